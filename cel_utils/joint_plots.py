"""Chapter 2's figures: the joint search (the best set of each size on the three splits, the random controls,
whether single-head effects add up), the cost of the chosen sets on other tasks, and every selector on held-out
items. Rendered like every figure of the book (:func:`cel_utils.plots.figure`).

Example:
    >>> import pandas as pd
    >>> from cel_utils import joint_plots
    >>> cm = pd.DataFrame({"set": ["L1H2"] * 2, "task": ["addition", "capitals"], "delta_accuracy": [0.1, -0.02],
    ...                    "ci_low": [0.05, -0.06], "ci_high": [0.15, 0.02]})
    >>> joint_plots.cross_task_heatmap(cm).data[0].z.tolist()
    [[0.1, -0.02]]
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from IPython.display import display

from .plots import clipped_bars, figure, fit
from .tables import table

# ---------------------------------------------------------------------------------------------
# Joint search on a pool of screened heads, its controls, and its cost on other tasks
# ---------------------------------------------------------------------------------------------


def search_trajectory(js, title: str | None = None) -> go.Figure:
    """Change in accuracy of the best-by-search set of each size on the three splits: search (where it was
    chosen), confirm and held-out (with the held-out 95% CI); the greedy path marked on the search line."""
    b = js.best.sort_values("size")
    fig = go.Figure()
    for col, name in (("search_delta_accuracy", "search split (chosen here)"),
                      ("confirm_delta_accuracy", "confirm split"), ("heldout_delta_accuracy", "held-out")):
        kw = {}
        if col == "heldout_delta_accuracy":   # a change in accuracy lies in [-baseline, 1 - baseline]
            bounds = (-b["heldout_baseline"], 1 - b["heldout_baseline"]) if "heldout_baseline" in b else (-1.0, 1.0)
            kw["error_y"] = clipped_bars(b[col], b["heldout_ci_low"], b["heldout_ci_high"], bounds)
        fig.add_scatter(x=b["size"], y=b[col], mode="lines+markers", name=name, text=b["heads"],
                        hovertemplate="%{text}<br>size %{x}: %{y:+.3f}<extra>" + name + "</extra>", **kw)
    g = js.strategies[js.strategies.strategy == "greedy"]
    if len(g):
        fig.add_scatter(x=g["size"], y=g["search_delta_accuracy"], mode="markers", name="greedy's pick (search)",
                        marker=dict(symbol="x", size=10), text=g["heads"],
                        hovertemplate="%{text}<extra>greedy</extra>")
    fig.add_hline(y=0, line=dict(color="#888", dash="dot"))
    sizes = sorted(int(k) for k in b["size"].unique())   # a count of heads: whole-number ticks only
    fig.update_layout(title=title or f"{js.model} · {js.task}: best set of each size on the three splits",
                      xaxis=dict(title="heads ablated together", tickmode="array", tickvals=sizes,
                                 ticktext=[str(k) for k in sizes]),
                      yaxis_title="change in accuracy", height=380)
    return fig


def random_control_figure(js, title: str | None = None) -> go.Figure:
    """Left: change of random head sets of each size (from all heads) on the explore items, with the found set
    marked (the plain control). Right: the held-out gain of the whole pipeline run on random pools of the
    same size, with the real pipeline's marked (the selection-aware control)."""
    rc, pc = js.random_control, js.pool_control
    sizes = sorted(rc["size"].unique())
    fig = go.Figure()
    for k in sizes:
        fig.add_box(x=[f"random set, size {k}"] * int((rc["size"] == k).sum()),
                    y=rc[rc["size"] == k]["heldout_delta_accuracy"], name=f"random, size {k}", boxpoints="all",
                    jitter=0.5, pointpos=0, marker=dict(size=4), line=dict(color="#999"),
                    fillcolor="rgba(0,0,0,0)", text=rc[rc["size"] == k]["heads"], showlegend=False,
                    hovertemplate="%{text}: %{y:+.3f}<extra></extra>")
    b = js.best[js.best["size"].isin(sizes)]
    fig.add_scatter(x=[f"random set, size {k}" for k in b["size"]], y=b["explore_delta_accuracy"], mode="markers",
                    marker=dict(symbol="star", size=16, color="#c0392b"), name="best-by-search set",
                    text=[f"{h}<br>percentile {p:.0f}" for h, p in zip(b["heads"], b["random_percentile"])],
                    hovertemplate="%{text}: %{y:+.3f}<extra></extra>")
    if len(pc):
        fig.add_box(x=["random pool, same pipeline"] * len(pc), y=pc["heldout_delta_accuracy"], boxpoints="all",
                    jitter=0.5, pointpos=0, marker=dict(size=6), line=dict(color="#999"),
                    fillcolor="rgba(0,0,0,0)", text=pc["chosen"].fillna("nothing chosen"), showlegend=False,
                    hovertemplate="%{text}: %{y:+.3f}<extra></extra>")
        fig.add_scatter(x=["random pool, same pipeline"], y=[js.chosen_gain()], mode="markers",
                        marker=dict(symbol="diamond", size=14, color="#c0392b"), name="the screened pool's pipeline",
                        hovertemplate=f"percentile {js.pool_percentile():.0f}: %{{y:+.3f}}<extra></extra>")
    fig.add_hline(y=0, line=dict(color="#888", dash="dot"))
    fig.update_layout(title=title or f"{js.model} · {js.task}: found sets against random sets and random pools",
                      yaxis_title="change in held-out accuracy", height=400)
    return fig


