"""What every figure of the book must satisfy, checked as it is shown (:func:`cel_utils.plots.figure`).

* an axis given an explicit range shows all of its data (a range in the wrong units, or one set before the data
  grew, hides points);
* a shape (a vertical or horizontal mark) on a log axis sits within :data:`DECADES` decades of the data (plotly
  reads a shape's coordinates on a log axis as log10 units: a mark placed at x = 171 stretched one axis to 10^171,
  while the exact screen's cost, a decade beyond the selectors' budgets, is a fair mark);
* traces of one legend group (one legend entry) share their colour: plotly colours traces by their index, so a
  group drawn in two panels gets two colours unless one is set, and one panel's colours then match no legend entry.

:func:`problems` lists what a figure breaks; ``plots.figure`` raises on them where ``CEL_STRICT_FIGURES`` is set
(the tests) and warns otherwise.

Example:
    >>> import plotly.graph_objects as go
    >>> fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[0.5, 1.4, 0.2])).update_yaxes(range=[0, 1])
    >>> problems(fig)
    ['yaxis: range [0, 1] hides data from 0.2 to 1.4']
"""

from __future__ import annotations

import numpy as np

SLACK = 1e-6   # relative: a point on the range's edge is shown
DECADES = 3    # how far beyond the data's decades a mark on a log axis may sit


def _numbers(values) -> np.ndarray:
    if values is None:
        return np.array([])
    try:
        a = np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):      # categories or dates: no numeric range to check
        return np.array([])
    return a[np.isfinite(a)]


def _axis_name(ref: str | None, letter: str) -> str:
    """``"x2"`` -> ``"xaxis2"``; a trace without a reference is on the first axis."""
    return f"{letter}axis{(ref or letter)[1:]}"


def _data_by_axis(fig) -> dict[str, np.ndarray]:
    got: dict[str, list] = {}
    for t in fig.data:
        if t.type not in ("scatter", "scattergl", "bar", "box"):
            continue
        for letter in ("x", "y"):
            vals = _numbers(getattr(t, letter, None))
            if letter == "x" and t.type == "bar" and getattr(t, "orientation", None) != "h":
                continue   # a vertical bar's x are positions; its height is checked on y
            if letter == "y" and t.type == "bar" and getattr(t, "orientation", None) == "h":
                continue
            got.setdefault(_axis_name(getattr(t, f"{letter}axis", None), letter), []).append(vals)
    return {k: np.concatenate(v) for k, v in got.items() if v}


def _ranges(fig, data: dict[str, np.ndarray]) -> list[str]:
    out = []
    for name, vals in data.items():
        ax = fig.layout[name] if name in fig.layout else None
        if ax is None or ax.range is None or not len(vals) or ax.autorange not in (None, False):
            continue
        lo, hi = sorted(float(r) for r in ax.range)
        if ax.type == "log":
            vals = np.log10(vals[vals > 0])
            if not len(vals):
                continue
        pad = SLACK * max(1.0, abs(lo), abs(hi))
        if vals.min() < lo - pad or vals.max() > hi + pad:
            out.append(f"{name}: range [{ax.range[0]:g}, {ax.range[1]:g}] hides data from {vals.min():.3g} to "
                       f"{vals.max():.3g}")
    return out


def _log_shapes(fig, data: dict[str, np.ndarray]) -> list[str]:
    out = []
    for s in fig.layout.shapes or ():
        for letter in ("x", "y"):
            ref = getattr(s, f"{letter}ref", None) or letter
            name = _axis_name(ref, letter)
            if ref.endswith("paper") or "domain" in ref or name not in fig.layout or fig.layout[name].type != "log":
                continue
            vals = data.get(name, np.array([]))
            vals = np.log10(vals[vals > 0])
            if not len(vals):
                continue
            for c in (getattr(s, f"{letter}0"), getattr(s, f"{letter}1")):
                if c is not None and not vals.min() - DECADES <= float(c) <= vals.max() + DECADES:
                    out.append(f"a shape at {letter} = {float(c):g} on the log axis {name} (log10 units) lies more "
                               f"than {DECADES} decades outside the data's {vals.min():.2f} to {vals.max():.2f}")
    return out


def _colour(t) -> str | None:
    line = getattr(t, "line", None)
    marker = getattr(t, "marker", None)
    c = getattr(line, "color", None) or getattr(marker, "color", None) or getattr(t, "fillcolor", None)
    return c if isinstance(c, str) else None


def _groups(fig) -> list[str]:
    seen: dict[str, list] = {}
    for t in fig.data:
        if getattr(t, "legendgroup", None):
            seen.setdefault(t.legendgroup, []).append(_colour(t))
    return [f"legend group {g!r}: {len(cs)} traces in {'no set colour' if None in cs else 'colours ' + str(sorted(set(cs)))}"
            for g, cs in seen.items() if len(cs) > 1 and (None in cs or len(set(cs)) > 1)]


def problems(fig) -> list[str]:
    """What ``fig`` breaks of the module's three rules (an empty list: nothing)."""
    data = _data_by_axis(fig)
    return _ranges(fig, data) + _log_shapes(fig, data) + _groups(fig)
