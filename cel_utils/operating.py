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
* ``null``: the noise alone (centred so that it changes no expected accuracy: on a task the model mostly gets
  wrong, noise alone would fix more items than it breaks).

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

from .defaults import OC_SIMS, POWER_GAIN
from .labels import LABELS, Outcomes, checks, label

TRUTHS = ("capability", "near-threshold capability", "format-specific", "offset", "null")


def shift_for(margins: np.ndarray, gain: float, tau: float) -> float:
    """The shift ``d`` of every item's margin that raises the expected accuracy by ``gain`` when each item also
    moves by N(0, ``tau``) noise: ``mean Phi((m + d) / tau) - mean(m > 0) = gain`` (``scipy.optimize.brentq``);
    the largest shift tried (the accuracy's ceiling) when ``gain`` is more than the room.

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
    acc = float((m > 0).mean())
    f = lambda d: float(ndtr((m + d) / max(tau, 1e-9)).mean()) - acc - gain  # noqa: E731
    hi = float(np.abs(m).max()) + 10 * tau + 1.0
    if f(hi) < 0:
        return hi
    return float(brentq(f, -hi, hi)) if f(-hi) < 0 else -hi


def plant(base: Outcomes, truth: str, gain: float, tau: float, rng, nll_sd: float = 0.005) -> Outcomes:
    """One planted head of ``truth`` on ``base``'s items (see the module docstring): every ablated margin drawn
    around the real unablated one, generation flipped where the default format flips, the text cost drawn around 0
    with spread ``nll_sd`` per chunk."""
    g = {"capability": gain, "near-threshold capability": gain / 2}.get(truth, gain)
    moves = truth != "null"
    margins = {}
    for f, (b, _) in base.margins.items():
        shifted = moves and (f == "default" or truth != "format-specific")
        d = shift_for(b, g if shifted else 0.0, tau)   # no gain: the noise alone, centred to change no accuracy
        margins[f] = (b, b + d + tau * rng.standard_normal(len(b)))
    b0 = base.margins["default"][0]
    d0 = shift_for(b0, g if moves and truth != "offset" else 0.0, tau)
    kinds = {k: b0 + d0 + tau * rng.standard_normal(len(b0)) for k in ("mean", "resample")}
    gen = None
    if base.generation is not None:
        g0 = np.asarray(base.generation[0], float)
        flip = (margins["default"][1] > 0) != (b0 > 0)
        gen = (g0, np.where(flip, 1 - g0, g0))
    nll = rng.normal(0.0, nll_sd, 20)
    return Outcomes(margins, kinds, gen, base.signs, nll, False)


def operating_characteristics(base: Outcomes, gain: float = POWER_GAIN, tau: float = 1.0, n_sim: int = OC_SIMS,
                              seed: int = 0, truths=TRUTHS) -> pd.DataFrame:
    """P(label | truth): one row per truth, one column per label of :data:`cel_utils.labels.LABELS` (shares of
    ``n_sim`` planted heads), and ``n`` (items). ``base``: a pair's real unablated outcomes (the ablated arrays
    are ignored); ``tau``: the per-item spread of an ablation's change in margin (e.g. a real head's)."""
    rng = np.random.default_rng(seed)
    rows = []
    for truth in truths:
        got = dict.fromkeys(LABELS, 0)
        for _ in range(n_sim):
            got[label(checks(plant(base, truth, gain, tau, rng)))] += 1
        rows.append({"truth": truth, **{k: v / n_sim for k, v in got.items()}, "n": base.n, "gain": gain,
                     "tau": tau, "n_sim": n_sim})
    return pd.DataFrame(rows).set_index("truth")
