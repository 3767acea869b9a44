"""The book's method written once (cel_utils.pipeline): confirm, choose, held-out and the control, against
oracles written here (exact McNemar, BH and Holm from tests/oracles.py on direct engine evaluations)."""

import json

import numpy as np
import pandas as pd
import pytest

from cel_utils.ablation import all_heads, format_set
from cel_utils.design import Design
from cel_utils.gates import GateSettings
from cel_utils.models import load_model
from cel_utils.pipeline import Run, choose, control, heldout, heldout_family, run
from cel_utils.scoring import encode_task, plain_evaluate
from cel_utils.tasks import Task
from cel_utils.tiny import HARMFUL_HEAD, harm_items
from cel_utils.selectors import gate_pipeline
from tests.oracles import by_q, bh_q, holm_p, mcnemar_p


def test_pipeline_statistics_match_the_oracles(pair):
    """Confirm: exact McNemar and BH over the sizes offered; held-out: exact McNemar and Holm over the sizes; the
    chosen set is the confirmed one with the largest confirm gain; the control's percentile is in [0, 100]."""
    from cel_utils.engine import evaluate_head_sets
    from cel_utils.scoring import encode_task

    lm, splits = pair
    gp, lg = gate_pipeline(lm, splits, GateSettings(max_k=3, random_sets=2, progress=False, n_boot=200))
    sets = [lg.sets[k] for k in (1, 2, 3)]
    assert gp.sets["heads"].tolist() == [format_set(x) for x in sets] and gp.sets["size"].tolist() == [1, 2, 3]
    for split, p_col, adj, oracle in (("confirm", "confirm_p_value", "confirm_q_value", bh_q),
                                      ("heldout", "heldout_p_value", "heldout_p_holm", holm_p)):
        r = evaluate_head_sets(lm, encode_task(lm, splits[split]), [[]] + sets, progress=False, result_cache=False)
        base, abl = r.correct[0], r.correct[1:]
        fixes, breaks = (~base & abl).sum(1), (base & ~abl).sum(1)
        p = [mcnemar_p(f, b) for f, b in zip(fixes, breaks)]
        assert gp.sets[p_col].to_numpy() == pytest.approx(p) and gp.sets[adj].to_numpy() == pytest.approx(oracle(p))
        if split == "confirm":   # Benjamini-Yekutieli beside BH, as a sensitivity check, against the hand oracle
            assert gp.sets["confirm_q_value_by"].to_numpy() == pytest.approx(by_q(p))
    ok = gp.sets[gp.sets.confirmed]
    assert gp.chosen()["heads"] == ok.loc[ok.confirm_delta_accuracy.idxmax(), "heads"]
    assert len(gp.control) == 2 and 0 <= gp.control_percentile() <= 100
    rec = json.loads(json.dumps(gp.record()))
    assert rec["chosen"] == gp.chosen()["heads"] and rec["selector"] == "learned gates"
    assert rec["task"] == splits["confirm"].name != ""   # the task's name survives encoding
    assert len(lg.record()["values"]) == len(all_heads(lm)) * len(lg.inits)   # a row per head and run


def test_the_choice_never_reads_the_heldout_split():
    """The chosen learned set is the confirmed one with the largest confirm gain, whatever the held-out figures;
    the control's percentile places the chosen set's held-out gain among the random rankings' pipelines."""
    sets = pd.DataFrame({"heads": ["A", "A+B", "A+B+C"], "size": [1, 2, 3], "offered": True,
                         "confirmed": [True, True, False], "confirm_delta_accuracy": [0.05, 0.10, 0.30],
                         "heldout_delta_accuracy": [0.4, 0.0, 0.5]})
    r = Run(model="m", task="t", selector="s", design=Design(), sets=sets, confirm_comparison=None,
            heldout_comparison=None, control=pd.DataFrame({"heldout_delta_accuracy": [-0.1, 0.0, 0.1]}))
    assert r.chosen()["heads"] == "A+B" and r.chosen_gain() == 0.0 and r.control_percentile() == 50.0
    none = Run(**{**r.__dict__, "sets": sets.assign(confirmed=False)})
    assert none.chosen() is None and none.chosen_gain() == 0.0


def test_the_control_chooses_as_the_pipeline_does():
    """A random ranking's sets go through the same rule: BH-confirmed on the confirm items, the largest confirm
    gain chosen, its held-out gain reported (0 when nothing is confirmed)."""
    from cel_utils.tiny import tiny_model
    from cel_utils.tasks import load_task

    lm = tiny_model("llama")
    encs = {s: load_task("ioi", s, n=24) for s in ("search", "confirm", "heldout")}
    heads = all_heads(lm)
    offers = [[[heads[0]], [heads[0], heads[5]]], [[heads[3]], [heads[3], heads[9]]]]
    d = Design(fdr=1.01, n_boot=100)   # every set that gains is confirmed
    ctrl = control(lm, encs, offers, d, labels=[{"pool": "a"}, {"pool": "b"}])
    assert list(ctrl.columns) == ["replicate", "pool", "chosen", "heldout_delta_accuracy"]
    for o, row in zip(offers, ctrl.itertuples()):
        r = run(lm, encs, {format_set(x): x for x in o}, d)   # the pipeline itself on the same offer
        c = r.chosen()
        assert row.chosen == (None if c is None else c["heads"])
        assert row.heldout_delta_accuracy == pytest.approx(0.0 if c is None else c["heldout_delta_accuracy"])


