"""The pass-rate histogram of the RL pool: every scored problem and the selected ones.

Pass rates of k rollouts take the k + 1 values 0, 1/k, ..., 1, so the plot is a bar chart over
those values (not a binned histogram that would merge neighbours), with the count written on
each bar and the band and bucket thresholds drawn as lines.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from agentrl.config import FilterConfig


def _between(values: np.ndarray, inside: np.ndarray, threshold: float) -> float:
    """The midpoint between the last value in ``inside`` and the first after it (the threshold if either is missing)."""
    if inside.any() and (~inside).any():
        return float((values[inside].max() + values[~inside].min()) / 2)
    return threshold


def plot_pass_rate_histogram(
    table: pd.DataFrame, selected_ids: set[str], cfg: FilterConfig, out: Path, title: str = "RL pool difficulty"
) -> None:
    """Bars of problems per pass rate: scored (light; orange when outside the band) and selected for RL (dark)."""
    # Imported here: the scoring shards import this module through the filter CLI, and their
    # envs (envs/train.yaml, envs/vllm.yaml) have no matplotlib; only the selection plots.
    import matplotlib

    matplotlib.use("Agg")  # files only; a cluster node has no display
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rates = table["pass_rate"].to_numpy(dtype=float)
    chosen = table["id"].astype(str).isin(selected_ids).to_numpy()
    values = np.unique(np.round(rates, 6))
    spacing = float(np.min(np.diff(values))) if len(values) > 1 else 0.1
    width = 0.4 * spacing
    scored_counts = [int((np.round(rates, 6) == v).sum()) for v in values]
    selected_counts = [int(((np.round(rates, 6) == v) & chosen).sum()) for v in values]

    band = (values > cfg.low) & (values < cfg.high)
    fig, ax = plt.subplots(figsize=(10.5, 4.5), dpi=120)
    bars_all = ax.bar(values - width / 2, scored_counts, width, color=np.where(band, "#9ecae1", "#fdae6b"))
    bars_sel = ax.bar(values + width / 2, selected_counts, width, color="#08519c")
    for bars in (bars_all, bars_sel):
        ax.bar_label(bars, fontsize=8, padding=1)
    top = max(scored_counts) * 1.18 + 1
    ax.set_ylim(0, top)
    # Bucket borders sit between the last value inside a bucket and the first outside it.
    hard_edge = _between(values, values <= cfg.hard_max, cfg.hard_max)
    easy_edge = _between(values, values < cfg.easy_min, cfg.easy_min)
    for edge in (hard_edge, easy_edge):
        ax.axvline(edge, color="grey", linestyle=":", linewidth=1)
    for x, label in (
        ((-spacing + hard_edge) / 2, f"hard\n(<= {cfg.hard_max:g})"),
        ((hard_edge + easy_edge) / 2, "medium"),
        ((easy_edge + 1 + spacing) / 2, f"easy\n(>= {cfg.easy_min:g})"),
    ):
        ax.text(x, top * 0.97, label, ha="center", va="top", fontsize=8, color="dimgrey")
    ax.legend(
        handles=[
            Patch(color="#9ecae1", label=f"scored, in band {cfg.low:g} < pass rate < {cfg.high:g}"),
            Patch(color="#fdae6b", label="scored, outside the band (dropped)"),
            Patch(color="#08519c", label=f"selected for RL ({int(chosen.sum())} of {len(table)})"),
        ],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        title="problems",
        title_fontsize=8,
    )
    ks = sorted({int(k) for k in table["k"]})
    ax.set_xlim(-spacing, 1 + spacing)
    ax.set_xticks(values, [f"{v:.3f}".rstrip("0").rstrip(".") for v in values])
    ax.set_xlabel(f"pass rate of the SFT model (correct / k, k = {', '.join(map(str, ks))})")
    ax.set_ylabel("problems")
    ax.set_title(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
