"""How often each label is right: the battery's label rule run on planted truths.

:func:`operating_characteristics` takes a pair's real unablated outcomes (every format's margins on the battery's
items, free generation, the classes; :class:`cel_utils.labels.Outcomes`) and plants, ``n_sim`` times each, a head
whose truth is known, then reads its label with the same code that labels real heads (:func:`cel_utils.labels.label`):

* ``capability``: the margin of every item shifts by the amount that gains ``gain`` in accuracy (in each format,
  from that format's own margins), under zero, mean and resample ablation alike, in free generation too, at no
  cost; each item also moves by its own noise of scale ``tau`` (a real head's per-item spread), which breaks some;
* ``near-threshold capability``: the same at half the gain;
* ``format-specific``: the gain in the task's own format only (the other formats get the noise alone);
* ``offset``: zero ablation gains in every format, mean and resample ablation do not (the head's constant part);
* ``label shift`` (two-class tasks): every margin moves toward one label, up in the class with more errors and
  down in the other, by the amount that gains ``gain`` (in every format and ablation kind, at no cost);
* ``null``: the noise alone (centred so that it changes no expected accuracy: on a task the model mostly gets
  wrong, noise alone would fix more items than it breaks);
* ``capability (semi-synthetic)``, when a real head's outcomes are given (:func:`plant_fixes`): that head's own
  per-item outcomes (a null head's: real noise, real class structure) with ``gain`` of its wrong items fixed, the
  same items in every format where they are wrong: fixes land where the errors are, so on a task whose errors sit
  in one class they are all in that class (the case a label-shift check must not mistake for a shift).

The text cost of each planted head is drawn with the labelled set's own per-chunk spread when it was measured.
The result is P(label | truth) for every label, the table chapter 1c prints beside its labels.

Example:
    >>> from cel_utils.labels import Outcomes
    >>> rng = np.random.default_rng(0)
    >>> base = Outcomes.of({f: (rng.normal(0.3, 1.5, 150), None) for f in ("default", "a", "b")})
    >>> oc = operating_characteristics(base, n_sim=20, tau=0.5)
    >>> float(oc.loc["null", "format-specific"])
    0.0
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .defaults import OC_SIMS, OC_TARGET_CAPABILITY, OC_TARGET_NULL, POWER_GAIN
from .labels import LABELS, Outcomes, checks, label

TRUTHS = ("capability", "near-threshold capability", "format-specific", "offset", "label shift", "null")
SEMI = "capability (semi-synthetic)"


def shift_for(margins: np.ndarray, gain: float, tau: float, toward: np.ndarray | None = None) -> float:
    """The shift ``d`` of every item's margin that raises the expected accuracy by ``gain`` when each item also
    moves by N(0, ``tau``) noise: ``mean Phi((m + d t) / tau) - mean(m > 0) = gain`` (``scipy.optimize.brentq``;
    ``t`` = ``toward``, +1 or -1 per item, default all +1); the largest shift tried (the accuracy's ceiling) when
    ``gain`` is more than the room.

    Example:
        >>> from scipy.stats import norm
        >>> m = np.array([-1.0, -0.5, 0.5, 1.0])
        >>> d = shift_for(m, 0.25, 0.5)
        >>> round(float(norm.cdf((m + d) / 0.5).mean() - (m > 0).mean()), 6)
        0.25
    """
    from scipy.optimize import brentq
    from scipy.special import ndtr   # the standard normal CDF (what scipy.stats.norm.cdf calls, without its overhead)

    m = np.asarray(margins, float)
    t = np.ones_like(m) if toward is None else np.asarray(toward, float)
    acc = float((m > 0).mean())
    f = lambda d: float(ndtr((m + d * t) / max(tau, 1e-9)).mean()) - acc - gain  # noqa: E731
    hi = float(np.abs(m).max()) + 10 * tau + 1.0
    if toward is not None and gain > 0:   # not monotone (the other class falls): the smallest d > 0 that gains
        grid = np.linspace(0.0, hi, 201)
        vals = np.array([f(d) for d in grid])
        up = np.flatnonzero(vals >= 0)
        if not len(up):
            return float(grid[int(np.argmax(vals))])   # the most this direction can gain
        return float(brentq(f, grid[up[0] - 1], grid[up[0]])) if up[0] else 0.0
    if f(hi) < 0:
        return hi
    return float(brentq(f, -hi, hi)) if f(-hi) < 0 else -hi


def toward_errors(base: Outcomes) -> np.ndarray | None:
    """+1 for the items of the class with the lower unablated accuracy in the task's own format, -1 for the others
    (None: not a two-class task): the direction of a label shift that gains."""
    if base.signs is None:
        return None
    s, right = np.asarray(base.signs), base.margins["default"][0] > 0
    low = 1 if right[s == 1].mean() <= right[s == -1].mean() else -1
    return np.where(s == low, 1.0, -1.0)


def plant(base: Outcomes, truth: str, gain: float, tau: float, rng, nll_sd: float = 0.005,
          chunks: int = 20) -> Outcomes:
    """One planted head of ``truth`` on ``base``'s items (see the module docstring): every ablated margin drawn
    around the real unablated one, generation flipped where the default format flips, the text cost drawn around 0
    with spread ``nll_sd`` per chunk (``chunks`` chunks)."""
    g = {"capability": gain, "near-threshold capability": gain / 2}.get(truth, gain)
    moves = truth != "null"
    t = toward_errors(base) if truth == "label shift" else None
    margins = {}
    for f, (b, _) in base.margins.items():
        shifted = moves and (f == "default" or truth != "format-specific")
        d = shift_for(b, g if shifted else 0.0, tau, t)   # no gain: the noise alone, centred to change no accuracy
        margins[f] = (b, b + d * (1 if t is None else t) + tau * rng.standard_normal(len(b)))
    b0 = base.margins["default"][0]
    d0 = shift_for(b0, g if moves and truth != "offset" else 0.0, tau, t)
    kinds = {k: b0 + d0 * (1 if t is None else t) + tau * rng.standard_normal(len(b0)) for k in ("mean", "resample")}
    gen = None
    if base.generation is not None:
        g0 = np.asarray(base.generation[0], float)
        flip = (margins["default"][1] > 0) != (b0 > 0)
        gen = (g0, np.where(flip, 1 - g0, g0))
    nll = rng.normal(0.0, nll_sd, chunks)
    return Outcomes(margins, kinds, gen, base.signs, nll, False)


def plant_fixes(real: Outcomes, gain: float, rng, nll: np.ndarray | None = None) -> Outcomes:
    """A capability of ``gain`` planted into a real head's outcomes ``real``: ``round(gain * n)`` items taken in
    one random order, in each format the first of them that are wrong with the head removed, get their margin
    mirrored to the right side (``|margin|``); the same default-format items under mean and resample ablation (the
    head's zero-ablated margins where those kinds were not measured) and in free generation (right there). The text
    cost: ``nll`` resampled and centred on 0 (a real set's per-chunk changes; None: no cost measured).

    Example:
        >>> real = Outcomes.of({"default": ([-1.0, -2.0, 1.0, 2.0], [-1.0, -2.0, 1.0, 2.0])})
        >>> o = plant_fixes(real, 0.25, np.random.default_rng(0))
        >>> int((o.margins["default"][1] > 0).sum() - (o.margins["default"][0] > 0).sum())
        1
    """
    k, order = int(round(gain * real.n)), rng.permutation(real.n)

    def fixed(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        fix = [i for i in order if a[i] <= 0][:k]
        out = a.copy()
        out[fix] = np.maximum(np.abs(a[fix]), 1e-3)
        return out, np.asarray(fix, int)

    margins = {f: (b, fixed(a)[0]) for f, (b, a) in real.margins.items()}
    a0, fix0 = fixed(real.margins["default"][1])
    kinds = {k_: fixed(real.kinds.get(k_, real.margins["default"][1]))[0] for k_ in ("mean", "resample")}
    gen = None
    if real.generation is not None:
        g0, g1 = (np.asarray(x, float).copy() for x in real.generation)
        g1[fix0] = 1.0
        gen = (g0, g1)
    cost = None if nll is None else (lambda c: c - c.mean())(np.asarray(nll, float)[rng.integers(0, len(nll), len(nll))])
    return Outcomes(margins, kinds, gen, real.signs, cost, False)


def operating_characteristics(base: Outcomes, gain: float = POWER_GAIN, tau: float = 1.0, n_sim: int = OC_SIMS,
                              seed: int = 0, truths=TRUTHS, real: Outcomes | None = None) -> pd.DataFrame:
    """P(label | truth): one row per truth, one column per label of :data:`cel_utils.labels.LABELS` (shares of
    ``n_sim`` planted heads), and ``n`` (items). ``base``: a pair's real unablated outcomes (the ablated arrays
    are ignored; its ``nll``, when measured, gives the planted heads' text-cost spread and chunk count); ``tau``:
    the per-item spread of an ablation's change in margin (e.g. a real head's); ``real``: a real (null) head's
    outcomes, adding the :data:`SEMI` row (:func:`plant_fixes`). ``label shift`` needs the classes."""
    rng = np.random.default_rng(seed)
    nll = None if base.nll is None or len(base.nll) < 2 else np.asarray(base.nll, float)
    spread = {} if nll is None else {"nll_sd": float(np.std(nll, ddof=1)), "chunks": len(nll)}
    draws = {t: (lambda t=t: plant(base, t, gain, tau, rng, **spread)) for t in truths
             if t != "label shift" or base.signs is not None}
    if real is not None:
        draws[SEMI] = lambda: plant_fixes(real, gain, rng, nll)
    rows = []
    for truth, draw in draws.items():
        got = dict.fromkeys(LABELS, 0)
        for _ in range(n_sim):
            got[label(checks(draw()))] += 1
        rows.append({"truth": truth, **{k: v / n_sim for k, v in got.items()}, "n": base.n, "gain": gain,
                     "tau": tau, "n_sim": n_sim})
    return pd.DataFrame(rows).set_index("truth")


def power_at_gain(oc: pd.DataFrame) -> tuple[float, str]:
    """(P(capability | a capability of the OC's gain), the truth it comes from): the lower of the Gaussian row and
    the semi-synthetic row (when simulated), the rule's power where it is weakest."""
    rows = [t for t in ("capability", SEMI) if t in oc.index]
    worst = min(rows, key=lambda t: oc.loc[t, "capability"])
    return float(oc.loc[worst, "capability"]), worst


def summary(oc: pd.DataFrame, pair: str) -> str:
    """One markdown line on one pair's operating characteristics (``oc``: indexed by truth): how often each
    capability row, a null and a planted label shift are labelled what, and whether the rule meets the book's
    targets (:data:`~cel_utils.defaults.OC_TARGET_CAPABILITY`, :data:`~cel_utils.defaults.OC_TARGET_NULL`)."""
    cap, null = oc.loc["capability", "capability"], oc.loc["null", "capability"]
    bits = [f"- **{pair}** ({int(oc['n'].iloc[0])} items): a planted capability of gain {oc['gain'].iloc[0]:.2f} "
            f"(every margin shifted) is labelled one {cap:.0%} of the time"]
    if SEMI in oc.index:
        bits.append(f"fixes of the same gain planted into a real null head's outcomes {oc.loc[SEMI, 'capability']:.0%}"
                    f" (label shift {oc.loc[SEMI, 'label shift']:.0%}, shift or capability "
                    f"{oc.loc[SEMI, 'shift or capability']:.0%})")
    if "label shift" in oc.index:
        bits.append(f"a planted label shift is labelled one {oc.loc['label shift', 'label shift']:.0%} of the time")
    bits.append(f"a null is labelled a capability {null:.0%} and format-specific {oc.loc['null', 'format-specific']:.0%}"
                " of the time")
    power, worst = power_at_gain(oc)
    ok = power >= OC_TARGET_CAPABILITY and null <= OC_TARGET_NULL
    verdict = ("The rule meets the book's targets here." if ok else
               f"**The rule misses the book's targets here (P(capability | {worst}) = {power:.2f}): its labels for "
               "this pair are weak evidence.**")
    return "; ".join(bits) + ". " + verdict
