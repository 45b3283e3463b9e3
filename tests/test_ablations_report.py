"""The ablation report: smoothing, steps to reach, spreads over seeds, tables and plots from hand-made runs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from agentrl.config import ConfigError, load_config
from agentrl.report import ablations
from agentrl.report import cli as report_cli
from agentrl.report.ablation_effects import Effect, format_effect, paired_effect, t_quantile
from agentrl.report.ablations import Spread, format_spread, smooth, spread, steps_to_reach
from agentrl.sampling.metrics import summarize_benchmark

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ARMS = {
    "base": {"sft_data": "real", "rl_data": "filtered", "variant": "grpo_tcr"},
    "stitched": {"sft_data": "stitched", "rl_data": "filtered", "variant": "grpo_tcr"},
    "gt": {"sft_data": "real", "rl_data": "filtered", "variant": "grpo_t"},
}
SETTINGS = {
    "seeds": [1, 2, 3],
    "arms": ARMS,
    "questions": {"data": ["base", "stitched"], "algorithm": ["base", "gt"], "reasoning": ["base", "stitched", "gt"]},
    "accuracy_threshold": 0.5,
    "smoothing_window": 2,
    "deliberative_max_calls": 2,
    "deliberative_min_tokens_per_call": 20,
}
CFG = load_config({"ablations": SETTINGS}).ablations


# --------------------------------------------------------------------------- pure functions
def test_smooth_is_a_trailing_mean_shorter_at_the_start():
    assert smooth([0, 1, 2, 3], 2).tolist() == [0.0, 0.5, 1.5, 2.5]
    assert smooth([0, 1, 2, 3], 3).tolist() == [0.0, 0.5, 1.0, 2.0]
    assert smooth([4, 2], 1).tolist() == [4.0, 2.0]


def test_steps_to_reach_uses_the_smoothed_curve_and_says_when_never():
    steps, acc = [1, 2, 3, 4, 5], [0.1, 0.5, 0.1, 0.5, 0.6]
    assert steps_to_reach(steps, acc, 0.5, window=1) == 2
    assert steps_to_reach(steps, acc, 0.5, window=2) == 5  # smoothed: .1 .3 .3 .3 .55
    assert steps_to_reach(steps, acc, 0.9, window=1) is None
    assert steps_to_reach([10, 20], [0.6, 0.6], 0.5, window=3) == 10  # the step number, not the index


def test_spread_over_seeds():
    assert spread([1.0, 2.0, 3.0]) == Spread(2.0, 1.0, 1.0, 3.0, 3, 3)
    assert spread([None, 2.0, None]) == Spread(2.0, None, 2.0, 2.0, 1, 3)
    assert spread([None, None]) == Spread(None, None, None, None, 0, 2)
    assert format_spread(spread([0.1, 0.2, 0.3]), percent=True) == "20.0 ± 10.0 [10.0-30.0]"
    assert format_spread(spread([4.0]), percent=False) == "4.00 [4.00-4.00]"
    assert format_spread(spread([None]), percent=True) == "-"


def t_975(dof: int) -> float:
    """t_{0.975, dof} in closed form, for the dof the tests use (1: Cauchy; 2: Student's own formula)."""
    p = 0.975
    return {1: math.tan(math.pi * (p - 0.5)), 2: (2 * p - 1) / math.sqrt(2 * p * (1 - p))}[dof]


def test_t_quantile_matches_the_closed_forms_and_tends_to_the_normal():
    assert t_quantile(0.975, 1) == pytest.approx(12.706204736, rel=1e-9)
    assert t_quantile(0.975, 1) == pytest.approx(t_975(1), rel=1e-12)
    assert t_quantile(0.975, 2) == pytest.approx(t_975(2), rel=1e-12)
    # dof 4: t = 2 sqrt(q - 1), q = cos(arccos(sqrt(a)) / 3) / sqrt(a), a = 4 p (1 - p)
    a = 4 * 0.975 * 0.025
    assert t_quantile(0.975, 4) == pytest.approx(
        2 * math.sqrt(math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a) - 1)
    )
    assert t_quantile(0.975, 3) == pytest.approx(3.182446305, rel=1e-9)
    normal = statistics.NormalDist().inv_cdf(0.975)
    assert normal < t_quantile(0.975, 1000) < normal + 0.003


