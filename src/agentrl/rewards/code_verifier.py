"""Code answers (LiveCodeBench-v6, the RL pool's ``train-code-*`` rows, ``embedded-code``).

Recipe (docs/recipe.md section 4): the last fenced python block of the response is the solution;
it is graded against the row's tests in the sandbox, one sandbox run per case with a per-case
timeout (``reward.code_case_timeout_s``; upstream: 30 s). Score = fraction of cases passed,
``acc`` = all passed, -1 when there is no code block, the code does not parse or a functional
answer lacks its entry point; with ``reward.invalid_ground_truth: score`` the answer is read
before the tests, as code_math reads it, so those -1 come first whatever the ground truth holds.
Three kinds of tests (the ground truth is a dict, or its JSON string, or under
``reward.code_ground_truth: literal_eval`` the text upstream reads with ``ast.literal_eval``:
:mod:`agentrl.rewards.code_truth`; ``inputs`` / ``outputs`` are lists, or their Python spelling
as a string, read with ``ast.literal_eval`` as SandboxFusion's ``check_correctness`` reads it):

- stdin/stdout ``{"inputs": [...], "outputs": [...]}``: the program reads the case's input on
  stdin; it passes when it exits cleanly and ``stdout.rstrip("\\n")`` equals the expected
  output (also with trailing newlines stripped: upstream's data has both spellings). Other
  whitespace counts: a trailing space is a wrong answer, as upstream. A case spelled as its list
  of lines is joined (a deliberate departure); ``reward.stdio_tests: upstream`` sends
  ``str(case)`` as upstream does, whatever its type (:class:`UpstreamStdioTests`).
- functional ``{"inputs", "outputs", "fn_name"}``: each input is the call's arguments, either
  a list or a string of one JSON value per line (LiveCodeBench's spelling); the expected
  output is a value or its JSON. The target is ``Solution().fn_name`` when the code defines a
  ``class Solution`` with that method, else a top-level ``fn_name``. Upstream moves a free
  function into ``class Solution`` with the AST, so a recursive function, or module code calling
  it, fails there (a deliberate departure: resolving the name at run time keeps a correct
  solution correct; ``reward.functional_tests: upstream`` rewrites, :func:`as_solution_method`).
  Code with neither the text ``class Solution`` nor a
  top-level ``def fn_name`` scores -1 like code that does not parse: upstream's rewrite finds
  no function to wrap and returns -1 before running anything. The solution is executed with
  ``__name__ != "__main__"`` so a demo ``main`` block does not wait on stdin; the names
  SandboxFusion's wrapper imports before the solution (``math``, ``copy``, ``sys``, ... star-
  imported and as modules: :data:`FUNCTIONAL_PRELUDE`) are there, as upstream.
  The return value travels back as JSON (tuples become lists) and is compared on the host:
  equal to the expected value, or to the single element of a one-element expected list (the
  APPS/TACO convention of wrapping outputs). ``reward.functional_tests: upstream`` grades as
  SandboxFusion's ``fn_name`` wrapper instead (:class:`UpstreamFunctionalTests`). A ``fn_name``
  that is null or empty gives stdin/stdout tests; ``reward.empty_fn_name: upstream`` runs them
  only for an answer holding ``class Solution`` (-1 otherwise: code_math's rewrite finds no function).
- LeetCode ``{"entry_point", "import_prefix", "test_code"}``: credit per assert, as upstream:
  ``test_code`` is split into its non-empty lines; the first (``def check(candidate):``) joined
  with each later line is one case (``check`` with one assert, called on ``entry_point``), and
  the score is the fraction of cases that hold (3 of 4 asserts: 0.75).

The grader decides correctness on the host from the run's status and output. A pass is never
"the program exited cleanly": a stdin case must print the expected output, a functional case
must print its return value, which the host compares, and a LeetCode case passes only when the
check process of :mod:`agentrl.rewards.leetcode_harness` ran the assert to its end and printed
its pass line, on a stdout the solution's process does not hold; the solution runs in a process
of its own, which never sees the test (it arrives on the checker's stdin after the fork), and
hands back return values as plain data only. So ``os._exit(0)``,
``sys.exit(0)``, ``atexit`` hooks, exits from ``sys.excepthook``, ``threading.excepthook``,
finalizers or signal handlers, a replaced ``__build_class__``, a redefined ``check`` or
``AssertionError``, patched builtins and always-equal objects score as failures. (Departure:
upstream runs ``prefix + solution + check`` as one program and pays any exit status 0;
docs/fidelity.md.) The solution's own prints during a functional call are captured so they
cannot fake a result line.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import RewardConfig
from agentrl.rewards import leetcode_harness
from agentrl.rewards.base import InvalidGroundTruthError, Job, PendingVerdict, Verdict
from agentrl.rewards.code_truth import (
    as_sent,
    boxed_text_verdict,
    case_list,
    ground_truth_text,
    is_boxed_route,
    read_code_truth,
)
from agentrl.rewards.leetcode_harness import PASSED as LEETCODE_PASSED

if TYPE_CHECKING:
    from agentrl.tools.sandbox import ExecutionResult

_FENCED_PYTHON = re.compile(r"```(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
# code_math's pattern (reward.code_block: upstream): case-sensitive, the newline right after the tag.
_UPSTREAM_FENCED_PYTHON = re.compile(r"```python\n(.*?)```", re.DOTALL)
RESULT_MARKER = "@@agentrl-functional-result@@"
# The names SandboxFusion's fn_name wrapper (sandbox_fusion/utils.py: _process_single_case) puts
# before every functional solution, in its order: a solution may use gcd, inf, deepcopy or sys.
# unimported there. `from builtins import *` after the others restores the builtins that
# `from math import *` (pow), `from re import *` (compile) or `from io import *` (open) replace.
_WRAPPER_MODULES = (
    "string re datetime collections heapq bisect copy math random statistics itertools functools operator io sys json"
).split()
FUNCTIONAL_PRELUDE = (
    "import traceback\n"
    + "".join(f"from {module} import *\n" for module in _WRAPPER_MODULES)
    + "from builtins import *\nfrom typing import *\n"
    + "".join(f"import {module}\n" for module in _WRAPPER_MODULES)
)
# The harness runs the solution's source with exec() so that it is not "__main__" and so that a
# `from __future__` line in it stays legal (it must open the compiled unit). Both harnesses call
# it this way; they differ in where the arguments come from and how the result is printed.
_CALL_SOLUTION = """\
_namespace = {{"__name__": "solution"}}
_real_stdout, _sys.stdout = _sys.stdout, _io.StringIO()
try:
    exec({prelude!r}, _namespace)
    _prelude = dict(_namespace)
    exec(compile({source!r}, "<solution>", "exec"), _namespace)
