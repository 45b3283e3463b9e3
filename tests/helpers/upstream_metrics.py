"""Upstream's metric code written out plainly, the reference the package's metrics must match draw for draw."""

from __future__ import annotations

import numpy as np


def verl_style_bootstrap(correct, preds, k, n_boot, seed):
    """Straightforward loop over the global legacy RNG, as verl's metric_utils draws."""
    np.random.seed(seed)
    bests, majs = [], []
    for _ in range(n_boot):
        idx = np.random.choice(len(correct), size=k, replace=True)
        bests.append(max(correct[i] for i in idx))
        groups: dict = {}
        for i in idx:
            groups.setdefault(preds[i], []).append(correct[i])
        winner = max(groups, key=lambda answer: len(groups[answer]))
        majs.append(groups[winner][0])
    return float(np.mean(bests)), float(np.mean(majs))