def test_the_heldout_family():
    """The verdict's family: the confirmed sets alone and, when more than one, all of them together (in the order
    confirmed); the joint search's: every offered set."""
    conf = pd.DataFrame({"heads": ["L2H0", "L0H1", "L1H1"], "confirmed": [True, False, True]})
    offer = {"L2H0": [(2, 0)], "L0H1": [(0, 1)], "L1H1": [(1, 1)]}
    assert heldout_family(conf, offer, "confirmed") == {"L2H0": [(2, 0)], "L1H1": [(1, 1)],
                                                        "L2H0+L1H1": [(2, 0), (1, 1)]}
    assert heldout_family(conf.assign(confirmed=[True, False, False]), offer, "confirmed") == {"L2H0": [(2, 0)]}
    assert heldout_family(conf.assign(confirmed=False), offer, "confirmed") == {}
    assert heldout_family(conf, offer, "offered") == offer
    with pytest.raises(ValueError, match="unknown held-out family"):
        heldout_family(conf, offer, "all")
    assert choose(conf.assign(confirm_delta_accuracy=[0.1, 0.5, 0.1]))["heads"] == "L2H0"   # ties: the earlier


def _harm_task(split, flip=False):
    """The planted model's items of one split; ``flip``: every answer the other choice."""
    items = [dict(it) for it in harm_items() if it["split"] == split]
    for it in items:
        it["answer"] = 1 - it["answer"] if flip else it["answer"]
    return Task(name=f"harm_{split}", kind="mc", items=items, split=split, seed=0, description="",
                metric="accuracy")


QUIET = (0, 0)   # a near-silent head of the planted model: removing it changes no answer


@pytest.mark.parametrize("split,flip,sets", [
    # every item wrong with all heads on: the planted head fixes all 20; with the quiet head too, the same
    ("search", False, {"harm": [HARMFUL_HEAD], "quiet": [QUIET], "both": [HARMFUL_HEAD, QUIET]}),
    # the answers flipped: the planted head breaks all 20, a significant loss, which never holds
    ("search", True, {"harm": [HARMFUL_HEAD], "quiet": [QUIET]}),
    # held-out items, every fourth answer flipped: 15 fixes, 5 breaks, p = 0.041 below 0.05 alone, above
    # 0.05 after Holm over two sets
    ("heldout", False, {"harm": [HARMFUL_HEAD], "quiet": [QUIET]}),
    ("heldout", False, {"harm": [HARMFUL_HEAD]}),
])
def test_the_heldout_stage_against_hand_counts_and_the_oracles(harmful_folder, monkeypatch, split, flip, sets):
    """Fixes and breaks counted by hand from a separate plain run per set; p-values from the exact McNemar
    oracle, Holm from the Holm oracle, holds = p_holm < alpha and a gain."""
    monkeypatch.setenv("CEL_NO_CACHE", "1")
    lm = load_model(harmful_folder[0])
    task = _harm_task(split, flip)
    tab, cmp = heldout(lm, task, sets, Design())
    enc = encode_task(lm, task)
    base = plain_evaluate(lm, enc).correct[0]
    fixes, breaks = [], []
    for heads in sets.values():
        a = plain_evaluate(lm, enc, heads).correct[0]
        fixes.append(sum(1 for x, y in zip(base, a) if not x and y))
        breaks.append(sum(1 for x, y in zip(base, a) if x and not y))
    p = [mcnemar_p(f, b) for f, b in zip(fixes, breaks)]
    p_holm = holm_p(p)
    assert tab["heads"].tolist() == list(sets) == cmp.names
    assert tab["heldout_fixes"].tolist() == fixes and tab["heldout_breaks"].tolist() == breaks
    assert tab["heldout_delta_accuracy"].to_numpy() == pytest.approx((np.array(fixes) - np.array(breaks)) / len(task))
    assert tab["heldout_p_value"].to_numpy() == pytest.approx(p, rel=1e-9)
    assert tab["heldout_p_holm"].to_numpy() == pytest.approx(p_holm, rel=1e-9)
    want = [bool(q < 0.05 and f > b) for q, f, b in zip(p_holm, fixes, breaks)]
    assert tab["holds"].tolist() == want
    # the planted head did what the case says (so that each case tests what its comment claims)
    f, b = fixes[0], breaks[0]
    assert (f, b) == {("search", False): (20, 0), ("search", True): (0, 20), ("heldout", False): (15, 5)}[split, flip]


def test_the_verdict_says_where_benjamini_yekutieli_disagrees():
    """Planted: three heads BH confirms, one of which BY does not; the clause names it. Where they agree, no clause."""
    from types import SimpleNamespace

    from cel_utils.verdict import Verdict

    t = pd.DataFrame({"heads": ["L1H0", "L2H0", "L3H0", "L4H0"], "offered": [True] * 4,
                      "confirmed": [True, True, True, False], "confirmed_by": [True, True, False, False]})
    fake = SimpleNamespace(run=SimpleNamespace(offered=lambda: t))
    assert Verdict.by_clause(fake) == ("; under Benjamini-Yekutieli (valid whatever the dependence between tests on "
                                       "shared items) 2 of the 3 confirmed heads stay confirmed (L3H0 would not)")
    t["confirmed_by"] = t["confirmed"]
    assert Verdict.by_clause(fake) == ""