LOOKUP
    _result = _target(*CALL_ARGS)
finally:
    _sys.stdout = _real_stdout
"""
# The project's target: Solution's method when the class has one, else a function of that name
# that the solution defined (not the prelude's operator.add for fn_name "add").
_SOLUTION_FIRST = """\
    _cls = _namespace.get("Solution")
    if isinstance(_cls, type) and hasattr(_cls, {fn_name!r}):
        _target = getattr(_cls(), {fn_name!r})
    elif callable(_namespace.get({fn_name!r})) and _namespace[{fn_name!r}] is not _prelude.get({fn_name!r}):
        _target = _namespace[{fn_name!r}]
    else:
        raise NameError("the solution defines neither Solution.{fn_name} nor a function {fn_name}")"""
# The wrapper's: any global of that name first (a prelude name too: fn_name "search" is re.search
# there), then Solution's attribute.
_GLOBAL_FIRST = """\
    if {fn_name!r} in _namespace:
        _target = _namespace[{fn_name!r}]
    elif "Solution" in _namespace:
        _target = getattr(_namespace["Solution"](), {fn_name!r})
    else:
        raise NameError("the solution defines neither Solution.{fn_name} nor a function {fn_name}")"""
_FUNCTIONAL_HARNESS = (
    "import io as _io, json as _json, sys as _sys\n"
    + _CALL_SOLUTION.replace("LOOKUP", _SOLUTION_FIRST).replace("CALL_ARGS", "_json.loads({args_json!r})")
    + "print({marker!r} + _json.dumps(_result, default=repr))\n"
)


# reward.functional_tests: upstream. SandboxFusion's fn_name wrapper reads the arguments from
# stdin, one json.loads per line (blank lines too), and prints the result: json.dumps for
# dict/list/tuple/None/bool, str() for the rest. The solution still runs as in the project's
# harness (not "__main__", its own prints captured), so only the marked line is the result.
_UPSTREAM_FUNCTIONAL_HARNESS = (
    """\
