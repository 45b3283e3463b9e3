"""Help texts of the stage CLIs: their docstrings, shown without reStructuredText markup.

The module docstrings double as Sphinx text (``--model``, :mod:`agentrl.launch`); ``--help``
shows ``--model`` and ``agentrl.launch`` instead.
"""

from __future__ import annotations

import argparse
import re

# :role:`text`, :role:`~a.b.c` (shown as c) and :role:`title <target>` (shown as title).
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)\s*(?:<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``")


def _role_text(match: re.Match[str]) -> str:
    text = match[2]
    return text.rsplit(".", 1)[-1] if match[1] else text


def plain(text: str) -> str:
    """``text`` with inline literals and Sphinx roles replaced by their text."""
    return _LITERAL.sub(r"\1", _ROLE.sub(_role_text, text))


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks (as RawDescriptionHelpFormatter) and drops the markup."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain(super()._expand_help(action))
