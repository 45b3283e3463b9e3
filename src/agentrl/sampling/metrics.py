"""Benchmark metrics: avg@n, pass@k, maj@k, confidence intervals, tool-use analysis.

The recipe (docs/recipe.md section 7) reports, per benchmark, with n = 32 samples per problem:

- ``avg@n``: mean accuracy over the n samples, averaged over problems;
- ``pass@n`` and ``maj@n`` *as upstream computes them*: verl's ``process_validation_metrics``
  bootstraps each problem's samples (:func:`bootstrap_best_and_maj`); the headline pass@32 is
  its ``best@32/mean`` of ``acc``, slightly below the plain "any of 32 correct";
- the reasoning-mode analysis: tool calls per response, response length per turn, tool-call
  success rate, deliberative vs reactive responses (:func:`reasoning_mode`).

Next to the upstream numbers this module gives the standard estimators: the unbiased pass@k of
Chen et al. 2021 (:func:`pass_at_k_unbiased`), a plain maj@k over the first k samples
(:func:`maj_at_k`, None never wins) and percentile-bootstrap confidence intervals over problems
(:func:`bootstrap_ci`). All values are fractions in [0, 1]; the report turns them into percent.

Departures from upstream, with reasons:

- verl's bootstrap counts a missing prediction as one more answer in the vote, the same answer
  as an empty ``\\boxed{}`` (upstream's ``compute_score`` turns a ``pred`` None into ``""``);
  :func:`bootstrap_best_and_maj` keeps that for parity, :func:`maj_at_k` does not (an
  unparsable answer is not a consensus).
- verl accepts problems with different sample counts; :func:`summarize_benchmark` refuses them,
  because "@n" would then mean different things for different problems (a crashed shard).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.errors import DataFormatError

# Reasoning-mode thresholds (see reasoning_mode). The paper gives no numbers, only the shape:
# deliberative = fewer, planned calls with longer thinking per call; reactive = short thinking,
# many calls (docs/recipe.md section 7). With 16 turns = 2k + 2, a response has at most k = 7 tool
# calls; "fewer" is read as at most 3 (under half of that budget). A planned call states what
# it computes and why - a paragraph, a few hundred tokens - while a reactive call follows a
# sentence or two ("Let me compute this."), tens of tokens; 200 tokens separates the two.
DELIBERATIVE_MAX_CALLS = 3
DELIBERATIVE_MIN_TOKENS_PER_CALL = 200


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class SampleRecord:
    """One evaluated response: correctness, extracted answer and tool-use counts.

    ``tokens_before_calls[j]`` is the number of model-text tokens between the previous tool
    response (or the prompt) and tool call j, the call's own code excluded: the thinking the
    model did before that call. ``tool_errors[j]`` is True when call j failed.
    """

    problem_id: str
    sample_index: int
    acc: bool
    pred: Hashable | None
    tool_calls: int
    tool_errors: tuple[bool, ...]
    num_turns: int
    response_tokens: int
    tokens_before_calls: tuple[int, ...]

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any], where: str = "sample") -> SampleRecord:
        """Validate a samples.jsonl row; errors name ``where`` (e.g. ``file.jsonl row 7``) and the key."""
        missing = [f for f in cls.__dataclass_fields__ if f not in row]
        if missing:
            raise DataFormatError(f"{where}: missing key(s) {missing}")

        def integer(key: str, minimum: int = 0) -> int:
            value = row[key]
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
                raise DataFormatError(f"{where}: {key!r} must be an integer >= {minimum}, got {value!r}")
            return int(value)

        acc = row["acc"]
        if acc not in (0, 1):  # True/False/0/1/0.0/1.0 pass; None, 0.5, "1" fail
            raise DataFormatError(f"{where}: 'acc' must be 0/1 or a bool, got {acc!r}")
        pred = row["pred"]
        if pred is not None and not isinstance(pred, Hashable):
            raise DataFormatError(f"{where}: 'pred' must be a string (or None), got {type(pred).__name__}")
        errors, before = row["tool_errors"], row["tokens_before_calls"]
        if not isinstance(errors, (list, tuple)) or not all(isinstance(e, (bool, np.bool_)) for e in errors):
            raise DataFormatError(f"{where}: 'tool_errors' must be a list of bools, got {errors!r}")
        if not isinstance(before, (list, tuple)) or not all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0 for t in before
        ):
            raise DataFormatError(f"{where}: 'tokens_before_calls' must be a list of integers >= 0, got {before!r}")
        calls = integer("tool_calls")
        if not len(errors) == len(before) == calls:
            raise DataFormatError(
                f"{where}: tool_calls={calls} but {len(errors)} tool_errors and {len(before)} tokens_before_calls"
            )
        return cls(
            problem_id=str(row["problem_id"]),
            sample_index=integer("sample_index"),
            acc=bool(acc),
            pred=pred,
            tool_calls=calls,
            tool_errors=tuple(bool(e) for e in errors),
            num_turns=integer("num_turns", minimum=1),
            response_tokens=integer("response_tokens"),
            tokens_before_calls=tuple(int(t) for t in before),
        )


# --------------------------------------------------------------------------- accuracy metrics
def default_ks(n: int) -> list[int]:
    """Powers of two below n, then n itself: 32 -> [1, 2, 4, 8, 16, 32]; 6 -> [1, 2, 4, 6]."""
    assert n >= 1, f"need at least one sample per problem, got n={n}"
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def _as_matrix(correct: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    matrix = np.asarray(correct, dtype=float)
    assert matrix.ndim == 2 and matrix.size > 0, f"correct must be (problems, samples), got shape {matrix.shape}"
    return matrix


def avg_at_k(correct: Sequence[Sequence[float]] | np.ndarray, k: int | None = None) -> float:
    """``(1/P) sum_p (1/k) sum_{j<k} acc_{p,j}``: mean accuracy of the first k samples (all when
    None), averaged over problems. ``correct`` is (P, n)."""
    matrix = _as_matrix(correct)
    k = matrix.shape[1] if k is None else k
    assert 1 <= k <= matrix.shape[1], f"k={k} outside 1..{matrix.shape[1]}"
    return float(matrix[:, :k].mean(axis=1).mean())


def pass_at_k_unbiased(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct among n samples (Chen et al. 2021):

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

    the product form avoids the huge binomials. It is the probability that a draw of k of the
    n samples *without* replacement holds a correct one; 1 when n - c < k.
    """
    assert 0 <= c <= n and 1 <= k <= n, f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}"
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k(correct: Sequence[Sequence[float]] | np.ndarray, ks: Iterable[int] | None = None) -> dict[int, float]:
    """Benchmark pass@k (unbiased, averaged over problems) for each k (default :func:`default_ks`)."""
    matrix = _as_matrix(correct)
    n = matrix.shape[1]
    counts = (matrix > 0.5).sum(axis=1)
    return {k: float(np.mean([pass_at_k_unbiased(n, int(c), k) for c in counts])) for k in (ks or default_ks(n))}


