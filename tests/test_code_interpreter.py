"""The code_interpreter tool: upstream's code post-processing, response text and truncation."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.tools.code_interpreter import (
    NOT_FINISHED_TEXT,
    TOOL_SCHEMA,
    TRUNCATION_MARKER,
    CodeInterpreter,
    ToolResult,
    extract_code,
    print_last_line,
    response_text,
    truncate_middle,
)
from agentrl.tools.sandbox import ExecutionResult, LocalSandbox


@pytest.fixture(scope="module")
def sandbox():
    cfg = load_config({"sandbox": {"workers": 2, "timeout_s": 1, "preload_modules": ["math"]}}).sandbox
    with LocalSandbox(cfg) as shared:
        yield shared


def interpreter(sandbox, **tool):
    return CodeInterpreter(sandbox, load_config({"tool": tool}).tool)


def test_tool_schema_is_upstream_verbatim():
    assert TOOL_SCHEMA == {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "A tool for executing code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The code to execute."}},
                "required": ["code"],
            },
        },
    }


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("print(1)", "print(1)"),
        ("Let me compute:\n```python\nx = 2\nprint(x)\n```\nthen ```python\nprint(3)\n```", "x = 2\nprint(x)"),
        ("```py\nprint(1)\n```", "print(1)"),
        ("```Python3 \r\nprint(1)\r\n```", "print(1)\r"),
        ("```\nprint(1)\n```", "```\nprint(1)\n```"),  # an unlabeled fence is not a python block
    ],
)
def test_extract_code_takes_the_first_python_block(text, code):
    assert extract_code(text) == code


@pytest.mark.parametrize(
    ("code", "expression_mode", "upstream"),
    [
        ("x = 1\nx", "x = 1\nprint(x)", "x = 1\nprint(x)"),
        ("x = 1", "x = 1", "print(x = 1)"),  # upstream's blind wrap: a TypeError at run time
        ("a = 1; a", "a = 1; print(a)", "print(a = 1; a)"),
        ("f(1,\n  2)", "print(f(1,\n  2))", "f(1,\nprint(  2))"),
        ("if x:\n    y", "if x:\n    y", "if x:\nprint(    y)"),
        ("x\n# done\n", "print(x)\n# done\n", "x\nprint(# done)\n"),
        ("print(2)\n\n", "print(2)\n\n", "print(2)\n\n"),
        ("printer(2)", "printer(2)", "printer(2)"),  # starts with "print": left alone, as upstream
        ("é = 'ü'; é  # c", "é = 'ü'; print(é)  # c", "print(é = 'ü'; é  # c)"),
        ("def f(:", "def f(:", "print(def f(:)"),  # does not parse: the interpreter reports it
        ("", "", ""),
    ],
)
def test_print_last_line(code, expression_mode, upstream):
    assert print_last_line(code, "expression") == expression_mode
    assert print_last_line(code, "always") == upstream


def test_truncate_middle_keeps_both_ends():
    assert truncate_middle("a" * 256, 256) == "a" * 256
    text = "h" * 128 + "m" * 10 + "t" * 128
    assert truncate_middle(text, 256) == "h" * 128 + TRUNCATION_MARKER + "t" * 128
    assert truncate_middle("abcdefghij", 5) == "ab" + TRUNCATION_MARKER + "ij"


def test_response_text_by_status():
    def result(status, exit_code):
        return ExecutionResult(status, "out", "err", exit_code, 0.1, False)

    assert response_text(result("ok", 0)) == "outerr"
    assert response_text(result("error", 1)) == "outerr"
    assert response_text(result("killed", -24)) == "outerr"  # finished, by a signal (CPU limit)
    assert response_text(result("timeout", -9)) == NOT_FINISHED_TEXT
    assert response_text(result("killed", None)) == NOT_FINISHED_TEXT  # the sandbox lost it


def test_execute_runs_the_post_processed_code(sandbox):
    tool = interpreter(sandbox)
    answer = tool.execute("I will check.\n```python\nimport math\nx = math.factorial(5)\nx\n```")
    assert isinstance(answer, ToolResult)
    assert (answer.text, answer.ok, answer.result.status) == ("120\n", True, "ok")
    assert tool.execute("x = 1").text == "", "expression mode must not wrap an assignment"
    assert tool.execute({"code": 1}).text == "{'code': 1}\n", "non-string code is run as str(code), as upstream"


def test_always_mode_reproduces_upstream(sandbox):
    answer = interpreter(sandbox, print_last_line="always").execute("x = 1")
    assert not answer.ok and "TypeError" in answer.text and "'x' is an invalid keyword argument" in answer.text


def test_failures_and_timeouts(sandbox):
    tool = interpreter(sandbox)
    error = tool.execute("1 / 0")
    assert not error.ok and error.text.startswith("Traceback") and "ZeroDivisionError" in error.text
    timeout = tool.execute("while True:\n    pass")
    assert (timeout.text, timeout.ok, timeout.result.status) == (NOT_FINISHED_TEXT, False, "timeout")


def test_long_output_is_truncated_to_the_configured_length(sandbox):
    answer = interpreter(sandbox).execute("print('a' * 200 + 'b' * 200)")
    assert answer.text == "a" * 128 + TRUNCATION_MARKER + "b" * 127 + "\n"
    short = interpreter(sandbox, max_output_chars=16).execute("print('0123456789' * 3)")
    assert short.text == "01234567" + TRUNCATION_MARKER + "3456789\n"


def test_execute_many_keeps_order(sandbox):
    answers = interpreter(sandbox).execute_many([f"{i} * {i}" for i in range(6)] + ["1 / 0"])
    assert [a.text for a in answers[:6]] == [f"{i * i}\n" for i in range(6)]
    assert [a.ok for a in answers] == [True] * 6 + [False]
