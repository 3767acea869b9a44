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


def _head_buttons(lm, preset=()):
    """One toggle button per head, in rows of layers: ``({(layer, head): button}, [row boxes])``."""
    import ipywidgets as W

    from .ablation import head_name

    buttons, rows = {}, []
    for l in range(lm.n_layers):
        row = [W.HTML(f"<code>L{l}</code>", layout=W.Layout(width="40px"))]
        for h in range(lm.n_heads):
            b = W.ToggleButton(value=(l, h) in set(preset), description=f"H{h}", tooltip=head_name((l, h)),
                               layout=W.Layout(width="46px", height="24px"))
            buttons[(l, h)] = b
            row.append(b)
        rows.append(W.HBox(row))
    return buttons, rows


def _print_flips(items, heads, base, abl, max_items_shown: int) -> None:
    """What an ablation did to the items: accuracy and margin before and after, and the items that flip."""
    import numpy as np

    from .ablation import head_name

    fixed = np.flatnonzero(~base.correct[0] & abl.correct[0])
    broken = np.flatnonzero(base.correct[0] & ~abl.correct[0])
    print(f"ablated: {', '.join(head_name(h) for h in heads) or '(none)'}")
    print(f"accuracy {base.accuracy[0]:.3f} -> {abl.accuracy[0]:.3f}   "
          f"mean margin {base.mean_margin[0]:.3f} -> {abl.mean_margin[0]:.3f}")
    print(f"{len(fixed)} items wrong -> right, {len(broken)} right -> wrong")
    for tag, idx in (("fixed", fixed), ("broken", broken)):
        for i in idx[:max_items_shown]:
            print(f"  {tag}: {items[i]['prompt'].strip().splitlines()[-1]!r}")


def head_toggle_grid(lm, task, heldout=None, mode: str = "zero", preset=(), max_items_shown: int = 5):
    """A layers x heads grid of toggle buttons: ablate any head set on the real model and see the result.

    Shows accuracy and mean margin against the unablated model, and which items flip (wrong -> right and
    right -> wrong). Controls choose the ablation mode and the split (search, or held-out if given).
    """
    import ipywidgets as W
    from IPython.display import display

    from .ablation import Ablation
    from .engine import evaluate
    from .scoring import encode_task

    splits = {"search": task} if heldout is None else {"search": task, "held-out": heldout}
    encs = {k: encode_task(lm, t) for k, t in splits.items()}
    ablations: dict = {}  # (split, mode) -> resolved Ablation (mean mode: that split's head means, once)
    buttons, rows = _head_buttons(lm, preset)
    mode_w = W.ToggleButtons(options=["zero", "mean"], value=mode, description="mode")
    split_w = W.ToggleButtons(options=list(splits), value="search", description="split")
    clear = W.Button(description="clear all")
    out = W.Output()

    def run(*_):
        heads = [k for k, b in buttons.items() if b.value]
        enc = encs[split_w.value]
        key = (split_w.value, mode_w.value)
        if key not in ablations:
            ablations[key] = Ablation.of(mode_w.value).resolved(lm, enc.inputs)
        base = evaluate(lm, enc, (), mode=ablations[key])
        abl = evaluate(lm, enc, heads, mode=ablations[key])
        with out:
            out.clear_output(wait=True)
            _print_flips(splits[split_w.value].items, heads, base, abl, max_items_shown)

    for w in (*buttons.values(), mode_w, split_w):
        w.observe(run, names="value")

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


_EXPLORER_CSS = """
.cel-explorer{border:1px solid #ccd;border-radius:6px;padding:10px 14px;margin:10px 0;font-size:14px;max-width:640px}
.cel-explorer .cel-exp-title{font-weight:600;margin-bottom:6px}
.cel-explorer button{margin:2px;padding:3px 9px;border:1px solid #889;border-radius:4px;background:#fff;
 cursor:pointer;font-family:monospace}
.cel-explorer button[aria-pressed=true]{background:#c0392b;color:#fff;border-color:#c0392b}
.cel-explorer table{border-collapse:collapse;margin-top:8px}
.cel-explorer td,.cel-explorer th{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}
.cel-explorer td:first-child,.cel-explorer th:first-child{text-align:left}
.cel-explorer .up{color:#1e8449;font-weight:600}.cel-explorer .down{color:#c0392b;font-weight:600}
.cel-explorer .cel-exp-note{color:#555;font-size:12px;margin-top:6px}
"""

