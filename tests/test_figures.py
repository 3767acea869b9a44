"""Figures and tables for people: token texts stay visible, counts get whole-number ticks, labels do not overlap,
a single point reads, panels that are compared share a scale."""

from html.parser import HTMLParser
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from cel_utils import joint_plots, plots, tables, theory, theory_plots


def _visible_text(html: str) -> str:
    """The text a browser shows for ``html`` (tags dropped, entities decoded)."""
    class Text(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.parts = []

        def handle_data(self, data):
            self.parts.append(data)

    t = Text()
    t.feed(html)
    return "".join(t.parts)


def test_a_bos_token_survives_as_visible_text_in_a_table():
    df = pd.DataFrame({"token": ["<bos>", " ="], "prompt end": ["<bos>The cat", "1 + 2 ="], "weight": [0.6, 0.1]})
    shown = _visible_text(tables.table(df, formats={"token": repr}).data)
    assert "'<bos>'" in shown and "<bos>The cat" in shown and "' ='" in shown


def test_token_labels_in_figures_are_escaped_for_plotly():
    """plotly drops tags it does not know ('<bos>') from tick labels; escaped, it shows them."""
    fig = plots.token_bars([{"token": "<bos>", "mean_logit": 0.5}], [{"token": " x", "mean_logit": -0.5}])
    assert "'&lt;bos&gt;'" in fig.layout.yaxis.ticktext and "<bos>" not in "".join(fig.layout.yaxis.ticktext)


def _js(sizes, inter=None):
    """A joint search's result as the figures read it: the best set of each size."""
    rows = []
    for k in sizes:
        rows.append({"size": k, "heads": ",".join(f"L0H{h}" for h in range(k)), "search_delta_accuracy": 0.05 * k,
                     "confirm_delta_accuracy": 0.04 * k, "heldout_delta_accuracy": 0.03 * k,
                     "heldout_ci_low": 0.01 * k, "heldout_ci_high": 0.05 * k, "heldout_baseline": 0.7, "heldout_delta_margin": 0.8 + 0.3 * k,
                     "interaction": 0.0 if k == 1 else inter[0], "interaction_ci_low": 0.0 if k == 1 else inter[1],
                     "interaction_ci_high": 0.0 if k == 1 else inter[2]})
    strategies = pd.DataFrame({"strategy": ["greedy"] * len(sizes), "size": sizes,
                               "search_delta_accuracy": [0.05 * k for k in sizes],
                               "heads": [r["heads"] for r in rows]})
    return SimpleNamespace(best=pd.DataFrame(rows), strategies=strategies, model="m", task="t")


def test_search_trajectory_ticks_are_whole_numbers_of_heads():
    fig = joint_plots.search_trajectory(_js([1, 2, 3], inter=(-0.3, -0.4, -0.2)))
    assert list(fig.layout.xaxis.tickvals) == [1, 2, 3]
    assert all(float(v).is_integer() for v in fig.layout.xaxis.tickvals)


def test_interaction_with_one_set_is_a_labelled_point_with_its_ci_and_the_diagonal():
    """Chapter 2's usual case: one set of two heads. Its point is labelled, its CI drawn, and both axes span one
    range that holds the point, the whole CI and the diagonal."""
    fig = joint_plots.interaction(_js([1, 2], inter=(-0.32, -0.38, -0.26)))
    point, diag = fig.data
    assert list(point.text) == ["L0H0,L0H1 (2 heads)"] and "text" in point.mode
    joint, summed = 0.8 + 0.6, 0.8 + 0.6 + 0.32
    assert point.y[0] == pytest.approx(joint) and point.x[0] == pytest.approx(summed)
    assert point.error_y.array[0] == pytest.approx(0.06) and point.error_y.arrayminus[0] == pytest.approx(0.06)
    xr, yr = fig.layout.xaxis.range, fig.layout.yaxis.range
    assert tuple(xr) == tuple(yr)
    assert xr[0] <= min(0, joint - 0.06) and xr[1] >= max(summed, joint + 0.06)
    assert list(diag.x) == list(diag.y) == list(xr)
    # without a set of two heads the figure says so instead of drawing an empty scatter
    empty = joint_plots.interaction(_js([1]))
    assert any("no set of two or more heads" in a.text for a in empty.layout.annotations)


# chapter 1a's winner's-curse points (the base run): L0H7 and L0H1 sit 0.02 apart at the same x
WINNERS = [(0.0, 0.048, "smollm2-135m addition L18H6"), (0.0, 0.048, "smollm2-135m addition L19H4"),
           (0.0312, 0.172, "smollm2-135m addition L13H0"), (-0.0625, 0.056, "smollm2-135m addition L19H3"),
           (0.0312, 0.108, "smollm2-135m addition L1H2"), (0.0625, 0.156, "smollm2-135m agreement_rc L0H7"),
           (0.0, 0.12, "smollm2-135m agreement_rc L11H6"), (0.0625, 0.136, "smollm2-135m agreement_rc L0H1"),
           (-0.0312, 0.044, "smollm2-135m agreement_rc L15H3"), (0.0, 0.068, "smollm2-135m agreement_rc L21H3"),
           (-0.0625, -0.04, "gemma3-270m addition L10H0"), (-0.0312, -0.044, "gemma3-270m addition L9H3"),
           (-0.0625, -0.036, "gemma3-270m addition L5H1"), (-0.0625, -0.024, "gemma3-270m addition L9H2"),
           (-0.0625, -0.056, "gemma3-270m addition L7H0"), (0.0312, 0.024, "gemma3-270m agreement L11H1"),
           (0.0, 0.004, "gemma3-270m agreement L16H0"), (0.0, 0.016, "gemma3-270m agreement L9H0"),
           (0.0, 0.016, "gemma3-270m agreement L13H1"), (0.0312, 0.016, "gemma3-270m agreement L13H3")]


def _label_boxes(fig):
    """Each shown label's pixel box (x0, y0, x1, y1), y up, from the figure's size, margins and axis ranges, and
    every point's pixel position: 6 px per character at font 11, 13 px tall, set off 4.5 px (the marker)."""
    lay, tr = fig.layout, fig.data[0]
    pw = lay.width - lay.margin.l - lay.margin.r
    ph = lay.height - lay.margin.t - lay.margin.b
    (x0, x1), (y0, y1) = lay.xaxis.range, lay.yaxis.range
    px = (np.asarray(tr.x) - x0) / (x1 - x0) * pw
    py = (np.asarray(tr.y) - y0) / (y1 - y0) * ph
    boxes = {}
    for i, (text, where) in enumerate(zip(tr.text, tr.textposition)):
        if not text:
            continue
        w, h, off = 6.0 * len(text), 13.0, 4.5
        v, hz = where.split()
        bx = (px[i] + off, px[i] + off + w) if hz == "right" else (px[i] - off - w, px[i] - off)
        by = {"middle": (py[i] - h / 2, py[i] + h / 2), "top": (py[i] + off, py[i] + off + h),
              "bottom": (py[i] - off - h, py[i] - off)}[v]
        boxes[i] = (bx[0], by[0], bx[1], by[1])
    return boxes, px, py, (pw, ph)


# points side by side at one height, with long names: a label running right would cover its neighbour's
ROW = [(0.02 * i, 0.1 - 0.001 * i, f"a long name for head L{i}H{i}") for i in range(4)] + [(-0.05, -0.05, "L9H9")]


@pytest.mark.parametrize("points, first", [(WINNERS, 2), (ROW, 0)], ids=["chapter 1a", "a row"])
def test_winners_curse_labels_do_not_overlap_each_other_or_other_points(points, first):
    df = pd.DataFrame(points, columns=["search_delta_accuracy", "delta_accuracy", "head"])
    fig = plots.search_vs_heldout(df, x="search_delta_accuracy", y="delta_accuracy", err_low=None)
    boxes, px, py, (pw, ph) = _label_boxes(fig)
    assert len(boxes) >= 3
    assert first in boxes   # the largest held-out change is labelled
    overlap = lambda a, b: not (a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1])  # noqa: E731
    items = list(boxes.items())
    for n, (i, a) in enumerate(items):
        assert a[0] >= 0 and a[2] <= pw and a[1] >= 0 and a[3] <= ph, f"label {i} leaves the plot"
        for j, b in items[n + 1:]:
            assert not overlap(a, b), f"labels {fig.data[0].text[i]!r} and {fig.data[0].text[j]!r} overlap"
        for j in range(len(px)):
            if j != i:
                assert not overlap(a, (px[j] - 4.5, py[j] - 4.5, px[j] + 4.5, py[j] + 4.5)), (i, j)
    # every point keeps its name on hover
    assert list(fig.data[0].hovertext) == [w[2] for w in points]


