"""Joint ablation on a real model: search a pool of screened heads, grade on held-out items, cost on other tasks.

* :func:`model_scorer`: a batched scorer for the strategies of :mod:`cel_utils.search`.
* :func:`search_heads`: one strategy on the search split, best set per size graded on held-out items (``cel search``).
* :func:`joint_search`: every subset of a small pool on both splits, all strategies on top (chapter 2).
* :func:`random_control`: random head sets of the same sizes, drawn from all heads.
* :func:`cross_task`: named head sets removed while the model does other tasks.

Every comparison against the unablated model goes through :func:`cel_utils.compare.compare_sets`.

Example (tiny random model, so the numbers mean nothing):
    >>> from cel_utils.joint import joint_search   # doctest: +SKIP
    >>> js = joint_search(lm, load_task("ioi", n=20), load_task("ioi", "heldout", n=20), [(0, 1), (1, 0)])  # doctest: +SKIP
    >>> len(js.subsets)   # doctest: +SKIP
    4
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from .ablation import Ablation, Head, all_heads, format_heads, head_name
from .compare import compare_sets
from .defaults import BEAM_WIDTH, N_BOOT, POOL_MAX, RANDOM_SETS, TIE_BREAK
from .engine import evaluate_head_sets
from .errors import CELError
from .scoring import encode_task
from .search import beam, exhaustive, greedy, heads_of, percentile_among, subset_masks

STRATEGIES = ("exhaustive", "greedy", "beam")


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
    return {format_heads(s): list(s) for s in sets}


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


def search_heads(lm, search_task, heldout_task, pool, strategy: str = "greedy", max_size: int = 3,
                 width: int = 4, random_sets: int = RANDOM_SETS, mode: str | Ablation = "zero", seed: int = 0,
                 n_boot: int = N_BOOT) -> dict:
    """Search on one split, report every best-per-size set on held-out items with a paired bootstrap CI,
    and the same for ``random_sets`` random head sets of each size drawn from all heads (the control)."""
    strategies = {"exhaustive": lambda p, s: exhaustive(p, s, max_size),
                  "greedy": lambda p, s: greedy(p, s, max_size),
                  "beam": lambda p, s: beam(p, s, width, max_size)}
    if strategy not in strategies:
        raise CELError(f"unknown strategy {strategy!r}; use {', '.join(STRATEGIES)}")
    enc_s, enc_h = encode_task(lm, search_task), encode_task(lm, heldout_task)
    ablation = Ablation.of(mode).resolved(lm, enc_s.inputs)  # means (if any) from the search split only
    t0 = time.perf_counter()
    res = strategies[strategy](list(pool), model_scorer(lm, enc_s, mode=ablation))
    secs = time.perf_counter() - t0
    sizes = sorted(k for k in res.best if k > 0)
    best_sets = [list(res.best[k].heads) for k in sizes]
    members = sorted({h for hs in best_sets for h in hs})
    on_search = compare_sets(lm, enc_s, {**_named(best_sets), **_named([[h] for h in members])}, mode=ablation,
                             n_boot=n_boot, seed=seed).table.set_index("heads")
    single = {h: float(on_search.loc[head_name(h), "delta_accuracy"]) for h in members}
    held = compare_sets(lm, enc_h, _named(best_sets), mode=ablation, n_boot=n_boot, seed=seed).table
    rc = random_control(lm, enc_h, sizes, random_sets, mode=ablation, seed=seed)
    controls = [{"size": k, "heldout_delta_accuracy": g["heldout_delta_accuracy"].tolist()}
                for k, g in rc.groupby("size")]
    best = []
    for j, (k, hs) in enumerate(zip(sizes, best_sets)):
        s, h = on_search.loc[format_heads(hs)], held.iloc[j]
        sum_singles = sum(single[x] for x in hs)
        ctrl = controls[j]["heldout_delta_accuracy"] if random_sets > 0 else []
        best.append({"size": k, "heads": format_heads(hs).split(","),
                     "search": {"accuracy": float(s.accuracy), "mean_margin": float(s.mean_margin),
                                "delta_accuracy": float(s.delta_accuracy),
                                "sum_of_singles_delta_accuracy": sum_singles,
                                "interaction": float(s.delta_accuracy) - sum_singles},
                     "heldout": {"accuracy": float(h.accuracy), "mean_margin": float(h.mean_margin),
                                 "delta_accuracy": float(h.delta_accuracy), "ci_low": float(h.ci_low),
                                 "ci_high": float(h.ci_high),
                                 "random_percentile": percentile_among(ctrl, h.delta_accuracy) if ctrl else None}})
    return {"strategy": strategy, "pool": format_heads(pool).split(","), "n_evaluations": res.n_evaluations,
            "search_seconds": secs,
            "baseline": {"search_accuracy": float(on_search["baseline_accuracy"].iloc[0]),
                         "heldout_accuracy": float(held["baseline_accuracy"].iloc[0])},
            "best": best, "random_control": controls}


@dataclass
class JointSearch:
    """Every subset of a candidate pool evaluated on both splits, and what the strategies find in it.

    ``subsets``: one row per subset (``mask``, ``heads``, ``size``, search and held-out accuracy / margin and
    their changes against the unablated model, ``sum_of_singles`` and ``interaction`` on the search split,
    ``search_score`` = search accuracy + ``TIE_BREAK`` x search margin, what the strategies maximise).
    ``strategies``: per strategy, the best set per size it finds on the search split and its evaluation count.
    ``best``: the best-by-search set of each size (exhaustive) with a held-out paired-bootstrap 95% CI.
    ``random_control``: held-out accuracy change of random head sets of each reported size, from all heads.
    """

    model: str
    task: str
    pool: list
    subsets: pd.DataFrame
    heldout_correct: np.ndarray  # [2^m, n_heldout] per-item correctness, rows in ``subsets`` order
    strategies: pd.DataFrame
    best: pd.DataFrame
    random_control: pd.DataFrame
    seconds_per_evaluation: float
    n_search: int
    n_heldout: int

    def smallest_helpful(self):
        """The smallest best-by-search set whose held-out CI lies above zero, or None (an honest 'none')."""
        ok = self.best[(self.best["size"] > 0) & (self.best["ci_low"] > 0)]
        return None if ok.empty else ok.iloc[0]

    def chosen(self):
        """The set a practitioner would take, chosen on the search split only: the best-by-search set of any
        size >= 1 (highest search accuracy; ties go to the smaller set), or None when no set improves the
        search split. Its held-out row is the honest figure."""
        b = self.best[self.best["size"] > 0]
        row = b.loc[b["search_accuracy"].idxmax()]  # idxmax takes the first (smallest) on ties
        return row if row["search_delta_accuracy"] > 0 else None  # nothing helps even on the search split

    def explorer_data(self) -> dict:
        """What the kernel-free explorer needs: pool names and, per subset mask, the exact figures."""
        rows = {}
        for r in self.subsets.itertuples():
            rows[int(r.mask)] = [round(float(r.search_accuracy), 4), round(float(r.heldout_accuracy), 4),
                                 round(float(r.search_margin), 4), round(float(r.heldout_margin), 4)]
        return {"model": self.model, "task": self.task, "pool": [head_name(h) for h in self.pool],
                "n_search": self.n_search, "n_heldout": self.n_heldout, "subsets": rows}


def _subset_table(masks, sets, on_search, on_heldout) -> pd.DataFrame:
    """One row per subset (the empty set first) with both splits' figures, single sums and interaction."""
    m = max(masks).bit_length()
    rows = {}
    for split, cmp in (("search", on_search), ("heldout", on_heldout)):
        rows[f"{split}_accuracy"] = np.concatenate([cmp.baseline.accuracy, cmp.results.accuracy])
        rows[f"{split}_margin"] = np.concatenate([cmp.baseline.mean_margin, cmp.results.mean_margin])
    tab = pd.DataFrame({"mask": masks, "heads": [",".join(head_name(h) for h in s) for s in sets],
                        "size": [len(s) for s in sets], **rows})
    tab = tab[["mask", "heads", "size", "search_accuracy", "search_margin", "heldout_accuracy", "heldout_margin"]]
    for split in ("search", "heldout"):
        tab[f"{split}_delta_accuracy"] = tab[f"{split}_accuracy"] - tab[f"{split}_accuracy"].iloc[0]
        tab[f"{split}_delta_margin"] = tab[f"{split}_margin"] - tab[f"{split}_margin"].iloc[0]
    single = {int(r.mask): r.search_delta_accuracy for r in tab[tab["size"] == 1].itertuples()}
    tab["sum_of_singles"] = [sum(single[1 << i] for i in range(m) if s >> i & 1) for s in masks]
    tab["interaction"] = tab["search_delta_accuracy"] - tab["sum_of_singles"]
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
                          "heldout_delta_accuracy": tab["heldout_delta_accuracy"].iloc[i],
                          "n_evaluations": res.n_evaluations, "est_seconds": res.n_evaluations * per_eval})
    best_rows = [0] + [row_of[tuple(sorted(runs["exhaustive"].best[k].heads))] for k in range(1, max_size + 1)]
    return pd.DataFrame(strat), best_rows


