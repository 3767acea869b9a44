"""Power of the whole pipeline: how likely a single head with a given gain would have been *localized*.

The minimum detectable gain of :func:`cel_utils.stats.min_detectable_gain` is the power of the confirm test
alone, for a head that has already ranked in the top ``top_k`` on the search items. A head must first get
there: :func:`pipeline_power` simulates all three stages of :func:`cel_utils.verdict.single_head_verdict`
for a head *planted* in the real screen, and gives the probability that it ends confirmed and holding on
the held-out items, with the stage probabilities behind it. Each simulation plants a head and runs the stages,
each written once:

* **search** (:func:`rank_stage`): the search items resampled with replacement; each real head scores its per-item
  change in margin averaged over the resample; the planted head is a *host* (a head drawn uniformly from those not
  in the real top ``2 * top_k``) plus the shift ``d = shift_for_gain(calib_margins, g)`` on every item, and
  replaces its host; it must rank in the top ``top_k`` (ties count against it);
* **confirm** (:func:`confirm_stage`): planted (fixes, breaks) ~ Multinomial(n_confirm, [g + b, b, 1 - g - 2b]),
  the other ``top_k - 1`` drawn from the real re-tested heads; exact McNemar, Benjamini-Hochberg over the
  ``top_k`` and the pipeline's confirm rule (:func:`cel_utils.stats.confirm_rule`);
* **held-out** (:func:`heldout_stage`): planted (fixes, breaks) ~ Multinomial(n_heldout, ...); the sets tested are
  the confirmed heads alone and, when more than one, all together (whose p-value, like the other heads', is drawn
  from the real held-out p-values or 1: conservative, since the set holds the planted head); Holm over the sets
  and the pipeline's held-out rule (:func:`cel_utils.stats.holds_rule`).

The stages use disjoint items and independent draws, so each stage probability is estimated on all simulations
and the power is their product. Counted is the planted head holding, whether or not another confirmed head has a
larger confirm gain. The same draws serve every (g, b) row (``p_rank`` never falls as ``g`` rises).

Resampling the observed items adds the search noise to head means that already carry it once, so the real heads
spread more than on fresh items and ``p_rank`` comes out low (conservative). ``match_spread`` first pulls each
head's per-item changes towards the mean over heads by ``sqrt(lam)``, with ``lam = 1 - (mean per-head noise
variance of a mean) / (variance of the head means)``: the centres then spread as much as the true head means are
estimated to (constrained Bayes, Louis 1984) and the resampling adds the noise once.

* :func:`shift_for_gain`: the uniform margin shift that turns a gain ``g`` in accuracy into a change in margin.
* :func:`mcnemar_table`: exact McNemar p-values for every (fixes, breaks) on ``n`` items (a lookup table).
* :func:`pipeline_power`: the simulation, one row per (gain, break rate).
* :func:`mde_pair`: the confirm test's own minimum detectable gain, best case and at the largest break rate.
* :func:`power_sentence`: one row as a conditional sentence.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> base = rng.normal(0.3, 1, 32); heads = base + rng.normal(0, 0.1, (40, 1)) + rng.normal(0, 0.3, (40, 32))
    >>> inputs = PowerInputs(base, heads, rng.normal(0.3, 1, 250), confirm_others=[(20, 22), (18, 25)])
    >>> tab = pipeline_power(inputs, Design(n_confirm=250, n_heldout=200), gains=[0.15], n_sim=500)
    >>> bool(tab.power[0] > 0.5), power_sentence(tab.iloc[0])[:45]
    (True, 'a single head with gain 0.15 would have been ')
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
import pandas as pd

from . import profiling
from .defaults import CONFIRM_TOP_K, FDR, POWER
from .design import Design
from .stats import confirm_rule, holds_rule, holm, min_detectable_gain


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


@dataclass(frozen=True)
class PowerInputs:
    """What the simulation of :func:`pipeline_power` plants a head into, taken from a real run.

    ``search_base [n_s]`` and ``search_heads [H, n_s]``: the search screen's margins, unablated and with each head
    removed alone; ``calib_margins [m]``: unablated margins (e.g. the confirm split's) that turn a gain into a
    margin shift and bound it (the room ``1 - accuracy``); ``confirm_others``: (fixes, breaks) of the real
    re-tested heads on the confirm items; ``heldout_others``: the real held-out p-values (None: 1)."""

    search_base: np.ndarray
    search_heads: np.ndarray
    calib_margins: np.ndarray
    confirm_others: Sequence[tuple[int, int]]
    heldout_others: Sequence[float] | None = None


@profiling.timed
def pipeline_power(inputs: PowerInputs, design: Design, gains: Sequence[float], break_rates: Sequence[float] = (0.0,),
                   match_spread: bool = False, n_sim: int = 2000, n_draw: int | None = None) -> pd.DataFrame:
    """Probability that a single head with accuracy gain ``g`` (breaking ``b`` of the items) would end
    *localized* -- in the top ``design.top_k`` on the search items, confirmed, holding on held-out items -- by
    the pipeline of :func:`cel_utils.verdict.single_head_verdict`, simulated ``n_sim`` times around the real run
    (:class:`PowerInputs`) with the run's :class:`~cel_utils.design.Design` (``n_confirm``, ``n_heldout``,
    ``top_k``, ``fdr``, ``alpha``; ``seed`` seeds the simulation), through :func:`rank_stage`,
    :func:`confirm_stage` and :func:`heldout_stage` (the module docstring says how each draws).
    ``match_spread``: shrink the screen's head means to the spread the true means are estimated to have (the
    module docstring); ``n_draw``: search items each simulated search draws (default the screen's; more
    extrapolates). One row per (gain, break rate); the same draws serve every row.

    Columns: ``gain``, ``break_rate``, ``margin_shift`` (``d``), ``room``, ``power`` (``p_rank *
    p_confirm_given_rank * p_hold_given_confirm``), ``se`` (its Monte Carlo standard error), the three stage
    probabilities, ``reason`` (why a row is structural: ``g`` above the room, power 0; ``g + b`` above it or ``b``
    above the accuracy, no such head, NaN) and ``n_sim``.

    Example:
        >>> rng = np.random.default_rng(1)
        >>> base = rng.normal(0, 1, 32); heads = base + rng.normal(0, 0.3, (30, 32))
        >>> inputs = PowerInputs(base, heads, rng.normal(1.8, 1, 250), confirm_others=[(3, 2)])
        >>> tab = pipeline_power(inputs, Design(n_confirm=250, n_heldout=200), gains=[0.1], n_sim=200)
        >>> float(tab.power[0]), tab.reason[0]
        (0.0, 'ceiling: the baseline leaves only 0.04 to gain')
    """
    calib = np.asarray(inputs.calib_margins, dtype=float)
    room = 1.0 - float(np.mean(calib > 0))
    others = np.asarray(inputs.confirm_others, dtype=int).reshape(-1, 2)  # [m_o, 2] (fixes, breaks)
    if design.top_k > 1 and len(others) == 0:
        raise ValueError("confirm_others is empty: the other re-tested heads' (fixes, breaks) are needed")
    rng = np.random.default_rng(design.seed)
    host_score, kth = rank_stage(inputs, design.top_k, match_spread, n_sim, n_draw, rng)
    draws = _shared_draws(rng, others, inputs.heldout_others, design, n_sim)
    rows = []
    for g in gains:
        d = shift_for_gain(calib, g)
        for b in break_rates:
            row = {"gain": float(g), "break_rate": float(b), "margin_shift": d, "room": room, "power": 0.0, "se": 0.0,
                   "p_rank": np.nan, "p_confirm_given_rank": np.nan, "p_hold_given_confirm": np.nan,
                   "reason": None, "n_sim": n_sim}
            if d is None:
                row["reason"] = f"ceiling: the baseline leaves only {room:.2f} to gain"
            elif g + b > room or b > 1 - room:
                row.update(power=np.nan, se=np.nan,
                           reason=f"no such head: it must fix {g + b:.2f} and break {b:.2f} of the items, and the "
                                  f"baseline gets {room:.2f} wrong and {1 - room:.2f} right")
            else:
                ranked = host_score + d > kth  # [n_sim]
                conf = confirm_stage(draws, design, g, b)
                holds = heldout_stage(draws, design, g, b, conf)
                row.update(_stage_probabilities(ranked, conf[:, 0], holds, n_sim))
            rows.append(row)
    return pd.DataFrame(rows)


def rank_stage(inputs: PowerInputs, top_k: int, match_spread: bool, n_sim: int, n_draw: int | None,
               rng) -> tuple[np.ndarray, np.ndarray]:
    """The search stage's draws: per simulation the planted head's host score and the ``top_k``-th best score of
    the other heads on a resample of the search items (``[n_sim]`` each; planted with shift ``d`` it ranks when
    ``host + d > kth``)."""
    base = np.asarray(inputs.search_base, dtype=float)  # [n_s]
    delta = np.asarray(inputs.search_heads, dtype=float) - base[None]  # [H, n_s] per-item change in margin
    H, n_s = delta.shape
    real = delta.mean(axis=1)  # [H]
    hosts = np.argsort(-real, kind="stable")[2 * top_k:]  # heads outside the real top 2k
    if match_spread:
        noise = float(np.mean(delta.var(axis=1, ddof=1))) / n_s  # variance of one head's mean from the items
        spread = float(real.var(ddof=1))
        lam = max(0.0, 1.0 - noise / spread) if spread > 0 else 1.0
        delta = delta - ((1.0 - np.sqrt(lam)) * (real - real.mean()))[:, None]  # same order, matched spread
    if len(hosts) == 0:
        raise ValueError(f"no host: {H} heads, none outside the top {2 * top_k}")
    m = n_s if n_draw is None else int(n_draw)
    counts = rng.multinomial(m, np.full(n_s, 1.0 / n_s), size=n_sim)  # bootstrap counts [n_sim, n_s]
    means = counts @ delta.T / m  # [n_sim, H]
    host = hosts[rng.integers(0, len(hosts), n_sim)]  # [n_sim]
    host_score = means[np.arange(n_sim), host]
    means[np.arange(n_sim), host] = -np.inf  # the planted head replaces its host
    return host_score, -np.partition(-means, top_k - 1, axis=1)[:, top_k - 1]


def _shared_draws(rng, others: np.ndarray, heldout_others, design: Design, n_sim: int) -> dict:
    """The confirm and held-out draws every (gain, break rate) row shares (common random numbers)."""
    k = design.top_k
    u_conf, u_held = rng.uniform(np.finfo(float).tiny, 1.0, (2, 2, n_sim))  # in (0, 1): ppf stays in the support
    p_conf_tab = mcnemar_table(design.n_confirm)
    pick = others[rng.integers(0, max(len(others), 1), (n_sim, k - 1))] if k > 1 else \
        np.zeros((n_sim, 0, 2), int)  # [n_sim, top_k - 1, 2]
    held_pool = np.asarray(heldout_others if heldout_others is not None else [], dtype=float)
    held_draw = (held_pool[rng.integers(0, len(held_pool), (n_sim, k))] if len(held_pool)
                 else np.ones((n_sim, k)))  # p-values of the other sets tested [n_sim, top_k]
    o_p = p_conf_tab[pick[..., 0], pick[..., 1]] if k > 1 else np.zeros((n_sim, 0))
    return {"u_conf": u_conf, "u_held": u_held, "o_f": pick[..., 0], "o_b": pick[..., 1], "o_p": o_p,
            "held_draw": held_draw}


def confirm_stage(draws: dict, design: Design, g: float, b: float) -> np.ndarray:
    """The confirm stage of every simulation: the planted head's (fixes, breaks) drawn, the others' from the real
    re-tested heads, exact McNemar, BH over the ``top_k`` and the confirm rule. ``[n_sim, top_k]``, planted first."""
    from scipy.stats import false_discovery_control

    f, br = _flips(draws["u_conf"], design.n_confirm, g, b)
    p = np.concatenate([mcnemar_table(design.n_confirm)[f, br][:, None], draws["o_p"]], axis=1)  # [n_sim, top_k]
    q = false_discovery_control(p, axis=1, method="bh")
    return confirm_rule(q, np.concatenate([f[:, None], draws["o_f"]], axis=1),
                        np.concatenate([br[:, None], draws["o_b"]], axis=1), design.fdr)


def heldout_stage(draws: dict, design: Design, g: float, b: float, conf: np.ndarray) -> np.ndarray:
    """The held-out stage where the planted head was confirmed: its (fixes, breaks) drawn, the other sets'
    p-values from the real run, Holm over the confirmed heads (and all of them together) and the held-out
    rule. ``[n_sim]`` bool."""
    hf, hb = _flips(draws["u_held"], design.n_heldout, g, b)
    hp = mcnemar_table(design.n_heldout)[hf, hb]
    n_conf = conf.sum(axis=1)
    n_sets = n_conf + (n_conf > 1)  # confirmed heads alone, and together when more than one
    holds = np.zeros(len(hp), bool)
    for s in np.flatnonzero(conf[:, 0]):
        adj = holm(np.concatenate([[hp[s]], draws["held_draw"][s, :n_sets[s] - 1]]))[0]
        holds[s] = holds_rule(adj, hf[s], hb[s], design.alpha)
    return holds


def _stage_probabilities(ranked, confirmed, holds, n_sim: int) -> dict:
    p_r, p_c = ranked.mean(), confirmed.mean()
    p_ch = (confirmed & holds).mean()
    v_r, v_ch = p_r * (1 - p_r) / n_sim, p_ch * (1 - p_ch) / n_sim
    return {"power": float(p_r * p_ch), "se": float(np.sqrt(p_r ** 2 * v_ch + p_ch ** 2 * v_r + v_r * v_ch)),
            "p_rank": float(p_r), "p_confirm_given_rank": float(p_c),
            "p_hold_given_confirm": float(p_ch / p_c) if p_c > 0 else np.nan}


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
