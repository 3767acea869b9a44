"""The book's confirm -> held-out verdict for anyone's per-item outcomes (a TransformerLens or nnsight run).

A table with one row per item, split and condition (CSV or JSONL):

- ``item``: the item's id (unique within its split; an id in two splits is refused: it would leak);
- ``split``: ``confirm`` or ``heldout`` (``search`` rows, where the sets were chosen, are ignored);
- ``condition``: ``baseline`` for the unablated model, and a name per head set or intervention (in the order the
  sets were offered: ties in the confirm gain go to the earlier one);
- ``correct`` (0/1, true/false) and/or ``margin`` (a number; without ``correct``, correct means margin > 0).

:func:`outcome_verdict` runs the stages of :mod:`cel_utils.pipeline` on it (exact McNemar with Benjamini-Hochberg
on confirm items, the confirmed set with the largest confirm gain, exact McNemar with Holm on held-out items,
paired-bootstrap CIs) and returns the record ``cel verdict`` writes, without the search screen's fields; ``cel
stats`` is the same from the command line. :func:`from_run` exports a run's outcomes in this shape.

Example:
    >>> rows = [{"item": f"{s}{i}", "split": s, "condition": c, "correct": int(c != "baseline" and i < 30 or i % 2)}
    ...         for s in ("confirm", "heldout") for i in range(60) for c in ("baseline", "L1H2")]
    >>> rec = outcome_verdict(pd.DataFrame(rows), Design(n_boot=200))
    >>> rec["chosen"], rec["sets"][0]["confirm_fixes"], rec["sets"][0]["holds"]
    ('L1H2', 15, True)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .ablation import parse_set
from .compare import Comparison, paired_table
from .design import Design
from .errors import CELError
from .io import json_safe
from .pipeline import POLICIES, Run, staged
from .scoring import ItemResults
from .screening import confirmation_power
from .verdict import equals_of

BASELINE = "baseline"
SPLITS = ("confirm", "heldout")


def read_outcomes(path: str | Path) -> pd.DataFrame:
    """A per-item table from a ``.csv``, ``.jsonl`` or ``.json`` (records) file, with a one-line error otherwise."""
    p = Path(path)
    if not p.is_file():
        raise CELError(f"no such table: {p}")
    if p.suffix == ".csv":
        return pd.read_csv(p)
    if p.suffix in (".jsonl", ".json"):
        try:
            return pd.read_json(p, lines=p.suffix == ".jsonl")
        except ValueError as e:
            raise CELError(f"{p} is not valid JSON{' lines' if p.suffix == '.jsonl' else ''}: {e}") from None
    raise CELError(f"{p}: give a .csv, .jsonl or .json table of per-item outcomes")


def checked(df: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """The confirm and held-out rows, checked (one-line :class:`~cel_utils.errors.CELError` for each fault), with
    ``correct`` as booleans and ``margin`` as floats (NaN when the table has none)."""
    missing = [c for c in ("item", "split", "condition") if c not in df]
    if missing or not {"correct", "margin"} & set(df):
        need = missing + ([] if {"correct", "margin"} & set(df) else ["correct or margin"])
        raise CELError(f"the table lacks column(s) {', '.join(need)}")
    df = df.assign(item=df["item"].astype(str), split=df["split"].astype(str), condition=df["condition"].astype(str))
    bad = sorted(set(df["split"]) - {"search", *SPLITS})
    if bad:
        raise CELError(f"unknown split(s) {', '.join(bad)}: use search, confirm or heldout")
    twice = df.groupby("item")["split"].nunique()
    if (twice > 1).any():
        raise CELError(f"item {twice[twice > 1].index[0]!r} is in two splits: confirm and held-out items must differ")
    df = df[df["split"].isin(SPLITS)].copy()
    if "correct" in df:
        raw = df["correct"].map(lambda v: {True: 1, False: 0, "true": 1, "false": 0}.get(
            v.lower() if isinstance(v, str) else v, v))
        ok = raw.isin([0, 1]) & raw.notna()
        if not ok.all():
            raise CELError(f"'correct' must be 0/1 or true/false; got {df['correct'][~ok].iloc[0]!r}")
        df["correct"] = raw.astype(int).astype(bool)
    if "margin" in df:
        margin = pd.to_numeric(df["margin"], errors="coerce")
        if (margin.isna() & df["margin"].notna()).any():
            raise CELError(f"'margin' must be a number; got {df['margin'][margin.isna() & df['margin'].notna()].iloc[0]!r}")
    df["margin"] = margin.astype(float) if "margin" in df else np.nan
    if "correct" not in df:
        df["correct"] = df["margin"] > 0
    dup = df.duplicated(["split", "item", "condition"])
    if dup.any():
        r = df[dup].iloc[0]
        raise CELError(f"item {r['item']!r} has two rows for condition {r['condition']!r} in the {r['split']} split")
    for s in SPLITS:
        part = df[df["split"] == s]
        if part.empty:
            if s == "confirm":
                raise CELError("the table has no confirm rows: the verdict confirms on them")
            continue   # no held-out rows: fine while nothing is confirmed (comparison() says what is missing)
        if baseline not in set(part["condition"]):
            raise CELError(f"the {s} split has no {baseline!r} condition (the unablated model's outcomes)")
        counts = part.groupby("condition")["item"].nunique()
        short = counts[counts != counts[baseline]]
        if len(short):
            raise CELError(f"condition {short.index[0]!r} has {short.iloc[0]} of the {counts[baseline]} {s} items "
                           f"of {baseline!r}: every condition needs every item of its split")
    return df


def comparison(df: pd.DataFrame, split: str, names, design: Design, baseline: str = BASELINE) -> Comparison:
    """The named conditions against the baseline on one split's items, as the engine's :class:`Comparison`."""
    part = df[df["split"] == split]
    have = set(part["condition"])
    absent = [n for n in names if n not in have]
    if absent:
        raise CELError(f"the {split} split has no condition {absent[0]!r}, which the verdict tests there")
    items = list(dict.fromkeys(part[part["condition"] == baseline]["item"]))

    def grid(col):   # [n_conditions, n_items]
        wide = part.pivot(index="condition", columns="item", values=col)
        return wide.loc[[baseline, *names], items].to_numpy()

    correct, margin = grid("correct").astype(bool), grid("margin").astype(float)
    base, res = ItemResults(correct[:1], margin[:1]), ItemResults(correct[1:], margin[1:])
    return Comparison(names=list(names), baseline=base, results=res,
                      table=paired_table(names, base, res, n_boot=design.n_boot, seed=design.seed, alpha=design.alpha))


def offered_sets(df: pd.DataFrame, policy: str, baseline: str = BASELINE) -> dict[str, list]:
    """The conditions of the confirm split in the table's order, as ``{name: heads}`` (heads parsed from the
    name when the held-out family needs them: ``"confirmed"`` tests all confirmed sets together)."""
    if policy not in POLICIES:
        raise CELError(f"unknown held-out family {policy!r}; use one of {', '.join(POLICIES)}")
    names = [c for c in dict.fromkeys(df[df["split"] == "confirm"]["condition"]) if c != baseline]
    if not names:
        raise CELError("the confirm split has no condition besides the baseline")
    if policy == "offered":
        return {n: [(0, i)] for i, n in enumerate(names)}   # stand-in heads: only the names are read
    try:
        return {n: parse_set(n) for n in names}
    except (ValueError, CELError):
        raise CELError("with the held-out family 'confirmed' every condition must name a head set (e.g. L14H8 or "
                       "L0H7+L11H6), to test the confirmed sets together; use family 'offered' otherwise") from None


def outcome_verdict(df: pd.DataFrame, design: Design | None = None, policy: str = "confirmed",
                    baseline: str = BASELINE, model: str = "", task: str = "") -> dict:
    """The book's verdict on a per-item table (see the module docstring): the record of ``cel verdict`` without
    the search screen (``sets``, ``chosen``, ``confirmed``, ``equals``, the minimum detectable gains, ``verdict``)."""
    d = design or Design()
    d.check()
    df = checked(df, baseline)
    offer = offered_sets(df, policy, baseline)
    sets, conf_cmp, held_cmp = staged(lambda split, named: comparison(df, split, list(named), d, baseline),
                                      offer, d, policy)
    if policy == "offered":
        sets["size"] = np.nan   # the stand-in heads say nothing about a set's size
    r = Run(model=model, task=task, selector="per-item table", design=d, sets=sets, confirm_comparison=conf_cmp,
            heldout_comparison=held_cmp, heldout_items=int(df[df["split"] == "heldout"]["item"].nunique()))
    conf = r.offered()
    confirmed = conf[conf["confirmed"].astype(bool)]["heads"].tolist()
    pw = confirmation_power(conf["confirm_breaks"].to_numpy(), r.n_confirm, len(conf), d.fdr)
    c = r.chosen()
    verdict = (r.sentence(verb="confirmed") if c is not None else
               f"not detected: none of the {len(conf)} conditions was confirmed; the confirm test detects a gain of "
               f"{pw['min_detectable_gain']:.3f} with {pw['power']:.0%} power at best (breaking nothing)")
    return json_safe({
        "model": model, "task": task, "verdict": verdict, "n_confirm": r.n_confirm, "n_heldout": r.n_heldout,
        "sets": sets.to_dict("records"), "chosen": None if c is None else c["heads"], "design": d.record(),
        "confirmed": confirmed, "equals": equals_of(r, confirmed, d.alpha).to_dict("records") if confirmed else [],
        "min_detectable_gain": pw["min_detectable_gain"], "mde": pw["min_detectable_gain"],
        "mde_worst": pw["min_detectable_gain_worst"], "break_rate_worst": pw["break_rate_worst"],
        "baseline": float(conf_cmp.baseline.accuracy[0]), "family": policy})


def from_run(r: Run) -> pd.DataFrame:
    """A run's per-item outcomes (confirm and held-out) in the table :func:`outcome_verdict` reads, items named
    ``confirm:0``, ``heldout:0``...; conditions in the order they were offered."""
    rows = []
    for split, cmp in (("confirm", r.confirm_comparison), ("heldout", r.heldout_comparison)):
        if cmp is None:
            continue
        for name, res in ((BASELINE, cmp.baseline), *((n, cmp.results.rows([j])) for j, n in enumerate(cmp.names))):
            rows += [{"item": f"{split}:{i}", "split": split, "condition": name, "correct": int(res.correct[0, i]),
                      "margin": float(res.margin[0, i])} for i in range(res.correct.shape[1])]
    return pd.DataFrame(rows, columns=["item", "split", "condition", "correct", "margin"])

