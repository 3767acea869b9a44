"""Every way of choosing heads side by side: :func:`compare_selectors`, a loop over the registry of
:mod:`cel_utils.selectors`.

Each compared selector offers sets of size ``k = 1..max_k`` on the search split; every set is graded on the same
held-out items (the curve, and its area: the mean held-out gain over ``k``, with a bootstrap CI), and each
selector's offer goes through the book's pipeline (:func:`cel_utils.pipeline.run`: confirm, choose, held-out),
beside the same pipeline on the random selector's offers (the selection-aware control).

Example:
    >>> sc = compare_selectors(lm, splits, Design(max_k=5), Options(pool_size=5))   # doctest: +SKIP
    >>> sc.summary[["selector", "area", "area_ci_low", "area_ci_high", "seconds"]]   # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .ablation import format_set, head_name
from .compare import paired_table
from .design import Design
from .errors import CELError
from .io import json_safe
from .pipeline import Run, control, encoded
from .scoring import ItemResults
from .screening import Screen
from .selectors import REGISTRY, Context, Offer, Options, compared, pipeline_run
from .stats import bootstrap_mean


@dataclass
class SelectorComparison:
    """Ways of choosing ``k`` heads, each graded on the same held-out items at every ``k = 1..max_k``.

    ``table``: one row per selector and ``k``: ``heads`` (the set; for ``random``, how many random sets are
    averaged), ``outside_pool`` (its heads not in the pool), ``heldout_delta_accuracy`` with a paired-bootstrap
    95% CI (``heldout_ci_low``, ``heldout_ci_high``), ``heldout_delta_margin``.
    ``summary``: one row per selector: ``area`` (the mean held-out gain over ``k = 1..max_k``: the area under the
    curve divided by ``max_k``) with a bootstrap CI over items, ``area_vs_pool`` (its difference from the pool
    search's area, paired over items, with a CI), ``best_k`` (the size with the largest confirm gain, chosen before
    any held-out figure is read) and ``best_gain`` (its held-out gain), the cost of choosing
    (``forward_equivalents``: clean full forwards over the search items, a backward pass counting two; ``seconds``:
    wall time on this CPU, for a result read back from the cache the time it took when computed;
    ``n_evaluations``), and the pipeline's choice: ``chosen`` (confirmed on the confirm split), ``chosen_size``,
    its held-out change with CI, Holm p and ``chosen_holds``, and ``control_percentile`` (where its held-out gain
    falls among the random selector's offers put through the same pipeline).
    ``runs``: each selector's :class:`~cel_utils.pipeline.Run`; ``offers``: what each offered.
    """

    model: str
    task: str
    max_k: int
    pool: list
    table: pd.DataFrame
    summary: pd.DataFrame
    runs: dict[str, Run]
    offers: dict[str, Offer]
    n_search: int
    n_heldout: int
    timings: dict = field(default_factory=dict)   # wall seconds of each selector's offer and pipeline, and total

    @property
    def pipeline(self) -> Run | None:
        """The learned gates' run (chapter 2's section on them); None when the comparison left the gates out."""
        return self.runs.get(REGISTRY["gates"].label)

    @property
    def gates(self):
        off = self.offers.get(REGISTRY["gates"].label)
        return None if off is None else off.info["gates"]

    def record(self) -> dict:
        """JSON-ready: the table, the summary, the pool, the stages' times and the gates' pipeline."""
        return json_safe({"model": self.model, "task": self.task, "max_k": self.max_k,
                          "pool": [head_name(h) for h in self.pool], "n_search": self.n_search,
                          "n_heldout": self.n_heldout, "table": self.table.to_dict("records"),
                          "summary": self.summary.to_dict("records"), "timings": self.timings,
                          "gates": None if self.pipeline is None else
                          {**self.pipeline.record(), "gates": self.gates.record()}})

    def sentence(self) -> str:
        """What this comparison finds, in one markdown paragraph written from its numbers: whether the learned
        gates reach beyond the pool, their area against the pool search's (with the difference's CI), the best
        selector by area, the gates' pipeline (its chosen set's held-out gain, Holm p, the random rankings that
        beat it) and against the pool search's set of the same size, and what learning the gates cost."""
        s = self.summary.set_index("selector")
        gl, pl = REGISTRY["gates"].label, REGISTRY["pool"].label
        if gl not in s.index:    # the gates left out: the largest area, and boosting where it ran
            return f"**{self.model} / {self.task}** (the learned gates left out): {_largest(s)}. " + self._boosted(s)
        g, p = s.loc[gl], s.loc[pl]
        outside = int(self.table[self.table.selector == gl]["outside_pool"].max())
        return (f"**{self.model} / {self.task}**: the learned gates' sets hold up to {outside} head"
                f"{'' if outside == 1 else 's'} outside the pool of {len(self.pool)}. Over k = 1..{self.max_k} "
                f"their mean held-out gain (the area) is {g.area:+.3f} [{g.area_ci_low:+.3f}, {g.area_ci_high:+.3f}], "
                f"{_versus(g)} ({p.area:+.3f} [{p.area_ci_low:+.3f}, {p.area_ci_high:+.3f}]; difference "
                f"{g.area_vs_pool:+.3f} [{g.area_vs_pool_ci_low:+.3f}, {g.area_vs_pool_ci_high:+.3f}]); "
                f"{_largest(s)}. " + self._boosted(s) + self._gates_choice() + _learning(self.gates, g, p))

    def _boosted(self, s: pd.DataFrame) -> str:
        """The boost selector's area against the pool search's (a different intervention: outputs multiplied by
        a dose above 1, not removed); empty when it was left out."""
        b = REGISTRY["boost"].label
        if b not in self.offers or b not in s.index:
            return ""
        x = s.loc[b]
        return (f"Boosting instead of removing (the top heads by direct effect, outputs multiplied by "
                f"{self.offers[b].info['alpha']:g}, the dose chosen on the search split) has an area of {x.area:+.3f} "
                f"[{x.area_ci_low:+.3f}, {x.area_ci_high:+.3f}], {_versus(x)} (difference {x.area_vs_pool:+.3f} "
                f"[{x.area_vs_pool_ci_low:+.3f}, {x.area_vs_pool_ci_high:+.3f}]). ")

    def _gates_choice(self) -> str:
        c = self.pipeline.chosen()
        if c is None:
            return ("The gates' pipeline confirmed none of its sets on the confirm split, so it reports nothing "
                    "(it removes no head). ")
        pr = self.table.set_index(["selector", "k"]).loc[("pool search", int(c["size"]))]
        ctrl = self.pipeline.control
        return (f"The gates' pipeline chose {c['heads']} (confirmed on the confirm split): it changes held-out "
                f"accuracy by {c['heldout_delta_accuracy']:+.3f} [{c['heldout_ci_low']:+.3f}, "
                f"{c['heldout_ci_high']:+.3f}], Holm p = {c['heldout_p_holm']:.2g} "
                f"({'holds' if c['holds'] else 'does not hold'}); {self.pipeline.control_at_least()} of {len(ctrl)} "
                f"random rankings put through the same pipeline chose a set with a held-out gain at least as large"
                + (f" (with {len(ctrl)} rankings the control is an illustration, not a test: the smallest p-value it "
                   f"could give is {1 / (len(ctrl) + 1):.2f})" if len(ctrl) < 20 else "") + ". The "
                f"pool search's set of the same size, {pr['heads']}, changes it by "
                f"{pr['heldout_delta_accuracy']:+.3f} [{pr['heldout_ci_low']:+.3f}, {pr['heldout_ci_high']:+.3f}]. ")


