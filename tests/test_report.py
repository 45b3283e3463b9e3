"""The report stage: summary table (markdown + CSV) with the published figures beside ours, and readable PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers.eval_samples import synthetic_samples

from agentrl.config import load_config
from agentrl.errors import UserInputError
from agentrl.filtering.selection import select_problems
from agentrl.report import cli as report_cli
from agentrl.report.plots import read_training_log, training_panels
from agentrl.report.tables import read_eval_results, read_published
from agentrl.sampling.metrics import summarize_benchmark

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _samples(accuracy: float, problems: int = 6, n: int = 4, seed: int = 0) -> list[dict]:
    return synthetic_samples(accuracy, problems, n, seed)


def _write_metrics(root: Path, model: str, benchmark: str, accuracy: float, seed: int) -> Path:
    path = root / "eval" / model / benchmark / "metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**summarize_benchmark(_samples(accuracy, seed=seed)), "run": {"n": 4}}))
    return path


def _write_log(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> dict:
    metrics = [
        _write_metrics(tmp_path, model, bench, acc, seed)
        for seed, (model, bench, acc) in enumerate(
            [
                ("base", "aime2024", 0.1),
                ("sft", "aime2024", 0.3),
                ("rl", "aime2024", 0.6),
                ("base", "arith", 0.2),
                ("sft", "arith", 0.5),
                ("rl", "arith", 0.8),
            ]
        )
    ]
    sft_log = _write_log(
        tmp_path / "sft/metrics.jsonl",
        [{"step": s, "loss": 2.0 / s, "lr": 1e-5, "grad_norm": 1.0, "epoch": 0} for s in range(1, 6)],
    )
    rl_log = _write_log(
        tmp_path / "rl/metrics.jsonl",
        [
            {
                "step": s,
                "reward": {"mean": -1 + 0.2 * s},
                "acc": 0.1 * s,
                "entropy": 1.0 - 0.1 * s,
                "response_length": {"mean": 300 + s},
                "tool_calls_per_response": 1.5,
                "clip_frac": {"low": 0.01, "high": 0.02},
                "note": "text is ignored",
            }
            for s in range(1, 6)
        ],
    )
    table = pd.DataFrame(
        {
            "id": [f"p{i}" for i in range(9)],
            "data_source": "embedded-arith",
            "k": 8,
            "correct": list(range(9)),
            "pass_rate": [i / 8 for i in range(9)],
        }
    )
    stats = select_problems(table, load_config({}).filter, seed=0).stats
    stats_path = tmp_path / "filter/stats.json"
    stats_path.parent.mkdir()
    stats_path.write_text(json.dumps(stats))
    return {"root": tmp_path, "metrics": metrics, "sft": sft_log, "rl": rl_log, "stats": stats_path}


def _outputs(root: Path) -> dict[str, Path]:
    out = root / "report"
    return {
        "md": out / "summary.md",
        "csv": out / "summary.csv",
        "acc": out / "accuracy_by_stage.png",
        "modes": out / "reasoning_modes.png",
        "sft": out / "training_sft.png",
        "rl": out / "training_rl.png",
    }


def test_report_renders_tables_and_plots(run_dir):
    out = _outputs(run_dir["root"])
    args = [
        "--metrics",
        *map(str, run_dir["metrics"]),
        "--sft-metrics",
        str(run_dir["sft"]),
        "--sft-plot",
        str(out["sft"]),
        "--rl-metrics",
        str(run_dir["rl"]),
        "--rl-plot",
        str(out["rl"]),
        "--filter-stats",
        str(run_dir["stats"]),
        "--table-md",
        str(out["md"]),
        "--table-csv",
        str(out["csv"]),
        "--accuracy-plot",
        str(out["acc"]),
        "--modes-plot",
        str(out["modes"]),
        "--published-model",
        "rl=Gen-Verse/DemyAgent-4B",
    ]
    assert report_cli.main(args) == 0
    for key in ("acc", "modes", "sft", "rl"):
        data = out[key].read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 20_000, f"{key} plot is not a real figure"

    frame = pd.read_csv(out["csv"])
    ours = frame[frame["source"] == "ours"]
    assert list(zip(ours["model"], ours["benchmark"])) == [
        ("base", "aime2024"),
        ("sft", "aime2024"),
        ("rl", "aime2024"),
        ("base", "arith"),
        ("sft", "arith"),
        ("rl", "arith"),
    ]
    for path, row in zip(run_dir["metrics"], ours.to_dict("records")):
        metrics = json.loads(path.read_text())
        assert row["avg@n"] == pytest.approx(100 * metrics["avg@4"], abs=0.01)
        assert row["pass@n"] == pytest.approx(100 * metrics["pass@k"]["4"], abs=0.01)
        assert row["best@n_upstream"] == pytest.approx(100 * metrics["upstream_bootstrap"]["best@4"], abs=0.01)
        assert row["tool_calls_per_response"] == pytest.approx(metrics["tool_use"]["tool_calls_per_response"], abs=1e-3)
    # the rl model is compared with DemyAgent-4B where the card reports the benchmark (not arith)
    compared = ours[ours["published"].notna()]
    assert list(zip(compared["model"], compared["benchmark"], compared["published"])) == [("rl", "aime2024", 72.6)]
    assert compared["published_as"].tolist() == ["Gen-Verse/DemyAgent-4B"]
    assert compared["difference"].iloc[0] == pytest.approx(compared["avg@n"].iloc[0] - 72.6, abs=0.01)

    md = out["md"].read_text()
    assert "| model | aime2024 | arith | mean |" in md
    rl_aime = ours[(ours["model"] == "rl") & (ours["benchmark"] == "aime2024")].iloc[0]
    rl_arith = ours[(ours["model"] == "rl") & (ours["benchmark"] == "arith")].iloc[0]
    rl_mean = (rl_aime["avg@n"] + rl_arith["avg@n"]) / 2
    assert f"| rl | {rl_aime['avg@n']:.1f} [{rl_aime['avg@n_ci_low']:.1f}, {rl_aime['avg@n_ci_high']:.1f}] |" in md
    rl_line = next(line for line in md.splitlines() if line.startswith("| rl |"))
    assert rl_line.endswith(f"] | {rl_mean:.1f} |")
    assert "## Measured and published" in md
    diff = rl_aime["avg@n"] - 72.6
    assert f"| rl | Gen-Verse/DemyAgent-4B | aime2024 | {rl_aime['avg@n']:.1f} [" in md
    assert f"] (n = 4) | 72.6 | {diff:+.1f} | no |" in md, "72.6 lies outside the interval of a 60 % model"
    assert "huggingface.co/Gen-Verse/DemyAgent-4B" in md, "the comparison cites the model card"
    assert "| scored | 9 | 3 | 3 | 3 |" in md and "| selected | 7 | 2 | 3 | 2 |" in md
    for name in ("accuracy_by_stage.png", "reasoning_modes.png", "training_sft.png", "training_rl.png"):
        assert f"]({name})" in md


def test_report_without_optional_inputs(run_dir):
    out = _outputs(run_dir["root"])
    args = [
        "--metrics",
        str(run_dir["metrics"][3]),
        "--table-md",
        str(out["md"]),
        "--table-csv",
        str(out["csv"]),
        "--accuracy-plot",
        str(out["acc"]),
        "--modes-plot",
        str(out["modes"]),
    ]
    assert report_cli.main(args) == 0
    md = out["md"].read_text()
    assert "training" not in md and "Model-aware RL data" not in md and "published" not in md
    assert not out["rl"].exists() and out["acc"].read_bytes()[:8] == PNG_MAGIC


def test_report_refuses_half_given_and_misplaced_inputs(run_dir, tmp_path):
    out = _outputs(run_dir["root"])
    base = [
        "--table-md",
        str(out["md"]),
        "--table-csv",
        str(out["csv"]),
        "--accuracy-plot",
        str(out["acc"]),
        "--modes-plot",
        str(out["modes"]),
    ]
    with pytest.raises(UserInputError, match="--rl-metrics and --rl-plot"):
        report_cli.main(["--metrics", str(run_dir["metrics"][0]), "--rl-metrics", str(run_dir["rl"]), *base])
    stray = tmp_path / "metrics.json"
    stray.write_text(json.dumps({"avg@4": 0.5}))
    with pytest.raises(ValueError, match="missing key 'samples_per_problem'"):
        read_eval_results([stray])
    with pytest.raises(ValueError, match="given twice"):
        read_eval_results([run_dir["metrics"][0]] * 2)


def test_published_figures_are_checked_and_cited(run_dir, tmp_path):
    entries = read_published()
    benchmarks = ("aime2024", "aime2025", "gpqa_diamond", "livecodebench_v6")
    card = {  # the model card's table, row by row (upstream README "DemyAgent Results")
        ("Gen-Verse/DemyAgent-4B", "agentic"): (72.6, 70.0, 58.5, 26.8),
        ("Qwen/Qwen3-4B-Instruct-2507", "self_contained"): (63.3, 47.4, 52.0, 35.1),
        ("Qwen/Qwen3-4B-Instruct-2507", "agentic"): (17.9, 16.3, 44.3, 23.0),
        ("Qwen/Qwen2.5-7B-Instruct", "self_contained"): (16.7, 10.0, 31.3, 15.2),
        ("Qwen/Qwen2.5-7B-Instruct", "agentic"): (4.8, 5.6, 25.5, 12.2),
    }
    found = {(name, half): figures for name, e in entries.items() for half, figures in e.figures.items()}
    assert found == {key: dict(zip(benchmarks, row)) for key, row in card.items()}
    assert all("huggingface.co/Gen-Verse/DemyAgent-4B" in e.source and e.metric == "avg@32" for e in entries.values())
    broken = tmp_path / "published.yaml"
    broken.write_text(
        "Org/Model: {source: card, metric: avg@32, n: 32, sampling: s, figures: {agentic: {aime2024: 726}}}\n"
    )
    with pytest.raises(ValueError, match=r"Org/Model.figures.agentic.aime2024 = 726 is not a percentage"):
        read_published(broken)
    broken.write_text("Org/Model: {source: card, metric: avg@32, n: 32, sampling: s, figures: {aime2024: 72.6}}\n")
    with pytest.raises(ValueError, match=r"Org/Model.figures must map halves of the table"):
        read_published(broken)
    out = _outputs(run_dir["root"])
    base = ["--metrics", str(run_dir["metrics"][0]), "--table-md", str(out["md"]), "--table-csv", str(out["csv"])]
    base += ["--accuracy-plot", str(out["acc"]), "--modes-plot", str(out["modes"])]
    with pytest.raises(UserInputError, match="has no entry 'Gen-Verse/DemyAgent-8B'"):
        report_cli.main([*base, "--published-model", "base=Gen-Verse/DemyAgent-8B"])
    with pytest.raises(UserInputError, match="no metrics of 'rl'"):
        report_cli.main([*base, "--published-model", "rl=Gen-Verse/DemyAgent-4B"])


def test_the_sources_of_models_not_trained_here_are_listed(run_dir, tmp_path):
    linked = tmp_path / "models/rl/config.json"
    linked.parent.mkdir(parents=True)
    commit = "0123456789abcdef0123456789abcdef01234567"
    source = {"id": "Gen-Verse/DemyAgent-4B", "revision": "main", "commit": commit}
    linked.write_text(json.dumps({"model_type": "qwen3", "agentrl_source": source}))
    trained = tmp_path / "models/base/config.json"
    trained.parent.mkdir(parents=True)
    trained.write_text(json.dumps({"model_type": "qwen3"}))
    out = _outputs(run_dir["root"])
    args = [
        "--metrics",
        *map(str, run_dir["metrics"][:3]),
        "--table-md",
        str(out["md"]),
        "--table-csv",
        str(out["csv"]),
    ]
    args += ["--accuracy-plot", str(out["acc"]), "--modes-plot", str(out["modes"])]
    args += ["--model-config", f"rl={linked}", "--model-config", f"base={trained}"]
    assert report_cli.main(args) == 0
    md = out["md"].read_text()
    assert "## Models not trained here" in md
    assert f"| rl | Gen-Verse/DemyAgent-4B | main | {commit} |" in md
    assert "| base |" not in md.split("## Models not trained here")[1].split("##")[0], "a trained model has no source"


def test_training_logs_are_grouped_by_metric_name(tmp_path):
    log = _write_log(
        tmp_path / "m.jsonl",
        [
            {
                "global_step": 1,
                "actor/pg_clipfrac": 0.1,
                "critic/score/mean": 0.5,
                "actor/entropy": 2.0,
                "response_length/mean": 80,
                "timing/gen": 3.0,
            }
        ],
    )
    step_key, rows = read_training_log(log)
    assert step_key == "global_step" and rows[0]["actor/entropy"] == 2.0
    panels = training_panels(list(rows[0]), step_key)
    assert panels == {
        "Clip fractions": ["actor/pg_clipfrac"],
        "Reward": ["critic/score/mean"],
        "Entropy": ["actor/entropy"],
        "Response length": ["response_length/mean"],
    }
    # durations, token counts and spreads are not drawn beside the values whose words they share
    ours = training_panels(
        [
            "step",
            "rollout/reward_mean",
            "rollout/reward_std",
            "timing/reward_s",
            "actor/pg_loss",
            "actor/loss_tokens",
            "timing/train_tokens_per_s",
        ],
        "step",
    )
    assert ours == {"Reward": ["rollout/reward_mean"], "Loss": ["actor/pg_loss"]}
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no rows"):
        read_training_log(empty)


def test_report_health_section_shows_what_failed_and_why(tmp_path):
    root = tmp_path
    from agentrl.tools.health import ToolUse, rows_tool_health, tool_health

    # metrics.json of a healthy evaluation and of one whose sandbox lost calls.
    healthy = [
        {**r, "tool_outcomes": ["program_error" if e else "ok" for e in r["tool_errors"]]} for r in _samples(0.5)
    ]
    broken = [{**r, "tool_outcomes": ["infra_failure"] * r["tool_calls"]} for r in _samples(0.5, seed=1)]
    broken[0] = {**broken[0], "tool_calls": 1, "tool_outcomes": ["infra_failure"], "attempts": 2, "infra_failed": True}
    paths = []
    for model, rows in (("sft", healthy), ("rl", broken)):
        path = root / "eval" / model / "arith" / "metrics.json"
        path.parent.mkdir(parents=True)
        health = {**rows_tool_health(rows), "problems_left_out": 1 if model == "rl" else 0}
        path.write_text(json.dumps({**summarize_benchmark(healthy), "tool_health": health, "run": {"n": 4}}))
        paths.append(path)
    # A GRPO log whose steps hold tool_health/ keys as the trainer writes them.
    steps = []
    for step in range(1, 5):
        uses = [ToolUse(("ok", "program_error"), (0.01, 0.02), (0.1, 0.2 * step), 1, False)] * 3
        uses += [ToolUse(("infra_failure",), (0.5,), (0.0,), 2, True)] * (step == 3)
        steps.append({"step": step, "rollout/reward_mean": 0.1 * step, **tool_health(uses, prefix="tool_health/")})
    rl_log = _write_log(root / "rl/metrics.jsonl", steps)
    out = _outputs(tmp_path)
    health_md, health_csv, health_png = (
        root / "report" / name for name in ("health.md", "health.csv", "tool_health_rl.png")
    )
    args = ["--metrics", *map(str, paths), "--rl-metrics", str(rl_log), "--rl-plot", str(out["rl"])]
    args += ["--table-md", str(out["md"]), "--table-csv", str(out["csv"])]
    args += ["--accuracy-plot", str(out["acc"]), "--modes-plot", str(out["modes"])]
    args += ["--health-md", str(health_md), "--health-csv", str(health_csv), "--health-plot", str(health_png)]
    assert report_cli.main(args) == 0
    frame = pd.read_csv(health_csv)
    assert frame["stage"].tolist() == ["grpo rollouts", "evaluate sft", "evaluate rl"]
    grpo, sft, rl = frame.to_dict("records")
    assert grpo["calls"] == 25 and grpo["retried"] == 1 and grpo["left_out"] == 1
    assert grpo["infra_failure_pct"] == pytest.approx(100 / 25) and grpo["ok_pct"] == pytest.approx(1200 / 25)
    assert grpo["run_p95_s"] == pytest.approx(max(s["tool_health/run_s_p95"] for s in steps))
    assert sft["infra_failure_pct"] == 0 and sft["ok_pct"] + sft["program_error_pct"] == pytest.approx(100)
    assert rl["infra_failure_pct"] == pytest.approx(100) and rl["left_out"] == 1 and rl["problems_left_out"] == 1
    md = health_md.read_text()
    assert md.startswith("# Tool health") and "lost up to 100.0 % of a stage's tool calls" in md
    assert "| grpo rollouts | 4 steps | 25 |" in md and "](tool_health_rl.png)" in md
    data = health_png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 20_000
    assert "](health.md)" in out["md"].read_text(), "the summary links the health section"


BENCHMARK_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def test_cost_table_has_a_row_per_rule_with_tokens_and_mfu(tmp_path):
    import torch
    from safetensors.torch import save_file

    from agentrl.report import cost

    timings = tmp_path / "timings"
    jobs = {
        "prepare_data.tsv": (12.5, 300.0, 10.0),
        "sft.tsv": (100.0, 900.0, 180.0),
        "grpo.tsv": (200.0, 1200.0, 390.0),
        "evaluate/sft/arith/0-of-2.tsv": (30.0, 500.0, 29.0),
        "evaluate/sft/arith/1-of-2.tsv": (50.0, 700.0, 49.0),
        "report.tsv": (3.0, 200.0, 2.0),  # the job writing the table: left out
    }
    for name, (wall, rss, cpu) in jobs.items():
        path = timings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(BENCHMARK_HEADER + f"{wall}\t0:00:{wall}\t{rss}\t1\t1\t1\t0\t0\t50\t{cpu}\n")
    sft_log = _write_log(
        tmp_path / "sft/metrics.jsonl",
        [{"step": s, "loss": 1.0, "tokens_per_s": 100.0, "step_time_s": 2.0, "trained_tokens": 80} for s in (1, 2)],
    )
    rl_log = _write_log(
        tmp_path / "rl/metrics.jsonl",
        [{"step": 0, "val/mean/acc": 0.1}]  # validation before training: no tokens
        + [
            {
                "step": s,
                "rollout/generated_tokens_mean": 50.0,
                "rollout/trajectories": 8.0,
                "actor/input_tokens": 1000.0,
                **({"rollout/staleness": 1.0} if s > 1 else {"rollout/staleness": 0.0}),  # one-step-off
            }
            for s in (1, 2, 3)
        ],
    )
    samples = _write_log(tmp_path / "eval/samples.jsonl", [{"response_tokens": 40}, {"response_tokens": 60}])
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": torch.zeros(10, 100), "b": torch.zeros(1000)}, str(model / "model.safetensors"))
    assert cost.parameter_count(model) == 2000
    md, csv = tmp_path / "report/cost.md", tmp_path / "report/cost.csv"
    args = ["--timings", str(timings), "--sft-metrics", str(sft_log), "--rl-metrics", str(rl_log)]
    args += ["--sft-model", str(model), "--rl-model", str(model), "--eval-samples", str(samples)]
    args += ["--gpus", "sft=0", "--gpus", "grpo=8", "--threads", "sft=2", "--accelerator", "H100"]
    args += ["--md", str(md), "--csv", str(csv)]
    assert report_cli.main(["cost", *args]) == 0
    frame = pd.read_csv(csv).set_index("rule")
    assert list(frame.index) == ["evaluate", "grpo", "prepare_data", "sft", "total"]
    assert frame.loc["evaluate", "jobs"] == 2 and frame.loc["evaluate", "wall_s"] == 80.0
    assert frame.loc["evaluate", "cpu_h"] == pytest.approx(78 / 3600) and frame.loc["evaluate", "max_rss_mb"] == 700
    assert frame.loc["evaluate", "generated_tokens"] == 100 and frame.loc["evaluate", "tokens_per_s"] == 100 / 80
    assert frame.loc["sft", "trained_tokens"] == 400 and frame.loc["sft", "gpu_h"] == 0
    assert (frame.loc["grpo", "generated_tokens"], frame.loc["grpo", "trained_tokens"]) == (1200, 3000)
    assert frame.loc["grpo", "gpu_h"] == pytest.approx(200 * 8 / 3600)
    grpo_flops = 6 * 2000 * 3000 + 2 * 2000 * 1200
    assert frame.loc["grpo", "mfu_pct"] == pytest.approx(100 * grpo_flops / 200 / (8 * 989e12))
    sft_peak = cost.measured_matmul_tflops(2) * 1e12
    assert frame.loc["sft", "mfu_pct"] == pytest.approx(100 * 6 * 2000 * 400 / 100 / sft_peak)
    assert "measured float32 matmul" in frame.loc["sft", "note"] and "H100" in frame.loc["grpo", "note"]
    assert pd.isna(frame.loc["prepare_data", "generated_tokens"]) and pd.isna(frame.loc["prepare_data", "mfu_pct"])
    assert frame.loc["total", "wall_s"] == 392.5 and frame.loc["total", "jobs"] == 6 - 1
    assert frame.loc["grpo", "staleness_mean"] == pytest.approx(2 / 3) and pd.isna(frame.loc["sft", "staleness_mean"])
    text = md.read_text()
    assert text.startswith("# Cost of every stage") and "| grpo | 1 | 200.0 |" in text
    assert "| 0.67 |" in text.split("| grpo |")[1].splitlines()[0]
    # Without the GPU model the GPU stage's MFU is omitted, with the reason.
    assert report_cli.main(["cost", *[a for a in args if a not in ("--accelerator", "H100")]]) == 0
    frame = pd.read_csv(csv).set_index("rule")
    assert pd.isna(frame.loc["grpo", "mfu_pct"]) and "--accelerator" in frame.loc["grpo", "note"]


def _write_half(root: Path, model: str, reasoning: str, benchmark: str, accuracy: float, seed: int) -> Path:
    half = "" if reasoning == "agentic" else f"{reasoning}/"
    path = root / "eval" / model / f"{half}{benchmark}" / "metrics.json"
    path.parent.mkdir(parents=True)
    run = {"n": 4, "reasoning": reasoning}
    path.write_text(json.dumps({**summarize_benchmark(_samples(accuracy, seed=seed)), "run": run}))
    return path


def test_the_report_places_each_half_under_its_model_card_rows(tmp_path):
    rows = [
        ("Qwen3-4B-Instruct-2507", "agentic", 0.2),
        ("Qwen3-4B-Instruct-2507", "self_contained", 0.6),
        ("DemyAgent-4B", "agentic", 0.7),
        ("DemyAgent-4B", "self_contained", 0.5),
    ]
    metrics = [_write_half(tmp_path, m, r, "aime2025", acc, seed) for seed, (m, r, acc) in enumerate(rows)]
    results = read_eval_results(metrics)
    assert [(r.model, r.reasoning) for r in results] == [(m, r) for m, r, _ in rows]
    out = _outputs(tmp_path)
    args = ["--metrics", *map(str, metrics), "--table-md", str(out["md"]), "--table-csv", str(out["csv"])]
    args += ["--accuracy-plot", str(out["acc"]), "--modes-plot", str(out["modes"])]
    args += ["--published-model", "Qwen3-4B-Instruct-2507=Qwen/Qwen3-4B-Instruct-2507"]
    args += ["--published-model", "DemyAgent-4B=Gen-Verse/DemyAgent-4B"]
    assert report_cli.main(args) == 0

    frame = pd.read_csv(out["csv"])
    published = {(r["model"], r["reasoning"]): r["published"] for r in frame.to_dict("records")}
    assert published[("Qwen3-4B-Instruct-2507", "self_contained")] == 47.4
    assert published[("Qwen3-4B-Instruct-2507", "agentic")] == 16.3
    assert published[("DemyAgent-4B", "agentic")] == 70.0
    assert pd.isna(published[("DemyAgent-4B", "self_contained")]), "the card has no self-contained DemyAgent row"

    md = out["md"].read_text()
    assert "| model | reasoning | aime2025 |" in md
    compared = md.split("## Measured and published")[1].split("## Metrics per benchmark")[0]
    self_contained, agentic = compared.split("### Self-contained reasoning (no tool)")[1].split(
        "### Agentic reasoning (code tool)"
    )
    assert "| Qwen3-4B-Instruct-2507 | Qwen/Qwen3-4B-Instruct-2507 | aime2025 |" in self_contained
    assert "| 47.4 |" in self_contained and "| 16.3 |" not in self_contained
    assert "| DemyAgent-4B | Gen-Verse/DemyAgent-4B | aime2025 |" in self_contained
    assert "| - | - | - |" in self_contained, "no published self-contained figure: no difference, no CI verdict"
    assert "| 16.3 |" in agentic and "| 70.0 |" in agentic and "| 47.4 |" not in agentic


def test_a_half_in_the_wrong_folder_is_refused(tmp_path):
    misplaced = _write_half(tmp_path, "rl", "agentic", "aime2024", 0.5, 0)
    data = json.loads(misplaced.read_text())
    misplaced.write_text(json.dumps({**data, "run": {"n": 4, "reasoning": "self_contained"}}))
    with pytest.raises(ValueError, match="expected a path ending in <model>/self_contained/<benchmark>"):
        read_eval_results([misplaced])
    data["run"]["reasoning"] = "tool_free"
    misplaced.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="run.reasoning is 'tool_free'"):
        read_eval_results([misplaced])


def test_the_summary_links_each_table_and_plot_to_a_file_that_exists(run_dir):
    """health.md and cost.md are links (an image of a markdown file renders broken), and every
    relative link of summary.md, and of the tables it links, resolves from where the file is."""
    from helpers.report_links import broken_links, relative_links

    root, out = run_dir["root"], _outputs(run_dir["root"])
    report = root / "report"
    timings = root / "timings"
    timings.mkdir()
    (timings / "sft.tsv").write_text(BENCHMARK_HEADER + "10.0\t0:00:10\t100\t1\t1\t1\t0\t0\t50\t9.0\n")
    cost = ["cost", "--timings", str(timings), "--sft-metrics", str(run_dir["sft"])]
    assert report_cli.main([*cost, "--md", str(report / "cost.md"), "--csv", str(report / "cost.csv")]) == 0
    args = ["--metrics", *map(str, run_dir["metrics"]), "--filter-stats", str(run_dir["stats"])]
    args += ["--sft-metrics", str(run_dir["sft"]), "--sft-plot", str(out["sft"])]
    args += ["--rl-metrics", str(run_dir["rl"]), "--rl-plot", str(out["rl"])]
    args += ["--table-md", str(out["md"]), "--table-csv", str(out["csv"])]
    args += ["--accuracy-plot", str(out["acc"]), "--modes-plot", str(out["modes"])]
    args += ["--health-md", str(report / "health.md"), "--health-csv", str(report / "health.csv")]
    args += ["--cost-md", str(report / "cost.md")]
    assert report_cli.main(args) == 0
    links = relative_links(out["md"])
    assert (False, "health.md") in links and (False, "cost.md") in links, links
    assert (True, "training_rl.png") in links and (True, "accuracy_by_stage.png") in links, links
    assert not any(target.endswith(".md") for image, target in links if image), "no table embedded as an image"
    for md in (out["md"], report / "health.md", report / "cost.md"):
        assert broken_links(md) == [], (md.name, broken_links(md))
    (report / "cost.md").unlink()  # the summary links only a cost table that is there
    with pytest.raises(ValueError, match=r"--cost-md .*cost.md: no such file"):
        report_cli.main(args)


# name -> (what is broken in the run folder, fragments of the message)
REPORT_INPUTS = {
    "metrics.json missing a key": ("metrics", ["rl/arith/metrics.json: missing key 'tool_use.modes.reactive.share'", "gather_evaluation"]),
    "an empty training log": ("sft", ["sft/metrics.jsonl: no rows", "logged no step"]),
    "a training log of no objects": ("rl", ["rl/metrics.jsonl: line 1: expected a JSON object"]),
    "filter stats missing a key": ("stats", ["filter/stats.json: missing key 'thresholds.low'", "select_rl_data"]),
    "published.yaml not YAML": ("published", ["published.yaml: not valid YAML at line 3"]),
    "published.yaml missing a key": ("published entry", ["published.yaml: entry 'Org/Model' lacks key(s) ['n']"]),
}  # fmt: skip


def _break_report_input(run_dir: dict, what: str) -> Path:
    """Break one input of the report in ``run_dir``; returns the published-figures file to give."""
    published = run_dir["root"] / "published.yaml"
    entry = {"source": "card", "metric": "avg@32", "n": 32, "sampling": "s", "figures": {"agentic": {"arith": 50}}}
    published.write_text(json.dumps({"Org/Model": entry}))
    if what == "metrics":
        path = run_dir["metrics"][5]
        metrics = json.loads(path.read_text())
        del metrics["tool_use"]["modes"]["reactive"]
        path.write_text(json.dumps(metrics))
    elif what == "sft":
        run_dir["sft"].write_text("\n")  # a stage that stopped before its first step
    elif what == "rl":
        run_dir["rl"].write_text("[1, 2]\n")
    elif what == "stats":
        stats = json.loads(run_dir["stats"].read_text())
        del stats["thresholds"]["low"]
        run_dir["stats"].write_text(json.dumps(stats))
    elif what == "published":
        published.write_text("Org/Model:\n  source: [card\n  n: 32\n")
    else:
        published.write_text(json.dumps({"Org/Model": {k: v for k, v in entry.items() if k != "n"}}))
    return published


@pytest.mark.parametrize("case", sorted(REPORT_INPUTS))
def test_a_broken_report_input_is_refused_naming_the_file_before_any_output(run_dir, case):
    from helpers.stage_inputs import assert_refused, run_agentrl

    what, fragments = REPORT_INPUTS[case]
    published = _break_report_input(run_dir, what)
    out = _outputs(run_dir["root"])
    args = ["report", "--metrics", *run_dir["metrics"], "--filter-stats", run_dir["stats"]]
    args += ["--sft-metrics", run_dir["sft"], "--sft-plot", out["sft"], "--rl-metrics", run_dir["rl"]]
    args += ["--rl-plot", out["rl"], "--published", published, "--published-model", "rl=Org/Model"]
    args += ["--table-md", out["md"], "--table-csv", out["csv"], "--accuracy-plot", out["acc"]]
    args += ["--modes-plot", out["modes"], "--health-md", run_dir["root"] / "report/health.md"]
    args += ["--health-csv", run_dir["root"] / "report/health.csv"]
    completed = run_agentrl(*args, cwd=run_dir["root"])
    assert_refused(completed, *fragments)
    written = [p for p in (run_dir["root"] / "report").rglob("*") if p.is_file()]
    assert written == [], "nothing written that looks like a report"


def test_the_cost_table_refuses_a_log_it_cannot_read_naming_the_file(tmp_path):
    from helpers.stage_inputs import assert_refused, run_agentrl

    (tmp_path / "timings").mkdir()
    log = _write_log(tmp_path / "sft/metrics.jsonl", [{"step": 1, "tokens_per_s": 1.0, "step_time_s": 1.0}])
    log.write_text(log.read_text() + "[2]\n")
    args = [
        "report",
        "cost",
        "--timings",
        tmp_path / "timings",
        "--md",
        tmp_path / "cost.md",
        "--csv",
        tmp_path / "cost.csv",
    ]
    assert_refused(
        run_agentrl(*args, "--sft-metrics", log, cwd=tmp_path), "sft/metrics.jsonl: line 2: expected a JSON object"
    )
    assert_refused(run_agentrl(*args, "--rl-metrics", tmp_path / "rl.jsonl", cwd=tmp_path), "rl.jsonl: cannot be read")
    assert not (tmp_path / "cost.md").exists() and not (tmp_path / "cost.csv").exists()
