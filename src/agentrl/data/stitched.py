"""Stitched synthetic SFT trajectories: the "stitched" arm of the paper's data ablation.

The paper (docs/recipe.md section 7) trains one SFT model on *real* end-to-end trajectories and one
on *stitched* synthetic ones: a solution written without the tool, into which tool calls and
their outputs are inserted afterwards. The tool output then does not drive the reasoning: the
text around a call was written before its output existed, and may not match it. SFT on real
trajectories reaches avg@32 29.79 on AIME25, on stitched ones 3.65.

:class:`agentrl.data.embedded.ScriptedSolver` writes the real data: each assistant turn is
written after reading the tool output it got (the answer is read off the output; a failed call
is followed by a recovery). :class:`StitchedSolver` writes the stitched data for the *same*
problems (same seed, same drafts, same prompts), in three steps:

1. **Write the solution first, without the tool.** ``arith``/``choice``: the expression worked
   out by hand, one binary operation per step in evaluation order (``"12 + 3 = 15, 15 * 4 =
   60"``, :func:`hand_steps`), the value it gives (and its option letter), then the concluding
   answer. ``program``: the output the program should print on the example (read off the
   prompt), then the concluding program. The hand work is correct and every final answer is
   right, as in a curated text-only solution: the arms differ in how text and tool output
   relate, not in the answers the SFT data teaches.
2. **Pick the insertion point**: after the worked text, before the conclusion.
3. **Splice in one tool call and its output.** The code is what the real generator runs for
   this problem at that point (``print(expression)``; for choice, the options dict and the
   letters matching the expression; or the program on the example input),
   including its failed first attempts: the same random draws as the real generator (share
   ``failed_attempt_share``) replace the call by the real generator's broken attempt (a
   ``NameError``, an assignment that prints nothing, or the template's buggy program). The
   code really runs in the project's code interpreter, so every output is the true output of
   its code.

So a stitched trajectory states its answer *before* any tool output, and the text after the
call is the pre-written conclusion whatever the output says. Where the spliced call failed, the
output (an error, nothing, the buggy program's wrong output) contradicts the conclusion that
follows it; no stitched trajectory recovers from an error, and each makes exactly one call.
The real generator, by contrast, never states the value before the tool has printed it. The
arith trajectories that answer without the tool (``direct_answer_share``) have no call to
stitch: both sets hold the same ones, word for word.

Departure from the paper: its stitched data came from an LLM's text-only reasoning with calls
inserted by another model; here the text-only solver is scripted, like the real one, so that
the two SFT sets share problems, answers, call code and output format, and differ only in the
order in which text and tool output were written.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from agentrl.data.embedded import (
    PROGRAM_TEMPLATES,
    Draft,
    TrajectoryWriter,
    arith_conclusion,
    broken_print,
    choice_code,
    choice_conclusion,
    direct_answer,
    last_line,
    option_letters,
    tool_call_turn,
    with_stdin,
)
from agentrl.data.records import Message, Problem

# Operators a hand evaluation writes out (the embedded generator uses +, - and *).
_OPERATORS: dict[type, tuple[str, Callable[[int, int], int]]] = {
    ast.Add: ("+", lambda a, b: a + b),
    ast.Sub: ("-", lambda a, b: a - b),
    ast.Mult: ("*", lambda a, b: a * b),
    ast.FloorDiv: ("//", lambda a, b: a // b),
    ast.Mod: ("%", lambda a, b: a % b),
}


def hand_steps(expression: str) -> tuple[list[str], int]:
    """Evaluate an integer expression as a person writes it out: one binary operation per step.

    Steps follow Python's evaluation order (operator precedence, parentheses, left to right),
    each ``"<left> <op> <right> = <value>"`` with the operands already reduced to numbers:
    ``"(12 + 3) * 4 - 5"`` -> ``["12 + 3 = 15", "15 * 4 = 60", "60 - 5 = 55"]``, 55.
    Raises ValueError naming the expression for anything but integers, unary minus and
    ``+ - * // %``.
    """
    steps: list[str] = []

    def reduce(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -reduce(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = reduce(node.left), reduce(node.right)
            symbol, apply = _OPERATORS[type(node.op)]
            value = apply(left, right)
            steps.append(f"{left} {symbol} {right} = {value}")
            return value
        raise ValueError(f"cannot work out {expression!r} by hand: unsupported part {ast.dump(node)}")

    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot work out {expression!r} by hand: not an expression ({exc})") from None
    value = reduce(tree.body)
    return steps, value


def _worked_text(expression: str) -> tuple[str, int]:
    steps, value = hand_steps(expression)
    work = ", ".join(steps) if steps else f"{expression} = {value}"
    return f"By hand: {work}.", value


class StitchedSolver(TrajectoryWriter):
    """Writes stitched SFT trajectories; the interface of ScriptedSolver (``solve(problem, draft)``).

    It draws from its random stream as ScriptedSolver draws, so the same problems get a failed call
    in both data sets, and the same problems are answered without the tool, in the same words
    (nothing is stitched into them).
    """

    def _spliced(self, messages: list[Message], pre_written: str, code: str, conclusion: str) -> None:
        """The pre-written text, the call spliced in after it with its real output, the conclusion."""
        output = self.execute(code)
        messages += [
            tool_call_turn(code, pre_written),
            {"role": "tool", "content": output},
            {"role": "assistant", "content": conclusion},
        ]

    def _expression_code(self, expression: str, setup: str = "") -> str:
        """The code the real generator runs first: print(expression) after ``setup``, or its broken attempt."""
        prefix = f"{setup}\n" if setup else ""
        if self.rng.random() < self.failed_attempt_share:
            return prefix + broken_print(expression, self.rng)
        return f"{prefix}print({expression})"

    def solve(self, problem: Problem, draft: Draft) -> list[Message]:
        messages: list[Message] = [dict(problem.prompt[0])]
        if self.answers_directly(draft):
            messages.append({"role": "assistant", "content": direct_answer(draft)})
        elif draft.family in ("arith", "choice"):
            expression = draft.fields["expression"]
            worked, value = _worked_text(expression)
            if draft.family == "arith":
                code = self._expression_code(expression)
                if str(value) != draft.answer:
                    raise RuntimeError(
                        f"{problem.id}: hand evaluation of {expression!r} gave {value}, not {draft.answer}"
                    )
                pre_written = f"{worked} The result is {value}. Let me check it with the tool."
                conclusion = arith_conclusion(value)
            else:
                letter = option_letters(draft.fields["options"]).get(str(value))
                if letter is None or letter != draft.answer:
                    raise RuntimeError(f"{problem.id}: the hand value {value} is not option {draft.answer}")
                setup, matches = choice_code(draft.fields["options"], expression)
                code = self._expression_code(matches, setup)
                pre_written = f"{worked} That is option {letter}. Let me check it with the tool."
                conclusion = choice_conclusion(letter)
            self._spliced(messages, pre_written, code, conclusion)
        elif draft.family == "program":
            template = next(t for t in PROGRAM_TEMPLATES if t.name == problem.extra["template"])
            example_input = problem.ground_truth["inputs"][0].rstrip("\n")
            expected = problem.ground_truth["outputs"][0].rstrip("\n")
            code = with_stdin(template.solution, example_input)
            if self.rng.random() < self.failed_attempt_share:
                wrong = with_stdin(template.wrong_solution, example_input)
                # The real generator shows a failed attempt only when its bug shows on the
                # example; the same test keeps the same problems failing in both data sets.
                if last_line(self.execute(wrong)) != expected:
                    code = wrong
            pre_written = f"On the example my program should print {expected}. Let me test it."
            conclusion = f"The output matches the example.\n```python\n{template.solution}\n```"
            self._spliced(messages, pre_written, code, conclusion)
        else:
            raise ValueError(f"{problem.id}: unknown embedded family {draft.family!r}")
        return messages
