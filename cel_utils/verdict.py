"""The book's verdict for one (model, task): choose on one split, confirm on another, report on a third.

:func:`single_head_verdict` runs the three stages of chapter 1 on a task's disjoint splits:

1. **search**: every head ablated alone on a few items, ranked by the change in mean margin;
2. **confirm**: the top ``top_k`` heads re-tested on fresh items, exact McNemar p-values, Benjamini-Hochberg
   over the ``top_k``; a head is confirmed when ``q < fdr`` and it fixes more items than it breaks;
3. **heldout**: the confirmed heads, alone and all together, tested once more on items that took no part in
   any choice (:func:`cel_utils.pipeline.heldout`: exact McNemar, Holm over the sets tested).

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
from .compare import Comparison
from .defaults import FDR, N_BOOT, POWER, POWER_GAIN, POWER_SIMS
from .design import Design
from .io import json_safe
from .joint import cross_task
from .models import cast
from .pipeline import Run, encoded, resolved, run
from .power import PowerInputs, pipeline_power, power_sentence
from .records import Pair
from .screening import Screen, confirmation_power, screen
from .stats import min_detectable_gain
from .tasks import Task, load_task


@dataclass
class Verdict:
    """Everything the three stages computed for one model and task (see the module docstring).

    ``run``: the top ``top_k`` heads of the search screen through :func:`cel_utils.pipeline.run` (``run.sets``: one
    row per re-tested head with its search, confirm and held-out figures, and a row for all confirmed heads
    together); :attr:`confirm` and :attr:`heldout` are its offered rows and its rows tested on held-out items."""

    model: str
    task: str
    splits: dict[str, Task]            # "search", "confirm", "heldout"
    screen: Screen
    stats: pd.DataFrame                # the screen's per-head statistics and candidate rule
    run: Run
    power: dict                        # confirmation_power(): min_detectable_gain, alpha, break_rate
    pipeline: pd.DataFrame | None = None  # power of the whole pipeline (:func:`pipeline_power_table`)

    @property
    def confirm(self) -> pd.DataFrame:
        """The re-tested heads (``heads``, ``search_*`` and ``confirm_*`` columns, ``confirmed``), best-ranked first."""
        return self.run.offered().reset_index(drop=True)

    @property
    def heldout(self) -> pd.DataFrame:
        """The sets tested on held-out items (the confirmed heads, and all of them together): ``heldout_*``."""
        return self.run.sets[self.run.sets["heldout_p_holm"].notna()].reset_index(drop=True)

    @property
    def confirmed(self) -> list[str]:
        return self.confirm[self.confirm.confirmed.astype(bool)]["heads"].tolist()

    @property
    def confirm_comparison(self) -> Comparison:
        return self.run.confirm_comparison

    @property
    def heldout_comparison(self) -> Comparison | None:
        return self.run.heldout_comparison

    @property
    def fdr(self) -> float:
        return self.run.design.fdr

    @property
    def chosen(self) -> str | None:
        """The head the pipeline reports, chosen before the held-out test: of the confirmed heads, the one with
        the largest gain on the confirm split (ties: the better-ranked on the search split). None if none."""
        c = self.run.chosen()
        return None if c is None else str(c["heads"])

    def record(self) -> dict:
        """The JSON-ready record of this verdict: what chapter 1a writes per (model, task) and what
        :mod:`cel_utils.records` reads back (chapters 1c, 2a, 3, 4 and 5). The schema:

        ``model``, ``task``, ``n_search``, ``n_confirm``, ``n_heldout``, ``n_heads_screened``;
        ``screened_heads`` (names) with their search-split ``delta_margin`` and ``delta_accuracy`` (same order);
        ``candidates`` (heads passing the candidate rule on the search items);
        ``sets``: :meth:`cel_utils.pipeline.Run.record`'s rows: each re-tested head (``offered``: ``heads``,
        ``search_delta_margin``, ``search_delta_accuracy``, ``confirm_*``, ``confirmed``; ``heldout_*`` and
        ``holds`` for the confirmed ones) and all confirmed heads together (``offered`` false);
        ``chosen``, ``confirmed`` (names), ``design``, ``min_detectable_gain``, the power fields of :meth:`row`
        and ``pipeline`` (the power table).
        """
        st = self.stats
        rec = self.run.record()
        return json_safe({
            "model": self.model, "task": self.task, "n_search": len(self.splits["search"]),
            "n_confirm": len(self.splits["confirm"]), "n_heldout": len(self.splits["heldout"]),
            "n_heads_screened": int(len(st)), "screened_heads": st["head"].tolist(),
            "candidates": st[st.candidate]["head"].tolist(), "delta_margin": st["delta_margin"].tolist(),
            "delta_accuracy": st["delta_accuracy"].tolist(), "sets": rec["sets"], "chosen": rec["chosen"],
            "design": rec["design"], "confirmed": list(self.confirmed),
            "min_detectable_gain": self.power["min_detectable_gain"],
            **{k: v for k, v in self.power_summary().items() if k != "power_sentence"},
            "pipeline": self.pipeline.to_dict("records") if self.pipeline is not None else []})

    def row(self) -> dict:
        """One row of the verdict table."""
        pw = self.power_summary()
        base = {"model": self.model, "task": self.task, "n_search": len(self.splits["search"]),
                "n_confirm": len(self.splits["confirm"]), "n_heldout": len(self.splits["heldout"]),
                "baseline": float(self.confirm_comparison.baseline.accuracy[0]),
                "search_baseline": float(self.screen.baseline.accuracy[0]), "n_heads": len(self.stats),
                "n_candidates": int(self.stats["candidate"].sum()), "confirmed": ", ".join(self.confirmed),
                "chosen": self.chosen, "heldout_baseline": np.nan, "heldout_delta": np.nan,
                "heldout_ci_low": np.nan, "heldout_ci_high": np.nan, "heldout_p_holm": np.nan, "holds": False,
                "together_delta": np.nan, "together_ci_low": np.nan, "together_ci_high": np.nan,
                "together_holds": False, **pw}
        if not self.confirmed:
            base["verdict"] = "not detected: " + pw["power_sentence"]
            return base
        tab = self.heldout.set_index("heads")
        r = tab.loc[self.chosen]
        base.update(heldout_baseline=float(r["heldout_baseline"]), heldout_delta=float(r["heldout_delta_accuracy"]),
                    heldout_ci_low=float(r["heldout_ci_low"]), heldout_ci_high=float(r["heldout_ci_high"]),
                    heldout_p_holm=float(r["heldout_p_holm"]), holds=bool(r["holds"]))
        base["verdict"] = self.run.sentence(verb="confirmed")
        if len(self.confirmed) > 1:
            t = tab.loc[format_set(parse_heads(self.confirmed))]
            n_hold = int(tab.loc[self.confirmed, "holds"].sum())
            base.update(together_delta=float(t["heldout_delta_accuracy"]), together_ci_low=float(t["heldout_ci_low"]),
                        together_ci_high=float(t["heldout_ci_high"]), together_holds=bool(t["holds"]))
            base["verdict"] += (f"; {n_hold} of the {len(self.confirmed)} confirmed heads hold alone, and all "
                                f"{len(self.confirmed)} removed together change it by {t['heldout_delta_accuracy']:+.3f} "
                                f"[{t['heldout_ci_low']:+.3f}, {t['heldout_ci_high']:+.3f}]")
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


def heads_to_explain(pairs: Sequence[Pair], k: int = 2) -> list[dict]:
    """Which heads of one model chapter 2a explains, from chapter 1a's verdicts of its tasks
    (:class:`cel_utils.records.Pair`): among the single heads that held on held-out items, first each task's one
    with the largest confirm-split gain (the head chapter 1a chose), then the others by confirm gain (held-out
    results only filter, they never rank); when none held anywhere, each task's head with the largest search-split
    margin gain, marked ``exploratory``. Each pick carries a same-layer ``control`` head whose removal changed the
    search margin least.

    Example:
        >>> p = Pair({"task": "t", "screened_heads": ["L0H0", "L0H1"], "delta_margin": [0.5, 0.01],
        ...           "sets": [{"heads": "L0H0", "offered": True, "holds": True, "confirm_delta_accuracy": 0.1,
        ...                     "heldout_p_holm": 0.01}]})
        >>> heads_to_explain([p])
        [{'task': 't', 'head': 'L0H0', 'status': 'confirmed', 'control': 'L0H1'}]
    """
    held = [(p.confirm_gain(r["heads"]), p.task, r["heads"]) for p in pairs for r in p.heldout_rows().to_dict("records")
            if r.get("holds") and len(parse_set(r["heads"])) == 1]
    picks: list[tuple[str, str, str]] = []
    if held:
        best = {}
        for gain, task, head in sorted(held, reverse=True):
            best.setdefault(task, (task, head, "confirmed"))
        picks = list(best.values())
        picks += [(t, h, "confirmed") for _, t, h in sorted(held, reverse=True) if (t, h, "confirmed") not in picks]
    else:
        picks = [(p.task, p.screened_heads[int(np.argmax(p.delta_margin))], "exploratory") for p in pairs]
    out = []
    for task, head, status in picks[:k]:
        p = next(q for q in pairs if q.task == task)
        same = [(abs(v), h) for h, v in zip(p.screened_heads, p.delta_margin) if layer_of(h) == layer_of(head)
                and h != head]
        out.append({"task": task, "head": head, "status": status, "control": min(same)[1] if same else None})
    return out


@dataclass(frozen=True)
class VerdictSettings(Design):
    """The parameters of :func:`single_head_verdict` (the shared ones from :class:`~cel_utils.design.Design`)."""

    power: float = POWER
    power_sims: int = POWER_SIMS  # simulations of the whole pipeline (0: not computed)
    rank_dtype: str = "float32"   # the search screen's dtype (it only ranks: confirm and held-out stay float32)


def power_inputs(sc: Screen, r: Run) -> PowerInputs:
    """What :func:`cel_utils.power.pipeline_power` plants a head into, from a verdict's screen and run: the search
    screen's margins, the confirm split's unablated margins, the re-tested heads' confirm (fixes, breaks) and the
    real held-out p-values."""
    conf = r.offered()
    held = r.sets["heldout_p_value"].dropna()
    return PowerInputs(sc.baseline.margin[0], sc.results.margin, r.confirm_comparison.baseline.margin[0],
                       confirm_others=list(zip(conf["confirm_fixes"].astype(int), conf["confirm_breaks"].astype(int))),
                       heldout_others=held.tolist() if len(held) else None)


def pipeline_power_table(sc: Screen, r: Run, n_heldout: int, mde: float, s: VerdictSettings) -> pd.DataFrame:
    """:func:`cel_utils.power.pipeline_power` around this pair's own screen and run (:func:`power_inputs`), at
    ``POWER_GAIN`` and at the confirm test's best-case MDE, breaking nothing and breaking as much as the worst
    re-tested head; ``match_spread`` (the estimate that tracked a direct simulation, ``tests/test_power.py``)."""
    conf = r.offered()
    n = r.n_confirm
    b_max = float(conf["confirm_breaks"].max()) / n if len(conf) else 0.0
    gains = [POWER_GAIN] + ([round(mde, 4)] if np.isfinite(mde) and not np.isclose(mde, POWER_GAIN) else [])
    d = r.design.with_(n_confirm=n, n_heldout=n_heldout, top_k=len(conf), seed=s.seed)
    return pipeline_power(power_inputs(sc, r), d, gains, sorted({0.0, b_max}), match_spread=True, n_sim=s.power_sims)


def single_head_verdict(lm, task: str | dict[str, Task], heads: str | Sequence[Head] = "all",
                        settings: VerdictSettings | None = None, **overrides) -> Verdict:
    """Run search -> confirm -> held-out for one task (a name or JSONL path, or its three splits as a dict).

    ``settings`` (a :class:`VerdictSettings`) and keyword ``overrides`` of its fields (e.g. ``top_k=10``) set the
    pipeline's parameters. Mean ablation takes its head means from the search split and uses them on every split.
    The search screen ranks every head (in ``rank_dtype``); its top ``top_k`` go through
    :func:`cel_utils.pipeline.run` with the verdict's held-out family (the confirmed heads alone and together).
    """
    s = replace(settings or VerdictSettings(), **overrides)
    if isinstance(task, dict):
        splits = task
    else:
        splits = {"search": load_task(task, "search", n=s.n_search, seed=s.seed, clip=True),
                  "confirm": load_task(task, "confirm", n=s.n_confirm, seed=s.seed, clip=True),
                  "heldout": load_task(task, "heldout", n=s.n_heldout, seed=s.seed, clip=True)}
    head_list = parse_heads(heads, lm.n_layers, lm.n_heads) if isinstance(heads, str) else list(heads)
    encs = encoded(lm, splits)
    d = resolved(s.design(), lm, encs["search"])
    sc = screen(cast(lm, s.rank_dtype), splits["search"], heads=head_list, mode=d.mode)
    st = sc.stats(n_boot=s.n_boot, seed=s.seed, fdr=s.fdr)
    top = sc.top(s.top_k, by="delta_margin")
    offer = {name: [(int(l), int(h))] for name, l, h in zip(top["head"], top["layer"], top["head_index"])}
    search = pd.DataFrame({"heads": top["head"], "search_delta_margin": top["delta_margin"].to_numpy(),
                           "search_delta_accuracy": top["delta_accuracy"].to_numpy()})
    r = run(lm, encs, offer, d, "confirmed", search=search, selector="top-k screen")
    r.task = splits["search"].name
    conf = r.offered()
    pw = confirmation_power(conf["confirm_breaks"].to_numpy(), len(splits["confirm"]), len(conf), s.fdr, s.power)
    pipeline = (pipeline_power_table(sc, r, len(splits["heldout"]), pw["min_detectable_gain"], s)
                if s.power_sims > 0 else None)
    return Verdict(model=lm.name, task=splits["search"].name, splits=splits, screen=sc, stats=st, run=r, power=pw,
                   pipeline=pipeline)


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
    r = js.run.row()
    row = {"model": js.model, "task": js.task, "pool": format_heads(js.pool), "n_search": js.n_search,
           "n_confirm": js.n_confirm, "n_heldout": js.n_heldout, "baseline": float(b["heldout_baseline"].iloc[0]),
           "chosen": r["chosen"], "confirm_delta": r["confirm_delta"], "heldout_delta": r["heldout_delta"],
           "heldout_ci_low": r["ci_low"], "heldout_ci_high": r["ci_high"], "heldout_p_holm": r["p_holm"],
           "holds": r["holds"], "pool_percentile": js.pool_percentile(), "mde": mde,
           "random_pools": len(js.pool_control), "pools_better": r["control_better"],
           "worst_cost_task": None, "cost_delta": np.nan, "cost_ci_low": np.nan, "cost_ci_high": np.nan}
    if r["chosen"] is None:
        row["verdict"] = ("not detected: no best-by-search set was confirmed; one with a gain >= "
                          f"{mde:.3f} would have been with {power:.0%} power" if np.isfinite(mde) else
                          "not detected: the confirm items could not detect any gain")
        return row
    row.update(worst_cost(cost, r["chosen"], js.task))
    gains = js.pool_control["heldout_delta_accuracy"].to_numpy()
    pools = (f"{r['control_better']} of {len(gains)} random pools put through the same pipeline chose a set with a "
             f"larger held-out gain (theirs: {', '.join(f'{g:+.3f}' for g in sorted(gains, reverse=True))}; a pool "
             "that confirms nothing counts as 0)" if len(gains) else "no random pool was run")
    row["verdict"] = f"{js.run.sentence()}; {pools}"
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
            d = v.run.design.with_(n_confirm=n_c, n_heldout=n_h, top_k=k, seed=0)
            t = pipeline_power(power_inputs(v.screen, v.run), d, [POWER_GAIN], [b_max], match_spread=True,
                               n_sim=n_sim, n_draw=m).iloc[0]
            rows.append({"model": v.model, "task": v.task, "n_search": m, "top_k": k, "power": t["power"],
                         "p_rank": t["p_rank"], "cpu_minutes": (v.screen.seconds * m / n_s + conf_secs * k / k0) / 60,
                         "extrapolated": m > n_s, "this_run": m == n_s and k == k0})
    return pd.DataFrame(rows)
