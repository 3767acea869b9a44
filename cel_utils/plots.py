"""Plotly figures for the book, and a renderer that works offline in the built HTML.

:func:`setup` (called by :func:`chapter` and :func:`figure`, so a chapter never calls it itself) registers a
plotly renderer ``"cel"`` and makes it the default: each figure is emitted both as the plotly mimetype (for
JupyterLab) and as HTML that *does not* embed plotly.js or MathJax (the book serves ``plotly.min.js`` as a local
static file, see :mod:`cel_utils.book`). Importing this module changes nothing in plotly. Chapter 2's figures are
in :mod:`cel_utils.joint_plots`, chapter 3's in :mod:`cel_utils.theory_plots`.

Example:
    >>> from cel_utils import plots
    >>> import pandas as pd
    >>> df = pd.DataFrame({"layer": [0, 0, 1, 1], "head_index": [0, 1, 0, 1], "delta_accuracy": [0, .1, -.2, 0]})
    >>> fig = plots.head_heatmap(df, "delta_accuracy", n_layers=2, n_heads=2)
    >>> fig.data[0].z.shape
    (2, 2)
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer

from . import figcheck
from .errors import CELError

_counter = {"n": 0}


class _BookRenderer(MimetypeRenderer):
    """Mimebundle renderer: plotly JSON for Jupyter frontends + plain HTML for static books."""

    def to_mimebundle(self, fig_dict):
        from plotly.io import to_html, to_json

        _counter["n"] += 1
        fig = go.Figure(fig_dict)
        html = to_html(fig, include_plotlyjs=False, include_mathjax=False, full_html=False,
                       div_id=f"cel-fig-{_counter['n']}", config={"responsive": True})
        import json

        return {"application/vnd.plotly.v1+json": json.loads(to_json(fig, validate=False)),
                "text/html": html}


def setup() -> None:
    """Register and select the offline book renderer (idempotent)."""
    pio.renderers["cel"] = _BookRenderer()
    pio.renderers.default = "cel"
    pio.templates.default = "plotly_white"


# readable names of the values the figures show (axis and colour-bar titles); others via tables.header
LABELS = {"delta_margin": "change in mean margin", "delta_accuracy": "change in accuracy",
          "search_delta": "change in accuracy, search split", "heldout_delta": "change in accuracy, held-out",
          "search_delta_accuracy": "change in accuracy, search split",
          "c_share": "C-share", "best_dloss_a": "best change in A's loss",
          "best_dacc_a": "best change in A's accuracy", "single_c_head": "runs with one C-carrier"}


def label(value: str) -> str:
    """A readable name for a column shown in a figure: ``label("delta_margin")`` -> ``change in mean margin``."""
    from .tables import header

    return LABELS.get(value, header(value))


_label = label   # for functions whose parameter is called ``label``


def fit(text: str, width: int, size: int = 14) -> str:
    """``text`` broken into lines (plotly ``<br>``) that fit ``width`` pixels at font ``size``: titles are not
    clipped by narrow figures."""
    import textwrap

    chars = max(12, int((width - 90) / (0.55 * size)))
    return "<br>".join(textwrap.wrap(text, chars)) if "<br>" not in text else text


def clipped_bars(y, low, high, bounds=(-1.0, 1.0)) -> dict:
    """Plotly ``error_y`` for intervals ``[low, high]`` around ``y``, clipped to the metric's range ``bounds``
    (scalars or arrays, e.g. ``(-baseline, 1 - baseline)`` for a change in accuracy)."""
    y, lo, hi = (np.asarray(a, float) for a in (y, low, high))
    lo, hi = np.maximum(lo, bounds[0]), np.minimum(hi, bounds[1])
    return dict(type="data", symmetric=False, array=np.maximum(hi - y, 0), arrayminus=np.maximum(y - lo, 0),
                thickness=1, visible=True)


def head_heatmap(table: pd.DataFrame, value: str, n_layers: int, n_heads: int, title: str | None = None,
                 zmid: float = 0.0, zlim: float | None = None) -> go.Figure:
    """Layer x head heatmap of a per-head value (e.g. ``delta_accuracy``) from a screen table.

    The colour scale is symmetric around ``zmid``; pass the same ``zlim`` to heatmaps that are compared."""
    z = np.full((n_layers, n_heads), np.nan)
    for r in table.itertuples():
        z[int(r.layer), int(r.head_index)] = getattr(r, value)
    if zlim is None:
        zlim = float(np.nanmax(np.abs(z - zmid))) if np.isfinite(z).any() else 1.0
    zlim = zlim or 1.0
    width = max(560, 60 * n_heads + 240)
    fig = go.Figure(go.Heatmap(
        z=z, x=[f"H{h}" for h in range(n_heads)], y=[f"L{l}" for l in range(n_layers)],
        colorscale="RdBu", zmid=zmid, zmin=zmid - zlim, zmax=zmid + zlim,
        colorbar=dict(title=dict(text=fit(label(value), 150), side="right")),
        hovertemplate="%{y} %{x}<br>" + label(value) + " = %{z:+.3f}<extra></extra>"))
    text = title or f"{label(value)} when each head is ablated alone (blue: removal helps)"
    fig.update_layout(title=dict(text=fit(text, width), font=dict(size=14)),
                      yaxis=dict(autorange="reversed", title="layer"), xaxis=dict(title="head"),
                      height=max(320, 18 * n_layers + 140), width=width)
    return fig


def effect_distribution(table: pd.DataFrame, value: str = "delta_margin", title: str | None = None) -> go.Figure:
    """Histogram of per-head effects: most heads sit at zero; a few hurt; a few help."""
    fig = go.Figure(go.Histogram(x=table[value], nbinsx=60, marker_color="#4C72B0"))
    fig.add_vline(x=0, line_dash="dash", line_color="grey")
    fig.update_layout(title=title or f"distribution of the {label(value)} over heads", xaxis_title=label(value),
                      yaxis_title="heads", height=320)
    return fig


@dataclass(frozen=True)
class ScatterStyle:
    """The size of :func:`search_vs_heldout`'s figure (pixels) and how many of its points get a label.

    Example:
        >>> ScatterStyle(n_labels=3).width
        720
    """

    n_labels: int = 5
    width: int = 720
    height: int = 440


# a label's font, a generous character width, its line height, and plotly's offset of a label from its marker's
# centre (size 9), sideways and up or down: all in pixels
LABEL_FONT, LABEL_CHAR_W, LABEL_LINE_H, LABEL_OFFSET = 11, 6.6, 15, 7


def _span(*arrays) -> tuple[float, float]:
    """An axis range that holds every finite value of ``arrays`` and 0, padded by 6% of its width."""
    v = np.concatenate([np.ravel(a) for a in arrays] + [[0.0]])
    v = v[np.isfinite(v)]
    lo, hi = float(v.min()), float(v.max())
    pad = 0.06 * (hi - lo) or 0.05
    return lo - pad, hi + pad


def _label_boxes(x0: float, y0: float, n: int) -> dict[str, tuple]:
    """The box (x0, y0, x1, y1), y up, in pixels, that a label of ``n`` characters takes at each textposition."""
    w, h, r = LABEL_CHAR_W * n, LABEL_LINE_H, LABEL_OFFSET
    return {"top right": (x0 + r, y0 + r, x0 + r + w, y0 + r + h),
            "bottom right": (x0 + r, y0 - r - h, x0 + r + w, y0 - r),
            "top left": (x0 - r - w, y0 + r, x0 - r, y0 + r + h),
            "bottom left": (x0 - r - w, y0 - r - h, x0 - r, y0 - r),
            "middle right": (x0 + r, y0 - h / 2, x0 + r + w, y0 + h / 2),
            "middle left": (x0 - r - w, y0 - h / 2, x0 - r, y0 + h / 2)}


def _clash(a, b) -> bool:
    return not (a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1])


def _place_labels(px, py, names: list[str], order, n_labels: int, area: tuple[float, float]) -> dict[int, str]:
    """Point index -> textposition for at most ``n_labels`` points, taken in ``order``: each at the first place
    inside the plot ``area`` (pixels) whose box covers no label placed before it and no other point."""
    pw, ph = area
    r = LABEL_OFFSET
    dots = [(px[j] - r, py[j] - r, px[j] + r, py[j] + r) for j in range(len(px))]
    placed, pos = [], {}
    for i in order:
        if len(pos) == n_labels:
            break
        for where, box in _label_boxes(px[i], py[i], len(names[i])).items():
            if box[0] >= 0 and box[1] >= 0 and box[2] <= pw and box[3] <= ph and \
                    not any(_clash(box, b) for b in placed) and \
                    not any(_clash(box, d) for j, d in enumerate(dots) if j != i):
                placed.append(box)
                pos[int(i)] = where
                break
    return pos


def search_vs_heldout(df: pd.DataFrame, x: str = "search_delta", y: str = "heldout_delta",
                      label: str = "head", title: str | None = None,
                      err_low: str | None = "heldout_ci_low", err_high: str | None = "heldout_ci_high",
                      baseline: str = "baseline_accuracy", diagonal: bool | None = None,
                      style: ScatterStyle = ScatterStyle()) -> go.Figure:
    """Scatter of a gain on the search split (or the metric that ranked the heads there, e.g.
    ``x="search_delta_margin"``) against the gain on held-out items, with the diagonal when both axes measure the
    same thing (``diagonal=None``: both or neither column names a margin).

    At most ``style.n_labels`` points are labelled, the largest held-out changes first, each where its text box
    covers no other label and no other point (the figure has a fixed size, ``style``, and fixed axis ranges, so
    boxes are placed in pixels); a point with no free place keeps its name on hover only. CIs are clipped to what
    a change in accuracy can be (``[-baseline, 1 - baseline]`` when the ``baseline`` column exists, else
    ``[-1, 1]``).

    Example:
        >>> df = pd.DataFrame({"head": ["L0H1", "L2H3"], "search_delta": [0.05, 0.1], "heldout_delta": [0.03, 0.0]})
        >>> fig = search_vs_heldout(df, err_low=None, style=ScatterStyle(n_labels=1))
        >>> list(fig.data[0].text), fig.layout.width
        (['L0H1', ''], 720)
    """
    df = df.reset_index(drop=True)
    xs, ys = df[x].astype(float).to_numpy(), df[y].astype(float).to_numpy()
    kw, y_ext = {}, [ys]
    if err_low and err_low in df and err_high in df:
        bounds = (-df[baseline], 1 - df[baseline]) if baseline in df else (-1.0, 1.0)
        kw["error_y"] = clipped_bars(df[y], df[err_low], df[err_high], bounds)
        e = kw["error_y"]
        y_ext += [ys + np.asarray(e["array"], float), ys - np.asarray(e["arrayminus"], float)]
    if diagonal is None:
        diagonal = ("margin" in x) == ("margin" in y)
    if diagonal:   # both axes span the same range: the diagonal is at 45 degrees
        xr = yr = _span(xs, *y_ext)
    else:
        xr, yr = _span(xs), _span(*y_ext)
    margin = dict(l=70, r=30, t=70, b=60)
    pw, ph = style.width - margin["l"] - margin["r"], style.height - margin["t"] - margin["b"]
    px = (xs - xr[0]) / (xr[1] - xr[0]) * pw            # pixels from the plot area's left
    py = (ys - yr[0]) / (yr[1] - yr[0]) * ph            # pixels from its bottom
    names = df[label].astype(str).tolist()
    pos = _place_labels(px, py, names, np.argsort(-np.abs(ys), kind="stable"), style.n_labels, (pw, ph))
    text = [names[i] if i in pos else "" for i in range(len(df))]
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="markers+text", text=text,
                               textposition=[pos.get(i, "top right") for i in range(len(df))],
                               hovertext=names, textfont=dict(size=LABEL_FONT), marker=dict(size=9),
                               hovertemplate="%{hovertext}<br>%{x:+.3f}, %{y:+.3f}<extra></extra>", **kw))
    if diagonal:
        fig.add_trace(go.Scatter(x=list(xr), y=list(yr), mode="lines", line=dict(dash="dash", color="grey"),
                                 name="held-out = search", hoverinfo="skip"))
    fig.add_hline(y=0, line_color="lightgrey")
    fig.update_layout(title=title or "gain on the search split vs on held-out items", xaxis_title=_label(x),
                      yaxis_title=_label(y), showlegend=False, width=style.width, height=style.height,
                      margin=margin, xaxis=dict(range=list(xr)), yaxis=dict(range=list(yr)))
    return fig


# ---------------------------------------------------------------------------------------------
# Chapter 1 across models and tasks
# ---------------------------------------------------------------------------------------------
def effect_landscape(df: pd.DataFrame, value: str = "delta_margin", title: str | None = None) -> go.Figure:
    """Distribution of per-head effects for every model/task pair (one box per pair, every head a point).

    ``df``: a long table with columns ``model``, ``task``, ``head`` and ``value`` (and ``candidate``).
    """
    fig = go.Figure()
    for (m, t), g in df.groupby(["model", "task"], sort=False):
        fig.add_box(y=g[value], x=[f"{m}<br>{t}"] * len(g), name=f"{m} · {t}", boxpoints="all", jitter=0.6,
                    pointpos=0, marker=dict(size=3), text=g["head"], showlegend=False,
                    hovertemplate="%{text}: %{y:+.3f}<extra></extra>")
        if "candidate" in g and g["candidate"].any():
            c = g[g["candidate"]]
            fig.add_scatter(x=[f"{m}<br>{t}"] * len(c), y=c[value], mode="markers", showlegend=False,
                            marker=dict(symbol="star", size=11, color="#c0392b"), text=c["head"],
                            hovertemplate="candidate %{text}: %{y:+.3f}<extra></extra>")
    fig.add_hline(y=0, line=dict(color="#888", dash="dot"))
    label = {"delta_margin": "change in mean margin", "delta_accuracy": "change in accuracy"}.get(value, value)
    fig.update_layout(title=title or f"every head, every pair: {label} when removed (stars: candidates)",
                      yaxis_title=label, height=460)
    return fig


def candidate_depth(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Where in depth the top heads sit: layer / (n_layers - 1), per model and task, sized by the gain."""
    fig = go.Figure()
    for m, g in df.groupby("model", sort=False):
        fig.add_scatter(x=g["depth"], y=g["task"], mode="markers", name=m, text=g["head"],
                        marker=dict(size=8 + 40 * g["delta_accuracy"].clip(lower=0), opacity=0.7,
                                    symbol=np.where(g["candidate"], "star", "circle")),
                        hovertemplate="%{text} (%{x:.2f} of depth)<extra>" + m + "</extra>")
    fig.update_layout(title=title or "where the top enhancement heads sit (stars: candidates)",
                      xaxis=dict(title="layer / (layers - 1)", range=[-0.05, 1.05]), height=380)
    return fig


