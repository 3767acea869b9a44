"""Live-notebook explorers (ipywidgets), which need a running kernel, and the kernel-free subset explorer.

The subset explorer (:func:`subset_explorer`) is static HTML + JS: every subset's figures (accuracy, change with
a 95% CI, joint minus sum, random-set percentile, plot coordinates) are computed and formatted in Python
(:func:`explorer_states`, with :func:`cel_utils.tables.cell`, so they read as in the tables); the page only
looks them up.

Example:
    >>> from cel_utils.widgets import theory_explorer   # doctest: +SKIP
    >>> theory_explorer()                              # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import html as H
import json
import math

import ipywidgets as W
import numpy as np
from IPython.display import HTML, display

from . import plots, theory, theory_plots
from .ablation import Ablation, format_heads, head_name
from .defaults import EXPLORER_POOL_MAX, N_BOOT, static_book
from .engine import evaluate
from .scoring import encode_task
from .search import heads_of, percentile_among
from .tables import cell


def theory_explorer(steps: int = 3000):
    """Sliders for sigma, number of heads and seed; retrains the toy model (about a second) and redraws."""
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
            display(theory_plots.theory_heads(r))

    plots.setup()
    for w in (sigma, heads, seed):
        w.observe(redraw, names="value")
    box = W.VBox([W.HBox([sigma, heads, seed]), out])
    redraw()
    display(box)
    return box


def _head_buttons(lm, preset=()):
    """One toggle button per head, in rows of layers: ``({(layer, head): button}, [row boxes])``."""
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
    right -> wrong). Controls choose the ablation mode and the split (search, or held-out if given). In the
    static book (:func:`cel_utils.defaults.static_book`) it shows a one-line note instead: a grid that cannot
    react would only mislead.
    """
    if static_book():
        display(HTML("<p><em>The live head grid needs a running kernel: open this chapter as a notebook to toggle "
                     "heads on the real model.</em></p>"))
        return None
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


# ---------------------------------------------------------------------------------------------------------------
# The kernel-free subset explorer: static HTML + JS with every subset's figures formatted in Python.
# ---------------------------------------------------------------------------------------------------------------

_SPLITS = ("search", "heldout")


def subset_explorer_data(js, lm=None, search=None, heldout=None, mode="zero", n_boot: int | None = None,
                         seed: int = 0) -> dict:
    """Everything the explorer shows, unformatted: per subset mask and split (``search``, ``heldout`` = the first
    ``js.n_explore`` held-out items) the accuracy, its change with a 95% paired-bootstrap CI, the mean margin
    and its change; and the plain random control's held-out changes per set size.

    ``js`` is a :class:`cel_utils.joint.JointSearch`. The CIs need the per-item results, which ``js`` does not
    keep: pass ``lm`` and the ``search`` and ``heldout`` tasks (and ``mode``, ``seed``, ``n_boot``) given to
    :func:`~cel_utils.joint.joint_search`; every subset is then compared again with
    :func:`cel_utils.compare.compare_sets` (the same call as the search's, so the result cache answers it) and
    checked against ``js``. Without them the CIs are NaN.

    Example:
        >>> d = subset_explorer_data(js, lm=lm, search=split["search"], heldout=split["heldout"])  # doctest: +SKIP
        >>> d["rows"][3]["heldout"]["ci_low"]                                                     # doctest: +SKIP
    """
    masks = [int(x) for x in js.subsets["mask"]]
    t = js.subsets.set_index("mask")
    rows = {}
    for mk in masks:
        r = t.loc[mk]
        rows[mk] = {sp: {"accuracy": float(r[f"{col}_accuracy"]), "delta_accuracy": float(r[f"{col}_delta_accuracy"]),
                         "ci_low": float("nan"), "ci_high": float("nan"), "mean_margin": float(r[f"{col}_margin"]),
                         "delta_margin": float(r[f"{col}_delta_margin"])}
                    for sp, col in (("search", "search"), ("heldout", "explore"))}
    if lm is not None:
        from dataclasses import replace

        from .ablation import Ablation
        from .compare import compare_sets
        from .scoring import encode_task

        if search is None or heldout is None:
            raise ValueError("the explorer's CIs need both the search and the held-out task with lm")
        enc_s = encode_task(lm, search)
        enc_h = encode_task(lm, replace(heldout, items=heldout.items[:js.n_explore]))
        ablation = Ablation.of(mode).resolved(lm, enc_s.inputs)  # as joint_search: means from the search split
        named = {format_heads(heads_of(mk, js.pool)): list(heads_of(mk, js.pool)) for mk in masks[1:]}
        for sp, enc in (("search", enc_s), ("heldout", enc_h)):
            tab = compare_sets(lm, enc, named, mode=ablation, n_boot=N_BOOT if n_boot is None else n_boot,
                               seed=seed).table  # one row per non-empty subset, in ``masks[1:]`` order
            got = np.concatenate([[tab["baseline_accuracy"].iloc[0]], tab["accuracy"]])
            want = np.array([rows[mk][sp]["accuracy"] for mk in masks])
            if not np.allclose(got, want, atol=1e-9):
                raise ValueError(f"the {sp} task given is not the one this joint search used (accuracies differ)")
            for mk, r in zip(masks[1:], tab.itertuples()):
                rows[mk][sp]["ci_low"], rows[mk][sp]["ci_high"] = float(r.ci_low), float(r.ci_high)
        for sp in _SPLITS:
            rows[0][sp]["ci_low"] = rows[0][sp]["ci_high"] = 0.0  # the unablated model against itself
    rc = js.random_control
    random = {int(k): [float(v) for v in g["heldout_delta_accuracy"]] for k, g in rc.groupby("size")} if len(rc) else {}
    return {"model": js.model, "task": js.task, "pool": [head_name(h) for h in js.pool], "n_search": js.n_search,
            "n_heldout": js.n_explore, "rows": rows, "random": random}


