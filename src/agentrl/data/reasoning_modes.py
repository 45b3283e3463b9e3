"""The reasoning-mode ablation's SFT data: the real trajectories, written deliberatively or reactively.

The paper (docs/recipe.md section 7) finds that a *deliberative* agent (it thinks first, then
makes few, selective tool calls) beats a *reactive* one (frequent calls with little thought
between them). The embedded model's SFT data has one style, ``plain``
(:class:`agentrl.data.embedded.ScriptedSolver`: one short line, then one call), so its RL never
starts from either mode. ``data.embedded.reasoning_mode`` writes the same real trajectories in
one of the two modes; an ablation arm trains its SFT model on them (``ablations.arms.<arm>.sft_data``).

Only ``arith`` and ``choice`` change (``program`` is the same in every mode), and in each mode
every trajectory is *real* (its code runs in the project's code interpreter, each turn is
written after the output it reads) and ends in the right answer:

- :class:`DeliberativeSolver`: the turn before the computing call holds a plan that restates
  the expression, how many operations it has and why one call does it, then the plain mode's
  single call (``print(expression)``, for choice the options and the letters that match) and
  the plain mode's conclusion; a failed first attempt is followed by the plain mode's recovery
  line. The report's classifier (:func:`agentrl.sampling.metrics.reasoning_mode`, ablations
  thresholds: at most 3 calls, a mean of at least 32 tokens before each) calls every one of
  them deliberative: measured with the embedded default's tokenizer, the mean before each call
  (the plan alone, or the plan and the recovery line) is at least 35 tokens.
- :class:`ReactiveSolver`: short lines, and one call per operation of the expression: each
  ``print(<left><op><right>)`` of two numbers, taken bottom-up in Python's order of evaluation
  (:func:`operation_steps`), whose operands come from the expression or are read off the
  previous calls' real outputs; the last output is the value. For choice the last operation is
  computed inside the option-matching call (the options and ``[k for k in options if options[k]
  == <left><op><right>]``), which prints the letters.

Every mode draws from the random stream as the plain mode does (the failed first attempt: on the
first call, same share, same kind of failure; ``direct_answer_share``: the same arith problems
answered without the tool, in the same words), so the data sets differ only in how the turns think
and split the work.

Lengths. The plan is written mostly in words the embedded tokenizer has merged (``compute``,
``the tool``, ``one call``, ``print``, ``result``, ``output``: it is trained on the plain data);
a word it never saw costs a token per letter or two, and the paper-like plan "The expression is
... It has 3 operations, and a slip in any of them changes the answer, ..." took 80-110 tokens. On
the default's data (400 per family), with its tokenizer, the longest response (every token after
the prompt up to the last ``<|im_end|>``, tool outputs included; the L of the overlong penalty) is
359 plain, 414 deliberative and 430 reactive (means 147, 179, 175), below
``rollout.max_response_tokens`` (512) in every mode; 32 deliberative and 24 reactive trajectories
of 1200 (none plain) pass 384, where ``reward.overlong``'s penalty starts: long expressions whose
first attempt failed, its traceback (about 120 tokens) on top of a plan or of three more calls.
The longest whole conversations (prompt included) are 441, 496 and 510 tokens, against
``sft.max_length`` 1024.

Departure from the paper: its modes are behaviours it measures in trained agents; here they are
written into the SFT data, so that the reasoning ablation compares RL from a deliberative and from
a reactive start. Choice folds its last operation into the matching call so that the longest
reactive trajectory (level 8: four operations, after a failed first attempt) has five calls and
the answer, the six assistant turns of ``rollout.max_turns``; a separate matching call would need
a seventh, which no rollout could reproduce.
"""

from __future__ import annotations

import ast

from agentrl.data.embedded import Draft, ScriptedSolver, choice_code, last_line
from agentrl.data.records import Message

# The operators of the embedded expressions (agentrl.data.embedded: +, - and *).
_SYMBOLS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}


def operation_steps(expression: str) -> list[tuple[int | str, str, int | str]]:
    """The binary operations of ``expression`` in Python's order of evaluation, bottom-up.

    Each step is ``(left, symbol, right)``: an operand is a number literal of the expression (a
    string, as written) or the index of an earlier step whose value it is. ``"(12+3)*4-5"`` ->
    ``[("12", "+", "3"), (0, "*", "4"), (1, "-", "5")]``. Raises ValueError naming the expression
    for anything but integer literals and ``+ - *``.
    """
    steps: list[tuple[int | str, str, int | str]] = []

    def visit(node: ast.AST) -> int | str:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return ast.get_source_segment(expression, node) or str(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOLS:
            left, right = visit(node.left), visit(node.right)
            steps.append((left, _SYMBOLS[type(node.op)], right))
            return len(steps) - 1
        raise ValueError(f"cannot split {expression!r} into operations: unsupported part {ast.dump(node)}")

    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot split {expression!r} into operations: not an expression ({exc})") from None
    visit(tree.body)
    return steps


def _operations(count: int) -> str:
    return f"{count} operation" if count == 1 else f"{count} operations"


class DeliberativeSolver(ScriptedSolver):
    """The deliberative mode: a plan before the one computing call (``reasoning_mode: deliberative``)."""

    def _intro(self, draft: Draft) -> str:
        expression = draft.fields["expression"]
        count = _operations(len(operation_steps(expression)))
        if draft.family == "choice":
            return (
                f"Compute {expression}: {count}, and the options are close. So I compute it and test each option "
                "with the tool in one call, and read the letter from the output."
            )
        return (
            f"Compute {expression}: {count}, and one slip changes the answer. So I print the whole expression "
            "with the tool in one call and read the result from the output."
        )


class ReactiveSolver(ScriptedSolver):
    """The reactive mode: short lines and one call per operation (``reasoning_mode: reactive``)."""

    def _intro(self, draft: Draft) -> str:
        return "Let me compute it in steps with the tool."

    def _steps(self, messages: list[Message], draft: Draft, match_options: bool = False) -> str:
        """Run the expression's operations one call each; return the last call's last output line.

        The first call draws the failed attempt as the plain mode's single call does; an operand
        that is an earlier step's value is read off that step's real output. With
        ``match_options`` (choice) the last call is the option-matching code around the last
        operation, and prints the matching letters.
        """
        steps = operation_steps(draft.fields["expression"])
        printed: list[str] = []  # the last output line of each step's call
        for index, (left, symbol, right) in enumerate(steps):
            operands = [printed[o] if isinstance(o, int) else o for o in (left, right)]
            if not all(operand.lstrip("-").isdigit() for operand in operands):
                raise RuntimeError(f"{draft.key}: step {index} of {steps} has operands {operands}, not integers")
            operation = f"{operands[0]}{symbol}{operands[1]}"
            setup = ""
            if match_options and index == len(steps) - 1:
                setup, operation = choice_code(draft.fields["options"], operation)
            if index == 0:
                printed.append(self._compute(messages, draft, operation, setup))
            else:
                code = f"{setup}\n" if setup else ""
                printed.append(last_line(self._tool_turn(messages, f"{code}print({operation})", "Then:")))
        return printed[-1]

    def _arith_value(self, messages: list[Message], draft: Draft) -> str:
        return self._steps(messages, draft)

    def _choice_letters(self, messages: list[Message], draft: Draft) -> str:
        return self._steps(messages, draft, match_options=True)


# data.embedded.reasoning_mode -> the writer of the real trajectories (data.embedded.sft_trajectories: real).
WRITERS = {"plain": ScriptedSolver, "deliberative": DeliberativeSolver, "reactive": ReactiveSolver}
