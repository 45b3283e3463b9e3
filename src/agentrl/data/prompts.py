"""The recipe's prompt templates (docs/recipe.md section 2), verbatim from the upstream scripts.

Typos ("sumbit") and odd spacing are upstream's and kept on purpose: the released SFT data and
the released checkpoints were trained on exactly these strings. The embedded task's compact
prompts live at the bottom; they are a deliberate departure (shorter sequences for a CPU-sized
model), selectable with ``data.embedded.prompt_style: paper``.
"""

from __future__ import annotations

from typing import Any

MATH_PROMPT_1 = "Analyze and solve the following math problem step by step. \n\n"
MATH_PROMPT_2 = (
    "\n\nThe tool could be used for more precise and efficient calculation and could help you "
    "to verify your result before you reach the final answer."
)
AGENT_PROMPT = (
    "\n\n**Note: You should first analyze the problem and form a high-level solution strategy, "
    "then utilize the tools to help you solve the problem.**"
)
ANSWER_FORMAT = (
    "\nRemember once you make sure the current answer is your final answer, do not call the tools "
    "again and directly output the final answer in the following text format, the answer format "
    "must be: \\boxed{'The final answer goes here.'}."
)
UNITS_SENTENCE = (
    "\nDo not put units of the final answer inside \\boxed{}. The content of \\boxed{} should be "
    "the numerical value of the final answer only, without any units."
)
UNITS_SENTENCE_OTHER_MATH = (
    "\nDo not put units of the final answer inside \\boxed{}. The content of \\boxed{} should be "
    "the final numerical value of the final answer only, without any units."
)
GPQA_LETTER = "\n Here you need to put the final uppercase letter option of this problem into \\boxed{}"
CODE_SUBMIT = (
    "\nBefore sumbit your code, you can utilize tools to check the correctness of your code, once "
    "you make sure the current code is correct, do not call the tools again and submit your code "
    "within ```python\n# YOUR CODE HERE\n```."
)
LCB_INTRO = (
    "You will be given a question (problem specification) and will generate a correct Python "
    "program that matches the specification and passes all tests.\n\n"
)
LCB_STDIN = (
    "\n\nRead the inputs from stdin solve the problem and write the answer to stdout (do not "
    "directly test on the sample inputs). Enclose your code within delimiters as follows. Ensure "
    "that when the python program runs, it reads the inputs, runs the algorithm and writes output "
    'to STDOUT.\n```python\n# YOUR CODE HERE\n"'
)

