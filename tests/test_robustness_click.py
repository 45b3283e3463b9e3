"""benchmarks/robustness.py's pretraining "click": the first step whose trailing mean loss over 100
steps falls below 1.0, read from a pretraining metrics.jsonl as the trainer writes it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "robustness.py"


@pytest.fixture(scope="module")
def robustness():
    spec = importlib.util.spec_from_file_location("robustness", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _metrics(path: Path, losses: list[float]) -> Path:
    rows = [{"step": i + 1, "loss": loss, "lr": 1e-3} for i, loss in enumerate(losses)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_click_is_the_first_step_whose_trailing_mean_is_below_one(robustness, tmp_path):
    # 300 steps on the plateau at 2.0, then 0.2: the 100-step mean is below 1.0 once 56 steps are at 0.2
    click, final = robustness.pretraining_click(_metrics(tmp_path / "m.jsonl", [2.0] * 300 + [0.2] * 200))
    assert click == 356
    assert final == pytest.approx(0.2)


def test_a_run_that_never_leaves_the_plateau_has_no_click(robustness, tmp_path):
    click, final = robustness.pretraining_click(_metrics(tmp_path / "m.jsonl", [2.0] * 150 + [1.05] * 150))
    assert click is None and final == pytest.approx(1.05)


def test_metrics_without_a_loss_are_refused_with_the_file_named(robustness, tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 1, "lr": 1e-3}) + "\n")
    with pytest.raises(ValueError, match="m.jsonl"):
        robustness.pretraining_click(path)
