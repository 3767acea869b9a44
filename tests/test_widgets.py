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


# ---- the kernel-free subset explorer (static HTML + JS, figures formatted in Python) ----------------------------

def _states_in(html):
    """The per-subset states a page embeds (the JSON the script looks up)."""
    import json
    import re

    return {int(k): v for k, v in json.loads(re.search(r"var D = (\{.*?\});\n", html).group(1))["states"].items()}


@pytest.fixture(scope="module")
def explored(tiny_llama):
    """A joint search over a 3-head pool of the tiny Llama whose heads move held-out answers, and its explorer
    data with CIs (the tasks given again, as the chapter would)."""
    from cel_utils.ablation import parse_heads
    from cel_utils.joint import joint_search
    from cel_utils.widgets import subset_explorer_data

    lm = tiny_llama
    s, c, h = (load_task("ioi", split, n=n) for split, n in (("search", 8), ("confirm", 4), ("heldout", 8)))
    pool = parse_heads("L0H2,L1H3,L2H3", lm.n_layers, lm.n_heads)
    js = joint_search(lm, s, c, h, pool, max_k=2, random_sets=4, random_pools=0, n_explore=8, fdr=1.01,
                      progress=False, n_boot=200)
    data = subset_explorer_data(js, lm=lm, search=s, heldout=h, n_boot=200, seed=0)
    return lm, s, h, js, data


def test_subset_explorer_figures_equal_direct_evaluations(explored):
    """Every subset's embedded text (accuracy, change, 95% CI, joint minus sum, random-set percentile) equals an
    independent computation: the plain reference loop with those heads removed, the paired bootstrap redone
    here with numpy on its per-item results, the control's percentile counted by hand; the plot follows."""
    from dataclasses import replace

    import numpy as np

    from cel_utils.scoring import encode_task, plain_evaluate
    from cel_utils.search import heads_of
    from cel_utils.tables import cell
    from cel_utils.widgets import subset_explorer_html

    lm, s, h, js, data = explored
    states = _states_in(subset_explorer_html(data))
    assert sorted(states) == list(range(8))
    encs = {"s": encode_task(lm, s), "h": encode_task(lm, replace(h, items=h.items[:js.n_explore]))}
    runs = {(sp, mk): plain_evaluate(lm, enc, heads_of(mk, js.pool)) for sp, enc in encs.items() for mk in range(8)}
    ctrl = js.random_control
    nontrivial_ci = 0
    for mk in range(8):
        k = bin(mk).count("1")
        t = states[mk]["t"]
        for sp in ("s", "h"):
            base, abl = runs[sp, 0].correct[0].astype(float), runs[sp, mk].correct[0].astype(float)  # [n_items]
            delta = abl.mean() - base.mean()
            assert t[sp + "a"] == cell(abl.mean(), "accuracy") and t[sp + "ad"] == cell(delta, "delta"), (mk, sp)
            # paired bootstrap of the mean change over items, same resampling convention (seed 0, 200 resamples)
            d = abl - base
            idx = np.random.default_rng(0).integers(0, len(d), size=(200, len(d)))
            lo, hi = np.quantile(d[idx].mean(axis=1), [0.025, 0.975])
            if k:
                assert t[sp + "ci"] == f"[{cell(lo, 'delta')}, {cell(hi, 'delta')}]", (mk, sp)
                nontrivial_ci += lo < hi
            singles = sum(runs[sp, 1 << i].correct[0].mean() - base.mean() for i in range(3) if mk >> i & 1)
            assert t[sp + "jms"] == (cell(delta - singles, "interaction") if k >= 2 else "\u2014"), (mk, sp)
            # the plot: the dot sits inside its CI, the search and held-out rows on one scale
            x, xlo, xhi = states[mk]["p"][:3] if sp == "s" else states[mk]["p"][3:]
            assert xlo <= x <= xhi and (xlo < xhi) == (k > 0 and lo < hi)
        if k:
            c = ctrl[ctrl["size"] == k]["heldout_delta_accuracy"].to_numpy()
            hd = runs["h", mk].correct[0].mean() - runs["h", 0].correct[0].mean()
            pct = 100 * ((c < hd - 1e-9).sum() + 0.5 * (np.abs(c - hd) <= 1e-9).sum()) / len(c) if len(c) else None
            assert t["hpct"] == ("\u2014" if pct is None else f"{pct:.0f} (of {len(c)})"), mk
    assert nontrivial_ci >= 4  # the pool moves answers: most CIs are not a point
    assert states[0]["t"]["hpct"] == "\u2014" and [states[4]["t"]["hpct"], states[7]["t"]["hpct"]] != ["\u2014"] * 2
    # the dots keep the order of the changes (one scale for every state)
    xs = [states[mk]["p"][3] for mk in range(8)]
    ds = [data["rows"][mk]["heldout"]["delta_accuracy"] for mk in range(8)]
    assert all((a < b) == (x < y) for a, x in zip(ds, xs) for b, y in zip(ds, xs) if abs(a - b) > 1e-9)


