import numpy as np
import pytest
from scipy.optimize import minimize

from cel_utils import theory as th
from tests.oracles import holm_p


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


def test_negative_control_weak_conflict():
    W, _ = th.optimum(th.WEAK_CONFLICT)
    assert W[2] > 0
    r = th.run(n_heads=4, sigma=1e-4, seed=0, steps=4000, setup=th.WEAK_CONFLICT)
    # one head learns everything (A, B and C agree in sign); the others keep only tiny residual weights
    # (W_D -> 0 needs theta_D -> -inf, approached slowly), whose removal changes A's loss by < 0.005,
    # against -0.19 for the C-head of the conflicting setup.
    assert all(x["delta_loss_a"] > -5e-3 for x in r.ablation())
    assert max(x["delta_loss_a"] for x in r.ablation()) > 0.3  # removing the one working head hurts A


def test_sweep_records_the_effect_not_only_its_concentration():
    """The sweep's per-cell effect equals the ablations of the same runs trained one at a time (a second path:
    separate runs instead of one vectorised batch, ablation read from Run.ablation)."""
    df = th.sweep(sigmas=(1e-2, 1.0), heads=(2,), n_seeds=2, steps=1500)
    assert {"best_dloss_a", "best_dacc_a", "runner_up_dloss_a", "best_dloss_a_min", "best_dloss_a_max"} <= set(df)
    for sig in (1e-2, 1.0):
        best = [min(x["delta_loss_a"] for x in th.run(n_heads=2, sigma=sig, seed=k, steps=1500).ablation())
                for k in range(2)]
        row = df[df.sigma == sig].iloc[0]
        assert row.best_dloss_a == pytest.approx(np.mean(best), abs=1e-9)
        assert row.best_dloss_a_min == pytest.approx(min(best), abs=1e-9)
        assert row.runs_helped == sum(b < -th.THEORY_EFFECT for b in best)


def test_controls_measure_the_effect():
    """What each control does to the effect itself (the chapter's sentences follow these numbers): the weak
    conflict removes it; one value scalar per head keeps it but spreads it over heads; large initialization
    spreads the feature and keeps an effect; the model keeps it in one head."""
    c = th.controls(n_heads=4, sigma=1e-4, seeds=range(4), steps=4000).set_index("control")
    model, large = c.loc["the model (factored values, small init)"], c.loc["large initialization (sigma = 1)"]
    scalar, weak = c.loc["(a) one value scalar per head"], c.loc["(b) weak conflict"]
    assert weak.best_dloss_a_min > -1e-3 and weak.W_star_C > 0
    assert weak.runs_helped == 0 and model.runs_helped == model.runs   # tiny residual changes do not count
    assert model.best_dloss_a_max < -0.15 and model.runner_up_dloss_a_min > -0.01
    assert scalar.best_dloss_a_max < -0.15 and scalar.runner_up_dloss_a_min < -0.05
    assert large.c_share < model.c_share - 0.1 and large.best_dloss_a < -0.05
    assert "sits in one head" in th.describe_effect(model)
    assert "shared" in th.describe_effect(scalar)
    assert "no head's removal helps task A" in th.describe_effect(weak)


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
    # the early phase, as chapter 3 derives it: the predictions from the initial weights by hand (the winner has
    # the largest |a + b|; the C-carrier the largest |a - b| among the others), the plateau from the phase times
    from cel_utils.theory import init_params

    e = d["early_phase"]
    p0 = init_params(1, 3, 1e-4, seed=1)
    a0, b0 = p0.a[0].numpy(), p0.b[0].numpy()
    winner = int(np.argmax(np.abs(a0 + b0)))
    others = [h for h in range(3) if h != winner]
    assert e["predicted_winner"] == winner
    assert e["predicted_c_carrier"] == others[int(np.argmax(np.abs(a0 - b0)[others]))]
    assert e["c_carrier"] == d["c_head"]
    assert e["plateau_length"] == e["plateau_end_step"] - e["escape_step"] > 0
    assert e["predicted_plateau_length"] == pytest.approx(e["rates"]["slope_plateau"] * np.log(1e4))


# ----------------------------------------------------------------------------------------------
# The early phase (cel_utils.dynamics), against hand computations and the simulation
# ----------------------------------------------------------------------------------------------
from cel_utils import dynamics as dyn  # noqa: E402


def test_rates_by_hand():
    """r and mu written out from the correlations (18 tokens; the plateau W = (0.4, 0.2, 0, 0))."""
    r_hand = (0.8 + 0.4 + (0.5 - 0.8) + 15 * 0.0) / 18
    # at W_pl: s_A = 0.8 * 0.4, s_B = 0.4 * 0.2; dL/dW_C = -(1 - s_A) * 0.5 - (1 - s_B) * (-0.8), one C token
    mu_hand = (-(1 - 0.32) * 0.5 + (1 - 0.08) * 0.8) / 18
    r = dyn.rates(lr=0.5)
    assert r["r"] == pytest.approx(r_hand, abs=1e-12) and r["mu"] == pytest.approx(mu_hand, abs=1e-12)
    assert r["slope_escape"] == pytest.approx(1 / np.log(1 + 0.5 * r_hand), rel=1e-12)
    lam1, lamd, lam2 = np.log(1 + 0.5 * r_hand), -np.log(1 - 0.5 * r_hand), np.log(1 + 0.5 * mu_hand)
    assert r["slope_plateau"] == pytest.approx((1 + lamd / lam1) / lam2, rel=1e-12)