def interaction(js, title: str | None = None) -> go.Figure:
    """For each best-by-search set of two or more heads: its change in held-out mean margin (y) against the sum of
    its members' single changes (x), labelled with its heads, with the 95% CI of the interaction (joint - sum)
    drawn around the joint change; the diagonal is "additive". Both axes span one range that holds every point,
    every CI and 0, so a single set reads as clearly as many: above the diagonal its heads help more together
    than apart, below it less."""
    b = js.best[js.best["size"] >= 2]
    fig = go.Figure()
    if len(b):
        joint = b["heldout_delta_margin"].astype(float)
        summed = joint - b["interaction"]
        v = np.concatenate([summed, joint, summed + b["interaction_ci_low"], summed + b["interaction_ci_high"], [0.0]])
        lo, hi = float(v.min()), float(v.max())
        pad = 0.1 * (hi - lo) or 0.1
        lo, hi = lo - pad, hi + pad
        fig.add_scatter(x=summed, y=joint, mode="markers+text", name="best set of its size",
                        text=[f"{h} ({int(k)} heads)" for h, k in zip(b["heads"], b["size"])],
                        textposition="middle right", cliponaxis=False, marker=dict(size=10, color="#c0392b"),
                        customdata=np.stack([b["interaction"], b["interaction_ci_low"], b["interaction_ci_high"]], 1),
                        error_y=dict(type="data", array=b["interaction_ci_high"] - b["interaction"],
                                     arrayminus=b["interaction"] - b["interaction_ci_low"], visible=True),
                        hovertemplate="%{text}<br>sum %{x:+.3f}, joint %{y:+.3f}<br>interaction %{customdata[0]:+.3f} "
                                      "[%{customdata[1]:+.3f}, %{customdata[2]:+.3f}]<extra></extra>")
    else:
        lo, hi = -1.0, 1.0
        fig.add_annotation(text="no set of two or more heads", x=0, y=0, showarrow=False)
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#888", dash="dot"),
                    name="additive (joint = sum)")
    fig.update_layout(title=title or f"{js.model} · {js.task}: do single-head effects add up? (held-out margins)",
                      xaxis=dict(title="sum of single-head changes in mean margin", range=[lo, hi], zeroline=True),
                      yaxis=dict(title="joint change in mean margin", range=[lo, hi], zeroline=True),
                      width=620, height=460, margin=dict(r=170), legend=dict(orientation="h", y=-0.2))
    return fig


