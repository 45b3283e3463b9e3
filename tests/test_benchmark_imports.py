"""The benchmark scripts (benchmarks/*.py) are run by hand or on a GPU node, not by the
fast tier, so a renamed or moved function they import from the package would only show there.
Every ``from agentrl... import name`` in them, and every ``alias.name`` of a module imported
``as alias``, must exist in the package as it is."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def _missing(script: Path) -> list[str]:
    source = script.read_text(encoding="utf-8")
    missing, aliases = [], {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentrl")):
            continue
        module = importlib.import_module(node.module)
        for name in node.names:
            target = f"{node.module}.{name.name}"
            if not hasattr(module, name.name) and importlib.util.find_spec(target) is None:
                missing.append(target)
            elif name.asname and importlib.util.find_spec(target) is not None:
                aliases[name.asname] = target
    for alias, target in aliases.items():
        module = importlib.import_module(target)
        for attribute in sorted(set(re.findall(rf"\b{re.escape(alias)}\.([A-Za-z_]\w*)", source))):
            if not hasattr(module, attribute):
                missing.append(f"{target}.{attribute}")
    return missing


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_what_a_benchmark_imports_from_the_package_exists(script):
    assert _missing(script) == [], f"{script.name} uses names the package does not have"
