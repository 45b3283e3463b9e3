"""The entry point as a shell user meets it: --version, --help without markup, a closed pipe."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl import __version__
from agentrl.__main__ import STAGES, main
from agentrl.cli_help import plain

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = {"filter": ["score", "select"], "evaluate": ["run", "export-livecodebench"], "report": ["ablations"]}


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"agentrl {__version__}\n"


def test_markup_is_dropped():
    text = "Writes ``--out``; see :mod:`agentrl.launch`, :func:`~agentrl.grpo.trainer.train` and :ref:`the docs <ops>`."
    assert plain(text) == "Writes --out; see agentrl.launch, train and the docs."


@pytest.mark.parametrize(
    "command", [[stage] for stage in STAGES] + [[stage, sub] for stage, subs in SUBCOMMANDS.items() for sub in subs]
)
def test_help_has_no_sphinx_markup(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage:")
    assert "``" not in text and ":mod:`" not in text and ":func:`" not in text and ":class:`" not in text, text


@pytest.mark.parametrize("args", [["--help"], ["sandbox", "-"]], ids=["usage", "sandbox-result"])
def test_a_closed_pipe_ends_quietly(args):
    """`python -m agentrl ... | head`: the reader left before the output was written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "agentrl", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    process.stdout.close()
    _, err = process.communicate(b"for i in range(20000):\n    print(i)\n", timeout=120)
    assert process.returncode == 1
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