def test_winners_curse_takes_the_ranking_margin_as_x():
    """x = the search split's change in mean margin (what ranked the heads): its own axis label and range, and no
    diagonal (margin and accuracy are not comparable); with accuracy on both axes the diagonal is there."""
    df = pd.DataFrame({"head": ["a", "b", "c"], "search_delta_margin": [0.4, 1.6, 2.5],
                       "delta_accuracy": [0.01, 0.05, 0.12], "ci_low": [-0.02, 0.01, 0.07],
                       "ci_high": [0.04, 0.09, 0.17]})
    fig = plots.search_vs_heldout(df, x="search_delta_margin", y="delta_accuracy", err_low="ci_low",
                                  err_high="ci_high")
    assert fig.layout.xaxis.title.text == "change in mean margin, search split"
    assert len(fig.data) == 1   # no "held-out = search" line
    (x0, x1), (y0, y1) = fig.layout.xaxis.range, fig.layout.yaxis.range
    assert x0 <= 0 and x1 >= 2.5 and y0 <= -0.02 and 0.17 <= y1 < 0.5
    same = plots.search_vs_heldout(df.assign(search_delta=[0.03, 0.06, 0.1]), x="search_delta",
                                   y="delta_accuracy", err_low="ci_low", err_high="ci_high")
    assert len(same.data) == 2 and tuple(same.layout.xaxis.range) == tuple(same.layout.yaxis.range)