def zero_vs_mean(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Change in accuracy with zero ablation against mean ablation, per head (the diagonal: mode-independent)."""
    fig = go.Figure()
    for m, g in df.groupby("model", sort=False):
        fig.add_scatter(x=g["zero_delta"], y=g["mean_delta"], mode="markers", name=m,
                        text=g["task"] + " " + g["head"],
                        hovertemplate="%{text}<br>zero %{x:+.3f}, mean %{y:+.3f}<extra></extra>")
    lo = float(min(df["zero_delta"].min(), df["mean_delta"].min(), 0))
    hi = float(max(df["zero_delta"].max(), df["mean_delta"].max(), 0))
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#888", dash="dot"), name="same effect")
    fig.update_layout(title=title or "zero vs mean ablation of the same heads (search split)",
                      xaxis_title="change in accuracy, zero ablation", yaxis_title="change in accuracy, mean ablation",
                      height=420)
    return fig


def direct_vs_total(items: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Per item: the change in the logit difference when a head is removed (``total``) against the part that is
    its direct effect (``direct``), coloured by what removal does to the item (``outcome``); the diagonal is
    "all of it direct"."""
    fig = go.Figure()
    colours = {"fixed": "#2ca02c", "broken": "#d62728", "unchanged": "#9e9e9e"}
    for outcome, c in colours.items():
        d = items[items["outcome"] == outcome]
        if len(d):
            fig.add_trace(go.Scatter(x=d["total"], y=d["direct"], mode="markers", name=outcome,
                                     marker=dict(color=c, size=6, opacity=0.7),
                                     text=d.get("text"), hovertemplate="%{text}<br>total %{x:.2f}, direct %{y:.2f}"))
    lo = float(min(items["total"].min(), items["direct"].min(), 0))
    hi = float(max(items["total"].max(), items["direct"].max(), 0))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(dash="dot", color="black"),
                             name="direct = total", hoverinfo="skip"))
    fig.update_layout(title=fit(title or "", 520), width=560, height=430,
                      xaxis_title="total change in logit difference", yaxis_title="direct effect",
                      legend=dict(orientation="h", y=-0.2))
    return fig


