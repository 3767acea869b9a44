"""Dose curves, the direct ranking and the per-item ceiling (cel_utils/dose.py), on tiny models and planted
outcomes; the oracles are the engine's own zero ablation and the intact model, and hand counts."""

import numpy as np
import pytest
import torch

from cel_utils import dose
from cel_utils.ablation import Ablation, ablate_heads
from cel_utils.direct import direct_ranking
from cel_utils.engine import evaluate_head_sets
from cel_utils.scoring import encode_task
from cel_utils.selectors import choose_boost
from cel_utils.tasks import load_task
from cel_utils.tiny import tiny_model


@pytest.fixture(scope="module")
def lm():
    return tiny_model("llama")


def _logits(lm, text="12 + 34 = 46"):
    ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
    with torch.no_grad():
        return lm.model(input_ids=ids, use_cache=False).logits


def test_alpha_one_is_the_intact_model_and_alpha_zero_is_removal(lm):
    ref = _logits(lm)
    with ablate_heads(lm, "L0H1,L1H0", Ablation.of("scale", alpha=1.0)):
        same = _logits(lm)
    torch.testing.assert_close(same, ref, rtol=0, atol=0)          # bit-identical
    with ablate_heads(lm, "L0H1,L1H0", "zero"):
        zero = _logits(lm)
    with ablate_heads(lm, "L0H1,L1H0", Ablation.of("scale", alpha=0.0)):
        scaled = _logits(lm)
    torch.testing.assert_close(scaled, zero, rtol=0, atol=0)
    assert (zero - ref).abs().max() > 1e-3                          # the heads matter on this model


def test_dose_curve_matches_the_engine_at_each_alpha(lm):
    encs = {s: encode_task(lm, load_task("addition", s, n=12)) for s in ("confirm", "heldout")}
    heads = [(0, 1), (1, 0)]
    curve = dose.dose_curve(lm, encs, heads, alphas=(0.0, 0.5, 2.0), n_boot=200)
    t = curve.table
    assert sorted(t.alpha.unique()) == [0.0, 0.5, 1.0, 2.0]
    base = evaluate_head_sets(lm, encs["heldout"], [[]], progress=False, result_cache=False)
    zero = evaluate_head_sets(lm, encs["heldout"], [heads], mode="zero", progress=False, result_cache=False)
    row = t[(t.split == "heldout") & (t.alpha == 0.0)].iloc[0]
    assert row.delta_accuracy == pytest.approx(zero.accuracy[0] - base.accuracy[0])
    assert row.delta_margin == pytest.approx(zero.mean_margin[0] - base.mean_margin[0], abs=1e-5)
    one = t[t.alpha == 1.0]
    assert (one.delta_accuracy == 0).all() and (one.delta_margin == 0).all()
    conf = t[(t.split == "confirm") & (t.alpha != 1.0)]
    if conf.delta_accuracy.max() > 0:                               # the chosen dose is the confirm argmax
        assert curve.chosen_alpha in set(conf[conf.delta_accuracy == conf.delta_accuracy.max()].alpha)
    else:
        assert curve.chosen_alpha == 1.0
    assert curve.shape == dose.shape_of(curve.chosen_alpha)


def test_removal_vs_counts_disagreements_by_hand():
    removed = np.array([1, 1, 0, 0, 0, 1], bool)
    other = np.array([1, 0, 1, 1, 0, 1], bool)
    r = dose.removal_vs(removed, other, n_boot=200)
    assert (r["better"], r["worse"]) == (2, 1)
    assert r["delta"] == pytest.approx(1 / 6)
    assert r["p_value"] == pytest.approx(1.0)                       # 2 vs 1 disagreements: exact two-sided p = 1


def test_ceiling_null_is_near_zero_for_random_flips_and_positive_for_item_specific_heads():
    rng = np.random.default_rng(0)
    base = np.zeros(400, bool)
    random_flips = rng.random((20, 400)) < 0.05                     # each head fixes items at random
    c = dose.per_item_ceiling(base, random_flips, n_perm=300, seed=1)
    assert abs(c["gap"]) < 0.03 and c["p_value"] > 0.05
    specific = np.zeros((20, 400), bool)                            # head j fixes items 20j..20j+19 only
    for j in range(20):
        specific[j, 20 * j:20 * j + 20] = True
    c = dose.per_item_ceiling(base, specific, n_perm=300, seed=1)
    assert c["oracle"] == 1.0 and c["gap"] > 0.3 and c["p_value"] < 0.01
    # the same fixes on the same items (one easy set) fall below the null
    shared = np.zeros((20, 400), bool)
    shared[:, :20] = True
    assert dose.per_item_ceiling(base, shared, n_perm=300)["gap"] < -0.3