# The one tool of the recipe (docs/recipe.md section 3), exactly as upstream declares it.
CODE_INTERPRETER_TOOL: dict[str, Any] = {
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


def aime_prompt(problem: str) -> str:
    return MATH_PROMPT_1 + problem + MATH_PROMPT_2 + AGENT_PROMPT + ANSWER_FORMAT


def gpqa_prompt(problem: str, domain: str) -> str:
    intro = f"Analyze and solve the following {domain} problem step by step. \n\n"
    return intro + problem + MATH_PROMPT_2 + AGENT_PROMPT + ANSWER_FORMAT + GPQA_LETTER


def lcb_prompt(problem: str, example_inputs: Any, example_outputs: Any) -> str:
    return (
        LCB_INTRO
        + problem
        + "\nHere are some input and output examples of the expected code:\nInput:"
        + str(example_inputs)
        + "\nOutput:\n"
        + str(example_outputs)
        + AGENT_PROMPT
        + LCB_STDIN
        + CODE_SUBMIT
    )


UNITS_ONLY_SOURCES = ("math_dapo", "mega-science")


def rl_prompt(content: str, data_source: str) -> str:
    """Wrap an RL-pool user message by its own data source (``rl_prompt_wrapping: per_row``)."""
    source = data_source.lower()
    if "code" in source:
        return content + AGENT_PROMPT + CODE_SUBMIT
    if source in UNITS_ONLY_SOURCES:
        return content + UNITS_SENTENCE
    return aime_prompt(content) + UNITS_SENTENCE_OTHER_MATH


def rl_file_wrapper(first_data_source: str):
    """Upstream's wrapping of a whole RL file (``rl_prompt_wrapping: per_file``).

    Upstream's ``CustomRLHFDataset`` picks one mapping per parquet file from the ``data_source``
    of its first row: ``math_dapo`` / ``mega-science`` first -> every row (code rows too) gets
    only the units sentence; anything else -> each row is wrapped by whether its own source
    contains ``code`` (case-sensitive there, unlike the reward routing) or else the AIME wrapping
    plus the units sentence. Returns ``wrap(content, data_source) -> str``.
    """
    if first_data_source in UNITS_ONLY_SOURCES:
        return lambda content, data_source: content + UNITS_SENTENCE

    def wrap(content: str, data_source: str) -> str:
        if "code" in data_source:
            return content + AGENT_PROMPT + CODE_SUBMIT
        return aime_prompt(content) + UNITS_SENTENCE_OTHER_MATH

    return wrap


# --------------------------------------------------------------------------- self-contained
# The model card's self-contained half (no tool) has no prompt of its own upstream: its eval
# scripts render every benchmark through the tool agent loop with the prompts above, and ship
# no script without the tool. The no-tool prompt is these prompts with each sentence about the
# tool replaced by its counterpart without the tool (or removed), everything else verbatim.
ANSWER_FORMAT_NO_TOOL = (
    "\nRemember once you make sure the current answer is your final answer, directly output the "
    "final answer in the following text format, the answer format must be: \\boxed{'The final "
    "answer goes here.'}."
)
CODE_SUBMIT_NO_TOOL = (
    "\nOnce you make sure the current code is correct, submit your code within ```python\n# YOUR CODE HERE\n```."
)
COMPACT_MATH_TAIL = " Use the code tool, then give the answer in \\boxed{}."
COMPACT_CHOICE_TAIL = "\nUse the code tool, then give the letter in \\boxed{}."
COMPACT_CODE_TAIL = "\nTest it with the code tool, then submit it in a ```python``` block."
# (agentic text, self-contained text), applied in this order.
NO_TOOL_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    (MATH_PROMPT_2, ""),
    (AGENT_PROMPT, ""),
    (ANSWER_FORMAT, ANSWER_FORMAT_NO_TOOL),
    (CODE_SUBMIT, CODE_SUBMIT_NO_TOOL),
    (COMPACT_MATH_TAIL, " Give the answer in \\boxed{}."),
    (COMPACT_CHOICE_TAIL, "\nGive the letter in \\boxed{}."),
    (COMPACT_CODE_TAIL, "\nSubmit it in a ```python``` block."),
)


def self_contained_text(text: str) -> str:
    """A user message of the recipe without its tool sentences (:data:`NO_TOOL_REPLACEMENTS`).

    A message holding none of them (a data set of other prompts) is returned unchanged.
    """
    for agentic, no_tool in NO_TOOL_REPLACEMENTS:
        text = text.replace(agentic, no_tool)
    return text


def self_contained_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The problem's chat messages with every user message through :func:`self_contained_text`."""
    return [
        {**m, "content": self_contained_text(m["content"])} if m.get("role") == "user" else dict(m) for m in messages
    ]


# --------------------------------------------------------------------------- embedded task
COMPACT_MATH = "Compute {expression}. Use the code tool, then give the answer in \\boxed{{}}."
COMPACT_CHOICE = "Which option equals {expression}?\n{options}\nUse the code tool, then give the letter in \\boxed{{}}."
COMPACT_CODE = (
    "Write a Python program: {statement}\nExample input:\n{example_input}\nExample output:\n"
    "{example_output}\nTest it with the code tool, then submit it in a ```python``` block."
)


def embedded_prompt(family: str, style: str, **fields: str) -> str:
    """The user message of an embedded problem: compact by default, the paper's wrapping on request."""
    if family == "arith":
        text = COMPACT_MATH.format(**fields)
        return aime_prompt(f"Compute {fields['expression']}.") if style == "paper" else text
    if family == "choice":
        text = COMPACT_CHOICE.format(**fields)
        if style == "paper":
            problem = f"Which option equals {fields['expression']}?\n{fields['options']}"
            return gpqa_prompt(problem, "arithmetic")
        return text
    if family == "program":
        if style == "paper":
            return lcb_prompt(fields["statement"], [fields["example_input"]], [fields["example_output"]])
        return COMPACT_CODE.format(**fields)
    raise ValueError(f"unknown embedded family {family!r}; known: arith, choice, program")
