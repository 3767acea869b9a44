"""Every selector side by side (cel_utils.comparison.compare_selectors) on tiny models with planted heads: a pair
only the learned gates can see, the table and areas, the pool search reading chapter 2's sweep, the beam beyond the
sweep, grading in the dtype asked, and every selector through the pipeline beside the random control."""

import json

import numpy as np
import pytest

from cel_utils.ablation import all_heads, format_set
from cel_utils.comparison import compare_selectors
from cel_utils.design import Design
from cel_utils.gates import GateSettings
from cel_utils.selectors import Options, compared
from cel_utils.tiny import HARMFUL_HEAD, PAIR_HEADS


def compare(lm, splits, max_k, pool_size=5, random_sets=3, compressed=True, compressed_evals=None, mode="zero",
            beam_width=3, dtype=None, seed=0, n_boot=2000, progress=False, gate_settings=None, screen_result=None):
    """compare_selectors with the comparison's options as keywords."""
    return compare_selectors(lm, splits, Design(max_k=max_k, mode=mode, seed=seed, n_boot=n_boot, dtype=dtype),
                             Options(pool_size=pool_size, beam_width=beam_width, compressed_evals=compressed_evals,
                                     gates=gate_settings, random_sets=random_sets,
                                     leave_out=() if compressed else ("compressed",)),
                             screen_result=screen_result, progress=progress)


def test_gates_find_a_pair_whose_members_do_nothing_alone(pair):
    """Removing either planted head alone changes no answer (and lowers the margin, so the single-head screen
    ranks both last: no pool of the top screened heads holds them); removing both turns every item right. Pool
    search, top-k, and the gradient screen find nothing; the gates, over all heads, find the pair at k = 2."""
    lm, splits = pair
    res = compare(lm, splits, max_k=3, pool_size=10, random_sets=2, compressed=False, progress=False,
                            n_boot=300)
    assert not set(PAIR_HEADS) & {tuple(h) for h in res.pool}
    t = res.table.set_index(["selector", "k"])
    assert t.loc[("learned gates", 2), "heads"] == format_set(PAIR_HEADS)
    assert t.loc[("learned gates", 2), "heldout_delta_accuracy"] > 0.4     # 15 fixes, 5 breaks on 20 items
    for name in ("top-k screen", "pool search", "gradient"):
        assert (t.loc[name, "heldout_delta_accuracy"] == 0).all(), name
    s = res.summary.set_index("selector")
    assert s.loc["learned gates", "area_vs_pool_ci_low"] > 0
    # the gates' pipeline: the pair set is confirmed and chosen on the confirm split
    assert res.pipeline.chosen()["heads"] == format_set(PAIR_HEADS)
    # the chapter's sentence says so, with the numbers
    text = res.sentence()
    g = s.loc["learned gates"]
    assert f"is {g.area:+.3f} [{g.area_ci_low:+.3f}, {g.area_ci_high:+.3f}], above the pool search's" in text
    assert f"chose {format_set(PAIR_HEADS)} (confirmed" in text and "the largest area is the learned gates" in text


def test_selector_table_and_areas(pair):
    """Every selector at every k; each area is the mean of its curve, inside its bootstrap CI; costs recorded."""
    lm, splits = pair
    res = compare(lm, splits, max_k=2, pool_size=3, random_sets=2, compressed=True, compressed_evals=12,
                            progress=False, n_boot=200)
    assert res.table.groupby("selector", sort=False).size().to_dict() == {s.label: 2 for s in compared()}
    for r in res.summary.itertuples():
        curve = res.table[res.table.selector == r.selector]["heldout_delta_accuracy"]
        assert r.area == pytest.approx(curve.mean())
        assert r.area_ci_low - 1e-12 <= r.area <= r.area_ci_high + 1e-12
    s = res.summary.set_index("selector")
    assert s.loc["pool search", "area_vs_pool"] == 0 and s.loc["random", "forward_equivalents"] == 0
    assert s.loc["gradient", "forward_equivalents"] == 3.0 and s.loc["compressed sensing", "n_evaluations"] == 12
    assert (s.drop("random")["seconds"] > 0).all()
    json.dumps(res.record())
    with pytest.raises(ValueError, match="pool_size must be at least max_k"):
        compare(lm, splits, max_k=4, pool_size=3)


