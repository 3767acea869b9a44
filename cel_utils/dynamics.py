"""The early phase of chapter 3's toy model, derived and checked against the simulation.

From small initialization training goes origin -> plateau -> optimum (saddle to saddle). Write each head's
value as ``v_h = a_h b_h = (s_h^2 - d_h^2) / 4`` with ``s_h = a_h + b_h`` and ``d_h = a_h - b_h``; a head's
gradient in ``v_h`` is ``g_h = <grad_W L, p_h>`` (its attention ``p_h`` read against the loss gradient in the
effective weights). One gradient step maps ``s_h -> (1 - lr g_h) s_h`` and ``d_h -> (1 + lr g_h) d_h`` exactly
when ``g_h`` is frozen, which is what linearising does.

* **Near the origin** every head attends uniformly and ``g_h = -r`` with
  ``r = sum_i n_i (rho_A,i + rho_B,i) / N`` (``N`` tokens, ``n_i`` of type i): ``s_h`` grows by ``1 + lr r`` per
  step, ``d_h`` shrinks by ``1 - lr r``. Values start at ``sigma^2``, so the loss leaves its start after
  ``T_1 = log(1/sigma) / lambda_1 + const`` steps, ``lambda_1 = log(1 + lr r)``.
* **The plateau** is the best one head can do: a positive-valued head on the A and B tokens only, i.e. the
  optimum with ``W_C = W_D = 0`` (:func:`plateau`; a saddle reached only as that head's attention on C and D
  goes to zero). There the gradient points along C alone, and a head that still attends uniformly has
  ``g = mu > 0``: its ``d`` grows by ``1 + lr mu`` (a *negative* value, the conflicting head) while its ``s``
  decays. ``d`` was shrunk during ``T_1`` by ``(1 - lr r)^{T_1}``, so the plateau lasts
  ``T_2 - T_1 = (1 + lambda_d / lambda_1) log(1/sigma) / lambda_2 + const``, ``lambda_2 = log(1 + lr mu)``,
  ``lambda_d = -log(1 - lr r)``.
* **Which head does what** follows from the same linear maps: all heads share the factors while their attention
  is uniform, so the order of ``|s_h|`` and of ``|d_h|`` is kept from initialization. The head with the largest
  ``|s_h(0)|`` grows first and takes the A/B signal (the *winner*); among the others the one with the largest
  ``|d_h(0)|`` is first to grow a negative value and becomes the C-carrier (:func:`predict_heads`).

What is exact: the linear maps, the plateau point and loss, ``r`` and ``mu``. What is approximate: freezing
``g_h`` (heads' attention moves a little during the first transition) and taking the plateau at the saddle
(the real plateau approaches it slowly, so at finite sigma its gradient, and the escape rate, are larger).
:func:`early_phase` and :func:`check` measure each prediction on simulated runs.

Example:
    >>> from cel_utils import dynamics
    >>> round(dynamics.rates()["r"], 3), round(dynamics.plateau()[1], 3)
    (0.05, 0.8)
"""

from __future__ import annotations

import numpy as np

from . import profiling
from .theory import DEFAULT, Setup, joint_loss, train


def loss_gradient(W, setup: Setup = DEFAULT) -> np.ndarray:
    """Gradient of the joint population loss in the per-token effective weights ``W [type]`` (counts included)."""
    c, rho = setup.counts, setup.rho
    s = (rho * W * c).sum(1)  # [task]
    return 0.5 * sum(-2 * (1 - s[t]) * rho[t] * c + 2 * W * (1 - rho[t] ** 2) * c for t in range(len(rho)))


def plateau(setup: Setup = DEFAULT) -> tuple[np.ndarray, float]:
    """The first plateau: the joint optimum with the C and D weights held at zero, ``(W_pl [type], L_pl)``.

    One head with a positive value and attention on the A and B tokens only represents it; it is the best a
    single head can do when both of those weights are positive (checked against
    :func:`cel_utils.theory.best_single_head_loss` in the tests).
    """
    c, rho = setup.counts, setup.rho
    keep = [0, 1]
    R = rho[:, keep] * c[keep]  # [task, kept type]
    A = R.T @ R + np.diag(((1 - rho[:, keep] ** 2) * c[keep]).sum(0))
    W = np.zeros(4)
    W[keep] = np.linalg.solve(A, R.sum(0))
    return W, float(joint_loss(W, setup))


def rates(setup: Setup = DEFAULT, lr: float = 0.5) -> dict:
    """The linearised rates: ``r`` and ``mu`` (gradient of a uniformly attending head at the origin and at the
    plateau), ``lambda_1`` (growth at the origin), ``lambda_d`` (decay of ``d`` there), ``lambda_2`` (growth of
    a negative-valued head at the plateau), and the predicted slopes of the phase lengths per unit of
    ``log(1/sigma)``."""
    n = setup.counts.sum()
    p_uniform = np.ones(4) / n  # per-token attention of a head that has not moved
    r = -float(loss_gradient(np.zeros(4), setup) @ p_uniform)
    W_pl, _ = plateau(setup)
    mu = float(loss_gradient(W_pl, setup) @ p_uniform)
    lam1, lam_d, lam2 = np.log1p(lr * r), -np.log1p(-lr * r), np.log1p(lr * mu)
    return {"r": r, "mu": mu, "lambda_1": float(lam1), "lambda_d": float(lam_d), "lambda_2": float(lam2),
            "slope_escape": float(1 / lam1), "slope_plateau": float((1 + lam_d / lam1) / lam2)}


