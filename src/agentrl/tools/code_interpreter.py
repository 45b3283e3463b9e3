"""The ``code_interpreter`` tool: a model's tool call in, the tool-response text out.

Recipe (docs/recipe.md section 3; upstream: verl's ``SandboxFusionTool`` with the demystify
recipe's code sanitizer and the agent loop's middle truncation):

1. take the first fenced python block of the call's ``code`` if there is one;
2. if the last line is not a ``print``, wrap it in ``print(...)``;
3. run it (``sandbox.timeout_s``; upstream 30 s, 2048 MB);
4. the response is ``stdout + stderr`` when the program finished (with any exit status), and
   the fixed upstream text ``"no stdout here"`` when it did not (timeout, sandbox failure);
5. responses longer than ``tool.max_output_chars`` (256) keep the first and last half around
   ``"...(truncated)..."``.

Departure (documented improvement, ``tool.print_last_line: expression``, the default): upstream
wraps the last non-empty line blindly, so ``x = 1`` becomes ``print(x = 1)`` (a TypeError the
model then sees), an indented last line or the tail of a multi-line call becomes a syntax error.
Here the same rule applies only when the code parses and its last statement is an expression
statement not starting with ``print``; the whole statement (all its lines) is wrapped, so the
output is upstream's whenever upstream's wrap was valid Python. ``always`` restores upstream.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from agentrl.config import ToolConfig
from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.tools.sandbox import ExecutionResult, Sandbox

TOOL_SCHEMA = CODE_INTERPRETER_TOOL  # one definition of the tool, shared with the prompts

# verl's SandboxFusionTool answers this whenever the run did not finish (timeout, sandbox error).
NOT_FINISHED_TEXT = "no stdout here"
TRUNCATION_MARKER = "...(truncated)..."
_LINE_END = re.compile(rb"\r\n|\r|\n")
_FENCED_PYTHON = re.compile(r"```(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
# The demystify tool's pattern (tool.code_block: upstream): case-sensitive, nothing required after the tag.
_UPSTREAM_FENCED_PYTHON = re.compile(r"```python(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class ToolResult:
    """``text``: the tool response the model sees (truncated). ``ok``: the code ran and exited 0."""

    text: str
    ok: bool
    result: ExecutionResult

    @property
    def outcome(self) -> str:
        """What the call came to (``ExecutionResult.outcome``; the agent loop adds ``parse_failure``)."""
        return self.result.outcome


def extract_code(text: str, code_block: str = "project") -> str:
    """The first fenced python block of ``text`` if it has one, else ``text`` itself.

    ``project``: ```python / ```python3 / ```py in any case with a newline after the tag, the
    block's surrounding newlines stripped. ``upstream``: ```python(.*?)``` and ``strip()`` (so
    ```python3 keeps a leading "3" and the first line loses its indentation), as the tool runs it.
    """
    if code_block == "upstream":
        match = _UPSTREAM_FENCED_PYTHON.search(text)
        return match.group(1).strip() if match else text
    match = _FENCED_PYTHON.search(text)
    return match.group(1).strip("\n") if match else text


def _wrap_last_line_always(code: str) -> str:
    """Upstream's rule, verbatim in effect: the last line that is not "" gets print(...)."""
    lines = code.split("\n")
    for index in range(len(lines) - 1, -1, -1):
        if lines[index] == "":
            continue
        if not lines[index].startswith("print"):
            lines[index] = f"print({lines[index]})"
        break
    return "\n".join(lines)


def _wrap_last_expression(code: str) -> str:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code  # let the interpreter report it, unchanged
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    # ast columns are UTF-8 byte offsets within lines the tokenizer ends at \n, \r\n or \r.
    source = code.encode("utf-8", "surrogatepass")
    line_starts = [0] + [match.end() for match in _LINE_END.finditer(source)]
    start = line_starts[last.lineno - 1] + last.col_offset
    end = line_starts[last.end_lineno - 1] + last.end_col_offset
    statement = source[start:end].decode("utf-8", "surrogatepass")
    if statement.startswith("print"):
        return code
    return (source[:start] + b"print(" + source[start:end] + b")" + source[end:]).decode("utf-8", "surrogatepass")


def print_last_line(code: str, mode: str) -> str:
    """Make the code print its last line's value: ``expression`` (default) or ``always`` (upstream)."""
    if mode == "always":
        return _wrap_last_line_always(code)
    assert mode == "expression", f"tool.print_last_line must be 'expression' or 'always', got {mode!r}"
    return _wrap_last_expression(code)


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the first and last ``max_chars // 2`` characters around the marker (upstream)."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return text[:half] + TRUNCATION_MARKER + text[-half:]


def response_text(result: ExecutionResult) -> str:
    """The untruncated tool response for an execution result."""
    finished = result.status in ("ok", "error") or (result.status == "killed" and result.exit_code is not None)
    return result.stdout + result.stderr if finished else NOT_FINISHED_TEXT


class CodeInterpreter:
    """The ``code_interpreter`` tool over a sandbox; ``execute_many`` uses the sandbox's pool."""

    def __init__(self, sandbox: Sandbox, cfg: ToolConfig):
        self.sandbox = sandbox
        self.config = cfg

    def prepare(self, code: object) -> str:
        """The program actually run for a tool call's ``code`` argument."""
        text = code if isinstance(code, str) else str(code)  # upstream: str(code) for non-strings
        return print_last_line(extract_code(text, self.config.code_block), self.config.print_last_line)

    def _tool_result(self, result: ExecutionResult) -> ToolResult:
        text = truncate_middle(response_text(result), self.config.max_output_chars)
        return ToolResult(text=text, ok=result.status == "ok", result=result)

    def execute(self, code: object) -> ToolResult:
        return self._tool_result(self.sandbox.run(self.prepare(code)))

    def submit(self, code: object) -> Future[ToolResult]:
        """``execute`` in the sandbox's pool: the future holds the tool result (or the sandbox's error)."""
        answer: Future[ToolResult] = Future()

        def done(execution: Future[ExecutionResult]) -> None:
            error = execution.exception()
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(self._tool_result(execution.result()))

        self.sandbox.submit(self.prepare(code)).add_done_callback(done)
        return answer

    def execute_many(self, codes: Sequence[object]) -> list[ToolResult]:
        results = self.sandbox.run_many([(self.prepare(code), None) for code in codes])
        return [self._tool_result(result) for result in results]
