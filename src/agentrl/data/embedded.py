"""The embedded task: three small families that mirror the paper's benchmark kinds.

- ``arith`` (like AIME): integer arithmetic with products that a 1-5 M-parameter model cannot
  compute itself; the answer is an integer in ``\\boxed{}``. Difficulty = number of operands
  and digits (levels 1-8). Numbers stay short (at most 3 digits, answers at most 10) because
  every digit must be copied exactly twice (problem -> code, tool output -> answer): the tiny
  pretrained model copies a dozen digits reliably, and a 30-digit copy almost never.
- ``choice`` (like GPQA): four lettered options, one of them the value of such an
  expression, the others off by 1-9; the answer is the letter. The options are written
  ``A=-26, B=-21, C=-29, D=-24``, and the solver picks the letter *with the tool*: it copies the
  options and the expression into ``options = dict(A=-26, ...)`` and
  ``print([k for k in options if options[k] == <expression>])``, then boxes the letter the tool
  printed. Every step is then a copy the tiny model can learn (problem -> code, tool output ->
  answer), as in ``arith``. Measured: with the letter looked up in the prompt by the model itself
  (``The value is -26 (A).``, options ``-26 (A)``, or letter-first ones) the 1.5 M-parameter SFT
  model picked the letter at chance, after 14 epochs, however well it computed the value.
- ``program`` (like LiveCodeBench): a small stdin/stdout task from a set of templates of
  growing length; the answer is a fenced python program graded on hidden test cases.

Everything is deterministic from the seed. SFT trajectories are *real end to end*, as the
paper's data: a scripted solver writes code, the code runs in the project's code interpreter
(the same sandbox and output post-processing the agent loop uses), and the next assistant turn
is written from the real tool output it got back. A configurable share of trajectories contains
a failed first attempt (a crash, code that prints nothing, or a wrong program whose output does
not match the example) followed by a recovery. Another share of the arith trajectories
(``direct_answer_share``) answers at once, without the tool: the scripted solver states the true
value, which the tiny model cannot compute, so the SFT model that imitates it answers wrongly
there and RL learns to call the tool instead (the paper's SFT data, too, mixes tool-using with
text-only solutions). Only arith: a direct answer there is never right, so the reward tells the
two apart without noise (a guessed choice letter is right one time in four). Held-out eval
problems never share their text with SFT or RL-pool problems.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.config import EmbeddedDataConfig
from agentrl.data.prompts import CODE_INTERPRETER_TOOL, embedded_prompt
from agentrl.data.records import Message, Problem, SftExample

DATA_SOURCES = {"arith": "embedded-arith", "choice": "embedded-choice", "program": "embedded-code"}
ABILITIES = {"arith": "math", "choice": "science", "program": "code"}
LETTERS = "ABCD"
NUM_CODE_CASES = 4


# --------------------------------------------------------------------------- arithmetic
# Levels 1-5 are short (2-3 operands of 1-3 digits); 6-8 have 4-5 operands of 2-3 digits, so
# every problem -> code and tool output -> answer copy is longer. Measured, the pretrained SFT
# model copies them almost as well (docs/experiments.md, 2026-12-03): they widen the task more
# than they lower its accuracy.
ARITH_LEVELS = 8
_OPERANDS = {1: 2, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 4, 8: 5}
_DIGITS = {1: (1, 2), 2: (2, 2), 3: (2, 3), 4: (1, 2), 5: (2, 2), 6: (2, 3), 7: (3, 3), 8: (2, 3)}
_MAX_PRODUCTS = 2  # at most two '*' per expression: answers stay within 10 characters


def _arith_expression(rng: random.Random, level: int) -> str:
    """An integer expression whose size grows with ``level`` (1-``ARITH_LEVELS``).

    Levels 5 and 7 put one parenthesised pair around the first two operands, which changes the
    order of operations.
    """
    operands = _OPERANDS[level]
    numbers = []
    for _ in range(operands):
        width = rng.randint(*_DIGITS[level])
        numbers.append(str(rng.randint(10 ** (width - 1), 10**width - 1)))
    ops = [rng.choice(["+", "-", "*"]) for _ in range(operands - 1)]
    while ops.count("*") > _MAX_PRODUCTS:
        ops[ops.index("*")] = rng.choice(["+", "-"])
    # No spaces: every token of the expression is then distinct from its neighbours, so copying it
    # into code is a chain of unambiguous "what came after this token" lookups.
    head = f"{numbers[0]}{ops[0]}{numbers[1]}"
    if level in (5, 7):
        head = f"({head})"
    expression = head
    for op, number in zip(ops[1:], numbers[2:]):
        expression = f"{expression}{op}{number}"
    return expression


def _distractors(rng: random.Random, value: int) -> list[int]:
    """Three wrong options, ``value`` plus offsets in -9..-1 or 1..9 whose last digits all differ.

    Guessing stays at chance without the tool: the model cannot compute the value to the unit.
    """
    residues = rng.sample(range(1, 10), 3)  # distinct nonzero changes of the last digit
    return sorted(value + (r if rng.random() < 0.5 else r - 10) for r in residues)


def options_text(values: list[int]) -> str:
    """``[-26, -21]`` -> ``"A=-26, B=-21"``: the options as the prompt shows them.

    The same text is valid inside ``dict(...)``, so the solver's code copies it verbatim.
    """
    return ", ".join(f"{LETTERS[i]}={v}" for i, v in enumerate(values))


def option_letters(options: str) -> dict[str, str]:
    """``"A=-26, B=-27"`` -> ``{"-26": "A", "-27": "B"}``: each option's value and its letter."""
    out = {}
    for item in options.split(", "):
        letter, sep, value = item.partition("=")
        if not sep or letter not in tuple(LETTERS) or not value.lstrip("-").isdigit():
            raise ValueError(f"option {item!r} of {options!r} is not LETTER=INTEGER")
        out[value] = letter
    return out


