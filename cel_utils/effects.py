"""What an ablation changed, item by item: per-class accuracy, capability versus bias, and flips.

A head whose removal raises accuracy may have made the model more capable, or may only have moved its answers
toward one label (every error on one class, and the ablation pushes answers toward that class). Two figures
tell the two apart, each with a stratified bootstrap CI: the change in **balanced accuracy** (the mean of the
per-class accuracies) and, for two-class tasks, the change in the **share of answers given as each label**;
and two exact tests: did answers move toward one label (a binomial test on the items whose answer changed
label), and did some class lose items (a binomial test on that class's fixes and breaks)?

Example:
    >>> import numpy as np
    >>> labels = ["pos"] * 100 + ["neg"] * 100
    >>> base = np.r_[np.ones(100), np.arange(100) < 50].astype(bool)      # every error is a negative review
    >>> shift = np.r_[np.arange(100) >= 20, np.arange(100) < 70].astype(bool)  # 20 negatives fixed, 20 positives broken
    >>> class_effects(labels, base, shift)["kind"]
    'a class loses items'
    >>> class_effects(labels, base, np.ones(200, bool))["kind"]          # every error of one class fixed, no breaks
    'no class loses items'
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from .defaults import ALPHA, N_BOOT
from .stats import stratified_mean_ci

KINDS = ("no class loses items", "a class loses items", "harmful", "unclear", "none")


def item_labels(task) -> list | None:
    """The class of each item (``label`` field), or None when the task has no classes (e.g. exact match)."""
    labs = [it.get("label") for it in task.items]
    return None if any(l is None for l in labs) else labs


def _binom_p(k: int, n: int) -> float:
    from scipy.stats import binomtest

    return 1.0 if n == 0 else float(binomtest(int(k), int(n), 0.5).pvalue)


def _label_share_shift(labels: np.ndarray, classes: list, base: np.ndarray, ablated: np.ndarray, n_boot: int,
                       seed: int, alpha: float) -> dict:
    """For two classes: the label whose share of answers grew (``share_label``), that growth with its CI
    (``delta_share``, ``share_ci_low``, ``share_ci_high``) and the binomial test on the items whose answer label
    changed (``shift_p_value``)."""
    a = classes[0]
    # 1 when the item's answer label is classes[0]: right on an `a` item, or wrong on the other class
    ans_b = np.where(labels == a, base, ~base).astype(float)
    ans_a = np.where(labels == a, ablated, ~ablated).astype(float)
    moves = [ans_a[labels == c] - ans_b[labels == c] for c in classes]
    w = np.array([(labels == c).mean() for c in classes])
    d_share, lo, hi = stratified_mean_ci(moves, w, n_boot, seed, alpha)
    to_a, to_b = int(sum((mv > 0).sum() for mv in moves)), int(sum((mv < 0).sum() for mv in moves))
    p_shift = _binom_p(to_a, to_a + to_b)
    sign = 1.0 if d_share >= 0 else -1.0
    return dict(share_label=a if sign > 0 else classes[1], delta_share=sign * d_share,
                share_ci_low=min(sign * lo, sign * hi), share_ci_high=max(sign * lo, sign * hi),
                shift_p_value=p_shift)


def class_effects(labels: Sequence, base: np.ndarray, ablated: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                  alpha: float = ALPHA) -> dict:
    """Per-class accuracy before and after, balanced accuracy and label shares with CIs, and the kind of effect.

    For two classes an item's *answer label* is its own label when it is answered correctly and the other
    label when not; ``delta_share`` is the change in the share of answers given as the label that gains.
    ``kind`` (decided with exact tests at ``alpha`` and the CI of the balanced-accuracy change):

    * ``a class loses items``: some class lost items (binomial test on its fixes and breaks) while answers moved toward
      one label (binomial test on the items whose answer label changed) or another class gained: a gain, if
      any, is a calibration shift;
    * ``no class loses items``: balanced accuracy rose (CI above 0) and no class lost items;
    * ``harmful``: balanced accuracy fell (CI below 0); ``none``: nothing changed; ``unclear``: otherwise
      (for instance a few fixes in one class: too few to call).

    With more than two classes the label share is not defined (NaN).
    """
    labels = np.asarray(labels)
    base, ablated = np.asarray(base, bool), np.asarray(ablated, bool)
    if not (len(labels) == len(base) == len(ablated)):
        raise ValueError("labels, base and ablated must have one entry per item")
    classes = sorted(set(labels.tolist()))
    k = len(classes)
    per, diffs, losing, gaining = {}, [], [], []
    for c in classes:
        m = labels == c
        fixes, breaks = int((~base[m] & ablated[m]).sum()), int((base[m] & ~ablated[m]).sum())
        p = _binom_p(fixes, fixes + breaks)
        per[c] = {"baseline": float(base[m].mean()), "ablated": float(ablated[m].mean()),
                  "delta": float(ablated[m].mean() - base[m].mean()), "fixes": fixes, "breaks": breaks,
                  "p_value": p}
        diffs.append(ablated[m].astype(float) - base[m].astype(float))
        if p < alpha:
            (losing if breaks > fixes else gaining).append(c)
    d_bal, bal_lo, bal_hi = stratified_mean_ci(diffs, np.full(k, 1.0 / k), n_boot, seed, alpha)
    out = {"classes": per, "balanced_baseline": float(np.mean([v["baseline"] for v in per.values()])),
           "balanced_ablated": float(np.mean([v["ablated"] for v in per.values()])),
           "delta_balanced": d_bal, "balanced_ci_low": bal_lo, "balanced_ci_high": bal_hi,
           "share_label": None, "delta_share": float("nan"), "share_ci_low": float("nan"),
           "share_ci_high": float("nan"), "shift_p_value": float("nan")}
    shifted = False
    if k == 2:
        out.update(_label_share_shift(labels, classes, base, ablated, n_boot, seed, alpha))
        shifted = out["shift_p_value"] < alpha
    if not any(v["fixes"] or v["breaks"] for v in per.values()):
        kind = "none"
    elif losing and (shifted or gaining):
        kind = "a class loses items"
    elif bal_lo > 0 and not losing:
        kind = "no class loses items"
    elif bal_hi < 0:
        kind = "harmful"
    else:
        kind = "unclear"
    out["kind"] = kind
    return out


def class_table(task, heads: Sequence[str], base: np.ndarray, ablated: np.ndarray, n_boot: int = N_BOOT,
                seed: int = 0, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per head set: per-class accuracy change, balanced accuracy and label-share changes with CIs,
    and the kind of effect (:func:`class_effects`).

    ``base`` is ``[n_items]`` correctness without ablation; ``ablated`` is ``[len(heads), n_items]``.
    Tasks without classes give an empty table.
    """
    cols = ["heads", "kind", "delta_accuracy", "delta_balanced", "balanced_ci_low", "balanced_ci_high",
            "share_label", "delta_share", "share_ci_low", "share_ci_high"]
    labels = item_labels(task)
    if labels is None:
        return pd.DataFrame(columns=cols)
    rows = []
    for name, ab in zip(heads, np.atleast_2d(ablated)):
        e = class_effects(labels, base, ab, n_boot=n_boot, seed=seed, alpha=alpha)
        row = {"heads": name, "delta_accuracy": float(np.mean(ab) - np.mean(base)),
               **{c: e[c] for c in cols if c in e}, "kind": e["kind"]}
        for c, v in e["classes"].items():
            row[f"{c}: before"] = v["baseline"]
            row[f"{c}: change"] = v["delta"]
        rows.append(row)
    return pd.DataFrame(rows)[cols + [c for c in rows[0] if c not in cols]] if rows else pd.DataFrame(columns=cols)


def _answer(item) -> str:
    return item["target"] if "target" in item else item["choices"][item["answer"]]


def flips(task, base: np.ndarray, ablated: np.ndarray, n_examples: int = 2) -> dict:
    """Items that go wrong -> right and right -> wrong under the ablation, with a few shown as text.

    Example:
        >>> from cel_utils.tasks import load_task
        >>> t = load_task("addition", n=3)
        >>> f = flips(t, np.array([0, 1, 1], bool), np.array([1, 0, 1], bool))
        >>> f["fixed"], f["broken"]
        (1, 1)
    """
    base, ablated = np.asarray(base, bool), np.asarray(ablated, bool)
    fixed, broken = np.flatnonzero(~base & ablated), np.flatnonzero(base & ~ablated)

    def show(idx):
        out = []
        for i in idx[:n_examples]:
            it = task.items[i]
            out.append(f"{it['prompt'].strip().splitlines()[-1]} -> {_answer(it).strip()}")
        return out

    return {"fixed": int(len(fixed)), "broken": int(len(broken)), "net": int(len(fixed) - len(broken)),
            "fixed_examples": show(fixed), "broken_examples": show(broken)}