def _versus(g) -> str:
    if g.area_vs_pool_ci_low > 0:
        return "above the pool search's"
    if g.area_vs_pool_ci_high < 0:
        return "below the pool search's"
    return "not distinguishable from the pool search's"


def _largest(s: pd.DataFrame) -> str:
    blind = s.index[s.get("signal", pd.Series("ok", index=s.index)) == "none"].tolist()
    note = "".join(f"; {b}'s estimates were all equal, so its sets are random heads, not a choice (left out of "
                   f"the comparison of areas)" for b in blind)
    s = s.drop(index=blind)
    top = s.index[np.isclose(s["area"], s["area"].max(), atol=1e-12)].tolist()
    return (f"the largest area is the {top[0]} selector's ({s.loc[top[0], 'area']:+.3f})" if len(top) == 1 else
            f"every selector has the same area ({s['area'].max():+.3f})" if len(top) == len(s) else
            f"{', '.join(top)} tie for the largest area ({s['area'].max():+.3f})") + note


def _learning(lg, g, p) -> str:
    n3 = min(3, lg.n_steps)
    runs = []
    for r, c in lg.curve.groupby("run"):
        n_sets = sum(x == r for x in lg.run_of.values())
        runs.append(f"from log-alpha {lg.inits[r]:g} (penalty {lg.penalties[r]:g}) the loss went from "
                    f"{c['loss'].iloc[:n3].mean():.2f} to {c['loss'].iloc[-n3:].mean():.2f}, with "
                    f"{c['expected_removed'].iloc[-1]:.1f} heads removed in expectation at the end, and gave "
                    f"{n_sets} of the {len(lg.sets)} sets")
    return (f"Over {lg.n_steps} steps per run (means of the first and last {n3} steps), " + "; ".join(runs)
            + f". Learning the gates cost {g.forward_equivalents:.0f} forward-equivalents ({g.seconds:.0f} s); "
            f"the screen and pool search {p.forward_equivalents:.0f} ({p.seconds:.0f} s).")


