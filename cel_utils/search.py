"""Search strategies for joint ablation, on any scorer: which small sets, removed together, score best.

The strategies (exhaustive, greedy, beam) work on any scoring function ``score(head_sets) -> list of
floats`` (higher is better; one call may evaluate many sets, so a model-backed scorer can batch them: see
:func:`cel_utils.joint.model_scorer`). They know nothing of models and are tested on synthetic functions with
a known best set. The model-backed joint search is in :mod:`cel_utils.joint`.

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

from .defaults import BEAM_WIDTH

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


class MemoEvaluator:
    """Wraps a scorer: evaluates each distinct set once (``memo``) and counts the evaluations (``n``)."""

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
    ev = MemoEvaluator(score)
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
    ev = MemoEvaluator(score)
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


def beam(pool: Sequence[Hashable], score: Scorer, width: int = BEAM_WIDTH, max_size: int | None = None) -> SearchResult:
    """Beam search: keep the ``width`` best sets of each size and extend each by one head."""
    max_size = len(pool) if max_size is None else min(max_size, len(pool))
    _check(pool, max(max_size, 1))
    if width < 1:
        raise ValueError("beam width must be at least 1")
    ev = MemoEvaluator(score)
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


def subset_masks(m: int) -> list[int]:
    """Bitmasks of all subsets of a pool of ``m`` heads, ordered by size then mask (bit i = pool[i])."""
    return sorted(range(2 ** m), key=lambda s: (bin(s).count("1"), s))


def heads_of(mask: int, pool) -> tuple:
    """The heads of ``pool`` that a subset bitmask selects, sorted."""
    return tuple(sorted(pool[i] for i in range(len(pool)) if mask >> i & 1))
