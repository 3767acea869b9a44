"""Figures of the toy model (chapter 3): training curves, heads, the sigma sweep, the early phase, and the
task trade-off in real models. Rendered like every figure of the book (:func:`cel_utils.plots.figure`).

Example:
    >>> from cel_utils import theory, theory_plots
    >>> fig = theory_plots.theory_heads(theory.run(n_heads=2, steps=50))
    >>> len(fig.data) > 0
    True
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .plots import fit, label

TYPE_NAMES = ("A (task-A signal)", "B (task-B signal)", "C (conflicting)", "D (distractors)")


def theory_loss(run, single_head_loss: float | None = None, index: int = 0) -> go.Figure:
    """Loss gap L(t) - L* over training (log scale), with the single-head plateau marked."""
    steps = run.record_steps
    gap = np.maximum(run.history["loss"][:, index] - run.L_star, 1e-16)
    fig = go.Figure(go.Scatter(x=steps, y=gap, mode="lines", name="L(t) - L*"))
    if single_head_loss is not None:
        fig.add_hline(y=single_head_loss - run.L_star, line_dash="dash", line_color="grey",
                      annotation_text="best single head", annotation_position="top right")
    fig.update_layout(title="distance to the joint optimum during training", xaxis_title="gradient step",
                      yaxis_title="L(t) - L*", yaxis_type="log", height=360)
    return fig


def theory_heads(run, index: int = 0) -> go.Figure:
    """Per head: attention mass on each token type, and the C weight kappa_h, over training. Every head's panels
    share one y-scale per row (attention mass on [0, 1], kappa on one range that holds every head's curve), so a
    head that carries little of C looks flat beside the one that carries it."""
    from plotly.subplots import make_subplots

    H = run.n_heads
    fig = make_subplots(rows=2, cols=H, shared_xaxes=True, subplot_titles=[f"head {h}" for h in range(H)] + [""] * H,
                        vertical_spacing=0.12)
    colors = ["#4C72B0", "#55A868", "#C44E52", "#8172B2"]
    steps = run.record_steps
    for h in range(H):
        for t in range(4):
            fig.add_trace(go.Scatter(x=steps, y=run.history["att"][:, index, h, t], mode="lines",
                                     line=dict(color=colors[t]), name=TYPE_NAMES[t], legendgroup=str(t),
                                     showlegend=h == 0), row=1, col=h + 1)
        fig.add_trace(go.Scatter(x=steps, y=run.history["kappa"][:, index, h], mode="lines",
                                 line=dict(color="black"), name="kappa_h (C weight)", legendgroup="k",
                                 showlegend=h == 0), row=2, col=h + 1)
    k = run.history["kappa"][:, index]   # [step, head]
    lo, hi = min(float(k.min()), 0.0), max(float(k.max()), 0.0)
    pad = 0.05 * (hi - lo) or 0.05
    for h in range(H):
        fig.update_yaxes(range=[-0.02, 1.02], row=1, col=h + 1)
        fig.update_yaxes(range=[lo - pad, hi + pad], row=2, col=h + 1)
    fig.update_yaxes(title_text="attention mass", row=1, col=1)
    fig.update_yaxes(title_text="kappa_h (same scale for every head)", row=2, col=1)
    fig.update_layout(title="what each head attends to, and its weight on the conflicting token C",
                      height=520, legend=dict(orientation="h", y=-0.15))
    return fig


def theory_slider(run, index: int = 0, n_frames: int = 40) -> go.Figure:
    """A kernel-free view: slide over training steps; bars show each head's attention and C weight."""
    steps = run.record_steps
    picks = np.unique(np.linspace(0, len(steps) - 1, n_frames).astype(int))
    H = run.n_heads
    colors = ["#4C72B0", "#55A868", "#C44E52", "#8172B2"]

    def bars(i):
        att = run.history["att"][i, index]  # [head, type]
        traces = [go.Bar(x=[f"head {h}" for h in range(H)], y=att[:, t], name=TYPE_NAMES[t],
                         marker_color=colors[t]) for t in range(4)]
        traces.append(go.Scatter(x=[f"head {h}" for h in range(H)], y=run.history["kappa"][i, index],
                                 mode="markers", marker=dict(size=14, color="black", symbol="diamond"),
                                 name="kappa_h (C weight)", yaxis="y2"))
        return traces

    fig = go.Figure(data=bars(picks[0]), frames=[go.Frame(data=bars(i), name=str(int(steps[i]))) for i in picks])
    klim = float(np.abs(run.history["kappa"][:, index]).max()) * 1.1 + 1e-9
    fig.update_layout(
        barmode="stack", title=dict(text="training, step by step (drag the slider)", y=0.97), height=520,
        yaxis=dict(title="attention mass", range=[0, 1]),
        yaxis2=dict(title="kappa_h", overlaying="y", side="right", range=[-klim, klim], showgrid=False),
        # the legend sits above the plot: below it, it would cover the slider's track
        legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom"), margin=dict(t=110),
        sliders=[dict(active=0, currentvalue=dict(prefix="step "), pad=dict(t=50),
                      steps=[dict(label=str(int(steps[i])), method="animate",
                                  args=[[str(int(steps[i]))], dict(mode="immediate", frame=dict(duration=0, redraw=True),
                                                                   transition=dict(duration=0))]) for i in picks])])
    return fig


def sweep_heatmap(df: pd.DataFrame, value: str = "c_share", title: str | None = None) -> go.Figure:
    """A sweep column by initialization scale (x) and number of heads (y). C-share and fractions on [0, 1];
    a change in loss on a diverging scale centred at zero."""
    piv = df.pivot(index="heads", columns="sigma", values=value)
    if value.startswith(("best_dloss", "best_dacc", "runner_up")):
        lim = float(np.nanmax(np.abs(piv.values))) or 1.0
        scale = dict(colorscale="RdBu" if "dacc" in value else "RdBu_r", zmin=-lim, zmax=lim)
    else:
        scale = dict(colorscale="Viridis", zmin=0, zmax=1)
    fig = go.Figure(go.Heatmap(z=piv.values, x=[f"{s:g}" for s in piv.columns], y=[f"H={h}" for h in piv.index],
                               text=np.round(piv.values, 3), texttemplate="%{text}",
                               colorbar=dict(title=fit(label(value), 160)), **scale))
    fig.update_layout(title=title or f"{label(value)} by initialization scale and number of heads",
                      xaxis_title="initialization scale sigma", yaxis_title="heads", height=320)
    return fig


# ---------------------------------------------------------------------------------------------
# Chapter 2: joint search
# ---------------------------------------------------------------------------------------------
def tradeoff_scatter(points: pd.DataFrame, x_label: str = "change on task A", y_label: str = "change on task B",
                     title: str | None = None, marked: str = "confirmed") -> go.Figure:
    """Every head's ablation change on one task (x) against another (y), one panel per ``panel`` value (or per
    ``model``/``task_a``/``task_b``); heads flagged in ``marked`` drawn as stars. The lower-right quadrant is the
    toy model's signature: removal helps A and hurts B."""
    from plotly.subplots import make_subplots

    if "panel" not in points:
        points = points.assign(panel=points["model"] + ": " + points["task_a"] + " vs " + points["task_b"])
    panels = list(dict.fromkeys(points["panel"]))
    cols = min(2, len(panels))
    rows = (len(panels) + cols - 1) // cols
    height = 340 * rows + 80
    # about 55 px between rows whatever their number (plotly refuses a spacing above 1 / (rows - 1))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=panels, horizontal_spacing=0.12,
                        vertical_spacing=min(0.16, 55 / height) if rows > 1 else 0.1)
    for i, p in enumerate(panels):
        g = points[points["panel"] == p]
        r, c = i // cols + 1, i % cols + 1
        for flag, style in [(False, dict(size=5, color="#95a5a6", opacity=0.6)),
                            (True, dict(size=13, color="#c0392b", symbol="star"))]:
            h = g[g[marked] == flag]
            fig.add_scatter(x=h["delta_a"], y=h["delta_b"], mode="markers", marker=style, text=h["head"],
                            name=marked if flag else "other heads", legendgroup=str(flag), showlegend=i == 0,
                            hovertemplate="%{text}: %{x:+.3f}, %{y:+.3f}<extra></extra>", row=r, col=c)
        fig.add_hline(y=0, line=dict(color="#888", dash="dot"), row=r, col=c)
        fig.add_vline(x=0, line=dict(color="#888", dash="dot"), row=r, col=c)
        fig.update_xaxes(title_text=x_label, row=r, col=c)
        fig.update_yaxes(title_text=y_label, row=r, col=c)
    fig.update_layout(title=title or "helps one task, hurts the other? (lower right: the toy model's signature)",
                      height=height, legend=dict(orientation="h", y=-0.12))
    return fig


