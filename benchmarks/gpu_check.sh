#!/usr/bin/env bash
# GPU check, on one CUDA GPU without network, in four parts run as two calls of at most 5 minutes
# each (a short GPU allocation, 15 minutes say, holds its start, both calls and a part's rerun):
#
#   call 1 (about 3.5 minutes on an H100; cap 260 s):
#   1. benchmarks/gpu_check.py: SFT steps and GRPO steps of a randomly initialised ~0.5 B-parameter
#      Qwen3 in bf16 on DeepSpeed (ZeRO-2) with the hf rollout engine: SFT tokens/s and model FLOPs
#      utilisation, GRPO update tokens/s and MFU, hf-engine rollout tokens/s; then the same GRPO run
#      one step off, its rollout process on the same GPU taking each version over the gloo weight
#      transfer: staleness, push seconds; then with LoRA as presets/one-gpu.yaml trains it (rank 8,
#      10x the lr): update tokens/s beside the full run's, the adapter's share of the parameters.
#      20 SFT steps and 256-token responses (were 40 and 512).
#   call 2 (about 3.5 minutes; caps 100 + 80 + 60 s):
#   2. benchmarks/gpu_check_vllm.py: (a) GRPO's colocated vLLM engine with CUDA graphs: weight push,
#      sleep level 1 / wake, sleep level 2 / push (needs vLLM: skipped where it is missing, the one
#      skip that exits 3); (b) a ZeRO-2 bf16 step with gradient checkpointing on a 16K-token
#      sequence (beside the sleeping engine when there is one); (c) decode tokens/s at 3K/6K/12K
#      context, vLLM's or, without vLLM, the hf engine's.
#   3. benchmarks/gpu_check_paper_path.py: (a) ZeRO-3 SFT with uneven trained tokens per rank on two
#      CPU ranks; (b) the HF export's extra GPU memory beside an awake hf engine; (c) the colocated
#      memory plan measured beside the one docs/paper-scale.md assumes.
#   4. benchmarks/packing.py: GRPO's update packed (torch's varlen flash kernel, bf16) against
#      padded micro-batches at the paper's trajectory lengths, one A B pair (were two, A B B A).
#
#   benchmarks/gpu_check.sh [summary.json] [--call 1|2] [--part N[,N]] [--size tiny] [gpu_check.py options]
#       no --call / --part: both calls one after the other; --part 4: one part alone (a rerun)
#   GPU_CHECK_CARRY=gpu_carry benchmarks/gpu_check.sh --call 1   # on a GPU node without a package index:
#       gpu_carry/ built by benchmarks/gpu_carry.sh elsewhere and copied there (docs/paper-scale.md)
#
# Summaries go to $OUT (else the checkout's root) or beside the summary.json given: gpu_check.json and
# gpu_check_logs.tar.gz (part 1's stage logs and metrics, packed: one archive to copy back from
# the node), gpu_check_vllm.json, gpu_check_paper_path.json, gpu_check_packing.json.
#
# Every part runs under `timeout --kill-after=10` at its cap, and no later than the call's budget
# allows (GPU_CHECK_CALL_S, default 285 s from the call's start, carried-wheel install included):
# a part killed at its cap, or not started for lack of time, has failed. After each part it prints
# the part's outcome and seconds, and each sub-part it skipped with why; at the end every part again
# (benchmarks/gpu_check_report.py). Every module a part needs is checked before anything starts
# (benchmarks/gpu_check_imports.py): without one that every stage imports it stops at once.
#
# Exit status: 0 every part passed; 1 a part failed, ran past its cap, or was skipped for a package
# that could be carried (DeepSpeed); 2 nothing could run (no GPU, or a module every part needs is
# missing); 3 nothing failed, and only what needs vLLM (or CUDA, on a CPU run) was skipped.
#
# Environment:
#   GPU_CHECK_CARRY        a folder with wheels/ (benchmarks/gpu_carry.sh): what this machine lacks of
#                          them is installed into $TMPDIR/gpu_check_site first (a second call on
#                          the same node, same $TMPDIR, finds them there), no index, no network
#   GPU_CHECK_CAP_1..4     a part's cap in seconds (260, 100, 80, 60; --size tiny: 270, 180, 150,
#                          150; part 2 with vLLM: 240, so there run --part 2, then --part 3,4)
#   GPU_CHECK_CALL_S       one call's budget in seconds (285)
#   GPU_CHECK_PEAK_FLOPS   peak dense bf16 FLOP/s of the chip for the MFU (default 989e12: H100/H200 SXM)
#   GPU_CHECK_ALLOW_CPU=1  run without a GPU (with --size tiny: tests the script on a CPU)
#   GPU_CHECK_SIZE         0.5b (default) | tiny
#   GPU_CHECK_PYTHON       the interpreter (default: python3, else python)
# Further options (--sft-steps, --grpo-steps, --workdir, ...): python benchmarks/gpu_check.py --help
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${GPU_CHECK_PYTHON:-$(command -v python3 || command -v python)}"
usage() { echo "gpu_check: $1 (usage: benchmarks/gpu_check.sh [summary.json] [--call 1|2] [--part N[,N]] [--size tiny])" >&2; exit 2; }