def choice_code(options: str, expression: str) -> tuple[str, str]:
    """The options line, and the expression that lists the letters whose option equals the value."""
    return f"options = dict({options})", f"[k for k in options if options[k] == {expression}]"


# --------------------------------------------------------------------------- programs
@dataclass(frozen=True)
class ProgramTemplate:
    name: str
    statement: str
    solution: str
    wrong_solution: str  # a plausible first attempt with a real bug, used for recoveries
    make_input: Callable[[random.Random], str]


def _ints_line(rng: random.Random, lo: int = 3, hi: int = 7) -> str:
    return " ".join(str(rng.randint(-20, 99)) for _ in range(rng.randint(lo, hi)))


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9)))


def _column(rng: random.Random) -> str:
    values = [str(rng.randint(1, 99)) for _ in range(rng.randint(2, 5))]
    return "\n".join([str(len(values)), *values])


PROGRAM_TEMPLATES: tuple[ProgramTemplate, ...] = (
    ProgramTemplate("reverse", "read a word and print it reversed.", "print(input()[::-1])", "print(input())", _word),
    ProgramTemplate(
        "upper", "read a word and print it in upper case.", "print(input().upper())", "print(input().lower())", _word
    ),
    ProgramTemplate(
        "sum",
        "read integers from one line and print their sum.",
        "print(sum(map(int, input().split())))",
        "print(max(map(int, input().split())))",
        _ints_line,
    ),
    ProgramTemplate(
        "max",
        "read integers from one line and print the largest.",
        "print(max(map(int, input().split())))",
        "print(min(map(int, input().split())))",
        _ints_line,
    ),
    ProgramTemplate(
        "count",
        "read integers from one line and print how many there are.",
        "print(len(input().split()))",
        "print(len(input()))",
        _ints_line,
    ),
    ProgramTemplate(
        "range",
        "read integers from one line and print the largest minus the smallest.",
        "a = list(map(int, input().split()))\nprint(max(a) - min(a))",
        "a = list(map(int, input().split()))\nprint(max(a) + min(a))",
        _ints_line,
    ),
    ProgramTemplate(
        "sorted",
        "read integers from one line and print them sorted, separated by spaces.",
        "print(*sorted(map(int, input().split())))",
        "print(*sorted(input().split()))",
        _ints_line,
    ),
    ProgramTemplate(
        "evens",
        "read integers from one line and print how many are even.",
        "print(sum(1 for x in map(int, input().split()) if x % 2 == 0))",
        "print(sum(1 for x in map(int, input().split()) if x % 2 == 1))",
        _ints_line,
    ),
    ProgramTemplate(
        "column",
        "read n, then n lines with one integer each, and print their sum.",
        "n = int(input())\nprint(sum(int(input()) for _ in range(n)))",
        "n = int(input())\nprint(n)",
        _column,
    ),
)


