"""What benchmarks/gpu_check.sh needs importable, checked before any part starts; the carry set's contents.

    python benchmarks/gpu_check_imports.py check                 # exit 2 naming what every part needs and is missing
    python benchmarks/gpu_check_imports.py install WHEELS TARGET # the missing carried distributions into TARGET
    python benchmarks/gpu_check_imports.py carried               # the distributions benchmarks/gpu_carry.sh packs
    python benchmarks/gpu_check_imports.py has MODULE...         # exit 1 unless every module is found (not imported)

``REQUIRED``: every stage imports these (``import agentrl.config`` alone needs jsonschema and
pyyaml), so without one no part can run and the check stops before starting any. ``PART_NEEDS``:
the parts that need more (DeepSpeed for the SFT/GRPO stages, the long-sequence step and the
packed update, vLLM for the colocated engine part); without them those parts are skipped, never
passed: gpu_check.sh exits 3 when only vLLM's part was, 1 when a part that DeepSpeed would run was
(benchmarks/gpu_check_report.py).

A GPU node without a package index (air-gapped, or behind a firewall) may have torch with CUDA
and little else: ``CARRIED`` is what benchmarks/gpu_carry.sh packs as wheels (DeepSpeed built
where pip reaches an index, the rest as released) into the folder copied to the node and
installed there offline. The folder is kept small: DeepSpeed and the pure-Python or small
compiled dependencies, not torch or CUDA vLLM (hundreds of MB); the transformers, NumPy and
pandas/pyarrow stacks are expected on the node.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

# module -> distribution (pip name)
REQUIRED = {
    "torch": "torch",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "huggingface_hub": "huggingface-hub",
    "numpy": "numpy",
    "pandas": "pandas",
    "pyarrow": "pyarrow",
    "yaml": "pyyaml",
    "jsonschema": "jsonschema",
    "referencing": "referencing",
    "jsonschema_specifications": "jsonschema-specifications",
    "rpds": "rpds-py",
    "attrs": "attrs",
    "tqdm": "tqdm",
    "math_verify": "math-verify",
    "latex2sympy2_extended": "latex2sympy2_extended",
    "antlr4": "antlr4-python3-runtime",
}
DEEPSPEED = {
    "deepspeed": "deepspeed",
    "hjson": "hjson",
    "cpuinfo": "py-cpuinfo",
    "einops": "einops",
    "msgpack": "msgpack",
    "psutil": "psutil",
    "ninja": "ninja",
    "pydantic": "pydantic",
    "pydantic_core": "pydantic-core",
    "annotated_types": "annotated-types",
    "typing_inspection": "typing-inspection",
    "packaging": "packaging",
}
PART_NEEDS = {  # part -> the modules it needs beyond REQUIRED
    "1 (SFT and GRPO stages, hf engine, DeepSpeed ZeRO-2)": tuple(DEEPSPEED),
    "2a (colocated vLLM engine)": ("vllm",),
    "2b (ZeRO-2 step on a long sequence)": tuple(DEEPSPEED),
    "2c (decode speed: vLLM's, else the hf engine's)": (),
    "3 (ZeRO-3 with uneven ranks, the export beside an engine, the memory plan)": tuple(DEEPSPEED),
    "4 (GRPO update packed against padded)": tuple(DEEPSPEED),
}
NOT_CARRIED = {"torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "pandas", "pyarrow"}
CARRIED = {module: dist for module, dist in {**REQUIRED, **DEEPSPEED}.items() if module not in NOT_CARRIED}


def importable(module: str) -> bool:
    """Whether ``module`` can be found (a finder that refuses it counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(modules) -> list[str]:
    return [m for m in modules if not importable(m)]


def check() -> int:
    """Print what can run; 2 when a module every part needs is missing (named), else 0."""
    absent = missing(REQUIRED)
    if absent:
        names = ", ".join(f"{m} (pip: {REQUIRED[m]})" for m in absent)
        print(
            f"gpu_check: not importable here: {names}. Every stage needs it (import agentrl.config needs "
            "jsonschema and pyyaml), so no part was started. Carry it: build the wheel folder with "
            "benchmarks/gpu_carry.sh where pip reaches an index, copy gpu_carry/ to this node, then "
            "GPU_CHECK_CARRY=gpu_carry benchmarks/gpu_check.sh (docs/paper-scale.md, "
            "'The GPU check on a short GPU allocation')",
            file=sys.stderr,
        )
        return 2
    for part, needs in PART_NEEDS.items():
        lacking = missing(needs)
        if not lacking:
            print(f"gpu_check: part {part}: runs")
            continue
        counts = "needs vLLM: exit 3" if lacking == ["vllm"] else "counts as FAILED: carry it"
        print(f"gpu_check: part {part}: SKIPPED, not importable: {', '.join(lacking)} ({counts})")
    return 0


def install(wheels: str, target: str) -> int:
    """pip-install the carried distributions this machine lacks from ``wheels`` into ``target``
    (no index, no dependencies: the wheelhouse holds each one)."""
    wanted = sorted({CARRIED[m] for m in missing(CARRIED)})
    if not wanted:
        print("gpu_check: every carried package is importable already")
        return 0
    print(f"gpu_check: installing from {wheels} into {target}: {' '.join(wanted)}")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--find-links", wheels]
    return subprocess.call([*command, "--target", target, *wanted])


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        return check()
    if argv[:1] == ["install"] and len(argv) == 3:
        return install(argv[1], argv[2])
    if argv[:1] == ["has"] and len(argv) > 1:
        return 1 if missing(argv[1:]) else 0
    if argv[:1] == ["carried"]:
        print(" ".join(sorted(set(CARRIED.values()))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