def _rows_from_lists(data: dict) -> dict:
    """The older data format (:meth:`JointSearch.explorer_data`: per mask ``[search accuracy, held-out accuracy,
    search margin, held-out margin]``) as rows of :func:`subset_explorer_data` (no CIs)."""
    subs = {int(k): [float(x) for x in v] for k, v in data["subsets"].items()}
    b = subs[0]
    return {mk: {sp: {"accuracy": v[j], "delta_accuracy": v[j] - b[j], "ci_low": float("nan"),
                      "ci_high": float("nan"), "mean_margin": v[j + 2], "delta_margin": v[j + 2] - b[j + 2]}
                 for j, sp in enumerate(_SPLITS)} for mk, v in subs.items()}


def _axis(values, x0: float = 80.0, width: float = 320.0):
    """A shared horizontal scale for the explorer's plot: ``(x_of, [(x, label)] ticks)``; includes 0."""
    v = np.asarray([x for x in values if np.isfinite(x)] + [0.0])
    lo, hi = float(v.min()), float(v.max())
    pad = 0.06 * (hi - lo) if hi > lo else 0.1
    lo, hi = lo - pad, hi + pad
    step = next(s for s in (0.01, 0.02, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 1e9)
                if (hi - lo) / s <= 5)
    x_of = lambda x: round(x0 + (x - lo) / (hi - lo) * width, 1)  # noqa: E731
    ticks = [(x_of(k * step), cell(k * step, "delta", 3 if step < 0.1 else 2))
             for k in range(int(np.ceil(lo / step)), int(np.floor(hi / step)) + 1)]
    return x_of, ticks


def _explorer_svg(x_of, ticks, random: dict) -> str:
    """The static SVG of :func:`explorer_states`: the search and held-out rows, the zero line and ticks of the
    shared scale ``x_of``, the random sets' changes per size (hidden until that size is chosen), and the point
    and CI line of each row (placed by the page)."""
    y = {"s": 20, "h": 46}
    parts = [f'<svg class="cel-exp-plot" width="410" height="84" viewBox="0 0 410 84" role="img" '
             f'aria-label="change in accuracy with 95% CI">',
             f'<text x="4" y="{y["s"] + 4}" font-size="11">search</text>',
             f'<text x="4" y="{y["h"] + 4}" font-size="11">held-out</text>',
             f'<line x1="80" x2="400" y1="62" y2="62" stroke="#999"/>']
    for tx, label in ticks:
        parts.append(f'<line x1="{tx}" x2="{tx}" y1="8" y2="65" stroke="{"#888" if label in ("+0.00", "+0.000") else "#eee"}"/>'
                     f'<text x="{tx}" y="77" font-size="10" text-anchor="middle">{label}</text>')
    for k, vs in sorted(random.items()):
        dots = "".join(f'<circle cx="{x_of(v)}" cy="{y["h"]}" r="2.5"/>' for v in vs)
        parts.append(f'<g class="cel-exp-rand" data-size="{k}" fill="#999" fill-opacity="0.35" '
                     f'style="display:none">{dots}</g>')
    for s in ("s", "h"):
        parts.append(f'<line class="cel-exp-ci-{s}" y1="{y[s]}" y2="{y[s]}" stroke="#333" stroke-width="2"/>'
                     f'<circle class="cel-exp-pt-{s}" cy="{y[s]}" r="5"/>')
    parts.append("</svg>")
    return "".join(parts)