def with_stdin(solution: str, stdin: str) -> str:
    """Tool code that runs ``solution`` on ``stdin``: the interpreter tool itself has no stdin."""
    return f"import io, sys\nsys.stdin = io.StringIO({stdin + chr(10)!r})\n{solution}"


# --------------------------------------------------------------------------- problems
@dataclass(frozen=True)
class Draft:
    """A problem before grading material that needs execution (program outputs) is filled in."""

    family: str
    key: str  # the text that makes two problems the same (dedup across splits)
    fields: dict[str, str]
    answer: str  # arith: value, choice: letter, program: template name
    level: int


def _draft(family: str, rng: random.Random) -> Draft:
    if family == "arith":
        level = rng.randint(1, ARITH_LEVELS)
        expression = _arith_expression(rng, level)
        return Draft(family, expression, {"expression": expression}, str(eval(expression)), level)
    if family == "choice":
        level = rng.randint(1, ARITH_LEVELS)
        expression = _arith_expression(rng, level)
        value = eval(expression)
        options = _distractors(rng, value) + [value]
        rng.shuffle(options)
        lines = options_text(options)
        answer = LETTERS[options.index(value)]
        return Draft(family, f"{expression}|{lines}", {"expression": expression, "options": lines}, answer, level)
    if family == "program":
        level = rng.randrange(len(PROGRAM_TEMPLATES))
        template = PROGRAM_TEMPLATES[level]
        inputs = [template.make_input(rng) for _ in range(NUM_CODE_CASES)]
        return Draft(
            family,
            f"{template.name}|{inputs}",
            {"statement": template.statement, "inputs": json.dumps(inputs)},
            template.name,
            level,
        )
    raise ValueError(f"unknown embedded family {family!r}; known: {sorted(DATA_SOURCES)}")


def _drafts(family: str, count: int, rng: random.Random, taken: set[str]) -> list[Draft]:
    out: list[Draft] = []
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 100 * count:
            raise RuntimeError(f"embedded '{family}': could not draw {count} distinct problems")
        draft = _draft(family, rng)
        if draft.key not in taken:
            taken.add(draft.key)
            out.append(draft)
    return out


def _problem(draft: Draft, split: str, index: int, style: str, case_outputs: list[str] | None) -> Problem:
    fields = dict(draft.fields)
    ground_truth: str | dict
    if draft.family == "program":
        assert case_outputs is not None, "program problems need their reference outputs"
        inputs = json.loads(fields.pop("inputs"))
        fields.update(example_input=inputs[0], example_output=case_outputs[0])
        ground_truth = {"inputs": [i + "\n" for i in inputs], "outputs": [o + "\n" for o in case_outputs]}
    else:
        ground_truth = draft.answer
    content = embedded_prompt(draft.family, style, **fields)
    return Problem(
        id=f"{draft.family}-{split}-{index:05d}",
        data_source=DATA_SOURCES[draft.family],
        prompt=[{"role": "user", "content": content}],
        ability=ABILITIES[draft.family],
        ground_truth=ground_truth,
        extra={
            "family": draft.family,
            "level": draft.level,
            "split": split,
            "template": draft.answer if draft.family == "program" else None,
        },
    )


# --------------------------------------------------------------------------- the solver
def arith_conclusion(value: str | int) -> str:
    """The last turn of an arith trajectory (real, stitched and answered without the tool alike)."""
    return f"The result is {value}.\n\\boxed{{{value}}}"


def choice_conclusion(letter: str) -> str:
    """The last turn of a choice trajectory (real and stitched alike)."""
    return f"Option {letter} matches.\n\\boxed{{{letter}}}"


def direct_answer(draft: Draft) -> str:
    """The one assistant turn of an arith trajectory that answers without the tool: the words the
    tool-using trajectory ends with, so the response's first words decide tool or no tool."""
    if draft.family != "arith":
        raise ValueError(f"only arith trajectories answer without the tool, not {draft.family!r}")
    return arith_conclusion(draft.answer)


def broken_print(expression: str, rng: random.Random) -> str:
    """A failed first attempt at printing ``expression``: a ``NameError`` or an assignment that prints nothing."""
    return f"prnt({expression})" if rng.random() < 0.5 else f"result = {expression}"