def test_paired_effect_is_the_mean_difference_with_its_t_interval():
    reference, other = {1: 0.40, 2: 0.50, 3: 0.45}, {1: 0.47, 2: 0.52, 3: 0.55}
    d = [0.07, 0.02, 0.10]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    half = t_975(2) * sd / math.sqrt(3)
    e = paired_effect(reference, other)
    assert (e.mean, e.low, e.high) == pytest.approx((mean, mean - half, mean + half), rel=1e-12)
    assert e.pairs == 3 and e.differences == pytest.approx({1: 0.07, 2: 0.02, 3: 0.10})
    assert e.low < 0 < e.high and not e.excludes_zero
    tight = paired_effect({1: 0.0, 2: 0.0, 3: 0.0}, {1: 0.05, 2: 0.06, 3: 0.07})  # sd 0.01: [0.035, 0.085]
    assert tight.low == pytest.approx(0.06 - t_975(2) * 0.01 / math.sqrt(3)) and tight.excludes_zero
    assert paired_effect(other, reference).high == pytest.approx(-e.low)  # swapping the arms flips the sign


def test_paired_effect_pairs_only_the_seeds_both_have():
    # seed 3: the reference has no value (never reached); seed 4: only the other arm ran it
    e = paired_effect({1: 1.0, 2: 2.0, 3: None}, {1: 2.0, 2: 4.0, 3: 5.0, 4: 9.0})
    half = t_975(1) * math.sqrt(0.5) / math.sqrt(2)  # d = 1, 2: mean 1.5, sd sqrt(0.5)
    assert e.differences == {1: 1.0, 2: 2.0} and e.pairs == 2
    assert (e.mean, e.low, e.high) == pytest.approx((1.5, 1.5 - half, 1.5 + half))
    assert paired_effect({1: float("nan"), 2: 1.0}, {1: 1.0, 2: 1.5}).pairs == 1  # NaN pairs with nothing


def test_one_pair_has_no_interval_and_none_has_no_effect():
    one = paired_effect({1: 0.1, 2: None}, {1: 0.3, 2: 0.5})
    assert (one.mean, one.low, one.high, one.pairs) == (pytest.approx(0.2), None, None, 1)
    assert format_effect(one, 100.0, 1) == "+20.0 [-]"
    none = paired_effect({1: None}, {1: 0.3})
    assert none == Effect(None, None, None, 0, {}, False) and format_effect(none) == "-"


def test_effect_cells_are_signed_with_a_typographic_minus_and_bold_when_the_interval_excludes_0():
    e = Effect(0.031, -0.004, 0.066, 3, {}, False)
    assert format_effect(e, 100.0, 1) == "+3.1 [\u22120.4, +6.6]"
    assert format_effect(Effect(-0.5, -0.75, -0.25, 3, {}, True), 1.0, 2) == "**\u22120.50 [\u22120.75, \u22120.25]**"
    assert format_effect(Effect(-0.0001, -0.01, 0.01, 3, {}, False), 1.0, 2) == "+0.00 [\u22120.01, +0.01]"


def test_locate_reads_arm_seed_and_benchmark_and_refuses_other_layouts():
    assert ablations.locate("r/ablations/base/seed2/rl/metrics.jsonl", "training") == ("base", 2, None)
    assert ablations.locate("r/ablations/gt/seed10/eval/arith/samples.jsonl", "eval") == ("gt", 10, "arith")
    with pytest.raises(ValueError, match="<arm>/seed<k>/rl/metrics.jsonl"):
        ablations.locate("r/ablations/base/rl/metrics.jsonl", "training")
    with pytest.raises(ValueError, match="metrics.json"):
        ablations.locate("r/eval/rl/arith/metrics.json", "eval")


def test_questions_naming_an_undefined_arm_are_refused():
    cfg = load_config({"ablations": {**SETTINGS, "questions": {"data": ["base", "nope"]}}}).ablations
    with pytest.raises(ConfigError, match=r"ablations.questions.data names undefined arm\(s\) \['nope'\]"):
        ablations.check_ablations(cfg)


def test_the_shared_folder_name_is_no_arm_name():
    arm = {"sft_data": "real", "rl_data": "pool", "variant": "grpo_t"}
    with pytest.raises(ConfigError, match="ablations.arms"):
        load_config({"ablations": {"arms": {"shared": arm}}})


