"""The size rules of docs/design.md (Style) hold in ``src/``: files under 600 lines, functions
under 80, so a newcomer reads each in one sitting; a longer one is cut by what its parts are."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "agentrl"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def long_files(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root)}: {lines} lines"
        for path in sorted(root.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    ]


def long_functions(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_source_file_over_the_limit():
    assert long_files(SRC) == []


def test_no_function_over_the_limit():
    assert long_functions(SRC) == []


def test_the_checks_find_what_is_too_long(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n" + "\n" * MAX_FILE_LINES, encoding="utf-8")
    assert long_functions(tmp_path) == [f"long.py:1 long: {MAX_FUNCTION_LINES + 1} lines"]
    assert long_files(tmp_path) == [f"long.py: {MAX_FUNCTION_LINES + 1 + MAX_FILE_LINES} lines"]
