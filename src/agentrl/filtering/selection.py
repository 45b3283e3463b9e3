"""Selecting the RL training set from the SFT model's pass rates (paper section 3.3).

Recipe (docs/recipe.md section 6): the SFT model makes k = 8 rollouts per problem of the RL pool;
the pass rate (share of correct rollouts) is the problem's difficulty *for that model*.
Problems solved 0 % or 100 % of the time carry no GRPO signal (every rollout of the group gets
the same reward, so every advantage is 0) and are dropped. The rest fall into buckets: easy
(pass rate >= 0.75), hard (<= 0.25), medium between. For the weak model (Qwen2.5-7B) the paper
resamples its set to match the difficulty histogram of the strong model (Qwen3-4B); without it,
Qwen2.5-7B-RA-SFT's reward stagnates near 0.

Here: :func:`select_problems` keeps ``low < pass rate < high`` (defaults 0 and 1: exactly the
paper's rule) and, when a target histogram is given, draws from each bucket without
replacement so that the bucket shares match the target. The paper does not say how it
resampled; drawing *down* to the largest set with the target shares (or to ``target_size``)
never repeats a problem - repeats would weight some prompts twice per epoch, which the paper
does not describe. The draw is seeded and ordered by problem id, so the same table, config and
seed always give the same ids.

``balance_sources`` (not in the paper; off by default) then draws every data source down to the
count of the smallest, the same way: the families of a mixed pool stay equally weighted in GRPO
however unequally the SFT model finds them learnable. A strong SFT model leaves mostly the family
it is worst at in the band; on the embedded model, GRPO on that mix let the other families drift
at grpo.lr 2e-4, and balancing kept them (docs/experiments.md, 2026-12-05).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from agentrl.config import FilterConfig
from agentrl.errors import UserInputError

BUCKETS = ("easy", "medium", "hard")
PASS_RATE_COLUMNS = ("id", "data_source", "k", "correct", "pass_rate")


class SelectionError(UserInputError):
    """The pass-rate table or the target histogram cannot give a selection; the message says why."""


def check_pass_rate_table(table: pd.DataFrame, origin: str) -> None:
    """Refuse a table without the needed columns, with repeated ids or pass rates outside [0, 1]."""
    missing = [c for c in PASS_RATE_COLUMNS if c not in table.columns]
    if missing:
        raise SelectionError(f"{origin}: missing column(s) {missing}; expected at least {list(PASS_RATE_COLUMNS)}")
    if table.empty:
        raise SelectionError(f"{origin}: no problems")
    repeated = table["id"][table["id"].duplicated()].tolist()
    if repeated:
        raise SelectionError(f"{origin}: problem id(s) repeated: {repeated[:5]}")
    bad = table[(table["pass_rate"] < 0) | (table["pass_rate"] > 1) | table["pass_rate"].isna()]
    if not bad.empty:
        row, problem_id, rate = bad.index[0], bad["id"].iloc[0], float(bad["pass_rate"].iloc[0])
        raise SelectionError(f"{origin}: row {row} (id {problem_id!r}) has pass_rate {rate}, outside [0, 1]")


def check_thresholds(cfg: FilterConfig) -> None:
    if not cfg.low < cfg.high:
        raise SelectionError(f"filter.low ({cfg.low}) must be below filter.high ({cfg.high}): the band would be empty")
    if not cfg.hard_max < cfg.easy_min:
        raise SelectionError(
            f"filter.hard_max ({cfg.hard_max}) must be below filter.easy_min ({cfg.easy_min}): buckets would overlap"
        )
    if cfg.target_histogram is not None and cfg.target_pass_rates is not None:
        raise SelectionError("set filter.target_histogram or filter.target_pass_rates, not both")
    if cfg.target_size is not None and cfg.target_histogram is None and cfg.target_pass_rates is None:
        raise SelectionError(
            "filter.target_size needs a target histogram (filter.target_histogram or filter.target_pass_rates)"
        )


def bucket_of(pass_rates: pd.Series | np.ndarray, easy_min: float, hard_max: float) -> np.ndarray:
    """``easy`` (>= easy_min), ``hard`` (<= hard_max) or ``medium`` per pass rate."""
    rates = np.asarray(pass_rates, dtype=float)
    return np.where(rates >= easy_min, "easy", np.where(rates <= hard_max, "hard", "medium"))


def in_band(pass_rates: pd.Series | np.ndarray, low: float, high: float) -> np.ndarray:
    rates = np.asarray(pass_rates, dtype=float)
    return (rates > low) & (rates < high)


def bucket_counts(buckets: np.ndarray | pd.Series) -> dict[str, int]:
    values = list(buckets)
    return {b: values.count(b) for b in BUCKETS}


def normalize_shares(shares: Mapping[str, float], origin: str) -> dict[str, float]:
    total = sum(float(shares[b]) for b in BUCKETS)
    if total <= 0:
        raise SelectionError(
            f"{origin}: the target histogram {dict(shares)} has no mass; give at least one positive share"
        )
    return {b: float(shares[b]) / total for b in BUCKETS}


def target_shares_from_table(table: pd.DataFrame, cfg: FilterConfig, origin: str) -> dict[str, float]:
    """The bucket shares of another model's in-band problems (the histogram the paper matches)."""
    check_pass_rate_table(table, origin)
    kept = table[in_band(table["pass_rate"], cfg.low, cfg.high)]
    if kept.empty:
        raise SelectionError(f"{origin}: no problem has {cfg.low} < pass rate < {cfg.high}; no histogram to match")
    counts = bucket_counts(bucket_of(kept["pass_rate"], cfg.easy_min, cfg.hard_max))
    return normalize_shares(counts, origin)


