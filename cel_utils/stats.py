"""Paired statistics over items: bootstrap confidence intervals, exact tests on flips, multiplicity, power.

* :func:`paired_bootstrap`, :func:`paired_bootstrap_many`: percentile CIs of a paired mean difference.
* :func:`fixes_breaks`, :func:`mcnemar_exact`: the exact McNemar test on the items an ablation fixes
  (wrong -> right) and breaks (right -> wrong) -- outcomes are binary, so no resampling floor on p.
* :func:`benjamini_hochberg` (``scipy.stats.false_discovery_control``), :func:`holm` (family-wise).
* :func:`mcnemar_power`, :func:`min_detectable_gain`: exact power of that test, and the smallest accuracy
  gain it detects with a given power.

Example:
    >>> import numpy as np
    >>> from cel_utils.stats import paired_bootstrap
    >>> base = np.array([0, 1, 0, 1, 0, 1, 0, 0] * 10, dtype=float)
    >>> r = paired_bootstrap(base, base, seed=0)
    >>> r["delta"], r["ci_low"] <= 0 <= r["ci_high"]
    (0.0, True)
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .defaults import ALPHA, N_BOOT


def paired_bootstrap(base: np.ndarray, ablated: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                     alpha: float = ALPHA) -> dict:
    """Bootstrap over items of mean(ablated - base): point estimate, percentile CI, two-sided p-value.

    ``base`` and ``ablated`` are per-item values ``[n_items]`` on the *same* items (paired).
    The p-value is the bootstrap estimate of P(delta has the other sign than observed), doubled.
    """
    d = np.asarray(ablated, dtype=float) - np.asarray(base, dtype=float)
    n = len(d)
    if n == 0:
        raise ValueError("no items")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    boots = d[idx].mean(axis=1)
    est = float(d.mean())
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    if np.all(d == 0):
        p = 1.0
    else:
        # centred bootstrap: how often a resample of the null-shifted deltas is as extreme as observed
        p = float(min(1.0, (np.sum(np.abs(boots - est) >= abs(est)) + 1) / (n_boot + 1)))
    return {"delta": est, "ci_low": float(lo), "ci_high": float(hi), "p_value": p}


def paired_bootstrap_many(base: np.ndarray, ablated: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                          alpha: float = ALPHA) -> dict[str, np.ndarray]:
    """Vectorised :func:`paired_bootstrap` for many rows: ``base [n_items]``, ``ablated [rows, n_items]``.

    All rows use the same resamples of items (so rows are comparable).
    """
    d = np.asarray(ablated, dtype=float) - np.asarray(base, dtype=float)[None]
    rows, n = d.shape
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    # resample counts per item: boots = d @ counts / n, without materialising [rows, n_boot, n]
    counts = np.zeros((n_boot, n))
    np.add.at(counts, (np.repeat(np.arange(n_boot), n), idx.ravel()), 1.0)
    boots = d @ counts.T / n  # [rows, n_boot]
    est = d.mean(axis=1)
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2], axis=1)
    extreme = (np.abs(boots - est[:, None]) >= np.abs(est)[:, None]).sum(axis=1)
    p = np.minimum(1.0, (extreme + 1) / (n_boot + 1))
    p = np.where(np.all(d == 0, axis=1), 1.0, p)
    return {"delta": est, "ci_low": lo, "ci_high": hi, "p_value": p}


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg q-values (false-discovery-rate adjusted p-values), from scipy."""
    from scipy.stats import false_discovery_control

    p = np.asarray(p, dtype=float)
    return p.copy() if len(p) == 0 else false_discovery_control(p, method="bh")


def benjamini_yekutieli(p: np.ndarray) -> np.ndarray:
    """Benjamini-Yekutieli q-values, from scipy: BH's times sum(1/i), valid under any dependence between the tests
    (the confirm tests share their items), so a sensitivity check beside BH.

        >>> [round(float(x), 4) for x in benjamini_yekutieli([0.01, 0.02])]
        [0.03, 0.03]
    """
    from scipy.stats import false_discovery_control

    p = np.asarray(p, dtype=float)
    return p.copy() if len(p) == 0 else false_discovery_control(p, method="by")


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: reject ``adjusted < alpha`` controls the family-wise error rate.

    Written here because scipy has no Holm adjustment (``false_discovery_control`` offers BH and BY only).

    Example:
        >>> holm(np.array([0.01, 0.04, 0.03])).round(3).tolist()
        [0.03, 0.06, 0.06]
    """
    p = np.asarray(p, dtype=float)
    m = len(p)
    if m == 0:
        return p.copy()
    order = np.argsort(p)
    adj = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return out


def fixes_breaks(base: np.ndarray, ablated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``ablated [rows, n_items]`` (bool), the items it fixes (wrong -> right) and breaks."""
    base = np.asarray(base, bool)[None]
    ablated = np.atleast_2d(np.asarray(ablated, bool))
    return (~base & ablated).sum(axis=1), (base & ~ablated).sum(axis=1)


