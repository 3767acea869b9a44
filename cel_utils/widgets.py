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


def head_toggle_grid(lm, task, heldout=None, mode: str = "zero", preset=(), max_items_shown: int = 5):
    """A layers x heads grid of toggle buttons: ablate any head set on the real model and see the result.

    Shows accuracy and mean margin against the unablated model, and which items flip (wrong -> right and
    right -> wrong). Controls choose the ablation mode and the split (search, or held-out if given).
    """
    import ipywidgets as W
    import numpy as np
    from IPython.display import display

    from .ablation import compute_head_means, head_name
    from .scoring import encode_task, evaluate

    splits = {"search": task} if heldout is None else {"search": task, "held-out": heldout}
    encs = {k: encode_task(lm, t) for k, t in splits.items()}
    means_cache: dict = {}
    buttons = {}
    rows = []
    for l in range(lm.n_layers):
        row = [W.HTML(f"<code>L{l}</code>", layout=W.Layout(width="40px"))]
        for h in range(lm.n_heads):
            b = W.ToggleButton(value=(l, h) in set(preset), description=f"H{h}", tooltip=head_name((l, h)),
                               layout=W.Layout(width="46px", height="24px"))
            buttons[(l, h)] = b
            row.append(b)
        rows.append(W.HBox(row))
    mode_w = W.ToggleButtons(options=["zero", "mean"], value=mode, description="mode")
    split_w = W.ToggleButtons(options=list(splits), value="search", description="split")
    clear = W.Button(description="clear all")
    out = W.Output()

    def run(*_):
        heads = [k for k, b in buttons.items() if b.value]
        enc = encs[split_w.value]
        means = None
        if mode_w.value == "mean":
            if split_w.value not in means_cache:
                means_cache[split_w.value] = compute_head_means(lm, enc.inputs)
            means = means_cache[split_w.value]
        base = evaluate(lm, enc, (), mode=mode_w.value, means=means)
        abl = evaluate(lm, enc, heads, mode=mode_w.value, means=means)
        fixed = np.flatnonzero(~base.correct[0] & abl.correct[0])
        broken = np.flatnonzero(base.correct[0] & ~abl.correct[0])
        items = splits[split_w.value].items
        with out:
            out.clear_output(wait=True)
            names = ", ".join(head_name(h) for h in heads) or "(none)"
            print(f"ablated: {names}")
            print(f"accuracy {base.accuracy[0]:.3f} -> {abl.accuracy[0]:.3f}   "
                  f"mean margin {base.mean_margin[0]:.3f} -> {abl.mean_margin[0]:.3f}")
            print(f"{len(fixed)} items wrong -> right, {len(broken)} right -> wrong")
            for tag, idx in (("fixed", fixed), ("broken", broken)):
                for i in idx[:max_items_shown]:
                    last = items[i]["prompt"].strip().splitlines()[-1]
                    print(f"  {tag}: {last!r}")

    for b in buttons.values():
        b.observe(run, names="value")
    mode_w.observe(run, names="value")
    split_w.observe(run, names="value")

    def clear_all(_):
        for b in buttons.values():
            b.unobserve(run, names="value")
            b.value = False
            b.observe(run, names="value")
        run()

    clear.on_click(clear_all)
    box = W.VBox([W.HBox([mode_w, split_w, clear]), W.VBox(rows), out])
    run()
    display(box)
    return box