def test_ceiling_null_mean_is_the_exact_expectation_of_independent_permutations():
    """Under the null each head's f fixes fall on a random f of the n wrong items, independently per head, so an
    item escapes every head with probability prod(1 - f_h / n): the null's mean against that closed form, with
    heads of very unequal fix counts (where an equal-rate null would be wrong)."""
    rng = np.random.default_rng(3)
    counts = [1, 2, 2, 5, 30, 60]
    fixes = np.zeros((len(counts), 100), bool)
    for j, f in enumerate(counts):
        fixes[j, rng.choice(100, f, replace=False)] = True
    c = dose.per_item_ceiling(np.zeros(100, bool), fixes, n_perm=4000, seed=2)
    want = 1 - np.prod(1 - np.array(counts) / 100)
    assert c["fixes_per_head"] == counts
    assert c["null_mean"] == pytest.approx(want, abs=0.005)            # Monte Carlo sd about 0.0007
    assert abs(c["null_mean"] - (1 - (1 - np.mean(counts) / 100) ** len(counts))) > 0.02


def test_ceiling_reads_only_wrong_items_and_the_static_set():
    base = np.array([1, 1, 0, 0], bool)
    heads = np.array([[0, 0, 1, 0], [1, 1, 0, 0]], bool)            # head 2 fixes nothing wrong
    c = dose.per_item_ceiling(base, heads, n_perm=50, static_correct=np.array([1, 1, 1, 1], bool))
    assert c["wrong_items"] == 2 and c["oracle"] == 0.5 and c["static"] == 1.0


def test_direct_ranking_orders_by_share_then_mean(lm):
    r = direct_ranking(lm, load_task("addition", "search", n=6))
    assert len(r) == lm.n_layers * lm.n_heads
    key = list(zip(r.share_positive, r.mean_direct))
    assert key == sorted(key, reverse=True)
    assert r.share_positive.between(0, 1).all()


def test_choose_dose_takes_the_confirm_argmax_and_never_reads_heldout():
    import pandas as pd

    t = pd.DataFrame({"split": ["confirm"] * 4 + ["heldout"] * 4, "alpha": [0.0, 0.5, 1.0, 2.0] * 2,
                      "delta_accuracy": [0.10, 0.02, 0.0, -0.05, 0.0, 0.9, 0.0, 0.9],
                      "delta_margin": [0.2, 0.1, 0.0, -0.1, 0.0, 1.0, 0.0, 1.0]})
    assert dose.choose_dose(t) == 0.0
    t.loc[t.split == "confirm", "delta_accuracy"] = [0.10, 0.10, 0.0, 0.10]   # a tie: the margin decides
    assert dose.choose_dose(t) == 0.0
    t.loc[t.split == "confirm", "delta_margin"] = [0.2, 0.2, 0.0, 0.2]        # then the alpha nearest 0
    assert dose.choose_dose(t) == 0.0
    t.loc[t.split == "confirm", "delta_accuracy"] = [-0.1, -0.2, 0.0, 0.0]    # no dose gains: the intact model
    assert dose.choose_dose(t) == 1.0


def _hand_correct(lm, task, heads, mode="zero"):
    """Per item: is the right choice the most likely (summed log-probabilities of its tokens), from the model's own
    logits with ``heads`` ablated by ``ablate_heads`` (one prompt at a time, no engine)."""
    right = []
    for it in task.items:
        scores = []
        with ablate_heads(lm, heads, mode):
            for c in it["choices"]:
                ids = lm.tokenizer(it["prompt"] + c)["input_ids"]
                n = len(lm.tokenizer(it["prompt"])["input_ids"])
                with torch.no_grad():
                    lp = lm.model(input_ids=torch.tensor([ids])).logits.float().log_softmax(-1)[0]
                scores.append(sum(lp[i - 1, ids[i]].item() for i in range(n, len(ids))))
        right.append(int(np.argmax(scores)) == it["answer"])
    return np.array(right)


