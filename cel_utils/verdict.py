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

from .ablation import Head, format_set, parse_heads, parse_set
from .compare import Comparison
from .defaults import POWER, POWER_GAIN, POWER_SIMS
from .design import Design
from .io import json_safe
from .models import cast
from .pipeline import Run, encoded, resolved, run
from .power import PowerInputs, pipeline_power, power_sentence
from .records import Pair
from .screening import Screen, confirmation_power, screen
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

    def equals(self) -> pd.DataFrame:
        """The confirmed heads beside the chosen one (:func:`equals_of`): each one's confirm gain and the exact paired
        test of its confirm answers against the chosen head's, Holm over the comparisons; ``equal``: not shown to
        differ. The chosen head is "first of k" where k counts itself and these."""
        return equals_of(self.run, self.confirmed, self.run.design.alpha)

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
            "equals": self.equals().to_dict("records") if self.confirmed else [],
            "min_detectable_gain": self.power["min_detectable_gain"], "selection": self.selection(),
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
                "chosen": self.chosen, "equals": "", "n_equals": 0, "heldout_baseline": np.nan, "heldout_delta": np.nan,
                "heldout_ci_low": np.nan, "heldout_ci_high": np.nan, "heldout_p_holm": np.nan, "holds": False,
                "together_delta": np.nan, "together_ci_low": np.nan, "together_ci_high": np.nan,
                "together_holds": False, "selection_offered": np.nan, "selection_first": np.nan, **pw}
        if not self.confirmed:
            base["verdict"] = "not detected: " + pw["power_sentence"]
            return base
        tab = self.heldout.set_index("heads")
        r = tab.loc[self.chosen]
        base.update(heldout_baseline=float(r["heldout_baseline"]), heldout_delta=float(r["heldout_delta_accuracy"]),
                    heldout_ci_low=float(r["heldout_ci_low"]), heldout_ci_high=float(r["heldout_ci_high"]),
                    heldout_p_holm=float(r["heldout_p_holm"]), holds=bool(r["holds"]))
        base["verdict"] = self.run.sentence(verb="confirmed") + self.by_clause()
        st = self.selection()   # in the row (the verdict's own words stay what `cel stats` can say from outcomes)
        base.update(selection_offered=st["offered"], selection_first=st["first"])
        eq = self.equals()
        same = [self.chosen] + eq[eq["equal"].astype(bool)]["heads"].tolist()
        base.update(equals=", ".join(same), n_equals=len(same))
        if len(same) > 1:
            base["verdict"] += (f"; it is the first of {len(same)} confirmed heads whose confirm gains do not differ "
                                f"(exact paired test against it, Holm): {', '.join(same)}")
        if len(self.confirmed) > 1:
            t = tab.loc[format_set(parse_heads(self.confirmed))]
            n_hold = int(tab.loc[self.confirmed, "holds"].sum())
            base.update(together_delta=float(t["heldout_delta_accuracy"]), together_ci_low=float(t["heldout_ci_low"]),
                        together_ci_high=float(t["heldout_ci_high"]), together_holds=bool(t["holds"]))
            base["verdict"] += (f"; {n_hold} of the {len(self.confirmed)} confirmed heads hold alone, and all "
                                f"{len(self.confirmed)} removed together change it by {t['heldout_delta_accuracy']:+.3f} "
                                f"[{t['heldout_ci_low']:+.3f}, {t['heldout_ci_high']:+.3f}]")
        return base

    def selection(self) -> dict:
        """The chosen head's selection stability on the search split (:meth:`cel_utils.screening.Screen.
        selection_stability`, as many resamples as the design's bootstrap); NaN shares when nothing is chosen."""
        if self.chosen is None:
            return {"offered": np.nan, "first": np.nan, "n_boot": 0}
        d = self.run.design
        return self.screen.selection_stability(self.chosen, len(self.confirm), d.n_boot, d.seed)

    def by_clause(self) -> str:
        """Benjamini-Yekutieli beside Benjamini-Hochberg (the confirm tests share their items): how many of the
        heads BH confirmed BY also confirms, in words ("" when they agree on every head)."""
        offered = self.run.offered()
        bh = set(offered[offered.confirmed.astype(bool)]["heads"])
        by = set(offered[offered.confirmed_by.astype(bool)]["heads"]) if "confirmed_by" in offered else bh
        if by == bh:
            return ""
        return (f"; under Benjamini-Yekutieli (valid whatever the dependence between tests on shared items) "
                f"{len(by & bh)} of the {len(bh)} confirmed heads stay confirmed"
                + (f" ({', '.join(sorted(bh - by))} would not)" if bh - by else ""))

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


def equals_of(r: Run, confirmed: Sequence[str], alpha: float) -> pd.DataFrame:
    """Each confirmed head other than the chosen one against the chosen head, on the confirm items: the exact
    McNemar test of their ablated answers (items one gets right and the other wrong), Holm over the heads compared;
    ``equal`` when not shown to differ. Columns ``heads``, ``confirm_delta_accuracy``, ``p_vs_chosen``,
    ``p_holm``, ``equal``.

    Example:
        >>> equals_of(None, [], 0.05).empty
        True
    """
    from .stats import holm, mcnemar_exact

    cols = ["heads", "confirm_delta_accuracy", "p_vs_chosen", "p_holm", "equal"]
    c = r.chosen() if r is not None else None
    others = [h for h in confirmed if c is not None and h != c["heads"]]
    if not others:
        return pd.DataFrame(columns=cols)
    cmp, conf = r.confirm_comparison, r.offered().set_index("heads")
    first = cmp.results.correct[cmp.names.index(c["heads"])]
    rows = [cmp.results.correct[cmp.names.index(h)] for h in others]
    p = mcnemar_exact([int((first & ~x).sum()) for x in rows], [int((~first & x).sum()) for x in rows])
    adj = holm(p)
    return pd.DataFrame({"heads": others, "confirm_delta_accuracy": [float(conf.loc[h, "confirm_delta_accuracy"])
                                                                      for h in others],
                         "p_vs_chosen": p, "p_holm": adj, "equal": adj >= alpha}, columns=cols)


def heads_to_explain(pairs: Sequence[Pair], k: int = 2) -> list[dict]:
    """Which heads of one model chapter 2a explains, from chapter 1a's verdicts of its tasks
    (:class:`cel_utils.records.Pair`): among the single heads that held on held-out items, first each task's one
    with the largest confirm-split gain (the head chapter 1a chose), then the others by confirm gain (held-out
    results only filter, they never rank); when none held anywhere, each task's head with the largest search-split
    margin gain, marked ``exploratory``. Each pick carries a same-layer ``control`` head whose removal changed the
    search margin least, not confirmed (:meth:`cel_utils.records.Pair.null_control`, chapter 1c's null too).

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
        out.append({"task": task, "head": head, "status": status, "control": p.null_control(head)})
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
