"""Progress of a long loop: a tqdm bar on a terminal, plain log lines in a log file.

A bar's carriage-return stream is unreadable in ``results/logs/*.log``; there the same loop logs
one line every ``every_percent`` of the work (and at least every ``max_silence_s``), with the
rate and the time left::

    sft: 420/2100 steps (20%) | 1.9 steps/s | elapsed 3m41s | ETA 14m44s | loss=0.412

:func:`progress` returns either; both take tqdm's ``update``, ``set_postfix`` and ``close``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class ProgressLines:
    """tqdm's interface for a log file: a line each time another ``every_percent`` is done."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "it",
        initial: int = 0,
        every_percent: float = 5.0,
        max_silence_s: float = 600.0,
        logger: logging.Logger | None = None,
    ) -> None:
        self.total, self.desc, self.unit, self.n = max(int(total), 0), desc, unit, initial
        self.initial = initial
        self.step = max(1, round(self.total * every_percent / 100))
        self.max_silence_s = max_silence_s
        self.log = logger or logging.getLogger(f"agentrl.{desc}")
        self.postfix: dict[str, Any] = {}
        self.started = self.last_line = time.monotonic()
        self.next_line = self.n + self.step
        self.logged_n = initial  # the count the last line showed
        self.closed = False

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.n >= self.next_line or self.n >= self.total or now - self.last_line >= self.max_silence_s:
            self._line(now)

    def close(self) -> None:
        if not self.closed and self.n != self.logged_n:
            self._line(time.monotonic())  # the last count, not shown yet
        self.closed = True

    def line(self, now: float | None = None) -> str:
        """The progress line as of ``now`` (monotonic seconds)."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.started
        done = self.n - self.initial
        rate = done / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.desc}: {self.n}/{self.total} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        parts.append(f"{rate:.3g} {self.unit}/s" if rate >= 0.1 or not rate else f"{1 / rate:.3g} s/{self.unit}")
        parts.append(f"elapsed {_duration(elapsed)}")
        if rate > 0 and self.n < self.total:
            parts.append(f"ETA {_duration((self.total - self.n) / rate)}")
        parts += [f"{key}={value}" for key, value in self.postfix.items()]
        return " | ".join(parts)

    def _line(self, now: float) -> None:
        self.log.info(self.line(now))
        self.last_line, self.logged_n = now, self.n
        while self.next_line <= self.n:
            self.next_line += self.step


def progress(
    total: int,
    desc: str,
    unit: str = "it",
    initial: int = 0,
    disable: bool = False,
    logger: logging.Logger | None = None,
) -> Any:
    """A tqdm bar when stderr is a terminal, else :class:`ProgressLines` (``disable``: neither)."""
    from tqdm import tqdm

    if disable:
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty():
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, mininterval=2.0)
    return ProgressLines(total, desc, unit, initial, logger=logger)