def test_theory_heads_kappa_panels_share_one_scale():
    """Fig 3.2: every head's kappa panel has the same y-range, which holds every head's curve, so the heads that
    carry little of C look flat beside the one that carries it."""
    run = theory.run(n_heads=4, sigma=1e-4, seed=0, steps=4000)
    fig = theory_plots.theory_heads(run)
    k = run.history["kappa"][:, 0]   # [step, head]
    axes = [fig.layout[f"yaxis{h + 5}"] for h in range(4)]   # the second row's axes
    ranges = {tuple(a.range) for a in axes}
    assert len(ranges) == 1
    lo, hi = ranges.pop()
    assert lo <= k.min() and hi >= k.max()
    spread = k.max(0) - k.min(0)
    assert spread.min() < 0.1 * (hi - lo)   # a head that looks flat on the shared scale (not on its own)
    assert {tuple(fig.layout[f"yaxis{h + 1}"].range) for h in range(4)} == {(-0.02, 1.02)}


def test_selector_curves_one_panel_per_pair_whole_number_ticks_and_ci_bands():
    """Chapter 2's "beyond the pool" figure: one panel per (model, task), one line per selector with its CI as a
    closed band around the line, a legend entry per selector (not per panel), whole-number ticks for k."""
    rows = [{"model": m, "task": t, "selector": s, "k": k, "heads": f"{s}{k}", "heldout_delta_accuracy": 0.01 * k,
             "heldout_ci_low": 0.01 * k - 0.02, "heldout_ci_high": 0.01 * k + 0.03}
            for m, t in (("a", "x"), ("b", "y")) for s in ("pool search", "learned gates") for k in (1, 2, 3)]
    fig = joint_plots.selector_curves(pd.DataFrame(rows))
    assert [a.text for a in fig.layout.annotations][:2] == ["a · x", "b · y"]
    lines = [tr for tr in fig.data if tr.mode == "lines+markers"]
    bands = [tr for tr in fig.data if tr.fill == "toself"]
    assert len(lines) == len(bands) == 4 and sum(tr.showlegend for tr in lines) == 2
    for line, band in zip(lines, bands):
        assert list(band.x) == [1, 2, 3, 3, 2, 1]
        assert min(band.y) <= min(line.y) and max(band.y) >= max(line.y)
        assert list(band.y[:3]) == pytest.approx([0.04, 0.05, 0.06])
    assert list(fig.layout.xaxis.tickvals) == [1, 2, 3] and list(fig.layout.xaxis2.tickvals) == [1, 2, 3]


