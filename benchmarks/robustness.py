"""Does the embedded recipe learn robustly? SFT over seeds and torch thread counts, GRPO over seeds (not a test).

Every arm runs the real workflow (``snakemake``) in a results folder of its own under
``--out-dir``, with the config files given by ``--config-overlay`` (repeatable, over
config.yaml) and ``--config seed=S results_dir=<arm folder>``:

- SFT arms, one per seed of ``--seeds`` and thread count of ``--threads``: the SFT model and its
  evaluation (``results/eval/sft/<benchmark>/metrics.json``), the SFT job and the embedded
  model's copying pretraining before it at ``--set-threads sft=T pretrain=T``. The config's ``seed`` also draws the embedded data and the base
  model's initial weights, so each seed builds its own; the thread counts of one seed share them
  (the first arm's ``data/`` and ``models/base/`` are copied, mtimes kept, into the others'
  folders: Snakemake finds them up to date and has no record of other params for them).
- The default SFT arm: the config's own seed at 2 threads (one of the SFT arms when that pair is
  listed, else an arm of its own, built only when there are RL arms), or ``--default-run``, a
  finished results folder of the same recipe.
- RL arms, one per seed of ``--rl-seeds``: the default arm's data, base and SFT model copied into
  the arm's folder, then at that seed the RL-pool scoring and selection, GRPO and the RL model's
  evaluation (``results/eval/rl/<benchmark>/metrics.json``). RL - SFT is against the default SFT
  model's avg@n (evaluated at the config's seed).

Per arm it reads avg@n (eval.n) of each benchmark and their mean (in %), the copy probe
(``benchmarks/copy_probe.py`` on the arm's arith eval set, teacher forced: the probability of
copying each span whole; the "copy" figure is the least of expression, stated and boxed; the
choice options line is shown beside it, unchecked), the step at which the embedded model's
pretraining "clicked" (the first whose trailing mean loss over 100 steps is below 1.0: the plateau
near 2 ends when the model starts copying) and its final loss, the SFT job's minutes
(``results/timings/sft.tsv``), the arm's wall minutes and the load average over it. A threshold
not met is FAIL; an arm whose workflow or probe failed is ERROR, with its log.

    nice -n 19 python benchmarks/robustness.py --json results/robustness.json
    python benchmarks/robustness.py --config-overlay presets/smoke.yaml --seeds 1 2 --rl-seeds 1 \\
        --out-dir results/robustness-smoke --json results/robustness-smoke.json
    python benchmarks/robustness.py --dry-run    # the snakemake commands only

A finished arm is up to date on a second run (Snakemake re-runs what changed), so a stopped
benchmark resumes where it stopped; its wall minutes then are those of the second run.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_THREADS = 2  # the sft rule's threads (rules/sft.smk): the default SFT model's
COPY_SPANS = ("expression", "stated", "boxed")  # arith spans; the least of them is the copy figure
# The copying "click" of the embedded model's pretraining: the first step whose trailing mean loss
# over CLICK_WINDOW steps is below CLICK_LOSS (before it the loss plateaus near 2, after it falls
# to about 0.2; docs/experiments.md, 2026-12-04).
CLICK_WINDOW, CLICK_LOSS = 100, 1.0
SHARED_SFT_INPUTS = ("data", "models/base")  # seed-dependent, thread-independent
# the outputs of the pretrain and sft rules (both outputs of each), which the RL arms start from
SHARED_RL_INPUTS = (
    "data",
    "models/base",
    "models/pretrained",
    "pretrain/metrics.jsonl",
    "models/sft",
    "sft/metrics.jsonl",
)


@dataclass
class Arm:
    name: str
    kind: str  # sft | rl
    seed: int
    threads: int | None
    folder: Path
    copy_from: Path | None = None  # a folder whose stage outputs this arm starts from
    command: list[str] = field(default_factory=list)


@dataclass
class Row:
    arm: str
    kind: str
    seed: int
    threads: int | None
    folder: str
    status: str = "ok"  # ok | ERROR
    error: str | None = None
    log: str | None = None
    avg: dict[str, float] = field(default_factory=dict)  # benchmark -> avg@n in %
    mean: float | None = None
    sft_mean: float | None = None  # rl arms: the default SFT model's
    delta: float | None = None
    copy: dict[str, float] = field(default_factory=dict)  # span -> P(whole span)
    copy_min: float | None = None
    pretrain_click_step: int | None = None  # None: no pretraining, or it never clicked
    pretrain_final_loss: float | None = None  # trailing mean over the last CLICK_WINDOW steps
    sft_job_minutes: float | None = None
    wall_minutes: float | None = None
    load: dict[str, float] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)  # threshold -> PASS | FAIL | ERROR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds", type=int, nargs="*", default=[1, 2, 3, 4, 5], help="SFT seeds (default 1..5; none: RL arms only)"
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="SFT torch threads (default 1 2)")
    parser.add_argument("--rl-seeds", type=int, nargs="*", default=[1, 2, 3], help="GRPO seeds (default 1 2 3)")
    parser.add_argument("--config-overlay", type=Path, action="append", default=[], help="config file over config.yaml")
    parser.add_argument("--out-dir", type=Path, default=Path("results/robustness"), help="arm folders go here")
    parser.add_argument("--default-run", type=Path, help="a finished results folder whose SFT model the RL arms use")
    parser.add_argument("--cores", default="all", help="snakemake --cores (default all)")
    parser.add_argument("--min-sft", type=float, default=70.0, help="SFT avg@n mean threshold, %% (default 70)")
    parser.add_argument("--min-copy", type=float, default=0.8, help="copy probe threshold (default 0.8)")
    parser.add_argument("--min-rl-gain", type=float, default=8.0, help="RL - SFT threshold, points (default 8)")
    parser.add_argument("--dry-run", action="store_true", help="print the snakemake commands, run nothing")
    parser.add_argument("--json", type=Path, help="write the rows and spreads here")
    return parser


def _merge(base: dict, over: dict) -> dict:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def merged_config(overlays: list[Path]) -> dict:
    """config.yaml with the overlays over it, as Snakemake merges them (later files win, key by key)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    for path in overlays:
        if not path.is_file():
            sys.exit(f"--config-overlay {path}: no such file")
        config = _merge(config, yaml.safe_load(path.read_text()) or {})
    return config


