#!/usr/bin/env bash
# The embedded default from scratch, timed: each stage's wall time and the headline table.
#
#   benchmarks/pipeline.sh [WORKDIR] [extra snakemake arguments...]
#
# WORKDIR (default: a new folder under /tmp) gets a clean checkout of this repository's HEAD
# (`git worktree`-free: `git archive`), so uncommitted edits and an existing results/ folder
# play no part; the run is `snakemake --cores all` there, as the README's quickstart. Prints the
# load average before and after (the machine is shared: compare runs made side by side), the
# total wall time, every job's time from results/timings/ (Snakemake's benchmark files) summed
# per rule, and results/report/summary.md.
set -euo pipefail

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
workdir=${1:-$(mktemp -d /tmp/agentrl-pipeline.XXXXXX)}
shift || true
mkdir -p "$workdir"
if [ -e "$workdir/results" ]; then
    echo "pipeline.sh: $workdir/results exists; give an empty or new WORKDIR" >&2
    exit 2
fi
git -C "$repo" archive HEAD | tar -x -C "$workdir"
commit=$(git -C "$repo" rev-parse --short HEAD)

echo "commit $commit, workdir $workdir, $(nproc) cores"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
started=$(date +%s)
(cd "$workdir" && snakemake --cores all "$@" > pipeline.log 2>&1) || {
    echo "pipeline.sh: snakemake failed; see $workdir/pipeline.log" >&2
    tail -20 "$workdir/pipeline.log" >&2
    exit 1
}
ended=$(date +%s)
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "wall time: $(( (ended - started) / 60 )) min $(( (ended - started) % 60 )) s"

echo
echo "job time per rule (s, summed over its jobs; jobs of different rules may overlap):"
python - "$workdir/results/timings" <<'EOF'
import csv
import sys
from collections import defaultdict
from pathlib import Path

root = Path(sys.argv[1])
total, jobs = defaultdict(float), defaultdict(int)
for tsv in sorted(root.rglob("*.tsv")):
    rule = tsv.relative_to(root).parts[0].removesuffix(".tsv")
    with tsv.open() as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            total[rule] += float(row["s"])
            jobs[rule] += 1
for rule in sorted(total, key=total.get, reverse=True):
    print(f"  {rule:24s} {total[rule]:8.1f} s  ({jobs[rule]} job{'s' if jobs[rule] > 1 else ''})")
EOF
echo
cat "$workdir/results/report/summary.md"
