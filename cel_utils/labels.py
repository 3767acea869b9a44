"""Labels a test could have reversed: what each check of the battery reads from per-item outcomes, and the label.

The battery (:mod:`cel_utils.battery`) measures a head set on the same items in every prompt format, under every
ablation kind and in free generation; this module turns those per-item outcomes (:class:`Outcomes`) into checks and
a label, with nothing else read, so the same code grades real heads and planted truths
(:mod:`cel_utils.operating`). Every check is an estimate with its confidence interval and a reading --
``holds``, ``fails`` or ``cannot tell`` -- and every word of the label needs a check that holds:

=====================  ===========================================================================================
check                  estimate (per item, paired; a t interval from ``scipy.stats.ttest_1samp``)
=====================  ===========================================================================================
``effect``             the change in accuracy in the task's own format (holds: CI above 0)
``transfer``           the change in accuracy averaged over the other formats whose baseline leaves room
                       (``ROOM`` to ``1 - ROOM``): holds above 0, fails below
``format_specific``    the default format's change minus the other formats' (holds: CI above 0 and no transfer)
``survives``           the change in accuracy under mean and under resample ablation (each at ``alpha / 2``):
                       what the head reads from the item; holds when either is above 0, fails when both are below
``offset``             zero minus resample ablation's change in accuracy: the head's constant part (zero removes
                       the constant and what the head reads, mean and resample only what it reads); holds above
                       0 when the gain does not survive
``generation``         the change in accuracy in free generation (exact-match tasks)
``teacher_forcing``    teacher-forced minus free-generation change (holds: above 0 with no gain in generation)
``label_shift``        two-class tasks: per class, the change in margin, and the *balance*: the falling class's
                       loss minus half the rising class's gain (Welch interval, the classes are other items). A
                       shift toward one label moves every margin alike, up in one class and down in the other, so
                       the balance is about half the gain; fixes of errors that sit in one class raise that class
                       and leave the other. Holds when one class rises, the other falls and the balance lies above
                       0; fails when both rise or the balance lies below 0 (lopsided: not a shift)
``cost``               the change in NLL per token on general text (holds: above ``COLLATERAL_NLL``, or a
                       significant loss on another task; fails: below it and no such loss)
=====================  ===========================================================================================

:func:`label`, in order: ``no effect`` (the gain's CI lies below ``NO_EFFECT``: no gain that large, or a loss),
``inconclusive`` (no gain shown), ``format-specific``, ``label shift``, ``offset``, ``teacher-forcing only``,
``costly``, ``capability`` (transfer, survives, a gain in free generation where it applies, a cost shown below
the threshold and, on a two-class task, a label shift ruled out), ``shift or capability`` (all of that, but the
items cannot tell a label shift from fixes of errors that sit in one class), else ``inconclusive``. :func:`label_distribution` resamples the items and reads the label again.

Example:
    >>> rng = np.random.default_rng(0)
    >>> m = rng.normal(0.3, 1, 200)
    >>> o = Outcomes.of({"default": (m, m + 0.6)}, kinds={"mean": m + 0.6, "resample": m + 0.6})
    >>> c = checks(o)
    >>> c["effect"]["reading"], c["survives"]["reading"], label(c)   # no other format, no cost measured
    ('holds', 'holds', 'inconclusive')
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .defaults import ALPHA, COLLATERAL_NLL, NO_EFFECT, ROOM

HOLDS, FAILS, UNKNOWN = "holds", "fails", "cannot tell"
LABELS = ("capability", "format-specific", "label shift", "offset", "teacher-forcing only", "costly", "no effect",
          "shift or capability", "inconclusive")


@dataclass
class Outcomes:
    """One head set's per-item outcomes on the battery's items (the same items, in the same order, in every array).

    ``margins``: per format (``default`` first) the unablated and the zero-ablated margins ``[n]`` (right when
    above 0); ``kinds``: the ablated margins in the default format under ``mean``, ``resample`` (and any other
    kind); ``generation``: free generation, unablated and ablated, right or not ``[n]`` (exact-match tasks);
    ``signs``: +1 / -1 per item for a two-class task; ``nll``: per-chunk change in NLL per token on general text;
    ``hurts_other``: a significant loss on another task (None: not measured)."""

    margins: dict[str, tuple[np.ndarray, np.ndarray]]
    kinds: dict[str, np.ndarray] = field(default_factory=dict)
    generation: tuple[np.ndarray, np.ndarray] | None = None
    signs: np.ndarray | None = None
    nll: np.ndarray | None = None
    hurts_other: bool | None = None

    @classmethod
    def of(cls, margins: dict, **kw) -> "Outcomes":
        """From lists or arrays (converted to float arrays)."""
        m = {k: (np.asarray(a, float), np.asarray(b, float)) for k, (a, b) in margins.items()}
        kinds = {k: np.asarray(v, float) for k, v in kw.pop("kinds", {}).items()}
        return cls(m, kinds, **kw)

    @property
    def n(self) -> int:
        return len(self.margins["default"][0])

    def take(self, idx: np.ndarray, chunks: np.ndarray | None = None) -> "Outcomes":
        """The same outcomes on items ``idx`` (a resample), the text chunks on ``chunks``."""
        gen = None if self.generation is None else tuple(g[idx] for g in self.generation)
        return replace(self, margins={k: (a[idx], b[idx]) for k, (a, b) in self.margins.items()},
                       kinds={k: v[idx] for k, v in self.kinds.items()}, generation=gen,
                       signs=None if self.signs is None else self.signs[idx],
                       nll=self.nll if self.nll is None or chunks is None else self.nll[chunks])


def mean_ci(d: np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float]:
    """Mean of paired per-item differences ``d`` with its t interval: the mean plus or minus the t quantile
    (``scipy.special.stdtrit``, n - 1 degrees of freedom) times the standard error, the interval
    ``scipy.stats.ttest_1samp(d, 0).confidence_interval`` gives (a test checks they agree), about 20 times faster
    per call: the label's bootstrap over items and the operating characteristics recompute it thousands of times.
    A constant ``d`` gives an interval of zero width; fewer than 2 values give no interval (-inf to inf: a check
    on one text chunk cannot say anything). (A bootstrap would fit too, at a far higher cost.)

    Example:
        >>> [round(x, 3) for x in mean_ci(np.array([0.0, 1.0, 1.0, 0.0, 1.0]))]
        [0.6, -0.08, 1.28]
    """
    from scipy.special import stdtrit

    d = np.asarray(d, float)
    point = float(d.mean()) if len(d) else float("nan")
    if len(d) < 2:
        return point, -np.inf, np.inf
    if np.ptp(d) == 0:
        return point, point, point
    half = float(stdtrit(len(d) - 1, 1 - alpha / 2) * d.std(ddof=1) / np.sqrt(len(d)))
    return point, point - half, point + half


def welch_ci(x: np.ndarray, y: np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float]:
    """``mean(x) - mean(y)`` of two independent samples with its Welch t interval (Welch-Satterthwaite degrees of
    freedom): the interval ``scipy.stats.ttest_ind(x, y, equal_var=False).confidence_interval`` gives (a test
    checks they agree), written out for the same reason as :func:`mean_ci`. Samples of fewer than 2 give an
    interval from -inf to inf; two constant samples one of zero width.

    Example:
        >>> [round(v, 3) for v in welch_ci(np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0, 0.0, 1.0]))]
        [1.5, -0.554, 3.554]
    """
    from scipy.special import stdtrit

    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or len(y) < 2:
        return float(x.mean() - y.mean()) if len(x) and len(y) else float("nan"), -np.inf, np.inf
    point = float(x.mean() - y.mean())
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        return point, point, point
    df = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    half = float(stdtrit(df, 1 - alpha / 2) * np.sqrt(vx + vy))
    return point, point - half, point + half


def check(d: np.ndarray, alpha: float = ALPHA, above: float = 0.0, on: str = "accuracy") -> dict:
    """A check on per-item differences ``d``: estimate, CI, and its reading (``holds`` when the CI lies above
    ``above``, ``fails`` when it lies below, ``cannot tell`` otherwise)."""
    est, lo, hi = mean_ci(d, alpha)
    reading = HOLDS if lo > above else FAILS if hi < above else UNKNOWN
    return {"estimate": est, "ci_low": lo, "ci_high": hi, "reading": reading, "on": on, "n": int(len(d))}


def _right(m: np.ndarray) -> np.ndarray:
    return (np.asarray(m) > 0).astype(float)


def roomy(o: Outcomes, room: float | None = None) -> list[str]:
    """The formats other than the default whose unablated accuracy lies in ``[room, 1 - room]`` (default
    :data:`ROOM`): there is room for a gain, and the model does the task in that format at all (at the floor no
    removal can be expected to bring the task back)."""
    room = ROOM if room is None else room
    return [f for f, (b, _) in o.margins.items() if f != "default" and room <= _right(b).mean() <= 1 - room]


def _transfer_checks(o: Outcomes, alpha: float) -> dict:
    b0, a0 = o.margins["default"]
    d0 = _right(a0) - _right(b0)
    others = roomy(o)
    if not others:
        na = {"estimate": None, "ci_low": None, "ci_high": None, "reading": UNKNOWN, "on": "accuracy", "n": 0}
        return {"transfer": dict(na, formats=[]), "format_specific": dict(na)}
    d_o = np.mean([_right(o.margins[f][1]) - _right(o.margins[f][0]) for f in others], axis=0)  # [n]
    t = dict(check(d_o, alpha), formats=others)
    fs = check(d0 - d_o, alpha)
    fs["reading"] = HOLDS if fs["reading"] == HOLDS and t["reading"] != HOLDS else \
        FAILS if t["reading"] == HOLDS else UNKNOWN
    signs = np.sign([(_right(o.margins[f][1]) - _right(o.margins[f][0])).mean() for f in others])
    from scipy.stats import binomtest

    pos, neg = int((signs > 0).sum()), int((signs < 0).sum())   # formats with no change are ties, left out
    t["sign_test"] = {"positive": pos, "negative": neg, "ties": int((signs == 0).sum()),
                      "p_value": float(binomtest(pos, pos + neg, 0.5).pvalue) if pos + neg else 1.0}
    return {"transfer": t, "format_specific": fs}


def _ablation_checks(o: Outcomes, alpha: float) -> dict:
    b0, a0 = o.margins["default"]
    out = {}
    got = [k for k in ("mean", "resample") if k in o.kinds]
    if got:
        parts = {k: dict(check(_right(o.kinds[k]) - _right(b0), alpha / len(got)),
                         margin=check(o.kinds[k] - b0, alpha / len(got), on="margin")) for k in got}
        reading = HOLDS if any(p["reading"] == HOLDS for p in parts.values()) else \
            FAILS if all(p["reading"] == FAILS for p in parts.values()) else UNKNOWN
        best = max(parts, key=lambda k: parts[k]["estimate"])
        out["survives"] = dict(parts[best], reading=reading, kind=best, by_kind=parts)
    if "resample" in o.kinds:
        off = dict(check(_right(a0) - _right(o.kinds["resample"]), alpha),
                   margin=check(a0 - o.kinds["resample"], alpha, on="margin"))
        surv = out.get("survives", {}).get("reading")
        off["reading"] = HOLDS if off["reading"] == HOLDS and surv != HOLDS else \
            FAILS if off["reading"] == FAILS or surv == HOLDS else UNKNOWN
        out["offset"] = off
    return out


def _generation_checks(o: Outcomes, alpha: float) -> dict:
    if o.generation is None:
        return {}
    b0, a0 = o.margins["default"]
    g0, g1 = (np.asarray(x, float) for x in o.generation)
    gen = check(g1 - g0, alpha)
    tf = check((_right(a0) - _right(b0)) - (g1 - g0), alpha)
    tf["reading"] = HOLDS if tf["reading"] == HOLDS and gen["reading"] != HOLDS else \
        FAILS if gen["reading"] == HOLDS else UNKNOWN
    return {"generation": gen, "teacher_forcing": tf}


def _label_shift_check(o: Outcomes, alpha: float) -> dict:
    if o.signs is None:
        return {}
    b0, a0 = o.margins["default"]
    s = np.asarray(o.signs)
    per = {int(c): check((a0 - b0)[s == c], alpha / 2, on="margin") for c in (1, -1)}
    up, down = per[1], per[-1]
    opposite = (up["reading"] == HOLDS and down["reading"] == FAILS) or (up["reading"] == FAILS and
                                                                         down["reading"] == HOLDS)
    both_up = up["reading"] == HOLDS and down["reading"] == HOLDS
    rise = 1 if (up["estimate"] or 0) >= (down["estimate"] or 0) else -1    # the class whose margins rise more
    est, lo, hi = welch_ci(-(a0 - b0)[s == -rise], 0.5 * (a0 - b0)[s == rise], alpha)
    balance = {"estimate": est, "ci_low": lo, "ci_high": hi, "rising_class": f"{rise:+d}",
               "reading": HOLDS if lo > 0 else FAILS if hi < 0 else UNKNOWN}
    shift = float(np.mean((a0 - b0) * s))   # the head's own shift toward class +1, fitted to its margin changes
    gain = float(_right(b0 + shift * s).mean() - _right(b0).mean())
    reading = HOLDS if opposite and balance["reading"] == HOLDS else \
        FAILS if both_up or balance["reading"] == FAILS else UNKNOWN
    return {"label_shift": {"estimate": shift, "reproduced_gain": gain, "per_class": {"+1": up, "-1": down},
                            "balance": balance, "reading": reading, "on": "margin", "n": int(len(s))}}


def _cost_check(o: Outcomes, alpha: float) -> dict:
    if o.nll is None and o.hurts_other is None:
        return {}
    c = check(o.nll, alpha, above=COLLATERAL_NLL, on="nll") if o.nll is not None else \
        {"estimate": None, "ci_low": None, "ci_high": None, "reading": UNKNOWN, "on": "nll", "n": 0}
    if o.hurts_other:
        c["reading"] = HOLDS
    elif c["reading"] == FAILS and o.hurts_other is None:
        c["reading"] = UNKNOWN   # the text is cheap, the other tasks were not measured
    return {"cost": dict(c, hurts_other=o.hurts_other)}


def checks(o: Outcomes, alpha: float = ALPHA) -> dict:
    """Every check the outcomes allow (see the module docstring), each an estimate, CI and reading."""
    b0, a0 = o.margins["default"]
    out = {"effect": dict(check(_right(a0) - _right(b0), alpha), margin=check(a0 - b0, alpha, on="margin"))}
    for part in (_transfer_checks, _ablation_checks, _generation_checks, _label_shift_check, _cost_check):
        out.update(part(o, alpha))
    return out


def reads(c: dict, name: str, value: str) -> bool:
    return c.get(name, {}).get("reading") == value


def label(c: dict) -> str:
    """The label of a set's checks (:func:`checks`), in the order of the module docstring: each word needs a check
    that holds; ``capability`` needs them all.

    Example:
        >>> label({"effect": {"reading": "cannot tell", "ci_high": 0.02}})
        'no effect'
    """
    e = c["effect"]
    if e["reading"] != HOLDS:
        return "no effect" if e["ci_high"] is not None and e["ci_high"] < NO_EFFECT else "inconclusive"
    for name, word in (("format_specific", "format-specific"), ("label_shift", "label shift"), ("offset", "offset"),
                       ("teacher_forcing", "teacher-forcing only"), ("cost", "costly")):
        if reads(c, name, HOLDS):
            return word
    needs = [reads(c, "transfer", HOLDS), reads(c, "survives", HOLDS), reads(c, "cost", FAILS)]
    if "generation" in c:
        needs.append(reads(c, "generation", HOLDS))
    if not all(needs):
        return "inconclusive"
    return "shift or capability" if "label_shift" in c and not reads(c, "label_shift", FAILS) else "capability"


def label_distribution(o: Outcomes, n_boot: int = 200, seed: int = 0, alpha: float = ALPHA) -> dict[str, float]:
    """How often each label comes out when the items (and the text chunks) are resampled with replacement: the
    label's stability over items. ``{label: share}``, every label of :data:`LABELS`.

    Example:
        >>> m = np.random.default_rng(1).normal(0, 1, 100)
        >>> label_distribution(Outcomes.of({"default": (m, m)}), n_boot=20)["no effect"]
        1.0
    """
    rng = np.random.default_rng(seed)
    counts = dict.fromkeys(LABELS, 0)
    for _ in range(n_boot):
        idx = rng.integers(0, o.n, o.n)
        chunks = None if o.nll is None else rng.integers(0, len(o.nll), len(o.nll))
        counts[label(checks(o.take(idx, chunks), alpha))] += 1
    return {k: v / n_boot for k, v in counts.items()}