def largest_remainder(shares: Mapping[str, float], total: int) -> dict[str, int]:
    """Integer counts summing to ``total`` whose ratios are closest to ``shares`` (Hamilton's method)."""
    exact = {b: shares[b] * total for b in BUCKETS}
    counts = {b: math.floor(exact[b]) for b in BUCKETS}
    # Ties in the remainder go to the bucket listed first, so the result never depends on dict order.
    by_remainder = sorted(BUCKETS, key=lambda b: (-(exact[b] - counts[b]), BUCKETS.index(b)))
    for b in by_remainder[: total - sum(counts.values())]:
        counts[b] += 1
    return counts


def resample_counts(
    available: Mapping[str, int], shares: Mapping[str, float], target_size: int | None
) -> dict[str, int]:
    """How many problems to draw per bucket, without replacement, for the target shares.

    The largest possible set is ``N = min_b floor(available_b / share_b)`` over buckets with a
    positive share; ``target_size`` may ask for fewer, never more.
    """
    wanted = [b for b in BUCKETS if shares[b] > 0]
    empty = [b for b in wanted if available[b] == 0]
    if empty:
        raise SelectionError(
            f"the target histogram {shares} wants {empty} problems but no kept problem is in that bucket "
            f"(kept per bucket: {dict(available)})"
        )
    largest = min(math.floor(available[b] / shares[b] + 1e-9) for b in wanted)
    size = largest if target_size is None else target_size
    if size > largest:
        raise SelectionError(
            f"filter.target_size = {target_size} but the kept problems {dict(available)} allow at most {largest} "
            f"with the shares {shares} without repeating a problem"
        )
    counts = largest_remainder(shares, size)
    assert all(counts[b] <= available[b] for b in BUCKETS), f"drew more than available: {counts} vs {dict(available)}"
    return counts


def selection_seed(seed: int, purpose: bytes = b"filter.select") -> np.random.Generator:
    """The select stage's own streams, derived from the global seed (stages never share draws)."""
    return np.random.default_rng([seed, zlib.crc32(purpose)])


def draw_by_id(table: pd.DataFrame, candidates: pd.Index, size: int, rng: np.random.Generator) -> list[int]:
    """``size`` of the ``candidates`` rows without replacement, independent of the table's row order."""
    ordered = sorted(candidates, key=lambda i: str(table.at[i, "id"]))
    return [ordered[j] for j in rng.choice(len(ordered), size=size, replace=False)] if size else []


