"""Joint ablation on a real model: search a pool of screened heads, grade on held-out items, cost on other tasks.

* :func:`model_scorer`: a batched scorer for the strategies of :mod:`cel_utils.search`.
* :func:`sweep_pool`, :func:`pool_search`: every subset of a pool on the search split, and the best set of each size
  (exhaustive, greedy and beam on the sweep's figures): what the pool selectors of :mod:`cel_utils.selectors` offer.
* :func:`joint_search`: chapter 2's search: the best set of each size through the pipeline of
  :mod:`cel_utils.pipeline` (confirm, choose, held-out), with the same pipeline on random pools as the
  selection-aware control, random head sets as the plain control, and each set's interaction on held-out margins.
* :func:`graded_sets`: ``cel search``'s grading of one strategy's sets on held-out items.
* :func:`random_control`: random head sets of the same sizes, drawn from all heads.
* :func:`margin_interaction`: a set's change in margin against the sum of its members' changes, with a CI.
* :func:`cross_task`: named head sets removed while the model does other tasks.

Every comparison against the unablated model goes through :func:`cel_utils.compare.compare_sets`.

Example (tiny random model, so the numbers mean nothing):
    >>> from cel_utils.joint import joint_search   # doctest: +SKIP
    >>> js = joint_search(lm, *(load_task("ioi", s, n=20) for s in SPLITS), [(0, 1), (1, 0)])  # doctest: +SKIP
    >>> len(js.subsets)   # doctest: +SKIP
    4
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import pandas as pd

from .ablation import Ablation, Head, all_heads, format_heads, format_set, head_name
from .compare import Comparison, compare_sets
from .defaults import ALPHA, BEAM_WIDTH, N_BOOT, POOL_MAX, RANDOM_POOLS, RANDOM_SETS, TIE_BREAK
from .design import Design
from .engine import evaluate_head_sets
from .errors import CELError
from .io import json_safe
from .pipeline import Run, encoded, resolved, run
from .scoring import encode_task
from .search import beam, exhaustive, greedy, heads_of, percentile_among, subset_masks
from .stats import bootstrap_mean


@dataclass(frozen=True)
class JointSettings(Design):
    """The parameters of :func:`joint_search` (the shared ones from :class:`~cel_utils.design.Design`; ``max_k``:
    the best set of each size up to this is confirmed and tested)."""

    max_k: int = 3
    beam_width: int = BEAM_WIDTH
    random_sets: int = RANDOM_SETS    # random head sets per size (the plain control)
    random_pools: int = RANDOM_POOLS  # random pools through the whole pipeline (the selection-aware control)
    n_explore: int | None = None  # held-out items on which every subset is also shown (None: all)
    progress: bool = True


def model_scorer(lm, enc, mode: str | Ablation = "zero", means=None, tie_break: float = TIE_BREAK,
                 progress: bool = False):
    """A batched scorer for the strategies: mean accuracy plus ``tie_break`` x mean margin of each head set.

    Accuracy moves in steps of 1/n; the small margin term orders sets with equal accuracy.
    """
    ablation = Ablation.of(mode, means).resolved(lm, enc.inputs)

    def score(sets):
        res = evaluate_head_sets(lm, enc, [list(s) for s in sets], mode=ablation, progress=progress,
                                 desc=f"evaluating {len(sets)} head sets")
        return list(res.accuracy + tie_break * res.mean_margin)

    return score


def _named(sets: Sequence[Sequence[Head]]) -> dict[str, list[Head]]:
    return {format_set(s): list(s) for s in sets}


def random_control(lm, enc, sizes: Sequence[int], n_sets: int, mode: str | Ablation = "zero", means=None,
                   seed: int = 0, progress: bool = False) -> pd.DataFrame:
    """``n_sets`` random head sets of each size, drawn from all heads, evaluated on ``enc`` (one batched call):
    a tidy table of ``size``, ``heads`` and ``heldout_delta_accuracy`` (change against the unablated model)."""
    cols = ["size", "heads", "heldout_delta_accuracy"]
    if n_sets <= 0:
        return pd.DataFrame(columns=cols)
    rng = np.random.default_rng(seed)
    everything = all_heads(lm)
    rsets = [(k, [everything[i] for i in rng.choice(len(everything), k, replace=False)])
             for k in sizes for _ in range(n_sets)]
    rr = evaluate_head_sets(lm, enc, [[]] + [s for _, s in rsets], mode=mode, means=means, progress=progress,
                            desc=f"{len(rsets)} random sets, held-out split")
    return pd.DataFrame([(k, ",".join(head_name(h) for h in s), float(rr.accuracy[j + 1] - rr.accuracy[0]))
                         for j, (k, s) in enumerate(rsets)], columns=cols)


def graded_sets(lm, enc_s, enc_h, best_sets: list[list[Head]], ablation: Ablation, random_sets: int, n_boot: int,
                seed: int) -> dict:
    """The ``baseline``, ``best`` and ``random_control`` fields of ``cel search``: each set (one per size, chosen
    on the search split) on both splits, its held-out change with a paired-bootstrap CI, its interaction on
    held-out margins with a CI, and its percentile among random sets of its size."""
    members = sorted({h for hs in best_sets for h in hs})
    singles = _named([[h] for h in members])
    on_search = compare_sets(lm, enc_s, _named(best_sets), mode=ablation, n_boot=n_boot, seed=seed).table
    held = compare_sets(lm, enc_h, {**_named(best_sets), **singles}, mode=ablation, n_boot=n_boot, seed=seed)
    row_of = {name: j for j, name in enumerate(held.names)}
    sizes = [len(hs) for hs in best_sets]
    rc = random_control(lm, enc_h, sorted(set(sizes)), random_sets, mode=ablation, seed=seed)
    controls = [{"size": k, "heldout_delta_accuracy": g["heldout_delta_accuracy"].tolist()}
                for k, g in rc.groupby("size")]
    ctrl_of = {c["size"]: c["heldout_delta_accuracy"] for c in controls}
    best = []
    for j, hs in enumerate(best_sets):
        s, h = on_search.iloc[j], held.table.iloc[j]
        inter = margin_interaction(held.baseline.margin[0], held.results.margin[j],
                                   held.results.margin[[row_of[format_set([x])] for x in hs]], n_boot=n_boot, seed=seed)
        ctrl = ctrl_of.get(len(hs), [])
        best.append({"size": len(hs), "heads": [head_name(x) for x in hs],
                     "search": {"accuracy": float(s.accuracy), "mean_margin": float(s.mean_margin),
                                "delta_accuracy": float(s.delta_accuracy)},
                     "heldout": {"accuracy": float(h.accuracy), "mean_margin": float(h.mean_margin),
                                 "delta_accuracy": float(h.delta_accuracy), "ci_low": float(h.ci_low),
                                 "ci_high": float(h.ci_high), "delta_margin": float(h.delta_margin),
                                 "interaction": inter[0], "interaction_ci_low": inter[1],
                                 "interaction_ci_high": inter[2],
                                 "random_percentile": percentile_among(ctrl, h.delta_accuracy) if ctrl else None}})
    return {"baseline": {"search_accuracy": float(on_search["baseline_accuracy"].iloc[0]),
                         "heldout_accuracy": float(held.table["baseline_accuracy"].iloc[0])},
            "interaction_rule": "held-out mean over items of (the set's change in margin) - (the sum of its heads' "
                                "changes alone), with a percentile bootstrap 95% CI",
            "best": best, "random_control": controls}


@dataclass
class JointSearch:
    """A candidate pool searched on one split, the best sets confirmed on a second, tested on a third.

    ``run``: the best-by-search set of each size (exhaustive) through :func:`cel_utils.pipeline.run` (``run.sets``:
    search, confirm and held-out figures, the interaction on held-out margins, the figures on the explore items and
    the percentile among random sets of the size; ``run.control``: the selection-aware control, the same pipeline
    on random pools of the same size).
    ``subsets``: every subset of the pool on the search split (``mask``, ``heads``, ``size``, accuracy and
    margin and their changes, ``search_score`` = search accuracy + ``TIE_BREAK`` x search margin, what the
    strategies maximise) and on the first ``n_explore`` held-out items (``explore_*``, for the explorer and the
    plain random control only: never used to choose).
    ``strategies``: per strategy, the best set per size it finds on the search split and its evaluation count.
    ``random_control``: the plain control, random head sets of each size from all heads, on the explore items.
    """

    run: Run
    pool: list
    subsets: pd.DataFrame
    strategies: pd.DataFrame
    random_control: pd.DataFrame
    seconds_per_evaluation: float
    n_explore: int

    model = property(lambda self: self.run.model)
    task = property(lambda self: self.run.task)
    n_search = property(lambda self: self.run.n_search)
    n_confirm = property(lambda self: self.run.n_confirm)
    n_heldout = property(lambda self: self.run.n_heldout)
    best = property(lambda self: self.run.sets, doc="The best set of each size with its three splits' figures.")
    pool_control = property(lambda self: self.run.control, doc="The pipeline on random pools (per replicate).")

    def chosen(self):
        """The set the pipeline reports, chosen on the search and confirm splits only
        (:func:`cel_utils.pipeline.choose`: ties go to the smaller set); None when none is confirmed."""
        return self.run.chosen()

    def chosen_gain(self) -> float:
        """The held-out gain of the chosen set (0 when nothing is chosen: the pipeline removes nothing)."""
        return self.run.chosen_gain()

    def pool_percentile(self) -> float:
        """Where the chosen set's held-out gain falls among the random-pool pipelines' (mid-rank percentile)."""
        return self.run.control_percentile()

    def record(self) -> dict:
        """The JSON-ready record of this search (:meth:`cel_utils.pipeline.Run.record`'s fields, the pool, the
        strategies' evaluation counts and the explorer's data; NaN becomes null)."""
        return json_safe({
            **self.run.record(), "pool": [head_name(h) for h in self.pool], "n_explore": self.n_explore,
            "n_subsets": int(len(self.subsets)),
            "n_evaluations": {k: int(v) for k, v in self.strategies.groupby("strategy")["n_evaluations"].first().items()},
            "seconds_per_evaluation": self.seconds_per_evaluation, "explorer": self.explorer_data()})

    def explorer_data(self) -> dict:
        """What the kernel-free explorer needs: pool names and, per subset mask, the exact figures."""
        rows = {}
        for r in self.subsets.itertuples():
            rows[int(r.mask)] = [round(float(r.search_accuracy), 4), round(float(r.explore_accuracy), 4),
                                 round(float(r.search_margin), 4), round(float(r.explore_margin), 4)]
        return {"model": self.model, "task": self.task, "pool": [head_name(h) for h in self.pool],
                "n_search": self.n_search, "n_heldout": self.n_explore, "subsets": rows}


def sweep_pool(lm, enc, pool, ablation: Ablation, max_size: int | None = None, n_boot: int = N_BOOT, seed: int = 0,
               progress: bool = False) -> tuple[list[tuple], Comparison]:
    """Every subset of ``pool`` (up to ``max_size`` heads; None: all), the empty set first, in
    :func:`cel_utils.search.subset_masks` order, evaluated in one :func:`cel_utils.compare.compare_sets` call.
    The one order chapter 2's joint search and the pool selector of :mod:`cel_utils.selectors` both use, so a sweep of
    the same pool on the same items is one result-cache entry. Returns (subsets, comparison)."""
    sets = [heads_of(m, pool) for m in subset_masks(len(pool))]
    if max_size is not None:
        sets = [x for x in sets if len(x) <= max_size]
    return sets, compare_sets(lm, enc, _named(sets[1:]), mode=ablation, n_boot=n_boot, seed=seed, progress=progress)


def sweep_scores(sets: Sequence[tuple], cmp: Comparison) -> dict[tuple, float]:
    """The strategies' score of each swept subset (:func:`sweep_pool`): accuracy + ``TIE_BREAK`` x mean margin,
    keyed by the sorted subset."""
    acc = np.concatenate([cmp.baseline.accuracy, cmp.results.accuracy])
    margin = np.concatenate([cmp.baseline.mean_margin, cmp.results.mean_margin])
    return {tuple(sorted(x)): float(v) for x, v in zip(sets, acc + TIE_BREAK * margin)}


def _subset_table(masks, sets, on_search, on_explore) -> pd.DataFrame:
    """One row per subset (the empty set first) with the search split's and the explore items' figures."""
    rows = {}
    for split, cmp in (("search", on_search), ("explore", on_explore)):
        if cmp is None:
            rows[f"{split}_accuracy"] = rows[f"{split}_margin"] = np.full(len(sets), np.nan)
            continue
        rows[f"{split}_accuracy"] = np.concatenate([cmp.baseline.accuracy, cmp.results.accuracy])
        rows[f"{split}_margin"] = np.concatenate([cmp.baseline.mean_margin, cmp.results.mean_margin])
    tab = pd.DataFrame({"mask": masks, "heads": [format_set(s) for s in sets],
                        "size": [len(s) for s in sets], **rows})
    for split in ("search", "explore"):
        tab[f"{split}_delta_accuracy"] = tab[f"{split}_accuracy"] - tab[f"{split}_accuracy"].iloc[0]
        tab[f"{split}_delta_margin"] = tab[f"{split}_margin"] - tab[f"{split}_margin"].iloc[0]
    tab["search_score"] = tab["search_accuracy"] + TIE_BREAK * tab["search_margin"]
    return tab


def _run_strategies(pool, sets, tab, max_size, beam_width, per_eval):
    """Exhaustive, greedy and beam on the search-split scores of the sweep; a tidy table of what each found."""
    score_of = dict(zip(sets, tab["search_score"]))
    scorer = lambda ss: [score_of[tuple(sorted(s))] for s in ss]  # noqa: E731
    runs = {"exhaustive": exhaustive(pool, scorer, max_size), "greedy": greedy(pool, scorer, max_size),
            "beam": beam(pool, scorer, beam_width, max_size)}
    row_of = {s: i for i, s in enumerate(sets)}
    strat = []
    for name, res in runs.items():
        for k, sc in sorted(res.best.items()):
            if k == 0:
                continue
            i = row_of[tuple(sorted(sc.heads))]
            strat.append({"strategy": name, "size": k, "heads": tab["heads"].iloc[i],
                          "search_delta_accuracy": tab["search_delta_accuracy"].iloc[i],
                          "n_evaluations": res.n_evaluations, "est_seconds": res.n_evaluations * per_eval})
    best_rows = [row_of[tuple(sorted(runs["exhaustive"].best[k].heads))] for k in range(1, max_size + 1)]
    return pd.DataFrame(strat), best_rows


def margin_interaction(base: np.ndarray, joint: np.ndarray, singles: np.ndarray, n_boot: int = N_BOOT,
                       seed: int = 0, alpha: float = ALPHA) -> tuple[float, float, float]:
    """Interaction of a head set on per-item margins: mean over items of (joint change) - (sum of the members'
    changes), with a percentile bootstrap CI over items (:func:`cel_utils.stats.bootstrap_mean`). ``base`` and
    ``joint`` are ``[n_items]``, ``singles`` ``[n_members, n_items]``. Margins add exactly when the effects are
    additive, so unlike accuracy no threshold makes it non-zero.

    Example:
        >>> base = np.zeros(4); singles = np.array([[1.0, 1, 1, 1], [2.0, 2, 2, 2]])
        >>> margin_interaction(base, singles.sum(0), singles)[0]
        0.0
    """
    d = (np.asarray(joint) - base) - (np.asarray(singles) - base).sum(axis=0)  # [n_items]
    return bootstrap_mean(d, n_boot, seed, alpha)


@dataclass
class PoolSearch:
    """One pool searched on the search split (:func:`pool_search`)."""

    subsets: pd.DataFrame               # every subset on the search split (and the explore items)
    strategies: pd.DataFrame            # what each strategy found on the search-split figures
    best: list[list[Head]]              # the best set of each size 1..max_k (exhaustive)
    search: pd.DataFrame                # their search-split figures (heads, search_accuracy, search_delta_*)
    seconds_per_evaluation: float


def pool_search(lm, enc, pool, d: Design, beam_width: int = BEAM_WIDTH, explore=None,
                progress: bool = False) -> PoolSearch:
    """Every subset of ``pool`` on the search items ``enc`` (and on ``explore``, shown only), then the strategies
    on the sweep's figures and the best set of each size ``1..d.max_k`` (exhaustive). Nothing but ``enc`` is read
    to choose. ``d.mode``: a resolved ablation."""
    masks = subset_masks(len(pool))
    t0 = time.perf_counter()
    sets, on_search = sweep_pool(lm, enc, pool, d.mode, n_boot=d.n_boot, seed=d.seed, progress=progress)
    per_eval = (time.perf_counter() - t0) / len(sets)
    on_explore = None if explore is None else compare_sets(lm, explore, _named(sets[1:]), mode=d.mode,
                                                           n_boot=d.n_boot, seed=d.seed, progress=progress)
    tab = _subset_table(masks, sets, on_search, on_explore)
    strategies, best_rows = _run_strategies(pool, sets, tab, d.max_k, beam_width, per_eval)
    search = tab.iloc[best_rows][["heads", "search_accuracy", "search_delta_accuracy", "search_delta_margin"]]
    return PoolSearch(tab, strategies, [list(sets[i]) for i in best_rows], search.reset_index(drop=True), per_eval)


def joint_search(lm, search_task, confirm_task, heldout_task, pool, settings: JointSettings | None = None,
                 **overrides) -> JointSearch:
    """Search every subset of ``pool`` (m <= ``POOL_MAX``) on the search split (:func:`pool_search`), then the
    best set of each size through :func:`cel_utils.pipeline.run` (confirm, choose, held-out: Holm over the sizes),
    with the same pipeline on ``random_pools`` random pools of the same size (the selection-aware control); then
    the plain control and each set's interaction on held-out margins.

    The strategies (exhaustive up to ``max_k``, greedy, beam) run on the search-split figures of the sweep:
    the model is deterministic, so looking a set up is the same as evaluating it, and each strategy's cost is
    its evaluation count (x the measured seconds per evaluation). The held-out split never takes part in
    choosing. ``settings`` (a :class:`JointSettings`) and keyword ``overrides`` of its fields set the parameters:
    ``n_explore``, held-out items (the first ones) on which every subset is also evaluated for the explorer and the
    plain random control. Mean ablation takes its head means from the search split.
    """
    s = replace(settings or JointSettings(), **overrides)
    pool = [tuple(h) for h in pool]
    m = len(pool)
    if not 1 <= m <= POOL_MAX:
        raise CELError(f"the pool must hold 1 to {POOL_MAX} heads (2^m subsets), got {m}")
    if len(set(pool)) != m:
        raise CELError("the candidate pool has duplicates")
    s = replace(s, max_k=min(s.max_k, m))
    encs = encoded(lm, {"search": search_task, "confirm": confirm_task, "heldout": heldout_task})
    n_explore = encs["heldout"].n_items if s.n_explore is None else min(s.n_explore, encs["heldout"].n_items)
    explore = encode_task(lm, replace(heldout_task, items=heldout_task.items[:n_explore]))
    d = resolved(s.design(), lm, encs["search"])
    ps = pool_search(lm, encs["search"], pool, d, s.beam_width, explore, s.progress)
    rng = np.random.default_rng(s.seed)
    everything = all_heads(lm)
    rpools = [[everything[i] for i in rng.choice(len(everything), m, replace=False)] for _ in range(s.random_pools)]
    offers = [pool_search(lm, encs["search"], rp, d, s.beam_width).best for rp in rpools]
    r = run(lm, encs, {format_set(x): x for x in ps.best}, d, "offered", search=ps.search, selector="pool search",
            control_offers=offers, control_labels=[{"pool": format_heads(rp)} for rp in rpools])
    add_interaction(lm, encs["heldout"], r, ps.best, d)
    control = random_control(lm, explore, range(1, s.max_k + 1), s.random_sets, mode=d.mode, seed=s.seed,
                             progress=s.progress)
    ex = ps.subsets.set_index("heads")["explore_delta_accuracy"]
    best = r.sets
    best["explore_delta_accuracy"] = [float(ex[h]) for h in best["heads"]]
    best["random_percentile"] = [
        percentile_among(control[control["size"] == k]["heldout_delta_accuracy"].to_numpy(), x)
        for k, x in zip(best["size"], best["explore_delta_accuracy"])]
    return JointSearch(run=r, pool=pool, subsets=ps.subsets, strategies=ps.strategies, random_control=control,
                       seconds_per_evaluation=ps.seconds_per_evaluation, n_explore=n_explore)


def add_interaction(lm, heldout, r: Run, sets: Sequence[Sequence[Head]], d: Design) -> None:
    """Each set's interaction on held-out margins (its change against the sum of its members' changes, with a
    CI), added to ``r.sets`` (rows in the order of ``sets``, the held-out comparison's) as ``interaction``,
    ``interaction_ci_low``, ``interaction_ci_high``."""
    members = sorted({h for s in sets for h in s})
    singles = compare_sets(lm, heldout, _named([[h] for h in members]), mode=d.mode, n_boot=d.n_boot, seed=d.seed)
    row_of = {h: i for i, h in enumerate(members)}
    held = r.heldout_comparison
    inter = [margin_interaction(held.baseline.margin[0], held.results.margin[j],
                                singles.results.margin[[row_of[h] for h in s]], n_boot=d.n_boot, seed=d.seed)
             for j, s in enumerate(sets)]
    r.sets["interaction"], r.sets["interaction_ci_low"], r.sets["interaction_ci_high"] = map(list, zip(*inter))


def cross_task(lm, head_sets: dict, tasks: dict, mode: str | Ablation = "zero", n_boot: int = N_BOOT,
               seed: int = 0, progress: bool = False) -> pd.DataFrame:
    """Each named head set evaluated on every task: a tidy table (set, task, baseline, accuracy, change, CI).

    Mean ablation takes each task's head means from that task's own prompts.

    Example:
        >>> cross_task(lm, {"best for addition": [(13, 0)]}, {"addition": task_a, "ioi": task_b})  # doctest: +SKIP
    """
    rows = []
    for tname, task in tasks.items():
        cmp = compare_sets(lm, task, head_sets, mode=mode, n_boot=n_boot, seed=seed, progress=progress)
        for r in cmp.table.itertuples():
            rows.append({"set": r.heads, "task": tname, "baseline": float(r.baseline_accuracy),
                         "accuracy": float(r.accuracy), "delta_accuracy": float(r.delta_accuracy),
                         "ci_low": float(r.ci_low), "ci_high": float(r.ci_high),
                         "delta_margin": float(r.delta_margin)})
    return pd.DataFrame(rows)