def tool_call_turn(code: str, content: str) -> Message:
    """An assistant turn with ``content`` and one code_interpreter call running ``code``."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}],
    }


def last_line(text: str) -> str:
    """The last non-empty line of a tool output, stripped (what an answer is read from)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class TrajectoryWriter:
    """What every SFT trajectory writer holds: the tool, its random stream and the two shares it
    draws from. The writers draw in the same order, so one seed gives the same problems a failed
    call, or no call at all, in every data set."""

    def __init__(
        self,
        execute: Callable[[str], str],
        rng: random.Random,
        failed_attempt_share: float,
        direct_answer_share: float = 0.0,
    ):
        self.execute = execute  # code -> tool-response text, exactly as the agent loop shows it
        self.rng = rng
        self.failed_attempt_share = failed_attempt_share
        self.direct_answer_share = direct_answer_share

    def answers_directly(self, draft: Draft) -> bool:
        """Whether this arith trajectory answers without the tool (share ``direct_answer_share``).

        A share of 0 draws nothing, so the rest of the random stream (the failed attempts) stays
        what it was before the share existed.
        """
        share = self.direct_answer_share
        return draft.family == "arith" and share > 0 and self.rng.random() < share


class ScriptedSolver(TrajectoryWriter):
    """Writes the SFT trajectories: code goes through the real tool; answers come from its output.

    This is the plain reasoning mode (``data.embedded.reasoning_mode: plain``): one short line, then
    the call. :mod:`agentrl.data.reasoning_modes` subclasses it for the reasoning ablation's other
    modes, which change what the turns before a call say (:meth:`_intro`, :meth:`_recovery`) and
    how arith and choice compute (:meth:`_arith_value`, :meth:`_choice_letters`).
    """

    def _tool_turn(self, messages: list[Message], code: str, content: str) -> str:
        output = self.execute(code)
        messages += [tool_call_turn(code, content), {"role": "tool", "content": output}]
        return output

    def _intro(self, draft: Draft) -> str:
        """The text of the turn that makes an arith or choice trajectory's first call."""
        return "Let me compute it with the tool."

    def _recovery(self, output: str, draft: Draft) -> str:
        """The text of the turn after a failed attempt: what the tool showed decides what it says."""
        if not output.strip():
            return "The code printed nothing. Let me print the result."
        if "Error" in output:
            return "The code failed. Let me fix it."
        return f"It printed {last_line(output)}. Let me check it once more."

    def _compute(
        self, messages: list[Message], draft: Draft, expression: str, setup: str = "", intro: str | None = None
    ) -> str:
        """Print ``expression`` with the tool after the ``setup`` lines, maybe after a failed attempt;
        return the last line the tool printed. ``intro`` (default :meth:`_intro`) opens the first call."""
        prefix = f"{setup}\n" if setup else ""
        intro = self._intro(draft) if intro is None else intro
        if self.rng.random() < self.failed_attempt_share:
            output = self._tool_turn(messages, prefix + broken_print(expression, self.rng), intro)
            intro = self._recovery(output, draft)  # written from the real output
        return last_line(self._tool_turn(messages, f"{prefix}print({expression})", intro))

    def _arith_value(self, messages: list[Message], draft: Draft) -> str:
        """The value of an arith problem's expression, as the tool printed it (the calls added to ``messages``)."""
        return self._compute(messages, draft, draft.fields["expression"])

    def _choice_letters(self, messages: list[Message], draft: Draft) -> str:
        """The list of matching letters of a choice problem, as the tool printed it."""
        setup, matches = choice_code(draft.fields["options"], draft.fields["expression"])
        return self._compute(messages, draft, matches, setup)

    def solve(self, problem: Problem, draft: Draft) -> list[Message]:
        messages: list[Message] = [dict(problem.prompt[0])]
        if self.answers_directly(draft):
            messages.append({"role": "assistant", "content": direct_answer(draft)})
        elif draft.family == "arith":
            value = self._arith_value(messages, draft)
            if value != draft.answer:
                raise RuntimeError(f"{problem.id}: the tool printed {value!r}, not the value {draft.answer}")
            messages.append({"role": "assistant", "content": arith_conclusion(value)})
        elif draft.family == "choice":
            printed = self._choice_letters(messages, draft)
            if printed != f"[{draft.answer!r}]":
                raise RuntimeError(f"{problem.id}: the tool printed {printed!r}, not the letter [{draft.answer!r}]")
            messages.append({"role": "assistant", "content": choice_conclusion(draft.answer)})
        else:
            self._program(messages, problem)
        return messages

    def _program(self, messages: list[Message], problem: Problem) -> None:
        template = next(t for t in PROGRAM_TEMPLATES if t.name == problem.extra["template"])
        example_input = problem.ground_truth["inputs"][0].rstrip("\n")
        expected = problem.ground_truth["outputs"][0].rstrip("\n")
        intro = "Let me test my program on the example."
        if self.rng.random() < self.failed_attempt_share:
            wrong_code = with_stdin(template.wrong_solution, example_input)
            output = self.execute(wrong_code)
            # Only a bug that shows on the example makes a recovery story; one that does not
            # show would teach the model to rewrite code that just passed its check.
            if last_line(output) != expected:
                messages += [tool_call_turn(wrong_code, intro), {"role": "tool", "content": output}]
                intro = f"It printed {last_line(output) or 'nothing'}, but {expected} is expected. Let me fix it."
        output = self._tool_turn(messages, with_stdin(template.solution, example_input), intro)
        if last_line(output) != expected:
            raise RuntimeError(f"{problem.id}: reference solution printed {output!r}, expected {expected!r}")
        messages.append(
            {"role": "assistant", "content": f"The output matches the example.\n```python\n{template.solution}\n```"}
        )


