"""Power of the whole pipeline: how likely a single head with a given gain would have been *localized*.

The minimum detectable gain of :func:`cel_utils.stats.min_detectable_gain` is the power of the confirm test
alone, for a head that has already ranked in the top ``top_k`` on the search items. A head must first get
there: :func:`pipeline_power` simulates all three stages of :func:`cel_utils.verdict.single_head_verdict`
for a head *planted* in the real screen, and gives the probability that it ends confirmed and holding on
the held-out items, with the stage probabilities behind it.

* :func:`shift_for_gain`: the uniform margin shift that turns a gain ``g`` in accuracy into a change in margin.
* :func:`mcnemar_table`: exact McNemar p-values for every (fixes, breaks) on ``n`` items (a lookup table).
* :func:`pipeline_power`: the simulation, one row per (gain, break rate).
* :func:`mde_pair`: the confirm test's own minimum detectable gain, best case and at the largest break rate.
* :func:`power_sentence`: one row as a conditional sentence.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> base = rng.normal(0.3, 1, 32); heads = base + rng.normal(0, 0.1, (40, 1)) + rng.normal(0, 0.3, (40, 32))
    >>> tab = pipeline_power(base, heads, rng.normal(0.3, 1, 250), n_confirm=250, n_heldout=200, gains=[0.15],
    ...                      confirm_others=[(20, 22), (18, 25)], n_sim=500)
    >>> bool(tab.power[0] > 0.5), power_sentence(tab.iloc[0])[:45]
    (True, 'a single head with gain 0.15 would have been ')
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import pandas as pd

from .defaults import ALPHA, CONFIRM_TOP_K, FDR, POWER
from .stats import holm, min_detectable_gain


def shift_for_gain(margins: np.ndarray, g: float) -> float | None:
    """The uniform margin shift ``d >= 0`` that raises accuracy (margin > 0 is correct) by at least ``g``:
    ``mean(margins + d > 0) - mean(margins > 0) >= g``. It fixes the wrong items nearest to zero first; ``d``
    is the midpoint of the gap between the last item it must fix and the next one (just above the last
    wrong item when all must be fixed). ``None`` when even an infinite shift cannot gain ``g`` (the room,
    ``1 - accuracy``, is below ``g``).

    Example:
        >>> shift_for_gain(np.array([-0.3, -0.1, 0.2, 0.5]), 0.25)   # fix -0.1: midpoint of 0.1 and 0.3
        0.2
        >>> shift_for_gain(np.array([-0.3, -0.1, 0.2, 0.5]), 0.75) is None   # only 0.5 to gain
        True
    """
    m = np.asarray(margins, dtype=float)
    if g <= 0:
        return 0.0
    need = int(np.ceil(g * len(m) - 1e-9))  # items to fix
    dist = np.sort(-m[m <= 0])  # [n_wrong] how far each wrong item is from being right, nearest first
    if need > len(dist):
        return None
    u = np.unique(dist)  # a shift past one of tied items fixes them all
    j = np.searchsorted(u, dist[need - 1])  # the distinct distance the shift must pass
    return float((u[j] + u[j + 1]) / 2 if j + 1 < len(u) else np.nextafter(u[j], np.inf))


@lru_cache(maxsize=8)
def mcnemar_table(n: int) -> np.ndarray:
    """Two-sided exact McNemar p-values ``[n + 1, n + 1]`` indexed by (fixes, breaks), for fixes + breaks
    <= ``n`` (NaN elsewhere): the binomial test at 1/2, ``min(1, 2 * P(X <= min(fixes, breaks)))`` with
    ``X ~ Binomial(fixes + breaks, 1/2)`` from ``scipy.stats.binom`` (the test is symmetric), the same numbers as
    :func:`cel_utils.stats.mcnemar_exact` without one ``binomtest`` call per pair. Cached, read-only.

    Example:
        >>> mcnemar_table(10)[[5, 3], [0, 3]].round(4).tolist()
        [0.0625, 1.0]
    """
    from scipy.stats import binom

    f, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")  # [n + 1, n + 1]
    p = np.minimum(1.0, 2 * binom.cdf(np.minimum(f, b), f + b, 0.5))
    out = np.where(f + b <= n, p, np.nan)
    out.flags.writeable = False
    return out


def _flips(u: np.ndarray, n: int, g: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """(fixes, breaks) ~ Multinomial(n, [g + b, b, 1 - g - 2b]) by inversion of two uniforms ``u [2, n_sim]``:
    breaks ~ Binomial(n, b), then fixes ~ Binomial(n - breaks, (g + b) / (1 - b)). The same ``u`` for every
    ``g`` (common random numbers): fixes never fall as ``g`` rises."""
    from scipy.stats import binom

    brk = binom.ppf(u[0], n, b).astype(int)
    fix = binom.ppf(u[1], n - brk, min(1.0, (g + b) / (1 - b))).astype(int)
    return fix, brk


def pipeline_power(search_base: np.ndarray, search_heads: np.ndarray, calib_margins: np.ndarray, *,
                   n_confirm: int, n_heldout: int, top_k: int = CONFIRM_TOP_K, fdr: float = FDR,
                   alpha: float = ALPHA, gains: Sequence[float], break_rates: Sequence[float] = (0.0,),
                   confirm_others: Sequence[tuple[int, int]], heldout_others: Sequence[float] | None = None,
                   match_spread: bool = False, n_sim: int = 2000, seed: int = 0,
                   n_draw: int | None = None) -> pd.DataFrame:
    """Probability that a single head with accuracy gain ``g`` (breaking ``b`` of the items) would end
    *localized* -- in the top ``top_k`` on the search items, confirmed, holding on held-out items -- by the
    pipeline of :func:`cel_utils.verdict.single_head_verdict`, simulated ``n_sim`` times around the real screen.

    Inputs: the search screen's margins, ``search_base [n_s]`` (unablated) and ``search_heads [H, n_s]`` (each
    head removed alone); ``calib_margins [m]`` unablated margins (e.g. the confirm split's) that turn ``g``
    into a margin shift and bound it (the room ``1 - accuracy``); ``confirm_others``: (fixes, breaks) of the
    real re-tested heads on ``n_confirm`` items; ``heldout_others``: the real held-out p-values (None: 1).

    Each simulation plants a head and runs the three stages:

    * **search**: the ``n_s`` items resampled with replacement; each real head scores its per-item change in
      margin averaged over the resample; the planted head is a *host* (a head drawn uniformly from those not
      in the real top ``2 * top_k``) plus the shift ``d = shift_for_gain(calib_margins, g)`` on every item, and
      replaces its host; it must rank in the top ``top_k`` (ties count against it);
    * **confirm**: planted (fixes, breaks) ~ Multinomial(n_confirm, [g + b, b, 1 - g - 2b]), the other
      ``top_k - 1`` drawn from ``confirm_others``; exact McNemar, Benjamini-Hochberg over the ``top_k``;
      confirmed = q < ``fdr`` and fixes > breaks (:func:`cel_utils.stats.confirm_decisions`);
    * **held-out**: planted (fixes, breaks) ~ Multinomial(n_heldout, ...); the sets tested are the confirmed
      heads alone and, when more than one, all together (whose p-value, like the other heads', is drawn from
      ``heldout_others`` or 1: conservative, since the set holds the planted head); Holm over the sets; the
      planted head holds when its adjusted p < ``alpha`` and fixes > breaks.

    The stages use disjoint items and independent draws, so each stage probability is estimated on all
    ``n_sim`` simulations and ``power = p_rank * p_confirm_given_rank * p_hold_given_confirm`` (``se`` its Monte
    Carlo standard error). Counted is the planted head holding, whether or not another confirmed head has a
    larger confirm gain. The same draws serve every (g, b) row: rows differ by the effect, not by the draws
    (``p_rank`` never falls as ``g`` rises).

    Resampling the observed items adds the search noise to head means that already carry it once, so the
    real heads spread more than on fresh items and ``p_rank`` comes out low (conservative). ``match_spread``
    first pulls each head's per-item changes towards the mean over heads by ``sqrt(lam)``, with ``lam = 1 -
    (mean per-head noise variance of a mean) / (variance of the head means)``: the centres then spread as much
    as the true head means are estimated to (constrained Bayes, Louis 1984) and the resampling adds the noise
    once.

    ``n_draw``: how many search items each simulated search draws (default ``n_s``, the screen's own): the power
    of a search on fewer or more items, estimated from this screen (more than ``n_s`` extrapolates: the draws
    repeat the screen's items).

    Columns: ``gain``, ``break_rate``, ``margin_shift`` (``d``), ``room``, ``power``, ``se``, ``p_rank``,
    ``p_confirm_given_rank``, ``p_hold_given_confirm``, ``reason``, ``n_sim``. ``reason`` says why a row is
    structural: ``g`` above the room (power 0), or ``g + b`` above it or ``b`` above the accuracy (no such
    head: power NaN).

    Example:
        >>> rng = np.random.default_rng(1)
        >>> base = rng.normal(0, 1, 32); heads = base + rng.normal(0, 0.3, (30, 32))
        >>> tab = pipeline_power(base, heads, rng.normal(1.8, 1, 250), n_confirm=250, n_heldout=200,
        ...                      gains=[0.1], confirm_others=[(3, 2)], n_sim=200)
        >>> float(tab.power[0]), tab.reason[0]
        (0.0, 'ceiling: the baseline leaves only 0.04 to gain')
    """
    from scipy.stats import false_discovery_control

    base = np.asarray(search_base, dtype=float)  # [n_s]
    delta = np.asarray(search_heads, dtype=float) - base[None]  # [H, n_s] per-item change in margin
    H, n_s = delta.shape
    calib = np.asarray(calib_margins, dtype=float)
    room = 1.0 - float(np.mean(calib > 0))
    others = np.asarray(confirm_others, dtype=int).reshape(-1, 2)  # [m_o, 2] (fixes, breaks)
    if top_k > 1 and len(others) == 0:
        raise ValueError("confirm_others is empty: the other re-tested heads' (fixes, breaks) are needed")
    real = delta.mean(axis=1)  # [H]
    hosts = np.argsort(-real, kind="stable")[2 * top_k:]  # heads outside the real top 2k
    if match_spread:
        noise = float(np.mean(delta.var(axis=1, ddof=1))) / n_s  # variance of one head's mean from the items
        spread = float(real.var(ddof=1))
        lam = max(0.0, 1.0 - noise / spread) if spread > 0 else 1.0
        delta = delta - ((1.0 - np.sqrt(lam)) * (real - real.mean()))[:, None]  # same order, matched spread
    if len(hosts) == 0:
        raise ValueError(f"no host: {H} heads, none outside the top {2 * top_k}")
    rng = np.random.default_rng(seed)

    # search: bootstrap counts [n_sim, n_s] -> every head's resampled mean change [n_sim, H]
    m = n_s if n_draw is None else int(n_draw)
    counts = rng.multinomial(m, np.full(n_s, 1.0 / n_s), size=n_sim)
    means = counts @ delta.T / m  # [n_sim, H]
    host = hosts[rng.integers(0, len(hosts), n_sim)]  # [n_sim]
    host_score = means[np.arange(n_sim), host]
    means[np.arange(n_sim), host] = -np.inf  # the planted head replaces its host
    kth = -np.partition(-means, top_k - 1, axis=1)[:, top_k - 1]  # top_k-th best of the others [n_sim]

    # confirm and held-out draws shared by every row
    u_conf, u_held = rng.uniform(np.finfo(float).tiny, 1.0, (2, 2, n_sim))  # in (0, 1): ppf stays in the support
    p_conf_tab, p_held_tab = mcnemar_table(n_confirm), mcnemar_table(n_heldout)
    pick = others[rng.integers(0, max(len(others), 1), (n_sim, top_k - 1))] if top_k > 1 else \
        np.zeros((n_sim, 0, 2), int)  # [n_sim, top_k - 1, 2]
    o_f, o_b = pick[..., 0], pick[..., 1]
    o_p = p_conf_tab[o_f, o_b] if top_k > 1 else np.zeros((n_sim, 0))
    held_pool = np.asarray(heldout_others if heldout_others is not None else [], dtype=float)
    held_draw = (held_pool[rng.integers(0, len(held_pool), (n_sim, top_k))] if len(held_pool)
                 else np.ones((n_sim, top_k)))  # p-values of the other sets tested [n_sim, top_k]

    rows = []
    for g in gains:
        d = shift_for_gain(calib, g)
        for b in break_rates:
            row = {"gain": float(g), "break_rate": float(b), "margin_shift": d, "room": room, "power": 0.0, "se": 0.0,
                   "p_rank": np.nan, "p_confirm_given_rank": np.nan, "p_hold_given_confirm": np.nan,
                   "reason": None, "n_sim": n_sim}
            if d is None:
                row["reason"] = f"ceiling: the baseline leaves only {room:.2f} to gain"
                rows.append(row)
                continue
            if g + b > room or b > 1 - room:
                row.update(power=np.nan, se=np.nan,
                           reason=f"no such head: it must fix {g + b:.2f} and break {b:.2f} of the items, and the "
                                  f"baseline gets {room:.2f} wrong and {1 - room:.2f} right")
                rows.append(row)
                continue
            ranked = host_score + d > kth  # [n_sim]
            f, br = _flips(u_conf, n_confirm, g, b)
            p = np.concatenate([p_conf_tab[f, br][:, None], o_p], axis=1)  # [n_sim, top_k], planted first
            q = false_discovery_control(p, axis=1, method="bh")
            conf = (q < fdr) & (np.concatenate([(f > br)[:, None], o_f > o_b], axis=1))  # [n_sim, top_k]
            hf, hb = _flips(u_held, n_heldout, g, b)
            hp = p_held_tab[hf, hb]
            n_conf = conf.sum(axis=1)
            n_sets = n_conf + (n_conf > 1)  # confirmed heads alone, and together when more than one
            holds = np.zeros(n_sim, bool)
            for s in np.flatnonzero(conf[:, 0]):
                adj = holm(np.concatenate([[hp[s]], held_draw[s, :n_sets[s] - 1]]))[0]
                holds[s] = adj < alpha and hf[s] > hb[s]
            p_r, p_c = ranked.mean(), conf[:, 0].mean()
            p_ch = (conf[:, 0] & holds).mean()
            v_r, v_ch = p_r * (1 - p_r) / n_sim, p_ch * (1 - p_ch) / n_sim
            row.update(power=float(p_r * p_ch), se=float(np.sqrt(p_r ** 2 * v_ch + p_ch ** 2 * v_r + v_r * v_ch)),
                       p_rank=float(p_r), p_confirm_given_rank=float(p_c),
                       p_hold_given_confirm=float(p_ch / p_c) if p_c > 0 else np.nan)
            rows.append(row)
    return pd.DataFrame(rows)


def mde_pair(n_confirm: int, fdr: float = FDR, top_k: int = CONFIRM_TOP_K, break_rates: Sequence[float] = (0.0,),
             power: float = POWER) -> pd.DataFrame:
    """The confirm test's own minimum detectable gain (:func:`cel_utils.stats.min_detectable_gain` at ``fdr /
    top_k``, BH's threshold for a lone discovery), for a head that has already ranked in the top ``top_k``:
    the best case (break rate 0) and at the largest of ``break_rates`` (the re-tested heads' breaks / n).

    Example:
        >>> mde_pair(30, 0.1, 5, [0.0, 0.02])[["case", "break_rate", "mde"]].values.tolist()
        [['best case', 0.0, 0.2875], ['largest re-tested break rate', 0.02, 0.35]]
    """
    alpha = fdr / top_k
    b_max = float(max(break_rates, default=0.0))
    return pd.DataFrame([{"case": case, "break_rate": b, "alpha": alpha, "power": power,
                          "mde": round(min_detectable_gain(n_confirm, alpha, b, power), 6)}
                         for case, b in (("best case", 0.0), ("largest re-tested break rate", b_max))])


def power_sentence(row) -> str:
    """One row of :func:`pipeline_power` as a conditional sentence with its numbers.

    Example:
        >>> power_sentence({"gain": 0.1, "break_rate": 0.0, "power": 0.62, "p_rank": 0.7,
        ...                 "p_confirm_given_rank": 0.93, "p_hold_given_confirm": 0.95, "reason": None})
        'a single head with gain 0.10 would have been localized with probability 0.62 (search rank 0.70, confirm 0.93, held-out 0.95)'
    """
    r = dict(row)
    head = f"a single head with gain {r['gain']:.2f}" + (f" and break rate {r['break_rate']:.2f}"
                                                         if r.get("break_rate", 0) else "")
    reason = r.get("reason")
    if isinstance(reason, str) and reason.startswith("ceiling"):
        return f"{head} cannot be localized: the baseline leaves {r['room']:.2f} to gain"
    if isinstance(reason, str):
        return f"{head} is not possible here ({reason})"
    hold = r["p_hold_given_confirm"]
    return (f"{head} would have been localized with probability {r['power']:.2f} (search rank {r['p_rank']:.2f}, "
            f"confirm {r['p_confirm_given_rank']:.2f}, held-out "
            + ("n/a" if not np.isfinite(hold) else f"{hold:.2f}") + ")")