def benchmarks(config: dict) -> list[str]:
    if config["data"]["source"] == "embedded":
        return list(config["data"]["embedded"]["families"])
    return list(config["data"]["upstream"]["eval"])


def plan(args, config: dict) -> tuple[list[Arm], Arm | None, list[Arm]]:
    """The SFT arms, the default SFT arm (None with --default-run or without RL arms) and the RL arms."""
    out = args.out_dir
    sft_arms = []
    for seed in args.seeds:
        first = None
        for threads in args.threads:
            arm = Arm(f"sft-s{seed}-t{threads}", "sft", seed, threads, out / f"sft-s{seed}-t{threads}")
            arm.copy_from = first
            first = first or arm.folder
            sft_arms.append(arm)
    default_seed = int(config["seed"])
    default = None
    if args.rl_seeds and args.default_run is None:
        listed = [a for a in sft_arms if a.seed == default_seed and a.threads == DEFAULT_THREADS]
        default = listed[0] if listed else Arm("sft-default", "sft", default_seed, DEFAULT_THREADS, out / "sft-default")
    source = args.default_run if args.default_run is not None else default.folder if default else None
    rl_arms = [Arm(f"rl-s{seed}", "rl", seed, None, out / f"rl-s{seed}", copy_from=source) for seed in args.rl_seeds]
    names = benchmarks(config)
    for arm in [*sft_arms, *([default] if default and default not in sft_arms else []), *rl_arms]:
        model = "sft" if arm.kind == "sft" else "rl"
        targets = [str(arm.folder / "eval" / model / name / "metrics.json") for name in names]
        arm.command = [
            "snakemake",
            "--cores",
            str(args.cores),
            "--rerun-incomplete",
            "--printshellcmds",  # the log shows each stage's --threads
            # the embedded model's pretraining is part of the SFT recipe: it runs at the arm's threads too
            *(["--set-threads", f"sft={arm.threads}", f"pretrain={arm.threads}"] if arm.threads else []),
            *[item for path in args.config_overlay for item in ("--configfile", str(path))],
            "--config",
            f"seed={arm.seed}",
            f"results_dir={arm.folder}",
            "--",
            *targets,
        ]
    return sft_arms, default, rl_arms