summary_file=""
call=""
parts=()
size="${GPU_CHECK_SIZE:-0.5b}"
part1_args=()  # what gpu_check.py gets besides the summary path
if [[ $# -gt 0 && "$1" != -* ]]; then summary_file="$1"; shift; fi
while [[ $# -gt 0 ]]; do
    case "$1" in
        --call) [[ $# -ge 2 ]] || usage "--call needs 1 or 2"; call="$2"; shift 2 ;;
        --call=*) call="${1#--call=}"; shift ;;
        --part) [[ $# -ge 2 ]] || usage "--part needs a part"; parts+=(${2//,/ }); shift 2 ;;
        --part=*) value="${1#--part=}"; parts+=(${value//,/ }); shift ;;
        --size) [[ $# -ge 2 ]] || usage "--size needs 0.5b or tiny"; size="$2"; part1_args+=(--size "$2"); shift 2 ;;
        --size=*) size="${1#--size=}"; part1_args+=("$1"); shift ;;
        *) part1_args+=("$1"); shift ;;
    esac
done
case "$call" in "" | 1 | 2) ;; *) usage "--call $call: the calls are 1 and 2" ;; esac
for part in ${parts[@]+"${parts[@]}"}; do
    case "$part" in 1 | 2 | 3 | 4) ;; *) usage "--part $part: the parts are 1 to 4" ;; esac
done
if [[ ${#parts[@]} -gt 0 ]]; then
    groups=("${parts[*]}")
elif [[ "$call" == 1 ]]; then
    groups=("1")
elif [[ "$call" == 2 ]]; then
    groups=("2 3 4")
else
    groups=("1" "2 3 4")  # both calls, each with its own budget
fi
call_s="${GPU_CHECK_CALL_S:-285}"
deadline=$((SECONDS + call_s))

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
    # the site first: what an earlier call on this machine installed there is not installed again
    export PYTHONPATH="$PWD/src:$site${PYTHONPATH#"$PWD/src"}"
    began=$SECONDS
    "$PY" benchmarks/gpu_check_imports.py install "$GPU_CHECK_CARRY/wheels" "$site" || {
        echo "gpu_check: installing the carried wheels from $GPU_CHECK_CARRY/wheels failed: nothing was run" >&2
        exit 2
    }
    echo "gpu_check: carried wheels ready in $((SECONDS - began)) s"
fi
"$PY" benchmarks/gpu_check_imports.py check || exit 2

summary_dir="${OUT:-.}"
[[ -z "$summary_file" ]] && summary_file="$summary_dir/gpu_check.json"
summary_dir="$(dirname "$summary_file")"
mkdir -p "$summary_dir"
results="$(mktemp)"
trap 'rm -f "$results"' EXIT

# Seconds per part: 0.5b's fit an H100 call with margin (estimates); tiny's a shared 2-core CPU,
# where each process's imports (most of a tiny part) take 5-8 times their CPU time under load.
if [[ "$size" == tiny ]]; then caps=(270 180 150 150); else caps=(260 100 80 60); fi
if "$PY" benchmarks/gpu_check_imports.py has vllm; then caps[1]=240; fi  # vLLM's engine parts: about 4 minutes
cap_of() {
    local variable="GPU_CHECK_CAP_$1"
    echo "${!variable:-${caps[$(($1 - 1))]}}"
}
report() { "$PY" benchmarks/gpu_check_report.py part "$@" "$results"; }
run_part() {  # PART SUMMARY COMMAND...: under the part's cap and within the call's budget
    local part="$1" summary="$2" cap left began code=0
    shift 2
    cap="$(cap_of "$part")"
    left=$((deadline - SECONDS - 15))  # the kill's 10 s grace and the report
    if ((left < cap)); then cap=$left; fi
    rm -f "$summary"
    if ((cap < 20)); then
        report "$part" -1 "$cap" - "$summary"
        return 0
    fi
    echo "gpu_check: part $part: started, capped at $cap s"
    began=$SECONDS
    GPU_CHECK_PART_CAP_S="$cap" timeout --kill-after=10 "$cap" "$@" || code=$?
    report "$part" "$code" "$cap" "$((SECONDS - began))" "$summary"
}
skip_part() {  # PART SUMMARY REASON
    echo "{\"status\": \"skipped: $3\"}" > "$2"
    report "$1" 3 "$(cap_of "$1")" - "$2"
}
has_deepspeed() { "$PY" benchmarks/gpu_check_imports.py has deepspeed; }

if [[ "$size" == tiny ]]; then  # the script's own test on a CPU: small lengths
    packing=(--pairs 1 --prompts 2 --n 4 --prompt-tokens 20 40 --median 60 --max 200 --budget 512)
else
    packing=(--pairs 1 --prompts 4 --n 8 --prompt-tokens 640 2560 --median 8000 --max 22000 --budget 32768)
fi
for index in "${!groups[@]}"; do
    if ((index > 0)); then deadline=$((SECONDS + call_s)); fi  # the next call's budget
    for part in ${groups[$index]}; do
        case "$part" in
            1)
                rm -rf "$summary_dir/gpu_check_logs" "$summary_dir/gpu_check_logs.tar.gz"
                if has_deepspeed; then
                    run_part 1 "$summary_file" "$PY" benchmarks/gpu_check.py "$summary_file" \
                        ${part1_args[@]+"${part1_args[@]}"}
                else
                    skip_part 1 "$summary_file" "deepspeed not importable on this machine"
                fi
                if [[ -d "$summary_dir/gpu_check_logs" ]]; then  # one file, not eight
                    tar -czf "$summary_dir/gpu_check_logs.tar.gz" -C "$summary_dir" gpu_check_logs
                    rm -rf "$summary_dir/gpu_check_logs"
                fi
                ;;
            2) run_part 2 "$summary_dir/gpu_check_vllm.json" \
                   "$PY" benchmarks/gpu_check_vllm.py "$summary_dir/gpu_check_vllm.json" --size "$size" ;;
            3) run_part 3 "$summary_dir/gpu_check_paper_path.json" \
                   "$PY" benchmarks/gpu_check_paper_path.py "$summary_dir/gpu_check_paper_path.json" ;;
            4)
                if has_deepspeed; then
                    run_part 4 "$summary_dir/gpu_check_packing.json" "$PY" benchmarks/packing.py "${packing[@]}" \
                        --json "$summary_dir/gpu_check_packing.json"
                else
                    skip_part 4 "$summary_dir/gpu_check_packing.json" "deepspeed not importable on this machine"
                fi
                ;;
        esac
    done
done
echo "gpu_check: summaries in $summary_dir"
"$PY" benchmarks/gpu_check_report.py final "$results"
