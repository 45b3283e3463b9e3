"""The ablation report: smoothing, steps to reach, spreads over seeds, tables and plots from hand-made runs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from agentrl.config import ConfigError, load_config
from agentrl.report import ablation_plots, ablations
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


def test_run_metrics_for_the_effects_and_none_where_an_older_log_lacks_the_key(runs):
    root, paths = runs
    loaded = ablations.load_runs(paths["training"], paths["eval_metrics"], paths["samples"])
    base, stitched, gt = (ablations.run_metrics(loaded[arm][0], CFG) for arm in ("base", "stitched", "gt"))
    assert base["train/entropy_last"] == pytest.approx(0.8)  # mean of the last 3 steps: .9 .8 .7
    assert base["train/clip_frac_high_mean"] == pytest.approx(0.01)
    assert base["train/clip_frac_low_mean"] == pytest.approx(0.02)
    assert base["train/zero_advantage_share_mean"] == pytest.approx(0.5)
    # 16 responses with one call each, 8 of them correct; stitched: 3 calls each, 4 correct; gt: none correct
    assert base["eval/tool_calls_per_solved"] == 2.0 and stitched["eval/tool_calls_per_solved"] == 12.0
    assert gt["eval/tool_calls_per_solved"] is None and gt["train/clip_frac_low_mean"] is None
    assert all(
        stitched[f"train/{k}"] is None for k in ("entropy_last", "clip_frac_high_mean", "zero_advantage_share_mean")
    )


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
    steps = pd.read_csv(out / "data.csv").query("kind == 'spread' and arm == 'stitched' and metric == 'steps_to_reach'")
    steps = steps.iloc[0]
    assert steps["seeds_with_value"] == 1 and json.loads(steps["values"]) == [None, None, 3.0]


def _effects_table(markdown: str) -> dict[str, dict[str, str]]:
    """arm name -> column header -> cell of the markdown's "Effects against" table."""
    section = markdown[markdown.index("## Effects against base") :].split("\n\n")[1]
    header, _, *rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in section.splitlines()]
    return {row[0].split(" ")[0]: dict(zip(header, row)) for row in rows}


def test_effects_against_the_reference_arm_in_the_markdown_and_the_csv(runs, tmp_path):
    root, paths = runs
    loaded = ablations.load_runs(paths["training"], paths["eval_metrics"], paths["samples"])
    ablations.write_ablations(CFG, loaded, tmp_path / "out")
    data = _effects_table((tmp_path / "out" / "data.md").read_text())
    assert list(data) == ["stitched"]  # the reference arm has no row
    stitched = data["stitched"]
    assert stitched["avg@2 mean (pp)"] == "**\u221225.0 [\u221225.0, \u221225.0]**"  # every seed: 25 - 50
    # final training accuracy by seed: base .65 .65 .65, stitched .2 .2 .5 -> d = -.45 -.45 -.15
    d = [-0.45, -0.45, -0.15]
    mean = sum(d) / 3
    half = t_975(2) * math.sqrt(sum((x - mean) ** 2 for x in d) / 2) / math.sqrt(3)
    assert (round(100 * mean, 1), round(100 * (mean - half), 1), round(100 * (mean + half), 1)) == (-35.0, -78.0, 8.0)
    assert stitched["final training accuracy (pp)"] == "\u221235.0 [\u221278.0, +8.0]"  # not bold: contains 0
    assert stitched["steps to training accuracy >= 50 %"] == "+0.0 [-] (1/3 both reached)"  # only seed 3 reached
    assert stitched["tool calls / response (eval)"] == "**+2.00 [+2.00, +2.00]**"
    assert stitched["zero-advantage share, mean over steps (pp)"] == "-"  # stitched's logs lack the key
    algorithm = _effects_table((tmp_path / "out" / "algorithm.md").read_text())["gt"]
    assert algorithm["policy entropy, last 3 steps (nats / token)"] == "+0.233 [\u22120.146, +0.613]"
    assert algorithm["clip fraction high, mean over steps (pp)"] == "**+1.00 [+1.00, +1.00]**"
    assert algorithm["steps to training accuracy >= 50 %"] == "- (0/3 both reached)"
    reasoning = _effects_table((tmp_path / "out" / "reasoning.md").read_text())
    assert list(reasoning) == ["stitched", "gt"]
    assert reasoning["stitched"]["tool calls / correct response (eval)"] == "**+10.00 [+10.00, +10.00]**"
    assert reasoning["gt"]["tool calls / correct response (eval)"] == "-"  # gt solves nothing
    assert reasoning["stitched"]["deliberative share (pp)"] == "**\u2212100.0 [\u2212100.0, \u2212100.0]**"
    csv = pd.read_csv(tmp_path / "out" / "data.csv")
    row = csv.query("kind == 'effect' and metric == 'final_train_acc'").iloc[0]
    assert (row["arm"], row["reference"], row["seeds_with_value"], bool(row["excludes_zero"])) == (
        "stitched",
        "base",
        3,
        False,
    )
    assert (row["mean"], row["low"], row["high"]) == pytest.approx((mean, mean - half, mean + half))
    assert json.loads(row["values"]) == pytest.approx(d)
    steps = csv.query("kind == 'effect' and metric == 'steps_to_reach'").iloc[0]
    assert json.loads(steps["values"]) == [None, None, 0.0] and math.isnan(steps["low"])
    assert set(csv.query("kind == 'spread'")["arm"]) == {"base", "stitched"}  # the spread rows stay


def test_each_figure_has_an_entropy_panel_and_draws_without_entropy_in_the_logs(runs, tmp_path):
    root, paths = runs
    loaded = ablations.load_runs(paths["training"], paths["eval_metrics"], paths["samples"])
    per_seed = {arm: [ablations.run_metrics(r, CFG) for r in rs] for arm, rs in loaded.items()}
    table = ablations.aggregate(per_seed)
    bands = {arm: {k: ablations.seed_band(rs, k, 2) for k in ablation_plots.CURVE_KEYS} for arm, rs in loaded.items()}
    assert bands["stitched"][ablations.ENTROPY_KEY] is None  # an older log: no curve, no crash
    entropy = bands["gt"][ablations.ENTROPY_KEY]
    assert entropy.seeds == 3 and entropy.low == pytest.approx([0.9] * 4) and entropy.high == pytest.approx([1.2] * 4)
    plot = lambda question, arms, png: ablation_plots.plot_question(  # noqa: E731
        question, arms, bands, table, ["arith", "program"], 2, CFG, tmp_path / png
    )
    titles = plot("data", ["base", "stitched"], "data.png")
    assert titles == [
        "training accuracy (mean of 2 steps; band: seed min-max)",
        "policy entropy (mean of 2 steps; band: seed min-max)",
        "final evaluation: avg@2 (bars: mean; whiskers: seed min-max)",
    ]
    assert (tmp_path / "data.png").read_bytes()[:8] == PNG_MAGIC
    titles = plot("reasoning", ["base", "stitched", "gt"], "reasoning.png")
    assert titles[:4] == [
        "tool calls over training",
        "tool success over training",
        "training accuracy (mean of 2 steps; band: seed min-max)",
        "policy entropy (mean of 2 steps; band: seed min-max)",
    ] and titles[4].startswith("reasoning modes")
    assert len(plot("algorithm", ["stitched"], "old.png")) == 3  # no arm logs entropy: the panel says so


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
