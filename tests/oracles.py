"""Reference computations the tests check the library against, in one place.

Each is independent of ``cel_utils.stats`` (an oracle that called the code under test would check nothing):
the exact McNemar test is scipy's binomial test on the discordant pairs, the BH q-values are scipy's, and
Holm's step-down is written out as a plain loop (scipy has none).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binomtest, false_discovery_control


def mcnemar_p(fixes: int, breaks: int) -> float:
    """Exact two-sided McNemar p-value: a fair-coin binomial test of ``fixes`` out of ``fixes + breaks``
    (1 when there is no discordant item)."""
    fixes, breaks = int(fixes), int(breaks)
    return 1.0 if fixes + breaks == 0 else float(binomtest(fixes, fixes + breaks, 0.5).pvalue)


def bh_q(p) -> np.ndarray:
    """Benjamini-Hochberg q-values (scipy's ``false_discovery_control``, method ``"bh"``)."""
    return np.asarray(false_discovery_control(np.asarray(p, float), method="bh"))


def by_q(p) -> np.ndarray:
    """Benjamini-Yekutieli q-values by hand: BH's step-up with every p-value multiplied by c(m) = sum 1/i, the
    running minimum from the largest p down, capped at 1.

    >>> [round(float(x), 4) for x in by_q([0.01, 0.04, 0.03])]
    [0.055, 0.0733, 0.0733]
    """
    p = np.asarray(p, float)
    m = len(p)
    c = sum(1.0 / i for i in range(1, m + 1))
    order = np.argsort(p)
    q = np.empty(m)
    running = 1.0
    for rank in range(m - 1, -1, -1):
        i = order[rank]
        running = min(running, p[i] * m * c / (rank + 1))
        q[i] = running
    return q


def holm_p(p) -> np.ndarray:
    """Holm's step-down adjusted p-values: sort ascending; the k-th smallest (k from 0) is multiplied by
    ``m - k``; each adjusted value is at least the one before it in that order; capped at 1.

    >>> [round(float(x), 6) for x in holm_p([0.01, 0.04, 0.03, 0.5])]
    [0.04, 0.09, 0.09, 0.5]
    """
    p = [float(x) for x in p]
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adj = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return np.array(adj)
