"""What summary.md says beside its numbers, and plots a reader can read without arithmetic.

The legend defines every column of the per-benchmark tables and what a ``-`` in them means; the
config's ``report.note`` opens the summary (the smoke preset's says its numbers mean nothing, and
the workflow hands it to the report job); a training curve's tick labels are its values (no
matplotlib offset such as ``+6.459``) and a flat series is drawn flat, not stretched over the
axis.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from helpers.eval_samples import synthetic_samples
from helpers.workflows import ROOT, run_snakemake

from agentrl.report import cli as report_cli
from agentrl.report.plots import training_figure
from agentrl.report.tables import DETAIL_COLUMNS
from agentrl.sampling.metrics import summarize_benchmark


def _samples(accuracy: float, with_answers: bool, seed: int, problems: int = 4, n: int = 2) -> list[dict]:
    return synthetic_samples(accuracy, problems, n, seed, with_answers=with_answers, response_tokens=(10, 64))


def _report(root: Path, *extra: str) -> str:
    """summary.md of an sft model that never wrote an answer (maj@n: -) and an rl model that did."""
    metrics = []
    for seed, (model, with_answers) in enumerate((("sft", False), ("rl", True))):
        path = root / "eval" / model / "arith" / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({**summarize_benchmark(_samples(0.4, with_answers, seed)), "run": {"n": 2}}))
        metrics.append(str(path))
    out = root / "report"
    args = ["--metrics", *metrics, "--table-md", str(out / "summary.md"), "--table-csv", str(out / "summary.csv")]
    args += ["--accuracy-plot", str(out / "accuracy.png"), "--modes-plot", str(out / "modes.png"), *extra]
    assert report_cli.main(args) == 0
    return (out / "summary.md").read_text()


def _legend(md: str) -> dict[str, str]:
    section = md.split("## What the columns mean", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return {column.strip(): meaning.strip() for column, meaning in rows[1:]}


def test_the_legend_defines_every_column_and_the_dash(tmp_path):
    md = _report(tmp_path)
    legend = _legend(md)
    assert set(legend) == {label for _, label in DETAIL_COLUMNS} - {"model"}
    sft_row = next(line for line in md.splitlines() if line.startswith("| sft | 2 |"))
    maj_column = [label for _, label in DETAIL_COLUMNS].index("maj@n")
    assert sft_row.strip("|").split("|")[maj_column].strip() == "-", "no sample had an answer: no maj@n"
    assert "`-` when no sample of the benchmark had an answer" in legend["maj@n"]
    assert "at least 200 tokens" in legend["deliberative %"] and "1 to 3 tool calls" in legend["deliberative %"]
    assert "100 - deliberative - reactive, called no tool" in legend["reactive %"]
    assert "paper's pass@32" in legend["pass@n (verl bootstrap)"]
    assert "here 2" in legend["n"]
    assert "Note" not in md, "no report.note, no note"


def _planned_note(workdir: Path, *configfiles: str) -> str | None:
    """The --note of the report job a dry run of the workflow plans with these config files."""
    (workdir / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    done = run_snakemake(workdir, "-n", "-p", "--configfile", *configfiles, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if "python -m agentrl report --metrics" in line)
    words = shlex.split(line[line.index("python -m agentrl report --metrics") :].split(" ) 2>&1")[0])
    return words[words.index("--note") + 1] if "--note" in words else None


def test_the_smoke_report_opens_saying_its_numbers_mean_nothing(tmp_path):
    smoke = yaml.safe_load((ROOT / "presets" / "smoke.yaml").read_text())["report"]["note"]
    assert "numbers mean nothing" in smoke
    (tmp_path / "smoke").mkdir()
    planned = _planned_note(tmp_path / "smoke", str(ROOT / "config.yaml"), str(ROOT / "presets" / "smoke.yaml"))
    assert planned == smoke, "the workflow hands the preset's report.note to the report job"
    (tmp_path / "default").mkdir()
    assert _planned_note(tmp_path / "default", str(ROOT / "config.yaml")) is None, "report.note: null adds nothing"

    md = _report(tmp_path / "run", "--note", planned)
    title, note, first_section = md.split("\n\n")[:3]
    assert title == "# agentrl run summary" and first_section.startswith("## Accuracy")
    assert note == f"> **Note:** {smoke}", "the note comes before any number"


def _training_log(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("lr", [1e-6, 3e-3, 0.0])
def test_training_curves_label_values_as_they_are_and_draw_a_flat_series_flat(tmp_path, lr):
    rows = [{"step": s, "response_length": {"mean": 6.459 + 1e-4 * s}, "lr": lr, "loss": 2.0 / s} for s in range(1, 5)]
    fig, drawn = training_figure(_training_log(tmp_path / "metrics.jsonl", rows), "RL")
    assert set(drawn) == {"response_length/mean", "lr", "loss"}
    fig.canvas.draw()
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    for title, ax in axes.items():
        assert ax.yaxis.get_offset_text().get_text() in ("", "1e−6", "1e−3"), f"{title}: an offset to add up"
    length = axes["RL: response length"]
    labels = [label.get_text() for label in length.get_yticklabels()]
    assert any(text.startswith("6.459") for text in labels), f"the ticks are the values: {labels}"
    low, high = axes["RL: learning rate"].get_ylim()
    if lr > 0:
        assert (low, high) == (0.0, pytest.approx(2 * lr)), "a constant learning rate sits mid-axis, from 0"
    else:
        assert (low, high) == (-1.0, 1.0)
    loss_low, loss_high = axes["RL: loss"].get_ylim()
    assert loss_low < 0.5 and loss_high > 2.0, "a series that moves keeps matplotlib's range"
