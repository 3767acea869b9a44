"""The live explorers build and react to changes (driven programmatically, no browser)."""

import ipywidgets as W

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


def test_head_toggle_grid(tiny_llama, capsys):
    t = load_task("capitals", n=4)
    h = load_task("capitals", split="heldout", n=4)
    box = head_toggle_grid(tiny_llama, t, heldout=h, preset=[(0, 1)])
    toggles = [b for b in _find(box, W.ToggleButton)]
    assert len(toggles) == tiny_llama.n_layers * tiny_llama.n_heads
    assert sum(b.value for b in toggles) == 1
    toggles[-1].value = True  # re-runs the model with two heads ablated
    (split,) = [w for w in _find(box, W.ToggleButtons) if w.description == "split"]
    split.value = "held-out"
    (mode,) = [w for w in _find(box, W.ToggleButtons) if w.description == "mode"]
    mode.value = "mean"
    out = capsys.readouterr().out
    assert "accuracy" in out and "L0H1" in out


def test_theory_explorer(capsys):
    box = theory_explorer(steps=300)
    sliders = _find(box, W.IntSlider)
    sliders[0].value = 3
    assert "C-share" in capsys.readouterr().out
