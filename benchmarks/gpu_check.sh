#!/usr/bin/env bash
# GPU check, on one CUDA GPU without network, in four parts (about 10 minutes on an H100/H200):
# 1. benchmarks/gpu_check.py: SFT steps and GRPO steps of a randomly initialised ~0.5 B-parameter
#    Qwen3 in bf16 on DeepSpeed (ZeRO-2) with the hf rollout engine: SFT tokens/s and model FLOPs
#    utilisation, GRPO update tokens/s and MFU, hf-engine rollout tokens/s; then the same GRPO run
#    one step off, its rollout process on the same GPU taking each version over vLLM's
#    weight-transfer protocol (gloo backend): staleness, push seconds (about 4 minutes, limit 7.5).
# 2. benchmarks/gpu_check_vllm.py: (a) GRPO's colocated vLLM engine with CUDA graphs: weight push
#    (outputs change, log-probs follow the HF forward of the pushed weights), sleep level 1 / wake,
#    sleep level 2 / push; (b) a ZeRO-2 bf16 step with gradient checkpointing on a 16K-token
#    sequence (beside the sleeping engine when there is one; DeepSpeed only); (c) decode tokens/s
#    at 3K/6K/12K context (about 4 minutes).
# 3. benchmarks/gpu_check_paper_path.py: (a) ZeRO-3 SFT with uneven trained tokens per rank on two
#    CPU ranks (needs no GPU); (b) the HF export's extra GPU memory beside an awake hf engine on a
#    ZeRO-2 model, against save_pretrained's; (c) the colocated memory plan measured beside the one
#    docs/paper-scale.md assumes (about 1 minute).
# 4. benchmarks/packing.py: GRPO's update (the recomputation pass and one optimizer step) packed -
#    padding-free rows on torch's varlen flash kernel in bf16 - against padded micro-batches, on
#    the paper's trajectory lengths (prompts 640-2,560 tokens, responses median 8K, 2% at 22K,
#    budget 32,768), time and peak memory, arms A B B A (about 2 minutes). The update's MFU with
#    the packed default is part 1's.
#
#   benchmarks/gpu_check.sh [summary.json] [--size tiny] # default: $OUT/gpu_check.json; part 2 writes
#                                                       # gpu_check_vllm.json beside it
#   GPU_CHECK_CARRY=gpu_carry benchmarks/gpu_check.sh   # on a lent machine, from benchmarks/gpu_carry.sh's wheels
#
# Every module a part needs is checked before anything starts (benchmarks/gpu_check_imports.py):
# without one that every stage imports (jsonschema, pyyaml, transformers, ...) it stops at once,
# naming it. A part whose package is missing (DeepSpeed: 1 and 2b; vLLM: 2a and 2c) is skipped,
# never passed, and the others run.
#
# Exit status: 0 every part passed; 1 a part failed; 2 nothing could run (no GPU, or a module every
# part needs is missing); 3 nothing failed but a part was skipped (so "0" always means all checked).
#
# Environment:
#   GPU_CHECK_CARRY        a folder with wheels/ (benchmarks/gpu_carry.sh): what this machine lacks of
#                          them is installed into $TMPDIR/gpu_check_site first (no index, no network)
#   GPU_CHECK_PEAK_FLOPS   peak dense bf16 FLOP/s of the chip for the MFU (default 989e12: H100/H200 SXM)
#   GPU_CHECK_ALLOW_CPU=1  run without a GPU (with --size tiny: tests the script on a CPU)
#   GPU_CHECK_SIZE         0.5b (default) | tiny (both parts; --size in the arguments also reaches part 2)
# Further options (--sft-steps, --grpo-steps, --workdir, ...): python benchmarks/gpu_check.py --help
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
SKIPPED=3

if [[ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]]; then
    if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
        echo "gpu_check: no working nvidia-smi: this check needs a CUDA GPU" \
             "(GPU_CHECK_ALLOW_CPU=1 ... --size tiny runs it on a CPU, to test the script)" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
if [[ -n "${GPU_CHECK_CARRY:-}" ]]; then
    site="${TMPDIR:-/tmp}/gpu_check_site"
    python benchmarks/gpu_check_imports.py install "$GPU_CHECK_CARRY/wheels" "$site" || {
        echo "gpu_check: installing the carried wheels from $GPU_CHECK_CARRY/wheels failed: nothing was run" >&2
        exit 2
    }
    export PYTHONPATH="$PWD/src:$site${PYTHONPATH#"$PWD/src"}"
fi
python benchmarks/gpu_check_imports.py check || exit 2

summary_dir="${OUT:-.}"
size="${GPU_CHECK_SIZE:-0.5b}"
previous=""
for arg in "$@"; do
    [[ "$previous" == --size ]] && size="$arg"
    [[ "$arg" == --size=* ]] && size="${arg#--size=}"
    previous="$arg"
done
summary_file="$summary_dir/gpu_check.json"
if [[ $# -gt 0 && "$1" != -* ]]; then summary_dir="$(dirname "$1")"; summary_file="$1"; fi
mkdir -p "$summary_dir"

failed=0
skipped=()
ran=()
if python -c "import deepspeed" 2> /dev/null; then
    if python benchmarks/gpu_check.py "$@"; then ran+=("1"); else failed=1; ran+=("1 (failed)"); fi
else
    echo '{"status": "skipped: deepspeed not importable on this machine"}' > "$summary_file"
    echo "gpu_check: part 1: skipped: deepspeed not importable on this machine (-> $summary_file)"
    skipped+=("1")
fi
# Part 2 runs even when part 1 failed: its figures are independent; the exit status keeps the failure.
part2=0
python benchmarks/gpu_check_vllm.py "$summary_dir/gpu_check_vllm.json" --size "$size" || part2=$?
case "$part2" in
    0) ran+=("2") ;;
    "$SKIPPED") ran+=("2 (in part)"); skipped+=("in 2: see gpu_check_vllm.json") ;;
    *) failed=1; ran+=("2 (failed)") ;;
esac
part3=0
python benchmarks/gpu_check_paper_path.py "$summary_dir/gpu_check_paper_path.json" || part3=$?
case "$part3" in
    0) ran+=("3") ;;
    "$SKIPPED") ran+=("3 (in part)"); skipped+=("in 3: see gpu_check_paper_path.json") ;;
    *) failed=1; ran+=("3 (failed)") ;;
esac
if python -c "import deepspeed" 2> /dev/null; then
    if [[ "$size" == tiny ]]; then  # the script's own test on a CPU: small lengths, one pair
        packing=(--pairs 1 --prompts 2 --n 4 --prompt-tokens 20 40 --median 60 --max 200 --budget 512)
    else
        packing=(--pairs 2 --prompts 4 --n 8 --prompt-tokens 640 2560 --median 8000 --max 22000 --budget 32768)
    fi
    if python benchmarks/packing.py "${packing[@]}" --json "$summary_dir/gpu_check_packing.json"; then
        ran+=("4")
    else
        failed=1
        ran+=("4 (failed)")
    fi
else
    echo "gpu_check: part 4: skipped: deepspeed not importable on this machine"
    skipped+=("4")
fi
echo "gpu_check: ran: ${ran[*]:-none}; skipped: ${skipped[*]:-none}; summaries in $summary_dir"
if [[ "$failed" != 0 ]]; then exit 1; fi
if [[ ${#skipped[@]} -gt 0 ]]; then
    echo "gpu_check: exit $SKIPPED: nothing failed, but not everything was checked"
    exit "$SKIPPED"
fi
exit 0
