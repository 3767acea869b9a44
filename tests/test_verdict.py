"""The three-stage verdict (search -> confirm -> held-out) against a hand computation on the plain loop.

The oracle re-scores every head and set with ``plain_evaluate`` (full forward passes, no engine, no cache) and
applies the decisions with scipy and a hand-written Holm step-down, so a slip in the pipeline's ranking, its
split use, its BH or its Holm step shows up as a disagreement.
"""

import numpy as np
import pytest

from cel_utils.ablation import head_name, parse_heads
from cel_utils.scoring import encode_task, plain_evaluate
from cel_utils.tasks import load_task
from cel_utils.verdict import single_head_verdict, together, verdict_markdown, verdict_table
from tests.oracles import bh_q, holm_p, mcnemar_p


@pytest.fixture(scope="module")
def splits():
    return {s: load_task("ioi", s, n=n, seed=0) for s, n in (("search", 12), ("confirm", 60), ("heldout", 60))}


def test_verdict_matches_a_hand_computation(monkeypatch, tiny_llama, splits):
    monkeypatch.setenv("CEL_NO_CACHE", "1")
    # an fdr above 1 confirms every re-tested head that fixes more than it breaks, so that the random tiny
    # model reaches the held-out stage with several sets (checked below)
    lm, fdr, top_k = tiny_llama, 1.01, 4
    v = single_head_verdict(lm, splits, top_k=top_k, fdr=fdr)
    heads = parse_heads("all", lm.n_layers, lm.n_heads)
    # stage 1 by hand: rank every head by the change in mean margin on the search split
    enc_s = encode_task(lm, splits["search"])
    b = plain_evaluate(lm, enc_s)
    d_margin = [plain_evaluate(lm, enc_s, [h]).margin.mean() - b.margin.mean() for h in heads]
    top = [heads[i] for i in np.argsort(-np.asarray(d_margin), kind="stable")[:top_k]]
    assert v.confirm["head"].tolist() == [head_name(h) for h in top]
    # stage 2 by hand: exact McNemar on the confirm split, BH over the top_k
    enc_c = encode_task(lm, splits["confirm"])
    bc = plain_evaluate(lm, enc_c).correct[0]
    fb = []
    for h in top:
        a = plain_evaluate(lm, enc_c, [h]).correct[0]
        fb.append((int((~bc & a).sum()), int((bc & ~a).sum())))
    q = bh_q([mcnemar_p(f, k) for f, k in fb])
    confirmed = [head_name(h) for h, (f, k), qq in zip(top, fb, q) if qq < fdr and f > k]
    assert v.confirmed == confirmed
    np.testing.assert_allclose(v.confirm["q_value"], q, rtol=1e-9)
    assert len(confirmed) >= 2
    # stage 3 by hand: each confirmed head and all together on the held-out split, Holm over the sets
    enc_h = encode_task(lm, splits["heldout"])
    bh = plain_evaluate(lm, enc_h).correct[0]
    sets = [[h] for h in parse_heads(",".join(confirmed))]
    if len(confirmed) > 1:
        sets.append(parse_heads(",".join(confirmed)))
    p = []
    for s in sets:
        a = plain_evaluate(lm, enc_h, s).correct[0]
        p.append(mcnemar_p((~bh & a).sum(), (bh & ~a).sum()))
    np.testing.assert_allclose(v.heldout["p_holm"], holm_p(p), rtol=1e-9)
    row = v.row()
    gains = {head_name(h): (f - k) / len(splits["confirm"]) for h, (f, k) in zip(top, fb)}
    best = max(confirmed, key=lambda h: gains[h])  # the confirmed head with the largest confirm gain
    assert row["chosen"] == best
    assert row["p_holm"] == pytest.approx(holm_p(p)[confirmed.index(best)])
    assert row["together_delta"] == pytest.approx(v.heldout.set_index("heads").loc[together(confirmed), "delta_accuracy"])


def test_verdict_table_and_text(tiny_llama, splits):
    v = single_head_verdict(tiny_llama, splits, top_k=2, fdr=1e-9)  # nothing can be confirmed at this level
    tab = verdict_table([v])
    assert tab["confirmed"].tolist() == [""] and not tab["holds"].any()
    assert "would have been confirmed" in tab["verdict"].iloc[0]
    assert f"accuracy {tab['baseline'].iloc[0]:.3f} on 60 confirm items" in verdict_markdown(tab)
    assert tab["baseline"].iloc[0] == v.confirm["baseline_accuracy"].iloc[0]
