"""Comparing two `cel screen` outputs as the issue states "the same screen": every field equal apart from the timing,
the numbers that come from margins within a tolerance (1e-6 on CPU float32: another number of torch threads may
change the last bits of a sum), everything that comes from per-item right/wrong (accuracies, fixes and breaks,
p- and q-values, their CIs) and the candidates identical."""

from __future__ import annotations

import math

MARGIN_FIELDS = ("mean_margin", "delta_margin", "margin_ci_low", "margin_ci_high")


def candidates(d: dict) -> list[tuple[int, int]]:
    return [(h["layer"], h["head"]) for h in d["heads"] if h.get("candidate")]


def assert_same_screen(a: dict, b: dict, tol: float = 1e-6) -> None:
    """``a`` and ``b`` (parsed JSON) are the same screen; an AssertionError names the first difference."""
    a = {k: v for k, v in a.items() if k != "timing"}
    b = {k: v for k, v in b.items() if k != "timing"}
    assert a.keys() == b.keys(), f"fields differ: {sorted(a.keys() ^ b.keys())}"
    for k in a:
        if k not in ("heads", "baseline"):
            assert a[k] == b[k], f"'{k}' differs: {a[k]!r} against {b[k]!r}"
    _close(a["baseline"], b["baseline"], "baseline", tol)
    assert [(h["layer"], h["head"]) for h in a["heads"]] == [(h["layer"], h["head"]) for h in b["heads"]], \
        "the heads or their order differ"
    for ha, hb in zip(a["heads"], b["heads"]):
        _close(ha, hb, f"L{ha['layer']}H{ha['head']}", tol)
    assert candidates(a) == candidates(b)


def _close(x: dict, y: dict, where: str, tol: float) -> None:
    assert x.keys() == y.keys(), f"{where}: fields differ: {sorted(x.keys() ^ y.keys())}"
    for k in x:
        if k in MARGIN_FIELDS and isinstance(x[k], float) and isinstance(y[k], float):
            assert math.isclose(x[k], y[k], rel_tol=0, abs_tol=tol), f"{where}.{k}: {x[k]!r} against {y[k]!r}"
        else:
            assert x[k] == y[k], f"{where}.{k}: {x[k]!r} against {y[k]!r}"