def majority_vote(preds: Sequence[Hashable | None], correct: Sequence[float]) -> float:
    """Correctness of the majority answer of one problem's samples.

    The answer predicted most often wins; a tie goes to the answer that occurred first; None
    (no answer extracted) never takes part, so it never wins over a real answer. The result is
    the correctness of the first sample giving the winning answer; 0 when no sample has one.
    """
    assert len(preds) == len(correct), f"{len(preds)} preds for {len(correct)} correctness values"
    votes: dict[Hashable, list[int]] = {}  # answer -> [count, first position]; dicts keep order
    for position, pred in enumerate(preds):
        if pred is not None:
            votes.setdefault(pred, [0, position])[0] += 1
    if not votes:
        return 0.0
    best_count = max(count for count, _ in votes.values())
    first_position = next(first for count, first in votes.values() if count == best_count)
    return float(correct[first_position])


def maj_at_k(
    preds: Sequence[Sequence[Hashable | None]],
    correct: Sequence[Sequence[float]] | np.ndarray,
    k: int | None = None,
) -> float:
    """Benchmark maj@k: :func:`majority_vote` over each problem's first k samples, averaged."""
    matrix = _as_matrix(correct)
    k = matrix.shape[1] if k is None else k
    assert 1 <= k <= matrix.shape[1], f"k={k} outside 1..{matrix.shape[1]}"
    return float(np.mean([majority_vote(list(p)[:k], row[:k]) for p, row in zip(preds, matrix, strict=True)]))


