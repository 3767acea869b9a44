"""The book's verdict for one (model, task): choose on one split, confirm on another, report on a third.

:func:`single_head_verdict` runs the three stages of chapter 1 on a task's disjoint splits:

1. **search**: every head ablated alone on a few items, ranked by the change in mean margin;
2. **confirm**: the top ``top_k`` heads re-tested on fresh items, exact McNemar p-values, Benjamini-Hochberg
   over the ``top_k``; a head is confirmed when ``q < fdr`` and it fixes more items than it breaks;
3. **heldout**: the confirmed heads, alone and all together, tested once more on items that took no part in
   any choice (:func:`cel_utils.compare.heldout_test`: exact McNemar, Holm over the sets tested).

The *chosen* head, fixed before the held-out test, is the confirmed head with the largest confirm gain; all
confirmed heads together are tested beside it (single-head gains need not add up: chapter 2).
The result carries every table and a one-row :meth:`Verdict.row` (baseline, confirmed heads, the chosen head,
its held-out gain with CI and Holm-adjusted p, the minimum detectable gain, and a sentence). When nothing is
confirmed the sentence says how large a single-head gain would have been found with 80% power.

Example:
    >>> v = single_head_verdict(lm, "addition", n_search=32, n_confirm=200, n_heldout=200)  # doctest: +SKIP
    >>> v.row()["verdict"]                                                                  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import pandas as pd

from .ablation import Ablation, Head, format_heads, format_set, layer_of, parse_heads, parse_set
from .compare import Comparison, compare_sets, heldout_test, pick_chosen
from .defaults import (ALPHA, CONFIRM_TOP_K, FDR, N_BOOT, N_CONFIRM, N_HELDOUT, N_SEARCH, POWER, POWER_GAIN,
                       POWER_SIMS)
from .io import json_safe
from .models import cast
from .scoring import encode_task
from .joint import cross_task
from .screening import Screen, confirm_test, confirmation_power, screen
from .power import pipeline_power, power_sentence
from .stats import min_detectable_gain
from .tasks import Task, load_task


@dataclass
class Verdict:
    """Everything the three stages computed for one model and task (see the module docstring)."""

    model: str
    task: str
    splits: dict[str, Task]            # "search", "confirm", "heldout"
    screen: Screen
    stats: pd.DataFrame                # the screen's per-head statistics and candidate rule
    confirm: pd.DataFrame              # the top_k heads re-tested on the confirm split
    confirm_comparison: Comparison     # per-item results behind it
    power: dict                        # confirmation_power(): min_detectable_gain, alpha, break_rate
    confirmed: list[str]
    heldout: pd.DataFrame              # heldout_test() of the confirmed heads alone and together ([] if none)
    heldout_comparison: Comparison | None
    ablation: Ablation | None = None    # the ablation used (with its head means in mean mode)
    fdr: float = FDR
    pipeline: pd.DataFrame | None = None  # power of the whole pipeline (:func:`pipeline_power_table`)

    @property
    def chosen(self) -> str | None:
        """The head the pipeline reports, chosen before the held-out test: of the confirmed heads, the one with
        the largest gain on the confirm split (ties: the better-ranked on the search split). None if none."""
        c = pick_chosen(self.confirm)
        return None if c is None else str(c["head"])

    def record(self) -> dict:
        """The JSON-ready record of this verdict: what chapter 1a writes per (model, task) and what
        :func:`heads_to_explain` (chapter 2a) and chapter 3's bridge read back. The schema:

        ``model``, ``task``, ``n_search``, ``n_confirm``, ``n_heldout``, ``n_heads_screened``;
        ``screened_heads`` (names) with their search-split ``delta_margin`` and ``delta_accuracy`` (same order);
        ``candidates`` (heads passing the candidate rule on the search items);
        ``confirm``: one row per re-tested head (``head``, ``search_delta_margin``, ``delta_accuracy``, ``ci_low``,
        ``ci_high``, ``fixes``, ``breaks``, ``p_value``, ``q_value``, ``confirmed``);
        ``confirmed`` (names), ``min_detectable_gain``;
        ``heldout``: one row per set tested (``heads``: a set name, :func:`~cel_utils.ablation.format_set`;
        ``delta_accuracy``, ``ci_low``, ``ci_high``, ``fixes``, ``breaks``, ``p_holm``, ``holds``).
        """
        st = self.stats
        conf_cols = ["head", "search_delta_margin", "delta_accuracy", "ci_low", "ci_high", "fixes", "breaks",
                     "p_value", "q_value", "confirmed"]
        held_cols = ["heads", "delta_accuracy", "ci_low", "ci_high", "fixes", "breaks", "p_holm", "holds"]
        return json_safe({
            "model": self.model, "task": self.task, "n_search": len(self.splits["search"]),
            "n_confirm": len(self.splits["confirm"]), "n_heldout": len(self.splits["heldout"]),
            "n_heads_screened": int(len(st)), "screened_heads": st["head"].tolist(),
            "candidates": st[st.candidate]["head"].tolist(), "delta_margin": st["delta_margin"].tolist(),
            "delta_accuracy": st["delta_accuracy"].tolist(),
            "confirm": self.confirm[conf_cols].to_dict("records"), "confirmed": list(self.confirmed),
            "min_detectable_gain": self.power["min_detectable_gain"],
            "heldout": self.heldout[held_cols].to_dict("records") if len(self.heldout) else [],
            **{k: v for k, v in self.power_summary().items() if k != "power_sentence"},
            "pipeline": self.pipeline.to_dict("records") if self.pipeline is not None else []})

    def row(self) -> dict:
        """One row of the verdict table."""
        mde = self.power["min_detectable_gain"]
        pw = self.power_summary()
        base = {"model": self.model, "task": self.task, "n_search": len(self.splits["search"]),
                "n_confirm": len(self.splits["confirm"]), "n_heldout": len(self.splits["heldout"]),
                "baseline": float(self.confirm_comparison.baseline.accuracy[0]),
                "search_baseline": float(self.screen.baseline.accuracy[0]), "n_heads": len(self.stats),
                "n_candidates": int(self.stats["candidate"].sum()), "confirmed": ", ".join(self.confirmed),
                "mde": mde, "chosen": self.chosen, "heldout_baseline": np.nan, "heldout_delta": np.nan,
                "ci_low": np.nan, "ci_high": np.nan, "p_holm": np.nan, "holds": False, "together_delta": np.nan,
                "together_ci_low": np.nan, "together_ci_high": np.nan, "together_holds": False, **pw}
        if not self.confirmed:
            base["verdict"] = "not detected: " + pw["power_sentence"]
            return base
        tab = self.heldout.set_index("heads")
        r = tab.loc[self.chosen]
        base.update(heldout_baseline=float(r["baseline_accuracy"]), heldout_delta=float(r["delta_accuracy"]),
                    ci_low=float(r["ci_low"]), ci_high=float(r["ci_high"]), p_holm=float(r["p_holm"]),
                    holds=bool(r["holds"]))
        base["verdict"] = (f"localized: removing {self.chosen} changes held-out accuracy by "
                           f"{r['delta_accuracy']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}], Holm p = "
                           f"{r['p_holm']:.2g}" if r["holds"] else
                           f"confirmed ({self.chosen}) but not replicated on held-out items "
                           f"({r['delta_accuracy']:+.3f}, Holm p = {r['p_holm']:.2g})")
        if len(self.confirmed) > 1:
            t = tab.loc[format_set(parse_heads(self.confirmed))]
            n_hold = int(tab.loc[self.confirmed, "holds"].sum())
            base.update(together_delta=float(t["delta_accuracy"]), together_ci_low=float(t["ci_low"]),
                        together_ci_high=float(t["ci_high"]), together_holds=bool(t["holds"]))
            base["verdict"] += (f"; {n_hold} of the {len(self.confirmed)} confirmed heads hold alone, and all "
                                f"{len(self.confirmed)} removed together change it by {t['delta_accuracy']:+.3f} "
                                f"[{t['ci_low']:+.3f}, {t['ci_high']:+.3f}]")
        return base

    def power_summary(self) -> dict:
        """The power fields of :meth:`row`: the confirm test's minimum detectable gain at break rate 0 (``mde``,
        the best case) and at the largest break rate among the re-tested heads (``mde_worst``), and the power of
        the whole pipeline at ``POWER_GAIN`` at that largest break rate (``pipeline_power``) and at 0
        (``pipeline_power_best``), with the sentence that states them (never "ruled out")."""
        b_max, mde_worst = self.power["break_rate_worst"], self.power["min_detectable_gain_worst"]
        out = {"mde": self.power["min_detectable_gain"], "mde_worst": mde_worst, "break_rate_worst": b_max,
               "pipeline_power": np.nan, "pipeline_power_best": np.nan, "power_gain": POWER_GAIN,
               "power_sentence": ""}
        if self.pipeline is None or self.pipeline.empty:
            return out
        at = self.pipeline[np.isclose(self.pipeline.gain, POWER_GAIN)]
        worst, best = at.loc[at.break_rate.idxmax()], at.loc[at.break_rate.idxmin()]
        out.update(pipeline_power=float(worst["power"]), pipeline_power_best=float(best["power"]))
        text = power_sentence(worst)
        if worst["break_rate"] > 0 and isinstance(best["reason"], str) is False:
            text += f" ({best['power']:.2f} if it breaks nothing)"
        if np.isfinite(out["mde"]):
            text += (f"; the confirm test alone, for a head already ranked in the top {len(self.confirm)}, detects "
                     f"a gain of {out['mde']:.3f} with {self.power['power']:.0%} power at best (breaking nothing), "
                     f"{mde_worst:.3f} at the largest re-tested break rate ({b_max:.3f})")
        out["power_sentence"] = text
        return out


def heads_to_explain(pairs: Sequence[dict], k: int = 2) -> list[dict]:
    """Which heads of one model chapter 2a explains, from the :meth:`Verdict.record` of each of its tasks
    (``pairs``; it reads ``task``, ``screened_heads``, ``delta_margin``, ``confirm`` and ``heldout``): among the single heads that held on
    held-out items, first each task's one with the largest confirm-split gain (the head chapter 1a chose), then
    the others by confirm gain (held-out results only filter, they never rank); when none held anywhere, each task's head with the largest search-split margin
    gain, marked ``exploratory``. Each pick carries a same-layer ``control`` head whose removal changed the
    search margin least.

    Example:
        >>> p = [{"task": "t", "screened_heads": ["L0H0", "L0H1"], "delta_margin": [0.5, 0.01],
        ...       "heldout": [{"heads": "L0H0", "holds": True, "delta_accuracy": 0.1}]}]
        >>> heads_to_explain(p)
        [{'task': 't', 'head': 'L0H0', 'status': 'confirmed', 'control': 'L0H1'}]
    """
    def confirm_gain(p, head):
        return next((r["delta_accuracy"] for r in p.get("confirm", []) if r["head"] == head), 0.0)

    held = [(confirm_gain(p, row["heads"]), p["task"], row["heads"]) for p in pairs for row in p.get("heldout", [])
            if row.get("holds") and len(parse_set(row["heads"])) == 1]
    picks: list[tuple[str, str, str]] = []
    if held:
        best = {}
        for gain, task, head in sorted(held, reverse=True):
            best.setdefault(task, (task, head, "confirmed"))
        picks = list(best.values())
        picks += [(t, h, "confirmed") for _, t, h in sorted(held, reverse=True) if (t, h, "confirmed") not in picks]
    else:
        for p in pairs:
            dm = np.asarray(p["delta_margin"], float)
            picks.append((p["task"], p["screened_heads"][int(np.argmax(dm))], "exploratory"))
    out = []
    for task, head, status in picks[:k]:
        p = next(q for q in pairs if q["task"] == task)
        same = [(abs(v), h) for h, v in zip(p["screened_heads"], p["delta_margin"])
                if layer_of(h) == layer_of(head) and h != head]
        out.append({"task": task, "head": head, "status": status, "control": min(same)[1] if same else None})
    return out


@dataclass(frozen=True)
class VerdictSettings:
    """The parameters of :func:`single_head_verdict` (defaults from :mod:`cel_utils.defaults`)."""

    n_search: int = N_SEARCH      # items per split (clipped to what a split holds)
    n_confirm: int = N_CONFIRM
    n_heldout: int = N_HELDOUT
    top_k: int = CONFIRM_TOP_K    # heads re-tested on the confirm split
    fdr: float = FDR
    seed: int = 0
    mode: str | Ablation = "zero"
    n_boot: int = N_BOOT
    power: float = POWER
    power_sims: int = POWER_SIMS  # simulations of the whole pipeline (0: not computed)
    rank_dtype: str = "float32"   # the search screen's dtype (it only ranks: confirm and held-out stay float32)


def pipeline_power_table(sc: Screen, conf: pd.DataFrame, conf_cmp: Comparison, held: pd.DataFrame, n_heldout: int,
                         mde: float, s: VerdictSettings) -> pd.DataFrame:
    """:func:`cel_utils.power.pipeline_power` around this pair's own screen: a head planted in the real search
    screen (margins of every head on the search items), the real re-tested heads' confirm (fixes, breaks), the
    real held-out p-values, the confirm split's unablated margins to turn a gain into a margin shift; at
    ``POWER_GAIN`` and at the confirm test's best-case MDE, breaking nothing and breaking as much as the worst
    re-tested head. ``match_spread`` (the estimate that tracked a direct simulation, ``tests/test_power.py``)."""
    n = len(conf_cmp.baseline.correct[0])
    b_max = float(conf["breaks"].max()) / n if len(conf) else 0.0
    gains = [POWER_GAIN] + ([round(mde, 4)] if np.isfinite(mde) and not np.isclose(mde, POWER_GAIN) else [])
    return pipeline_power(sc.baseline.margin[0], sc.results.margin, conf_cmp.baseline.margin[0], n_confirm=n,
                          n_heldout=n_heldout, top_k=len(conf), fdr=s.fdr, alpha=ALPHA, gains=gains,
                          break_rates=sorted({0.0, b_max}),
                          confirm_others=list(zip(conf["fixes"].astype(int), conf["breaks"].astype(int))),
                          heldout_others=held["p_value"].tolist() if len(held) else None, match_spread=True,
                          n_sim=s.power_sims, seed=s.seed)


def single_head_verdict(lm, task: str | dict[str, Task], heads: str | Sequence[Head] = "all",
                        settings: VerdictSettings | None = None, **overrides) -> Verdict:
    """Run search -> confirm -> held-out for one task (a name or JSONL path, or its three splits as a dict).

    ``settings`` (a :class:`VerdictSettings`) and keyword ``overrides`` of its fields (e.g. ``top_k=10``) set the
    pipeline's parameters. Mean ablation takes its head means from the search split and uses them on every split.
    """
    s = replace(settings or VerdictSettings(), **overrides)
    if isinstance(task, dict):
        splits = task
    else:
        splits = {"search": load_task(task, "search", n=s.n_search, seed=s.seed, clip=True),
                  "confirm": load_task(task, "confirm", n=s.n_confirm, seed=s.seed, clip=True),
                  "heldout": load_task(task, "heldout", n=s.n_heldout, seed=s.seed, clip=True)}
    head_list = parse_heads(heads, lm.n_layers, lm.n_heads) if isinstance(heads, str) else list(heads)
    ablation = Ablation.of(s.mode)
    if ablation.mode == "mean":
        ablation = ablation.resolved(lm, encode_task(lm, splits["search"]).inputs)
    ranker = cast(lm, s.rank_dtype)
    sc = screen(ranker, splits["search"], heads=head_list, mode=ablation)
    st = sc.stats(n_boot=s.n_boot, seed=s.seed, fdr=s.fdr)
    conf, conf_cmp = confirm_test(lm, sc, splits["confirm"], top_k=s.top_k, fdr=s.fdr, mode=ablation,
                                  n_boot=s.n_boot, seed=s.seed)
    pw = confirmation_power(conf, len(splits["confirm"]), s.fdr, s.power)
    confirmed = conf[conf.confirmed]["head"].tolist()
    held, cmp = pd.DataFrame(), None
    if confirmed:
        sets = {h: parse_heads(h) for h in confirmed}
        if len(confirmed) > 1:
            sets[format_set(parse_heads(confirmed))] = parse_heads(confirmed)
        held, cmp = heldout_test(lm, splits["heldout"], sets, mode=ablation, n_boot=s.n_boot, seed=s.seed)
    pipeline = (pipeline_power_table(sc, conf, conf_cmp, held, len(splits["heldout"]), pw["min_detectable_gain"], s)
                if s.power_sims > 0 else None)
    return Verdict(model=lm.name, task=splits["search"].name, splits=splits, screen=sc, stats=st, confirm=conf,
                   confirm_comparison=conf_cmp, power=pw, confirmed=confirmed, heldout=held, heldout_comparison=cmp,
                   ablation=ablation, fdr=s.fdr, pipeline=pipeline)


def set_costs(lm, chosen: dict[str, tuple[str, Sequence[Head]]], tasks: dict[str, Task], n_items: int | None = None,
              mode: str | Ablation = "zero", n_boot: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """Named head sets, each chosen for its own task (``{name: (own_task, heads)}``), removed while the model
    does every task in ``tasks`` (the first ``n_items`` items of each): a tidy table (``own_task``, ``set``,
    ``task``, ``delta_accuracy`` and its CI). Empty when nothing was chosen.

    Example:
        >>> set_costs(lm, {"L13H0": ("addition", [(13, 0)])}, {"ioi": ioi_heldout}, n_items=100)  # doctest: +SKIP
    """
    cols = ["own_task", "set", "task", "baseline", "accuracy", "delta_accuracy", "ci_low", "ci_high", "delta_margin"]
    if not chosen:
        return pd.DataFrame(columns=cols)
    evals = {name: _first(t, n_items) for name, t in tasks.items()}
    tab = cross_task(lm, {k: list(h) for k, (_, h) in chosen.items()}, evals, mode=mode, n_boot=n_boot, seed=seed)
    tab.insert(0, "own_task", tab["set"].map({k: own for k, (own, _) in chosen.items()}))
    return tab[cols]


def cost_on_other_tasks(lm, verdicts: Sequence[Verdict], n_items: int | None = None, mode: str | Ablation = "zero",
                        n_boot: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """:func:`set_costs` of each verdict's chosen set on the held-out split of every task of ``verdicts``."""
    chosen = {v.chosen: (v.task, parse_heads(v.chosen)) for v in verdicts if v.confirmed}
    return set_costs(lm, chosen, {v.task: v.splits["heldout"] for v in verdicts}, n_items, mode, n_boot, seed)