def test_ceiling_on_a_model_matches_single_head_removals_done_by_hand(lm):
    """dose.ceiling: the wrong items are the intact model's, and its oracle and static share equal those of every
    head removed alone (and the static set) by hand, one prompt at a time."""
    from dataclasses import replace

    task = load_task("ioi", "heldout", n=30)
    static = [(1, 0), (0, 1)]
    c = dose.ceiling(lm, task, static, n_wrong=6, n_perm=100)
    base = _hand_correct(lm, task, [])
    wrong = np.flatnonzero(~base)[:6]
    sub = replace(task, items=[task.items[i] for i in wrong])
    per_head = np.array([_hand_correct(lm, sub, [(layer, h)]) for layer in range(lm.n_layers)
                         for h in range(lm.n_heads)])
    assert c["wrong_items"] == len(wrong) > 0 and c["heads"] == lm.n_layers * lm.n_heads
    assert c["oracle"] == per_head.any(axis=0).mean() and c["fixes_per_head"] == per_head.sum(axis=1).tolist()
    assert c["static"] == _hand_correct(lm, sub, static).mean()


def test_boost_chooses_the_dose_with_the_largest_mean_search_gain(lm):
    """choose_boost against a second computation: each alpha's sets scaled by hand through ablate_heads and the
    model's own logits, the accuracy of the correct choice averaged over the sets."""
    task = load_task("ioi", "search", n=24)
    enc = encode_task(lm, task)
    sets = [[(1, 0)], [(1, 0), (0, 1)]]
    doses = (1.5, 3.0, 6.0, 12.0)
    alpha, table = choose_boost(lm, enc, sets, alphas=doses)

    def accuracy(heads, a):
        return np.mean(_hand_correct(lm, task, heads, Ablation.of("scale", alpha=a)))

    base = accuracy([], 1.0)
    gains = {a: np.mean([accuracy(s, a) - base for s in sets]) for a in doses}
    got = table.groupby("alpha").search_delta_accuracy.mean()
    for a, g in gains.items():
        assert got[a] == pytest.approx(g, abs=1e-9)
    assert len(set(gains.values())) > 1 and gains[alpha] == max(gains.values())   # the doses differ here


def test_cel_search_boost_grades_the_boosted_sets_as_cel_eval_does(tiny_folder, tmp_path, capsys):
    """`cel search --strategy boost`: its sets are the top of the direct ranking, tested scaled by the dose it
    chose; each set's held-out accuracy equals `cel eval --mode scale --alpha A` on the same items (a separate
    command); --mode with boost is refused."""
    import json

    from cel_utils.cli import main

    folder = tiny_folder("llama")
    out = tmp_path / "s.json"
    assert main(["search", "--model", folder, "--task", "agreement", "--n", "10", "--strategy", "boost",
                 "--max-size", "2", "--random-sets", "0", "--out", str(out)]) == 0
    s = json.loads(out.read_text())
    alpha = float(s["mode"].split()[1])
    assert s["mode"].startswith("scale") and alpha > 1
    ranking = direct_ranking(tiny_model_from(folder), load_task("agreement", "search", n=10))
    assert s["pool"] == list(ranking["head"][:2])
    for b in s["best"]:
        e = tmp_path / "e.json"
        assert main(["eval", "--model", folder, "--task", "agreement", "--split", "heldout", "--n", "10",
                     "--mode", "scale", "--alpha", str(alpha), "--ablate", ",".join(b["heads"]), "--out", str(e)]) == 0
        ev = json.loads(e.read_text())
        assert b["heldout"]["accuracy"] == pytest.approx(ev["ablated"]["accuracy"], abs=1e-12)
        assert b["heldout"]["mean_margin"] == pytest.approx(ev["ablated"]["mean_margin"], abs=1e-5)
    capsys.readouterr()
    assert main(["search", "--model", folder, "--task", "agreement", "--n", "4", "--strategy", "boost",
                 "--mode", "scale", "--alpha", "2", "--out", str(tmp_path / "x.json")]) == 2
    assert "--strategy boost chooses its own dose" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def tiny_model_from(folder):
    from cel_utils.models import load_model

    return load_model(folder)


