"""Live-notebook explorers (ipywidgets). They need a running kernel; the static book shows kernel-free views.

Example:
    >>> from cel_utils.widgets import theory_explorer   # doctest: +SKIP
    >>> theory_explorer()                              # doctest: +SKIP
"""

from __future__ import annotations


def theory_explorer(steps: int = 3000):
    """Sliders for sigma, number of heads and seed; retrains the toy model (about a second) and redraws."""
    import ipywidgets as W
    from IPython.display import display

    from . import plots, theory

    sigma = W.SelectionSlider(options=[1e-6, 1e-4, 1e-2, 0.1, 0.3, 1.0], value=1e-4, description="sigma")
    heads = W.IntSlider(value=4, min=2, max=8, description="heads")
    seed = W.IntSlider(value=0, min=0, max=19, description="seed")
    out = W.Output()

    def redraw(*_):
        r = theory.run(n_heads=heads.value, sigma=sigma.value, seed=seed.value, steps=steps)
        s = r.summary()
        with out:
            out.clear_output(wait=True)
            print(f"gap to optimum {s['gap']:.2e}   C-share {s['c_share']:.2f}   C-head {s['c_head']}")
            display(plots.theory_heads(r))

    for w in (sigma, heads, seed):
        w.observe(redraw, names="value")
    box = W.VBox([W.HBox([sigma, heads, seed]), out])
    redraw()
    display(box)
    return box