def test_pool_search_reads_chapter_2s_sweep_and_chooses_as_it_does(pair, monkeypatch):
    """compare_selectors' pool search sweeps every subset of the pool in joint_search's order, so the sweep
    joint_search made is read back from the result cache (no new forward), and it chooses at each size the set
    joint_search's exhaustive search chose (the same scores: accuracy plus the margin tie-break)."""
    from cel_utils import joint
    from cel_utils.joint import joint_search
    from cel_utils.screening import screen

    lm, splits = pair
    sc = screen(lm, splits["search"], progress=False)
    pool = [(int(r.layer), int(r.head_index)) for r in sc.top(3).itertuples()]
    js = joint_search(lm, splits["search"], splits["confirm"], splits["heldout"], pool, max_k=2, random_sets=2,
                      random_pools=0, progress=False)
    first = []
    real = joint.compare_sets

    def spy(*a, **k):
        cmp = real(*a, **k)
        first.append(bool(cmp.baseline.cached))
        return cmp

    monkeypatch.setattr(joint, "compare_sets", spy)
    res = compare(lm, splits, max_k=2, pool_size=3, screen_result=sc, random_sets=1, compressed=False,
                            progress=False, n_boot=100)
    assert first[0], "the pool sweep was evaluated again"
    chosen = res.table[res.table.selector == "pool search"].set_index("k")["heads"]
    want = js.strategies[js.strategies.strategy == "exhaustive"].set_index("size")["heads"]
    assert [chosen[k] for k in (1, 2)] == [want[k] for k in (1, 2)]


def test_pool_search_beyond_the_sweep_is_a_beam_search(pair, monkeypatch):
    """A pool with more subsets than SELECTOR_SWEEP_MAX is searched by chapter 2's beam search with the same score:
    a beam wider than any size's candidates evaluates every subset, so it chooses what the exhaustive sweep
    chose at the same counted cost; a beam of width 1 evaluates 1 + 5 + 4 + 3 sets on a pool of 5 (by hand)."""
    from cel_utils import selectors

    lm, splits = pair
    kw = dict(max_k=3, pool_size=5, random_sets=1, compressed=False, progress=False, n_boot=100,
              gate_settings=GateSettings(steps=2, inits=(0.0,)))
    swept = compare(lm, splits, **kw)
    monkeypatch.setattr(selectors, "SELECTOR_SWEEP_MAX", 0)
    wide = compare(lm, splits, beam_width=100, **kw)
    narrow = compare(lm, splits, beam_width=1, **kw)

    def pool_search(r):
        s = r.summary.set_index("selector").loc["pool search"]
        return (r.table[r.table.selector == "pool search"]["heads"].tolist(), s.forward_equivalents,
                s.n_evaluations)

    assert pool_search(wide) == pool_search(swept)
    n_screen = len(all_heads(lm))
    assert pool_search(swept)[2] == n_screen + 1 + 5 + 10 + 10 and pool_search(narrow)[2] == n_screen + 1 + 5 + 4 + 3
    assert pool_search(narrow)[1] < pool_search(wide)[1]
    with pytest.raises(Exception, match="beam_width must be at least 1"):
        compare(lm, splits, beam_width=0, **kw)


def test_selectors_grade_in_the_dtype_asked_and_learn_in_the_models(pair):
    """dtype="bfloat16": every set is graded by the bfloat16 copy of the model (each selector's held-out change in
    mean margin equals a separate evaluation of that set by cast(lm, "bfloat16"), and differs from float32's),
    while the gates learn in the model's own float32 (the same log-alphas as with no dtype)."""
    from cel_utils.ablation import Ablation, parse_set
    from cel_utils.engine import evaluate_head_sets
    from cel_utils.models import cast
    from cel_utils.scoring import encode_task
    from cel_utils.selectors import REGISTRY

    lm, splits = pair
    kw = dict(max_k=2, pool_size=3, random_sets=1, compressed=False, progress=False, n_boot=100,
              gate_settings=GateSettings(steps=3))
    f32 = compare(lm, splits, **kw)
    b16 = compare(lm, splits, dtype="bfloat16", **kw)
    assert np.array_equal(f32.gates.log_alpha, b16.gates.log_alpha)
    enc = encode_task(lm, splits["heldout"])
    got = {}
    for name, res, model in (("f32", f32, lm), ("b16", b16, cast(lm, "bfloat16"))):
        t = res.table[res.table.selector != "random"]
        boost = res.offers[REGISTRY["boost"].label].info["alpha"]   # the boosted sets: scaled; the rest: removed
        alphas = [boost if x == REGISTRY["boost"].label else 0.0 for x in t["selector"]]
        r = evaluate_head_sets(model, enc, [[]] + [parse_set(h) for h in t["heads"]], progress=False,
                               mode=Ablation("scale", alphas=(1.0, *alphas)))
        got[name] = t["heldout_delta_margin"].to_numpy()
        assert np.allclose(got[name], r.mean_margin[1:] - r.mean_margin[0], atol=1e-5), name
    assert not np.allclose(got["f32"], got["b16"], atol=1e-5)
    assert b16.runs["learned gates"].design.dtype == "bfloat16"