def test_recall_at_budget_against_separate_screens(lm):
    """The gradient row's recall is the overlap of the gradient screen's top k with the exact screen's top k, both
    computed here by separate calls; each budgeted selector's cost stays near its budget; the CI holds the recall
    when the reference is certain (the bootstrap of a planted dominant head)."""
    from cel_utils.approximate import gradient_screen
    from cel_utils.design import Design
    from cel_utils.screening import screen
    from cel_utils.selectors import Context

    task = load_task("ioi", "search", n=12)
    ctx = Context.make(lm, task, Design(seed=0))
    t = dose.recall_at_budget(ctx, budgets=(8.0,), k=3, n_boot=100)
    assert list(t.selector) == ["gradient", "compressed", "gates"]
    ex = screen(lm, task, progress=False).top(3)
    top = {(int(r.layer), int(r.head_index)) for r in ex.itertuples()}
    g = gradient_screen(lm, task)
    order = np.argsort(-np.asarray(g.estimate), kind="stable")[:3]
    want = len(top & {g.heads[i] for i in order}) / 3
    assert t.recall.iloc[0] == pytest.approx(want)
    assert (t.ci_low <= t.ci_high).all() and ((t.recall >= 0) & (t.recall <= 1)).all()
    assert t.forward_equivalents.iloc[1] <= 8.0 * 1.5                 # compressed: about its budget


@pytest.mark.parametrize("task", ["addition", "agreement"])   # a shared few-shot prefix, and none
def test_per_set_scale_factors_equal_one_call_per_factor(lm, task):
    """The engine with one scale factor per head set (one batched call, the shared prefix scaled per set) gives
    each set what a separate call with that factor gives, and the hooks of one prompt at a time give too."""
    enc = encode_task(lm, load_task(task, "search", n=10))
    heads = [(0, 1), (1, 2)]
    doses = (0.0, 0.5, 2.0, -0.5)
    both = evaluate_head_sets(lm, enc, [[]] + [heads] * len(doses), mode=Ablation("scale", alphas=(1.0, *doses)),
                              progress=False, result_cache=False)
    for j, a in enumerate(doses):
        one = evaluate_head_sets(lm, enc, [heads], mode=Ablation.of("scale", alpha=a), progress=False,
                                 result_cache=False)
        np.testing.assert_allclose(both.margin[j + 1], one.margin[0], atol=1e-5)
    if task == "agreement":                                       # multiple choice: scored by hand too
        np.testing.assert_array_equal(both.correct[1], _hand_correct(lm, load_task(task, "search", n=10), heads))
    with pytest.raises(Exception, match="scale factors"):
        evaluate_head_sets(lm, enc, [heads], mode=Ablation("scale", alphas=(1.0, 2.0)), progress=False,
                           result_cache=False)


def test_ceiling_null_within_strata_keeps_what_only_the_items_difficulty_explains():
    """Fixes that depend only on the item (the items nearest the boundary are flipped by many heads, the others by
    none) put the oracle far below a null that exchanges all items; exchanging items only within their stratum
    (their margin bin) gives a null equal to the oracle: no head-item link beyond difficulty."""
    rng = np.random.default_rng(4)
    easy = np.zeros(40, bool)
    easy[:10] = True
    fixes = (rng.random((30, 40)) < 0.5) & easy                     # only the 10 easy items are ever fixed
    base = np.zeros(40, bool)
    flat = dose.per_item_ceiling(base, fixes, n_perm=300, seed=1)
    strat = dose.per_item_ceiling(base, fixes, n_perm=300, seed=1, strata=easy.astype(int))
    assert flat["oracle"] == 0.25 and flat["gap"] < -0.3
    assert strat["null_mean"] == pytest.approx(0.25, abs=0.01) and abs(strat["gap"]) < 0.01


def _raw_factor_hook(factors):
    """A z hook written by hand: multiply head h of the layer by ``factors[h]`` (no cel_utils ablation code)."""
    def fn(z):
        z = z.clone()
        for h, f in factors.items():
            z[:, :, h] = z[:, :, h] * f
        return z
    return fn