# --------------------------------------------------------------------------- hand-made runs
def _sample(problem: int, index: int, acc: bool, calls: int, tokens: int, errors: int = 0) -> dict:
    return {
        "problem_id": f"q{problem}",
        "sample_index": index,
        "acc": acc,
        "pred": "1" if acc else "0",
        "tool_calls": calls,
        "tool_errors": [i < errors for i in range(calls)],
        "tokens_before_calls": [tokens] * calls,
        "num_turns": 2 * calls + 2,
        "response_tokens": 50,
    }


def _write_run(
    root: Path,
    arm: str,
    seed: int,
    acc_curve: list[float],
    correct: list[list[bool]],
    calls: int,
    tokens: int,
    extra: dict[str, list[float]] | None = None,
) -> None:
    """One arm/seed: a GRPO log with ``acc_curve`` (and each ``extra`` key's curve) and, per benchmark,
    samples with ``correct[p][i]``."""
    run = root / arm / f"seed{seed}"
    (run / "rl").mkdir(parents=True)
    records = [{"step": 0, "val/mean/avg@2": 0.0}]  # validation-only record: skipped by the curves
    records += [
        {"step": s, ablations.ACC_KEY: a, ablations.CALLS_KEY: calls + 0.1 * s, ablations.SUCCESS_KEY: 0.5}
        for s, a in enumerate(acc_curve, 1)
    ]
    for key, curve in (extra or {}).items():
        for record, value in zip(records[1:], curve):
            record[key] = value
    (run / "rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for benchmark in ("arith", "program"):
        rows = [
            _sample(p, i, ok, calls, tokens, errors=1 if calls else 0)
            for p, row in enumerate(correct)
            for i, ok in enumerate(row)
        ]
        folder = run / "eval" / benchmark
        folder.mkdir(parents=True)
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "metrics.json").write_text(json.dumps(summarize_benchmark(rows)))


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "ablations"
    for seed in (1, 2, 3):
        # base: reaches 0.5 (window 2) at step 3 for every seed; avg@2 = 0.5, pass@2 = 1.0; entropy of the
        # last 3 steps 0.8, clip fractions 1 % high and 2 % low, zero-advantage share 50 %.
        base_log = {
            "actor/entropy": [1.0, 0.9, 0.8, 0.7],
            "actor/clip_frac_high": [0.01] * 4,
            "actor/clip_frac_low": [0.02] * 4,
            "rollout/zero_advantage_share": [0.5] * 4,
        }
        correct = [[True, False], [False, True]]
        _write_run(root, "base", seed, [0.2, 0.6, 0.6, 0.7], correct, calls=1, tokens=30, extra=base_log)
        # stitched: reaches only with seed 3; avg@2 = 0.25, pass@2 = 0.5; reactive (few tokens before calls);
        # an older log: no entropy, clip fractions or zero-advantage share.
        curve = [0.1, 0.1, 0.2, 0.2] if seed != 3 else [0.1, 0.5, 0.5, 0.5]
        _write_run(root, "stitched", seed, curve, [[True, False], [False, False]], calls=3, tokens=5)
        # gt: never reaches; avg@2 = 0; no tool calls; entropy 0.9, 1.0, 1.2 by seed; clip high 2 %, no clip low.
        gt_log = {"actor/entropy": [{1: 0.9, 2: 1.0, 3: 1.2}[seed]] * 4, "actor/clip_frac_high": [0.02] * 4}
        no = [[False, False], [False, False]]
        _write_run(root, "gt", seed, [0.0, 0.1, 0.1, 0.1], no, calls=0, tokens=0, extra=gt_log)
    paths = {
        "training": sorted(root.glob("*/seed*/rl/metrics.jsonl")),
        "eval_metrics": sorted(root.glob("*/seed*/eval/*/metrics.json")),
        "samples": sorted(root.glob("*/seed*/eval/*/samples.jsonl")),
    }
    return root, paths


