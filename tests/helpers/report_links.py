"""The links of a report's markdown files, as a reader of summary.md follows them."""

from __future__ import annotations

import re
from pathlib import Path

# [text](target) and ![text](target); a target with a scheme (https:) or an anchor is not a file.
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def relative_links(md: Path) -> list[tuple[bool, str]]:
    """(is an image, target) of every relative link in ``md``."""
    found = LINK.findall(md.read_text(encoding="utf-8"))
    return [(bang == "!", target) for bang, _, target in found if not re.match(r"^[a-z]+:|^#", target)]


def broken_links(md: Path) -> list[str]:
    """The relative links of ``md`` that a reader cannot follow: no such file, or a markdown table
    embedded as an image (it renders as a broken picture)."""
    broken = []
    for image, target in relative_links(md):
        if not (md.parent / target).is_file():
            broken.append(f"{target}: no such file")
        elif image and not target.endswith((".png", ".svg", ".jpg")):
            broken.append(f"{target}: embedded as an image")
    return broken