def explorer_states(data: dict) -> tuple[dict, str]:
    """Per subset mask, what the page shows, formatted in Python like the book's tables
    (:func:`cel_utils.tables.cell`, so 0.8125 reads 0.812 in both), plus the plot's coordinates; and the
    static SVG the states draw into.

    ``data``: :func:`subset_explorer_data` or the older :meth:`JointSearch.explorer_data`. A state is
    ``{"t": {cell class: text}, "c": {cell class: "up"/"down"/""}, "p": [6 x-coordinates], "k": size}``; ``p``
    is (point, CI low, CI high) on the search row, then on the held-out row (a CI of zero length when unknown).

    Example:
        >>> d = {"model": "m", "task": "t", "pool": ["L0H1"], "n_search": 16, "n_heldout": 16,
        ...      "subsets": {0: [0.5, 0.5, 0.1, 0.2], 1: [0.8125, 0.5, 0.3, 0.1]}}
        >>> states, svg = explorer_states(d)
        >>> states[1]["t"]["sa"], states[1]["t"]["sad"], "<svg" in svg
        ('0.812', '+0.312', True)
    """
    rows = data["rows"] if "rows" in data else _rows_from_lists(data)
    rows = {int(k): v for k, v in rows.items()}
    random = {int(k): list(v) for k, v in (data.get("random") or {}).items()}
    m = len(data["pool"])
    singles = {i: {sp: rows[1 << i][sp]["delta_accuracy"] for sp in _SPLITS} for i in range(m)}
    vals = [r[sp][f] for r in rows.values() for sp in _SPLITS for f in ("delta_accuracy", "ci_low", "ci_high")]
    x_of, ticks = _axis(vals + [v for vs in random.values() for v in vs])
    sign = lambda x: "up" if x > 1e-9 else ("down" if x < -1e-9 else "")  # noqa: E731
    dash = "\u2014"
    states = {}
    for mk, r in sorted(rows.items()):
        k = bin(mk).count("1")
        t, c, p = {}, {}, []
        for sp, s in zip(_SPLITS, ("s", "h")):
            x = r[sp]
            jms = x["delta_accuracy"] - sum(singles[i][sp] for i in range(m) if mk >> i & 1)  # joint - sum
            has_ci = math.isfinite(x["ci_low"]) and math.isfinite(x["ci_high"])
            t[s + "a"], t[s + "ad"] = cell(x["accuracy"], "accuracy"), cell(x["delta_accuracy"], "delta")
            t[s + "m"], t[s + "md"] = cell(x["mean_margin"], "margin"), cell(x["delta_margin"], "delta")
            t[s + "ci"] = f"[{cell(x['ci_low'], 'delta')}, {cell(x['ci_high'], 'delta')}]" if has_ci and k else dash
            t[s + "jms"] = cell(jms, "interaction") if k >= 2 else dash
            c[s + "ad"], c[s + "md"], c[s + "jms"] = sign(x["delta_accuracy"]), sign(x["delta_margin"]), \
                sign(jms) if k >= 2 else ""
            lo, hi = (x["ci_low"], x["ci_high"]) if has_ci else (x["delta_accuracy"],) * 2
            p += [x_of(x["delta_accuracy"]), x_of(lo), x_of(hi)]
        ctrl = random.get(k, [])
        if k == 0 or not ctrl:
            t["hpct"] = dash
        else:  # mid-rank percentile of the held-out change among the random sets of this size
            pct = percentile_among(ctrl, r["heldout"]["delta_accuracy"])
            t["hpct"] = f"{pct:.0f} (of {len(ctrl)})"
        states[mk] = {"t": t, "c": c, "p": p, "k": k}
    return states, _explorer_svg(x_of, ticks, random)