def copy_shared(source: Path, folder: Path, parts: tuple[str, ...]) -> None:
    """Copies (not links: a re-run stage rewrites its folder in place) with their mtimes."""
    for part in parts:
        src, dst = source / part, folder / part
        if dst.exists() or not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, copy_function=shutil.copy2)
        else:
            shutil.copy2(src, dst)


class LoadSampler:
    """The 1-minute load average every ``period`` seconds while an arm runs."""

    def __init__(self, period: float = 30.0):
        self.period, self.samples, self._stop = period, [os.getloadavg()[0]], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        return {
            "start": round(self.samples[0], 2),
            "max": round(max(self.samples), 2),
            "mean": round(statistics.fmean(self.samples), 2),
        }


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }


def run_workflow(arm: Arm, row: Row, out_dir: Path) -> None:
    log = out_dir / f"{arm.name}.snakemake.log"
    row.log = str(log)
    if arm.copy_from is not None:
        if not (arm.copy_from / "models" / "base").exists():
            row.status, row.error = "ERROR", f"{arm.copy_from} has no models/base to start from"
            return
        copy_shared(arm.copy_from, arm.folder, SHARED_SFT_INPUTS if arm.kind == "sft" else SHARED_RL_INPUTS)
    print(f"[{time.strftime('%H:%M:%S')}] {arm.name}: {shlex.join(arm.command)}", flush=True)
    start = time.monotonic()
    with LoadSampler() as load, log.open("w") as stream:
        done = subprocess.run(arm.command, cwd=ROOT, env=_env(), stdout=stream, stderr=subprocess.STDOUT)
    row.wall_minutes = round((time.monotonic() - start) / 60, 2)
    row.load = load.summary()
    if done.returncode != 0:
        row.status, row.error = "ERROR", f"snakemake exited {done.returncode}"


def read_avg(folder: Path, model: str, names: list[str]) -> dict[str, float]:
    """avg@n (n = the metrics' samples_per_problem) per benchmark, in %."""
    avg = {}
    for name in names:
        metrics = json.loads((folder / "eval" / model / name / "metrics.json").read_text())
        avg[name] = 100.0 * metrics[f"avg@{metrics['samples_per_problem']}"]
    return avg