def test_subset_explorer_plot_and_controls_per_state(explored):
    """The page carries one plot (a dot and a CI line per split) and the random sets of each size, hidden
    until a subset of that size is shown; every state has the plot's coordinates."""
    from cel_utils.widgets import subset_explorer_html

    *_, js, data = explored
    html = subset_explorer_html(data)
    assert html.count('<svg class="cel-exp-plot"') == 1
    for cls in ("cel-exp-pt-s", "cel-exp-pt-h", "cel-exp-ci-s", "cel-exp-ci-h"):
        assert html.count(f'class="{cls}"') == 1
    for k, g in js.random_control.groupby("size"):
        assert f'data-size="{k}"' in html
    assert html.count('class="cel-exp-rand"') == js.random_control["size"].nunique()
    for st in _states_in(html).values():
        assert len(st["p"]) == 6 and all(80 <= x <= 400 for x in st["p"])
    assert "toFixed" not in html and "http" not in html  # the page formats nothing and fetches nothing


def test_subset_explorer_rounds_like_the_tables():
    """0.8125 (13/16) reads 0.812 in the explorer and in the book's tables (Python rounds the exact binary value
    half to even; the page used to call JavaScript's toFixed, which rounds it up to 0.813)."""
    import pandas as pd

    from cel_utils.tables import table
    from cel_utils.widgets import explorer_states, subset_explorer_html

    old = {"model": "m", "task": "t", "pool": ["L0H1"], "n_search": 16, "n_heldout": 16,
           "subsets": {0: [0.5, 0.5, 0.1, 0.2], 1: [0.8125, 0.5, 0.3, 0.1]}}
    nan = float("nan")
    row = lambda a, d, lo, hi: {"accuracy": a, "delta_accuracy": d, "ci_low": lo, "ci_high": hi,  # noqa: E731
                                "mean_margin": 0.0, "delta_margin": 0.0}
    new = {**old, "rows": {0: {"search": row(0.5, 0, 0, 0), "heldout": row(0.5, 0, 0, 0)},
                           1: {"search": row(0.8125, 0.3125, 0.0625, 0.5625), "heldout": row(0.5, 0, nan, nan)}}}
    del new["subsets"]
    shown = table(pd.DataFrame({"accuracy": [0.8125], "delta_accuracy": [0.3125], "ci_low": [0.0625],
                                "ci_high": [0.5625]}), ci={"ci_low": "ci_high"}).data
    assert "<td>0.812</td>" in shown and "<td>+0.312</td>" in shown and "[+0.062, +0.562]" in shown
    for data in (old, new):
        st = _states_in(subset_explorer_html(data))[1]["t"]
        assert st["sa"] == "0.812" and st["sad"] == "+0.312" and explorer_states(data)[0][1]["t"] == st
    assert _states_in(subset_explorer_html(new))[1]["t"]["sci"] == "[+0.062, +0.562]"
    assert _states_in(subset_explorer_html(new))[1]["t"]["hci"] == "\u2014"  # no CI known: a dash, not "nan"