def balance_by_source(table: pd.DataFrame, kept: np.ndarray, seed: int) -> np.ndarray:
    """``kept`` with every data source drawn down to the smallest source's kept count.

    Sources with no kept problem do not count (a pool without code leaves code out, it does not
    empty the set); the draw is seeded and by problem id, as the bucket draw.
    """
    sources = table["data_source"].astype(str)
    counts = sources[kept].value_counts()
    if counts.empty:
        return kept
    per_source = int(counts.min())
    rng = selection_seed(seed, b"filter.balance_sources")
    balanced = np.zeros_like(kept)
    for source in sorted(counts.index):
        candidates = table.index[kept & (sources == source).to_numpy()]
        balanced[draw_by_id(table, candidates, per_source, rng)] = True
    return balanced


@dataclass(frozen=True)
class Selection:
    """The kept problem ids (in the table's order), each one's bucket, and the counts that explain them."""

    ids: list[str]
    buckets: dict[str, str]
    stats: dict[str, Any]


def _per_source(table: pd.DataFrame, mask: np.ndarray) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for source, group in table[mask].groupby("data_source", sort=True):
        out[str(source)] = {"total": len(group), **bucket_counts(group["bucket"])}
    return out


def select_problems(
    table: pd.DataFrame,
    cfg: FilterConfig,
    seed: int,
    target_shares: Mapping[str, float] | None = None,
    origin: str = "pass rates",
) -> Selection:
    """Keep ``cfg.low < pass rate < cfg.high``; resample buckets to ``target_shares`` if given;
    then, with ``cfg.balance_sources``, draw every data source down to the smallest one's count.

    ``target_shares`` (easy/medium/hard, any scale) comes from ``cfg.target_histogram`` or
    from another model's table (:func:`target_shares_from_table`); the caller resolves which.
    """
    check_thresholds(cfg)
    check_pass_rate_table(table, origin)
    table = table.reset_index(drop=True).assign(bucket=bucket_of(table["pass_rate"], cfg.easy_min, cfg.hard_max))
    band = in_band(table["pass_rate"], cfg.low, cfg.high)
    kept = band.copy()
    available = bucket_counts(table.loc[band, "bucket"])
    shares = None
    if target_shares is not None:
        shares = normalize_shares(target_shares, "target histogram")
        draw = resample_counts(available, shares, cfg.target_size)
        rng = selection_seed(seed)
        kept[:] = False
        for bucket in BUCKETS:
            candidates = table.index[band & (table["bucket"] == bucket).to_numpy()]
            kept[draw_by_id(table, candidates, draw[bucket], rng)] = True
    resampled = int(kept.sum())
    if cfg.balance_sources:
        kept = balance_by_source(table, kept, seed)
    rates = table["pass_rate"].to_numpy(dtype=float)
    after = bucket_counts(table.loc[kept, "bucket"])
    stats = {
        "thresholds": {"low": cfg.low, "high": cfg.high, "easy_min": cfg.easy_min, "hard_max": cfg.hard_max},
        "k": sorted({int(k) for k in table["k"]}),
        "scored": {"total": len(table), **bucket_counts(table["bucket"])},
        "dropped_at_or_below_low": int((rates <= cfg.low).sum()),
        "dropped_at_or_above_high": int((rates >= cfg.high).sum()),
        "in_band": {"total": int(band.sum()), **available},
        "target_shares": shares,
        "resampled_out": int(band.sum()) - resampled,
        "balance_sources": cfg.balance_sources,
        "source_balanced_out": resampled - int(kept.sum()),
        "selected": {"total": int(kept.sum()), **after},
        "selected_shares": {b: after[b] / max(1, int(kept.sum())) for b in BUCKETS},
        "per_data_source": {
            "scored": _per_source(table, np.ones(len(table), bool)),
            "selected": _per_source(table, kept),
        },
    }
    ids = table.loc[kept, "id"].astype(str).tolist()
    buckets = dict(zip(ids, table.loc[kept, "bucket"]))
    return Selection(ids=ids, buckets=buckets, stats=stats)
