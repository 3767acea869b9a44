"""Joint ablation search: which small head sets, removed together, improve a task.

The strategies work on any scoring function ``score(head_sets) -> list of floats`` (higher is better;
one call may evaluate many sets, so a model-backed scorer can batch them with
:func:`cel_utils.screening.evaluate_head_sets`). They are tested on synthetic functions with a known best set.

Example:
    >>> from cel_utils.search import exhaustive, greedy
    >>> gain = {"a": 1.0, "b": 0.5, "c": -2.0}
    >>> score = lambda sets: [sum(gain[h] for h in s) - (0.8 if {"a", "b"} <= set(s) else 0) for s in sets]
    >>> exhaustive(["a", "b", "c"], score, max_size=2).best[2].heads
    ('a', 'b')
    >>> [s.heads for s in greedy(["a", "b", "c"], score).path]
    [(), ('a',)]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

Scorer = Callable[[list[tuple]], Sequence[float]]


@dataclass(frozen=True)
class Scored:
    heads: tuple
    score: float


@dataclass
class SearchResult:
    strategy: str
    best: dict[int, Scored]  # size -> best set of that size found
    n_evaluations: int
    path: list[Scored] = field(default_factory=list)  # greedy: the sets it moved through

    @property
    def overall(self) -> Scored:
        return max(self.best.values(), key=lambda s: s.score)


class _Counter:
    def __init__(self, score: Scorer):
        self.score = score
        self.n = 0
        self.memo: dict[tuple, float] = {}

    def __call__(self, sets: list[tuple]) -> list[float]:
        keys = [tuple(sorted(s)) for s in sets]
        todo = [k for k in dict.fromkeys(keys) if k not in self.memo]
        if todo:
            vals = list(self.score(todo))
            if len(vals) != len(todo):
                raise ValueError(f"the scorer returned {len(vals)} values for {len(todo)} head sets")
            self.memo.update(zip(todo, map(float, vals)))
            self.n += len(todo)
        return [self.memo[k] for k in keys]


def _check(pool: Sequence[Hashable], max_size: int) -> None:
    if len(set(pool)) != len(pool):
        raise ValueError("the candidate pool has duplicates")
    if max_size < 1:
        raise ValueError("max_size must be at least 1")


def exhaustive(pool: Sequence[Hashable], score: Scorer, max_size: int | None = None) -> SearchResult:
    """Every subset of the pool up to ``max_size`` (2^m subsets for the whole pool of size m)."""
    max_size = len(pool) if max_size is None else min(max_size, len(pool))
    _check(pool, max(max_size, 1))
    ev = _Counter(score)
    best: dict[int, Scored] = {}
    for k in range(0, max_size + 1):
        sets = [tuple(sorted(c)) for c in itertools.combinations(pool, k)]
        vals = ev(sets)
        i = max(range(len(sets)), key=lambda j: vals[j])
        best[k] = Scored(sets[i], vals[i])
    return SearchResult("exhaustive", best, ev.n)


def greedy(pool: Sequence[Hashable], score: Scorer, max_size: int | None = None, min_gain: float = 0.0) -> SearchResult:
    """Forward selection: add the head that helps most; stop when nothing improves by more than ``min_gain``."""
    max_size = len(pool) if max_size is None else min(max_size, len(pool))
    _check(pool, max(max_size, 1))
    ev = _Counter(score)
    cur: tuple = ()
    (cur_score,) = ev([cur])
    path = [Scored(cur, cur_score)]
    best = {0: path[0]}
    while len(cur) < max_size:
        cands = [tuple(sorted(cur + (h,))) for h in pool if h not in cur]
        vals = ev(cands)
        i = max(range(len(cands)), key=lambda j: vals[j])
        best[len(cur) + 1] = Scored(cands[i], vals[i])
        if vals[i] <= cur_score + min_gain:
            break
        cur, cur_score = cands[i], vals[i]
        path.append(Scored(cur, cur_score))
    return SearchResult("greedy", best, ev.n, path)


def beam(pool: Sequence[Hashable], score: Scorer, width: int = 4, max_size: int | None = None) -> SearchResult:
    """Beam search: keep the ``width`` best sets of each size and extend each by one head."""
    max_size = len(pool) if max_size is None else min(max_size, len(pool))
    _check(pool, max(max_size, 1))
    if width < 1:
        raise ValueError("beam width must be at least 1")
    ev = _Counter(score)
    (s0,) = ev([()])
    frontier = [Scored((), s0)]
    best = {0: frontier[0]}
    for k in range(1, max_size + 1):
        cands = sorted({tuple(sorted(f.heads + (h,))) for f in frontier for h in pool if h not in f.heads})
        vals = ev(cands)
        scored = sorted((Scored(c, v) for c, v in zip(cands, vals)), key=lambda s: -s.score)
        frontier = scored[:width]
        best[k] = frontier[0]
    return SearchResult("beam", best, ev.n)


# ---------------------------------------------------------------------------------------------
# On a real model
# ---------------------------------------------------------------------------------------------
TIE_BREAK = 1e-3  # weight of the mean margin in a set's score: orders sets with equal accuracy


def model_scorer(lm, enc, mode: str = "zero", means=None, by: str = "accuracy", tie_break: float = TIE_BREAK,
                 progress: bool = False):
    """A batched scorer for the strategies: mean accuracy (plus ``tie_break`` x mean margin) of each head set.

    Accuracy moves in steps of 1/n; the small margin term orders sets with equal accuracy.
    """
    from .screening import evaluate_head_sets

    def score(sets):
        res = evaluate_head_sets(lm, enc, [list(s) for s in sets], mode=mode, means=means, progress=progress,
                                 desc=f"evaluating {len(sets)} head sets")
        if by == "margin":
            return list(res.mean_margin)
        return list(res.accuracy + tie_break * res.mean_margin)

    return score


def search_heads(lm, search_task, heldout_task, pool, strategy: str = "greedy", max_size: int = 3, width: int = 4,
                 random_sets: int = 100, mode: str = "zero", seed: int = 0, n_boot: int = 2000) -> dict:
    """Search on one split, report every best-per-size set on held-out items with a paired bootstrap CI,
    and the same for ``random_sets`` random head sets of each size drawn from all heads (the control)."""
    import time


    from .ablation import format_heads
    from .scoring import encode_task
    from .screening import evaluate_head_sets
    from .stats import paired_bootstrap_many

    strategies = {"exhaustive": lambda p, s: exhaustive(p, s, max_size),
                  "greedy": lambda p, s: greedy(p, s, max_size),
                  "beam": lambda p, s: beam(p, s, width, max_size)}
    if strategy not in strategies:
        from .errors import CELError

        raise CELError(f"unknown strategy {strategy!r}; use exhaustive, greedy or beam")
    enc_s, enc_h = encode_task(lm, search_task), encode_task(lm, heldout_task)
    t0 = time.perf_counter()
    res = strategies[strategy](list(pool), model_scorer(lm, enc_s, mode=mode))
    secs = time.perf_counter() - t0
    sizes = sorted(k for k in res.best if k > 0)
    best_sets = [list(res.best[k].heads) for k in sizes]
    members = sorted({h for hs in best_sets for h in hs})
    s_res = evaluate_head_sets(lm, enc_s, [[]] + best_sets + [[h] for h in members], mode=mode, progress=False)
    single = {h: float(s_res.accuracy[1 + len(best_sets) + i] - s_res.accuracy[0]) for i, h in enumerate(members)}
    h_res = evaluate_head_sets(lm, enc_h, [[]] + best_sets, mode=mode, progress=False)
    ci = paired_bootstrap_many(h_res.correct[0].astype(float), h_res.correct[1:].astype(float), n_boot=n_boot,
                               seed=seed)
    rc = random_control(lm, enc_h, sizes, random_sets, mode=mode, seed=seed)
    controls = [{"size": k, "heldout_delta_accuracy": g["heldout_delta_accuracy"].tolist()}
                for k, g in rc.groupby("size")]
    best = []
    for j, k in enumerate(sizes):
        best.append({"size": k, "heads": format_heads(best_sets[j]).split(","),
                     "search": {"accuracy": float(s_res.accuracy[j + 1]), "mean_margin": float(s_res.mean_margin[j + 1]),
                                "delta_accuracy": float(s_res.accuracy[j + 1] - s_res.accuracy[0]),
                                "sum_of_singles_delta_accuracy": sum(single[h] for h in best_sets[j]),
                                "interaction": float(s_res.accuracy[j + 1] - s_res.accuracy[0])
                                - sum(single[h] for h in best_sets[j])},
                     "heldout": {"accuracy": float(h_res.accuracy[j + 1]), "mean_margin": float(h_res.mean_margin[j + 1]),
                                 "delta_accuracy": float(ci["delta"][j]), "ci_low": float(ci["ci_low"][j]),
                                 "ci_high": float(ci["ci_high"][j])}})
        ctrl = controls[j]["heldout_delta_accuracy"] if random_sets > 0 else []
        best[-1]["heldout"]["random_percentile"] = percentile_among(ctrl, ci["delta"][j]) if ctrl else None
    return {"strategy": strategy, "pool": format_heads(pool).split(","), "n_evaluations": res.n_evaluations,
            "search_seconds": secs, "baseline": {"search_accuracy": float(s_res.accuracy[0]),
                                                 "heldout_accuracy": float(h_res.accuracy[0])},
            "best": best, "random_control": controls}


# ---------------------------------------------------------------------------------------------
# Chapter 2: every subset of a small pool, strategies on top of it, controls, cross-task cost
# ---------------------------------------------------------------------------------------------
def percentile_among(control, value: float) -> float:
    """Mid-rank percentile of ``value`` among control values: ties count half (so a value equal to every
    control sits at 50, not 0 or 100).

    Example:
        >>> percentile_among([0.0, 0.0, 0.1, 0.2], 0.1)
        62.5
        >>> percentile_among([0, 0], 0)
        50.0
    """
    c = np.asarray(control, dtype=float)
    if c.size == 0:
        return float("nan")
    tie = np.abs(c - value) <= 1e-9
    return float(((c < value) & ~tie).sum() + 0.5 * tie.sum()) / c.size * 100


def random_control(lm, enc, sizes: Sequence[int], n_sets: int, mode: str = "zero", seed: int = 0,
                   progress: bool = False):
    """``n_sets`` random head sets of each size, drawn from all heads, evaluated on ``enc`` (one batched call):
    a tidy table of ``size``, ``heads`` and ``heldout_delta_accuracy`` (change against the unablated model)."""
    import pandas as pd

    from .ablation import all_heads, head_name
    from .screening import evaluate_head_sets

    cols = ["size", "heads", "heldout_delta_accuracy"]
    if n_sets <= 0:
        return pd.DataFrame(columns=cols)
    rng = np.random.default_rng(seed)
    everything = all_heads(lm)
    rsets = [(k, [everything[i] for i in rng.choice(len(everything), k, replace=False)])
             for k in sizes for _ in range(n_sets)]
    rr = evaluate_head_sets(lm, enc, [[]] + [s for _, s in rsets], mode=mode, progress=progress,
                            desc=f"{len(rsets)} random sets, held-out split")
    return pd.DataFrame([(k, ",".join(head_name(h) for h in s), float(rr.accuracy[j + 1] - rr.accuracy[0]))
                         for j, (k, s) in enumerate(rsets)], columns=cols)


def subset_masks(m: int) -> list[int]:
    """Bitmasks of all subsets of a pool of ``m`` heads, ordered by size then mask (bit i = pool[i])."""
    return sorted(range(2 ** m), key=lambda s: (bin(s).count("1"), s))


def _heads_of(mask: int, pool) -> tuple:
    return tuple(sorted(pool[i] for i in range(len(pool)) if mask >> i & 1))


@dataclass
class JointSearch:
    """Every subset of a candidate pool evaluated on both splits, and what the strategies find in it.

    ``subsets``: one row per subset (``mask``, ``heads``, ``size``, search and held-out accuracy / margin and
    their changes against the unablated model, ``sum_of_singles`` and ``interaction`` on the search split,
    ``search_score`` = search accuracy + ``TIE_BREAK`` x search margin, what the strategies maximise).
    ``strategies``: per strategy, the best set per size it finds on the search split and its evaluation count.
    ``best``: the best-by-search set of each size (exhaustive) with a held-out paired-bootstrap 95% CI.
    ``random_control``: held-out accuracy change of random head sets of each reported size, from all heads.
    """

    model: str
    task: str
    pool: list
    subsets: "object"  # pandas.DataFrame
    heldout_correct: np.ndarray  # [2^m, n_heldout] per-item correctness, rows in ``subsets`` order
    strategies: "object"  # pandas.DataFrame
    best: "object"  # pandas.DataFrame
    random_control: "object"  # pandas.DataFrame
    seconds_per_evaluation: float
    n_search: int
    n_heldout: int

    def smallest_helpful(self):
        """The smallest best-by-search set whose held-out CI lies above zero, or None (an honest 'none')."""
        ok = self.best[(self.best["size"] > 0) & (self.best["ci_low"] > 0)]
        return None if ok.empty else ok.iloc[0]

    def chosen(self):
        """The set a practitioner would take, chosen on the search split only: the best-by-search set of any
        size >= 1 (highest search accuracy; ties go to the smaller set), or None when no set improves the
        search split. Its held-out row is the honest figure."""
        b = self.best[self.best["size"] > 0]
        row = b.loc[b["search_accuracy"].idxmax()]  # idxmax takes the first (smallest) on ties
        return row if row["search_delta_accuracy"] > 0 else None  # nothing helps even on the search split

    def explorer_data(self) -> dict:
        """What the kernel-free explorer needs: pool names and, per subset mask, the exact figures."""
        from .ablation import head_name

        rows = {}
        for r in self.subsets.itertuples():
            rows[int(r.mask)] = [round(float(r.search_accuracy), 4), round(float(r.heldout_accuracy), 4),
                                 round(float(r.search_margin), 4), round(float(r.heldout_margin), 4)]
        return {"model": self.model, "task": self.task, "pool": [head_name(h) for h in self.pool],
                "n_search": self.n_search, "n_heldout": self.n_heldout, "subsets": rows}


def joint_search(lm, search_task, heldout_task, pool, max_size: int = 3, beam_width: int = 3,
                 random_sets: int = 100, mode: str = "zero", seed: int = 0, n_boot: int = 2000,
                 progress: bool = True) -> JointSearch:
    """Evaluate every subset of ``pool`` (m <= 10) on the search and held-out splits, then run the strategies.

    The strategies (exhaustive up to ``max_size``, greedy, beam) run on the search-split figures of the sweep:
    the model is deterministic, so looking a set up is the same as evaluating it, and each strategy's cost is
    its evaluation count (x the measured seconds per evaluation). Held-out figures are never used to choose.

    Example (tiny random model, so the numbers mean nothing):
        >>> from cel_utils.search import joint_search   # doctest: +SKIP
        >>> js = joint_search(lm, load_task("ioi", n=20), load_task("ioi", "heldout", n=20), [(0, 1), (1, 0)])  # doctest: +SKIP
        >>> len(js.subsets)   # doctest: +SKIP
        4
    """
    import time

    import pandas as pd

    from .ablation import head_name
    from .scoring import encode_task
    from .screening import evaluate_head_sets
    from .stats import paired_bootstrap_many

    pool = [tuple(h) for h in pool]
    m = len(pool)
    if not 1 <= m <= 10:
        raise ValueError(f"the pool must hold 1 to 10 heads (2^m subsets), got {m}")
    if len(set(pool)) != m:
        raise ValueError("the candidate pool has duplicates")
    max_size = min(max_size, m)
    enc_s, enc_h = encode_task(lm, search_task), encode_task(lm, heldout_task)
    masks = subset_masks(m)
    sets = [_heads_of(s, pool) for s in masks]
    t0 = time.perf_counter()
    rs = evaluate_head_sets(lm, enc_s, [list(s) for s in sets], mode=mode, progress=progress,
                            desc=f"{len(sets)} subsets, search split")
    rh = evaluate_head_sets(lm, enc_h, [list(s) for s in sets], mode=mode, progress=progress,
                            desc=f"{len(sets)} subsets, held-out split")
    per_eval = (time.perf_counter() - t0) / (2 * len(sets))
    tab = pd.DataFrame({"mask": masks, "heads": [",".join(head_name(h) for h in s) for s in sets],
                        "size": [len(s) for s in sets],
                        "search_accuracy": rs.accuracy, "search_margin": rs.mean_margin,
                        "heldout_accuracy": rh.accuracy, "heldout_margin": rh.mean_margin})
    for split in ("search", "heldout"):
        tab[f"{split}_delta_accuracy"] = tab[f"{split}_accuracy"] - tab[f"{split}_accuracy"].iloc[0]
        tab[f"{split}_delta_margin"] = tab[f"{split}_margin"] - tab[f"{split}_margin"].iloc[0]
    single = {int(r.mask): r.search_delta_accuracy for r in tab[tab["size"] == 1].itertuples()}
    tab["sum_of_singles"] = [sum(single[1 << i] for i in range(m) if s >> i & 1) for s in masks]
    tab["interaction"] = tab["search_delta_accuracy"] - tab["sum_of_singles"]

    # strategies on the search-split figures (accuracy, margin as tie-break)
    tab["search_score"] = tab["search_accuracy"] + TIE_BREAK * tab["search_margin"]
    score_of = dict(zip(sets, tab["search_score"]))
    scorer = lambda ss: [score_of[tuple(sorted(s))] for s in ss]  # noqa: E731
    runs = {"exhaustive": exhaustive(pool, scorer, max_size), "greedy": greedy(pool, scorer, max_size),
            "beam": beam(pool, scorer, beam_width, max_size)}
    row_of = {s: i for i, s in enumerate(sets)}
    strat = []
    for name, res in runs.items():
        for k, sc in sorted(res.best.items()):
            if k == 0:
                continue
            i = row_of[tuple(sorted(sc.heads))]
            strat.append({"strategy": name, "size": k, "heads": tab["heads"].iloc[i],
                          "search_delta_accuracy": tab["search_delta_accuracy"].iloc[i],
                          "heldout_delta_accuracy": tab["heldout_delta_accuracy"].iloc[i],
                          "n_evaluations": res.n_evaluations,
                          "est_seconds": res.n_evaluations * per_eval})
    strategies = pd.DataFrame(strat)

    # best set per size (exhaustive over the whole pool), held-out CI
    best_rows = [0] + [row_of[tuple(sorted(runs["exhaustive"].best[k].heads))] for k in range(1, max_size + 1)]
    ci = paired_bootstrap_many(rh.correct[0].astype(float), rh.correct[best_rows].astype(float), n_boot=n_boot,
                               seed=seed)
    best = tab.iloc[best_rows][["heads", "size", "search_accuracy", "search_delta_accuracy", "heldout_accuracy",
                                "heldout_delta_accuracy", "interaction"]].reset_index(drop=True)
    best["ci_low"], best["ci_high"] = ci["ci_low"], ci["ci_high"]

    # random control: held-out change of random sets of each reported size, drawn from all heads
    random_control_ = random_control(lm, enc_h, range(1, max_size + 1), random_sets, mode=mode, seed=seed,
                                     progress=progress)
    pct = []
    for r in best.itertuples():
        d = random_control_[random_control_["size"] == r.size]["heldout_delta_accuracy"].to_numpy()
        pct.append(percentile_among(d, r.heldout_delta_accuracy))
    best["random_percentile"] = pct
    return JointSearch(model=lm.name, task=search_task.name, pool=pool, subsets=tab,
                       heldout_correct=rh.correct, strategies=strategies, best=best,
                       random_control=random_control_, seconds_per_evaluation=per_eval,
                       n_search=enc_s.n_items, n_heldout=enc_h.n_items)


def cross_task(lm, head_sets: dict, tasks: dict, mode: str = "zero", n_boot: int = 2000, seed: int = 0,
               progress: bool = False):
    """Each named head set evaluated on every task: a tidy table (set, task, baseline, accuracy, change, CI).

    Example:
        >>> cross_task(lm, {"best for addition": [(13, 0)]}, {"addition": task_a, "ioi": task_b})  # doctest: +SKIP
    """
    import pandas as pd

    from .scoring import encode_task
    from .screening import evaluate_head_sets
    from .stats import paired_bootstrap_many

    names = list(head_sets)
    rows = []
    for tname, task in tasks.items():
        enc = encode_task(lm, task)
        r = evaluate_head_sets(lm, enc, [[]] + [list(head_sets[n]) for n in names], mode=mode, progress=progress)
        ci = paired_bootstrap_many(r.correct[0].astype(float), r.correct[1:].astype(float), n_boot=n_boot, seed=seed)
        for j, n in enumerate(names):
            rows.append({"set": n, "task": tname, "baseline": float(r.accuracy[0]),
                         "accuracy": float(r.accuracy[j + 1]), "delta_accuracy": float(ci["delta"][j]),
                         "ci_low": float(ci["ci_low"][j]), "ci_high": float(ci["ci_high"][j]),
                         "delta_margin": float(r.mean_margin[j + 1] - r.mean_margin[0])})
    return pd.DataFrame(rows)
