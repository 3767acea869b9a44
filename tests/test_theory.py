import numpy as np
import pytest
from scipy.optimize import minimize

from cel_utils import theory as th


def test_closed_form_optimum_matches_numerical_minimisation():
    W_star, L_star = th.optimum()
    counts = th.DEFAULT.counts

    def f(w_tok):  # unconstrained per-token weights (18 tokens), not per type
        W_types = np.array([w_tok[0], w_tok[1], w_tok[2], 0.0])
        extra = w_tok[3:]
        base = th.joint_loss(W_types, th.DEFAULT)
        # distractors each with their own weight: signal 0, noise w^2 per task
        return base + (extra ** 2).sum()

    r = minimize(f, np.zeros(3 + int(counts[3])), method="BFGS", options={"gtol": 1e-10})
    assert r.fun == pytest.approx(L_star, abs=1e-8)
    assert np.allclose(r.x[:3], W_star[:3], atol=1e-5)
    assert L_star == pytest.approx(0.758, abs=1e-3)
    assert W_star[2] == pytest.approx(-0.212, abs=1e-3)
    wa, _ = th.optimum(rho_tasks=[th.DEFAULT.rho[0]])
    wb, _ = th.optimum(rho_tasks=[th.DEFAULT.rho[1]])
    assert wa[2] > 0 > W_star[2] > wb[2]  # the conflict: A wants +C, B wants -C, the joint optimum sides with B


def test_one_head_cannot_reach_optimum():
    _, L_star = th.optimum()
    assert th.best_single_head_loss(restarts=8) - L_star == pytest.approx(0.042, abs=3e-3)


def test_literal_attention_agrees_with_effective_weights():
    rng = np.random.default_rng(1)
    H = 3
    a, b, theta = rng.normal(size=H), rng.normal(size=H), rng.normal(size=(H, 4))
    import torch

    counts = torch.tensor(th.DEFAULT.counts)
    att = th.head_attention(torch.tensor(theta), counts).numpy()  # [head, type] per-token weights
    W = (a * b)[:, None] * att
    W = W.sum(0)
    for task in (0, 1):
        types, z, y = th.sample_sequences(20000, task, seed=task)
        f_literal = th.attention_forward(a, b, theta, types, z)
        f_eff = (W[types] * z).sum(-1)
        assert np.allclose(f_literal, f_eff, atol=1e-10)
        # the finite-sample loss agrees with the population form
        emp = np.mean((f_literal - y) ** 2)
        pop = th.task_loss(W, th.DEFAULT.rho[task], th.DEFAULT.counts)
        assert emp == pytest.approx(pop, rel=0.05)
        acc = np.mean(np.sign(f_literal) == y)
        assert acc == pytest.approx(th.task_accuracy(W, th.DEFAULT.rho[task], th.DEFAULT.counts), abs=0.015)


@pytest.fixture(scope="module")
def trained():
    return th.run(n_heads=4, sigma=1e-4, seed=0, steps=4000)


def test_training_reaches_optimum_and_concentrates_c(trained):
    assert trained.gap < 1e-8
    assert trained.c_share > 0.9
    assert trained.n_c_carriers[0] == 1


def test_ablating_c_head_helps_a_hurts_b(trained):
    abl = trained.ablation()
    c = trained.c_heads[0]
    row = abl[c]
    assert row["delta_loss_a"] < -0.1 and row["delta_acc_a"] > 0.05
    assert row["delta_loss_b"] > 0.1 and row["delta_acc_b"] < -0.05
    others = [r for r in abl if r["head"] != c]
    assert all(r["delta_loss_a"] > -1e-3 for r in others)  # no other head's removal helps A


def test_saddle_to_saddle_plateau(trained):
    """The loss passes near the best single-head loss before reaching the optimum."""
    single = th.best_single_head_loss(restarts=8)
    loss = trained.history["loss"][:, 0]
    near = np.abs(loss - single) < 0.01
    assert near.sum() >= 3  # several recorded steps on the plateau
    assert loss[-1] < single - 0.03


def test_negative_control_scalar_values_spread():
    r = th.train(n_heads=4, sigma=1e-4, seeds=range(6), steps=4000, value="scalar", record_every=4000)
    f = th.train(n_heads=4, sigma=1e-4, seeds=range(6), steps=4000, record_every=4000)
    assert r.gaps.max() < 1e-6
    assert r.c_shares.mean() < f.c_shares.mean() - 0.2


def test_negative_control_weak_conflict():
    W, _ = th.optimum(th.WEAK_CONFLICT)
    assert W[2] > 0
    r = th.run(n_heads=4, sigma=1e-4, seed=0, steps=4000, setup=th.WEAK_CONFLICT)
    # one head learns everything (A, B and C agree in sign); the others keep only tiny residual weights
    # (W_D -> 0 needs theta_D -> -inf, approached slowly), whose removal changes A's loss by < 0.005,
    # against -0.19 for the C-head of the conflicting setup.
    assert all(x["delta_loss_a"] > -5e-3 for x in r.ablation())
    assert max(x["delta_loss_a"] for x in r.ablation()) > 0.3  # removing the one working head hurts A


def test_sweep_small():
    df = th.sweep(sigmas=(1e-4, 1.0), heads=(2,), n_seeds=3, steps=1500)
    assert list(df.columns[:3]) == ["heads", "sigma", "runs"] and len(df) == 2
    assert df.c_share.between(0, 1).all()


def test_factored_query_key_variant():
    """Query and key weights factored (theta = q . k): works when the key-query scale starts larger."""
    r = th.run(n_heads=4, sigma=1e-4, seed=0, steps=4000, qk="factored", qk_scale=0.3)
    assert r.gap < 1e-4
    assert r.c_share > 0.8


def test_cli_theory_json(tmp_path):
    import json

    from cel_utils.cli import main

    out = tmp_path / "theory.json"
    assert main(["theory", "--heads", "3", "--sigma", "1e-4", "--seed", "1", "--steps", "3000", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    for k in ("gap", "c_share", "c_head", "ablation"):
        assert k in d
    assert len(d["ablation"]) == 3
    assert set(d["ablation"][0]) >= {"head", "delta_loss_a", "delta_loss_b", "delta_acc_a", "delta_acc_b"}
    assert d["ablation"][d["c_head"]]["delta_loss_a"] < 0
