"""One way to compare head sets: the unablated model plus named head sets, each paired against it item by item.

:func:`compare_sets` evaluates the sets with the exact engine and returns a :class:`Comparison`: a tidy table
(accuracy, change, paired-bootstrap CI and p-value, the same for the mean margin) and the per-item arrays
behind it. :func:`paired_table` is the statistics alone, for results already computed (a screen's).
The stages that test chosen sets (confirm, held-out) are in :mod:`cel_utils.pipeline`.

Example:
    >>> from cel_utils.compare import compare_sets                        # doctest: +SKIP
    >>> cmp = compare_sets(lm, heldout, {"L14H8": [(14, 8)], "both": [(14, 8), (11, 8)]})  # doctest: +SKIP
    >>> cmp.table[["heads", "delta_accuracy", "ci_low", "ci_high"]]       # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from .ablation import Ablation, Head
from .defaults import ALPHA, N_BOOT
from .engine import evaluate_head_sets
from .scoring import EncodedTask, ItemResults, encode_task
from .stats import paired_bootstrap_many


@dataclass
class Comparison:
    """Named head sets against the unablated model on the same items."""

    names: list[str]
    baseline: ItemResults  # [1, n_items]
    results: ItemResults  # [n_sets, n_items], rows in ``names`` order
    table: pd.DataFrame  # one row per set (see :func:`paired_table`)

    def row(self, name: str) -> pd.Series:
        return self.table.set_index("heads").loc[name]


def paired_table(names: Sequence[str], baseline: ItemResults, results: ItemResults, n_boot: int = N_BOOT,
                 seed: int = 0, alpha: float = ALPHA) -> pd.DataFrame:
    """Per set: accuracy and mean margin, their changes against the baseline, and paired-bootstrap CIs.

    Paired: every resample draws the same items for the baseline and the ablation. Columns ``heads``,
    ``n_items``, ``baseline_accuracy``, ``accuracy``, ``delta_accuracy``, ``ci_low``, ``ci_high``,
    ``p_value`` (accuracy), ``mean_margin``, ``delta_margin``, ``margin_ci_low``, ``margin_ci_high``.

    Example:
        >>> import numpy as np
        >>> base = ItemResults(np.array([[0, 0, 1, 1]], bool), np.array([[-1.0, -1, 1, 1]]))
        >>> abl = ItemResults(np.array([[1, 1, 1, 1]], bool), np.array([[1.0, 1, 1, 1]]))
        >>> t = paired_table(["L0H0"], base, abl)
        >>> float(t.delta_accuracy[0]), float(t.delta_margin[0])
        (0.5, 1.0)
    """
    b_correct, b_margin = baseline.correct[0].astype(float), baseline.margin[0]
    acc = paired_bootstrap_many(b_correct, results.correct.astype(float), n_boot=n_boot, seed=seed, alpha=alpha)
    mar = paired_bootstrap_many(b_margin, results.margin, n_boot=n_boot, seed=seed, alpha=alpha)
    return pd.DataFrame({
        "heads": list(names), "n_items": results.correct.shape[1],
        "baseline_accuracy": float(b_correct.mean()), "accuracy": results.accuracy,
        "delta_accuracy": acc["delta"], "ci_low": acc["ci_low"], "ci_high": acc["ci_high"],
        "p_value": acc["p_value"],
        "mean_margin": results.mean_margin, "delta_margin": mar["delta"],
        "margin_ci_low": mar["ci_low"], "margin_ci_high": mar["ci_high"],
    })


def compare_sets(lm, task_or_enc, named_sets: dict[str, Sequence[Head]], mode: str | Ablation = "zero",
                 means=None, n_boot: int = N_BOOT, seed: int = 0, alpha: float = ALPHA, progress: bool = False,
                 result_cache: bool | None = None) -> Comparison:
    """Evaluate the unablated model and every named head set (heads of a set removed together) on the same
    items, in one batched engine call, and pair each set against the baseline.

    ``task_or_enc`` is a :class:`~cel_utils.tasks.Task` or an already encoded task. ``named_sets`` maps a label
    (e.g. ``"L14H8"`` or ``"top 5 together"``) to its heads.
    """
    enc = task_or_enc if isinstance(task_or_enc, EncodedTask) else encode_task(lm, task_or_enc)
    names = list(named_sets)
    res = evaluate_head_sets(lm, enc, [[]] + [list(named_sets[k]) for k in names], mode=mode, means=means,
                             progress=progress, desc=f"comparing {len(names)} head sets", result_cache=result_cache)
    baseline, results = res.rows(slice(0, 1)), res.rows(slice(1, None))
    return Comparison(names=names, baseline=baseline, results=results,
                      table=paired_table(names, baseline, results, n_boot=n_boot, seed=seed, alpha=alpha))
