"""Learned head gates (cel_utils.gates) on tiny models with planted heads: the relaxation against Monte Carlo, a
helpful pair the pool search cannot see, a single helpful head at k = 1, never reading the confirm or held-out
items, the pipeline's statistics against the oracles, and the ``cel search --strategy gates`` contract."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from cel_utils.ablation import all_heads, format_set, head_name
from cel_utils.cli import main
from cel_utils.gates import (SELECTORS, GateSettings, compare_selectors, expected_gate, gate_pipeline, learn_gates,
                             prob_kept, prob_removed, sample_gates)
from cel_utils.tasks import SPLITS, Task
from cel_utils.tiny import HARMFUL_HEAD, PAIR_HEADS, harm_items, harmful_head_model, pair_heads_model
from tests.oracles import bh_q, holm_p, mcnemar_p


def _splits(items, name="planted"):
    return {s: Task(name, "mc", [dict(it) for it in items if it["split"] == s], split=s) for s in SPLITS}


@pytest.fixture(scope="module")
def pair():
    """A tiny Llama whose two heads PAIR_HEADS each do nothing alone and together turn every item wrong."""
    items = harm_items()
    return pair_heads_model(items), _splits(items)


@pytest.fixture(scope="module")
def harmful():
    items = harm_items()
    return harmful_head_model(items), _splits(items)


@pytest.mark.parametrize("beta", [2 / 3, 0.3])
def test_the_relaxation_matches_a_monte_carlo_estimate(beta):
    """The sampler used in training against the closed forms the penalty and the records use: the share of
    samples exactly 0 is P(removed), exactly 1 is P(kept), and their mean is E[gate] (to 4.5 standard errors)."""
    log_alpha = torch.tensor([-3.0, -1.0, 0.0, 0.7, 2.5])
    n = 200_000
    u = torch.rand((n, len(log_alpha)), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    g = sample_gates(log_alpha.double()[None], u.clamp(1e-12, 1 - 1e-12), beta).numpy()   # [n, 5]
    la = log_alpha.numpy()
    for got, want in ((g == 0).mean(0), prob_removed(la, beta)), ((g == 1).mean(0), prob_kept(la, beta)):
        se = np.sqrt(want * (1 - want) / n)
        assert np.all(np.abs(got - want) < 4.5 * se), (got, want)
    se = g.std(0) / np.sqrt(n)
    assert np.all(np.abs(g.mean(0) - expected_gate(la, beta)) < 4.5 * se)
    # the torch and numpy closed forms agree, and the penalty's gradient points the right way
    t = log_alpha.clone().requires_grad_(True)
    prob_removed(t, beta).sum().backward()
    assert np.allclose(prob_removed(t, beta).detach().numpy(), prob_removed(la, beta)) and (t.grad < 0).all()


def test_gates_find_a_pair_whose_members_do_nothing_alone(pair):
    """Removing either planted head alone changes no answer (and lowers the margin, so the single-head screen
    ranks both last: no pool of the top screened heads holds them); removing both turns every item right. Pool
    search, top-k, and the gradient screen find nothing; the gates, over all heads, find the pair at k = 2."""
    lm, splits = pair
    res = compare_selectors(lm, splits, max_k=3, pool_size=10, random_sets=2, compressed=False, progress=False,
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


def test_ranking_follows_the_push_not_its_noise(pair):
    """Started near 1 (log_alpha 2), the pair's gates see only that removing one head lowers the margin, so they
    are pushed up, harder than the penalty pushes the heads the task ignores: they rank last. (Adam with one second
    moment per gate would move every gate about lr per step and rank the pair's noisier gates first.)"""
    lm, splits = pair
    lg = learn_gates(lm, splits["search"], GateSettings(inits=(2.0,), max_k=2, progress=False))
    assert set(lg.ranking()[-2:]) == set(PAIR_HEADS)


def test_gates_pick_a_single_planted_head_at_k1(harmful):
    """One head whose removal turns every item right, every other near-silent: the gates' set of size 1 is it."""
    lm, splits = harmful
    lg = learn_gates(lm, splits["search"], GateSettings(max_k=3, progress=False))
    assert lg.sets[1] == [HARMFUL_HEAD]
    assert lg.ranking()[0] == HARMFUL_HEAD and all(HARMFUL_HEAD in lg.sets[k] for k in (1, 2, 3))
    # the loss curve: one row per step, loss = -mean margin + penalty x expected heads removed (before the step)
    assert lg.inits == list(lg.settings.inits) and len(lg.inits) == 2   # the default: two starting points
    for run, c in lg.curve.groupby("run"):
        assert list(c["step"]) == list(range(lg.settings.steps)) and c["loss"].iloc[-1] < c["loss"].iloc[0]
        assert (c["init"] == lg.inits[run]).all()


def test_the_penalty_trades_heads_for_margin(harmful):
    """A penalty per head larger than what removing the planted head gains keeps every head (the expected number
    removed falls); the default penalty lets the planted head go. A sweep runs both and keeps, at each size, the
    candidate that scores best on the search split."""
    lm, splits = harmful
    s = GateSettings(steps=15, inits=(0.0,), max_k=2, progress=False)
    i = all_heads(lm).index(HARMFUL_HEAD)
    small, large = (learn_gates(lm, splits["search"], replace(s, penalties=(p,))) for p in (0.05, 100.0))
    assert prob_removed(small.log_alpha[0, i]) > 0.9 > 0.1 > prob_removed(large.log_alpha[0, i])
    assert large.curve["expected_removed"].iloc[-1] < 0.5 * large.curve["expected_removed"].iloc[0]
    sweep = learn_gates(lm, splits["search"], replace(s, penalties=(100.0, 0.05)))
    assert np.array_equal(sweep.log_alpha, np.stack([large.log_alpha[0], small.log_alpha[0]]))
    assert sweep.sets[1] == [HARMFUL_HEAD] and sweep.curve.groupby("run").size().tolist() == [15, 15]
    assert sweep.forward_equivalents > small.forward_equivalents + large.forward_equivalents  # + the candidates


def test_learning_is_deterministic_for_a_seed(harmful):
    lm, splits = harmful
    s = GateSettings(steps=4, inits=(0.0,), max_k=2, batch_size=8, progress=False)
    a, b = (learn_gates(lm, splits["search"], s) for _ in range(2))
    c = learn_gates(lm, splits["search"], replace(s, seed=1))
    assert np.array_equal(a.log_alpha, b.log_alpha) and a.curve.equals(b.curve)
    assert not np.array_equal(a.log_alpha, c.log_alpha)
    assert a.forward_equivalents == pytest.approx(4 * 3.0 * 8 / 20)   # 4 steps, forward + backward, 8 of 20 items


def _poisoned(split: Task) -> Task:
    """Every answer flipped and every prompt scrambled: a gate learned from these items would differ."""
    items = [{**it, "prompt": it["prompt"][::-1] + "zz:", "answer": 1 - it["answer"]} for it in split.items]
    return replace(split, items=items)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_gates_never_read_the_confirm_or_heldout_items(pair, mode):
    """The same gates, sets and search figures with the confirm and held-out splits poisoned; the confirm and
    held-out baselines change (those splits are read, to grade). Mean ablation: head means from the search split."""
    lm, splits = pair
    s = GateSettings(steps=6, max_k=2, random_sets=1, mode=mode, progress=False, n_boot=100)
    clean = gate_pipeline(lm, splits, s)
    bad = gate_pipeline(lm, {**splits, "confirm": _poisoned(splits["confirm"]),
                             "heldout": _poisoned(splits["heldout"])}, s)
    assert np.array_equal(clean.gates.log_alpha, bad.gates.log_alpha) and clean.gates.sets == bad.gates.sets
    assert clean.sets["search_delta_accuracy"].tolist() == bad.sets["search_delta_accuracy"].tolist()
    for col in ("confirm_baseline", "heldout_baseline"):   # the poisoned splits were read, to grade
        assert clean.sets[col].iloc[0] != bad.sets[col].iloc[0]


def test_pipeline_statistics_match_the_oracles(pair):
    """Confirm: exact McNemar and BH over the sizes offered; held-out: exact McNemar and Holm over the sizes; the
    chosen set is the confirmed one with the largest confirm gain; the control's percentile is in [0, 100]."""
    from cel_utils.engine import evaluate_head_sets
    from cel_utils.scoring import encode_task

    lm, splits = pair
    gp = gate_pipeline(lm, splits, GateSettings(max_k=3, random_sets=2, progress=False, n_boot=200))
    sets = [gp.gates.sets[k] for k in (1, 2, 3)]
    assert gp.sets["heads"].tolist() == [format_set(x) for x in sets] and gp.sets["size"].tolist() == [1, 2, 3]
    for split, p_col, adj, oracle in (("confirm", "confirm_p_value", "confirm_q_value", bh_q),
                                      ("heldout", "p_value", "p_holm", holm_p)):
        r = evaluate_head_sets(lm, encode_task(lm, splits[split]), [[]] + sets, progress=False, result_cache=False)
        base, abl = r.correct[0], r.correct[1:]
        fixes, breaks = (~base & abl).sum(1), (base & ~abl).sum(1)
        p = [mcnemar_p(f, b) for f, b in zip(fixes, breaks)]
        assert gp.sets[p_col].to_numpy() == pytest.approx(p) and gp.sets[adj].to_numpy() == pytest.approx(oracle(p))
    ok = gp.sets[gp.sets.confirmed]
    assert gp.chosen()["heads"] == ok.loc[ok.confirm_delta_accuracy.idxmax(), "heads"]
    assert len(gp.control) == 2 and 0 <= gp.control_percentile() <= 100
    rec = json.loads(json.dumps(gp.record()))
    assert rec["chosen"] == gp.chosen()["heads"]
    assert len(rec["gates"]["values"]) == len(all_heads(lm)) * len(gp.gates.inits)   # a row per head and run


def test_the_choice_never_reads_the_heldout_split():
    """The chosen learned set is the confirmed one with the largest confirm gain, whatever the held-out figures;
    the control's percentile places the chosen set's held-out gain among the random rankings' pipelines."""
    import pandas as pd

    from cel_utils.gates import GatePipeline

    sets = pd.DataFrame({"heads": ["A", "A+B", "A+B+C"], "size": [1, 2, 3], "confirmed": [True, True, False],
                         "confirm_delta_accuracy": [0.05, 0.10, 0.30], "heldout_delta_accuracy": [0.4, 0.0, 0.5]})
    gp = GatePipeline(model="m", task="t", gates=None, sets=sets, heldout=None, control_heldout=None,
                      control_sets=[], n_search=1, n_confirm=1, n_heldout=1,
                      control=pd.DataFrame({"heldout_delta_accuracy": [-0.1, 0.0, 0.1]}))
    assert gp.chosen()["heads"] == "A+B" and gp.chosen_gain() == 0.0 and gp.control_percentile() == 50.0
    none = GatePipeline(**{**gp.__dict__, "sets": sets.assign(confirmed=False)})
    assert none.chosen() is None and none.chosen_gain() == 0.0


def test_the_control_chooses_as_the_pipeline_does():
    """A random ranking's sets go through the same rule: BH-confirmed on the confirm items, the largest confirm
    gain chosen, its held-out gain reported (0 when nothing is confirmed)."""
    from cel_utils.gates import confirm_choose

    base = np.zeros(30, bool)
    rows = np.stack([np.arange(30) < 12, np.arange(30) < 20, np.arange(30) < 1])   # confirm gains .4, .67, .03
    assert confirm_choose(base, rows, np.array([0.5, 0.1, 0.9]), fdr=0.1) == (1, 0.1)
    assert confirm_choose(base, rows[2:], np.array([0.9]), fdr=0.1) == (None, 0.0)


def test_selector_table_and_areas(pair):
    """Every selector at every k; each area is the mean of its curve, inside its bootstrap CI; costs recorded."""
    lm, splits = pair
    res = compare_selectors(lm, splits, max_k=2, pool_size=3, random_sets=2, compressed=True, compressed_evals=12,
                            progress=False, n_boot=200)
    assert res.table.groupby("selector", sort=False).size().to_dict() == {s: 2 for s in SELECTORS}
    for r in res.summary.itertuples():
        curve = res.table[res.table.selector == r.selector]["heldout_delta_accuracy"]
        assert r.area == pytest.approx(curve.mean())
        assert r.area_ci_low - 1e-12 <= r.area <= r.area_ci_high + 1e-12
    s = res.summary.set_index("selector")
    assert s.loc["pool search", "area_vs_pool"] == 0 and s.loc["random", "forward_equivalents"] == 0
    assert s.loc["gradient", "forward_equivalents"] == 3.0 and s.loc["compressed sensing", "n_evaluations"] == 12
    assert (s.drop("random")["seconds"] > 0).all()
    json.dumps(res.record())
    with pytest.raises(ValueError, match="pool_size at least max_k"):
        compare_selectors(lm, splits, max_k=4, pool_size=3)


# ---- cel search --strategy gates -------------------------------------------------------------------------------
def test_cel_search_gates_contract(harmful_folder, tmp_path, capsys):
    """The JSON has the pool strategies' fields (same shape) plus the gate values and the loss curve; the planted
    harmful head is the set of size 1."""
    model, task = harmful_folder
    outs = {}
    for strategy, extra in (("exhaustive", ["--pool", "3"]), ("gates", ["--gate-steps", "8"])):
        out = tmp_path / f"{strategy}.json"
        assert main(["search", "--model", model, "--task", task, "--n", "12", "--max-size", "2", "--strategy",
                     strategy, "--random-sets", "3", "--out", str(out), *extra]) == 0
        outs[strategy] = json.loads(out.read_text())
    g, ex = outs["gates"], outs["exhaustive"]
    assert set(g) == set(ex) | {"gates"}
    assert set(g["best"][0]) == set(ex["best"][0]) and set(g["best"][0]["heldout"]) == set(ex["best"][0]["heldout"])
    assert g["strategy"] == "gates" and g["n_evaluations"] == 16 and len(g["pool"]) == 12   # 8 steps x 2 starts
    assert [b["size"] for b in g["best"]] == [1, 2] and g["best"][0]["heads"] == [head_name(HARMFUL_HEAD)]
    assert g["best"][0]["search"]["delta_accuracy"] == pytest.approx(1.0)
    assert len(g["gates"]["values"]) == 24 and len(g["gates"]["loss_curve"]) == 16
    assert [s["heads"] for s in g["gates"]["sets"]] == [b["heads"] for b in g["best"]]
    assert g["gates"]["settings"]["steps"] == 8
    assert [len(c["heldout_delta_accuracy"]) for c in g["random_control"]] == [3, 3]


@pytest.mark.parametrize("argv, msg", [
    (["--strategy", "gates", "--pool", "4"], "leave out --screen and --pool"),
    (["--strategy", "gates", "--screen", "s.json"], "leave out --screen and --pool"),
    (["--strategy", "greedy", "--gate-steps", "5"], "--gate-steps only apply to --strategy gates"),
    (["--gate-penalty", "0.1"], "--gate-penalty only apply to --strategy gates"),
    (["--strategy", "gates", "--gate-steps", "0"], "must be at least 1"),
    (["--strategy", "gates", "--gate-penalty", "abc"], "--gate-penalty takes numbers separated by commas"),
    (["--strategy", "gates", "--gate-penalty", "0.1,-1"], "penalties must be a non-empty list of numbers >= 0"),
])
def test_cel_search_gates_rejects_bad_options_before_loading(argv, msg, tmp_path, capsys, monkeypatch):
    from cel_utils import models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(models, "load_model", refuse)
    out = tmp_path / "x.json"
    code = main(["search", "--model", "smollm2-135m", "--task", "agreement", "--n", "4", *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out.exists(), err


def test_cel_search_gates_too_many_heads(harmful_folder, tmp_path, capsys):
    model, task = harmful_folder
    out = tmp_path / "x.json"
    code = main(["search", "--model", model, "--task", task, "--n", "4", "--strategy", "gates", "--max-size", "13",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "max_k = 13 but the model has only 12 heads" in err and not out.exists(), err


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_a_closed_gate_is_an_ablated_head_in_every_family(tiny, mode):
    """Gates fixed at 0 for a head set and 1 elsewhere give the engine's per-item results for that set removed
    (zero or mean ablation), in every supported family; all gates at 1 give the unablated model."""
    from cel_utils.ablation import Ablation
    from cel_utils.engine import evaluate_head_sets, read_stats_with
    from cel_utils.gates import gate_points
    from cel_utils.scoring import aggregate, encode_task
    from cel_utils.tasks import load_task

    enc = encode_task(tiny, load_task("agreement", n=6))
    ablation = Ablation.of(mode).resolved(tiny, enc.inputs)
    heads = [(0, 1), (tiny.n_layers - 1, 2)]
    want = evaluate_head_sets(tiny, enc, [heads, []], mode=ablation, progress=False, result_cache=False)
    for j, removed in enumerate((heads, [])):
        mask = torch.ones(tiny.n_layers, tiny.n_heads)
        for l, h in removed:
            mask[l, h] = 0.0
        lp, gap = read_stats_with(tiny, enc, lambda seqs: gate_points(tiny, lambda l: mask[l], ablation))
        got = aggregate(enc, lp[None], gap[None])
        assert np.allclose(got.margin[0], want.margin[j], atol=1e-4) and (got.correct[0] == want.correct[j]).all()


def test_pool_search_reads_chapter_2s_sweep_and_chooses_as_it_does(pair, monkeypatch):
    """compare_selectors' pool search sweeps every subset of the pool in joint_search's order, so the sweep
    joint_search made is read back from the result cache (no new forward), and it chooses at each size the set
    joint_search's exhaustive search chose (the same scores: accuracy plus the margin tie-break)."""
    from cel_utils import gates
    from cel_utils.joint import joint_search
    from cel_utils.screening import screen

    lm, splits = pair
    sc = screen(lm, splits["search"], progress=False)
    pool = [(int(r.layer), int(r.head_index)) for r in sc.top(3).itertuples()]
    js = joint_search(lm, splits["search"], splits["confirm"], splits["heldout"], pool, max_size=2, random_sets=2,
                      random_pools=0, progress=False)
    first = []
    real = gates.compare_sets

    def spy(*a, **k):
        cmp = real(*a, **k)
        first.append(bool(cmp.baseline.cached))
        return cmp

    monkeypatch.setattr(gates, "compare_sets", spy)
    res = compare_selectors(lm, splits, max_k=2, pool_size=3, screen_result=sc, random_sets=1, compressed=False,
                            progress=False, n_boot=100)
    assert first[0], "the pool sweep was evaluated again"
    chosen = res.table[res.table.selector == "pool search"].set_index("k")["heads"]
    want = js.strategies[js.strategies.strategy == "exhaustive"].set_index("size")["heads"]
    assert [chosen[k] for k in (1, 2)] == [want[k] for k in (1, 2)]


def test_pool_search_beyond_the_sweep_is_a_beam_search(pair, monkeypatch):
    """A pool with more subsets than SELECTOR_SWEEP_MAX is searched by chapter 2's beam search with the same score:
    a beam wider than any size's candidates evaluates every subset, so it chooses what the exhaustive sweep
    chose at the same counted cost; a beam of width 1 evaluates 1 + 5 + 4 + 3 sets on a pool of 5 (by hand)."""
    from cel_utils import gates

    lm, splits = pair
    kw = dict(max_k=3, pool_size=5, random_sets=1, compressed=False, progress=False, n_boot=100,
              gate_settings=GateSettings(steps=2, inits=(0.0,)))
    swept = compare_selectors(lm, splits, **kw)
    monkeypatch.setattr(gates, "SELECTOR_SWEEP_MAX", 0)
    wide = compare_selectors(lm, splits, beam_width=100, **kw)
    narrow = compare_selectors(lm, splits, beam_width=1, **kw)

    def pool_search(r):
        s = r.summary.set_index("selector").loc["pool search"]
        return (r.table[r.table.selector == "pool search"]["heads"].tolist(), s.forward_equivalents,
                s.n_evaluations)

    assert pool_search(wide) == pool_search(swept)
    n_screen = len(all_heads(lm))
    assert pool_search(swept)[2] == n_screen + 1 + 5 + 10 + 10 and pool_search(narrow)[2] == n_screen + 1 + 5 + 4 + 3
    assert pool_search(narrow)[1] < pool_search(wide)[1]
    with pytest.raises(Exception, match="beam_width must be at least 1"):
        compare_selectors(lm, splits, beam_width=0, **kw)


def test_selectors_grade_in_the_dtype_asked_and_learn_in_the_models(pair):
    """dtype="bfloat16": every set is graded by the bfloat16 copy of the model (each selector's held-out change in
    mean margin equals a separate evaluation of that set by cast(lm, "bfloat16"), and differs from float32's),
    while the gates learn in the model's own float32 (the same log-alphas as with no dtype)."""
    from cel_utils.ablation import parse_set
    from cel_utils.engine import evaluate_head_sets
    from cel_utils.models import cast
    from cel_utils.scoring import encode_task

    lm, splits = pair
    kw = dict(max_k=2, pool_size=3, random_sets=1, compressed=False, progress=False, n_boot=100,
              gate_settings=GateSettings(steps=3))
    f32 = compare_selectors(lm, splits, **kw)
    b16 = compare_selectors(lm, splits, dtype="bfloat16", **kw)
    assert np.array_equal(f32.pipeline.gates.log_alpha, b16.pipeline.gates.log_alpha)
    enc = encode_task(lm, splits["heldout"])
    got = {}
    for name, res, model in (("f32", f32, lm), ("b16", b16, cast(lm, "bfloat16"))):
        t = res.table[res.table.selector != "random"]
        r = evaluate_head_sets(model, enc, [[]] + [parse_set(h) for h in t["heads"]], progress=False)
        got[name] = t["heldout_delta_margin"].to_numpy()
        assert np.allclose(got[name], r.mean_margin[1:] - r.mean_margin[0], atol=1e-5), name
    assert not np.allclose(got["f32"], got["b16"], atol=1e-5)
    assert b16.pipeline.gates.settings.eval_dtype == "bfloat16"