_EXPLORER_JS = """
(function(){
  var D = %(data)s;
  var root = document.getElementById(%(id)s);
  if (!root) return;
  var bits = 0;
  function fmt(x, d){ return (x >= 0 && d ? "+" : "") + x.toFixed(3); }
  function cls(x){ return x > 1e-9 ? "up" : (x < -1e-9 ? "down" : ""); }
  function render(){
    var r = D.subsets[bits], b = D.subsets[0];
    var cells = {sa: r[0], ha: r[1], sm: r[2], hm: r[3]};
    var base = {sa: b[0], ha: b[1], sm: b[2], hm: b[3]};
    for (var k in cells){
      root.querySelector("." + k).textContent = fmt(cells[k], false);
      var d = root.querySelector("." + k + "d");
      d.textContent = fmt(cells[k] - base[k], true);
      d.className = k + "d " + cls(cells[k] - base[k]);
    }
    var names = [];
    root.querySelectorAll("button[data-bit]").forEach(function(btn){
      var on = (bits >> Number(btn.dataset.bit)) & 1;
      btn.setAttribute("aria-pressed", on ? "true" : "false");
      if (on) names.push(btn.textContent);
    });
    root.querySelector(".cel-exp-set").textContent = names.length ? names.join(", ") : "(none: the unablated model)";
    root.dataset.mask = String(bits);
  }
  root.querySelectorAll("button[data-bit]").forEach(function(btn){
    btn.addEventListener("click", function(){ bits ^= (1 << Number(btn.dataset.bit)); render(); });
  });
  root.querySelector("button.cel-exp-clear").addEventListener("click", function(){ bits = 0; render(); });
  render();
})();
"""


def subset_explorer_html(data: dict) -> str:
    """Self-contained HTML + JS: toggle pool heads and read the exact precomputed figures of that subset.

    ``data`` is :meth:`cel_utils.joint.JointSearch.explorer_data` (pool names; per subset bitmask:
    search accuracy, held-out accuracy, search margin, held-out margin). Works with no kernel and no network.

    Example:
        >>> d = {"model": "m", "task": "t", "pool": ["L0H1"], "n_search": 2, "n_heldout": 2,
        ...      "subsets": {0: [0.5, 0.5, 0.1, 0.2], 1: [1.0, 0.5, 0.3, 0.1]}}
        >>> html = subset_explorer_html(d)
        >>> 'data-bit="0"' in html and "L0H1" in html
        True
    """
    import hashlib
    import html as H
    import json

    from .defaults import EXPLORER_POOL_MAX

    m = len(data["pool"])
    if m > EXPLORER_POOL_MAX:
        raise ValueError(f"the explorer embeds at most {EXPLORER_POOL_MAX} pool heads (2^m subsets), got {m}")
    if sorted(int(k) for k in data["subsets"]) != list(range(2 ** m)):
        raise ValueError(f"the explorer needs all {2 ** m} subsets of the pool")
    blob = json.dumps({"pool": data["pool"], "subsets": {str(int(k)): v for k, v in data["subsets"].items()}},
                      sort_keys=True)
    uid = "cel-exp-" + hashlib.sha1((data["model"] + data["task"] + blob).encode()).hexdigest()[:10]
    buttons = "".join(f'<button type="button" data-bit="{i}" aria-pressed="false">{H.escape(n)}</button>'
                      for i, n in enumerate(data["pool"]))
    title = f'{H.escape(data["model"])} &middot; {H.escape(data["task"])}: click heads to ablate them together'
    return (f"<style>{_EXPLORER_CSS}</style>"
            f'<div class="cel-explorer" id="{uid}" data-mask="0">'
            f'<div class="cel-exp-title">{title}</div>'
            f'<div class="cel-exp-buttons">{buttons}'
            f'<button type="button" class="cel-exp-clear">clear</button></div>'
            f'<div>ablated: <span class="cel-exp-set"></span></div>'
            f'<table><tr><th></th><th>search (n={data["n_search"]})</th><th>change</th>'
            f'<th>held-out (n={data["n_heldout"]})</th><th>change</th></tr>'
            f'<tr><td>accuracy</td><td class="sa"></td><td class="sad"></td><td class="ha"></td><td class="had"></td></tr>'
            f'<tr><td>mean margin</td><td class="sm"></td><td class="smd"></td><td class="hm"></td><td class="hmd"></td></tr>'
            f"</table>"
            f'<div class="cel-exp-note">Every one of the {2 ** m} subsets of these {m} heads was evaluated on the real '
            f"model when the book was built; the page looks the figures up, no kernel needed. Choose sets on the "
            f"search split; the held-out column is the honest one.</div></div>"
            f"<script>{_EXPLORER_JS % {'data': blob, 'id': json.dumps(uid)}}</script>")


def subset_explorer(js):
    """Display the kernel-free subset explorer for a :class:`cel_utils.search.JointSearch` (or its data)."""
    from IPython.display import HTML

    data = js.explorer_data() if hasattr(js, "explorer_data") else js
    return HTML(subset_explorer_html(data))