def test_per_head_factors_match_a_hand_written_hook_and_the_engine(lm):
    """"Boost and remove together": one scale ablation with a factor per head (L0H1 x1.5, L1H0 removed) against a
    z hook written by hand, on the logits and through the engine (multiple-choice items scored by hand)."""
    from cel_utils import hooks

    ab = Ablation("scale", alpha=0.0, head_alphas=((0, 1, 1.5),))
    with ablate_heads(lm, "L0H1,L1H0", ab):
        mine = _logits(lm)
    with hooks.hooked(lm, [("z", 0, _raw_factor_hook({1: 1.5})), ("z", 1, _raw_factor_hook({0: 0.0}))]):
        hand = _logits(lm)
    torch.testing.assert_close(mine, hand, rtol=0, atol=0)
    task = load_task("agreement", "search", n=10)
    res = evaluate_head_sets(lm, encode_task(lm, task), [[], [(0, 1), (1, 0)]], mode=ab, progress=False)
    with hooks.hooked(lm, [("z", 0, _raw_factor_hook({1: 1.5})), ("z", 1, _raw_factor_hook({0: 0.0}))]):
        want = _hand_correct(lm, task, [])
    np.testing.assert_array_equal(res.correct[1], want)
    assert ab.describe() == "scale 0 (L0H1 x1.5)"


def test_boost_and_remove_together_goes_through_the_pipeline(lm):
    from cel_utils.design import Design
    from cel_utils.pipeline import encoded

    encs = encoded(lm, {s: load_task("agreement", s, n=12) for s in ("search", "confirm", "heldout")})
    b = dose.boost_vs_remove(lm, load_task("agreement", "search", n=12), encs, [(1, 2)], Design(n_boot=100), max_k=2)
    assert b["both"].selector == "boost and remove" and b["both"].design.mode is b["both_mode"]
    boosted = {(l, h) for l, h, _ in b["both_mode"].head_alphas}
    assert (1, 2) not in boosted and all(a == b["alpha"] for _, _, a in b["both_mode"].head_alphas)
    for heads in b["both"].sets["heads"]:
        assert "L1H2" in heads.split("+")


def test_collateral_curve_is_zero_at_one_and_removal_at_zero(lm):
    from cel_utils.robust import text_nll

    t = dose.collateral_curve(lm, [(0, 1), (1, 0)], alphas=[0.0, 1.0, 2.0], n_tokens=200, chunk=64, n_boot=100)
    assert t.alpha.tolist() == [0.0, 1.0, 2.0]
    assert t.set_index("alpha").loc[1.0, ["nll_delta", "nll_low", "nll_high"]].tolist() == [0.0, 0.0, 0.0]
    assert (t.tokens == 200).all()                  # every cost says on how many tokens of text
    zero = text_nll(lm, {"s": [(0, 1), (1, 0)]}, 200, chunk=64, n_boot=100)["sets"]["s"]
    assert t.set_index("alpha").loc[0.0, "nll_delta"] == pytest.approx(zero["text_nll_delta"], abs=1e-6)
    assert abs(t.set_index("alpha").loc[2.0, "nll_delta"]) > 1e-4


def test_what_per_item_choice_adds_over_the_static_set_has_its_own_interval():
    """Planted: 60 wrong items; the oracle fixes 45, the static set 30 of them (all inside the oracle's): oracle
    minus static is 15/60 by hand, inside an item-bootstrap CI that excludes 0; a static set that fixes what the
    oracle fixes adds nothing, with a CI of zero width."""
    base = np.zeros(60, bool)
    heads = np.zeros((3, 60), bool)
    heads[0, :20], heads[1, 15:45], heads[2, 40:45] = True, True, True          # together: items 0..44
    static = np.zeros(60, bool)
    static[:30] = True
    c = dose.per_item_ceiling(base, heads, n_perm=50, static_correct=static)
    assert c["oracle"] == 0.75 and c["static"] == 0.5
    assert c["oracle_minus_static"] == pytest.approx(15 / 60)
    assert 0 < c["oms_low"] < 15 / 60 < c["oms_high"]
    c = dose.per_item_ceiling(base, heads, n_perm=50, static_correct=heads.any(axis=0))
    assert c["oracle_minus_static"] == c["oms_low"] == c["oms_high"] == 0


