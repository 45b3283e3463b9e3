#!/usr/bin/env bash
# GPU check: SFT steps and GRPO steps of a randomly initialised ~0.5 B-parameter Qwen3 in bf16 on
# DeepSpeed (ZeRO-2) with the hf rollout engine, on one CUDA GPU without network; reports training
# tokens/s and model FLOPs utilisation. Takes about 3 minutes on an H100/H200 (limit: 7.5).
#
#   benchmarks/gpu_check.sh [summary.json]      # default: $OUT/gpu_check.json
#
# Environment:
#   GPU_CHECK_PEAK_FLOPS   peak dense bf16 FLOP/s of the chip for the MFU (default 989e12: H100/H200 SXM)
#   GPU_CHECK_ALLOW_CPU=1  run without a GPU (with --size tiny: tests the script on a CPU)
#   GPU_CHECK_SIZE         0.5b (default) | tiny
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
python -c "import torch, deepspeed, transformers" || {
    echo "gpu_check: torch, deepspeed and transformers must be installed (pip install -e .)" >&2
    exit 2
}
exec python benchmarks/gpu_check.py "$@"