def test_run_metrics_of_a_hand_made_run(runs):
    root, paths = runs
    loaded = ablations.load_runs(paths["training"], paths["eval_metrics"], paths["samples"])
    assert sorted(loaded) == ["base", "gt", "stitched"] and [r.seed for r in loaded["base"]] == [1, 2, 3]
    base = ablations.run_metrics(loaded["base"][0], CFG)
    assert base["avg@n/arith"] == 0.5 and base["pass@n/program"] == 1.0 and base["avg@n/mean"] == 0.5
    assert base["steps_to_reach"] == 3.0  # smoothed: .2 .4 .6 .65
    assert base["final_train_acc"] == pytest.approx(0.65)
    assert base["train/tool_calls_first"] == pytest.approx(1.1) and base["train/tool_calls_last"] == pytest.approx(1.35)
    # one call per response, 30 tokens before it (>= 20) -> all deliberative; the single call failed.
    assert base["eval/deliberative_share"] == 1.0 and base["eval/reactive_share"] == 0.0
    assert base["eval/tool_success_rate"] == 0.0 and base["eval/tool_calls_per_response"] == 1.0
    stitched = ablations.run_metrics(loaded["stitched"][0], CFG)
    assert stitched["eval/reactive_share"] == 1.0 and stitched["eval/tool_success_rate"] == pytest.approx(2 / 3)
    assert stitched["steps_to_reach"] is None
    gt = ablations.run_metrics(loaded["gt"][0], CFG)
    assert gt["eval/no_tool_share"] == 1.0 and gt["eval/tool_success_rate"] is None


def test_tables_csv_and_plots_written_per_question(runs, tmp_path):
    root, paths = runs
    out = tmp_path / "out"
    cfg_json = json.dumps({"ablations": SETTINGS})
    assert (
        report_cli.main(
            [
                "ablations",
                "--config-json",
                cfg_json,
                "--training",
                *map(str, paths["training"]),
                "--eval-metrics",
                *map(str, paths["eval_metrics"]),
                "--samples",
                *map(str, paths["samples"]),
                "--out-dir",
                str(out),
            ]
        )
        == 0
    )
    for question in ("data", "algorithm", "reasoning"):
        assert (out / f"{question}.png").read_bytes()[:8] == PNG_MAGIC
    data_md = (out / "data.md").read_text()
    assert "| base (real SFT, filtered, grpo_tcr) | 50.0 ± 0.0 [50.0-50.0]" in data_md
    assert "3.0 ± 0.0 [3-3] (3/3 reached)" in data_md
    assert "3.0 [3-3] (1/3 reached)" in data_md  # stitched: only seed 3 (smoothed .1 .3 .5)
    algorithm_md = (out / "algorithm.md").read_text()
    assert "not reached (0/3)" in algorithm_md and "stitched" not in algorithm_md
    reasoning = pd.read_csv(out / "reasoning.csv")
    assert sorted(reasoning["arm"].unique()) == ["base", "gt", "stitched"]
    row = reasoning[(reasoning["arm"] == "stitched") & (reasoning["metric"] == "eval/reactive_share")].iloc[0]
    assert (row["mean"], row["seeds"], json.loads(row["values"])) == (1.0, 3, [1.0, 1.0, 1.0])
    steps = pd.read_csv(out / "data.csv").query("arm == 'stitched' and metric == 'steps_to_reach'").iloc[0]
    assert steps["seeds_with_value"] == 1 and json.loads(steps["values"]) == [None, None, 3.0]


def test_a_missing_seed_or_evaluation_is_named(runs, tmp_path):
    root, paths = runs
    without_seed = [p for p in paths["training"] if "gt/seed2" not in str(p)]
    with pytest.raises(ValueError, match="arm 'gt' seed 2: evaluation files but no GRPO log"):
        ablations.load_runs(without_seed, paths["eval_metrics"], paths["samples"])
    keep = lambda ps: [p for p in ps if "gt/seed2" not in str(p)]  # noqa: E731
    loaded = ablations.load_runs(keep(paths["training"]), keep(paths["eval_metrics"]), keep(paths["samples"]))
    with pytest.raises(ValueError, match=r"runs missing for \(arm: seeds\) \{'gt': \[2\]\}"):
        ablations.write_ablations(CFG, loaded, tmp_path / "out")
    no_samples = [p for p in paths["samples"] if "base/seed1/eval/arith" not in str(p)]
    with pytest.raises(ValueError, match="arm 'base' seed 1: .* samples.jsonl for \\['program'\\]"):
        ablations.load_runs(paths["training"], paths["eval_metrics"], no_samples)