# --------------------------------------------------------------------------- upstream bootstrap
def bootstrap_best_and_maj(
    correct: Sequence[float],
    preds: Sequence[Hashable | None] | None,
    k: int,
    *,
    n_boot: int = 1000,
    seed: int = 42,
) -> tuple[float, float | None]:
    """One problem's best@k and maj@k as verl's ``process_validation_metrics`` computes them.

    What verl does (``bootstrap_metric`` and ``calc_maj_val`` in
    ``verl/trainer/ppo/metric_utils.py``), reproduced draw for draw:

    1. re-seed numpy's legacy global RNG with ``seed`` (42) - for *every* problem and every k,
       so all problems share one index sequence;
    2. ``n_boot`` (1000) times, draw k indices out of the n samples *with replacement*
       (``np.random.choice(n, size=k, replace=True)``);
    3. best = max of ``acc`` over the draw; maj = majority vote over ``pred`` in the draw,
       ties to the answer seen first in the draw, None counted as the answer ``""`` (so a missing
       box and an empty ``\\boxed{}`` are one vote, as upstream's ``compute_score`` makes them), scored
       by the ``acc`` of the first drawn sample with that answer;
    4. report the mean over the draws (verl also reports the std).

    The maj@k draw is re-seeded too, so it uses the same indices as best@k; here the indices
    are drawn once from a private ``RandomState(seed)``, the same stream without touching the
    global RNG.

    Difference from the unbiased estimator: a draw with replacement repeats samples, so for 0/1
    accuracy with c correct of n, best@k estimates ``1 - (1 - c/n)^k``, whereas
    :func:`pass_at_k_unbiased` (draws without replacement) is ``1 - C(n-c, k) / C(n, k)``, never
    lower. At k = n the unbiased value is "any of the n correct"; the bootstrap gives a
    problem with 1 correct of 32 about ``1 - (31/32)^32 = 0.64``, not 1. The bootstrap also
    carries Monte-Carlo noise, at most about 0.016 per problem at 1000 draws.
    Returns ``(best, maj)``; maj is None when ``preds`` is None.
    """
    values = np.asarray(correct, dtype=float)
    n = values.shape[0]
    assert n >= 1 and k >= 1, f"need n >= 1 samples and k >= 1, got n={n}, k={k}"
    draws = np.random.RandomState(seed).choice(n, size=(n_boot, k), replace=True)  # (R, k)
    best = float(values[draws].max(axis=1).mean())
    if preds is None:
        return best, None
    assert len(preds) == n, f"{len(preds)} preds for {n} samples"
    code_of: dict[Hashable | None, int] = {}
    codes = np.array([code_of.setdefault("" if p is None else p, len(code_of)) for p in preds])
    drawn_codes = codes[draws]  # (R, k)
    rows = np.broadcast_to(np.arange(n_boot)[:, None], draws.shape)
    positions = np.broadcast_to(np.arange(k)[None, :], draws.shape)
    counts = np.zeros((n_boot, len(code_of)), dtype=int)
    np.add.at(counts, (rows, drawn_codes), 1)
    first_seen = np.full((n_boot, len(code_of)), k)
    np.minimum.at(first_seen, (rows, drawn_codes), positions)
    # Winner: most votes, then earliest first occurrence (Python's max over an insertion-ordered dict).
    tie_break = np.where(counts == counts.max(axis=1, keepdims=True), first_seen, k + 1)
    winner_position = first_seen[np.arange(n_boot), tie_break.argmin(axis=1)]  # (R,)
    maj = float(values[draws[np.arange(n_boot), winner_position]].mean())
    return best, maj


def bootstrap_ks(n: int) -> list[int]:
    """verl's subset sizes: 2, 4, 8, ... below n, then n (none for n = 1)."""
    return [] if n < 2 else default_ks(n)[1:]