def path_split(summary: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Per head (``label``): the mean change in the logit difference through the direct path, through later
    layers only, and in total."""
    fig = go.Figure()
    for col, name, c in (("direct_path", "direct path only", "#1f77b4"),
                         ("indirect_path", "later layers only", "#ff7f0e"),
                         ("total_delta_margin", "total (head removed)", "#333333")):
        fig.add_trace(go.Bar(x=summary["label"], y=summary[col], name=name, marker_color=c))
    fig.update_layout(barmode="group", title=fit(title or "", 760), width=800, height=420,
                      yaxis_title="mean change in logit difference", legend=dict(orientation="h", y=-0.25))
    return fig


def token_bars(promoted: list[dict], suppressed: list[dict], title: str | None = None) -> go.Figure:
    """The tokens a head's output raises and lowers most (its direct logits, centred, averaged over items); token
    texts are HTML-escaped so that plotly shows ``'<bos>'`` instead of dropping it as a tag."""
    from html import escape

    rows = list(reversed(suppressed)) + list(reversed(promoted))
    names = [escape(repr(r["token"]), quote=False) for r in rows]
    vals = [r["mean_logit"] for r in rows]
    fig = go.Figure(go.Bar(x=vals, y=list(range(len(rows))), orientation="h",
                           marker_color=["#d62728" if v < 0 else "#2ca02c" for v in vals],
                           hovertext=names, hoverinfo="text+x"))
    fig.update_yaxes(tickvals=list(range(len(rows))), ticktext=names)
    fig.update_layout(title=fit(title or "", 440), width=480, height=60 + 22 * max(len(rows), 4),
                      xaxis_title="mean direct logit (centred)", margin=dict(l=120))
    return fig


def attention_map(z, x_labels: list[str], y_labels: list[str], title: str | None = None,
                  x_title: str = "position, aligned by role (sink: the prompt's first token; read-k: k positions "
                                 "before the read; line-g end-k: k before the end of the g-th line above)"
                  ) -> go.Figure:
    """Attention at the read position: rows (heads, or items) by positions (labelled with their role and token,
    see :func:`cel_utils.explanation.attention_panel`), on one scale from 0 to 1; blank cells: no such position."""
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(x_labels))), y=list(range(len(y_labels))), zmin=0, zmax=1,
                               colorscale="Blues", colorbar=dict(title="attention"), hoverongaps=False,
                               text=[["" if np.isnan(v) else f"{v:.2f}" for v in row] for row in np.asarray(z, float)],
                               texttemplate="%{text}"))
    fig.update_xaxes(tickvals=list(range(len(x_labels))), ticktext=x_labels, tickangle=-30)
    fig.update_yaxes(tickvals=list(range(len(y_labels))), ticktext=y_labels, autorange="reversed")
    fig.update_layout(title=fit(title or "", 760), width=800, height=200 + 26 * len(y_labels),
                      xaxis_title=fit(x_title, 760, 12))
    return fig


# ---------------------------------------------------------------------------------------------
_FIGURES = {"chapter": "", "n": 0}


def chapter(label: str) -> None:
    """Start numbering a chapter's figures: ``chapter("3")`` makes the next figure "Figure 3.1" (and selects the
    book's offline renderer, :func:`setup`)."""
    setup()
    _FIGURES.update(chapter=str(label), n=0)


def figure(fig, caption: str) -> None:
    """Show ``fig`` with a numbered caption under it (HTML, so the static book shows it too). Returns nothing, so
    that a cell ending with it prints no label; :func:`last_label` gives the label.

    Example:
        >>> chapter("9"); figure(go.Figure(), "an empty figure"); last_label()  # doctest: +SKIP
        'Figure 9.1'
    """
    from html import escape

    from IPython.display import HTML, display

    setup()
    _FIGURES["n"] += 1
    bad = figcheck.problems(fig)
    if bad:
        what = f"{last_label()} ({caption[:60]}): " + "; ".join(bad)
        if os.environ.get("CEL_STRICT_FIGURES"):
            raise CELError(what)
        warnings.warn(what, stacklevel=2)
    display(fig)
    display(HTML(f'<p class="cel-caption"><strong>{last_label()}.</strong> {escape(caption)}</p>'))


def last_label() -> str:
    """The label of the last figure shown (``"Figure 1a.7"``)."""
    return f"Figure {_FIGURES['chapter']}.{_FIGURES['n']}" if _FIGURES["chapter"] else f"Figure {_FIGURES['n']}"


def cost_vs_agreement(agreement: pd.DataFrame) -> go.Figure:
    """Each screen's wall time (log scale) against its Spearman agreement with the exact screen (chapter 1b);
    hover for the recall of the exact top-10 improvers and harmful heads."""
    import plotly.express as px

    fig = px.scatter(agreement, x="seconds", y="spearman", color="method", symbol="model", log_x=True,
                     hover_data=["recall_top10_improvers", "recall_top10_harmful", "n_evaluations"],
                     title="cost versus agreement with the exact screen (change in mean margin per head)")
    fig.update_traces(marker=dict(size=13))
    fig.update_layout(xaxis_title="wall time (s, log scale)", yaxis_title="Spearman correlation with exact",
                      height=420)
    return fig


def format_changes(fmt: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Chapter 1c: each head set's change in accuracy in every prompt format (95% CI), beside the unablated
    model's own accuracy in that format (the spread formats cause without any ablation)."""
    from plotly.subplots import make_subplots

    formats = list(dict.fromkeys(fmt["format"]))
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.7, 0.3], horizontal_spacing=0.03,
                        subplot_titles=("change in accuracy when removed", "unablated accuracy"))
    for name, g in fmt.groupby("set", sort=False):
        g = g.set_index("format").loc[formats]
        fig.add_trace(go.Scatter(x=g["delta"], y=formats, mode="markers", name=name, marker=dict(size=9),
                                 error_x=clipped_bars(g["delta"], g["ci_low"], g["ci_high"]),
                                 hovertemplate="%{y}: %{x:+.3f}<extra>" + name + "</extra>"), row=1, col=1)
    base = fmt.drop_duplicates("format").set_index("format").loc[formats]
    fig.add_trace(go.Bar(x=base["baseline"], y=formats, orientation="h", marker_color="#bbbbbb", showlegend=False,
                         hovertemplate="%{y}: %{x:.3f}<extra>unablated</extra>"), row=1, col=2)
    fig.add_vline(x=0, line=dict(color="grey", dash="dot"), row=1, col=1)
    width = 760
    fig.update_layout(title=dict(text=fit(title or "change in accuracy in every prompt format", width)),
                      yaxis=dict(autorange="reversed"), height=120 + 34 * len(formats), width=width,
                      legend=dict(orientation="h", y=-0.15))
    fig.update_xaxes(range=[0, 1], row=1, col=2)
    return fig