_EXPLORER_CSS = """
.cel-explorer{border:1px solid #ccd;border-radius:6px;padding:10px 14px;margin:10px 0;font-size:14px;max-width:640px}
.cel-explorer .cel-exp-title{font-weight:600;margin-bottom:6px}
.cel-explorer button{margin:2px;padding:3px 9px;border:1px solid #889;border-radius:4px;background:#fff;
 cursor:pointer;font-family:monospace}
.cel-explorer button[aria-pressed=true]{background:#c0392b;color:#fff;border-color:#c0392b}
.cel-explorer .cel-exp-scroll{overflow-x:auto;max-width:100%}
.cel-explorer table{border-collapse:collapse;margin-top:8px}
.cel-explorer td,.cel-explorer th{padding:3px 7px;text-align:right;border-bottom:1px solid #eee;white-space:nowrap}
.cel-explorer td:first-child,.cel-explorer th:first-child{text-align:left;white-space:normal}
.cel-explorer .up{color:#1e8449;font-weight:600}.cel-explorer .down{color:#c0392b;font-weight:600}
.cel-explorer circle.up{fill:#1e8449}.cel-explorer circle.down{fill:#c0392b}.cel-explorer circle{fill:#555}
.cel-explorer .cel-exp-rand circle{fill:#999}
.cel-explorer .cel-exp-note{color:#555;font-size:12px;margin-top:6px}
"""

_EXPLORER_JS = """
(function(){
  var D = %(data)s;
  var root = document.getElementById(%(id)s);
  if (!root) return;
  var bits = 0;
  function render(){
    var st = D.states[bits];
    for (var k in st.t){
      var el = root.querySelector("." + k);
      el.textContent = st.t[k];
      el.className = k + (st.c[k] ? " " + st.c[k] : "");
    }
    ["s", "h"].forEach(function(s, j){
      var pt = root.querySelector(".cel-exp-pt-" + s), ci = root.querySelector(".cel-exp-ci-" + s);
      pt.setAttribute("cx", st.p[3 * j]); pt.setAttribute("class", "cel-exp-pt-" + s + (st.c[s + "ad"] ? " " + st.c[s + "ad"] : ""));
      ci.setAttribute("x1", st.p[3 * j + 1]); ci.setAttribute("x2", st.p[3 * j + 2]);
    });
    root.querySelectorAll(".cel-exp-rand").forEach(function(g){
      g.style.display = Number(g.dataset.size) === st.k ? "" : "none";
    });
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


def _explorer_notes(m: int, has_ci: bool, has_random: bool) -> str:
    """The explorer's note under the plot (HTML-escaped): how the figures were made, for ``m`` pool heads, with
    or without CIs and the random sets' control."""
    notes = [f"Every one of the {2 ** m} subsets of these {m} heads was evaluated on the real model when the book "
             "was built; the page looks the figures up, no kernel needed. Choose sets on the search split; the "
             "held-out column is the honest one."]
    notes.append("95% CI: paired bootstrap over items of the change in accuracy against the unablated model." if has_ci else
                 "No per-item results were embedded, so no CIs are shown.")
    if has_random:
        notes.append("Percentile: where the held-out change falls among random head sets of the same size drawn "
                     "from all heads (the plain control; ties count half).")
    notes.append("Joint minus sum (accuracy): the set's change in accuracy minus the sum of its heads' changes alone "
                 "(0 when the heads' effects add up).")
    if has_random:
        notes.append("Plot: the change in accuracy (dot) with its 95% CI (line); grey dots on the held-out row: "
                     "random head sets of the same size drawn from all heads (the plain control), on the same "
                     "items.")
    else:
        notes.append("Plot: the change in accuracy (dot) with its 95% CI (line).")
    return " ".join(H.escape(n) for n in notes)


