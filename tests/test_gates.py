"""Learned head gates (cel_utils.gates) on tiny models with planted heads: the relaxation against Monte Carlo, the
ranking, a single helpful head at k = 1, the penalty, determinism, and a closed gate as an ablated head. The gates'
sets through the pipeline and beside the other selectors: tests/test_selectors.py and tests/test_comparison.py."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from cel_utils.ablation import all_heads
from cel_utils.gates import GateSettings, expected_gate, learn_gates, prob_kept, prob_removed, sample_gates
from cel_utils.tiny import HARMFUL_HEAD, PAIR_HEADS


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