def test_the_dose_sentence_says_tie_where_the_exact_test_cannot_tell():
    """Chapter 2b's per-curve sentence (it typed 0.05 and said 'not distinguishable'): beats at p below ALPHA with
    the chosen dose ahead, loses with it behind, ties at p at least ALPHA whatever the point estimate."""
    from types import SimpleNamespace as R

    from cel_utils.defaults import ALPHA
    from cel_utils.dose import verdict_line

    row = dict(model="m", heads="L1H1", chosen_alpha=-0.5, shape="peak", removal_delta=0.1, ci_low=0.01,
               ci_high=0.09)
    assert "it beats removal" in verdict_line(R(**row, best_minus_removal=0.05, p_value=ALPHA / 2))
    assert "it loses to removal" in verdict_line(R(**row, best_minus_removal=-0.05, p_value=ALPHA / 2))
    tie = verdict_line(R(**row, best_minus_removal=0.05, p_value=ALPHA))
    assert "it ties with removal" in tie and "beats" not in tie
    assert "removal is the dose" in verdict_line(R(**dict(row, chosen_alpha=0.0), best_minus_removal=0.0, p_value=1))


def test_boost_against_removal_compares_the_two_chosen_sets_on_the_same_items():
    """Planted runs: boost's chosen set right on 30 of 40 held-out items, removal's on 22, the intact model on 20.
    The head-to-head is boost minus removal on the same items, with scipy's binomial test on the items where they
    differ; a pipeline that chose nothing counts as the intact model."""
    from types import SimpleNamespace as NS

    from scipy.stats import binomtest

    from cel_utils.design import Design

    rng = np.random.default_rng(0)
    base = np.zeros(40, bool); base[:20] = True
    boost = base.copy(); boost[20:30] = True
    remove = base.copy(); remove[20:22] = True
    rng.shuffle(idx := np.arange(40))
    base, boost, remove = base[idx], boost[idx], remove[idx]

    def run(correct, name):
        cmp = NS(names=["X", name], results=NS(correct=np.array([~correct, correct])), baseline=NS(correct=base[None]))
        return NS(chosen=lambda: {"heads": name}, heldout_comparison=cmp, design=Design(n_boot=200))

    got = dose.boost_against_removal({"boost": run(boost, "B"), "remove": run(remove, "R")})
    want = binomtest(int((boost & ~remove).sum()), int((boost != remove).sum()), 0.5).pvalue
    assert got["delta"] == pytest.approx(0.2) and got["p_value"] == pytest.approx(want) and got["word"] == "more"
    nothing = NS(chosen=lambda: None, heldout_comparison=None, design=Design(n_boot=200))
    vs_intact = dose.boost_against_removal({"boost": run(boost, "B"), "remove": nothing})
    assert vs_intact["delta"] == pytest.approx(0.25)
    assert dose.boost_against_removal({"boost": nothing, "remove": nothing}) is None


def test_the_versus_sentence_words_the_exact_test_and_puts_each_cost_beside_it():
    import pandas as pd

    costs = pd.DataFrame([{"model": "m", "intervention": k, "heads": "L1H1", "measured on": "general text (1000 tokens)",
                           "change": c, "ci_low": c - 0.1, "ci_high": c + 0.1, "unit": "NLL per token"}
                          for k, c in (("boost", -0.48), ("remove", 1.56))]
                         + [{"model": "m", "intervention": "boost", "heads": "L1H1", "measured on": "addition",
                             "change": 0.0, "ci_low": 0.0, "ci_high": 0.0, "unit": "accuracy"}])
    tie = dose.versus_line("m", {"delta": 0.02, "ci_low": -0.03, "ci_high": 0.07, "p_value": 0.4, "word": "tie"}, costs)
    assert "not shown to differ (a tie on these items)" in tie and "more" not in tie
    assert "boost -0.480 [-0.580, -0.380] nats/token on 1000 tokens; remove +1.560" in tie
    assert "addition" not in tie
    more = dose.versus_line("m", {"delta": 0.1, "ci_low": 0.05, "ci_high": 0.15, "p_value": 0.001, "word": "more"}, costs)
    assert "boosting helps more than removal" in more
