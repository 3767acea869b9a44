"""Paired statistics over items: bootstrap confidence intervals, p-values, FDR.

Example:
    >>> import numpy as np
    >>> from cel_utils.stats import paired_bootstrap
    >>> base = np.array([0, 1, 0, 1, 0, 1, 0, 0] * 10, dtype=float)
    >>> r = paired_bootstrap(base, base, seed=0)
    >>> r["delta"], r["ci_low"] <= 0 <= r["ci_high"]
    (0.0, True)
"""

from __future__ import annotations

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
    """Benjamini-Hochberg q-values (false-discovery-rate adjusted p-values)."""
    p = np.asarray(p, dtype=float)
    n = len(p)
    if n == 0:
        return p
    order = np.argsort(p)
    ranked = p[order] * n / np.arange(1, n + 1)
    q = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(n)
    out[order] = np.minimum(q, 1.0)
    return out