def test_tradeoff_scatter_lays_out_any_number_of_task_pairs():
    """Chapter 3 draws one panel per (model, task A, task B): four tasks on two models is 24 panels in 12 rows,
    which plotly refuses with a fixed row spacing; every panel gets its own axes and its points."""
    import pandas as pd

    from cel_utils.theory_plots import tradeoff_scatter

    tasks = ["a", "b", "c", "d"]
    pts = pd.DataFrame([{"model": m, "task_a": x, "task_b": y, "head": f"L0H{i}", "delta_a": 0.1 * i, "delta_b": -0.1 * i,
                         "confirmed": i == 0} for m in ("m1", "m2") for x in tasks for y in tasks if x != y
                        for i in range(3)])
    fig = tradeoff_scatter(pts)
    assert len(fig.layout.annotations) >= 24  # the panel titles
    domains = sorted({tuple(fig.layout[k].domain) for k in fig.layout if k.startswith("yaxis")})
    assert len(domains) == 12 and all(b[0] > a[1] for a, b in zip(domains, domains[1:]))  # rows do not overlap


def test_head_set_names_wrap_after_each_plus_and_numbers_do_not():
    """A long head-set name may break after each '+' (a <wbr>), so a ten-head set does not widen its column; a
    signed number keeps its '+'; the visible text is unchanged."""
    df = pd.DataFrame({"heads": ["L0H7+L11H6+L3H2"], "delta_accuracy": [0.125], "note": ["1 + 2 = L3"]})
    html = tables.table(df).data
    assert "<td>L0H7+<wbr>L11H6+<wbr>L3H2</td>" in html and "<td>+0.125</td>" in html and "1 + 2 = L3" in html
    assert "L0H7+L11H6+L3H2" in _visible_text(html)


def test_gain_vs_collateral_has_a_legend_and_names_the_task():
    """The caption says 'coloured by label': the legend shows even with one label, and a head chosen on two
    tasks is two distinct points (its task in the point's text)."""
    rows = pd.DataFrame({"label": ["inconclusive"] * 2, "heads": ["L0H7", "L0H7"], "task": ["agreement", "ioi"],
                         "gain": [0.1, 0.05], "gain_ci_low": [0.0, -0.02], "gain_ci_high": [0.2, 0.1],
                         "text_nll_delta": [0.01, 0.02], "nll_ci_low": [0.0, 0.01], "nll_ci_high": [0.02, 0.03]})
    fig = plots.gain_vs_collateral(rows)
    assert fig.layout.showlegend is True and fig.layout.legend.title.text == "label"
    assert list(fig.data[0].text) == ["agreement: L0H7", "ioi: L0H7"]


def test_marks_on_a_log_axis_sit_among_the_data():
    """Figure 2b.3's exact-screen marks: plotly places a shape on a log axis in log10 units, so a mark at the
    exact screen's cost of 171 forward-equivalents drawn at x=171 stretched the axis to 10^171. Every vertical
    mark sits within the decades the data span."""
    import pandas as pd

    from cel_utils.joint_plots import recall_budget

    t = pd.DataFrame({"model": ["m"] * 4, "selector": ["gradient", "gradient", "gates", "gates"],
                      "forward_equivalents": [3.0, 12.0, 6.0, 40.0], "recall": [0.2, 0.5, 0.4, 0.9],
                      "ci_low": [0.1, 0.3, 0.2, 0.7], "ci_high": [0.3, 0.7, 0.6, 1.0],
                      "exact_forward_equivalents": [171.0] * 4})
    fig = recall_budget(t)
    assert fig.layout.xaxis.type == "log"
    lo, hi = np.log10(t["forward_equivalents"].min()), np.log10(t["exact_forward_equivalents"].max())
    xs = [s.x0 for s in fig.layout.shapes]
    assert xs and all(lo - 1 <= x <= hi + 1 for x in xs), xs


