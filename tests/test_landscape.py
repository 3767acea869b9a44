"""Chapter 1a's tables over many verdicts (cel_utils.landscape): the stability of the search's ranking over fresh
windows against screens made here, and the power model's search stage beside it."""

import numpy as np
import pandas as pd
import pytest

from tests.oracles import mcnemar_p

from cel_utils.landscape import power_check, rank_stability


def test_rank_stability_counts_each_windows_top_k(tiny_llama, monkeypatch):
    """Each window's ranks equal a screen of those items made here (the engine, cache off), and a head's share is
    how many windows put it in the top k."""
    from dataclasses import replace

    from cel_utils.screening import screen
    from cel_utils.tasks import load_task

    monkeypatch.setenv("CEL_NO_CACHE", "1")
    heads = [(0, 0), (0, 3), (1, 1), (2, 2), (2, 3)]
    t = rank_stability(tiny_llama, "ioi", heads, n_search=6, windows=3, top_k=2)
    full = load_task("ioi", "search")
    tops = []
    for w in (1, 2, 3):
        sc = screen(tiny_llama, replace(full, items=full.items[6 * w:6 * (w + 1)]), heads=heads, progress=False)
        order = sc.top(len(heads))["head"].tolist()
        assert t[f"rank_{w}"].tolist() == [order.index(h) + 1 for h in t["head"]]
        tops.append(set(order[:2]))
    assert t["top_k_share"].tolist() == [np.mean([h in s for s in tops]) for h in t["head"]]
    assert (t["windows"] == 3).all() and t["top_k_share"].sum() == 2.0


def test_power_check_sets_the_model_beside_the_windows(tiny_llama):
    """For a verdict with confirmed heads, one row per confirmed head: the modelled p_rank (a probability) beside
    the observed share of windows."""
    from cel_utils.tasks import load_task
    from cel_utils.verdict import single_head_verdict

    splits = {s: load_task("ioi", s, n=n) for s, n in (("search", 12), ("confirm", 60), ("heldout", 60))}
    v = single_head_verdict(tiny_llama, splits, top_k=2, fdr=1.01, power_sims=0)
    heads = [(int(r.layer), int(r.head_index)) for r in v.screen.top(len(v.screen.heads)).itertuples()]
    st = rank_stability(tiny_llama, "ioi", heads, n_search=12, windows=2, top_k=2)
    pc = power_check(v, st, n_sim=100)
    assert pc["head"].tolist() == v.confirmed
    assert ((pc.modelled_p_rank >= 0) & (pc.modelled_p_rank <= 1)).all() and (pc.windows == 2).all()


def test_several_vs_one_is_the_paired_difference_with_the_best_single_head():
    """The chosen two-head set against the pool's best single head on the same held-out items: the mean of the
    per-item differences (by hand) inside its CI, the clause that reads it, nothing for a single head."""
    from types import SimpleNamespace

    from cel_utils.design import Design
    from cel_utils.landscape import several_vs_one
    from cel_utils.scoring import ItemResults

    rng = np.random.default_rng(0)
    single = rng.random(120) < 0.5
    pair = single | (rng.random(120) < 0.4)                      # fixes many items, breaks none
    cmp = SimpleNamespace(names=["L1H0", "L1H0+L2H3"],
                          results=ItemResults(np.stack([single, pair]), np.zeros((2, 120))))
    js = SimpleNamespace(best=pd.DataFrame({"size": [1, 2], "heads": ["L1H0", "L1H0+L2H3"]}),
                         run=SimpleNamespace(heldout_comparison=cmp, design=Design(n_boot=300)))
    out = several_vs_one(js, "L1H0+L2H3")
    by_hand = (pair.sum() - single.sum()) / 120
    assert out["vs_single"] == "L1H0" and out["vs_single_delta"] == pytest.approx(by_hand)
    assert 0 < out["vs_single_ci_low"] < by_hand < out["vs_single_ci_high"]
    assert "helps more than removing L1H0 alone" in out["vs_sentence"]
    assert several_vs_one(js, "L1H0")["vs_sentence"] == ""
    # chapter 1a's chosen head given: the set against it, worded from the exact test on the items they differ on
    better = pair | (rng.random(120) < 0.3)                     # a single head that fixes more than the set
    out = several_vs_one(js, "L1H0+L2H3", ("L0H7", better))
    f, b = int((pair & ~better).sum()), int((~pair & better).sum())
    assert out["vs_single"] == "L0H7" and out["vs_single_p"] == pytest.approx(mcnemar_p(f, b))
    assert out["vs_single_delta"] == pytest.approx((f - b) / 120) and out["vs_single_delta"] < 0
    assert "helps less than removing L0H7 alone" in out["vs_sentence"]
    # a tie: the set and the head differ on two items, one each way (the old wording said "more" on a CI)
    tie = pair.copy()
    i, j = np.flatnonzero(pair)[0], np.flatnonzero(~pair)[0]
    tie[i], tie[j] = False, True
    out = several_vs_one(js, "L1H0+L2H3", ("L0H7", tie))
    assert out["vs_single_delta"] == 0 and "is not shown to differ from removing L0H7 alone (a tie" in out["vs_sentence"]


def test_the_verdict_sentence_says_how_stable_the_choice_is():
    """The selection stability is printed beside each verdict (chapter 1a's sentences), not inside the verdict's
    own words (those are what `cel stats` reproduces from outcomes alone); nothing chosen, nothing said."""
    import pandas as pd

    from cel_utils.landscape import verdict_markdown

    row = dict(model="m", task="t", baseline=0.5, n_confirm=200, n_search=64, n_heldout=200, verdict="confirmed ...",
               worst_cost_task=None, cost_delta=float("nan"), cost_ci_low=float("nan"), cost_ci_high=float("nan"),
               chosen="L1H2", selection_offered=0.95, selection_first=0.42)
    text = verdict_markdown(pd.DataFrame([row, dict(row, task="u", chosen=None, selection_offered=float("nan"))]))
    first, second = text.splitlines()
    assert "the screen offers L1H2 to the confirm split in 95% and ranks it first in 42%" in first
    assert "resamples" not in second