def compare_selectors(lm, splits: dict, design: Design, options: Options | None = None,
                      screen_result: Screen | None = None, progress: bool = True) -> SelectorComparison:
    """Every compared selector of the registry (:func:`cel_utils.selectors.compared`) offers ``k =
    1..design.max_k`` heads on ``splits["search"]``; each offer goes through the pipeline on ``splits["confirm"]``
    and ``splits["heldout"]`` (the random selector's offers are the control), and every set is graded on the
    held-out items. ``options.pool_size >= max_k``. Every forward evaluation runs in ``design.dtype`` (None:
    ``lm``'s own); the gradient screen and the gates learn in ``lm``'s. ``screen_result``: an exact screen of the
    search items made elsewhere (chapter 2's ranking screen), reused by the top-k and pool selectors.
    """
    options = options or Options()
    max_k = design.max_k
    if options.pool_size < max_k:
        raise CELError(f"pool_size must be at least max_k, got max_k={max_k}, pool_size={options.pool_size}")
    if options.beam_width < 1:
        raise CELError(f"beam_width must be at least 1, got {options.beam_width}")
    t_start = time.perf_counter()
    ctx = Context.make(lm, splits["search"], design, options, screen_result=screen_result, progress=progress)
    if len(ctx.ranking()) < options.pool_size:
        raise CELError(f"the screen has {len(ctx.ranking())} heads, fewer than pool_size = {options.pool_size}")
    encs = encoded(ctx.lm, splits)
    offers, clock = {}, {}
    for sel in compared(options.leave_out):
        t0 = time.perf_counter()
        offers[sel.label] = sel.offer(ctx, max_k)
        clock[f"{sel.label}: offer"] = time.perf_counter() - t0
    runs, per_set, ctrl = _pipelines(ctx, encs, offers, clock)
    base = next(iter(runs.values())).heldout_comparison.baseline  # the unablated model on the held-out items
    table, summary = _grade(ctx, offers, per_set, base, runs, options.pool_size)
    clock["total"] = time.perf_counter() - t_start
    return SelectorComparison(model=ctx.lm.name, task=splits["search"].name, max_k=max_k,
                              pool=ctx.ranking()[:options.pool_size], table=table, summary=summary, runs=runs,
                              offers=offers, n_search=ctx.enc.n_items, n_heldout=encs["heldout"].n_items,
                              timings=clock)


def _pipelines(ctx, encs, offers, clock):
    """The random selector's sets graded on held-out items and its offers through confirm -> choose (the control),
    then every other selector's offer through the pipeline with that control. Returns the runs, every set's
    held-out (correct, margin) by (selector label, set name), and the control."""
    from .compare import compare_sets

    d = ctx.design
    per_set, ctrl = {}, None
    rand_label, rand = next(((k, o) for k, o in offers.items() if o.replicates is not None), (None, None))
    if rand is not None and rand.replicates:
        t0 = time.perf_counter()
        flat = {format_set(x): x for r in rand.replicates for x in r}
        held = compare_sets(ctx.lm, encs["heldout"], flat, mode=d.mode, n_boot=d.n_boot, seed=d.seed)
        for j, n in enumerate(held.names):
            per_set[rand_label, n] = (held.results.correct[j], held.results.margin[j])
        ctrl = control(ctx.lm, encs, rand.replicates, d,
                       heldout_gain=dict(zip(held.names, held.table["delta_accuracy"].astype(float))))
        clock["random: control"] = time.perf_counter() - t0
    runs = {}
    for label, off in offers.items():
        if off.replicates is not None:
            continue
        t0 = time.perf_counter()
        runs[label] = r = pipeline_run(ctx, off, _by_label(label), encs, ctrl)
        for j, n in enumerate(r.heldout_comparison.names):   # keyed by selector too: a boosted and a removed
            per_set[label, n] = (r.heldout_comparison.results.correct[j],   # "L5H3" are different sets
                                 r.heldout_comparison.results.margin[j])
        clock[f"{label}: pipeline"] = time.perf_counter() - t0
    return runs, per_set, ctrl