def tradeoff(landscape: pd.DataFrame, confirmed: dict, value: str = "delta_margin") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Do the confirmed heads of task A hurt the model's other task B more often than other heads that help A?

    The toy model of chapter 3 makes heads whose removal helps A *and* hurts B. ``landscape`` holds one row
    per (model, task, head) with the single-head ablation change ``value`` (the screens of chapter 1a: the same
    heads on every task of a model); ``confirmed`` maps ``(model, task)`` to that task's confirmed heads.
    Returns ``points`` (every head: ``delta_a``, ``delta_b``, ``confirmed`` for A) and ``tests``, one row per
    model and ordered task pair: among the heads whose removal helps A (``delta_a > 0``), how many of the
    confirmed ones and how many of the others hurt B (``delta_b < 0``); Fisher's exact test, one-sided (confirmed
    heads hurt B more often), with Holm's correction over the pairs tested. A pair without confirmed heads is
    listed and not tested.

    Example:
        >>> points, tests = tradeoff(landscape, {("smollm2-135m", "addition"): ["L13H0"]})  # doctest: +SKIP
    """
    from scipy.stats import fisher_exact

    from .stats import holm

    points, rows = [], []
    for model, g in landscape.groupby("model", sort=False):
        wide = g.pivot_table(index="head", columns="task", values=value, sort=False)
        for ta in wide.columns:
            for tb in wide.columns:
                if ta == tb:
                    continue
                conf = set(confirmed.get((model, ta), []))
                pts = pd.DataFrame({"model": model, "task_a": ta, "task_b": tb, "head": wide.index,
                                    "delta_a": wide[ta].to_numpy(), "delta_b": wide[tb].to_numpy()})
                pts["confirmed"] = pts["head"].isin(conf)
                points.append(pts)
                helps = pts[pts.delta_a > 0]
                c, o = helps[helps.confirmed], helps[~helps.confirmed]
                k_c, k_o = int((c.delta_b < 0).sum()), int((o.delta_b < 0).sum())
                row = {"model": model, "task_a": ta, "task_b": tb, "heads": len(pts), "help_a": len(helps),
                       "confirmed": len(c), "confirmed_hurt_b": k_c, "others_help_a": len(o), "others_hurt_b": k_o,
                       "share_confirmed": k_c / len(c) if len(c) else np.nan,
                       "share_others": k_o / len(o) if len(o) else np.nan, "p_value": np.nan}
                if len(c) and len(o):
                    row["p_value"] = float(fisher_exact([[k_c, len(c) - k_c], [k_o, len(o) - k_o]],
                                                        alternative="greater").pvalue)
                rows.append(row)
    tests = pd.DataFrame(rows)
    tested = tests.p_value.notna()
    tests["p_holm"] = np.nan
    tests.loc[tested, "p_holm"] = holm(tests.loc[tested, "p_value"].to_numpy())
    return (pd.concat(points, ignore_index=True) if points else pd.DataFrame()), tests


def _first(task: Task, n: int | None) -> Task:
    return task if n is None or n >= len(task) else replace(task, items=task.items[:n])


def zero_vs_mean(lm, verdict: Verdict, n_boot: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """Each confirmed head's change in held-out accuracy under zero and under mean ablation (head means from the
    search prompts), with CIs: both on items that took no part in ranking or confirming the head."""
    cols = ["model", "task", "head", "zero_delta", "zero_ci_low", "zero_ci_high", "mean_delta", "mean_ci_low",
            "mean_ci_high"]
    if not verdict.confirmed:
        return pd.DataFrame(columns=cols)
    sets = {h: parse_heads(h) for h in verdict.confirmed}
    search = encode_task(lm, verdict.splits["search"])
    means = Ablation.of("mean").resolved(lm, search.inputs)
    tabs = {mode: compare_sets(lm, verdict.splits["heldout"], sets, mode=abl, n_boot=n_boot, seed=seed)
            .table.set_index("heads") for mode, abl in (("zero", "zero"), ("mean", means))}
    rows = [{"model": verdict.model, "task": verdict.task, "head": h,
             **{f"{mode}_{k}": float(tabs[mode].loc[h, c]) for mode in tabs
                for k, c in (("delta", "delta_accuracy"), ("ci_low", "ci_low"), ("ci_high", "ci_high"))}}
            for h in verdict.confirmed]
    return pd.DataFrame(rows, columns=cols)


def verdict_table(verdicts: Sequence[Verdict], cost: pd.DataFrame | None = None) -> pd.DataFrame:
    """The verdict rows of several (model, task) pairs as one table; with ``cost`` (from
    :func:`cost_on_other_tasks`) each chosen set's worst change on the model's *other* tasks is added."""
    tab = pd.DataFrame([v.row() for v in verdicts])
    tab["worst_cost_task"], tab["cost_delta"], tab["cost_ci_low"], tab["cost_ci_high"] = None, np.nan, np.nan, np.nan
    if cost is None or cost.empty:
        return tab
    for i, r in tab.iterrows():
        w = worst_cost(cost[cost["model"] == r["model"]] if "model" in cost else cost, r["chosen"], r["task"])
        for k, v in w.items():
            tab.loc[i, k] = v
    return tab


def worst_cost(cost: pd.DataFrame, chosen: str | None, own_task: str) -> dict:
    """The chosen set's most negative change on a task other than its own (from :func:`set_costs`), as the verdict
    columns ``worst_cost_task``, ``cost_delta``, ``cost_ci_low``, ``cost_ci_high``; empty when there is none."""
    if cost is None or cost.empty or chosen is None:
        return {}
    other = cost[(cost["set"] == chosen) & (cost["own_task"] == own_task) & (cost["task"] != own_task)]
    if other.empty:
        return {}
    w = other.loc[other["delta_accuracy"].idxmin()]
    return {"worst_cost_task": w["task"], "cost_delta": float(w["delta_accuracy"]), "cost_ci_low": float(w["ci_low"]),
            "cost_ci_high": float(w["ci_high"])}


def verdict_markdown(table: pd.DataFrame) -> str:
    """The verdict table as markdown sentences, one per pair (for a code cell to display: numbers from the run)."""
    lines = []
    for r in table.itertuples():
        lines.append(f"- **{r.model} / {r.task}** (accuracy {r.baseline:.3f} on {r.n_confirm} confirm items; "
                     f"{r.n_search} search, {r.n_heldout} held-out): {r.verdict}"
                     + (f"; on {r.worst_cost_task} it changes accuracy by {r.cost_delta:+.3f} "
                        f"[{r.cost_ci_low:+.3f}, {r.cost_ci_high:+.3f}]." if isinstance(r.worst_cost_task, str)
                        else "."))
    return "\n".join(lines)


def joint_row(js, cost: pd.DataFrame | None = None, fdr: float = FDR, power: float = POWER) -> dict:
    """One verdict row for a joint search (:class:`cel_utils.joint.JointSearch`): the chosen set (chosen on
    the search and confirm splits), its held-out gain with CI and Holm-adjusted p, the selection-aware control's
    percentile, the worst change on another task (from :func:`cost_on_other_tasks`-shaped ``cost``), and the
    minimum detectable gain of the confirmation (BH over the sizes confirmed)."""
    b = js.best
    mde = min_detectable_gain(js.n_confirm, fdr / max(len(b), 1), float(np.median(b["confirm_breaks"])) / js.n_confirm,
                              power)
    c = js.chosen()
    row = {"model": js.model, "task": js.task, "pool": format_heads(js.pool), "n_search": js.n_search,
           "n_confirm": js.n_confirm, "n_heldout": js.n_heldout, "baseline": float(b["heldout_baseline"].iloc[0]),
           "chosen": None, "confirm_delta": np.nan, "heldout_delta": np.nan, "ci_low": np.nan, "ci_high": np.nan,
           "p_holm": np.nan, "holds": False, "pool_percentile": js.pool_percentile(), "mde": mde,
           "random_pools": len(js.pool_control), "pools_better": np.nan,
           "worst_cost_task": None, "cost_delta": np.nan, "cost_ci_low": np.nan, "cost_ci_high": np.nan}
    if c is None:
        row["verdict"] = ("not detected: no best-by-search set was confirmed; one with a gain >= "
                          f"{mde:.3f} would have been with {power:.0%} power" if np.isfinite(mde) else
                          "not detected: the confirm items could not detect any gain")
        return row
    row.update(chosen=c["heads"], confirm_delta=float(c["confirm_delta_accuracy"]),
               heldout_delta=float(c["heldout_delta_accuracy"]), ci_low=float(c["ci_low"]), ci_high=float(c["ci_high"]),
               p_holm=float(c["p_holm"]), holds=bool(c["holds"]))
    row.update(worst_cost(cost, c["heads"], js.task))
    gains = js.pool_control["heldout_delta_accuracy"].to_numpy()
    better = int((gains > c["heldout_delta_accuracy"] + 1e-12).sum())
    row.update(random_pools=len(gains), pools_better=better)
    pools = (f"{better} of {len(gains)} random pools put through the same pipeline chose a set with a larger "
             f"held-out gain (theirs: {', '.join(f'{g:+.3f}' for g in sorted(gains, reverse=True))}; a pool that "
             "confirms nothing counts as 0)" if len(gains) else "no random pool was run")
    row["verdict"] = (f"localized: removing {c['heads']} changes held-out accuracy by {c['heldout_delta_accuracy']:+.3f} "
                      f"[{c['ci_low']:+.3f}, {c['ci_high']:+.3f}], Holm p = {c['p_holm']:.2g}; {pools}" if c["holds"]
                      else f"chosen ({c['heads']}) but not replicated on held-out items "
                      f"({c['heldout_delta_accuracy']:+.3f}, Holm p = {c['p_holm']:.2g}); {pools}")
    return row


def design_table(v: Verdict, n_draws=(16, 32, 64, 128), top_ks=(5, 10), n_sim: int = 1000) -> pd.DataFrame:
    """The power of the whole pipeline at ``POWER_GAIN`` (breaking as much as the worst re-tested head) for other
    search designs, estimated from this verdict's own screen (:func:`cel_utils.power.pipeline_power` with
    ``n_draw`` search items and ``top_k`` re-tested heads), beside their cost in CPU minutes scaled from this run's
    own timings (the search screen's time per item, the confirmation's time per re-tested head). A design with
    more search items than the screen has is ``extrapolated`` (the draws repeat its items). A ``top_k`` that
    leaves no screened head outside the top ``2 * top_k`` (a screen of a few layers) has no row: there is no head
    to plant the gain into."""
    n_s, k0 = len(v.splits["search"]), len(v.confirm)
    top_ks = [k for k in top_ks if 2 * k < len(v.screen.results.margin)]
    n_c, n_h = len(v.splits["confirm"]), len(v.splits["heldout"])
    b_max = v.power["break_rate_worst"]
    conf_secs = v.confirm_comparison.results.seconds or 0.0
    rows = []
    for k in top_ks:
        for m in n_draws:
            t = pipeline_power(v.screen.baseline.margin[0], v.screen.results.margin,
                               v.confirm_comparison.baseline.margin[0], n_confirm=n_c, n_heldout=n_h, top_k=k,
                               fdr=v.fdr, alpha=ALPHA, gains=[POWER_GAIN], break_rates=[b_max],
                               confirm_others=list(zip(v.confirm["fixes"].astype(int), v.confirm["breaks"].astype(int))),
                               heldout_others=v.heldout["p_value"].tolist() if len(v.heldout) else None,
                               match_spread=True, n_sim=n_sim, seed=0, n_draw=m).iloc[0]
            rows.append({"model": v.model, "task": v.task, "n_search": m, "top_k": k, "power": t["power"],
                         "p_rank": t["p_rank"], "cpu_minutes": (v.screen.seconds * m / n_s + conf_secs * k / k0) / 60,
                         "extrapolated": m > n_s, "this_run": m == n_s and k == k0})
    return pd.DataFrame(rows)