def _others_d(a0, b0) -> tuple[np.ndarray, np.ndarray]:
    """The predicted winner (largest ``|a + b|``) and every head's ``|a - b|`` with the winner's set to -inf."""
    s, d = np.abs(np.asarray(a0) + b0), np.abs(np.asarray(a0) - b0)
    winner = s.argmax(-1)
    d[np.arange(len(d)), winner] = -np.inf
    return winner, d


def carrier_margin(a0, b0) -> np.ndarray:
    """How clearly the initial weights decide the C-carrier: the largest ``|a - b|`` among the heads other than
    the predicted winner divided by the second largest (1 = a tie; needs at least three heads, else inf)."""
    _, d = _others_d(a0, b0)
    top = np.sort(d, -1)[:, ::-1]
    return top[:, 0] / top[:, 1] if d.shape[-1] > 2 else np.full(len(d), np.inf)


def predict_heads(a0, b0) -> tuple[np.ndarray, np.ndarray]:
    """Predicted winner (largest ``|a + b|``) and C-carrier (largest ``|a - b|`` among the other heads) from the
    initial output and value weights ``a0, b0 [runs, head]``."""
    winner, d = _others_d(a0, b0)
    return winner, d.argmax(-1)


def phase_times(run, setup: Setup = DEFAULT) -> tuple[np.ndarray, np.ndarray]:
    """Per run, the first recorded step at which the loss is below halfway from the start (1) to the plateau
    (``T_1``), and below halfway from the plateau to the optimum (``T_2``); -1 where it never gets there."""
    L = run.history["loss"]  # [record, runs]
    L0 = float(L[0].max())
    L_pl = plateau(setup)[1]
    out = []
    for level in ((L0 + L_pl) / 2, (L_pl + run.L_star) / 2):
        below = L < level
        out.append(np.where(below.any(0), run.record_steps[below.argmax(0)], -1))
    return out[0], out[1]


def plateau_growth_rate(run, carrier: np.ndarray, t1: np.ndarray, t2: np.ndarray,
                        setup: Setup = DEFAULT) -> tuple[np.ndarray, np.ndarray]:
    """Per run, over the middle half of its plateau: the measured growth rate per step of the carrier's
    ``log |a - b|``, and the rate the linearisation gives at the weights the run actually has there
    (``log(1 + lr <grad L(W(t)), p_uniform>)`` averaged over the window) instead of at the saddle."""
    steps = run.record_steps
    d = np.abs(run.history["a"] - run.history["b"])  # [record, runs, head]
    counts = setup.counts
    p_uniform = np.ones(4) / counts.sum()
    measured, at_w = [], []
    for i, (c, lo, hi) in enumerate(zip(carrier, t1, t2)):
        if lo < 0 or hi < 0:
            measured.append(np.nan)
            at_w.append(np.nan)
            continue
        i0, i1 = np.searchsorted(steps, lo + (hi - lo) / 4), np.searchsorted(steps, lo + 3 * (hi - lo) / 4)
        measured.append(float((np.log(d[i1, i, c]) - np.log(d[i0, i, c])) / (steps[i1] - steps[i0])))
        # W(t) [record, type] from the recorded values and attention mass per type
        W = (run.history["value"][i0:i1, i, :, None] * run.history["att"][i0:i1, i] / counts).sum(1)
        g = np.array([loss_gradient(w, setup) @ p_uniform for w in W])
        at_w.append(float(np.log1p(run.lr * g).mean()))
    return np.array(measured), np.array(at_w)


@profiling.timed
def early_phase(sigmas=(1e-8, 1e-6, 1e-4, 1e-2), n_seeds: int = 40, n_heads: int = 4, steps: int = 5000,
                lr: float = 0.5, setup: Setup = DEFAULT, record_every: int = 5):
    """Simulated runs over ``sigmas`` x seeds: phase times, predicted and actual winner and C-carrier, and the
    measured growth rate on the plateau. A tidy table, one row per run."""
    import pandas as pd

    run = train(n_heads=n_heads, sigma=list(sigmas), seeds=range(n_seeds), steps=steps, lr=lr, setup=setup,
                record_every=record_every)
    t1, t2 = phase_times(run, setup)
    a0, b0 = run.history["a"][0], run.history["b"][0]  # [runs, head] at step 0
    pred_w, pred_c = predict_heads(a0, b0)
    winner = run.history["value"][-1].argmax(-1)
    carrier = run.c_heads
    rate, rate_at_w = plateau_growth_rate(run, carrier, t1, t2, setup)
    return pd.DataFrame({"sigma": run.sigma, "seed": run.seeds, "T1": t1, "T2": t2,
                         "predicted_winner": pred_w, "winner": winner, "predicted_carrier": pred_c,
                         "carrier": carrier, "carrier_margin": carrier_margin(a0, b0), "plateau_rate": rate,
                         "plateau_rate_at_w": rate_at_w, "c_share": run.c_shares,
                         "gap": run.gaps, "n_heads": n_heads})