def joint_search(lm, search_task, heldout_task, pool, max_size: int = 3, beam_width: int = BEAM_WIDTH,
                 random_sets: int = RANDOM_SETS, mode: str | Ablation = "zero", seed: int = 0, n_boot: int = N_BOOT,
                 progress: bool = True) -> JointSearch:
    """Evaluate every subset of ``pool`` (m <= ``POOL_MAX``) on the search and held-out splits, then run the
    strategies.

    The strategies (exhaustive up to ``max_size``, greedy, beam) run on the search-split figures of the sweep:
    the model is deterministic, so looking a set up is the same as evaluating it, and each strategy's cost is
    its evaluation count (x the measured seconds per evaluation). Held-out figures are never used to choose.
    Mean ablation takes its head means from the search split.
    """
    pool = [tuple(h) for h in pool]
    m = len(pool)
    if not 1 <= m <= POOL_MAX:
        raise CELError(f"the pool must hold 1 to {POOL_MAX} heads (2^m subsets), got {m}")
    if len(set(pool)) != m:
        raise CELError("the candidate pool has duplicates")
    max_size = min(max_size, m)
    enc_s, enc_h = encode_task(lm, search_task), encode_task(lm, heldout_task)
    ablation = Ablation.of(mode).resolved(lm, enc_s.inputs)
    masks = subset_masks(m)
    sets = [heads_of(s, pool) for s in masks]
    named = _named(sets[1:])  # mask 0 is the empty set: the baseline of the comparison
    t0 = time.perf_counter()
    on_search = compare_sets(lm, enc_s, named, mode=ablation, n_boot=n_boot, seed=seed, progress=progress)
    on_heldout = compare_sets(lm, enc_h, named, mode=ablation, n_boot=n_boot, seed=seed, progress=progress)
    per_eval = (time.perf_counter() - t0) / (2 * len(sets))
    tab = _subset_table(masks, sets, on_search, on_heldout)
    strategies, best_rows = _run_strategies(pool, sets, tab, max_size, beam_width, per_eval)
    best = tab.iloc[best_rows][["heads", "size", "search_accuracy", "search_delta_accuracy", "heldout_accuracy",
                                "heldout_delta_accuracy", "interaction"]].reset_index(drop=True)
    ci = on_heldout.table  # row r of the table is subset r + 1; the empty set's CI is [0, 0]
    best["ci_low"] = [0.0 if r == 0 else float(ci["ci_low"].iloc[r - 1]) for r in best_rows]
    best["ci_high"] = [0.0 if r == 0 else float(ci["ci_high"].iloc[r - 1]) for r in best_rows]
    control = random_control(lm, enc_h, range(1, max_size + 1), random_sets, mode=ablation, seed=seed,
                             progress=progress)
    best["random_percentile"] = [
        percentile_among(control[control["size"] == r.size]["heldout_delta_accuracy"].to_numpy(),
                         r.heldout_delta_accuracy) for r in best.itertuples()]
    heldout_correct = np.concatenate([on_heldout.baseline.correct, on_heldout.results.correct])
    return JointSearch(model=lm.name, task=search_task.name, pool=pool, subsets=tab, heldout_correct=heldout_correct,
                       strategies=strategies, best=best, random_control=control, seconds_per_evaluation=per_eval,
                       n_search=enc_s.n_items, n_heldout=enc_h.n_items)


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