def test_a_boosted_set_and_the_same_set_removed_are_graded_apart(harmful, monkeypatch):
    """The boost selector joins the comparison. Its ranking is made to be the top-k screen's, so the two offer
    the same sets (the same names): each curve must still be its own intervention's, boosted (scale alpha) or
    removed, against a plain full-sequence evaluation of that set on the held-out items."""
    import pandas as pd

    from cel_utils import selectors
    from cel_utils.ablation import Ablation, parse_set
    from cel_utils.scoring import encode_task, plain_evaluate
    from cel_utils.screening import screen

    def as_topk(lm, task):   # the direct-effect ranking replaced by the exact screen's order
        sc = screen(lm, task, progress=False)
        return pd.DataFrame([{"layer": int(r.layer), "head_index": int(r.head_index)}
                             for r in sc.top(len(sc.heads)).itertuples()])

    monkeypatch.setattr(selectors, "direct_ranking", as_topk)
    lm, splits = harmful
    res = compare(lm, splits, max_k=2, pool_size=3, random_sets=2, compressed=False, n_boot=100,
                  gate_settings=GateSettings(steps=3))
    boost = selectors.REGISTRY["boost"].label
    t = res.table.set_index(["selector", "k"])
    assert [t.loc[(boost, k), "heads"] for k in (1, 2)] == [t.loc[("top-k screen", k), "heads"] for k in (1, 2)]
    alpha = res.offers[boost].info["alpha"]
    assert alpha > 1
    enc = encode_task(lm, splits["heldout"])
    base = plain_evaluate(lm, enc)
    for (sel, k), r in t.drop(index="random", level=0).iterrows():
        mode = Ablation.of("scale", alpha=alpha) if sel == boost else "zero"
        got = plain_evaluate(lm, enc, parse_set(r.heads), mode=mode)
        assert r.heldout_delta_accuracy == pytest.approx(float(got.correct[0].mean() - base.correct[0].mean()),
                                                         abs=1e-9), (sel, k)
        assert r.heldout_delta_margin == pytest.approx(float(got.margin[0].mean() - base.margin[0].mean()),
                                                       abs=1e-4), (sel, k)
    # removing the harmful head and boosting it change held-out accuracy by different amounts, so a table that
    # mixed the two up could not pass the checks above
    assert t.loc[("top-k screen", 1), "heads"] == format_set([HARMFUL_HEAD])
    assert abs(t.loc[("top-k screen", 1), "heldout_delta_accuracy"] - t.loc[(boost, 1), "heldout_delta_accuracy"]) > 0.1
    # the section's sentence gives boosting's own area (the mean of its curve) against the pool search's
    b = res.summary.set_index("selector").loc[boost]
    assert b.area == pytest.approx(t.loc[boost, "heldout_delta_accuracy"].mean())
    assert (f"multiplied by {alpha:g}, the dose chosen on the search split) has an area of {b.area:+.3f} "
            f"[{b.area_ci_low:+.3f}, {b.area_ci_high:+.3f}]") in res.sentence()


def test_the_comparison_runs_on_a_bfloat16_model_given_as_the_model(pair):
    """Chapter 2 passes the bfloat16 copy itself (selector_dtype): the boost selector's direct-effect ranking,
    which reads the model's norms and projections, runs on a float32 copy of it and offers its sets."""
    from cel_utils.models import cast
    from cel_utils.selectors import REGISTRY

    lm, splits = pair
    res = compare(cast(lm, "bfloat16"), splits, max_k=2, pool_size=3, random_sets=1, compressed=False, n_boot=100,
                  gate_settings=GateSettings(steps=2))
    rows = res.table[res.table.selector == REGISTRY["boost"].label]
    assert list(rows.k) == [1, 2] and res.offers[REGISTRY["boost"].label].info["alpha"] > 1


def test_a_comparison_without_the_gates_still_records_and_words_itself(pair):
    """Issue 52: the comparison looked the gates up by their display label, so leaving them out broke its record
    and its sentence. Without the gates: no gates' pipeline, a record whose gates entry is null (chapter 4's reader
    skips it), a sentence on the selectors that ran."""
    import tempfile
    from pathlib import Path

    from cel_utils.records import Records

    lm, splits = pair
    res = compare_selectors(lm, splits, Design(max_k=2, seed=0, n_boot=100),
                            Options(pool_size=3, random_sets=2, leave_out=("gates", "compressed")), progress=False)
    assert "learned gates" not in set(res.table.selector) and res.pipeline is None and res.gates is None
    rec = res.record()
    assert rec["gates"] is None and json.loads(json.dumps(rec))["gates"] is None
    assert "(the learned gates left out)" in res.sentence() and "area" in res.sentence()
    d = Path(tempfile.mkdtemp())
    (d / "02_joint_search.record.json").write_text(json.dumps(
        {"selectors": {"pairs": [dict(rec, model="m", task="t")]}}))
    assert Records(d).gates_runs() == [] and Records(d).gates_chosen("m", "t") is None