import io as _io, json as _json, sys as _sys
_raw = _sys.stdin.read()
_args = [_json.loads(_line) for _line in _raw.split("\\n")] if _raw.strip() else []
"""
    + _CALL_SOLUTION.replace("LOOKUP", _GLOBAL_FIRST).replace("CALL_ARGS", "_args")
    + """\
if isinstance(_result, (dict, list, tuple)) or _result is None or isinstance(_result, bool):
    _text = _json.dumps(_result)
else:
    _text = str(_result)
_sys.stdout.write({marker!r} + _text + "\\n")
"""
)


def extract_code(response: str, code_block: str = "project") -> str | None:
    """The last fenced python block of ``response``, or None: ```python / ```py / ```python3 in
    any case (``project``), or only a case-sensitive ```python and a newline (``upstream``), in
    the text between the first ``</think>`` and the next one when there is one (code_math's
    ``split("</think>")[1]``)."""
    pattern = _UPSTREAM_FENCED_PYTHON if code_block == "upstream" else _FENCED_PYTHON
    if code_block == "upstream" and "</think>" in response:
        response = response.split("</think>")[1]
    blocks = pattern.findall(response)
    return blocks[-1] if blocks else None


# --------------------------------------------------------------------------- test kinds
def _class_solution_guard(reason: str | None, code: str) -> str | None:
    """``reason`` when the tests run only an answer holding ``class Solution`` and ``code`` does not."""
    return reason if reason and "class Solution" not in code else None


@dataclass(frozen=True)
class StdioTests:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    class_solution_only: str | None = None  # see CodeTruth.class_solution_only and reward.empty_fn_name

    def __len__(self) -> int:
        return len(self.inputs)

    def unrunnable(self, code: str, tree: ast.Module) -> str | None:
        return _class_solution_guard(self.class_solution_only, code)

    def jobs(self, code: str) -> list[Job]:
        return [(code, stdin) for stdin in self.inputs]

    def outcome(self, index: int, result: ExecutionResult) -> str:
        if result.status != "ok":
            return result.status
        return "pass" if result.stdout.rstrip("\n") == self.outputs[index].rstrip("\n") else "wrong_answer"


@dataclass(frozen=True)
class FunctionalTests:
    fn_name: str
    args: tuple[list[Any], ...]
    outputs: tuple[Any, ...]
    class_solution_only: str | None = None

    def __len__(self) -> int:
        return len(self.args)

    def jobs(self, code: str) -> list[Job]:
        return [
            (
                _FUNCTIONAL_HARNESS.format(
                    prelude=FUNCTIONAL_PRELUDE,
                    source=code,
                    fn_name=self.fn_name,
                    args_json=json.dumps(args),
                    marker=RESULT_MARKER,
                ),
                None,
            )
            for args in self.args
        ]

    def unrunnable(self, code: str, tree: ast.Module) -> str | None:
        """Why upstream would score ``code`` -1 before running it, or None (its rewrite's test)."""
        if reason := _class_solution_guard(self.class_solution_only, code):
            return reason
        if "class Solution" in code:
            return None
        if any(isinstance(node, ast.FunctionDef) and node.name == self.fn_name for node in tree.body):
            return None
        return f"no_entry_point: neither class Solution nor a top-level def {self.fn_name}"

    def outcome(self, index: int, result: ExecutionResult) -> str:
        if result.status != "ok":
            return result.status
        lines = [line for line in result.stdout.splitlines() if line.startswith(RESULT_MARKER)]
        if not lines:
            return "error"
        actual = json.loads(lines[-1][len(RESULT_MARKER) :])
        expected = self.outputs[index]
        matches = actual == expected or (isinstance(expected, list) and len(expected) == 1 and actual == expected[0])
        return "pass" if matches else "wrong_answer"


@dataclass(frozen=True)
class UpstreamFunctionalTests(FunctionalTests):
    """``fn_name`` tests graded as upstream (``reward.functional_tests: upstream``).

    ``args`` and ``outputs`` are the ground truth's raw entries. Case i runs with
    ``str(inputs[i])`` as stdin, so a list input ``[1, 2]`` is one line and one argument (the
    list), a string ``"1\\n2"`` two; it passes when the printed result equals
    ``str(outputs[i])`` after ``rstrip("\\n")`` (a ``None`` output passes any run that finishes),
    so ``True`` (printed ``true``) never equals ``True`` and ``[3]`` never equals ``3``. Before
    that, code without the text ``class Solution`` has its top-level ``def fn_name`` moved into a
    ``class Solution`` (:func:`as_solution_method`), and the wrapper calls a global ``fn_name``
    before ``Solution().fn_name``.
    """

    def jobs(self, code: str) -> list[Job]:
        if "class Solution" not in code:  # code_math: compute_score
            code = as_solution_method(code, self.fn_name)
        harness = _UPSTREAM_FUNCTIONAL_HARNESS.format(
            prelude=FUNCTIONAL_PRELUDE, source=code, fn_name=self.fn_name, marker=RESULT_MARKER
        )
        return [(harness, None if value is None else as_sent(str(value))) for value in self.args]

    def outcome(self, index: int, result: ExecutionResult) -> str:
        if result.status != "ok":
            return result.status
        if RESULT_MARKER not in result.stdout:
            return "error"
        expected = self.outputs[index]
        if expected is None:
            return "pass"
        printed = result.stdout[result.stdout.rindex(RESULT_MARKER) + len(RESULT_MARKER) :]
        return "pass" if printed.rstrip("\n") == str(expected).rstrip("\n") else "wrong_answer"


def as_solution_method(code: str, fn_name: str) -> str:
    """code_math's ``convert_function_to_class_method``: every top-level ``def fn_name`` leaves the
    module and the last one becomes the method of a ``class Solution`` appended at its end (a
    ``self`` first argument added unless there is one). The function's own name is gone from the
    module: a recursive call, or module code calling it, raises ``NameError`` there, as upstream."""
    tree = ast.parse(code)
    target, body = None, []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == fn_name:
            target = node
        else:
            body.append(node)
    assert target is not None, "FunctionalTests.unrunnable refuses code without a top-level def fn_name"
    if not (target.args.args and target.args.args[0].arg == "self"):
        target.args.args.insert(0, ast.arg(arg="self"))
    solution = ast.ClassDef(name="Solution", bases=[], keywords=[], body=[target], decorator_list=[])
    if "type_params" in ast.ClassDef._fields:  # Python 3.12+; 3.12's unparse needs it set
        solution.type_params = []
    tree.body = [*body, solution]
    return ast.unparse(ast.fix_missing_locations(tree))


@dataclass(frozen=True)
class UpstreamStdioTests:
    """stdin/stdout tests as SandboxFusion's ``check_correctness`` runs them (``reward.stdio_tests:
    upstream``): ``str(inputs[i])`` is the stdin (a list of lines is its ``str``, not its lines) and
    ``str(outputs[i])`` the expected output, both compared after ``rstrip("\\n")``; a ``None``
    output passes any run that finishes."""

    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    class_solution_only: str | None = None

    def __len__(self) -> int:
        return len(self.inputs)

    def unrunnable(self, code: str, tree: ast.Module) -> str | None:
        return _class_solution_guard(self.class_solution_only, code)

    def jobs(self, code: str) -> list[Job]:
        return [(code, None if value is None else as_sent(str(value))) for value in self.inputs]

    def outcome(self, index: int, result: ExecutionResult) -> str:
        if result.status != "ok":
            return result.status
        expected = self.outputs[index]
        if expected is None or result.stdout.rstrip("\n") == str(expected).rstrip("\n"):
            return "pass"
        return "wrong_answer"


@dataclass(frozen=True)
class CheckHarness:
    """LeetCode-style tests: one case per assert line of ``test_code`` (upstream's split)."""

    entry_point: str
    import_prefix: str
    check_header: str
    assert_lines: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.assert_lines)

    def unrunnable(self, code: str, tree: ast.Module) -> str | None:
        return None

    def jobs(self, code: str) -> list[Job]:
        return [(f"{_leetcode_harness_source()}\nrun()\n", self.case(code, line)) for line in self.assert_lines]

    def case(self, code: str, assert_line: str) -> str:
        """The stdin of one case's run (the harness reads it; it is never a file the solution could read)."""
        spec = {
            "import_prefix": self.import_prefix,
            "solution": code,
            "check": self.check_header + assert_line,  # upstream's join: "def check(c):    assert ..."
            "entry_point": self.entry_point,
        }
        return json.dumps(spec, ensure_ascii=False)

    def outcome(self, index: int, result: ExecutionResult) -> str:
        if result.status != "ok":
            return self._failure(result)
        lines = result.stdout.rstrip("\n").split("\n")
        return "pass" if lines[-1] == LEETCODE_PASSED else "error"

    @staticmethod
    def _failure(result: ExecutionResult) -> str:
        last = result.stderr.rstrip("\n").rsplit("\n", 1)[-1]
        return "wrong_answer" if result.status == "error" and last.startswith("AssertionError") else result.status