def cross_task_heatmap(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Head set x task matrix of the change in accuracy, annotated with the 95% CI."""
    sets = list(dict.fromkeys(df["set"]))
    tasks = list(dict.fromkeys(df["task"]))
    z = np.full((len(sets), len(tasks)), np.nan)
    txt = [["" for _ in tasks] for _ in sets]
    for r in df.itertuples():
        i, j = sets.index(r.set), tasks.index(r.task)
        z[i, j] = r.delta_accuracy
        txt[i][j] = f"{r.delta_accuracy:+.2f}<br>[{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
    lim = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() and np.nanmax(np.abs(z)) > 0 else 1.0
    fig = go.Figure(go.Heatmap(z=z, x=tasks, y=sets, text=txt, texttemplate="%{text}", colorscale="RdBu",
                               zmid=0, zmin=-lim, zmax=lim,
                               colorbar=dict(title=dict(text="change in<br>accuracy", side="top"), len=1,
                                             lenmode="fraction", thickness=18),
                               hovertemplate="%{y} on %{x}: %{z:+.3f}<extra></extra>"))
    # at least 320 px: with one or two rows a shorter plot squashes the colour bar to a sliver
    fig.update_layout(title=fit(title or "cost on other tasks: change in held-out accuracy", 700),
                      xaxis_title="evaluated on", yaxis_title="head set removed", height=max(400, 180 + 70 * len(sets)))
    return fig


# ---------------------------------------------------------------------------------------------
# Chapter 2, beyond the pool: every selector on held-out items
# ---------------------------------------------------------------------------------------------
SELECTOR_COLOURS = {"top-k screen": "#1f77b4", "pool search": "#ff7f0e", "gradient": "#2ca02c",
                    "compressed sensing": "#9467bd", "learned gates": "#d62728", "boost (direct effect)": "#8c564b",
                    "random": "#7f7f7f"}


def selector_curves(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Held-out change in accuracy of the set each selector chooses at every size ``k`` (lines), with its
    paired-bootstrap 95% CI as a band, one panel per (model, task) of ``table`` (the tidy
    :attr:`cel_utils.comparison.SelectorComparison.table`, several concatenated); whole-number ticks for ``k``.

    Example:
        >>> t = pd.DataFrame({"model": "m", "task": "t", "selector": ["gradient"] * 2, "k": [1, 2],
        ...                   "heads": ["L0H1", "L0H1+L1H0"], "heldout_delta_accuracy": [0.0, 0.05],
        ...                   "heldout_ci_low": [-0.02, 0.0], "heldout_ci_high": [0.02, 0.1]})
        >>> [tr.name for tr in selector_curves(t).data]
        ['gradient', 'gradient 95% CI']
    """
    from plotly.subplots import make_subplots

    pairs = list(dict.fromkeys(zip(table["model"], table["task"])))
    fig = make_subplots(rows=1, cols=len(pairs), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"{m} · {t}" for m, t in pairs])
    for col, (m, t) in enumerate(pairs, start=1):
        g = table[(table["model"] == m) & (table["task"] == t)]
        for name, s in g.groupby("selector", sort=False):
            s = s.sort_values("k")
            colour = SELECTOR_COLOURS.get(name, "#333333")
            fig.add_trace(go.Scatter(x=s["k"], y=s["heldout_delta_accuracy"], mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=col == 1, line=dict(color=colour),
                                     text=s["heads"], hovertemplate="%{text}<br>k = %{x}: %{y:+.3f}<extra>"
                                     + name + "</extra>"), row=1, col=col)
            band_x = list(s["k"]) + list(s["k"])[::-1]
            band_y = list(s["heldout_ci_high"]) + list(s["heldout_ci_low"])[::-1]
            fig.add_trace(go.Scatter(x=band_x, y=band_y, fill="toself", mode="lines", line=dict(width=0),
                                     fillcolor=colour, opacity=0.12, name=f"{name} 95% CI", legendgroup=name,
                                     showlegend=False, hoverinfo="skip"), row=1, col=col)
        fig.add_hline(y=0, line=dict(color="#888", dash="dot"), row=1, col=col)
    ks = sorted(int(k) for k in table["k"].unique())
    fig.update_xaxes(title="heads removed (k)", tickmode="array", tickvals=ks, ticktext=[str(k) for k in ks])
    fig.update_yaxes(title="change in held-out accuracy", col=1)
    width = max(560, 420 * len(pairs))
    fig.update_layout(title=dict(text=fit(title or "held-out gain of the set each selector chooses, by size",
                                          width)), width=width, height=440, legend=dict(orientation="h", y=-0.2))
    return fig


# ---------------------------------------------------------------------------------------------
# Chapter 2b: remove, scale or boost
# ---------------------------------------------------------------------------------------------