def test_subset_explorer_keeps_its_old_calls(explored):
    """``subset_explorer(js)`` and ``subset_explorer(js.explorer_data())`` still work (no CIs); given tasks that
    are not the search's, the CIs are refused rather than mismatched."""
    from cel_utils.widgets import subset_explorer, subset_explorer_data

    lm, s, h, js, data = explored
    full = _states_in(subset_explorer(js, lm=lm, search=s, heldout=h, n_boot=200).data)[3]["t"]
    assert full["hci"] != "\u2014"
    for arg in (js, js.explorer_data()):
        st = _states_in(subset_explorer(arg).data)[3]["t"]
        assert st["hci"] == "\u2014" and st["ha"] == full["ha"] and st["hjms"] == full["hjms"]
    with pytest.raises(ValueError, match="not the one this joint search used"):
        subset_explorer_data(js, lm=lm, search=load_task("ioi", "confirm", n=2), heldout=h, n_boot=200)


_PROBE = """<script>
(function () {
  var root = document.querySelector(".cel-explorer"), out = [], b = root.querySelectorAll("button[data-bit]");
  function snap() {
    var t = {};
    root.querySelectorAll("td[class]").forEach(function (td) { t[td.className.split(" ")[0]] = td.textContent; });
    var pt = root.querySelector(".cel-exp-pt-h"), ci = root.querySelector(".cel-exp-ci-h");
    var shown = [];
    root.querySelectorAll(".cel-exp-rand").forEach(function (g) { if (g.style.display !== "none") shown.push(g.dataset.size); });
    out.push({mask: Number(root.dataset.mask), t: t, p: [Number(root.querySelector(".cel-exp-pt-s").getAttribute("cx")),
              Number(pt.getAttribute("cx")), Number(ci.getAttribute("x1")), Number(ci.getAttribute("x2"))], rand: shown});
  }
  snap(); b[0].click(); snap(); b[2].click(); snap(); b[1].click(); snap(); b[0].click(); snap();
  root.querySelector("button.cel-exp-clear").click(); snap();
  document.body.setAttribute("data-cel-probe", JSON.stringify(out));
})();
</script>"""


@pytest.mark.skipif(__import__("shutil").which("chromium") is None, reason="chromium not installed")
def test_subset_explorer_follows_clicks_in_headless_chromium(explored, tmp_path):
    """Clicks in a real browser: after each, every cell and the plot show exactly that subset's state."""
    import html as H
    import json
    import re
    import subprocess

    from cel_utils.widgets import subset_explorer_html

    *_, data = explored
    page = subset_explorer_html(data)
    states = _states_in(page)
    f = tmp_path / "explorer.html"
    f.write_text(f"<!doctype html><html><body>{page}{_PROBE}</body></html>", encoding="utf-8")
    r = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f.as_uri()],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r'data-cel-probe="([^"]*)"', r.stdout)
    assert m, r.stderr[-2000:]
    seen = json.loads(H.unescape(m.group(1)))
    assert [s["mask"] for s in seen] == [0, 1, 5, 7, 6, 0]
    for s in seen:
        want = states[s["mask"]]
        assert s["t"] == want["t"], s["mask"]
        assert s["p"] == [want["p"][0], want["p"][3], want["p"][4], want["p"][5]]
        assert s["rand"] == ([] if want["k"] == 0 else [str(want["k"])] if want["k"] <= 2 else [])


def test_the_live_grid_is_a_note_in_the_static_book(tiny_llama, monkeypatch):
    """While the book's chapters execute (CEL_STATIC_BOOK=1) the live grid, which needs a kernel to react, is a
    one-line note; in a live notebook it is the grid."""
    from cel_utils.tasks import load_task
    from cel_utils.widgets import head_toggle_grid

    task = load_task("ioi", n=4)
    monkeypatch.setenv("CEL_STATIC_BOOK", "1")
    assert head_toggle_grid(tiny_llama, task) is None
    monkeypatch.setenv("CEL_STATIC_BOOK", "0")
    assert head_toggle_grid(tiny_llama, task) is not None
