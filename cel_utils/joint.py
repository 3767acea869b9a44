"""Joint ablation on a real model: search a pool of screened heads, grade on held-out items, cost on other tasks.

* :func:`model_scorer`: a batched scorer for the strategies of :mod:`cel_utils.search`.
* :func:`search_heads`: one strategy on the search split, best set per size graded on held-out items (``cel search``).
* :func:`joint_search`: every subset of a small pool on the search split, all strategies on top, the best
  set of each size confirmed on the confirm split and tested on held-out items, two controls (chapter 2).
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
from .compare import Comparison, compare_sets, heldout_test, pick_chosen
from .defaults import ALPHA, BEAM_WIDTH, FDR, N_BOOT, POOL_MAX, RANDOM_POOLS, RANDOM_SETS, TIE_BREAK
from .engine import evaluate_head_sets
from .errors import CELError
from .io import json_safe
from .scoring import encode_task
from .stats import confirm_decisions
from .search import beam, exhaustive, greedy, heads_of, percentile_among, subset_masks

STRATEGIES = ("exhaustive", "greedy", "beam")


@dataclass(frozen=True)
class JointSettings:
    """The parameters of :func:`joint_search` and :func:`search_heads` (defaults from :mod:`cel_utils.defaults`)."""

    max_size: int = 3             # the best set of each size up to this is confirmed and tested
    beam_width: int = BEAM_WIDTH
    fdr: float = FDR
    random_sets: int = RANDOM_SETS    # random head sets per size (the plain control)
    random_pools: int = RANDOM_POOLS  # random pools through the whole pipeline (the selection-aware control)
    n_explore: int | None = None  # held-out items on which every subset is also shown (None: all)
    mode: str | Ablation = "zero"
    seed: int = 0
    n_boot: int = N_BOOT
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


def search_heads(lm, search_task, heldout_task, pool, strategy: str = "greedy", settings: JointSettings | None = None,
                 **overrides) -> dict:
    """Search on one split, report every best-per-size set on held-out items with a paired bootstrap CI and its
    interaction on held-out margins (:func:`margin_interaction`, as chapter 2 reports it), and the same for
    ``random_sets`` random head sets of each size drawn from all heads (the control). ``settings``/``overrides``:
    :class:`JointSettings` (``max_size``, ``beam_width``, ``random_sets``, ``mode``, ``seed``, ``n_boot``)."""
    s = replace(settings or JointSettings(), **overrides)
    strategies = {"exhaustive": lambda p, f: exhaustive(p, f, s.max_size),
                  "greedy": lambda p, f: greedy(p, f, s.max_size),
                  "beam": lambda p, f: beam(p, f, s.beam_width, s.max_size)}
    if strategy not in strategies:
        raise CELError(f"unknown strategy {strategy!r}; use {', '.join(STRATEGIES)}")
    enc_s, enc_h = encode_task(lm, search_task), encode_task(lm, heldout_task)
    ablation = Ablation.of(s.mode).resolved(lm, enc_s.inputs)  # means (if any) from the search split only
    t0 = time.perf_counter()
    res = strategies[strategy](list(pool), model_scorer(lm, enc_s, mode=ablation))
    secs = time.perf_counter() - t0
    best_sets = [list(res.best[k].heads) for k in sorted(k for k in res.best if k > 0)]
    return {"strategy": strategy, "pool": [head_name(h) for h in pool], "n_evaluations": res.n_evaluations,
            "search_seconds": secs,
            **graded_sets(lm, enc_s, enc_h, best_sets, ablation, s.random_sets, s.n_boot, s.seed)}


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

    ``subsets``: every subset of the pool on the search split (``mask``, ``heads``, ``size``, accuracy and
    margin and their changes, ``search_score`` = search accuracy + ``TIE_BREAK`` x search margin, what the
    strategies maximise) and on the first ``n_explore`` held-out items (``explore_*``, for the explorer and the
    plain random control only: never used to choose).
    ``strategies``: per strategy, the best set per size it finds on the search split and its evaluation count.
    ``best``: the best-by-search set of each size >= 1 (exhaustive): its confirm-split test (``confirm_*``,
    exact McNemar, BH over the sizes, ``confirmed``), its held-out test (``heldout_delta_accuracy`` with a
    paired-bootstrap CI, ``fixes``, ``breaks``, ``p_holm`` over the sizes, ``holds``) and its interaction on
    held-out mean margins (the set's change minus the sum of its members' changes, with a CI).
    ``random_control``: the plain control, random head sets of each size from all heads, on the explore items.
    ``pool_control``: the selection-aware control, the same pipeline run on random pools of the same size.
    """

    model: str
    task: str
    pool: list
    subsets: pd.DataFrame
    strategies: pd.DataFrame
    best: pd.DataFrame
    random_control: pd.DataFrame
    pool_control: pd.DataFrame
    seconds_per_evaluation: float
    n_search: int
    n_confirm: int
    n_heldout: int
    n_explore: int

    def chosen(self):
        """The set the pipeline reports, chosen on the search and confirm splits only (:func:`pick_chosen`: of the
        best-by-search sets confirmed on the confirm split, the one with the largest confirm gain; ties go to the
        smaller set); None when none is confirmed. Its held-out row is the honest figure."""
        return pick_chosen(self.best, gain="confirm_delta_accuracy")

    def chosen_gain(self) -> float:
        """The held-out gain of the chosen set (0 when nothing is chosen: the pipeline removes nothing)."""
        c = self.chosen()
        return 0.0 if c is None else float(c["heldout_delta_accuracy"])

    def pool_percentile(self) -> float:
        """Where the chosen set's held-out gain falls among the random-pool pipelines' (mid-rank percentile)."""
        return percentile_among(self.pool_control["heldout_delta_accuracy"].to_numpy(), self.chosen_gain())

    def record(self) -> dict:
        """The JSON-ready record of this search (chapter 2 writes one per model and task; NaN becomes null)."""
        return json_safe({
            "model": self.model, "task": self.task, "pool": [head_name(h) for h in self.pool],
            "n_search": self.n_search, "n_confirm": self.n_confirm, "n_heldout": self.n_heldout,
            "n_explore": self.n_explore, "n_subsets": int(len(self.subsets)),
            "best": self.best.to_dict("records"),
            "chosen": None if self.chosen() is None else self.chosen()["heads"],
            "pool_control": self.pool_control.to_dict("records"), "pool_percentile": self.pool_percentile(),
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
    The one order chapter 2's joint search and :func:`cel_utils.gates.compare_selectors` both use, so a sweep of
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
    changes), with a percentile bootstrap CI over items (``scipy.stats.bootstrap``). ``base`` and ``joint`` are
    ``[n_items]``, ``singles`` ``[n_members, n_items]``. Margins add exactly when the effects are additive, so
    unlike accuracy no threshold makes it non-zero.

    Example:
        >>> base = np.zeros(4); singles = np.array([[1.0, 1, 1, 1], [2.0, 2, 2, 2]])
        >>> margin_interaction(base, singles.sum(0), singles)[0]
        0.0
    """
    from scipy.stats import bootstrap

    d = (np.asarray(joint) - base) - (np.asarray(singles) - base).sum(axis=0)  # [n_items]
    point = float(d.mean())
    if np.ptp(d) == 0:
        return point, point, point
    ci = bootstrap((d,), np.mean, n_resamples=n_boot, confidence_level=1 - alpha, method="percentile",
                   random_state=np.random.default_rng(seed)).confidence_interval
    return point, float(ci.low), float(ci.high)


@dataclass
class PoolRun:
    """One pool through search (every subset) -> confirm (the best set of each size, BH) -> held-out (Holm)."""

    subsets: pd.DataFrame               # every subset on the search split (and the explore items)
    strategies: pd.DataFrame            # what each strategy found on the search-split figures
    best: pd.DataFrame                  # the best set of each size: search, confirm and held-out figures
    best_sets: dict[str, list[Head]]    # the best sets by name
    heldout: Comparison | None          # the held-out comparison behind ``best`` (None: not tested)
    seconds_per_evaluation: float


def run_pool(lm, encs: dict, pool, s: JointSettings, ablation: Ablation, explore=None,
             heldout: bool = True) -> PoolRun:
    """search (every subset) -> confirm (best set of each size, BH) -> held-out (Holm), for one pool;
    ``heldout=False`` stops after the confirmation (``best`` has no held-out columns)."""
    max_size, beam_width, fdr, n_boot, seed, progress = (s.max_size, s.beam_width, s.fdr, s.n_boot, s.seed,
                                                         s.progress)
    masks = subset_masks(len(pool))
    t0 = time.perf_counter()
    sets, on_search = sweep_pool(lm, encs["search"], pool, ablation, n_boot=n_boot, seed=seed, progress=progress)
    named = _named(sets[1:])  # mask 0 is the empty set: the baseline of the comparison
    per_eval = (time.perf_counter() - t0) / len(sets)
    on_explore = None if explore is None else compare_sets(lm, explore, named, mode=ablation, n_boot=n_boot,
                                                           seed=seed, progress=progress)
    tab = _subset_table(masks, sets, on_search, on_explore)
    strategies, best_rows = _run_strategies(pool, sets, tab, max_size, beam_width, per_eval)
    best = tab.iloc[best_rows][["heads", "size", "search_accuracy", "search_delta_accuracy",
                                "search_delta_margin"]].reset_index(drop=True)
    best_sets = {r: sets[i] for r, i in zip(best["heads"], best_rows)}
    conf = compare_sets(lm, encs["confirm"], best_sets, mode=ablation, n_boot=n_boot, seed=seed)
    d = confirm_decisions(conf.baseline.correct[0], conf.results.correct, fdr)
    best["confirm_delta_accuracy"] = conf.table["delta_accuracy"].to_numpy()
    for k in ("fixes", "breaks", "p_value", "q_value", "confirmed"):
        best[f"confirm_{k}" if k != "confirmed" else k] = d[k]
    if not heldout:
        return PoolRun(tab, strategies, best, best_sets, None, per_eval)
    held, cmp = heldout_test(lm, encs["heldout"], best_sets, mode=ablation, n_boot=n_boot, seed=seed)
    best["heldout_baseline"] = held["baseline_accuracy"].to_numpy()
    best["heldout_delta_accuracy"] = held["delta_accuracy"].to_numpy()
    for k in ("ci_low", "ci_high", "fixes", "breaks", "p_value", "p_holm", "holds"):
        best[k] = held[k].to_numpy()
    best["heldout_delta_margin"] = held["delta_margin"].to_numpy()
    return PoolRun(tab, strategies, best, best_sets, cmp, per_eval)


def joint_search(lm, search_task, confirm_task, heldout_task, pool, settings: JointSettings | None = None,
                 **overrides) -> JointSearch:
    """Search every subset of ``pool`` (m <= ``POOL_MAX``) on the search split, confirm the best set of each
    size on the confirm split, test them on the held-out split; then the two controls.

    The strategies (exhaustive up to ``max_size``, greedy, beam) run on the search-split figures of the sweep:
    the model is deterministic, so looking a set up is the same as evaluating it, and each strategy's cost is
    its evaluation count (x the measured seconds per evaluation). The held-out split never takes part in
    choosing. ``settings`` (a :class:`JointSettings`) and keyword ``overrides`` of its fields set the parameters:
    ``n_explore``, held-out items (the first ones) on which every subset is also evaluated for the explorer and the
    plain random control; ``random_pools``, how many random pools of the same size go through the same pipeline
    (the selection-aware control). Mean ablation takes its head means from the search split.
    """
    s = replace(settings or JointSettings(), **overrides)
    pool = [tuple(h) for h in pool]
    m = len(pool)
    if not 1 <= m <= POOL_MAX:
        raise CELError(f"the pool must hold 1 to {POOL_MAX} heads (2^m subsets), got {m}")
    if len(set(pool)) != m:
        raise CELError("the candidate pool has duplicates")
    s = replace(s, max_size=min(s.max_size, m))
    encs = {"search": encode_task(lm, search_task), "confirm": encode_task(lm, confirm_task),
            "heldout": encode_task(lm, heldout_task)}
    n_explore = encs["heldout"].n_items if s.n_explore is None else min(s.n_explore, encs["heldout"].n_items)
    explore = encode_task(lm, replace(heldout_task, items=heldout_task.items[:n_explore]))
    ablation = Ablation.of(s.mode).resolved(lm, encs["search"].inputs)
    run = run_pool(lm, encs, pool, s, ablation, explore)
    best = run.best
    add_interaction(lm, encs["heldout"], run, ablation, s.n_boot, s.seed)
    control = random_control(lm, explore, range(1, s.max_size + 1), s.random_sets, mode=ablation, seed=s.seed,
                             progress=s.progress)
    ex = run.subsets.set_index("heads")["explore_delta_accuracy"]
    best["explore_delta_accuracy"] = [float(ex[h]) for h in best["heads"]]
    best["random_percentile"] = [
        percentile_among(control[control["size"] == r.size]["heldout_delta_accuracy"].to_numpy(),
                         r.explore_delta_accuracy) for r in best.itertuples()]
    pool_control = random_pool_control(lm, encs, m, replace(s, progress=False), ablation)
    return JointSearch(model=lm.name, task=search_task.name, pool=pool, subsets=run.subsets,
                       strategies=run.strategies, best=best, random_control=control, pool_control=pool_control,
                       seconds_per_evaluation=run.seconds_per_evaluation, n_search=encs["search"].n_items,
                       n_confirm=encs["confirm"].n_items, n_heldout=encs["heldout"].n_items, n_explore=n_explore)


def add_interaction(lm, heldout, run: PoolRun, ablation: Ablation, n_boot: int, seed: int) -> None:
    """Each best set's interaction on held-out margins (its change against the sum of its members' changes, with
    a CI), added to ``run.best`` as ``interaction``, ``interaction_ci_low``, ``interaction_ci_high``."""
    members = sorted({h for s in run.best_sets.values() for h in s})
    singles = compare_sets(lm, heldout, _named([[h] for h in members]), mode=ablation, n_boot=n_boot, seed=seed)
    row_of = {h: i for i, h in enumerate(members)}
    base_m = run.heldout.baseline.margin[0]
    inter = [margin_interaction(base_m, run.heldout.results.margin[j],
                                singles.results.margin[[row_of[h] for h in s]], n_boot=n_boot, seed=seed)
             for j, s in enumerate(run.best_sets.values())]
    run.best["interaction"], run.best["interaction_ci_low"], run.best["interaction_ci_high"] = map(list, zip(*inter))


def random_pool_control(lm, encs: dict, m: int, s: JointSettings, ablation: Ablation) -> pd.DataFrame:
    """The selection-aware control: the whole pipeline run on ``s.random_pools`` random pools of ``m`` heads; per
    pool the set it would choose and that set's held-out gain (0 when it chooses nothing). The choice is made on
    the confirm split before any held-out test, so only the chosen set is evaluated on held-out items."""
    rng = np.random.default_rng(s.seed)
    everything = all_heads(lm)
    pc = []
    for rep in range(s.random_pools):
        rpool = [everything[i] for i in rng.choice(len(everything), m, replace=False)]
        run = run_pool(lm, encs, rpool, s, ablation, heldout=False)
        pick = pick_chosen(run.best, gain="confirm_delta_accuracy")
        gain = 0.0
        if pick is not None:
            held = compare_sets(lm, encs["heldout"], {pick["heads"]: run.best_sets[pick["heads"]]}, mode=ablation,
                                n_boot=s.n_boot, seed=s.seed)
            gain = float(held.table["delta_accuracy"].iloc[0])
        pc.append({"replicate": rep, "pool": format_heads(rpool), "chosen": None if pick is None else pick["heads"],
                   "heldout_delta_accuracy": gain})
    return pd.DataFrame(pc, columns=["replicate", "pool", "chosen", "heldout_delta_accuracy"])


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