def gain_vs_collateral(rows: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Chapter 1c: each head set's held-out gain on its own task (x, 95% CI) against the change in NLL per token
    on general English text (y, 95% CI); one colour per label."""
    fig = go.Figure()
    for lab, g in rows.groupby("label", sort=False):
        names = g["task"] + ": " + g["heads"] if "task" in g else g["heads"]   # one head may serve two tasks
        fig.add_trace(go.Scatter(
            x=g["gain"], y=g["text_nll_delta"], mode="markers+text", text=names, textposition="top center",
            name=lab, marker=dict(size=11),
            error_x=clipped_bars(g["gain"], g["gain_ci_low"], g["gain_ci_high"]),
            error_y=dict(type="data", symmetric=False, array=(g["nll_ci_high"] - g["text_nll_delta"]).clip(lower=0),
                         arrayminus=(g["text_nll_delta"] - g["nll_ci_low"]).clip(lower=0), thickness=1),
            hovertemplate="%{text}: gain %{x:+.3f}, NLL %{y:+.4f} nats/token<extra>" + lab + "</extra>"))
    fig.add_hline(y=0, line=dict(color="grey", dash="dot"))
    width = 640
    fig.update_layout(title=dict(text=fit(title or "gain on the task against cost on general text", width)),
                      xaxis_title="change in held-out accuracy (own task)",
                      yaxis_title="change in NLL per token, general text (nats)", height=420, width=width,
                      showlegend=True, legend_title_text="label")   # a legend even when one label is shown
    return fig


def rank_stability(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Each head's rank (1 = best) on every fresh search window, one panel row per (model, task) of ``df`` (the
    tidy table of :func:`cel_utils.landscape.rank_stability` with ``model``, ``task``, ``head``, ``rank_<w>`` and
    ``top_k_share``), the confirmed heads marked; lines join a head's ranks across windows.

    Example:
        >>> t = pd.DataFrame({"model": "m", "task": "t", "head": ["L0H1", "L1H0"], "rank_1": [1, 2],
        ...                   "rank_2": [2, 1], "top_k_share": [1.0, 1.0], "confirmed": [True, False]})
        >>> [tr.name for tr in rank_stability(t).data]
        ['m · t · L0H1 (confirmed)', 'm · t · L1H0']
    """
    fig = go.Figure()
    cols = [c for c in df.columns if c.startswith("rank_")]
    for r in df.to_dict("records"):
        name = f"{r['model']} · {r['task']} · {r['head']}" + (" (confirmed)" if r.get("confirmed") else "")
        fig.add_scatter(x=[int(c.split("_")[1]) for c in cols], y=[r[c] for c in cols], mode="lines+markers",
                        name=name, line=dict(dash="solid" if r.get("confirmed") else "dot"),
                        hovertemplate=f"{name}<br>window %{{x}}: rank %{{y}}<extra></extra>")
    fig.update_layout(title=title or "ranks of the top heads on fresh search windows (1 = best)",
                      xaxis=dict(title="fresh search window", tickmode="array",
                                 tickvals=[int(c.split("_")[1]) for c in cols]),
                      yaxis=dict(title="rank by change in mean margin", autorange="reversed", type="log"),
                      height=420)
    return fig
