"""Model-aware RL data selection (docs/recipe.md section 6): band, buckets, histogram matching, outputs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agentrl.config import load_config
from agentrl.data.records import Problem, read_problems, write_records
from agentrl.filtering import cli as filter_cli
from agentrl.filtering.pass_rates import pass_rate_table, read_pass_rates, write_pass_rates
from agentrl.filtering.selection import (
    BUCKETS,
    SelectionError,
    bucket_of,
    largest_remainder,
    resample_counts,
    select_problems,
    target_shares_from_table,
)
from agentrl.report.tables import filter_markdown

K = 8


def _problem(index: int, source: str = "embedded-arith", level: int | None = 2) -> Problem:
    extra = {"family": source.split("-")[-1], "level": level} if level is not None else {"index": index}
    return Problem(
        f"p{index:03d}", source, [{"role": "user", "content": f"question {index}"}], "math", str(index), extra
    )


def _pool(correct_counts: list[int], sources: list[str] | None = None) -> tuple[list[Problem], pd.DataFrame]:
    """Problems and their pass-rate table, problem i solved correct_counts[i] times out of K."""
    sources = sources or ["embedded-arith"] * len(correct_counts)
    problems = [_problem(i, s) for i, s in enumerate(sources)]
    rows = [
        {"problem_id": p.id, "acc": j < c, "score": 1.0 if j < c else -1.0, "tool_calls": 1, "response_length": 100 + j}
        for p, c in zip(problems, correct_counts)
        for j in range(K)
    ]
    return problems, pass_rate_table(problems, rows, K)


def _cfg(**filter_values):
    return load_config({"filter": filter_values}).filter


# --------------------------------------------------------------------------- the table
def test_pass_rate_table_aggregates_k_samples_per_problem():
    problems, table = _pool([0, 3, 8])
    assert table["id"].tolist() == ["p000", "p001", "p002"]
    assert table["pass_rate"].tolist() == [0.0, 3 / 8, 1.0]
    assert table["correct"].tolist() == [0, 3, 8]
    assert table.loc[1, "mean_score"] == pytest.approx((3 - 5) / 8)
    assert table.loc[0, "mean_response_length"] == pytest.approx(100 + 3.5)
    assert table["family"].tolist() == ["arith"] * 3 and table["level"].tolist() == [2, 2, 2]


def test_pass_rate_table_refuses_a_problem_with_the_wrong_sample_count():
    problems = [_problem(0)]
    rows = [{"problem_id": "p000", "acc": True, "score": 1.0, "tool_calls": 0, "response_length": 5}] * (K - 1)
    with pytest.raises(ValueError, match="p000.*7 scored samples, expected k = 8"):
        pass_rate_table(problems, rows, K)


def test_pass_rate_table_leaves_out_samples_lost_to_the_sandbox():
    problems = [_problem(0), _problem(1)]
    rows = [
        {"problem_id": "p000", "acc": j < 2, "score": 1.0 if j < 2 else -1.0, "tool_calls": 1, "response_length": 10}
        for j in range(K)
    ]
    rows[0]["infra_failed"] = True  # a correct-looking sample whose retry the sandbox lost: not the model's
    rows[-1]["infra_failed"] = True
    rows += [
        {
            "problem_id": "p001",
            "acc": False,
            "score": -1.0,
            "tool_calls": 1,
            "response_length": 10,
            "infra_failed": True,
        }
    ] * K
    table = pass_rate_table(problems, rows, K)
    assert table["id"].tolist() == ["p000"], "a problem whose every sample was lost gets no pass rate"
    assert (table.loc[0, "k"], table.loc[0, "correct"], table.loc[0, "pass_rate"]) == (K - 2, 1, 1 / (K - 2))
    assert table.loc[0, "mean_score"] == pytest.approx((1 - (K - 3)) / (K - 2))


def test_pass_rate_table_round_trips_through_parquet_without_levels(tmp_path):
    problems = [_problem(i, level=None) for i in range(2)]
    rows = [
        {"problem_id": p.id, "acc": False, "score": -1.0, "tool_calls": 0, "response_length": 5}
        for p in problems
        for _ in range(K)
    ]
    table = pass_rate_table(problems, rows, K)
    write_pass_rates(table, tmp_path / "pr.parquet")
    back = read_pass_rates(tmp_path / "pr.parquet")
    assert back["level"].isna().all() and back["family"].isna().all()
    assert back["pass_rate"].tolist() == [0.0, 0.0]


def test_read_pass_rates_names_the_bad_row(tmp_path):
    _, table = _pool([1, 2])
    table.loc[1, "pass_rate"] = 1.5
    table.to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(SelectionError, match=r"bad.parquet: row 1 \(id 'p001'\) has pass_rate 1.5"):
        read_pass_rates(tmp_path / "bad.parquet")


# --------------------------------------------------------------------------- band and buckets
def test_buckets_follow_the_paper_thresholds():
    rates = np.array([0.0, 0.25, 0.375, 0.5, 0.625, 0.75, 1.0])
    assert bucket_of(rates, 0.75, 0.25).tolist() == ["hard", "hard", "medium", "medium", "medium", "easy", "easy"]


def test_default_band_drops_exactly_never_and_always_solved():
    _, table = _pool(list(range(K + 1)) * 3)  # every pass rate 0/8 .. 8/8, three times
    selection = select_problems(table, _cfg(), seed=0)
    kept = table.set_index("id").loc[selection.ids, "pass_rate"]
    assert len(kept) == 3 * (K - 1)
    assert (kept > 0).all() and (kept < 1).all()
    stats = selection.stats
    assert stats["dropped_at_or_below_low"] == 3 and stats["dropped_at_or_above_high"] == 3
    assert (
        stats["scored"]["total"]
        == stats["dropped_at_or_below_low"] + stats["dropped_at_or_above_high"] + stats["in_band"]["total"]
    )
    assert stats["in_band"] == {"total": 21, "easy": 3 * 2, "medium": 3 * 3, "hard": 3 * 2}
    assert stats["selected"] == stats["in_band"] and stats["resampled_out"] == 0


@pytest.mark.parametrize("low,high", [(0.125, 0.875), (0.3, 0.7), (0.0, 0.5)])
def test_band_is_strict_at_both_ends(low, high):
    _, table = _pool(list(range(K + 1)) * 2)
    selection = select_problems(table, _cfg(low=low, high=high), seed=0)
    rates = table.set_index("id").loc[selection.ids, "pass_rate"]
    assert (rates > low).all() and (rates < high).all()
    expected = table[(table["pass_rate"] > low) & (table["pass_rate"] < high)]["id"].tolist()
    assert selection.ids == expected  # nothing inside the band is lost, the pool order is kept


def test_bad_thresholds_are_refused_with_the_keys_named():
    _, table = _pool([1, 2, 3])
    with pytest.raises(SelectionError, match=r"filter.low \(0.5\) must be below filter.high \(0.5\)"):
        select_problems(table, _cfg(low=0.5, high=0.5), seed=0)
    with pytest.raises(SelectionError, match="filter.hard_max .* must be below filter.easy_min"):
        select_problems(table, _cfg(easy_min=0.3, hard_max=0.4), seed=0)
    with pytest.raises(SelectionError, match="not both"):
        select_problems(
            table, _cfg(target_histogram={"easy": 1, "medium": 1, "hard": 1}, target_pass_rates="x"), seed=0
        )


# --------------------------------------------------------------------------- histogram matching
def test_largest_remainder_sums_to_the_total_and_tracks_the_shares():
    counts = largest_remainder({"easy": 0.5, "medium": 0.3, "hard": 0.2}, 7)
    assert sum(counts.values()) == 7
    assert counts == {"easy": 4, "medium": 2, "hard": 1}  # 3.5 / 2.1 / 1.4 -> easy's .5 wins the last slot


def test_resample_counts_takes_the_largest_set_without_replacement():
    # 10 easy, 10 medium, 40 hard available; target 1/3 each -> at most 10 per bucket.
    counts = resample_counts({"easy": 10, "medium": 10, "hard": 40}, {b: 1 / 3 for b in BUCKETS}, None)
    assert counts == {"easy": 10, "medium": 10, "hard": 10}
    with pytest.raises(SelectionError, match="target_size = 31 .* at most 30"):
        resample_counts({"easy": 10, "medium": 10, "hard": 40}, {b: 1 / 3 for b in BUCKETS}, 31)
    with pytest.raises(SelectionError, match=r"wants \['easy'\]"):
        resample_counts({"easy": 0, "medium": 10, "hard": 40}, {"easy": 0.5, "medium": 0.5, "hard": 0.0}, None)


def test_matching_a_stronger_models_histogram():
    # Weak model: mostly hard. Strong model: mostly easy. After matching, the weak set has the
    # strong set's bucket shares (the paper's fix for Qwen2.5-7B).
    weak_counts = [1] * 40 + [2] * 20 + [4] * 12 + [6] * 6  # hard (<=2/8) 60, medium 12, easy 6
    _, weak = _pool(weak_counts)
    _, strong = _pool([7] * 30 + [4] * 20 + [1] * 10 + [0] * 5 + [8] * 5)  # easy 30, medium 20, hard 10
    cfg = _cfg()
    shares = target_shares_from_table(strong, cfg, "strong")
    assert shares == pytest.approx({"easy": 0.5, "medium": 1 / 3, "hard": 1 / 6})
    selection = select_problems(weak, cfg, seed=3, target_shares=shares)
    after = selection.stats["selected"]
    assert after == {"total": 12, "easy": 6, "medium": 4, "hard": 2}
    assert selection.stats["in_band"]["total"] - selection.stats["resampled_out"] == after["total"]
    assert {selection.buckets[i] for i in selection.ids} <= set(BUCKETS)
    rates = weak.set_index("id").loc[selection.ids, "pass_rate"]
    assert (rates > 0).all() and (rates < 1).all()


def test_target_size_and_config_histogram():
    _, table = _pool([1] * 30 + [4] * 30 + [7] * 30)
    cfg = _cfg(target_histogram={"easy": 1, "medium": 2, "hard": 1}, target_size=20)
    selection = select_problems(table, cfg, seed=0, target_shares=cfg.target_histogram)
    assert selection.stats["selected"] == {"total": 20, "easy": 5, "medium": 10, "hard": 5}
    assert selection.stats["selected_shares"] == pytest.approx({"easy": 0.25, "medium": 0.5, "hard": 0.25})


def test_selection_is_deterministic_and_depends_on_the_seed():
    _, table = _pool([1] * 50 + [4] * 50 + [7] * 50)
    cfg = _cfg(target_histogram={"easy": 1, "medium": 1, "hard": 1}, target_size=30)
    first = select_problems(table, cfg, seed=11, target_shares=cfg.target_histogram).ids
    again = select_problems(table, cfg, seed=11, target_shares=cfg.target_histogram).ids
    shuffled = table.sample(frac=1.0, random_state=5)
    reordered = select_problems(shuffled, cfg, seed=11, target_shares=cfg.target_histogram).ids
    other = select_problems(table, cfg, seed=12, target_shares=cfg.target_histogram).ids
    assert first == again
    assert sorted(first) == sorted(reordered)  # the draw does not depend on the table's row order
    assert sorted(first) != sorted(other)


def test_balance_sources_draws_every_family_down_to_the_smallest():
    # In band: 20 arith, 6 code, 9 choice (solved 4 of 8); out of band: 10 arith solved always.
    sources = ["embedded-arith"] * 30 + ["embedded-code"] * 6 + ["embedded-choice"] * 9
    _, table = _pool([4] * 20 + [8] * 10 + [4] * 15, sources)
    balanced = select_problems(table, _cfg(balance_sources=True), seed=2)
    per_source = {s: v["total"] for s, v in balanced.stats["per_data_source"]["selected"].items()}
    assert per_source == {"embedded-arith": 6, "embedded-choice": 6, "embedded-code": 6}
    assert balanced.stats["source_balanced_out"] == 35 - 18 and balanced.stats["resampled_out"] == 0
    assert all(table.set_index("id").loc[balanced.ids, "pass_rate"] == 0.5)  # only in-band problems
    again = select_problems(table.sample(frac=1.0, random_state=1), _cfg(balance_sources=True), seed=2)
    assert sorted(again.ids) == sorted(balanced.ids)  # seeded and by id, not by row order
    other = select_problems(table, _cfg(balance_sources=True), seed=3)
    assert sorted(other.ids) != sorted(balanced.ids)
    every = select_problems(table, _cfg(balance_sources=False), seed=2)
    assert len(every.ids) == 35 and every.stats["source_balanced_out"] == 0
    assert "balanced out (filter.balance_sources): 17." in filter_markdown(balanced.stats)  # the report's note
    assert "balanced out" not in filter_markdown(every.stats)


def test_balance_sources_after_the_histogram_draw():
    # 30 arith (10 per bucket), 12 code (4 per bucket): the histogram draw keeps both whole, then
    # code's 12 bound arith.
    sources = ["embedded-arith"] * 30 + ["embedded-code"] * 12
    _, table = _pool([1] * 10 + [4] * 10 + [7] * 10 + [1] * 4 + [4] * 4 + [7] * 4, sources)
    cfg = _cfg(balance_sources=True, target_histogram={"easy": 1, "medium": 1, "hard": 1})
    selection = select_problems(table, cfg, seed=0, target_shares=cfg.target_histogram)
    assert selection.stats["selected"]["total"] == 24
    assert {s: v["total"] for s, v in selection.stats["per_data_source"]["selected"].items()} == {
        "embedded-arith": 12,
        "embedded-code": 12,
    }


# --------------------------------------------------------------------------- the select command
def test_select_command_writes_the_rl_set_stats_and_histogram(tmp_path: Path):
    sources = ["embedded-arith"] * 18 + ["embedded-code"] * 9
    problems, table = _pool(list(range(K + 1)) * 3, sources)
    write_records(problems, tmp_path / "pool.parquet")
    write_pass_rates(table, tmp_path / "pass_rates.parquet")
    cfg = load_config({"seed": 4})
    out, stats_path, png = tmp_path / "f/rl_train.parquet", tmp_path / "f/stats.json", tmp_path / "f/hist.png"
    args = [
        "select",
        "--config-json",
        json.dumps({"seed": 4}),
        "--pass-rates",
        str(tmp_path / "pass_rates.parquet"),
        "--pool",
        str(tmp_path / "pool.parquet"),
        "--out",
        str(out),
        "--stats",
        str(stats_path),
        "--histogram",
        str(png),
    ]
    assert filter_cli.main(args) == 0
    chosen = read_problems(out)
    stats = json.loads(stats_path.read_text())
    assert [p.id for p in chosen] == select_problems(table, cfg.filter, 4).ids
    assert all(0 < p.extra["filter_pass_rate"] < 1 for p in chosen)
    assert {p.extra["filter_bucket"] for p in chosen} == {"easy", "medium", "hard"}
    assert chosen[0].prompt == problems[1].prompt and chosen[0].extra["family"] == "arith"  # the pool row, kept whole
    assert stats["selected"]["total"] == len(chosen) == 21
    assert sum(stats["selected"][b] for b in BUCKETS) == stats["selected"]["total"]
    per_source = stats["per_data_source"]["selected"]
    assert sum(s["total"] for s in per_source.values()) == len(chosen)
    assert per_source["embedded-code"]["total"] == sum(p.data_source == "embedded-code" for p in chosen)
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_select_command_matches_a_target_pass_rate_file(tmp_path: Path):
    problems, weak = _pool([1] * 30 + [4] * 10 + [7] * 10)
    _, strong = _pool([1] * 10 + [4] * 10 + [7] * 20)
    write_records(problems, tmp_path / "pool.parquet")
    write_pass_rates(weak, tmp_path / "weak.parquet")
    write_pass_rates(strong, tmp_path / "strong.parquet")
    cfg = {"filter": {"target_pass_rates": str(tmp_path / "strong.parquet")}}
    stats = filter_cli.select(
        load_config(cfg),
        tmp_path / "weak.parquet",
        tmp_path / "pool.parquet",
        tmp_path / "rl.parquet",
        tmp_path / "stats.json",
        tmp_path / "hist.png",
    )
    assert stats["target_source"] == str(tmp_path / "strong.parquet")
    assert stats["selected"] == {"total": 20, "easy": 10, "medium": 5, "hard": 5}


def test_select_refuses_scores_of_another_pool(tmp_path: Path):
    problems, table = _pool([1, 2, 3])
    write_records(problems[:2], tmp_path / "pool.parquet")
    write_pass_rates(table, tmp_path / "pr.parquet")
    with pytest.raises(ValueError, match=r"not in .*pool.parquet: \['p002'\]"):
        filter_cli.select(
            load_config({}),
            tmp_path / "pr.parquet",
            tmp_path / "pool.parquet",
            tmp_path / "rl.parquet",
            tmp_path / "s.json",
            tmp_path / "h.png",
        )


def test_cfg_helper_matches_schema_defaults():
    cfg = _cfg()
    assert dataclasses.asdict(cfg) == {
        "k": 4,
        "temperature": 1.0,
        "top_p": 1.0,
        "low": 0.0,
        "high": 1.0,
        "easy_min": 0.75,
        "hard_max": 0.25,
        "target_histogram": None,
        "target_pass_rates": None,
        "target_size": None,
        "balance_sources": False,
        "shards": 1,
        "selection": "band",
    }