def copy_probe(model: Path, problems: Path) -> dict:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "copy_probe.py"),
        "--model",
        str(model),
        "--problems",
        str(problems),
    ]
    done = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def pretraining_click(metrics: Path) -> tuple[int | None, float]:
    """(the first step whose trailing mean loss over CLICK_WINDOW steps is below CLICK_LOSS, or None;
    the trailing mean at the last step) of a pretraining metrics.jsonl."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    points = [(int(r["step"]), float(r["loss"])) for r in rows if "loss" in r]
    if not points:
        raise ValueError(f"{metrics}: no row with a 'loss'")
    click, window = None, collections.deque(maxlen=CLICK_WINDOW)
    for step, loss in points:
        window.append(loss)
        if click is None and len(window) == CLICK_WINDOW and statistics.fmean(window) < CLICK_LOSS:
            click = step
    return click, statistics.fmean(window)


def read_sft(row: Row, folder: Path, names: list[str]) -> None:
    row.avg = read_avg(folder, "sft", names)
    row.mean = statistics.fmean(row.avg.values())
    if (folder / "pretrain" / "metrics.jsonl").exists():
        row.pretrain_click_step, final = pretraining_click(folder / "pretrain" / "metrics.jsonl")
        row.pretrain_final_loss = round(final, 3)
    timing = folder / "timings" / "sft.tsv"
    if timing.exists():
        with timing.open() as stream:
            row.sft_job_minutes = round(float(next(csv.DictReader(stream, delimiter="\t"))["s"]) / 60, 2)
    eval_dir = folder / "data" / "eval"
    if (eval_dir / "arith.parquet").exists():
        arith = copy_probe(folder / "models" / "sft", eval_dir / "arith.parquet")
        row.copy = {span: arith[span]["whole_span_probability_mean"] for span in COPY_SPANS}
        row.copy_min = min(row.copy.values())
    if (eval_dir / "choice.parquet").exists():
        choice = copy_probe(folder / "models" / "sft", eval_dir / "choice.parquet")
        row.copy["options"] = choice["options"]["whole_span_probability_mean"]


def measure(arm: Arm, args, names: list[str]) -> Row:
    row = Row(arm.name, arm.kind, arm.seed, arm.threads, str(arm.folder))
    run_workflow(arm, row, args.out_dir)
    if row.status == "ok":
        try:
            if arm.kind == "sft":
                read_sft(row, arm.folder, names)
            else:
                row.avg = read_avg(arm.folder, "rl", names)
                row.mean = statistics.fmean(row.avg.values())
        except (OSError, KeyError, ValueError, RuntimeError) as error:
            row.status, row.error = "ERROR", f"reading the results: {error}"
    return row


def check(row: Row, args) -> None:
    """PASS / FAIL per threshold of the row's kind; ERROR when the arm gave no figure."""

    def verdict(value: float | None, floor: float) -> str:
        return "ERROR" if row.status != "ok" or value is None else "PASS" if value >= floor else "FAIL"

    if row.kind == "sft":
        row.checks = {
            f"sft_mean>={args.min_sft:g}": verdict(row.mean, args.min_sft),
            f"copy>={args.min_copy:g}": verdict(row.copy_min, args.min_copy),
        }
    else:
        row.checks = {f"rl-sft>={args.min_rl_gain:g}": verdict(row.delta, args.min_rl_gain)}


def spread(values: list[float | None]) -> dict[str, float] | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"min": min(present), "max": max(present), "mean": statistics.fmean(present), "n": len(present)}