def mcnemar_exact(fixes, breaks) -> np.ndarray:
    """Two-sided exact McNemar p-values: a binomial test of ``fixes`` among ``fixes + breaks`` discordant items
    at 1/2 (``scipy.stats.binomtest``); 1 when nothing flips.

    Example:
        >>> mcnemar_exact([5, 3], [0, 3]).round(4).tolist()
        [0.0625, 1.0]
    """
    from scipy.stats import binomtest

    f, b = np.atleast_1d(fixes).astype(int), np.atleast_1d(breaks).astype(int)
    return np.array([1.0 if x + y == 0 else binomtest(int(x), int(x + y), 0.5).pvalue for x, y in zip(f, b)])


def _critical_fixes(d: np.ndarray, alpha: float) -> np.ndarray:
    """Smallest number of fixes among ``d`` discordant items that the two-sided exact test rejects at ``alpha``
    (``d + 1`` where no count can)."""
    table = _critical_fixes_upto(int(np.max(d)) if len(d) else 0, float(alpha))
    return table[np.asarray(d, dtype=int)]


@lru_cache(maxsize=256)
def _critical_fixes_upto(n_max: int, alpha: float) -> np.ndarray:
    """:func:`_critical_fixes` for every ``d`` in ``0..n_max`` at once (read-only, cached): the p-value
    ``min(1, 2 P(X >= f))``, ``X ~ Binomial(d, 1/2)``, falls as ``f`` rises past ``d / 2``, so the first ``f >= ceil(d / 2)``
    whose p-value is at most ``alpha`` is the critical count."""
    from scipy.stats import binom

    d, f = np.meshgrid(np.arange(n_max + 1), np.arange(n_max + 1), indexing="ij")  # [d, f]
    ok = (f >= d // 2 + 1) & (f <= d) & (np.minimum(1.0, 2 * binom.sf(f - 1, d, 0.5)) <= alpha)
    out = np.where(ok.any(axis=1), ok.argmax(axis=1), np.arange(n_max + 1) + 1)
    out.flags.writeable = False
    return out


def mcnemar_power(n: int, p_fix: float, p_break: float, alpha: float) -> float:
    """Exact power of the two-sided exact McNemar test at level ``alpha`` to find a gain on ``n`` items, when
    each item is fixed with probability ``p_fix`` and broken with probability ``p_break`` (counted only when the
    test rejects in the direction of a gain).

    The discordant count is ``D ~ Binomial(n, p_fix + p_break)`` and, given ``D = d``, the fixes are
    ``Binomial(d, p_fix / (p_fix + p_break))``: the sum over ``d`` is exact, no simulation.

    Example:
        >>> round(mcnemar_power(100, 0.10, 0.0, 0.05), 3)
        0.942
    """
    from scipy.stats import binom

    s = p_fix + p_break
    if s <= 0:
        return 0.0
    d = np.arange(n + 1)
    crit = _critical_fixes(d, alpha)
    return float(np.sum(binom.pmf(d, n, s) * binom.sf(crit - 1, d, p_fix / s)))


def min_detectable_gain(n: int, alpha: float, break_rate: float = 0.0, power: float = 0.8,
                        step: float = 0.0025) -> float:
    """The smallest accuracy gain ``g`` (on a grid of ``step``) that the exact McNemar test at ``alpha`` finds
    with at least ``power`` on ``n`` items, for an effect that fixes ``g + break_rate`` and breaks
    ``break_rate`` of the items, and for every larger gain on the grid (power is not monotone for a discrete
    test). ``inf`` when no gain up to ``1 - 2 break_rate`` is detectable.

    Example:
        >>> min_detectable_gain(100, 0.05)
        0.08
    """
    gains = np.arange(step, 1.0 - 2 * break_rate + 1e-12, step)
    ok = np.array([mcnemar_power(n, g + break_rate, break_rate, alpha) >= power for g in gains])
    if not ok.any() or not ok[-1]:
        return float("inf")
    last_fail = np.flatnonzero(~ok)
    return float(gains[0] if len(last_fail) == 0 else gains[last_fail[-1] + 1])


def bootstrap_mean(d: np.ndarray, n_boot: int = N_BOOT, seed: int = 0, alpha: float = ALPHA) -> tuple:
    """Mean of per-item values ``d [n_items]`` with a percentile bootstrap CI over items
    (``scipy.stats.bootstrap``); a constant ``d`` gives a CI of zero width. The package's one bootstrap of a mean.

    Example:
        >>> bootstrap_mean(np.array([0.0, 0.0, 1.0, 1.0]), n_boot=200)[0]
        0.5
    """
    from scipy.stats import bootstrap

    d = np.asarray(d, dtype=float)
    point = float(d.mean())
    if np.ptp(d) == 0:
        return point, point, point
    ci = bootstrap((d,), np.mean, n_resamples=n_boot, confidence_level=1 - alpha, method="percentile",
                   random_state=np.random.default_rng(seed)).confidence_interval
    return point, float(ci.low), float(ci.high)


def stratified_mean_ci(samples: list[np.ndarray], weights: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                       alpha: float = ALPHA) -> tuple:
    """``sum_c weights[c] * mean(samples[c])`` with a percentile CI, each class resampled on its own
    (``scipy.stats.bootstrap`` with one sample per class and ``paired=False``): per-class effects.

    Example:
        >>> stratified_mean_ci([np.array([0.0, 1.0]), np.array([1.0, 1.0])], np.array([0.5, 0.5]), n_boot=100)[0]
        0.75
    """
    from scipy.stats import bootstrap

    point = float(sum(w * s.mean() for w, s in zip(weights, samples)))
    if all(np.ptp(s) == 0 for s in samples):  # nothing varies: the CI is the point
        return point, point, point

    def stat(*xs, axis=-1):
        return sum(w * x.mean(axis=axis) for w, x in zip(weights, xs))

    res = bootstrap(tuple(samples), stat, n_resamples=n_boot, confidence_level=1 - alpha, method="percentile",
                    random_state=np.random.default_rng(seed), vectorized=True, paired=False)
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


def confirm_rule(q, fixes, breaks, fdr: float):
    """The confirm stage's rule: BH-adjusted ``q < fdr`` and more fixes than breaks (arrays of any shape; the
    power simulation applies it to ``[n_sim, k]``)."""
    return (np.asarray(q) < fdr) & (np.asarray(fixes) > np.asarray(breaks))


def holds_rule(p_holm, fixes, breaks, alpha: float):
    """The held-out stage's rule: Holm-adjusted ``p < alpha`` and more fixes than breaks (a gain)."""
    return (np.asarray(p_holm) < alpha) & (np.asarray(fixes) > np.asarray(breaks))


def heldout_decisions(base: np.ndarray, ablated: np.ndarray, alpha: float) -> dict[str, np.ndarray]:
    """The held-out rule on items that chose nothing: per row of ``ablated [k, n_items]`` (bool, one row per set
    tested), fixes and breaks against ``base [n_items]``, the exact McNemar p-value, Holm over the ``k`` rows
    (family-wise) and ``holds`` (:func:`holds_rule`).

    Example:
        >>> base = np.zeros(20, bool)
        >>> d = heldout_decisions(base, np.stack([np.arange(20) < 12, np.arange(20) < 1]), alpha=0.05)
        >>> d["p_holm"].round(4).tolist(), d["holds"].tolist()
        ([0.001, 1.0], [True, False])
    """
    f, b = fixes_breaks(base, ablated)
    p = mcnemar_exact(f, b)
    adj = holm(p)
    return {"fixes": f, "breaks": b, "p_value": p, "p_holm": adj, "holds": holds_rule(adj, f, b, alpha)}


def confirm_decisions(base: np.ndarray, ablated: np.ndarray, fdr: float) -> dict[str, np.ndarray]:
    """The confirmation rule on fresh items: per row of ``ablated [k, n_items]`` (bool, one row per head chosen
    elsewhere), fixes and breaks against ``base [n_items]``, the exact McNemar p-value, BH q-values over the
    ``k`` rows, and ``confirmed = q < fdr and fixes > breaks``; beside them, as a sensitivity check, the
    Benjamini-Yekutieli q-values (``q_value_by``, valid whatever the dependence between rows that share items) and
    the same rule on them (``confirmed_by``).

    Example:
        >>> base = np.zeros(20, bool)
        >>> d = confirm_decisions(base, np.stack([np.arange(20) < 12, np.arange(20) < 1]), fdr=0.1)
        >>> d["fixes"].tolist(), d["confirmed"].tolist()
        ([12, 1], [True, False])
    """
    f, b = fixes_breaks(base, ablated)
    p = mcnemar_exact(f, b)
    q, q_by = benjamini_hochberg(p), benjamini_yekutieli(p)
    return {"fixes": f, "breaks": b, "p_value": p, "q_value": q, "confirmed": confirm_rule(q, f, b, fdr),
            "q_value_by": q_by, "confirmed_by": confirm_rule(q_by, f, b, fdr)}


def head_to_head(a, b, n_boot: int = N_BOOT, seed: int = 0, alpha: float = ALPHA) -> dict:
    """Two interventions on the same items, compared with each other: ``a`` and ``b`` are each item's correctness
    ``[n_items]`` under one and the other. The paired difference in accuracy ``a - b`` with its bootstrap CI
    (:func:`bootstrap_mean`), the exact McNemar test on the items where they differ (``p_value``) and its word:
    ``more`` (a is better, p below ``alpha``), ``less``, or ``tie`` (not shown to differ on these items).

        >>> r = head_to_head(np.array([1, 1, 0, 1] * 10, bool), np.array([1, 1, 1, 0] * 10, bool), n_boot=200)
        >>> r["word"], round(r["p_value"], 3)
        ('tie', 1.0)
    """
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    d, lo, hi = bootstrap_mean(a.astype(float) - b, n_boot, seed, alpha)
    p = float(mcnemar_exact([int((a & ~b).sum())], [int((~a & b).sum())])[0])
    word = "more" if p < alpha and d > 0 else "less" if p < alpha and d < 0 else "tie"
    return {"delta": d, "ci_low": lo, "ci_high": hi, "p_value": p, "word": word}
