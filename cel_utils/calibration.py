"""Which tasks leave room: each candidate variant's unablated accuracy on the search split, before any head is
screened.

A pair can show a gain only when the model is neither always right nor always wrong. :func:`calibrate` measures
each candidate's accuracy on the first ``n`` items of its **search** split (the split every later choice is made
on; the confirm and held-out items are never read) and keeps those in ``band``; :func:`pick` then takes up to
``per_model`` kept tasks per model, one per family first (the one nearest 0.5), so that a chapter's pairs span
families, then the cheapest screens. The table says why each candidate was kept or left.

Example:
    >>> from cel_utils.tiny import tiny_model
    >>> lm = tiny_model("llama")
    >>> tab = calibrate(lm, ["ioi", "agreement"], n=4, progress=False)
    >>> list(tab.columns)[:5], tab["split"].unique().tolist()
    (['model', 'task', 'family', 'knob', 'split'], ['search'])
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from . import profiling
from .defaults import CALIBRATION_BAND, CALIBRATION_ITEMS
from .engine import evaluate_head_sets, screen_work
from .errors import CELError
from .scoring import encode_task
from .tasks import BUILTIN_TASKS, load_task
from .variants import VARIANTS, family_of

COLUMNS = ["model", "task", "family", "knob", "split", "n", "search_baseline", "kept", "reason", "screen_work", "dtype"]


def candidates() -> list[str]:
    """Every family that has variants: its base task, then its variants (the default candidates).

    Example:
        >>> candidates()[:3]
        ['addition', 'addition_nocarry', 'addition_carry']
    """
    out = []
    for fam in dict.fromkeys(v.family for v in VARIANTS.values()):
        out += [fam] + [n for n, v in VARIANTS.items() if v.family == fam]
    return out


@profiling.timed
def calibrate(lm, names: Sequence[str], n: int = CALIBRATION_ITEMS, band: tuple[float, float] = CALIBRATION_BAND,
              seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """One row per candidate task: its unablated accuracy on the first ``n`` search items, and whether it lies in
    ``band`` (``kept``) with the reason in words, and the dtype it ran in. Reads the search split only."""
    lo, hi = band
    if not 0 <= lo < hi <= 1:
        raise CELError(f"the calibration band must satisfy 0 <= low < high <= 1, got {band}")
    rows = []
    for name in names:
        task = load_task(name, "search", n=n, seed=seed, clip=True)
        enc = encode_task(lm, task)
        acc = float(evaluate_head_sets(lm, enc, [[]], progress=False).accuracy[0])
        spec = BUILTIN_TASKS.get(name)
        kept = lo <= acc <= hi
        reason = (f"kept: {acc:.2f} leaves room both ways" if kept else
                  f"left: {acc:.2f} is above {hi:g} (near the ceiling)" if acc > hi else
                  f"left: {acc:.2f} is below {lo:g} (near the floor)")
        rows.append({"model": lm.name, "task": name, "family": family_of(name), "knob": spec.knob if spec else "",
                     "split": task.split, "n": len(task), "search_baseline": acc, "kept": kept, "reason": reason,
                     "screen_work": screen_work(lm, enc), "dtype": str(next(lm.model.parameters()).dtype)[6:]})
        if progress:
            print(f"{lm.name} / {name}: {reason}")
    return pd.DataFrame(rows, columns=COLUMNS)


def pick(table: pd.DataFrame, per_model: int = 4) -> dict[str, list[str]]:
    """Up to ``per_model`` kept tasks per model: first the kept task nearest 0.5 of each family (families in order
    of that distance), then the other kept tasks, those whose screen costs least first (``screen_work``, the
    multiply-adds of a screen of every head; nearest 0.5 first when the table has no such column).

    Example:
        >>> t = pd.DataFrame({"model": "m", "task": ["a", "a2", "b", "c"], "family": ["a", "a", "b", "c"],
        ...                   "search_baseline": [0.5, 0.45, 0.7, 0.1], "kept": [True, True, True, False]})
        >>> pick(t, per_model=3)
        {'m': ['a', 'b', 'a2']}
        >>> t2 = pd.DataFrame({"model": "m", "task": ["a", "a2", "a3"], "family": "a", "search_baseline": [0.5, 0.45, 0.6],
        ...                    "kept": True, "screen_work": [3.0, 2.0, 1.0]})
        >>> pick(t2, per_model=2)
        {'m': ['a', 'a3']}
    """
    out = {}
    for model, g in table[table["kept"]].groupby("model", sort=False):
        g = g.assign(dist=(g["search_baseline"] - 0.5).abs()).sort_values(["dist", "task"])
        first = g.drop_duplicates("family")
        rest = g[~g["task"].isin(first["task"])]
        if "screen_work" in rest:
            rest = rest.sort_values(["screen_work", "task"])
        out[model] = pd.concat([first, rest])["task"].head(per_model).tolist()
    return out