def test_loss_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    for _ in range(3):
        W = rng.normal(size=4) * 0.3
        num = np.array([(th.joint_loss(W + e, th.DEFAULT) - th.joint_loss(W - e, th.DEFAULT)) / 2e-6
                        for e in np.eye(4) * 1e-6])
        assert np.allclose(dyn.loss_gradient(W), num, atol=1e-6)


def test_plateau_is_the_best_single_head_and_a_saddle_along_c():
    W, L = dyn.plateau()
    assert L == pytest.approx(th.best_single_head_loss(restarts=8), abs=1e-7)   # numerical, independent
    assert np.allclose(W, [0.4, 0.2, 0, 0])
    g = dyn.loss_gradient(W)
    assert np.allclose(g[[0, 1, 3]], 0, atol=1e-12) and g[2] > 0.3


def test_linear_maps_hold_near_the_origin():
    """Gradient descent itself (autograd on the model) multiplies every head's a+b by (1 + lr r) per step and
    a-b by (1 - lr r) while the weights are tiny."""
    run = th.train(n_heads=3, sigma=1e-7, seeds=(0, 1), steps=100, record_every=100)
    r = dyn.rates(lr=0.5)["r"]
    a, b = run.history["a"], run.history["b"]   # [record, runs, head]
    s_ratio = (a[-1] + b[-1]) / (a[0] + b[0])
    d_ratio = (a[-1] - b[-1]) / (a[0] - b[0])
    assert np.allclose(s_ratio, (1 + 0.5 * r) ** 100, rtol=1e-6)
    assert np.allclose(d_ratio, (1 - 0.5 * r) ** 100, rtol=1e-6)


def test_predict_heads_by_hand():
    a0 = np.array([[0.1, -0.3, 0.2, 0.05]])
    b0 = np.array([[0.1, -0.2, -0.3, 0.4]])
    # |a+b| = .2 .5 .1 .45 -> winner 1; |a-b| among the rest = 0 (h0), .5 (h2), .35 (h3) -> carrier 2
    w, c = dyn.predict_heads(a0, b0)
    assert w.tolist() == [1] and c.tolist() == [2]
    assert dyn.carrier_margin(a0, b0)[0] == pytest.approx(0.5 / 0.35)


@pytest.fixture(scope="module")
def early():
    return dyn.early_phase(sigmas=(1e-6, 1e-4, 1e-2), n_seeds=12, steps=3500)


def test_early_phase_predictions_against_the_simulation(early):
    chk = dyn.check(early).set_index("prediction")
    esc = chk.iloc[0]
    assert esc.ci_low <= esc.predicted <= esc.ci_high and abs(esc.measured / esc.predicted - 1) < 0.05
    pla = chk.iloc[1]
    # plateaus are shorter than the sigma -> 0 prediction at these scales, by less than a third
    assert 0.67 * pla.predicted < pla.measured < pla.predicted
    win, car = chk.iloc[2], chk.iloc[3]
    assert win.measured >= 0.9 and car.measured >= 0.7 and car.p_value < 1e-6
    ok = early.dropna(subset=["plateau_rate"])
    assert (ok.plateau_rate > dyn.rates()["lambda_2"]).all()
    assert np.allclose(ok.plateau_rate_at_w, ok.plateau_rate, rtol=0.03)


def test_tradeoff_against_a_hand_count():
    """Fisher's exact test, one-sided, recomputed from the hypergeometric distribution; Holm by hand."""
    import pandas as pd
    from scipy.stats import hypergeom

    from cel_utils.landscape import tradeoff

    heads = [f"L0H{i}" for i in range(8)]
    a = [0.5, 0.4, 0.3, 0.2, 0.1, 0.05, -0.1, -0.2]   # six heads help A
    b = [-0.3, -0.2, -0.1, 0.2, 0.1, 0.3, -0.4, 0.1]  # confirmed L0H0-2 all hurt B; 0 of 3 other helpers do
    land = pd.DataFrame([{"model": "m", "task": t, "head": h, "delta_margin": v}
                         for t, vals in (("A", a), ("B", b)) for h, v in zip(heads, vals)])
    points, tests = tradeoff(land, {("m", "A"): ["L0H0", "L0H1", "L0H2"], ("m", "B"): ["L0H3", "L0H0"]})
    ab = tests[(tests.task_a == "A")].iloc[0]
    assert (ab.help_a, ab.confirmed, ab.confirmed_hurt_b, ab.others_help_a, ab.others_hurt_b) == (6, 3, 3, 3, 0)
    # P(X >= 3), X ~ hypergeom(6 helpers, 3 hurt B in total, 3 confirmed drawn)
    assert ab.p_value == pytest.approx(hypergeom.sf(2, 6, 3, 3))
    ba = tests[(tests.task_a == "B")].iloc[0]
    # heads helping B: L0H3, L0H4, L0H5, L0H7 (L0H0 does not help B, so it is not counted); the confirmed
    # L0H3 does not hurt A (a = 0.2); of the other three, L0H7 hurts A (a = -0.2)
    assert (ba.help_a, ba.confirmed, ba.confirmed_hurt_b, ba.others_help_a, ba.others_hurt_b) == (4, 1, 0, 3, 1)
    assert ba.p_value == pytest.approx(hypergeom.sf(-1, 4, 1, 1))   # P(X >= 0) = 1
    assert [ab.p_holm, ba.p_holm] == pytest.approx(holm_p([ab.p_value, ba.p_value]))
    assert len(points) == 16 and points[points.task_a == "A"].confirmed.sum() == 3