def groups(rows: list[Row]) -> dict[str, dict]:
    sft = [r for r in rows if r.kind == "sft" and r.arm != "sft-default"]
    by_threads = {f"sft t={t}": [r for r in sft if r.threads == t] for t in sorted({r.threads for r in sft})}
    found = {**by_threads, "sft all": sft, "rl": [r for r in rows if r.kind == "rl"]}
    return {
        name: {
            "arms": len(members),
            "errors": sum(r.status != "ok" for r in members),
            "mean": spread([r.mean for r in members]),
            "copy": spread([r.copy_min for r in members]),
            "click": spread([r.pretrain_click_step for r in members]),
            "delta": spread([r.delta for r in members]),
        }
        for name, members in found.items()
        if members
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[Row], names: list[str], n: int) -> str:
    head = ["arm", "seed", "threads", *(f"{b} avg@{n}" for b in names), f"mean avg@{n}", "SFT mean", "RL - SFT"]
    head += [*(f"copy {s}" for s in (*COPY_SPANS, "options")), "pretrain click step", "pretrain final loss"]
    head += ["SFT job min", "wall min", "load start/max", "checks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        checks = ", ".join(f"{name} {verdict}" for name, verdict in r.checks.items()) or "-"
        if r.status != "ok":
            checks += f" ({r.error}" + (f"; log {r.log})" if r.log else ")")
        load = f"{r.load['start']:.1f}/{r.load['max']:.1f}" if r.load else "-"
        cells = [r.arm, str(r.seed), str(r.threads or "-"), *(_fmt(r.avg.get(b)) for b in names)]
        cells += [_fmt(r.mean), _fmt(r.sft_mean), _fmt(r.delta)]
        cells += [_fmt(r.copy.get(s), 3) for s in (*COPY_SPANS, "options")]
        cells += [str(r.pretrain_click_step or "-"), _fmt(r.pretrain_final_loss, 3)]
        cells += [_fmt(r.sft_job_minutes), _fmt(r.wall_minutes), load, checks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread_table(found: dict[str, dict]) -> str:
    lines = [
        "| group | arms | errors | mean avg min/max/mean | copy min/max/mean | pretrain click step min/max/mean "
        "| RL - SFT min/max/mean |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, group in found.items():
        cells = []
        for key, digits in (("mean", 1), ("copy", 3), ("click", 0), ("delta", 1)):
            s = group[key]
            cells.append("-" if s is None else "/".join(_fmt(s[k], digits) for k in ("min", "max", "mean")))
        lines.append(f"| {name} | {group['arms']} | {group['errors']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def default_sft_row(args, default: Arm | None, done: dict[str, Row], names: list[str]) -> Row:
    """The SFT figures the RL arms are measured against: the default arm's, or --default-run's."""
    if default is not None:
        return done[default.name]
    row = Row("default-run", "sft", -1, None, str(args.default_run))
    try:
        row.avg = read_avg(args.default_run, "sft", names)
        row.mean = statistics.fmean(row.avg.values())
    except (OSError, KeyError, ValueError) as error:
        row.status, row.error = "ERROR", f"--default-run {args.default_run}: {error}"
    return row


def main() -> None:
    args = _parser().parse_args()
    config = merged_config(args.config_overlay)
    names, n = benchmarks(config), int(config["eval"]["n"])
    sft_arms, default, rl_arms = plan(args, config)
    order = [*sft_arms, *([default] if default is not None and default not in sft_arms else []), *rl_arms]
    if args.dry_run:
        for arm in order:
            source = f"  # starts from {arm.copy_from}" if arm.copy_from else ""
            print(shlex.join(arm.command) + source)
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    done: dict[str, Row] = {}
    for arm in order:
        if arm.kind == "rl":
            base = default_sft_row(args, default, done, names)
            if base.status != "ok":
                row = Row(
                    arm.name,
                    "rl",
                    arm.seed,
                    None,
                    str(arm.folder),
                    status="ERROR",
                    error=f"no default SFT model ({base.error})",
                    log=base.log,
                )
                done[arm.name] = row
                continue
        row = measure(arm, args, names)
        if arm.kind == "rl" and row.mean is not None:
            row.sft_mean = base.mean
            row.delta = row.mean - base.mean
        done[arm.name] = row
    rows = list(done.values())
    for row in rows:
        check(row, args)
    found = groups(rows)
    print(f"\n## Robustness (avg@{n} in %, copy: P(whole span) teacher forced on the arith/choice eval sets)\n")
    print(table(rows, names, n))
    print("\n" + spread_table(found))
    verdicts = [v for r in rows if r.arm != "sft-default" for v in r.checks.values()]
    overall = "PASS" if verdicts and all(v == "PASS" for v in verdicts) else "ERROR" if "ERROR" in verdicts else "FAIL"
    print(f"\noverall: {overall}")
    if args.json:
        payload = {
            "overall": overall,
            "config_overlays": [str(p) for p in args.config_overlay],
            "thresholds": {"min_sft": args.min_sft, "min_copy": args.min_copy, "min_rl_gain": args.min_rl_gain},
            "eval_n": n,
            "rows": [asdict(r) for r in rows],
            "groups": found,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
