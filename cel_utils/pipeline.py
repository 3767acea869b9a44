"""The book's method, written once: offered sets -> confirm -> choose -> held-out, and the selection-aware control.

Every way of choosing heads (:mod:`cel_utils.selectors`) *offers* head sets chosen on the search split alone;
this module is the only place they are tested:

1. :func:`confirm`: each offered set re-tested on fresh confirm items: exact McNemar on fixes and breaks,
   Benjamini-Hochberg over the sets offered (:func:`cel_utils.stats.confirm_decisions`);
2. :func:`choose`: the confirmed set with the largest confirm gain (ties: the earlier offered), fixed before any
   held-out item is read;
3. :func:`heldout`: the sets of the held-out family on items that took no part in any choice: exact McNemar, Holm
   over the family (:func:`cel_utils.stats.heldout_decisions`). The family is every offered set (``"offered"``:
   the joint search, the gates) or the confirmed sets alone and, when more than one, all of them together
   (``"confirmed"``: the verdict);
4. :func:`control`: the same confirm -> choose on random offers, and the held-out gain of what each would choose.

:func:`run` chains them into one :class:`Run`, the one result type, with its record, a table row and a sentence.
Every column is named by its split: ``search_*``, ``confirm_*``, ``heldout_*``.

Example (a tiny random model, so the numbers mean nothing):
    >>> from cel_utils.tiny import tiny_model
    >>> from cel_utils.tasks import load_task
    >>> lm = tiny_model("llama")
    >>> encs = {s: load_task("ioi", s, n=8) for s in ("search", "confirm", "heldout")}
    >>> r = run(lm, encs, {"L0H1": [(0, 1)], "L0H1+L1H0": [(0, 1), (1, 0)]}, Design(n_boot=100))
    >>> list(r.sets["heads"]), r.record()["chosen"] in (None, "L0H1", "L0H1+L1H0")
    (['L0H1', 'L0H1+L1H0'], True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from .ablation import Ablation, Head, format_set, parse_heads
from .compare import Comparison, compare_sets
from .design import Design
from .io import json_safe
from .scoring import EncodedTask, encode_task
from .search import percentile_among
from .stats import confirm_decisions, heldout_decisions

CONFIRM_COLUMNS = ["confirm_baseline", "confirm_accuracy", "confirm_delta_accuracy", "confirm_ci_low",
                   "confirm_ci_high", "confirm_delta_margin", "confirm_fixes", "confirm_breaks", "confirm_p_value",
                   "confirm_q_value", "confirmed", "confirm_q_value_by", "confirmed_by"]
HELDOUT_COLUMNS = ["heldout_baseline", "heldout_accuracy", "heldout_delta_accuracy", "heldout_ci_low",
                   "heldout_ci_high", "heldout_delta_margin", "heldout_fixes", "heldout_breaks", "heldout_p_value",
                   "heldout_p_holm", "holds"]
POLICIES = ("offered", "confirmed")


def encoded(lm, splits: dict) -> dict[str, EncodedTask]:
    """Each split encoded once (a split already encoded is kept)."""
    return {k: v if isinstance(v, EncodedTask) else encode_task(lm, v) for k, v in splits.items()}


def resolved(design: Design, lm, search: EncodedTask) -> Design:
    """The design with its ablation resolved on the search split (mean ablation's head means come from there)."""
    return design.with_(mode=Ablation.of(design.mode).resolved(lm, search.inputs))


def _compare(lm, enc, sets, d: Design) -> Comparison:
    return compare_sets(lm, enc, sets, mode=d.mode, n_boot=d.n_boot, seed=d.seed, alpha=d.alpha)


def confirm(lm, enc, sets: dict[str, Sequence[Head]], d: Design) -> tuple[pd.DataFrame, Comparison]:
    """The confirm stage: one row per offered set (``heads``, ``size`` and :data:`CONFIRM_COLUMNS`), and the
    per-item comparison behind it."""
    cmp = _compare(lm, enc, sets, d)
    return confirm_table(cmp, {n: len(h) for n, h in sets.items()}, d), cmp


def confirm_table(cmp: Comparison, sizes: dict[str, int], d: Design) -> pd.DataFrame:
    """The confirm stage's table from a comparison on confirm items, however it was computed (the engine, or
    per-item outcomes read from a table: :mod:`cel_utils.outcomes`)."""
    dec = confirm_decisions(cmp.baseline.correct[0], cmp.results.correct, d.fdr)
    t = cmp.table
    tab = pd.DataFrame({"heads": cmp.names, "size": [sizes[n] for n in cmp.names],
                        "confirm_baseline": t["baseline_accuracy"].to_numpy(), "confirm_accuracy": t["accuracy"].to_numpy(),
                        "confirm_delta_accuracy": t["delta_accuracy"].to_numpy(), "confirm_ci_low": t["ci_low"].to_numpy(),
                        "confirm_ci_high": t["ci_high"].to_numpy(), "confirm_delta_margin": t["delta_margin"].to_numpy()})
    for k in ("fixes", "breaks", "p_value", "q_value"):
        tab[f"confirm_{k}"] = dec[k]
    tab["confirmed"] = dec["confirmed"]
    tab["confirm_q_value_by"], tab["confirmed_by"] = dec["q_value_by"], dec["confirmed_by"]   # sensitivity only
    return tab


def choose(table: pd.DataFrame, gain: str = "confirm_delta_accuracy", ok: str = "confirmed") -> pd.Series | None:
    """The one rule for what the pipeline reports, fixed before any held-out test: of the rows confirmed on the
    confirm split (``ok``), the one with the largest confirm gain (``gain``); ties go to the earlier row (the
    better-ranked head on the search split, or the smaller set). None when nothing is confirmed.

    Example:
        >>> t = pd.DataFrame({"heads": ["L1H0", "L2H0", "L3H0"], "confirm_delta_accuracy": [0.1, 0.2, 0.2],
        ...                   "confirmed": [True, True, True]})
        >>> choose(t)["heads"]
        'L2H0'
    """
    c = table[table[ok].astype(bool)]
    return None if c.empty else c.loc[c[gain].idxmax()]


def heldout(lm, enc, sets: dict[str, Sequence[Head]], d: Design) -> tuple[pd.DataFrame, Comparison]:
    """The held-out stage: one row per set tested (``heads`` and :data:`HELDOUT_COLUMNS`: exact McNemar, Holm over
    the sets, ``holds``), and the per-item comparison behind it.

    Example:
        >>> tab, cmp = heldout(lm, heldout_split, {"L13H0": [(13, 0)]}, Design())  # doctest: +SKIP
    """
    cmp = _compare(lm, enc, sets, d)
    return heldout_table(cmp, d), cmp


def heldout_table(cmp: Comparison, d: Design) -> pd.DataFrame:
    """The held-out stage's table from a comparison on held-out items (as :func:`confirm_table`)."""
    dec = heldout_decisions(cmp.baseline.correct[0], cmp.results.correct, d.alpha)
    t = cmp.table
    tab = pd.DataFrame({"heads": cmp.names, "heldout_baseline": t["baseline_accuracy"].to_numpy(),
                        "heldout_accuracy": t["accuracy"].to_numpy(),
                        "heldout_delta_accuracy": t["delta_accuracy"].to_numpy(), "heldout_ci_low": t["ci_low"].to_numpy(),
                        "heldout_ci_high": t["ci_high"].to_numpy(), "heldout_delta_margin": t["delta_margin"].to_numpy()})
    for k in ("fixes", "breaks", "p_value", "p_holm"):
        tab[f"heldout_{k}"] = dec[k]
    tab["holds"] = dec["holds"]
    return tab


def heldout_family(conf: pd.DataFrame, offered: dict[str, Sequence[Head]], policy: str) -> dict[str, list[Head]]:
    """The sets tested on held-out items: every offered set (``"offered"``), or the confirmed ones and, when more
    than one, all of them removed together (``"confirmed"``; none when nothing is confirmed)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown held-out family {policy!r}; use one of {', '.join(POLICIES)}")
    if policy == "offered":
        return {n: list(h) for n, h in offered.items()}
    names = conf[conf.confirmed.astype(bool)]["heads"].tolist()
    fam = {n: list(offered[n]) for n in names}
    if len(names) > 1:
        together = parse_heads([h for n in names for h in offered[n]])
        fam[format_set(together)] = together
    return fam


def control(lm, encs: dict, offers: Sequence[Sequence[Sequence[Head]]], d: Design,
            labels: Sequence[dict] | None = None, heldout_gain: dict[str, float] | None = None) -> pd.DataFrame:
    """The selection-aware control: for each random offer (a list of sets, e.g. a random pool's best sets or a
    random ranking's nested sets), the same :func:`confirm` -> :func:`choose` and the held-out gain of the set it
    would choose (0 when it chooses nothing: the pipeline then removes no head). One confirm evaluation of every
    offered set and one held-out evaluation of the chosen ones (``heldout_gain``: held-out gains by set name
    already computed, e.g. when every offered set was graded anyway). ``labels``: extra columns per replicate.
    Columns ``replicate``, the labels, ``chosen``, ``heldout_delta_accuracy``."""
    cols = ["replicate", *((labels or [{}])[0].keys()), "chosen", "heldout_delta_accuracy"]
    if not offers:
        return pd.DataFrame(columns=cols)
    flat = {format_set(x): list(x) for o in offers for x in o}
    conf = _compare(lm, encs["confirm"], flat, d)
    row_of = {n: j for j, n in enumerate(conf.names)}
    picks = []
    for o in offers:
        idx = [row_of[format_set(x)] for x in o]
        dec = confirm_decisions(conf.baseline.correct[0], conf.results.correct[idx], d.fdr)
        gain = (dec["fixes"] - dec["breaks"]) / conf.results.correct.shape[1]
        c = choose(pd.DataFrame({"confirm_delta_accuracy": gain, "confirmed": dec["confirmed"]}))
        picks.append(None if c is None else format_set(o[int(c.name)]))
    chosen = {n: flat[n] for n in dict.fromkeys(p for p in picks if p is not None)}
    gain_of = dict(heldout_gain or {})
    chosen = {n: h for n, h in chosen.items() if n not in gain_of}
    if chosen:
        t = _compare(lm, encs["heldout"], chosen, d).table
        gain_of.update(zip(t["heads"], t["delta_accuracy"].astype(float)))
    rows = [{"replicate": r, **((labels or [{}] * len(offers))[r]), "chosen": p,
             "heldout_delta_accuracy": gain_of.get(p, 0.0)} for r, p in enumerate(picks)]
    return pd.DataFrame(rows, columns=cols)


@dataclass
class Run:
    """Offered sets through confirm -> choose -> held-out, with the selection-aware control (:func:`run`).

    ``sets``: one row per set: ``heads``, ``size``, ``offered`` (False for a set only the held-out family adds:
    the verdict's confirmed heads together), the selector's ``search_*`` columns, :data:`CONFIRM_COLUMNS` and,
    for the sets tested on held-out items, :data:`HELDOUT_COLUMNS` (NaN, and ``holds`` False, elsewhere).
    ``control``: per random offer, the set the same pipeline would choose and its held-out gain.
    """

    model: str
    task: str
    selector: str
    design: Design
    sets: pd.DataFrame
    confirm_comparison: Comparison
    heldout_comparison: Comparison | None
    control: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=["replicate", "chosen", "heldout_delta_accuracy"]))
    n_search: int = 0
    heldout_items: int = 0   # the held-out split's size (graded or not: nothing confirmed leaves it untouched)

    @property
    def n_confirm(self) -> int:
        return int(self.confirm_comparison.baseline.correct.shape[1])

    @property
    def n_heldout(self) -> int:
        """The held-out split's size, whether or not any set reached it."""
        if self.heldout_comparison is None:
            return self.heldout_items
        return int(self.heldout_comparison.baseline.correct.shape[1])

    def offered(self) -> pd.DataFrame:
        return self.sets[self.sets.offered.astype(bool)]

    def chosen(self) -> pd.Series | None:
        """The reported set (:func:`choose` on the offered rows); its held-out row is the honest figure."""
        return choose(self.offered())

    def chosen_gain(self) -> float:
        """The chosen set's held-out gain (0 when nothing is chosen: the pipeline removes nothing)."""
        c = self.chosen()
        return 0.0 if c is None else float(c["heldout_delta_accuracy"])

    def control_percentile(self) -> float:
        """Where the chosen set's held-out gain falls among the control's (NaN without a control)."""
        return percentile_among(self.control["heldout_delta_accuracy"].to_numpy(), self.chosen_gain())

    def control_at_least(self) -> int:
        """How many control replicates chose a set with a held-out gain at least as large as the chosen set's (a
        tie counts: a random pool that gains as much says the choice added nothing over chance).

            >>> import pandas as pd
            >>> r = Run("m", "t", "s", Design(), pd.DataFrame({"offered": [True], "heads": ["L1H1"],
            ...         "confirmed": [True], "confirm_delta_accuracy": [0.2], "heldout_delta_accuracy": [0.3],
            ...         "search_delta_accuracy": [0.1]}), None, None,
            ...         control=pd.DataFrame({"heldout_delta_accuracy": [0.3, 0.1, 0.31]}))
            >>> r.control_at_least()
            2
        """
        gains = self.control["heldout_delta_accuracy"].to_numpy(dtype=float)
        return int((gains >= self.chosen_gain() - 1e-12).sum())

    def record(self) -> dict:
        """JSON-ready: the design, every set with its three splits' figures, the chosen set, the control."""
        c = self.chosen()
        return json_safe({
            "selector": self.selector, "model": self.model, "task": self.task, "n_search": self.n_search,
            "n_confirm": self.n_confirm, "n_heldout": self.n_heldout, "design": self.design.record(),
            "sets": self.sets.to_dict("records"), "chosen": None if c is None else c["heads"],
            "chosen_gain": self.chosen_gain(), "control": self.control.to_dict("records"),
            "control_percentile": self.control_percentile()})

    def row(self) -> dict:
        """One table row: the chosen set with its confirm and held-out figures and the control's count."""
        c = self.chosen()
        base = self.offered()["confirm_baseline"]
        row = {"model": self.model, "task": self.task, "selector": self.selector,
               "baseline": float(base.iloc[0]) if len(base) else np.nan, "chosen": None,
               "confirm_delta": np.nan, "heldout_delta": np.nan, "ci_low": np.nan, "ci_high": np.nan,
               "p_holm": np.nan, "holds": False, "control_at_least": np.nan, "control_runs": len(self.control)}
        if c is not None:
            row.update(chosen=c["heads"], confirm_delta=float(c["confirm_delta_accuracy"]),
                       heldout_delta=float(c["heldout_delta_accuracy"]), ci_low=float(c["heldout_ci_low"]),
                       ci_high=float(c["heldout_ci_high"]), p_holm=float(c["heldout_p_holm"]), holds=bool(c["holds"]),
                       control_at_least=self.control_at_least())
        row["sentence"] = self.sentence()
        return row

    def sentence(self, verb: str = "chosen") -> str:
        """The chosen set's held-out result in words, with the numbers (or why nothing was chosen); ``verb`` says
        how a set that does not hold was picked ("chosen", or "confirmed" for the verdict's single heads)."""
        c = self.chosen()
        if c is None:
            return f"the {self.selector} pipeline confirmed none of its {len(self.offered())} sets: it removes nothing"
        ab = self.design.mode
        act = (f"applying {ab.describe()} to {c['heads']}" if getattr(ab, "head_alphas", ())
               else f"scaling {c['heads']} by {ab.alpha:g}" if getattr(ab, "mode", ab) == "scale"
               else f"removing {c['heads']}")
        text = (f"localized: {act} changes held-out accuracy by {c['heldout_delta_accuracy']:+.3f} "
                f"[{c['heldout_ci_low']:+.3f}, {c['heldout_ci_high']:+.3f}], Holm p = {c['heldout_p_holm']:.2g}"
                if c["holds"] else f"{verb} ({c['heads']}) but not replicated on held-out items "
                f"({c['heldout_delta_accuracy']:+.3f}, Holm p = {c['heldout_p_holm']:.2g})")
        return text


def staged(compare, offer: dict[str, Sequence[Head]], design: Design, policy: str = "offered",
           search: pd.DataFrame | None = None) -> tuple[pd.DataFrame, Comparison, Comparison | None]:
    """Confirm -> choose -> held-out on comparisons from ``compare(split, {name: heads}) -> Comparison`` (the
    engine in :func:`run`; per-item outcomes from a table in :mod:`cel_utils.outcomes`): :attr:`Run.sets` and the
    two comparisons (the held-out one None when the family is empty)."""
    conf_cmp = compare("confirm", offer)
    conf = confirm_table(conf_cmp, {n: len(h) for n, h in offer.items()}, design)
    conf.insert(2, "offered", True)
    if search is not None:
        conf = conf.merge(search, on="heads", how="left", suffixes=("", "_search"))
    fam = heldout_family(conf, offer, policy)
    held_cmp = compare("heldout", fam) if fam else None
    sets = conf
    if held_cmp is not None:
        extra = [n for n in fam if n not in offer]
        add = pd.DataFrame({"heads": extra, "size": [len(fam[n]) for n in extra], "offered": False,
                            "confirmed": False})
        sets = pd.concat([conf, add], ignore_index=True) if extra else conf
        sets = sets.merge(heldout_table(held_cmp, design), on="heads", how="left")
    for c in HELDOUT_COLUMNS:
        if c not in sets:
            sets[c] = np.nan
    sets["holds"] = sets["holds"].eq(True)   # NaN (never reached the held-out split) is False
    return sets, conf_cmp, held_cmp


def run(lm, encs: dict, offer: dict[str, Sequence[Head]], design: Design, policy: str = "offered",
        search: pd.DataFrame | None = None, selector: str = "", control_offers=None, control_labels=None) -> Run:
    """Offered sets (``{name: heads}``, chosen on the search split) through :func:`confirm`, :func:`choose` and
    :func:`heldout` (the held-out family by ``policy``, :func:`heldout_family`), and the :func:`control` on
    ``control_offers``. ``encs``: the ``confirm`` and ``heldout`` splits (tasks or encoded), and ``search`` for its
    size; ``design.mode`` should be resolved (:func:`resolved`). ``search``: the selector's figures per offered
    set (``heads`` and ``search_*`` columns), joined into :attr:`Run.sets`."""
    encs = encoded(lm, encs)
    sets, conf_cmp, held_cmp = staged(lambda split, named: _compare(lm, encs[split], named, design), offer, design,
                                      policy, search)
    ctrl = control(lm, encs, control_offers, design, control_labels) if control_offers is not None else None
    out = Run(model=lm.name, task=encs["confirm"].name, selector=selector,
              design=design, sets=sets, confirm_comparison=conf_cmp, heldout_comparison=held_cmp,
              n_search=encs["search"].n_items if "search" in encs else 0, heldout_items=encs["heldout"].n_items)
    if ctrl is not None:
        out.control = ctrl
    return out
