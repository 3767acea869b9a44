"""The live explorers build and react to changes (driven programmatically, no browser)."""

import ipywidgets as W
import pytest

from cel_utils.tasks import load_task
from cel_utils.widgets import head_toggle_grid, theory_explorer


def _find(box, cls):
    found = []
    stack = [box]
    while stack:
        w = stack.pop()
        if isinstance(w, cls):
            found.append(w)
        stack.extend(getattr(w, "children", ()))
    return found


def _accuracy_line(text):
    """The figures a grid prints after a change: (base acc, ablated acc, base margin, ablated margin), and the
    numbers of items fixed and broken."""
    import re

    m = re.search(r"accuracy (\S+) -> (\S+)   mean margin (\S+) -> (\S+)", text)
    f = re.search(r"(\d+) items wrong -> right, (\d+) right -> wrong", text)
    return tuple(float(x) for x in m.groups()), (int(f.group(1)), int(f.group(2)))


def test_head_toggle_grid(tiny_llama, capsys):
    """Each change (a head toggled, the split, the mode, "clear all") re-runs the model once and prints what
    that state gives: checked against the plain reference loop on the same split, mode and heads."""
    from cel_utils.scoring import encode_task, plain_evaluate

    lm = tiny_llama
    t = load_task("ioi", n=8)
    h = load_task("ioi", split="heldout", n=8)
    box = head_toggle_grid(lm, t, heldout=h, preset=[(0, 1)])
    toggles = {b.tooltip: b for b in _find(box, W.ToggleButton)}
    assert len(toggles) == lm.n_layers * lm.n_heads
    assert [k for k, b in toggles.items() if b.value] == ["L0H1"]
    (split,) = [w for w in _find(box, W.ToggleButtons) if w.description == "split"]
    (mode,) = [w for w in _find(box, W.ToggleButtons) if w.description == "mode"]
    (clear,) = [w for w in _find(box, W.Button) if w.description == "clear all"]

    def expected(task, mode_, heads):
        enc = encode_task(lm, task)
        base, abl = plain_evaluate(lm, enc, (), mode=mode_), plain_evaluate(lm, enc, heads, mode=mode_)
        figs = (base.accuracy[0], abl.accuracy[0], base.mean_margin[0], abl.mean_margin[0])
        flips = (int((~base.correct[0] & abl.correct[0]).sum()), int((base.correct[0] & ~abl.correct[0]).sum()))
        return figs, flips

    steps = [("first render", None, "ablated: L0H1", (t, "zero", [(0, 1)])),
             ("toggle L2H3", lambda: setattr(toggles["L2H3"], "value", True), "ablated: L0H1, L2H3",
              (t, "zero", [(0, 1), (2, 3)])),
             ("held-out split", lambda: setattr(split, "value", "held-out"), "ablated: L0H1, L2H3",
              (h, "zero", [(0, 1), (2, 3)])),
             ("mean mode", lambda: setattr(mode, "value", "mean"), "ablated: L0H1, L2H3",
              (h, "mean", [(0, 1), (2, 3)])),
             ("clear all", clear.click, "ablated: (none)", (h, "mean", []))]
    seen = []
    for name, act, heads_line, state in steps:
        if act is not None:
            act()
        text = capsys.readouterr().out
        assert text.count("ablated:") == 1 and heads_line + "\n" in text, (name, text)
        (figs, flips), (want, want_flips) = _accuracy_line(text), expected(*state)
        assert figs == pytest.approx(want, abs=1.5e-3) and flips == want_flips, name
        seen.append(figs)
    # every change moved the printed figures (so a change that did not re-run would have been caught)
    assert all(a != b for a, b in zip(seen, seen[1:]))
    assert not any(b.value for b in toggles.values())


def test_theory_explorer(capsys):
    """Moving the heads slider retrains with that many heads and prints that run's summary (and only that)."""
    from cel_utils import theory

    box = theory_explorer(steps=300)
    first = capsys.readouterr().out
    (heads,) = [w for w in _find(box, W.IntSlider) if w.description == "heads"]
    assert heads.value == 4

    def line(n_heads):
        s = theory.run(n_heads=n_heads, sigma=1e-4, seed=0, steps=300).summary()
        return f"gap to optimum {s['gap']:.2e}   C-share {s['c_share']:.2f}   C-head {s['c_head']}"

    assert line(4) in first and line(3) != line(4)
    heads.value = 3
    after = capsys.readouterr().out
    assert after.count("C-share") == 1 and line(3) in after
    assert "'text': 'head 2'" in after and "'text': 'head 3'" not in after  # the figure shows three heads