def test_every_legend_entry_has_one_colour_in_every_panel():
    """Figure 3a.2: each line's right-panel trace took plotly's next colour (colours go by trace index), so the right
    panel's colours matched no legend entry. Each legend group now has one colour in both panels."""
    from cel_utils import figcheck

    f = pd.DataFrame([{"attention": a, "scale": s, "step": st, "gain_a": 0.1 * st, "two_sided": 0.5}
                      for a in ("softmax", "softmax-1") for s in (0.5, 1.0) for st in (0, 100, 200)])
    fig = theory_plots.formation_lines(f)
    assert figcheck.problems(fig) == []
    by_group = {}
    for t in fig.data:
        by_group.setdefault(t.legendgroup, set()).add(t.line.color)
    assert len(by_group) == 4 and all(len(c) == 1 and None not in c for c in by_group.values())
    assert len({next(iter(c)) for c in by_group.values()}) == 4        # four lines, four colours


def test_the_figure_checks_find_hidden_data_marks_off_the_log_axis_and_split_colours(monkeypatch):
    """Planted defects: a range that hides points, a mark placed in linear units (x = 140) on a log axis whose data
    span 10^0.5-10^1.1 (the Figure 2b.3 defect; the same mark in log10 units, a decade beyond the data, is fair), a
    legend group drawn in two colours; ``plots.figure`` raises on them where
    CEL_STRICT_FIGURES is set."""
    import plotly.graph_objects as go

    from cel_utils import figcheck
    from cel_utils.errors import CELError

    ok = go.Figure(go.Scatter(x=[1, 2], y=[0.0, 1.0])).update_yaxes(range=[0, 1])
    assert figcheck.problems(ok) == []                                          # a point on the edge is shown
    hidden = go.Figure(go.Scatter(x=[1, 2], y=[0.0, 1.3])).update_yaxes(range=[0, 1])
    assert figcheck.problems(hidden) == ["yaxis: range [0, 1] hides data from 0 to 1.3"]
    log = go.Figure(go.Scatter(x=[3.0, 11.5], y=[0.1, 0.9])).update_xaxes(type="log")
    assert figcheck.problems(log.add_vline(x=np.log10(140))) == []      # Figure 2b.2: the exact screen's cost
    assert "x = 140 on the log axis" in figcheck.problems(log.add_vline(x=140))[0]
    split = go.Figure([go.Scatter(x=[1], y=[1], legendgroup="a", line=dict(color="red")),
                       go.Scatter(x=[1], y=[2], legendgroup="a")])
    assert figcheck.problems(split) == ["legend group 'a': 2 traces in no set colour"]
    monkeypatch.setenv("CEL_STRICT_FIGURES", "1")
    with pytest.raises(CELError, match="hides data"):
        plots.figure(hidden, "a planted figure")


def test_counts_show_as_whole_numbers_when_a_missing_value_made_them_floats():
    """Issue 53: counts printed as '4.000' where a missing value in the column turned them into floats; a count
    column shows '4', a measured column keeps its digits."""
    df = pd.DataFrame({"n_items": [4, None], "fixes": [3, 5], "heads": [2.0, float("nan")], "accuracy": [1.0, 0.5],
                       "text_tokens": [1000.0, None]})
    html = _visible_text(tables.table(df).data)
    assert "4.000" not in html and "2.000" not in html and "1,000.000" not in html
    assert "1,000" in html and "1.000" in html and "0.500" in html
