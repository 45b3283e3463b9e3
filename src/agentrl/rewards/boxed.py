"""Extraction of the final ``\\boxed{...}`` answer, as upstream's strict-box check does it.

Upstream (verl's ``math_dapo.is_correct_strict_box``) looks only at the last ``\\boxed{``
occurrence, matches braces from there, and gives up (no answer) if that box is not closed: it
does not fall back to an earlier box. The same rule is kept here so strict mode is faithful.
"""

from __future__ import annotations

BOX_OPEN = "\\boxed{"


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces matched), or None.

    None when there is no ``\\boxed{`` or the last one is not closed.
    """
    start = text.rfind(BOX_OPEN)
    if start < 0:
        return None
    depth = 0
    for index in range(start + len(BOX_OPEN) - 1, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(BOX_OPEN) : index]
    return None


def strict_tail(text: str, tail_chars: int) -> str:
    """The last ``tail_chars`` characters: upstream's window for the strict box search."""
    return text[-tail_chars:] if tail_chars > 0 else text