def phase_lengths(runs: pd.DataFrame, rates: dict, title: str | None = None) -> go.Figure:
    """Escape time ``T1`` and plateau length ``T2 - T1`` of every run against ``log(1/sigma)``, with lines of
    the predicted slopes (``rates`` from :func:`cel_utils.dynamics.rates`) drawn through the mean of the runs
    (the slopes are predicted, the intercepts are not)."""
    ok = runs[(runs.T1 > 0) & (runs.T2 > 0)]
    x = np.log(1 / ok.sigma.to_numpy())
    fig = go.Figure()
    for name, y, slope, color in [("escape T1", ok.T1.to_numpy(), rates["slope_escape"], "#2980b9"),
                                  ("plateau T2 - T1", (ok.T2 - ok.T1).to_numpy(), rates["slope_plateau"], "#c0392b")]:
        fig.add_scatter(x=x, y=y, mode="markers", name=f"{name} (runs)", marker=dict(color=color, size=5, opacity=0.5))
        xs = np.array([x.min(), x.max()])
        fig.add_scatter(x=xs, y=y.mean() + slope * (xs - x.mean()), mode="lines", name=f"{name}: predicted slope",
                        line=dict(color=color, dash="dash"))
    fig.update_layout(title=title or "phase lengths against log(1/sigma): runs and predicted slopes",
                      xaxis_title="log(1/sigma)", yaxis_title="gradient steps", height=420)
    return fig