def dose_curves(curves: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Held-out change in accuracy against the dose alpha (0 removes, 1 is the intact model), one line per head
    set with its 95% CI; the confirm split's curve (where the dose was chosen) dotted.

    ``curves``: the rows of :meth:`cel_utils.dose.DoseCurve.record` ``curve`` with a ``heads`` column."""
    fig = go.Figure()
    for i, (heads, g) in enumerate(curves.groupby("heads", sort=False)):
        color = f"hsl({(i * 97) % 360},60%,42%)"
        h = g[g.split == "heldout"].sort_values("alpha")
        c = g[g.split == "confirm"].sort_values("alpha")
        fig.add_scatter(x=h["alpha"], y=h["delta_accuracy"], mode="lines+markers", name=f"{heads} (held-out)",
                        line={"color": color},
                        error_y={"type": "data", "symmetric": False, "array": h["ci_high"] - h["delta_accuracy"],
                                 "arrayminus": h["delta_accuracy"] - h["ci_low"]},
                        hovertemplate="alpha %{x:g}: %{y:+.3f}<extra>" + heads + " held-out</extra>")
        fig.add_scatter(x=c["alpha"], y=c["delta_accuracy"], mode="lines", name=f"{heads} (confirm: chooses)",
                        line={"color": color, "dash": "dot"},
                        hovertemplate="alpha %{x:g}: %{y:+.3f}<extra>" + heads + " confirm</extra>")
    fig.add_hline(y=0, line_color="grey", line_width=1)
    fig.add_vline(x=1, line_color="grey", line_dash="dash", line_width=1)
    fig.update_layout(title=title, xaxis_title="alpha (the heads' output multiplied by it; 0 removes, 1 intact)",
                      yaxis_title="change in accuracy", height=430, legend={"font": {"size": 11}})
    return fig


def ceiling_bars(rows: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Per model: the share of wrong items some single-head removal fixes (the oracle), the same share with the
    item-head link broken (the null, with its 95% range) and the share the static set fixes."""
    fig = go.Figure()
    x = rows["model"] + " · " + rows["task"]
    fig.add_bar(x=x, y=rows["oracle"], name="oracle (a head chosen per item)")
    fig.add_bar(x=x, y=rows["null_mean"], name="null (link broken)",
                error_y={"type": "data", "symmetric": False, "array": rows["null_high"] - rows["null_mean"],
                         "arrayminus": rows["null_mean"] - rows["null_low"]})
    fig.add_bar(x=x, y=rows["static"], name="the static set (chapter 2)")
    fig.update_layout(title=title, barmode="group", yaxis_title="share of wrong held-out items fixed",
                      yaxis_range=[0, 1], height=400)
    return fig


def recall_budget(t: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Recall of the exact screen's top k against the forward-equivalents each selector spent, one line per model
    and selector, with the reference's 95% CI over items; the exact screen's own cost marked per model."""
    fig = go.Figure()
    for (model, sel), g in t.groupby(["model", "selector"], sort=False):
        g = g.sort_values("forward_equivalents")
        fig.add_scatter(x=g["forward_equivalents"], y=g["recall"], mode="lines+markers", name=f"{model}: {sel}",
                        error_y={"type": "data", "symmetric": False, "array": g["ci_high"] - g["recall"],
                                 "arrayminus": g["recall"] - g["ci_low"]},
                        hovertemplate="%{x:.0f} forward-equivalents: recall %{y:.2f}<extra>" + sel + "</extra>")
    for model, g in t.groupby("model", sort=False):   # a shape on a log axis is placed in log10 units
        fig.add_vline(x=float(np.log10(g["exact_forward_equivalents"].iloc[0])), line_dash="dot", line_color="grey",
                      annotation_text=f"exact screen ({model})", annotation_font_size=10)
    fig.update_layout(title=title, xaxis_title="forward-equivalents over the search items (log)", xaxis_type="log",
                      yaxis_title="recall of the exact top k", yaxis_range=[-0.05, 1.05], height=420)
    return fig


# ---------------------------------------------------------------------------------------------
# One pair, shown
# ---------------------------------------------------------------------------------------------
def show_pair(js) -> None:
    """Chapter 2's figures and tables of one pair's joint search: the trajectory, the controls, the
    interactions, the best sets and what each strategy found."""
    figure(search_trajectory(js), "The best set of each size on the search items, its confirm and held-out gains "
           "(held-out 95% CI), and greedy's path.")
    figure(random_control_figure(js), "The chosen sets against random head sets of the same size (plain control) "
           "and against the whole pipeline run on random pools (selection-aware control).")
    figure(interaction(js), "The change in held-out mean margin of each pair removed together against the sum "
           "of its heads removed alone, with a bootstrap 95% CI.")
    display(table(js.best, ["heads", "size", "search_delta_accuracy", "confirm_delta_accuracy", "confirm_q_value",
                            "confirmed", "heldout_delta_accuracy", "heldout_ci_low", "heldout_p_holm", "holds",
                            "interaction", "interaction_ci_low", "random_percentile"],
                  formats={"random_percentile": "{:.0f}"},
                  rename={"search_delta_accuracy": "search change", "confirm_delta_accuracy": "confirm change",
                          "heldout_delta_accuracy": "held-out change", "heldout_ci_low": "95% CI",
                          "heldout_p_holm": "p (Holm)", "interaction": "interaction (margin)",
                          "random_percentile": "percentile among random sets"}))
    strat = (js.strategies.pivot_table(index="strategy", columns="size", values="heads", aggfunc="first")
             .join(js.strategies.groupby("strategy")[["n_evaluations", "est_seconds"]].first()))
    display(table(strat.rename(columns=lambda c: f"best set of size {c}" if not isinstance(c, str) else c),
                  digits=1, rename={"est_seconds": "estimated seconds"}))
