"""The tests share their parts through tests/conftest.py and tests/helpers, never through each other.

A test module imported by another one cannot be edited alone: renaming one of its private
helpers breaks tests elsewhere, and collecting one file runs the other's module code too.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
TEST_MODULES = {path.stem for path in TESTS.glob("test_*.py")}


def imported_test_modules(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) of every import of a tests/test_*.py module in ``source``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in TEST_MODULES]
    return found


def test_the_check_finds_imports_of_test_modules_at_module_level_and_inside_functions():
    source = "import os\nfrom helpers.rollout import GREEDY\ndef f():\n    from test_presets import resolved\n"
    assert imported_test_modules(source) == [(4, "test_presets")]
    assert imported_test_modules("import test_metrics as m, json\n") == [(1, "test_metrics")]
    assert imported_test_modules("from test_no_such_module import x\n") == []


def test_no_test_module_or_shared_helper_imports_a_test_module():
    shared = [TESTS / "conftest.py", *sorted((TESTS / "helpers").glob("*.py"))]
    offenders = {
        str(path.relative_to(TESTS)): imports
        for path in [*sorted(TESTS.glob("test_*.py")), *shared]
        if (imports := imported_test_modules(path.read_text(), str(path)))
    }
    assert offenders == {}, f"move what they import to tests/helpers or tests/conftest.py: {offenders}"
