"""What an ablation changed, item by item: per-class accuracy, capability versus bias, and flips.

A head whose removal raises accuracy may have made the model more capable, or may only have moved its bias
between answer labels (every error on one class, and the ablation pushes answers toward that class). The
per-class view tells the two apart.

Example:
    >>> import numpy as np
    >>> labels = ["pos", "pos", "neg", "neg"]
    >>> base = np.array([1, 1, 0, 0], bool)
    >>> class_effects(labels, base, np.array([1, 0, 1, 1], bool))["kind"]
    'bias-like'
    >>> class_effects(labels, base, np.array([1, 1, 1, 0], bool))["kind"]
    'capability-like'
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd


def item_labels(task) -> list | None:
    """The class of each item (``label`` field), or None when the task has no classes (e.g. exact match)."""
    labs = [it.get("label") for it in task.items]
    return None if any(l is None for l in labs) else labs


def class_effects(labels: Sequence, base: np.ndarray, ablated: np.ndarray, tol: float = 1e-9) -> dict:
    """Per-class accuracy before and after, balanced accuracy, and the kind of effect.

    ``kind``: ``capability-like`` when no class gets worse and at least one improves; ``bias-like`` when one
    class improves while another gets worse; ``harmful`` when no class improves and one gets worse; ``none``.
    """
    labels = np.asarray(labels)
    base, ablated = np.asarray(base, float), np.asarray(ablated, float)
    if not (len(labels) == len(base) == len(ablated)):
        raise ValueError("labels, base and ablated must have one entry per item")
    classes = sorted(set(labels.tolist()))
    per = {c: (float(base[labels == c].mean()), float(ablated[labels == c].mean())) for c in classes}
    deltas = np.array([a - b for b, a in per.values()])
    up, down = (deltas > tol).any(), (deltas < -tol).any()
    kind = "bias-like" if up and down else "capability-like" if up else "harmful" if down else "none"
    return {"classes": {c: {"baseline": b, "ablated": a, "delta": a - b} for c, (b, a) in per.items()},
            "balanced_baseline": float(np.mean([b for b, _ in per.values()])),
            "balanced_ablated": float(np.mean([a for _, a in per.values()])),
            "delta_balanced": float(deltas.mean()), "kind": kind}


def class_table(task, heads: Sequence[str], base: np.ndarray, ablated: np.ndarray) -> pd.DataFrame:
    """One row per head set: per-class accuracy change, balanced accuracy change, and the kind of effect.

    ``base`` is ``[n_items]`` correctness without ablation; ``ablated`` is ``[len(heads), n_items]``.
    Tasks without classes give an empty table.
    """
    labels = item_labels(task)
    if labels is None:
        return pd.DataFrame(columns=["heads", "kind", "delta_accuracy", "delta_balanced"])
    rows = []
    for name, ab in zip(heads, np.atleast_2d(ablated)):
        e = class_effects(labels, base, ab)
        row = {"heads": name, "delta_accuracy": float(np.mean(ab) - np.mean(base)),
               "delta_balanced": e["delta_balanced"], "kind": e["kind"]}
        for c, v in e["classes"].items():
            row[f"{c}: before"] = v["baseline"]
            row[f"{c}: change"] = v["delta"]
        rows.append(row)
    return pd.DataFrame(rows)


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