# --------------------------------------------------------------------------- intervals
def bootstrap_ci(
    per_problem_values: Sequence[float] | np.ndarray,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the benchmark mean: resample the P problems with
    replacement ``n_boot`` times and take the alpha/2 and 1 - alpha/2 quantiles of the means.
    It reflects which problems the benchmark happens to hold, not the sampling noise of the
    responses (use n samples per problem for that)."""
    values = np.asarray(per_problem_values, dtype=float)
    assert values.ndim == 1 and values.size > 0, f"need a non-empty 1-D array of values, got shape {values.shape}"
    assert 0 < alpha < 1, f"alpha must be in (0, 1), got {alpha}"
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


# --------------------------------------------------------------------------- tool use
def reasoning_mode(
    record: SampleRecord,
    *,
    max_calls: int = DELIBERATIVE_MAX_CALLS,
    min_tokens_per_call: int = DELIBERATIVE_MIN_TOKENS_PER_CALL,
) -> str:
    """Label a response ``no_tool``, ``deliberative`` or ``reactive``.

    - ``no_tool``: it made no tool call (pure text reasoning; neither mode applies);
    - ``deliberative``: at most ``max_calls`` calls (3) *and* a mean of at least
      ``min_tokens_per_call`` (200) model-text tokens before each call - few, planned calls;
    - ``reactive``: every other response with calls - many calls, or short thinking per call.
    The defaults are justified beside the constants at the top of this module.
    """
    if record.tool_calls == 0:
        return "no_tool"
    mean_tokens = sum(record.tokens_before_calls) / record.tool_calls
    if record.tool_calls <= max_calls and mean_tokens >= min_tokens_per_call:
        return "deliberative"
    return "reactive"


MODES = ("deliberative", "reactive", "no_tool")


def _success_rate(records: Sequence[SampleRecord]) -> float | None:
    calls = sum(r.tool_calls for r in records)
    return None if calls == 0 else (calls - sum(sum(r.tool_errors) for r in records)) / calls


def tool_use_stats(
    records: Sequence[SampleRecord],
    *,
    max_calls: int = DELIBERATIVE_MAX_CALLS,
    min_tokens_per_call: int = DELIBERATIVE_MIN_TOKENS_PER_CALL,
) -> dict[str, Any]:
    """Reasoning-mode statistics over responses (means over responses unless said otherwise).

    ``tool_success_rate`` is pooled over calls (successful calls / all calls, None without
    calls), as the paper's "share of calls that executed without error";
    ``tokens_before_call`` is pooled over calls too; ``tokens_per_assistant_turn`` divides a
    response's tokens by its assistant turns, ``tool_calls + 1`` (each call ends a turn, the
    answer is one more) - independent of how ``num_turns`` counts messages. ``modes`` holds,
    per :func:`reasoning_mode` label, the share of responses, their accuracy and tool success.
    """
    assert records, "no samples to analyse"
    labels = [reasoning_mode(r, max_calls=max_calls, min_tokens_per_call=min_tokens_per_call) for r in records]
    total_calls = sum(r.tool_calls for r in records)
    modes = {}
    for mode in MODES:
        members = [r for r, label in zip(records, labels) if label == mode]
        modes[mode] = {
            "share": len(members) / len(records),
            "count": len(members),
            "accuracy": float(np.mean([r.acc for r in members])) if members else None,
            "tool_success_rate": _success_rate(members),
        }
    return {
        "responses": len(records),
        "tool_calls_per_response": float(np.mean([r.tool_calls for r in records])),
        "tool_success_rate": _success_rate(records),
        "turns_per_response": float(np.mean([r.num_turns for r in records])),
        "response_tokens": float(np.mean([r.response_tokens for r in records])),
        "tokens_per_assistant_turn": float(np.mean([r.response_tokens / (r.tool_calls + 1) for r in records])),
        "tokens_before_call": sum(sum(r.tokens_before_calls) for r in records) / total_calls if total_calls else None,
        "modes": modes,
        "thresholds": {"max_calls": max_calls, "min_tokens_per_call": min_tokens_per_call},
    }


# --------------------------------------------------------------------------- assembly
def group_by_problem(
    samples: Sequence[SampleRecord | Mapping[str, Any]], source: str = "samples"
) -> dict[str, list[SampleRecord]]:
    """Validate rows, group them by problem (first-seen order), order by ``sample_index``; every
    problem must hold the same number of samples with distinct indices."""
    if not samples:
        raise DataFormatError(f"{source}: no samples (an empty file)")
    by_problem: dict[str, list[SampleRecord]] = {}
    for row_number, sample in enumerate(samples):
        if isinstance(sample, SampleRecord):
            record = sample
        else:
            record = SampleRecord.from_mapping(sample, f"{source} row {row_number}")
        by_problem.setdefault(record.problem_id, []).append(record)
    for problem_id, records in by_problem.items():
        records.sort(key=lambda r: r.sample_index)
        indices = [r.sample_index for r in records]
        if len(set(indices)) != len(indices):
            raise DataFormatError(f"{source}: problem {problem_id!r} repeats a sample_index: {indices}")
    sizes = {pid: len(rs) for pid, rs in by_problem.items()}
    if len(set(sizes.values())) > 1:
        n = max(sizes.values())
        short = {pid: size for pid, size in sizes.items() if size != n}
        raise DataFormatError(f"{source}: problems hold different sample counts; expected {n}, got {short}")
    return by_problem


def summarize_benchmark(
    samples: Sequence[SampleRecord | Mapping[str, Any]],
    *,
    ks: Sequence[int] | None = None,
    n_boot: int = 1000,
    bootstrap_seed: int = 42,
    ci_alpha: float = 0.05,
    ci_seed: int = 0,
    max_calls: int = DELIBERATIVE_MAX_CALLS,
    min_tokens_per_call: int = DELIBERATIVE_MIN_TOKENS_PER_CALL,
    source: str = "samples",
) -> dict[str, Any]:
    """The metrics.json dict of one benchmark (JSON-ready: str keys, Python numbers).

    Keys: ``num_problems``, ``samples_per_problem`` (n), ``num_samples``; ``avg@n``;
    ``pass@k`` (unbiased, per k); ``maj@k`` (first k samples, per k; absent when no sample has a
    pred); ``upstream_bootstrap`` (verl parity: ``best@k`` and ``maj@k`` per verl subset size -
    the paper's pass@32 is ``best@32``); ``ci`` (level and [low, high] of avg@n, pass@n and
    maj@n over problems); ``tool_use`` (:func:`tool_use_stats`).
    """
    by_problem = group_by_problem(samples, source)
    problems = list(by_problem.values())
    n = len(problems[0])
    correct = np.array([[float(r.acc) for r in rs] for rs in problems])  # (P, n)
    preds = [[r.pred for r in rs] for rs in problems]
    has_preds = any(p is not None for row in preds for p in row)
    ks = list(ks) if ks is not None else default_ks(n)
    assert all(1 <= k <= n for k in ks), f"every k must be in 1..{n}, got {ks}"

    upstream: dict[str, float] = {}
    for k in bootstrap_ks(n):
        per_problem = [
            bootstrap_best_and_maj(row, p if has_preds else None, k, n_boot=n_boot, seed=bootstrap_seed)
            for row, p in zip(correct, preds)
        ]
        upstream[f"best@{k}"] = float(np.mean([best for best, _ in per_problem]))
        if has_preds:
            upstream[f"maj@{k}"] = float(np.mean([maj for _, maj in per_problem]))

    ci_values = {f"avg@{n}": correct.mean(axis=1), f"pass@{n}": correct.max(axis=1)}
    if has_preds:
        ci_values[f"maj@{n}"] = np.array([majority_vote(p, row) for p, row in zip(preds, correct)])
    summary: dict[str, Any] = {
        "num_problems": len(problems),
        "samples_per_problem": n,
        "num_samples": len(problems) * n,
        f"avg@{n}": avg_at_k(correct),
        "pass@k": {str(k): v for k, v in pass_at_k(correct, ks).items()},
    }
    if has_preds:
        summary["maj@k"] = {str(k): maj_at_k(preds, correct, k) for k in ks}
    summary["upstream_bootstrap"] = upstream
    summary["ci"] = {
        "level": 1 - ci_alpha,
        **{name: list(bootstrap_ci(values, n_boot, ci_alpha, ci_seed)) for name, values in ci_values.items()},
    }
    records = [r for rs in problems for r in rs]
    summary["tool_use"] = tool_use_stats(records, max_calls=max_calls, min_tokens_per_call=min_tokens_per_call)
    return summary