@functools.cache
def _leetcode_harness_source() -> str:
    return Path(leetcode_harness.__file__).read_text(encoding="utf-8")


CodeTests = StdioTests | UpstreamStdioTests | FunctionalTests | UpstreamFunctionalTests | CheckHarness


# --------------------------------------------------------------------------- ground truth
def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)  # some rows spell a case as its list of lines
    raise InvalidGroundTruthError(f"{what} must be a string (or a list of lines), got {type(value).__name__}")


def _call_args(value: Any, what: str) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        try:
            return [json.loads(line) for line in value.split("\n") if line.strip()]
        except json.JSONDecodeError as exc:
            raise InvalidGroundTruthError(f"{what}: a line is not JSON ({exc}): {value[:80]!r}") from None
    return [value]


def _expected_value(value: Any, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise InvalidGroundTruthError(f"{what} is not JSON ({exc}): {value[:80]!r}") from None


def _check_harness(ground_truth: dict[str, Any]) -> CheckHarness:
    lines = [line for line in str(ground_truth["test_code"]).split("\n") if line != ""]
    if len(lines) < 2:
        raise InvalidGroundTruthError(
            f"code ground truth test_code needs a check definition and at least one assert line, got {lines!r}"
        )
    entry_point = str(ground_truth["entry_point"])
    try:
        ast.parse(entry_point, mode="eval")
    except SyntaxError:
        raise InvalidGroundTruthError(f"code ground truth entry_point {entry_point!r} is not an expression") from None
    return CheckHarness(
        entry_point=entry_point,
        import_prefix=str(ground_truth.get("import_prefix") or ""),
        check_header=lines[0],
        assert_lines=tuple(lines[1:]),
    )


def parse_code_tests(
    ground_truth: Any,
    functional_tests: str = "project",
    stdio_tests: str = "project",
    reading: str = "json",
    empty_fn_name: str = "stdio",
) -> CodeTests:
    """The tests a code ground truth describes, read as ``reward.code_ground_truth`` says
    (:func:`agentrl.rewards.code_truth.read_code_truth`); see the module docstring."""
    truth = read_code_truth(ground_truth, reading)
    tests, guard = truth.tests, truth.class_solution_only
    if {"entry_point", "test_code"} <= tests.keys():
        return _check_harness(tests)
    if not {"inputs", "outputs"} <= tests.keys():
        raise InvalidGroundTruthError(
            "code ground truth must have keys {inputs, outputs[, fn_name]} or {entry_point, import_prefix, "
            f"test_code}}; got keys {sorted(tests)}"
        )
    inputs, outputs = case_list(tests["inputs"], "inputs"), case_list(tests["outputs"], "outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs:
        # check_correctness raises on inputs without a length; no case: code_math divides by zero (-1)
        raise InvalidGroundTruthError(
            f"code ground truth 'inputs' must be a non-empty list and 'outputs' a list, got inputs="
            f"{str(inputs)[:60]!r}, outputs={str(outputs)[:60]!r}"
        )
    if len(inputs) != len(outputs):  # check_correctness fails every case without raising: 0.0
        raise InvalidGroundTruthError(
            f"code ground truth 'inputs' and 'outputs' must be lists of the same length, got {len(inputs)} inputs "
            f"and {len(outputs)} outputs",
            upstream_score=0.0,
        )
    fn_name = tests.get("fn_name")
    if fn_name:
        if not str(fn_name).isidentifier():
            raise InvalidGroundTruthError(f"code ground truth fn_name {fn_name!r} is not a Python identifier")
        if functional_tests == "upstream":
            return UpstreamFunctionalTests(str(fn_name), tuple(inputs), tuple(outputs), guard)
        return FunctionalTests(
            fn_name=str(fn_name),
            args=tuple(_call_args(value, f"inputs[{i}]") for i, value in enumerate(inputs)),
            outputs=tuple(_expected_value(value, f"outputs[{i}]") for i, value in enumerate(outputs)),
            class_solution_only=guard,
        )
    if "fn_name" in tests and empty_fn_name == "upstream":  # code_math's rewrite finds no def of that name
        guard = guard or f"no_entry_point: fn_name is {fn_name!r}, so code_math's rewrite into class Solution fails"
    if stdio_tests == "upstream":
        return UpstreamStdioTests(inputs=tuple(inputs), outputs=tuple(outputs), class_solution_only=guard)
    return StdioTests(
        inputs=tuple(_text(value, f"inputs[{i}]") for i, value in enumerate(inputs)),
        outputs=tuple(_text(value, f"outputs[{i}]") for i, value in enumerate(outputs)),
        class_solution_only=guard,
    )


# --------------------------------------------------------------------------- verifier
def _stderr_tail(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


class CodeVerifier:
    family = "code"

    def __init__(self, cfg: RewardConfig):
        self.case_timeout_s = cfg.code_case_timeout_s
        self.code_block = cfg.code_block
        self.functional_tests = cfg.functional_tests
        self.stdio_tests = cfg.stdio_tests
        self.reading = cfg.code_ground_truth
        self.empty_fn_name = cfg.empty_fn_name
        # reward.invalid_ground_truth: score grades as code_math: the answer's code before the tests
        self.answer_first = cfg.invalid_ground_truth == "score"

    def prepare(self, response: str, ground_truth: Any) -> PendingVerdict:
        if self.answer_first and self.reading == "literal_eval" and is_boxed_route(ground_truth):
            return PendingVerdict.ready(boxed_text_verdict(response, ground_truth_text(ground_truth)))
        code = extract_code(response, self.code_block)
        fault, tree = _read_answer(code)
        if fault and self.answer_first:
            return PendingVerdict.ready(_unrunnable(code, fault, 0))
        tests = parse_code_tests(
            ground_truth, self.functional_tests, self.stdio_tests, self.reading, self.empty_fn_name
        )
        if fault or (fault := tests.unrunnable(code, tree)):
            return PendingVerdict.ready(_unrunnable(code, fault, len(tests)))
        return PendingVerdict(jobs=tests.jobs(code), finish=lambda results: _graded(code, tests, results))


def _read_answer(code: str | None) -> tuple[str | None, ast.Module | None]:
    """(why the answer cannot be graded, its syntax tree): no code block, or code that does not parse."""
    if code is None:
        return "no_code", None
    try:
        return None, ast.parse(code)
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes in the source
        return f"syntax_error: {exc}", None


def _unrunnable(code: str | None, error: str, total: int) -> Verdict:
    details = {"error": error, "cases_passed": 0, "cases_total": total, "case_outcomes": []}
    return Verdict(score=-1.0, acc=False, pred=code, details=details)


def _graded(code: str, tests: CodeTests, results: Sequence[ExecutionResult]) -> Verdict:
    outcomes = [tests.outcome(index, result) for index, result in enumerate(results)]
    passed = outcomes.count("pass")
    details: dict[str, Any] = {"cases_passed": passed, "cases_total": len(outcomes), "case_outcomes": outcomes}
    failed = [index for index, outcome in enumerate(outcomes) if outcome != "pass"]
    if failed:
        first = results[failed[0]]
        details["first_failure"] = {
            "case": failed[0],
            "outcome": outcomes[failed[0]],
            "stderr": _stderr_tail(first.stderr),
        }
    return Verdict(score=passed / len(outcomes), acc=not failed, pred=code, details=details)