def check(runs, setup: Setup = DEFAULT, lr: float = 0.5):
    """Each prediction against the runs of :func:`early_phase`: a tidy table with the predicted value, the
    measured value and its 95% interval (slopes from ``scipy.stats.linregress``; agreement rates with the exact
    binomial test against chance, ``scipy.stats.binomtest``)."""
    import pandas as pd
    from scipy import stats

    pr = rates(setup, lr)
    ok = runs[(runs.T1 > 0) & (runs.T2 > 0)]
    x = np.log(1 / ok.sigma.to_numpy())
    rows = []
    for name, y, pred in [("escape from the origin: steps per unit log(1/sigma)", ok.T1, pr["slope_escape"]),
                          ("plateau length T2 - T1: steps per unit log(1/sigma)", ok.T2 - ok.T1,
                           pr["slope_plateau"])]:
        fit = stats.linregress(x, y.to_numpy().astype(float))
        half = stats.t.ppf(0.975, len(x) - 2) * fit.stderr
        rows.append({"prediction": name, "predicted": pred, "measured": fit.slope, "ci_low": fit.slope - half,
                     "ci_high": fit.slope + half, "chance": np.nan, "p_value": np.nan, "runs": len(x)})
    H = int(runs.n_heads.iloc[0])
    for name, hit, chance in [("winner = largest |a+b| at init", runs.predicted_winner == runs.winner, 1 / H),
                              ("C-carrier = largest |a-b| among the others", runs.predicted_carrier == runs.carrier,
                               1 / max(H - 1, 1))]:
        k, n = int(hit.sum()), len(hit)
        t = stats.binomtest(k, n, chance, alternative="greater")
        ci = t.proportion_ci(0.95)
        rows.append({"prediction": name, "predicted": 1.0, "measured": k / n, "ci_low": ci.low, "ci_high": ci.high,
                     "chance": chance, "p_value": t.pvalue, "runs": n})
    return pd.DataFrame(rows)


def carrier_misses(runs) -> dict:
    """Are the C-carrier predictions that miss the runs where the initial weights barely decide? Median
    :func:`carrier_margin` of hits and misses and a one-sided Mann-Whitney test (misses have smaller margins)."""
    from scipy.stats import mannwhitneyu

    hit = (runs.predicted_carrier == runs.carrier).to_numpy()
    m = runs.carrier_margin.to_numpy()
    out = {"hits": int(hit.sum()), "misses": int((~hit).sum()), "hit_median_margin": float(np.median(m[hit])),
           "miss_median_margin": float(np.median(m[~hit])) if (~hit).any() else np.nan, "p_value": np.nan}
    if hit.any() and (~hit).any() and np.isfinite(m).all():
        out["p_value"] = float(mannwhitneyu(m[~hit], m[hit], alternative="less").pvalue)
    return out


def run_record(run, r: int = 0) -> dict:
    """The record of one training run (``cel theory``'s JSON): the run's :meth:`~cel_utils.theory.Run.summary` and
    the early phase as chapter 3 derives it: the linearised rates, the predicted escape time and plateau length
    (their leading terms, the predicted slopes times ``log(1/sigma)``: the slopes are derived, the offsets are
    not, so compare how the measured times grow over sigmas, not one run's value), the phase times this run took,
    and the winner and C-carrier predicted from the initial weights beside the ones training produced."""
    pr = rates(run.setup, run.lr)
    t1, t2 = phase_times(run, run.setup)
    a0, b0 = run.history["a"][0], run.history["b"][0]  # [runs, head] at step 0
    pred_w, pred_c = predict_heads(a0, b0)
    log_inv = float(np.log(1 / run.sigma[r]))
    return {**run.summary(r), "early_phase": {
        "rates": pr, "log_inv_sigma": log_inv,
        "predicted_escape_step": pr["slope_escape"] * log_inv,
        "predicted_plateau_length": pr["slope_plateau"] * log_inv,
        "escape_step": int(t1[r]), "plateau_end_step": int(t2[r]),
        "plateau_length": int(t2[r] - t1[r]) if t1[r] >= 0 and t2[r] >= 0 else None,
        "predicted_winner": int(pred_w[r]), "winner": int(run.history["value"][-1].argmax(-1)[r]),
        "predicted_c_carrier": int(pred_c[r]), "c_carrier": int(run.c_heads[r]),
        "carrier_margin": float(carrier_margin(a0, b0)[r])}}