def subset_explorer_html(data: dict) -> str:
    """Self-contained HTML + JS: toggle pool heads and read the exact precomputed figures of that subset.

    ``data`` is :func:`subset_explorer_data` (with CIs when it had the per-item results) or the older
    :meth:`cel_utils.joint.JointSearch.explorer_data` (pool names; per subset bitmask: search accuracy,
    held-out accuracy, search margin, held-out margin). Shown per subset: accuracy and its change with a 95% CI,
    mean margin, the joint change minus the sum of the members' single-head changes, the held-out change's
    percentile among random head sets of the same size, and a plot of the changes. Every figure is formatted
    in Python (:func:`explorer_states`); the page only looks them up. Works with no kernel and no network.

    Example:
        >>> d = {"model": "m", "task": "t", "pool": ["L0H1"], "n_search": 2, "n_heldout": 2,
        ...      "subsets": {0: [0.5, 0.5, 0.1, 0.2], 1: [1.0, 0.5, 0.3, 0.1]}}
        >>> html = subset_explorer_html(d)
        >>> 'data-bit="0"' in html and "L0H1" in html
        True
    """
    m = len(data["pool"])
    if m > EXPLORER_POOL_MAX:
        raise ValueError(f"the explorer embeds at most {EXPLORER_POOL_MAX} pool heads (2^m subsets), got {m}")
    keys = data["rows"] if "rows" in data else data["subsets"]
    if sorted(int(k) for k in keys) != list(range(2 ** m)):
        raise ValueError(f"the explorer needs all {2 ** m} subsets of the pool")
    states, svg = explorer_states(data)
    blob = json.dumps({"pool": data["pool"], "states": {str(k): v for k, v in states.items()}}, sort_keys=True,
                      ensure_ascii=True)
    uid = "cel-exp-" + hashlib.sha1((data["model"] + data["task"] + blob).encode()).hexdigest()[:10]
    buttons = "".join(f'<button type="button" data-bit="{i}" aria-pressed="false">{H.escape(n)}</button>'
                      for i, n in enumerate(data["pool"]))
    title = f'{H.escape(data["model"])} &middot; {H.escape(data["task"])}: click heads to ablate them together'
    has_ci = any(st["t"]["sci"] != "\u2014" for mk, st in states.items() if mk)
    row = lambda label, cells: "<tr><td>" + label + "</td>" + "".join(  # noqa: E731
        f'<td class="{c}"></td>' if c else "<td></td>" for c in cells) + "</tr>"
    notes = _explorer_notes(m, has_ci, bool(data.get("random")))
    return (f"<style>{_EXPLORER_CSS}</style>"
            f'<div class="cel-explorer" id="{uid}" data-mask="0">'
            f'<div class="cel-exp-title">{title}</div>'
            f'<div class="cel-exp-buttons">{buttons}'
            f'<button type="button" class="cel-exp-clear">clear</button></div>'
            f'<div>ablated: <span class="cel-exp-set"></span></div>'
            f'<div class="cel-exp-scroll"><table><tr><th></th><th>search (n={data["n_search"]})</th><th>change</th>'
            f'<th>held-out (n={data["n_heldout"]})</th><th>change</th></tr>'
            + row("accuracy", ["sa", "sad", "ha", "had"])
            + row("95% CI", ["", "sci", "", "hci"])
            + row("mean margin", ["sm", "smd", "hm", "hmd"])
            + row("joint minus sum", ["", "sjms", "", "hjms"])
            + row("random-set percentile", ["", "", "", "hpct"])
            + f"</table></div>{svg}"
            f'<div class="cel-exp-note">{notes}</div></div>'
            f"<script>{_EXPLORER_JS % {'data': blob, 'id': json.dumps(uid)}}</script>")


def subset_explorer(js, lm=None, search=None, heldout=None, mode="zero", n_boot: int | None = None, seed: int = 0):
    """Display the kernel-free subset explorer for a :class:`cel_utils.joint.JointSearch` (or its data).

    With ``lm`` and the ``search`` and ``heldout`` tasks given to the joint search (and its ``mode``,
    ``n_boot``, ``seed``), the page also shows 95% CIs (see :func:`subset_explorer_data`).

    Example:
        >>> subset_explorer(js, lm=lm, search=split["search"], heldout=split["heldout"], mode="zero")  # doctest: +SKIP
    """
    if hasattr(js, "subsets") and hasattr(js, "random_control"):
        data = subset_explorer_data(js, lm=lm, search=search, heldout=heldout, mode=mode, n_boot=n_boot, seed=seed)
    else:
        data = js.explorer_data() if hasattr(js, "explorer_data") else js
    return HTML(subset_explorer_html(data))