def plateau_rates(runs: pd.DataFrame, rates: dict, title: str | None = None) -> go.Figure:
    """The carrier's measured growth rate on the plateau per run, the rate the linearisation gives at the run's
    own plateau weights, and the rate at the saddle (``lambda_2``), against ``log(1/sigma)``."""
    x = np.log(1 / runs.sigma.to_numpy())
    fig = go.Figure()
    fig.add_scatter(x=x, y=runs.plateau_rate, mode="markers", name="measured (runs)",
                    marker=dict(color="#c0392b", size=6, opacity=0.6))
    fig.add_scatter(x=x, y=runs.plateau_rate_at_w, mode="markers", name="linearised at the run's plateau weights",
                    marker=dict(color="#2c3e50", size=4, symbol="x"))
    fig.add_hline(y=rates["lambda_2"], line=dict(color="#888", dash="dash"),
                  annotation_text="at the saddle (lambda_2)", annotation_position="bottom right")
    fig.update_layout(title=title or "growth rate of the conflicting head on the plateau",
                      xaxis_title="log(1/sigma)", yaxis_title="growth of log|a - b| per step", height=400)
    return fig


# ---------------------------------------------------------------------------------------------
# Numbered, captioned figures


def rival_bars(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Chapter 3a: per setting, head kind and initial scale, the share of runs whose best removal for task A is a
    two-sided trade-off (conflict's signature) or a one-sided gain (noise's), with exact 95% CIs."""
    from plotly.subplots import make_subplots

    settings = list(dict.fromkeys(table["setting"]))
    fig = make_subplots(rows=1, cols=len(settings), subplot_titles=settings, shared_yaxes=True)
    colors = {"two_sided": "#c0392b", "one_sided": "#2980b9"}
    for j, s in enumerate(settings):
        g = table[table["setting"] == s]
        x = g["variant"] + ", σ=" + g["sigma"].map(lambda v: f"{v:g}")
        for kind, color in colors.items():
            fig.add_bar(x=x, y=g[kind], name=kind.replace("_", "-"), marker_color=color, legendgroup=kind,
                        showlegend=j == 0, error_y=dict(type="data", symmetric=False,
                                                       array=g[f"{kind}_high"] - g[kind],
                                                       arrayminus=g[kind] - g[f"{kind}_low"]),
                        hovertemplate="%{x}: %{y:.2f}<extra>" + kind + "</extra>", row=1, col=j + 1)
    fig.update_yaxes(title_text="share of runs", range=[0, 1.05], row=1, col=1)
    fig.update_layout(title=title, barmode="group", height=420, legend=dict(orientation="h", y=-0.25))
    return fig


def formation_lines(formation: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Chapter 3a's trained transformer: over training steps, the mean gain in task A's accuracy from the best
    single-head removal (left) and the share of runs where that removal is a two-sided trade-off (right), one line
    per attention and initial scale."""
    import plotly.express as px
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["best removal's gain on toy_a", "two-sided trade-offs"])
    colours = px.colors.qualitative.Plotly
    for j, ((att, sc), g) in enumerate(formation.groupby(["attention", "scale"], sort=False)):
        name = f"{att}, scale {sc:g}"
        dash = "solid" if att == "softmax" else "dash"
        for col, y in ((1, "gain_a"), (2, "two_sided")):   # one colour per line in both panels: its legend entry's
            fig.add_scatter(x=g["step"], y=g[y], mode="lines+markers", name=name, legendgroup=name,
                            showlegend=col == 1, line=dict(dash=dash, color=colours[j % len(colours)]),
                            marker=dict(size=4),
                            hovertemplate="step %{x}: %{y:.3f}<extra>" + name + "</extra>", row=1, col=col)
    fig.update_xaxes(title_text="training step")
    fig.update_yaxes(title_text="accuracy gain", row=1, col=1)
    fig.update_yaxes(title_text="share of runs", range=[0, 1.05], row=1, col=2)
    fig.update_layout(title=title, height=420, legend=dict(orientation="h", y=-0.3))
    return fig
