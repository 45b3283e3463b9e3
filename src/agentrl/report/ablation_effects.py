"""Effect sizes of the ablations: each arm against its question's reference arm, paired over seeds.

The seeds pair: seed k is the same RL sampling seed in every arm, so arm B's effect against the
reference arm A on a metric m is read from the per-seed differences

    d_k = m_B(k) - m_A(k)        over the seeds k where both runs have a value of m,
    effect = mean(d),  95 % interval = mean(d) ± t_{0.975, n-1} * sd(d) / sqrt(n)

(n the number of pairs, sd the sample standard deviation, ddof = 1; :func:`paired_effect`). A
metric a run lacks (None: steps to a threshold it never reached, a statistic an older log does not
have) drops that seed's pair, so steps to the threshold compare only the seeds where both arms
reached it. With fewer than 2 pairs there is no interval ("-").

The Student-t quantile is computed, not looked up (:func:`t_quantile`): scipy is not a dependency
of the project, and a percentile bootstrap over 3 seeds (at most 10 distinct resample means) gives
an interval no wider than the seeds' range, far narrower than the t-interval the question needs.
For an integer number of degrees of freedom the t distribution's CDF is a finite sum of
trigonometric terms (Abramowitz & Stegun 26.7.3-4), which bisection inverts to float precision.

Which metrics each question reports is :func:`effect_columns`; the rows go to the question's
markdown (:func:`effects_section`) and, as ``kind = effect`` rows, to its long CSV
(:func:`effect_rows`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LEVEL = 0.95
MINUS = "\u2212"  # the typographic minus of the cells: "+3.1 [−0.4, +6.6]"


# --------------------------------------------------------------------------- the statistics
def _t_central(theta: float, dof: int) -> float:
    """``P(|T| <= sqrt(dof) * tan(theta))`` for T ~ Student t with integer ``dof`` (A&S 26.7.3-4):

    odd dof:  (2/pi) (theta + sin(theta) sum_{j = 1, 3, .., dof-2} a_j cos^j(theta)),  a_1 = 1;
    even dof: sin(theta) sum_{j = 0, 2, .., dof-2} a_j cos^j(theta),  a_0 = 1;
    with a_{j+2} = a_j (j + 1) / (j + 2) in both.
    """
    s, c = math.sin(theta), math.cos(theta)
    j, a, series = (1, 1.0, 0.0) if dof % 2 else (0, 1.0, 0.0)
    while j <= dof - 2:
        series += a * c**j
        a *= (j + 1) / (j + 2)
        j += 2
    return (2 / math.pi) * (theta + s * series) if dof % 2 else s * series


def t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``dof`` degrees of freedom (integer >= 1)."""
    assert 0.5 < p < 1 and dof >= 1, f"t_quantile needs 0.5 < p < 1 and dof >= 1, got p={p}, dof={dof}"
    target, low, high = 2 * p - 1, 0.0, math.pi / 2
    for _ in range(200):  # bisection on theta = atan(t / sqrt(dof)); the central mass rises with it
        mid = (low + high) / 2
        low, high = (mid, high) if _t_central(mid, dof) < target else (low, mid)
        if high - low <= 1e-16:
            break
    return math.sqrt(dof) * math.tan((low + high) / 2)


@dataclass(frozen=True)
class Effect:
    """Arm B - reference arm A on one metric: the mean paired difference and its interval over seeds."""

    mean: float | None  # None: no seed where both have a value
    low: float | None  # None: fewer than 2 pairs
    high: float | None
    pairs: int
    differences: Mapping[int, float]  # seed -> d_k, the paired seeds only
    excludes_zero: bool


