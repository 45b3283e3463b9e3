"""Benchmark metrics against hand-computed values (docs/recipe.md section 7)."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from helpers.upstream_metrics import verl_style_bootstrap

from agentrl.sampling.metrics import (
    SampleRecord,
    avg_at_k,
    bootstrap_best_and_maj,
    bootstrap_ci,
    bootstrap_ks,
    default_ks,
    maj_at_k,
    majority_vote,
    pass_at_k,
    pass_at_k_unbiased,
    reasoning_mode,
    summarize_benchmark,
    tool_use_stats,
)


def _record(acc=1, pred="1", calls=0, errors=(), before=(), turns=2, tokens=100, problem="p", index=0):
    return SampleRecord(problem, index, bool(acc), pred, calls, tuple(errors), turns, tokens, tuple(before))


def _row(problem, index, acc, pred, calls=1, errors=(False,), before=(250,), turns=4, tokens=500):
    return {
        "problem_id": problem,
        "sample_index": index,
        "acc": acc,
        "pred": pred,
        "tool_calls": calls,
        "tool_errors": list(errors),
        "tokens_before_calls": list(before),
        "num_turns": turns,
        "response_tokens": tokens,
    }


# --------------------------------------------------------------------------- k grids
def test_k_grids():
    assert default_ks(32) == [1, 2, 4, 8, 16, 32]
    assert default_ks(6) == [1, 2, 4, 6]
    assert default_ks(1) == [1]
    assert bootstrap_ks(32) == [2, 4, 8, 16, 32]  # verl's subset sizes
    assert bootstrap_ks(1) == []


# --------------------------------------------------------------------------- avg, pass, maj
def test_avg_at_k_by_hand():
    correct = [[1, 0, 1, 1], [0, 0, 0, 1]]
    assert avg_at_k(correct) == pytest.approx((0.75 + 0.25) / 2)
    assert avg_at_k(correct, k=2) == pytest.approx((0.5 + 0.0) / 2)


def test_pass_at_k_unbiased_by_hand():
    assert pass_at_k_unbiased(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k_unbiased(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k_unbiased(10, 3, 1) == pytest.approx(0.3)  # k = 1 is the accuracy c/n
    assert pass_at_k_unbiased(32, 1, 32) == 1.0  # k = n: any correct
    assert pass_at_k_unbiased(32, 0, 32) == 0.0
    assert pass_at_k_unbiased(32, 0, 1) == 0.0  # c = 0
    assert pass_at_k_unbiased(32, 32, 1) == 1.0  # c = n
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k_unbiased(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)
    with pytest.raises(AssertionError, match="k=5"):
        pass_at_k_unbiased(4, 1, 5)


def test_pass_at_k_per_benchmark_by_hand():
    correct = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
    result = pass_at_k(correct)
    assert list(result) == [1, 2, 4]
    assert result[1] == pytest.approx((0.25 + 0.5 + 0) / 3)
    assert result[2] == pytest.approx((0.5 + (1 - 1 / 6) + 0) / 3)
    assert result[4] == pytest.approx(2 / 3)


def test_majority_vote_ties_go_to_the_first_answer():
    assert majority_vote(["7", "5", "5", "7"], [1, 0, 0, 1]) == 1.0
    assert majority_vote(["5", "7", "7", "5"], [0, 1, 1, 0]) == 0.0
    assert majority_vote(["5", "7", "7", "9"], [0, 1, 1, 0]) == 1.0  # a real majority beats order


def test_majority_vote_none_never_wins():
    assert majority_vote([None, None, None, "3"], [0, 0, 0, 1]) == 1.0
    assert majority_vote([None, None], [0, 0]) == 0.0


def test_maj_at_k_uses_the_first_k_samples():
    preds = [["a", "b", "b", "a", "a"], ["x", "y", "x", "y", "y"]]
    correct = [[1, 0, 0, 1, 1], [0, 1, 0, 1, 1]]
    assert maj_at_k(preds, correct, k=1) == pytest.approx((1 + 0) / 2)
    assert maj_at_k(preds, correct, k=3) == pytest.approx((0 + 0) / 2)  # b wins 2-1; x wins 2-1
    assert maj_at_k(preds, correct, k=4) == pytest.approx((1 + 0) / 2)  # ties: a first, x first
    assert maj_at_k(preds, correct) == pytest.approx((1 + 1) / 2)  # a 3-2, y 3-2


# --------------------------------------------------------------------------- upstream bootstrap
def test_bootstrap_matches_the_upstream_draws_exactly():
    correct = [1, 0, 0, 1, 0, 0, 0, 1]
    preds = ["4", "5", None, "4", "5", "5", None, "4"]
    for k in (2, 4, 8):
        ours = bootstrap_best_and_maj(correct, preds, k, n_boot=300, seed=42)
        assert ours == verl_style_bootstrap(correct, preds, k, 300, 42), k


def test_bootstrap_is_deterministic_and_leaves_the_global_rng_alone():
    correct, preds = [1, 0, 0, 0, 1, 0], ["2", "3", "3", None, "2", "7"]
    state = np.random.get_state()
    first = bootstrap_best_and_maj(correct, preds, 4)
    assert bootstrap_best_and_maj(correct, preds, 4) == first
    after = np.random.get_state()
    assert state[0] == after[0] and np.array_equal(state[1], after[1]) and state[2:] == after[2:]
    assert bootstrap_best_and_maj(correct, preds, 4, seed=7) != first


def test_bootstrap_values_by_hand_and_bounded_by_any_correct():
    assert bootstrap_best_and_maj([1, 1, 1], ["a", "a", "a"], 3) == (1.0, 1.0)
    assert bootstrap_best_and_maj([0, 0, 0], ["a", "b", "c"], 3) == (0.0, 0.0)
    assert bootstrap_best_and_maj([1, 0], None, 2)[1] is None
    # 1 correct of 32: E[best@32] = 1 - (31/32)^32 = 0.638, below "any correct" = 1
    one_of_32 = [1] + [0] * 31
    best, _ = bootstrap_best_and_maj(one_of_32, None, 32)
    assert best == pytest.approx(1 - (31 / 32) ** 32, abs=0.05)
    assert best < pass_at_k_unbiased(32, 1, 32) == 1.0
    # every pred distinct: each draw's vote goes to its first drawn sample, E[maj] = c / n
    _, maj = bootstrap_best_and_maj([1, 0, 0, 0], ["a", "b", "c", "d"], 4)
    assert maj == pytest.approx(0.25, abs=0.05)
    # benchmark level: never above the plain any-correct rate
    rng = random.Random(3)
    problems = [[int(rng.random() < p) for _ in range(8)] for p in (0.05, 0.2, 0.5, 0.0, 0.9)]
    bests = [bootstrap_best_and_maj(row, None, 8)[0] for row in problems]
    for best, row in zip(bests, problems):
        assert best <= max(row)
    assert np.mean(bests) <= np.mean([max(row) for row in problems])


def test_bootstrap_counts_none_as_a_vote_unlike_maj_at_k():
    correct, preds = [0, 0, 0, 1], [None, None, None, "4"]
    _, upstream_maj = bootstrap_best_and_maj(correct, preds, 4)
    assert upstream_maj < 0.5  # None usually outvotes "4" in verl's vote
    assert maj_at_k([preds], [correct]) == 1.0


# --------------------------------------------------------------------------- intervals
def test_bootstrap_ci_contains_the_mean_and_is_deterministic():
    values = np.random.default_rng(5).random(40) < 0.4
    low, high = bootstrap_ci(values)
    assert low < values.mean() < high
    assert bootstrap_ci(values) == (low, high)
    wide_low, wide_high = bootstrap_ci(values, alpha=0.01)
    assert wide_low <= low and wide_high >= high
    assert high - low < 0.4  # 40 problems: about 4 standard errors of 0.077
    assert bootstrap_ci([0.25, 0.25, 0.25]) == (0.25, 0.25)


# --------------------------------------------------------------------------- tool use
def test_reasoning_mode_labels():
    assert reasoning_mode(_record(calls=0)) == "no_tool"
    assert reasoning_mode(_record(calls=2, errors=(0, 0), before=(300, 250))) == "deliberative"
    assert reasoning_mode(_record(calls=3, errors=(0, 0, 0), before=(200, 100, 300))) == "deliberative"  # mean 200
    assert reasoning_mode(_record(calls=2, errors=(0, 0), before=(20, 30))) == "reactive"  # short thinking
    assert reasoning_mode(_record(calls=4, errors=(0,) * 4, before=(900,) * 4)) == "reactive"  # many calls
    assert reasoning_mode(_record(calls=4, errors=(0,) * 4, before=(900,) * 4), max_calls=4) == "deliberative"
    assert reasoning_mode(_record(calls=1, errors=(0,), before=(50,)), min_tokens_per_call=40) == "deliberative"


def test_tool_use_stats_by_hand():
    deliberative = _record(acc=1, calls=2, errors=(False, True), before=(300, 100), turns=6, tokens=900)
    reactive = _record(acc=0, calls=5, errors=(True, True, False, False, False), before=(10,) * 5, turns=12, tokens=600)
    no_tool = _record(acc=1, calls=0, turns=2, tokens=300)
    stats = tool_use_stats([deliberative, reactive, no_tool])
    assert stats["responses"] == 3
    assert stats["tool_calls_per_response"] == pytest.approx(7 / 3)
    assert stats["tool_success_rate"] == pytest.approx(4 / 7)  # 3 of 7 calls failed
    assert stats["turns_per_response"] == pytest.approx(20 / 3)
    assert stats["response_tokens"] == pytest.approx(600)
    assert stats["tokens_per_assistant_turn"] == pytest.approx((900 / 3 + 600 / 6 + 300 / 1) / 3)
    assert stats["tokens_before_call"] == pytest.approx(450 / 7)
    modes = stats["modes"]
    assert modes["deliberative"] == {"share": 1 / 3, "count": 1, "accuracy": 1.0, "tool_success_rate": 0.5}
    assert modes["reactive"] == {"share": 1 / 3, "count": 1, "accuracy": 0.0, "tool_success_rate": 0.6}
    assert modes["no_tool"] == {"share": 1 / 3, "count": 1, "accuracy": 1.0, "tool_success_rate": None}


# --------------------------------------------------------------------------- records and summary
def test_sample_record_validation_names_the_row_and_key():
    good = _row("p", 0, True, "3")
    assert SampleRecord.from_mapping(good).tool_calls == 1
    with pytest.raises(ValueError, match=r"x.jsonl row 4: missing key\(s\) \['acc'\]"):
        SampleRecord.from_mapping({k: v for k, v in good.items() if k != "acc"}, "x.jsonl row 4")
    with pytest.raises(ValueError, match="'acc' must be 0/1"):
        SampleRecord.from_mapping({**good, "acc": 0.5})
    with pytest.raises(ValueError, match="tool_calls=2 but 1 tool_errors"):
        SampleRecord.from_mapping({**good, "tool_calls": 2})
    with pytest.raises(ValueError, match="'num_turns' must be an integer >= 1"):
        SampleRecord.from_mapping({**good, "num_turns": 0})
    with pytest.raises(ValueError, match="'pred' must be a string"):
        SampleRecord.from_mapping({**good, "pred": ["3"]})


def _benchmark_rows():
    # problem a: acc [1, 0, 1, 1], preds [4, 5, 4, 4]; problem b: acc [0, 0, 0, 1], preds [2, 2, None, 9]
    rows = [_row("a", i, acc, pred) for i, (acc, pred) in enumerate(zip([1, 0, 1, 1], ["4", "5", "4", "4"]))]
    rows += [
        _row("b", i, acc, pred, calls=5, errors=(True,) * 5, before=(10,) * 5, turns=12, tokens=1200)
        for i, (acc, pred) in enumerate(zip([0, 0, 0, 1], ["2", "2", None, "9"]))
    ]
    return rows


def test_summarize_benchmark_by_hand():
    rows = _benchmark_rows()
    summary = summarize_benchmark(rows)
    assert summary["num_problems"] == 2 and summary["samples_per_problem"] == 4 and summary["num_samples"] == 8
    assert summary["avg@4"] == pytest.approx((0.75 + 0.25) / 2)
    assert summary["pass@k"]["1"] == pytest.approx(0.5)
    assert summary["pass@k"]["2"] == pytest.approx((1.0 + 0.5) / 2)  # a: c=3 -> 1; b: 1 - C(3,2)/C(4,2)
    assert summary["pass@k"]["4"] == pytest.approx(1.0)
    assert summary["maj@k"]["4"] == pytest.approx((1 + 0) / 2)  # a: "4" 3 votes; b: "2" 2 votes
    assert summary["maj@k"]["1"] == pytest.approx((1 + 0) / 2)
    upstream = summary["upstream_bootstrap"]
    assert set(upstream) == {"best@2", "maj@2", "best@4", "maj@4"}
    assert upstream["best@4"] <= summary["pass@k"]["4"]
    ci = summary["ci"]
    assert ci["level"] == pytest.approx(0.95)
    assert ci["avg@4"][0] <= summary["avg@4"] <= ci["avg@4"][1]
    assert set(ci) == {"level", "avg@4", "pass@4", "maj@4"}
    tool = summary["tool_use"]
    assert tool["modes"]["deliberative"]["count"] == 4 and tool["modes"]["reactive"]["count"] == 4
    assert tool["tool_success_rate"] == pytest.approx(4 / 24)
    json.dumps(summary)  # metrics.json must serialise without numpy types

    shuffled = rows[::-1]
    assert summarize_benchmark(shuffled) == summary  # order comes from sample_index, not the file


def test_summarize_benchmark_without_preds_omits_majority_metrics():
    rows = [{**row, "pred": None} for row in _benchmark_rows()]
    summary = summarize_benchmark(rows)
    assert "maj@k" not in summary and set(summary["upstream_bootstrap"]) == {"best@2", "best@4"}


def test_summarize_benchmark_rejects_uneven_or_repeated_samples():
    rows = _benchmark_rows()
    uneven = r"eval.jsonl: problems hold different sample counts; expected 4, got \{'b': 3\}"
    with pytest.raises(ValueError, match=uneven):
        summarize_benchmark(rows[:-1], source="eval.jsonl")
    with pytest.raises(ValueError, match="problem 'a' repeats a sample_index"):
        summarize_benchmark([*rows[:3], {**rows[3], "sample_index": 0}, *rows[4:]])
    with pytest.raises(ValueError, match="eval.jsonl row 2: 'acc'"):
        summarize_benchmark([*rows[:2], {**rows[2], "acc": None}, *rows[3:]], source="eval.jsonl")
