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
def model_scorer(lm, enc, mode: str = "zero", means=None, by: str = "accuracy", tie_break: float = 1e-3,
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

    import numpy as np

    from .ablation import all_heads, format_heads
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
    s_res = evaluate_head_sets(lm, enc_s, [[]] + best_sets, mode=mode, progress=False)
    h_res = evaluate_head_sets(lm, enc_h, [[]] + best_sets, mode=mode, progress=False)
    ci = paired_bootstrap_many(h_res.correct[0].astype(float), h_res.correct[1:].astype(float), n_boot=n_boot,
                               seed=seed)
    rng = np.random.default_rng(seed)
    everything = all_heads(lm)
    controls = []
    for k in sizes:
        sets = [[everything[i] for i in rng.choice(len(everything), k, replace=False)] for _ in range(random_sets)]
        r = evaluate_head_sets(lm, enc_h, [[]] + sets, mode=mode, progress=False)
        controls.append({"size": k, "heldout_delta_accuracy": [float(x) for x in r.accuracy[1:] - r.accuracy[0]]})
    best = []
    for j, k in enumerate(sizes):
        best.append({"size": k, "heads": format_heads(best_sets[j]).split(","),
                     "search": {"accuracy": float(s_res.accuracy[j + 1]), "mean_margin": float(s_res.mean_margin[j + 1]),
                                "delta_accuracy": float(s_res.accuracy[j + 1] - s_res.accuracy[0])},
                     "heldout": {"accuracy": float(h_res.accuracy[j + 1]), "mean_margin": float(h_res.mean_margin[j + 1]),
                                 "delta_accuracy": float(ci["delta"][j]), "ci_low": float(ci["ci_low"][j]),
                                 "ci_high": float(ci["ci_high"][j])}})
    return {"strategy": strategy, "pool": format_heads(pool).split(","), "n_evaluations": res.n_evaluations,
            "search_seconds": secs, "baseline": {"search_accuracy": float(s_res.accuracy[0]),
                                                 "heldout_accuracy": float(h_res.accuracy[0])},
            "best": best, "random_control": controls}