def _present(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def paired_effect(
    reference: Mapping[int, float | None], other: Mapping[int, float | None], level: float = LEVEL
) -> Effect:
    """``other`` against ``reference`` (both seed -> value): d_k = other(k) - reference(k) over the
    seeds both have a value for; mean(d) ± t_{(1+level)/2, n-1} * sd(d) / sqrt(n) (sd with ddof = 1)."""
    paired = [k for k in sorted(reference) if k in other and _present(reference[k]) and _present(other[k])]
    d = {k: other[k] - reference[k] for k in paired}
    n = len(d)
    if n == 0:
        return Effect(None, None, None, 0, {}, False)
    mean = statistics.fmean(d.values())
    if n < 2:
        return Effect(mean, None, None, 1, d, False)
    half = t_quantile((1 + level) / 2, n - 1) * statistics.stdev(d.values()) / math.sqrt(n)
    low, high = mean - half, mean + half
    return Effect(mean, low, high, n, d, low > 0 or high < 0)


# --------------------------------------------------------------------------- what each question reports
@dataclass(frozen=True)
class Column:
    """One metric of the effects table: ``scale`` 100 shows a rate in percentage points."""

    metric: str
    header: str
    scale: float
    digits: int


def effect_columns(question: str, n: int, threshold: float) -> list[Column]:
    """The headline metrics every question compares, then the question's own."""
    columns = [
        Column("avg@n/mean", f"avg@{n} mean (pp)", 100.0, 1),
        Column("pass@n/mean", f"pass@{n} mean (pp)", 100.0, 1),
        Column("final_train_acc", "final training accuracy (pp)", 100.0, 1),
        Column("steps_to_reach", f"steps to training accuracy >= {100 * threshold:g} %", 1.0, 1),
        Column("eval/tool_calls_per_response", "tool calls / response (eval)", 1.0, 2),
    ]
    own = {
        "data": [Column("train/zero_advantage_share_mean", "zero-advantage share, mean over steps (pp)", 100.0, 1)],
        "algorithm": [
            Column("train/entropy_last", "policy entropy, last 3 steps (nats / token)", 1.0, 3),
            Column("train/clip_frac_high_mean", "clip fraction high, mean over steps (pp)", 100.0, 2),
            Column("train/clip_frac_low_mean", "clip fraction low, mean over steps (pp)", 100.0, 2),
        ],
        "reasoning": [
            Column("eval/tool_calls_per_solved", "tool calls / correct response (eval)", 1.0, 2),
            Column("eval/deliberative_share", "deliberative share (pp)", 100.0, 1),
        ],
    }
    return columns + own.get(question, [])


def question_effects(
    arms: Sequence[str], by_seed: Mapping[str, Mapping[int, Mapping[str, float | None]]], columns: Sequence[Column]
) -> dict[str, dict[str, Effect]]:
    """arm -> metric -> :class:`Effect` against ``arms[0]``, for every other arm; ``by_seed`` is
    arm -> seed -> the run's metrics."""
    reference = arms[0]

    def values(arm: str, metric: str) -> dict[int, float | None]:
        return {seed: m.get(metric) for seed, m in by_seed[arm].items()}

    return {
        arm: {c.metric: paired_effect(values(reference, c.metric), values(arm, c.metric)) for c in columns}
        for arm in arms[1:]
    }


# --------------------------------------------------------------------------- tables
def _signed(x: float, digits: int) -> str:
    x = round(x, digits) + 0.0  # + 0.0: no "-0.0"
    return f"{x:+.{digits}f}".replace("-", MINUS)


def format_effect(e: Effect, scale: float = 1.0, digits: int = 1) -> str:
    """``+3.1 [−0.4, +6.6]``; ``+3.1 [-]`` with one pair, ``-`` with none; bold when the interval excludes 0."""
    if e.mean is None:
        return "-"
    interval = "-" if e.low is None else f"{_signed(scale * e.low, digits)}, {_signed(scale * e.high, digits)}"
    cell = f"{_signed(scale * e.mean, digits)} [{interval}]"
    return f"**{cell}**" if e.excludes_zero else cell


def _effect_cell(e: Effect, column: Column, seeds: int) -> str:
    cell = format_effect(e, column.scale, column.digits)
    if column.metric == "steps_to_reach":
        return f"{cell} ({e.pairs}/{seeds} both reached)"
    return cell if e.pairs in (0, seeds) else f"{cell} (n={e.pairs})"


def effects_section(
    arms: Sequence[str],
    effects: Mapping[str, Mapping[str, Effect]],
    columns: Sequence[Column],
    labels: Mapping[str, str],
    seeds: int,
) -> list[str]:
    """The markdown section "Effects against <reference arm>": one row per other arm, one column per metric."""
    reference = arms[0]
    rows = [[labels[arm], *(_effect_cell(effects[arm][c.metric], c, seeds) for c in columns)] for arm in arms[1:]]
    table = "\n".join(
        [
            "| " + " | ".join(["arm", *(c.header for c in columns)]) + " |",
            "|" + "|".join("---" for _ in range(len(columns) + 1)) + "|",
            *("| " + " | ".join(row) + " |" for row in rows),
        ]
    )
    note = (
        f"Paired over seeds: d_k = (arm) - ({reference}) at seed k; mean of d [{100 * LEVEL:g} % interval: "
        f"mean ± t(0.975, n-1) sd(d) / sqrt(n)] over the n seeds where both have a value (n = {seeds} "
        f"unless the cell says otherwise). pp: percentage points. Bold: the interval excludes 0. [-]: one "
        f"pair, no interval. Steps to the threshold pair only the seeds where both arms reached it."
    )
    return [f"## Effects against {reference}", table if rows else "(no other arm)", note]


def effect_rows(
    question: str,
    arms: Sequence[str],
    effects: Mapping[str, Mapping[str, Effect]],
    seeds: Sequence[int],
    arm_columns: Mapping[str, Mapping[str, str]],
) -> list[dict]:
    """The long CSV's ``kind = effect`` rows: ``mean`` the effect, ``low``/``high`` its interval
    (fractions for rates, not pp), ``seeds_with_value`` the pairs, ``values`` d_k per seed (None unpaired)."""
    rows = []
    for arm in arms[1:]:
        for metric, e in effects[arm].items():
            rows.append(
                {
                    "question": question,
                    "kind": "effect",
                    "arm": arm,
                    **arm_columns[arm],
                    "reference": arms[0],
                    "metric": metric,
                    "mean": e.mean,
                    "low": e.low,
                    "high": e.high,
                    "excludes_zero": e.excludes_zero,
                    "seeds_with_value": e.pairs,
                    "seeds": len(seeds),
                    "values": json.dumps([e.differences.get(k) for k in seeds]),
                }
            )
    return rows