def _by_label(label: str):
    return next(s for s in compared() if s.label == label)


def _grade(ctx, offers, per_set, base, runs, pool_size) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The curve of every selector (its held-out change at each k, with CIs) and its summary row (the area and
    its difference from the pool search's, paired over items; the cost; the pipeline's choice)."""
    d = ctx.design
    pool_names = {head_name(h) for h in ctx.ranking()[:pool_size]}
    rows, summary, item_delta, curves = [], [], {}, {}
    for label, off in offers.items():
        reps = off.replicates
        groups = ([[format_set(r[k]) for r in reps] for k in range(d.max_k)] if reps is not None else
                  [[format_set(x)] for x in off.sets])
        if not groups or not groups[0]:
            continue
        name = f"mean of {len(reps)} random sets" if reps is not None else None
        correct = np.stack([np.mean([per_set[label, n][0] for n in g], axis=0) for g in groups])  # [k, n_items]
        margin = np.stack([np.mean([per_set[label, n][1] for n in g], axis=0) for g in groups])
        tab = paired_table([name or g[0] for g in groups], base, ItemResults(correct, margin), n_boot=d.n_boot,
                           seed=d.seed)
        for k, (g, r) in enumerate(zip(groups, tab.itertuples()), start=1):
            rows.append({"model": ctx.lm.name, "task": ctx.search.name, "selector": label, "k": k, "heads": r.heads,
                         "outside_pool": None if name else sum(h not in pool_names for h in g[0].split("+")),
                         "heldout_delta_accuracy": float(r.delta_accuracy), "heldout_ci_low": float(r.ci_low),
                         "heldout_ci_high": float(r.ci_high), "heldout_delta_margin": float(r.delta_margin)})
        item_delta[label] = (correct - base.correct[0][None]).mean(axis=0)
        curves[label] = tab["delta_accuracy"].to_numpy()
    for label, dd in item_delta.items():
        area = bootstrap_mean(dd, d.n_boot, d.seed)
        vs = bootstrap_mean(dd - item_delta["pool search"], d.n_boot, d.seed)
        best = best_k(runs.get(label))
        summary.append({"model": ctx.lm.name, "task": ctx.search.name, "selector": label, "area": area[0],
                        "area_ci_low": area[1], "area_ci_high": area[2], "area_vs_pool": vs[0],
                        "area_vs_pool_ci_low": vs[1], "area_vs_pool_ci_high": vs[2], "best_k": best,
                        "best_gain": float(curves[label][best - 1]) if best else np.nan, **offers[label].cost,
                        "signal": offers[label].info.get("signal", "ok"),
                        **_choice(runs.get(label))})
    return pd.DataFrame(rows), pd.DataFrame(summary)


def best_k(r: Run | None) -> int | None:
    """The size whose set gained most on the confirm split (ties: the smaller), chosen before its held-out figure
    is read; None for the random selector (it has no run of its own: it is the control).

    Example:
        >>> best_k(None) is None
        True
    """
    if r is None:
        return None
    off = r.offered()
    return int(off["size"].iloc[int(np.argmax(off["confirm_delta_accuracy"].to_numpy()))])


def _choice(r: Run | None) -> dict:
    """A selector's pipeline choice as summary columns (NaN for the random selector, which is the control)."""
    out = {"chosen": None, "chosen_size": np.nan, "chosen_heldout_delta": np.nan, "chosen_ci_low": np.nan,
           "chosen_ci_high": np.nan, "chosen_p_holm": np.nan, "chosen_holds": False, "control_percentile": np.nan}
    c = None if r is None else r.chosen()
    if c is not None:
        out.update(chosen=c["heads"], chosen_size=int(c["size"]), chosen_heldout_delta=float(c["heldout_delta_accuracy"]),
                   chosen_ci_low=float(c["heldout_ci_low"]), chosen_ci_high=float(c["heldout_ci_high"]),
                   chosen_p_holm=float(c["heldout_p_holm"]), chosen_holds=bool(c["holds"]),
                   control_percentile=r.control_percentile())
    return out
