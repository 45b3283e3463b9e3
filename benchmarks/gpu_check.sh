#!/usr/bin/env bash
# GPU check, on one CUDA GPU without network, in two parts (about 7 minutes on an H100/H200):
# 1. benchmarks/gpu_check.py: SFT steps and GRPO steps of a randomly initialised ~0.5 B-parameter
#    Qwen3 in bf16 on DeepSpeed (ZeRO-2) with the hf rollout engine; training tokens/s and model
#    FLOPs utilisation (about 3 minutes, limit 7.5).
# 2. benchmarks/gpu_check_vllm.py: GRPO's colocated vLLM engine with CUDA graphs: weight push
#    (outputs change, log-probs follow the HF forward of the pushed weights), sleep/wake, a ZeRO-2
#    bf16 step with gradient checkpointing on a 16K-token sequence beside the sleeping engine (peak
#    memory), decode tokens/s at 3K/6K/12K context (about 4 minutes). A part whose package is not
#    importable (vllm, deepspeed) is reported as skipped in its summary, never as passed; without
#    deepspeed part 1 is skipped (with a message) and part 2 runs the parts that do not need it.
#
#   benchmarks/gpu_check.sh [summary.json]      # default: $OUT/gpu_check.json; part 2 writes
#                                               # gpu_check_vllm.json beside it
#
# Environment:
#   GPU_CHECK_PEAK_FLOPS   peak dense bf16 FLOP/s of the chip for the MFU (default 989e12: H100/H200 SXM)
#   GPU_CHECK_ALLOW_CPU=1  run without a GPU (with --size tiny: tests the script on a CPU)
#   GPU_CHECK_SIZE         0.5b (default) | tiny (both parts; --size in the arguments also reaches part 2)
# Further options (--sft-steps, --grpo-steps, --workdir, ...): python benchmarks/gpu_check.py --help
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if [[ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]]; then
    if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
        echo "gpu_check: no working nvidia-smi: this check needs a CUDA GPU" \
             "(GPU_CHECK_ALLOW_CPU=1 ... --size tiny runs it on a CPU, to test the script)" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
python -c "import torch, transformers" || {
    echo "gpu_check: torch and transformers must be installed (pip install -e .): no part can run" >&2
    exit 2
}
deepspeed=1
python -c "import deepspeed" 2> /dev/null || {
    deepspeed=0
    echo "gpu_check: deepspeed is not importable here: part 1 (SFT/GRPO on DeepSpeed) and part 2b are SKIPPED," \
         "not passed; the vLLM parts (2a, 2c) still run"
}
summary_dir="${OUT:-.}"
size="${GPU_CHECK_SIZE:-0.5b}"
previous=""
for arg in "$@"; do
    [[ "$previous" == --size ]] && size="$arg"
    [[ "$arg" == --size=* ]] && size="${arg#--size=}"
    previous="$arg"
done
if [[ $# -gt 0 && "$1" != -* ]]; then summary_dir="$(dirname "$1")"; fi

status=0
if [[ "$deepspeed" == 1 ]]; then
    python benchmarks/gpu_check.py "$@" || status=$?
else
    summary_file="$summary_dir/gpu_check.json"
    if [[ $# -gt 0 && "$1" != -* ]]; then summary_file="$1"; fi
    mkdir -p "$summary_dir"
    echo '{"status": "skipped: deepspeed not importable on this machine"}' > "$summary_file"
    echo "gpu_check: part 1: skipped: deepspeed not importable on this machine (-> $summary_file)"
fi
# Part 2 runs even when part 1 failed: its figures are independent; the exit status keeps the failure.
python benchmarks/gpu_check_vllm.py "$summary_dir/gpu_check_vllm.json" --size "$size" || status=$?
exit "$status"