# --------------------------------------------------------------------------- assembly
@dataclass(frozen=True)
class EmbeddedDataset:
    sft: list[SftExample]
    rl_pool: list[Problem]
    eval_sets: dict[str, list[Problem]]


def generate(
    cfg: EmbeddedDataConfig,
    seed: int,
    *,
    execute: Callable[[str], str],
    run_program: Callable[[list[tuple[str, str]]], list[str]],
    trajectory_writer: Callable = ScriptedSolver,
) -> EmbeddedDataset:
    """Draw every split of every family of ``cfg`` (``data.embedded``), then write the SFT
    trajectories through the real tool.

    ``execute(code) -> text`` is the code-interpreter tool; ``run_program([(code, stdin)]) ->
    [stdout]`` runs reference solutions to make the hidden test cases of ``program`` problems.
    Eval problems are drawn first so that no later split can take their text.
    ``trajectory_writer(execute, rng, failed_attempt_share, direct_answer_share)`` writes the SFT conversations:
    ScriptedSolver (real trajectories, plain mode), a writer of agentrl.data.reasoning_modes or
    agentrl.data.stitched.StitchedSolver, the writer that ``cfg.sft_trajectories`` and
    ``cfg.reasoning_mode`` name (the caller picks it: both modules build on this one).
    """
    rng = random.Random(seed)
    sft: list[SftExample] = []
    rl_pool: list[Problem] = []
    eval_sets: dict[str, list[Problem]] = {}
    solver = trajectory_writer(execute, random.Random(seed + 1), cfg.failed_attempt_share, cfg.direct_answer_share)
    for family in cfg.families:
        taken: set[str] = set()
        splits = {
            "eval": _drafts(family, cfg.eval_per_family, rng, taken),
            "sft": _drafts(family, cfg.sft_per_family, rng, taken),
            "rl": _drafts(family, cfg.rl_pool_per_family, rng, taken),
        }
        outputs = _program_outputs(splits, run_program) if family == "program" else {}
        problems = {
            split: [_problem(d, split, i, cfg.prompt_style, outputs.get((split, i))) for i, d in enumerate(drafts)]
            for split, drafts in splits.items()
        }
        eval_sets[family] = problems["eval"]
        rl_pool += problems["rl"]
        for problem, draft in zip(problems["sft"], splits["sft"]):
            messages = solver.solve(problem, draft)
            sft.append(SftExample(id=problem.id, messages=messages, tools=[CODE_INTERPRETER_TOOL]))
    return EmbeddedDataset(sft=sft, rl_pool=rl_pool, eval_sets=eval_sets)


def _program_outputs(splits: dict[str, list[Draft]], run_program) -> dict[tuple[str, int], list[str]]:
    """Reference outputs of every test case, computed by really running the reference solution."""
    jobs, where = [], []
    for split, drafts in splits.items():
        for i, draft in enumerate(drafts):
            template = next(t for t in PROGRAM_TEMPLATES if t.name == draft.answer)
            for stdin in json.loads(draft.fields["inputs"]):
                jobs.append((template.solution, stdin + "\n"))
                where.append((split, i))
    results = run_program(jobs)
    out: dict[tuple[str, int], list[str]] = {}
    for key, stdout in zip(where, results):
        out.setdefault(key, []).append(stdout.rstrip("\n"))
    return out
