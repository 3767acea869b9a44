"""Chapter 1a's tables over many verdicts: the verdict table and its sentences, what each chosen set costs on the
model's other tasks, the power of other search designs, each chosen head's equals, the stability of the search's
ranking over fresh windows (and the power model checked against it), chapter 2's verdict row, and the trade-off
bridge to chapter 3.

Example:
    >>> worst_cost(None, None, "addition")
    {}
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import pandas as pd

from .ablation import Ablation, Head, format_heads, parse_heads
from .defaults import FDR, N_BOOT, POWER, POWER_GAIN
from .joint import cross_task
from .power import pipeline_power
from .stats import head_to_head, min_detectable_gain
from .tasks import Task
from .verdict import Verdict, power_inputs


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
    tests = pd.DataFrame(rows, columns=["model", "task_a", "task_b", "heads", "help_a", "confirmed", "confirmed_hurt_b",
                                        "others_help_a", "others_hurt_b", "share_confirmed", "share_others",
                                        "p_value"])   # no model with two tasks: no row, the same columns
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
        offered, first = getattr(r, "selection_offered", np.nan), getattr(r, "selection_first", np.nan)
        lines.append(f"- **{r.model} / {r.task}** (accuracy {r.baseline:.3f} on {r.n_confirm} confirm items; "
                     f"{r.n_search} search, {r.n_heldout} held-out): {r.verdict}"
                     + (f"; on bootstrap resamples of the search items the screen offers {r.chosen} to the confirm "
                        f"split in {offered:.0%} and ranks it first in {first:.0%} (how stable the choice is)"
                        if isinstance(r.chosen, str) and np.isfinite(offered) else "")
                     + (f"; on {r.worst_cost_task} it changes accuracy by {r.cost_delta:+.3f} "
                        f"[{r.cost_ci_low:+.3f}, {r.cost_ci_high:+.3f}]." if isinstance(r.worst_cost_task, str)
                        else "."))
    return "\n".join(lines)


def joint_row(js, cost: pd.DataFrame | None = None, fdr: float = FDR, power: float = POWER,
              single: tuple[str, np.ndarray] | None = None) -> dict:
    """One verdict row for a joint search (:class:`cel_utils.joint.JointSearch`): the chosen set (chosen on
    the search and confirm splits), its held-out gain with CI and Holm-adjusted p, the selection-aware control's
    percentile, the worst change on another task (from :func:`cost_on_other_tasks`-shaped ``cost``), and the
    minimum detectable gain of the confirmation (BH over the sizes confirmed); a chosen set of several heads is
    compared with ``single`` (:func:`several_vs_one`)."""
    b = js.best
    mde = min_detectable_gain(js.n_confirm, fdr / max(len(b), 1), float(np.median(b["confirm_breaks"])) / js.n_confirm,
                              power)
    r = js.run.row()
    row = {"model": js.model, "task": js.task, "pool": format_heads(js.pool), "n_search": js.n_search,
           "n_confirm": js.n_confirm, "n_heldout": js.n_heldout, "baseline": float(b["heldout_baseline"].iloc[0]),
           "chosen": r["chosen"], "confirm_delta": r["confirm_delta"], "heldout_delta": r["heldout_delta"],
           "heldout_ci_low": r["ci_low"], "heldout_ci_high": r["ci_high"], "heldout_p_holm": r["p_holm"],
           "holds": r["holds"], "pool_percentile": js.pool_percentile(), "mde": mde,
           "random_pools": len(js.pool_control), "pools_at_least": r["control_at_least"],
           "worst_cost_task": None, "cost_delta": np.nan, "cost_ci_low": np.nan, "cost_ci_high": np.nan}
    if r["chosen"] is None:
        row["verdict"] = ("not detected: no best-by-search set was confirmed; one with a gain >= "
                          f"{mde:.3f} would have been with {power:.0%} power" if np.isfinite(mde) else
                          "not detected: the confirm items could not detect any gain")
        return row
    row.update(worst_cost(cost, r["chosen"], js.task))
    gains = js.pool_control["heldout_delta_accuracy"].to_numpy()
    pools = (f"{r['control_at_least']} of {len(gains)} random pools put through the same pipeline chose a set with "
             f"a held-out gain at least as large (theirs: {', '.join(f'{g:+.3f}' for g in sorted(gains, reverse=True))}; a pool "
             f"that confirms nothing counts as 0; with {len(gains)} pools the smallest p-value this control could "
             f"give is {1 / (len(gains) + 1):.2f})" if len(gains) else "no random pool was run")
    row.update(several_vs_one(js, r["chosen"], single))
    row["verdict"] = f"{js.run.sentence()}; {pools}" + row.pop("vs_sentence")
    return row


def several_vs_one(js, chosen: str, single: tuple[str, np.ndarray] | None = None) -> dict:
    """Does removing several help more than one? The chosen set against a single head on the same held-out items:
    ``single`` (a name and its held-out correctness, e.g. chapter 1a's chosen head: :func:`single_outcomes`),
    else the pool's best single head by search. The paired difference in accuracy with its bootstrap 95% CI, the
    exact McNemar test on the items where the two differ (``vs_single_p``), and a clause worded from that test:
    more, less, or not shown to differ (a tie is a tie). NaN and "" for a single head.

        >>> from types import SimpleNamespace
        >>> from cel_utils.design import Design
        >>> cmp = SimpleNamespace(names=["A+B"], results=SimpleNamespace(correct=np.array([[1, 1, 0, 1] * 10], bool)))
        >>> js = SimpleNamespace(best=pd.DataFrame({"size": [2], "heads": ["A+B"]}),
        ...                      run=SimpleNamespace(heldout_comparison=cmp, design=Design(n_boot=100)))
        >>> several_vs_one(js, "A+B", ("C", np.array([1, 1, 1, 0] * 10, bool)))["vs_sentence"][-60:]
        'shown to differ from removing C alone (a tie on these items)'
    """
    out = {"vs_single": None, "vs_single_delta": np.nan, "vs_single_ci_low": np.nan, "vs_single_ci_high": np.nan,
           "vs_single_p": np.nan, "vs_sentence": ""}
    b, cmp = js.best, js.run.heldout_comparison
    if "+" not in chosen or cmp is None or chosen not in cmp.names:
        return out
    if single is None:
        ones = [h for h in b[b["size"] == 1]["heads"].tolist() if h in cmp.names]
        if not ones:
            return out
        single = (ones[0], cmp.results.correct[cmp.names.index(ones[0])])
    name, o = single[0], np.asarray(single[1], bool)
    a = np.asarray(cmp.results.correct[cmp.names.index(chosen)], bool)
    hh = head_to_head(a, o, js.run.design.n_boot, js.run.design.seed, js.run.design.alpha)
    d, lo, hi, p = hh["delta"], hh["ci_low"], hh["ci_high"], hh["p_value"]
    word = {"more": "helps more than removing {} alone", "less": "helps less than removing {} alone",
            "tie": "is not shown to differ from removing {} alone (a tie on these items)"}[hh["word"]].format(name)
    out.update(vs_single=name, vs_single_delta=d, vs_single_ci_low=lo, vs_single_ci_high=hi, vs_single_p=p,
               vs_sentence=f"; against {name} alone on the same held-out items the set changes accuracy by "
                           f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}] (paired; exact McNemar p = {p:.2g}), so removing "
                           f"several {word}")
    return out


def single_outcomes(rec, lm, js, heldout: Task, mode="zero") -> tuple[str, np.ndarray] | None:
    """Chapter 1a's chosen head for the joint search's pair (its single-head verdict, chosen before any held-out
    test) with its correctness on ``heldout`` (the joint search's own held-out items); None when 1a chose none."""
    from .engine import evaluate
    from .scoring import encode_task

    v = rec.verdicts()
    row = v[(v.model == js.model) & (v.task == js.task)] if len(v) else v
    head = row["chosen"].iloc[0] if len(row) else None
    if not isinstance(head, str) or not head:
        return None
    r = evaluate(lm, encode_task(lm, heldout), parse_heads(head), mode=mode)
    return head, r.correct[0].astype(bool)


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


def rank_stability(lm, task_name: str, heads: Sequence[Head], n_search: int, windows: int, top_k: int,
                   rank_dtype: str = "float32", seed: int = 0) -> pd.DataFrame:
    """How stable the search's ranking is: the single-head screen (in ``rank_dtype``) on ``windows`` fresh windows of
    the search split, each ``n_search`` items after the verdict's own first ``n_search`` (items ``n_search * w`` to
    ``n_search * (w + 1) - 1`` for ``w = 1..windows``), and for every head how often it ranks in the top ``top_k``
    by the change in mean margin. Columns ``head``, ``top_k_share`` (of the windows), ``windows``, and per window
    ``rank_<w>`` (1 = best).

    Example:
        >>> from cel_utils.tiny import tiny_model
        >>> t = rank_stability(tiny_model("llama"), "ioi", [(0, 0), (0, 1), (1, 2)], 4, 2, 1)
        >>> float(t["top_k_share"].sum())   # one head per window in the top 1, two windows
        1.0
    """
    from .models import cast
    from .screening import screen
    from .tasks import load_task

    full = load_task(task_name, "search", seed=seed)
    ranker = cast(lm, rank_dtype)
    ranks = {}
    for w in range(1, windows + 1):
        items = full.items[n_search * w:n_search * (w + 1)]
        if len(items) < n_search:
            break
        sc = screen(ranker, replace(full, items=items), heads=list(heads), progress=False)
        order = sc.top(len(sc.heads))["head"].tolist()
        ranks[w] = {h: i + 1 for i, h in enumerate(order)}
    names = [f"L{l}H{h}" for l, h in heads]
    out = pd.DataFrame({"head": names})
    for w, r in ranks.items():
        out[f"rank_{w}"] = [r[n] for n in names]
    cols = [f"rank_{w}" for w in ranks]
    out["top_k_share"] = (out[cols] <= top_k).mean(axis=1) if cols else np.nan
    out["windows"] = len(cols)
    return out


def power_check(v: Verdict, stability: pd.DataFrame, n_sim: int = 1000) -> pd.DataFrame:
    """The power model's search stage against real heads: for each confirmed head, the probability the model gives
    it of ranking in the top ``top_k`` (``p_rank`` of :func:`cel_utils.power.pipeline_power` planted at the head's
    own confirm gain and break rate) beside the share of fresh search windows in which it did
    (:func:`rank_stability`). Columns ``head``, ``confirm_gain``, ``break_rate``, ``modelled_p_rank``,
    ``observed_top_k_share``, ``windows``."""
    rows = []
    conf = v.confirm.set_index("heads")
    share = stability.set_index("head")
    d = v.run.design.with_(n_confirm=v.run.n_confirm, n_heldout=max(v.run.n_heldout, 1), top_k=len(conf), seed=0)
    for h in v.confirmed:
        g, b = float(conf.loc[h, "confirm_delta_accuracy"]), float(conf.loc[h, "confirm_breaks"]) / v.run.n_confirm
        t = pipeline_power(power_inputs(v.screen, v.run), d, [max(g, 0.0)], [b], match_spread=True, n_sim=n_sim).iloc[0]
        rows.append({"model": v.model, "task": v.task, "head": h, "confirm_gain": g, "break_rate": b,
                     "modelled_p_rank": t["p_rank"], "observed_top_k_share": float(share.loc[h, "top_k_share"]),
                     "windows": int(share.loc[h, "windows"])})
    return pd.DataFrame(rows, columns=["model", "task", "head", "confirm_gain", "break_rate", "modelled_p_rank",
                                       "observed_top_k_share", "windows"])


def design_reach(table: pd.DataFrame, designs: pd.DataFrame, power: float = POWER, gain: float = POWER_GAIN) -> str:
    """Markdown: for each pair of the verdict ``table`` below ``power`` pipeline power, the cheapest design of
    :func:`design_table` (``designs``) that reaches it, or why none does.

        >>> t = pd.DataFrame({"model": ["m"], "task": ["t"], "pipeline_power": [0.5]})
        >>> d = pd.DataFrame({"model": ["m", "m"], "task": ["t", "t"], "n_search": [16, 32], "top_k": [5, 5],
        ...                   "power": [0.5, 0.9], "cpu_minutes": [1.0, 2.0], "extrapolated": [False, True]})
        >>> print(design_reach(t, d, power=0.8))
        Pairs below 0.80 pipeline power and what would reach it:
        - **m / t** (power 0.50): 32 search items and 5 heads re-tested reach 0.90 for 2.0 CPU minutes (extrapolated).
    """
    reach = []
    for r in table[table.pipeline_power.fillna(0) < power].itertuples():
        d = designs[(designs.model == r.model) & (designs.task == r.task)]
        ok = d[d.power >= power].sort_values("cpu_minutes")
        if len(ok):
            b = ok.iloc[0]
            reach.append(f"- **{r.model} / {r.task}** (power {r.pipeline_power:.2f}): {int(b.n_search)} search items "
                         f"and {int(b.top_k)} heads re-tested reach {b.power:.2f} for {b.cpu_minutes:.1f} CPU minutes"
                         + (" (extrapolated)" if b.extrapolated else "") + ".")
        elif len(d) and d.power.isna().all():   # no room for a gain: no design has a power
            reach.append(f"- **{r.model} / {r.task}**: no design has a power; its baseline leaves no room for a gain "
                         f"of {gain:.2f}.")
        elif len(d):
            b = d.loc[d.power.idxmax()]
            reach.append(f"- **{r.model} / {r.task}** (power {r.pipeline_power:.2f}): no design tried reaches "
                         f"{power:.2f}; the best, {int(b.n_search)} search items and {int(b.top_k)} re-tested, gives "
                         f"{b.power:.2f}.")
    return (f"Pairs below {power:.2f} pipeline power and what would reach it:\n" + "\n".join(reach) if reach
            else f"Every pair reaches {power:.2f} pipeline power at this design.")


def winners_curse(checks: pd.DataFrame, n_search: int) -> str:
    """Markdown: how many re-tested heads' changes shrink or grow from the search items that ranked them to the
    confirm items, on margin and on accuracy, and how many gain on the confirm items with a 95% CI above 0.

        >>> c = pd.DataFrame({"search_delta_margin": [0.5, 0.4], "confirm_delta_margin": [0.1, 0.6],
        ...                   "search_delta_accuracy": [0.1, 0.1], "confirm_delta_accuracy": [0.0, 0.0],
        ...                   "confirm_ci_low": [-0.1, 0.01]})
        >>> winners_curse(c, 16).split(" (")[0]
        'Of the 2 re-tested heads, 1 have a smaller change in mean margin on the confirm items than on the search items that ranked them and 1 a larger one; on accuracy 2 shrink and 0 grow'
    """
    shrink = {k: int((checks[f"confirm_delta_{k}"] < checks[f"search_delta_{k}"]).sum()) for k in ("margin", "accuracy")}
    grow = {k: int((checks[f"confirm_delta_{k}"] > checks[f"search_delta_{k}"]).sum()) for k in ("margin", "accuracy")}
    gain = int((checks["confirm_ci_low"] > 0).sum())
    return (f"Of the {len(checks)} re-tested heads, {shrink['margin']} have a smaller change in mean margin on the "
            f"confirm items than on the search items that ranked them and {grow['margin']} a larger one; on accuracy "
            f"{shrink['accuracy']} shrink and {grow['accuracy']} grow (search accuracy moves in steps of one item in "
            f"{n_search}). " + ("The winner's curse shows on the ranking metric: most search margins overstate the "
                                "confirm ones. " if shrink["margin"] > grow["margin"] else
                                "The winner's curse does not dominate here: most search margins do not overstate the "
                                "confirm ones (a ranking by margin over many items is less noisy than one by "
                                "accuracy). ")
            + f"{gain} of the {len(checks)} gain on the confirm items with a 95% CI above 0.")


def power_check_sentence(checks_power: pd.DataFrame, top_k: int) -> str:
    """Markdown: how far the modelled chance of ranking in the top ``top_k`` is from the observed share of fresh
    windows (:func:`power_check`), and the observed share's resolution."""
    gap = (checks_power.modelled_p_rank - checks_power.observed_top_k_share).abs()
    windows = max(int(checks_power.windows.max()), 1)
    return (f"Over {len(checks_power)} confirmed heads the modelled chance of ranking in the top {top_k} and the "
            f"observed share of fresh windows differ by {gap.mean():.2f} on average (at most {gap.max():.2f}); with "
            f"{windows} windows per head each observed share moves in steps of {1 / windows:.2f}. The pipeline "
            "powers of this chapter are the model's figures, checked here against real heads, not measured rates.")
