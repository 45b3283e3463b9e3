#!/usr/bin/env bash
# The wheel folder of benchmarks/gpu_check.sh for a GPU node without a package index (air-gapped,
# or behind a firewall) that has torch with CUDA but no DeepSpeed or jsonschema: built here, where
# pip reaches an index, then copied to the node and installed there offline. It is kept small
# (DeepSpeed and the pure-Python or small compiled dependencies, not torch or CUDA vLLM, which the
# node must have itself): the build fails over 64 MiB.
#
#   benchmarks/gpu_carry.sh [OUT_DIR] [PYTHON_VERSIONS]   # default: gpu_carry/, "310 311 312 313"
#
# - DeepSpeed: the installed release, built here as a wheel (`pip wheel --no-deps`, no build
#   isolation: its setup imports torch; no ops are compiled, they build just in time on the GPU
#   if ever needed, and the check's AdamW is torch's).
# - The other distributions of benchmarks/gpu_check_imports.py's CARRIED list at the versions
#   installed here, as released wheels on manylinux x86_64; the compiled ones (rpds-py,
#   pydantic-core, msgpack, pyyaml; psutil and ninja are abi-independent) for each of
#   PYTHON_VERSIONS, since the GPU node's Python version may not be known here (about 15 MiB for
#   four); gpu_check.sh's import check names whatever is still missing there.
#
# Then copy the checkout with the wheel folder to the node (gpu_carry/ is git-ignored, so a git clone
# there lacks it: rsync or scp it, or build it on a shared file system) and run there two calls of
# at most 5 minutes each (docs/paper-scale.md, "The GPU check on a short GPU allocation"), e.g.
#   rsync -a --exclude .git ./ gpu-node:agentrl/
#   timeout 300 env GPU_CHECK_CARRY=gpu_carry benchmarks/gpu_check.sh --call 1
#   timeout 300 env GPU_CHECK_CARRY=gpu_carry benchmarks/gpu_check.sh --call 2
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_carry}"
python_versions="${2:-310 311 312 313}"
limit=$((64 * 1024 * 1024))

rm -rf "$out"
mkdir -p "$out/wheels"
version_of() { python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

deepspeed_version="$(version_of deepspeed)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
quietly() {  # pip's output only when it fails
    "$@" > "$log" 2>&1 || { grep -v "is ignored: it is neither a file nor a directory" "$log" >&2; exit 1; }
}
quietly python -m pip wheel --no-deps --no-build-isolation "deepspeed==$deepspeed_version" -w "$out/wheels"

pins=()
for dist in $(python benchmarks/gpu_check_imports.py carried); do
    [[ "$dist" == deepspeed ]] && continue
    pins+=("$dist==$(version_of "$dist")")
done
for python_version in $python_versions; do
    quietly python -m pip download --no-deps --only-binary=:all: --python-version "$python_version" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform linux_x86_64 -d "$out/wheels" "${pins[@]}"
done

size=$(du -sb "$out" | cut -f1)
echo "gpu_carry: $(ls "$out/wheels" | wc -l) wheels for CPython $python_versions in $out: $((size / 1024)) KiB (limit $((limit / 1024)) KiB)"
ls "$out/wheels"
if (( size > limit )); then
    echo "gpu_carry: $out is over 64 MiB: it should hold DeepSpeed and the small dependencies," \
         "not torch or CUDA vLLM (the GPU node must have those itself)" >&2
    exit 1
fi
echo "gpu_carry: copy the checkout with $out/ to the GPU node (rsync, scp or a shared file system), then there:"
for call in 1 2; do
    echo "gpu_carry:   timeout 300 env GPU_CHECK_CARRY=$out benchmarks/gpu_check.sh --call $call"
done
