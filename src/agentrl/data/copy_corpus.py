"""The copying corpus the embedded base model is pretrained on before SFT (``pretrain``).

The paper's base is a pretrained instruct model that already copies text from its context; the
embedded model starts from random weights, and copying numbers and expressions (from the problem
into the code, from the tool's output into the answer) is the skill every embedded family's
reward needs and the last one its SFT learns (docs/experiments.md). This corpus teaches that skill
alone, densely, on short conversations:

    user:      a: 58*21-7
               b: A=6126, B=6131, C=6129, D=6122
               c: 4871
    assistant: c \\boxed{4871}
               a print(58*21-7)
               b dict(A=6126, B=6131, C=6129, D=6122)

Each user turn names a few random spans (an embedded expression, an options line, a number, a
word); the assistant turn writes every span again, in a random order, after its name and inside
one of the wrappers the SFT trajectories use. SFT's loss covers the assistant turn only, so
every trained token but a name and a wrapper is a copy: a lookup of where the name was and what
followed it, the induction-style circuit copying needs. The spans come from a stream of their
own (``seed``), never from the eval sets' text.

A share of the conversations (``letter_share``) also name a letter list as the choice family's
tool prints it (``['C']``) and answer it as that family does (``Option C matches.``): the one step
from a tool output to an answer that is not a token copy.
"""

from __future__ import annotations

import random

from agentrl.data.embedded import _arith_expression, _distractors, choice_conclusion, options_text
from agentrl.data.records import SftExample

NAMES = "abcdefgh"
# How a copy is written in the SFT trajectories: code, a value, a box, the choice family's dict.
WRAPPERS = ("print({})", "{}", "= {}", "\\boxed{{{}}}", "dict({})", "[{}]", "is {}.")


def random_span(rng: random.Random) -> str:
    """One span to copy: an expression (40%), an options line (20%), a number (25%) or a word."""
    draw = rng.random()
    if draw < 0.4:
        return _arith_expression(rng, rng.randint(1, 5))
    if draw < 0.6:
        value = rng.randint(-999, 99999)
        options = _distractors(rng, value) + [value]
        rng.shuffle(options)
        return options_text(options)
    if draw < 0.85:
        return str(rng.randint(-99999, 999999))
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))


def copy_conversation(
    rng: random.Random, index: int, max_spans: int, verbatim_share: float = 0.0, letter_share: float = 0.0
) -> SftExample:
    """A user turn naming 2..``max_spans`` random spans, an assistant turn copying each of them.

    With probability ``verbatim_share`` the assistant turn repeats the user turn as it stands
    (same order, names kept, no wrappers): every trained token is then the successor of the same
    token in the user turn, the plain induction pattern, learnt before the name lookups the other
    conversations need (docs/experiments.md). A share of 0 draws nothing: the stream stays that of
    a corpus without it.

    With probability ``letter_share`` one span is a letter list as the choice family's tool prints
    it (``['C']``), and its copy is the choice answer (``Option C matches.`` and the box): the
    letter's token there (`` C``) is not the printed one (``C``), a mapping SFT alone may miss.
    """
    spans = [random_span(rng) for _ in range(rng.randint(2, max_spans))]
    letter_at, letter = None, None
    if letter_share > 0 and rng.random() < letter_share:
        letter_at, letter = rng.randrange(len(spans)), rng.choice("ABCD")
        spans[letter_at] = repr([letter])  # as the tool prints the matching letters: ['C']
    source = "\n".join(f"{NAMES[i]}: {span}" for i, span in enumerate(spans))
    if verbatim_share > 0 and rng.random() < verbatim_share:
        copies = source
    else:
        order = rng.sample(range(len(spans)), len(spans))
        copies = "\n".join(
            f"{NAMES[i]} " + (choice_conclusion(letter) if i == letter_at else rng.choice(WRAPPERS).format(spans[i]))
            for i in order
        )
    messages = [{"role": "user", "content": source}, {"role": "assistant", "content": copies}]
    return SftExample(id=f"copy-{index:06d}", messages=messages, tools=[])


def copy_corpus(
    count: int, seed: int, max_spans: int, verbatim_share: float = 0.0, letter_share: float = 0.0
) -> list[SftExample]:
    """``count`` copying conversations, the same for the same ``seed`` (a stream of their own:
    the embedded problems draw from ``random.Random(seed)``); ``verbatim_share`` of them repeat
    their user turn verbatim, ``letter_share`` answer a printed letter list as the choice family."""
    if not 2 <= max_spans <= len(NAMES):
        raise ValueError(f"max_spans must be in 2..{len(NAMES)}: {max_spans}")
    if not 0 <= verbatim_share <= 1:
        raise ValueError(f"verbatim_share must be in [0, 1]: {verbatim_share}")
    if not 0 <= letter_share <= 1:
        raise ValueError(f"letter_share must be in [0, 1]: {letter_share}")
    rng = random.Random(f"{seed}:copy-corpus")
    return [copy_conversation(rng, index, max_spans, verbatim_share, letter_share) for index in range(count)]
