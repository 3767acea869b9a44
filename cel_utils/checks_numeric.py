"""Checks for the "implement it yourself" exercises that need no model: numbers and small tables.

Each ``check_*`` calls the learner's function on fixed cases and compares it with an independent reference (scipy
where one exists, else the library's own function), raising an ``AssertionError`` whose first line says which case
failed and how (the autograder, :mod:`cel_utils.exercises`, prints that line). The model-based checks are in
:mod:`cel_utils.checks`.

* :func:`check_bh` (chapter 1a): Benjamini-Hochberg q-values, against ``scipy.stats.false_discovery_control``;
* :func:`check_reading` (chapter 1c): a check's reading (holds / fails / cannot tell) from per-item differences,
  against :func:`cel_utils.labels.check`;
* :func:`check_greedy` (chapter 2): forward selection's path, against :func:`cel_utils.search.greedy`;
* :func:`check_direct` (chapter 2a): direct contributions to a logit difference through a frozen final norm;
* :func:`check_equal_rate_null` (chapter 2b): the per-item ceiling's equal-rate null, against its closed form;
* :func:`check_kind` (chapter 3a): what a removal does to two tasks, against :func:`cel_utils.rival.kind_of`;
* :func:`check_interaction` (chapter 2): a set's interaction on per-item margins, against
  :func:`cel_utils.joint.margin_interaction`;
* :func:`check_threshold` (chapter 3): task B's C-correlation where the joint optimum's C weight changes sign, against
  a root of :func:`cel_utils.theory.optimum` found by ``scipy.optimize.brentq``.

Example:
    >>> from scipy.stats import false_discovery_control
    >>> check_bh(lambda p: false_discovery_control(p, method="bh"))
    check_bh passed: 6 cases (1 to 40 p-values)
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy.optimize import brentq

from .joint import margin_interaction
from .labels import check as reading_check
from .rival import kind_of
from .search import greedy
from .theory import DEFAULT, Setup, optimum

# ---------------------------------------------------------------------------------------------------------
# chapter 1a: Benjamini-Hochberg
# ---------------------------------------------------------------------------------------------------------
BH_CASES = ([0.01, 0.04, 0.03, 0.5], [0.02, 0.02, 0.02], [0.3], [0.001, 0.04, 0.2, 1.0, 1.0],
            sorted(np.random.default_rng(0).uniform(0, 0.2, 12)), sorted(np.random.default_rng(1).beta(0.3, 2, 40)))


def _bh_hint(p: np.ndarray, got: np.ndarray) -> str:
    m = len(p)
    order = np.argsort(p)
    raw = np.empty(m)
    raw[order] = p[order] * m / np.arange(1, m + 1)
    if np.allclose(got, np.minimum(raw, 1)):
        return "Take the running minimum from the largest p-value down (q_(i) = min over j >= i of p_(j) m / j)."
    if np.allclose(got, np.minimum(p * m, 1)):
        return "That is Bonferroni (p m); BH divides by each p-value's rank: p_(i) m / i."
    if np.allclose(np.sort(got), np.sort(np.minimum(raw, 1))) or np.allclose(got, np.sort(got)) and m > 2:
        return "Return the q-values in the order of the p-values given (not sorted)."
    return "Sort the p-values, scale the i-th smallest by m / i, take the running minimum from the top, cap at 1."


def check_bh(fn: Callable, cases=BH_CASES) -> None:
    """Check ``fn(p) -> q``: the Benjamini-Hochberg adjusted p-values (q-values) of the p-values ``p``, in their
    order (chapter 1a's confirm step: a head is confirmed when its q-value is below the FDR level).
    Compared with ``scipy.stats.false_discovery_control(p, method="bh")``."""
    from scipy.stats import false_discovery_control

    for p in cases:
        p = np.asarray(p, float)
        out = np.asarray(fn(p.copy()), dtype=float).reshape(-1)
        if out.shape != p.shape:
            raise AssertionError(f"for {len(p)} p-values return {len(p)} q-values; got {out.size}")
        ref = false_discovery_control(p, method="bh")
        if not np.allclose(out, ref, rtol=0, atol=1e-12):
            i = int(np.argmax(np.abs(out - ref)))
            raise AssertionError(f"p-values {np.round(p[:6], 4).tolist()}{'...' if len(p) > 6 else ''}: your q-value "
                                 f"{i} is {out[i]:.4g}, BH gives {ref[i]:.4g}. " + _bh_hint(p, out))
    print(f"check_bh passed: {len(cases)} cases ({min(map(len, cases))} to {max(map(len, cases))} p-values)")


# ---------------------------------------------------------------------------------------------------------
# chapter 1c: a check's reading
# ---------------------------------------------------------------------------------------------------------
def reading_cases(seed: int = 0) -> list[tuple[np.ndarray, float]]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(0.3, 1, 200), 0.0), (rng.normal(-0.3, 1, 200), 0.0), (rng.normal(0.02, 1, 60), 0.0),
            (np.full(50, 0.1), 0.0), (np.zeros(40), 0.0),
            (rng.choice([-1.0, 0.0, 1.0], 150, p=[0.1, 0.7, 0.2]), 0.0), (np.array([1.0]), 0.0),
            (np.array([0.0, 0.2, 0.1]), 0.0)]   # three items: the t interval cannot tell, a z interval says holds


def check_reading(fn: Callable, cases=None) -> None:
    """Check ``fn(d, above) -> reading``: ``d`` holds per-item paired differences (a head's change in each item's
    correctness), ``above`` a threshold; return ``"holds"`` when the 95% t interval of the mean of ``d``
    (``scipy.stats.ttest_1samp(d, 0).confidence_interval(0.95)``) lies above ``above``, ``"fails"`` when it lies
    below, ``"cannot tell"`` otherwise; a constant ``d`` is its own interval, a single item has none (``"cannot
    tell"``). Compared with
    :func:`cel_utils.labels.check` (chapter 1c's rule: an interval that includes the threshold is never a "no")."""
    cases = reading_cases() if cases is None else cases
    for d, above in cases:
        got = fn(d.copy(), above)
        ref = reading_check(d, above=above)
        if got != ref["reading"]:
            hint = ("An interval that includes the threshold cannot tell: absence of significance is not evidence "
                    "of absence." if ref["reading"] == "cannot tell" else
                    "Read the interval, not the point estimate: holds needs its lower end above the threshold, "
                    "fails its upper end below.")
            raise AssertionError(f"{len(d)} differences, mean {d.mean():+.3f}, interval [{ref['ci_low']:+.3f}, "
                                 f"{ref['ci_high']:+.3f}], threshold {above}: you read {got!r}, the rule reads "
                                 f"{ref['reading']!r}. {hint}")
    print(f"check_reading passed: {len(cases)} cases (holds, fails and cannot tell)")


# ---------------------------------------------------------------------------------------------------------
# chapter 2: forward selection
# ---------------------------------------------------------------------------------------------------------
def pair_score(single: dict, pairs: dict) -> Callable:
    return lambda s: sum(single[h] for h in s) + sum(v for (a, b), v in pairs.items() if a in s and b in s)


GREEDY_CASES = (
    ("additive", list("abcde"), pair_score(dict(a=0.1, b=0.4, c=-0.2, d=0.3, e=0.05), {}), 3),
    ("a pair that helps only together", list("abcd"),
     pair_score(dict(a=0.2, b=0.0, c=0.0, d=-0.1), {("b", "c"): 0.5, ("a", "b"): -0.3}), 4),
    ("heads that clash", list("abcd"), pair_score(dict(a=0.2, b=0.15, c=0.1, d=0.0), {("a", "b"): -0.3}), 4),
    ("nothing helps", list("abc"), pair_score(dict(a=-0.1, b=-0.2, c=-0.3), {}), 3),
)


def check_greedy(fn: Callable, cases=GREEDY_CASES) -> None:
    """Check ``fn(pool, score, max_size) -> path``: forward selection over the heads of ``pool`` with ``score(set)
    -> float`` (a set is a tuple of heads, sorted); ``path`` is the list of sets it moves through, from ``()``:
    at each step add the head whose set scores highest (ties: the earlier head of the pool), and stop at
    ``max_size`` heads or when the best addition does not raise the score. Compared with
    :func:`cel_utils.search.greedy` (chapter 2's ``greedy`` strategy)."""
    for name, pool, score, max_size in cases:
        ref = [tuple(s.heads) for s in greedy(pool, lambda sets: [score(s) for s in sets], max_size=max_size).path]
        got = [tuple(sorted(s)) for s in fn(list(pool), lambda s: score(tuple(sorted(s))), max_size)]
        if got != ref:
            hint = ("Start the path at the empty set ()." if got and got[0] != () else
                    "Stop when the best addition does not raise the score." if len(got) > len(ref) else
                    "Score the set with the head added, not the head alone: heads can help only together.")
            raise AssertionError(f"case '{name}' (pool {pool}, max_size {max_size}): your path is {got}, forward "
                                 f"selection's is {ref}. {hint}")
    print(f"check_greedy passed: {len(cases)} cases")


# ---------------------------------------------------------------------------------------------------------
# chapter 2a: direct contributions through a frozen final norm
# ---------------------------------------------------------------------------------------------------------
def direct_cases(seed: int = 0, rest: float = 0.0) -> list[tuple]:
    """Components' outputs with the frozen scale of the whole residual: theirs plus, when ``rest`` is not 0, a
    component left out of ``outs`` (the embeddings, say) of that size."""
    rng = np.random.default_rng(seed)
    out = []
    for n, d in ((3, 8), (7, 16), (1, 4)):
        outs = rng.normal(0, 1, (n, d))
        rms = float(np.sqrt(((outs.sum(0) + rest * rng.normal(0, 1, d)) ** 2).mean() + 1e-6))
        out.append((outs, 1.0 / rms, rng.normal(1, 0.2, d), rng.normal(0, 1, d)))
    return out


def check_direct(fn: Callable, cases=None) -> None:
    """Check ``fn(outs, scale, gamma, w_diff) -> contributions``: ``outs`` ``[n_components, d_model]`` are the
    components' outputs that sum to the final residual, ``scale`` the final RMS norm's ``1 / rms`` of that residual
    (frozen: computed once, on the whole residual), ``gamma`` ``[d_model]`` the norm's weight and ``w_diff``
    ``[d_model]`` the unembedding of the right answer minus the wrong one; return each component's direct
    contribution to the logit difference ``[n_components]``, which add up to the whole logit difference (of the
    residual's part that ``outs`` covers: ``scale`` may come from components not in ``outs``)."""
    cases = direct_cases() if cases is None else cases
    for outs, scale, gamma, w_diff in cases:
        ref = (outs * scale * gamma) @ w_diff
        got = np.asarray(fn(outs.copy(), scale, gamma.copy(), w_diff.copy()), dtype=float).reshape(-1)
        if got.shape != ref.shape:
            raise AssertionError(f"for {len(outs)} components return {len(outs)} numbers; got {got.size}")
        if not np.allclose(got, ref, rtol=1e-6, atol=1e-9):
            own = np.array([(o / np.sqrt((o ** 2).mean() + 1e-6) * gamma) @ w_diff for o in outs])
            hint = ("Each component is scaled by the whole residual's norm, frozen, not by its own: then the "
                    "contributions add up to the logit difference." if np.allclose(got, own, rtol=1e-4) else
                    "Multiply by the norm's weight gamma too." if np.allclose(got, (outs * scale) @ w_diff) else
                    "Contribution_i = sum over d of outs[i, d] * scale * gamma[d] * w_diff[d].")
            raise AssertionError(f"{len(outs)} components of width {outs.shape[1]}: yours {np.round(got, 4).tolist()}"
                                 f", expected {np.round(ref, 4).tolist()}. {hint}")
    print(f"check_direct passed: {len(cases)} cases; the contributions add up to the logit difference")


# ---------------------------------------------------------------------------------------------------------
# chapter 2b: the per-item ceiling's equal-rate null
# ---------------------------------------------------------------------------------------------------------
NULL_CASES = (([3, 1, 0, 8], 12), ([2, 2, 2], 10), ([5], 5), ([0, 0], 7), ([1, 9, 4, 4, 0, 2], 32))


def check_equal_rate_null(fn: Callable, cases=NULL_CASES, as_list: bool = False) -> None:
    """Check ``fn(fixes, n_wrong) -> share``: ``fixes`` holds how many of ``n_wrong`` wrong items each head's
    removal fixes; under the equal-rate null every head fixes every wrong item independently with the same
    probability ``p = mean(fixes) / n_wrong``, so the expected share of wrong items some head fixes is
    ``1 - (1 - p) ** k`` for ``k`` heads. Compared with that closed form. ``as_list``: ``fixes`` passed as a list
    (as a chapter's JSON record holds it), not an array."""
    for fixes, n in cases:
        k, p = len(fixes), float(np.mean(fixes)) / n
        want = 1 - (1 - p) ** k
        got = float(fn(list(fixes) if as_list else np.asarray(fixes), n))
        if not np.isclose(got, want, rtol=1e-9, atol=1e-12):
            per_head = 1 - float(np.prod(1 - np.asarray(fixes, float) / n))
            hint = ("That is each head at its own rate, the permutation null's mean; the equal-rate null gives every "
                    "head the mean rate." if np.isclose(got, per_head) else
                    "An item is fixed by some head unless every head misses it: 1 - (1 - p) ** k.")
            raise AssertionError(f"case fixes {list(fixes)} of {n} wrong items: your share is {got:.6f}, the "
                                 f"equal-rate null's is {want:.6f}. {hint}")
    print(f"check_equal_rate_null passed: {len(cases)} cases")


# ---------------------------------------------------------------------------------------------------------
# chapter 3a: what a removal does to two tasks
# ---------------------------------------------------------------------------------------------------------
KIND_CASES = (([0.1, 0.1, 0.0, 0.05], [-0.1, 0.0, -0.1, -0.01], 0.02),
              ([0.02, 0.021, 0.5, 0.5], [-0.5, -0.021, -0.02, -0.3], 0.02))


def check_kind(fn: Callable, cases=KIND_CASES) -> None:
    """Check ``fn(gain_a, change_b, eps) -> kinds``: per removal, ``two-sided`` when task A gains more than
    ``eps`` and task B loses more than ``eps`` (each change signed so that positive is better), ``one-sided`` when
    A gains more than ``eps`` and B does not lose more than ``eps``, else ``none``; compared with
    :func:`cel_utils.rival.kind_of` (chapter 3a's classification)."""
    for a, b, eps in cases:
        want = kind_of(a, b, eps).tolist()
        got = [str(x) for x in fn(np.asarray(a), np.asarray(b), eps)]
        if got != want:
            i = next(j for j, (x, y) in enumerate(zip(got, want)) if x != y) if len(got) == len(want) else 0
            raise AssertionError(f"removal {i} (A gains {a[i]:+g}, B changes {b[i]:+g}, eps {eps:g}): yours says "
                                 f"{got[i] if i < len(got) else None!r}, the accounts' definition {want[i]!r}. A "
                                 "change counts only when it is more than eps; B's change is signed (positive is "
                                 "better).")
    print(f"check_kind passed: {len(cases)} cases")


# ---------------------------------------------------------------------------------------------------------
# chapter 2: a set's interaction on margins
# ---------------------------------------------------------------------------------------------------------
def interaction_case(seed: int, k: int, n: int) -> tuple:
    rng = np.random.default_rng(seed)
    base = rng.normal(1.0, 1.0, n)                       # [n_items] the intact model's margins
    singles = base + rng.normal(0.2, 0.5, (k, n))        # [k, n_items] each head removed alone
    joint = base + (singles - base).sum(0) + rng.normal(0.1, 0.3, n)   # [n_items] all k removed together
    return base, joint, singles


INTERACTION_CASES = tuple(interaction_case(s, 2, n) for s, n in ((0, 12), (1, 40), (2, 5)))


def check_interaction(fn: Callable, cases=INTERACTION_CASES, as_list: bool = False) -> None:
    """Check ``fn(base, joint, singles) -> interaction``: ``base`` and ``joint`` are per-item margins ``[n_items]``
    of the intact model and of the set removed, ``singles`` ``[n_heads, n_items]`` of each head removed alone; the
    interaction is the mean over items of (the set's change) - (the sum of its heads' changes). Compared with
    :func:`cel_utils.joint.margin_interaction`. ``as_list``: every argument a plain list (as a record holds it)."""
    for i, (base, joint, singles) in enumerate(cases):
        want = margin_interaction(base, joint, singles, n_boot=200)[0]
        args = (base.tolist(), joint.tolist(), singles.tolist()) if as_list else (base, joint, singles)
        got = float(fn(*args))
        if not np.isclose(got, want, rtol=1e-9, atol=1e-12):
            once = float(np.mean(joint - singles.sum(0)))
            hint = ("That subtracts the intact margins once; each head's change is its margin minus the intact one, "
                    "so the intact margins enter once per head." if np.isclose(got, once) else
                    "Each change is measured from the intact model: (joint - base) - sum over heads of (single - base).")
            raise AssertionError(f"case {i} ({singles.shape[0]} heads, {len(base)} items): your interaction is "
                                 f"{got:.6f}, the set's is {want:.6f}. {hint}")
    print(f"check_interaction passed: {len(cases)} cases")


# ---------------------------------------------------------------------------------------------------------
# chapter 3: where the joint optimum's C weight changes sign
# ---------------------------------------------------------------------------------------------------------
def c_weight_root(setup: Setup) -> float:
    """Task B's C-correlation at which the joint optimum's C weight is 0, the rest of ``setup`` kept.

    Example:
        >>> round(c_weight_root(DEFAULT), 2)
        -0.37
    """
    def w_c(rb: float) -> float:
        rho_b = list(setup.rho_b)
        rho_b[2] = rb
        return float(optimum(Setup(rho_a=setup.rho_a, rho_b=tuple(rho_b), m=setup.m))[0][2])
    return float(brentq(w_c, -1.0, 1.0, xtol=1e-6))


THRESHOLD_CASES = (("the chapter's set-up", DEFAULT), ("A's C-correlation 0.3", Setup(rho_a=(0.8, 0.0, 0.3, 0.0))))


def check_threshold(fn: Callable, cases=THRESHOLD_CASES, tol: float = 0.01) -> None:
    """Check ``fn(setup) -> threshold``: the value of task B's C-correlation (``setup.rho_b[2]``; the other
    correlations and ``m`` as in ``setup``) at which the joint optimum's C weight :math:`W^*_C` changes sign,
    within ``tol``; compared with :func:`c_weight_root`."""
    for name, setup in cases:
        want = c_weight_root(setup)
        got = float(fn(setup))
        if abs(got - want) > tol:
            hint = ("That is minus A's C-correlation: the tasks' other features and the distractors move the root."
                    if np.isclose(got, -setup.rho_a[2], atol=tol) else
                    "Find where theory.optimum(...)[0][2] changes sign as task B's C-correlation varies (a grid, then "
                    "bisection or scipy.optimize.brentq).")
            raise AssertionError(f"{name} (rho_a {setup.rho_a}, m {setup.m}): your threshold is {got:+.4f}, the "
                                 f"C weight changes sign at {want:+.4f}. {hint}")
    print(f"check_threshold passed: {len(cases)} set-ups")
