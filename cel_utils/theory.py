"""Chapter 3's toy model: multi-head softmax attention trained on two tasks with a conflicting feature.

The model
---------
A sequence holds one task-A signal token (type A), one task-B signal token (type B), one
conflicting-feature token (type C) and ``m`` distractors (type D), plus a query token. Token ``i`` has a
type and a scalar content ``z_i``. Head ``h`` attends from the query with scores that depend only on the
token's type, ``s_hi = theta_h[type(i)]``, ``p_h = softmax(s_h)`` over the ``m + 3`` content tokens, and
outputs ``a_h * b_h * <p_h, z>`` (output weight ``a_h`` = W_O, value weight ``b_h`` = W_V). The model's
output is ``f = sum_h a_h b_h <p_h, z>`` = ``<W, z>`` with effective weights ``W = sum_h a_h b_h p_h``.

Data: ``y = +-1``, ``z_i = rho_{t,i} y + sqrt(1 - rho_{t,i}^2) eps_i``, ``eps ~ N(0, 1)``, with per-task
correlations ``rho_t`` over the types (A, B, C, D). Squared loss, averaged over the two tasks. In
population form the loss of task t is ``(1 - <W, rho_t>)^2 + sum_i W_i^2 (1 - rho_{t,i}^2)``, a quadratic
in W whose joint minimiser has a closed form; the prediction ``sign(f)`` has exact accuracy
``Phi(<W, rho_t> / sqrt(sum_i W_i^2 (1 - rho_{t,i}^2)))``.

Example:
    >>> from cel_utils import theory
    >>> r = theory.run(n_heads=4, sigma=1e-4, seed=0, steps=4000)
    >>> r.gap < 1e-8
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from . import threads
from .defaults import THEORY_EFFECT, TOY_DISTRACTORS, TOY_RHO, progress_enabled


@dataclass(frozen=True)
class Setup:
    """Task correlations per token type (A, B, C, D) and the number of distractors."""

    rho_a: tuple = TOY_RHO["toy_a"]
    rho_b: tuple = TOY_RHO["toy_b"]
    m: int = TOY_DISTRACTORS

    @property
    def counts(self) -> np.ndarray:
        return np.array([1, 1, 1, self.m], dtype=float)  # tokens per type

    @property
    def rho(self) -> np.ndarray:
        return np.array([self.rho_a, self.rho_b], dtype=float)  # [task, type]


DEFAULT = Setup()
WEAK_CONFLICT = Setup(rho_b=(0.0, 0.4, -0.2, 0.0))  # negative control (b): W*_C > 0


# ----------------------------------------------------------------------------------------------
# Population loss in the effective weights (per token *type*; all D tokens share one weight)
# ----------------------------------------------------------------------------------------------
def task_loss(W, rho, counts):
    """Population squared loss of one task. ``W [..., type]`` (per-token weight of each type)."""
    lib = torch if isinstance(W, torch.Tensor) else np
    rho = lib.as_tensor(rho, dtype=W.dtype) if lib is torch else np.asarray(rho)
    counts = lib.as_tensor(counts, dtype=W.dtype) if lib is torch else np.asarray(counts)
    signal = (W * rho * counts).sum(-1)
    noise = (W ** 2 * (1 - rho ** 2) * counts).sum(-1)
    return (1 - signal) ** 2 + noise


def joint_loss(W, setup: Setup = DEFAULT):
    return 0.5 * (task_loss(W, setup.rho[0], setup.counts) + task_loss(W, setup.rho[1], setup.counts))


def task_accuracy(W, rho, counts) -> np.ndarray:
    """Exact accuracy of sign(f) on one task: Phi(mean / sd) of f given y."""
    W = np.asarray(W, dtype=float)
    signal = (W * rho * counts).sum(-1)
    sd = np.sqrt((W ** 2 * (1 - rho ** 2) * counts).sum(-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, signal / sd, np.sign(signal) * np.inf)
    from scipy.stats import norm

    return norm.cdf(z)


def optimum(setup: Setup = DEFAULT, rho_tasks=None) -> tuple[np.ndarray, float]:
    """Closed-form minimiser W* (per type) of the average loss over the given tasks, and L*.

    Setting the gradient of ``mean_t [(1 - <W, rho_t>)^2 + sum_i W_i^2 (1 - rho_ti^2)]`` to zero over the
    per-token weights gives ``(sum_t R_t R_t^T + diag(sum_t (1 - rho_t^2))) W = sum_t R_t``.
    """
    rho = setup.rho if rho_tasks is None else np.atleast_2d(rho_tasks)
    counts = setup.counts
    # per-token variables: expand types to tokens
    tok_rho = np.repeat(rho, counts.astype(int), axis=1)  # [task, token]
    A = tok_rho.T @ tok_rho + np.diag((1 - tok_rho ** 2).sum(0))
    w_tok = np.linalg.solve(A, tok_rho.sum(0))
    starts = np.cumsum(np.r_[0, counts[:-1]]).astype(int)
    W = w_tok[starts]  # tokens of one type share the same weight at the optimum (symmetry)
    L = float(np.mean([task_loss(W, r, counts) for r in rho]))
    return W, L


def best_single_head_loss(setup: Setup = DEFAULT, restarts: int = 20, seed: int = 0) -> float:
    """Best joint loss one head can reach (W = c * softmax(theta)); numerical, from random restarts."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(seed)
    counts = setup.counts

    def f(x):
        c, th = x[0], x[1:]
        p = np.exp(th - th.max())
        p = p / (p * counts).sum()
        return float(joint_loss(c * p, setup))

    return min(minimize(f, rng.normal(size=5), method="Nelder-Mead",
                        options={"maxiter": 20000, "xatol": 1e-12, "fatol": 1e-14}).fun for _ in range(restarts))


# ----------------------------------------------------------------------------------------------
# The multi-head model and its training (vectorised over independent runs)
# ----------------------------------------------------------------------------------------------
ATTENTIONS = ("softmax", "softmax1")   # softmax1: an extra zero logit, so a head can attend to nothing


def head_attention(theta: torch.Tensor, counts: torch.Tensor, attention: str = "softmax") -> torch.Tensor:
    """Per-token attention of each type: ``theta [..., head, type]`` -> ``p [..., head, type]``.

    ``p[..., t]`` is the weight on *one* token of type t; ``sum_t counts[t] p[..., t] = 1`` for ``softmax``, and
    ``< 1`` for ``softmax1`` (softmax over the scores and one more logit fixed at 0 whose value is nothing: the
    head can put its weight nowhere and output about zero).
    """
    logits = theta + torch.log(counts)
    if attention == "softmax1":
        null = torch.zeros_like(logits[..., :1])
        return torch.softmax(torch.cat([logits, null], -1), dim=-1)[..., :-1] / counts
    if attention != "softmax":
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    return torch.softmax(logits, dim=-1) / counts


@dataclass
class Params:
    a: torch.Tensor  # [runs, head]  output weights W_O
    b: torch.Tensor  # [runs, head]  value weights W_V (None-equivalent when value="scalar")
    theta: torch.Tensor  # [runs, head, type] key-query scores (or built from q, k)
    q: torch.Tensor | None = None  # [runs, head, d] factored query (variant)
    k: torch.Tensor | None = None  # [runs, head, type, d] factored keys (variant)
    gate: torch.Tensor | None = None  # [runs, head] logits of a learned output gate sigmoid(gate) (variant)
    attention: str = "softmax"     # or "softmax1" (:func:`head_attention`)

    def scores(self) -> torch.Tensor:
        if self.q is not None:
            return torch.einsum("rhd,rhtd->rht", self.q, self.k)
        return self.theta

    def values(self) -> torch.Tensor:
        v = self.a * self.b  # [runs, head]
        return v if self.gate is None else v * torch.sigmoid(self.gate)

    def weights(self, counts: torch.Tensor) -> torch.Tensor:
        """Per-head effective weights ``W_h [runs, head, type]`` (their sum over heads is ``W``)."""
        return self.values()[..., None] * head_attention(self.scores(), counts, self.attention)


def init_params(runs: int, n_heads: int, sigma: float | torch.Tensor, seed: int = 0, value: str = "factored",
                qk: str = "combined", qk_scale: float = 0.3, d_qk: int = 4) -> Params:
    g = torch.Generator().manual_seed(seed)
    sig = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1, 1) * torch.ones(runs, 1, dtype=torch.float64)
    a = torch.randn(runs, n_heads, generator=g, dtype=torch.float64) * sig
    if value == "factored":
        b = torch.randn(runs, n_heads, generator=g, dtype=torch.float64) * sig
    elif value == "scalar":  # negative control (a): one value scalar per head, b fixed to 1
        b = torch.ones(runs, n_heads, dtype=torch.float64)
    else:
        raise ValueError(f"value must be 'factored' or 'scalar', got {value!r}")
    theta = torch.randn(runs, n_heads, 4, generator=g, dtype=torch.float64) * sig[..., None]
    q = k = None
    if qk == "factored":
        q = torch.randn(runs, n_heads, d_qk, generator=g, dtype=torch.float64) * qk_scale
        k = torch.randn(runs, n_heads, 4, d_qk, generator=g, dtype=torch.float64) * qk_scale
    return Params(a, b, theta, q, k)


def stacked_params(n_heads: int, sigmas, seeds, **init) -> Params:
    """One :class:`Params` over runs, each run drawn by its own generator (:func:`init_params` with one run per
    (sigma, seed) pair), so that a run does not depend on what else is in the batch."""
    parts = [init_params(1, n_heads, float(s), seed=int(sd), **init) for s, sd in zip(sigmas, seeds)]
    return Params(*(torch.cat([getattr(q, f) for q in parts]).detach() if getattr(parts[0], f) is not None else None
                    for f in ("a", "b", "theta", "q", "k")))


def effective_weights(p: Params, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``W [runs, type]`` and the per-head parts ``W_h [runs, head, type]``."""
    Wh = p.weights(counts)   # [runs, head, type]
    return Wh.sum(1), Wh


@dataclass
class Run:
    """A training run (or a batch of runs) with its recorded history and final measures."""

    setup: Setup
    n_heads: int
    sigma: np.ndarray  # [runs]
    seeds: list
    steps: int
    lr: float
    history: dict = field(default_factory=dict)  # name -> array [record, runs, ...]
    record_steps: np.ndarray | None = None
    final_W: np.ndarray | None = None  # [runs, type]
    final_Wh: np.ndarray | None = None  # [runs, head, type]
    final_att: np.ndarray | None = None  # [runs, head, type] (per-type mass, sums to 1)
    L_star: float = 0.0
    W_star: np.ndarray | None = None
    value: str = "factored"

    # ---- measures -----------------------------------------------------------------------------
    @property
    def losses(self) -> np.ndarray:
        return joint_loss(self.final_W, self.setup)

    @property
    def gaps(self) -> np.ndarray:
        return self.losses - self.L_star

    @property
    def gap(self) -> float:
        return float(self.gaps[0])

    @property
    def kappa(self) -> np.ndarray:
        """Per-head weight on the conflicting token C: ``kappa_h = a_h b_h p_{h,C}``, ``[runs, head]``."""
        return self.final_Wh[..., 2]

    @property
    def c_shares(self) -> np.ndarray:
        k = np.abs(self.kappa)
        return k.max(-1) / np.maximum(k.sum(-1), 1e-300)

    @property
    def c_share(self) -> float:
        return float(self.c_shares[0])

    @property
    def c_heads(self) -> np.ndarray:
        return np.abs(self.kappa).argmax(-1)

    @property
    def n_c_carriers(self) -> np.ndarray:
        """Heads carrying at least 10% of |W*_C|."""
        return (np.abs(self.kappa) >= 0.1 * abs(self.W_star[2])).sum(-1)

    def ablation(self, run: int = 0) -> list[dict]:
        """Effect of ablating each head alone: deltas (ablated minus intact) of loss and exact accuracy."""
        W = self.final_W[run]
        counts, rho = self.setup.counts, self.setup.rho
        base_l = [task_loss(W, rho[t], counts) for t in (0, 1)]
        base_a = [task_accuracy(W, rho[t], counts) for t in (0, 1)]
        rows = []
        for h in range(self.n_heads):
            Wa = W - self.final_Wh[run, h]
            l = [task_loss(Wa, rho[t], counts) for t in (0, 1)]
            a = [task_accuracy(Wa, rho[t], counts) for t in (0, 1)]
            rows.append({"head": h, "kappa": float(self.kappa[run, h]),
                         "delta_loss_a": float(l[0] - base_l[0]), "delta_loss_b": float(l[1] - base_l[1]),
                         "delta_acc_a": float(a[0] - base_a[0]), "delta_acc_b": float(a[1] - base_a[1])})
        return rows

    def best_head_for_a(self) -> np.ndarray:
        """Per run: the head whose ablation lowers task A's loss the most (or -1 if none lowers it)."""
        return best_head_for_a(self.effects())

    def best_ablation(self, run: int = 0) -> dict:
        """The single-head ablation that lowers task A's loss the most, and the runner-up (the best other head).

        ``best_delta_loss_a`` near 0 means no head's removal helps A; a runner-up close to the best means the
        effect is shared by several heads rather than localized in one.
        """
        abl = self.ablation(run)
        d = np.array([x["delta_loss_a"] for x in abl])
        order = np.argsort(d, kind="stable")  # ties: the first head, as argmin
        best = abl[order[0]]
        return {"best_head": int(order[0]), "best_delta_loss_a": best["delta_loss_a"],
                "best_delta_acc_a": best["delta_acc_a"], "best_delta_loss_b": best["delta_loss_b"],
                "best_delta_acc_b": best["delta_acc_b"],
                "runner_up_delta_loss_a": float(d[order[1]]) if len(d) > 1 else 0.0}

    def effects(self):
        """One row per run: sigma, seed, C-share, gap and :meth:`best_ablation` (a tidy table)."""
        import pandas as pd

        return pd.DataFrame([{"sigma": float(self.sigma[r]), "seed": self.seeds[r], "c_share": float(self.c_shares[r]),
                              "gap": float(self.gaps[r]), **self.best_ablation(r)} for r in range(len(self.sigma))])

    def summary(self, run: int = 0) -> dict:
        return {
            "n_heads": self.n_heads, "sigma": float(self.sigma[run]), "seed": self.seeds[run],
            "steps": self.steps, "lr": self.lr, "value": self.value,
            "rho_a": list(self.setup.rho_a), "rho_b": list(self.setup.rho_b), "m": self.setup.m,
            "L_star": self.L_star, "W_star": [float(x) for x in self.W_star],
            "final_loss": float(self.losses[run]), "gap": float(self.gaps[run]),
            "c_share": float(self.c_shares[run]), "c_head": int(self.c_heads[run]),
            "n_c_carriers": int(self.n_c_carriers[run]),
            "kappa": [float(x) for x in self.kappa[run]],
            "attention": [[float(x) for x in row] for row in self.final_att[run]],
            "ablation": self.ablation(run),
        }


def train(n_heads: int = 4, sigma=1e-4, seeds=(0,), steps: int = 4000, lr: float = 0.5,
          setup: Setup = DEFAULT, value: str = "factored", qk: str = "combined", qk_scale: float = 0.3,
          record_every: int = 20) -> Run:
    """Full-batch gradient descent on the population loss, for len(seeds) x len(sigma) runs at once.

    ``sigma`` may be a scalar or a list (runs are then every (sigma, seed) pair, sigma-major).
    """
    sig_list = np.atleast_1d(np.asarray(sigma, dtype=float))
    seeds = list(seeds)
    sig = np.repeat(sig_list, len(seeds))
    run_seeds = seeds * len(sig_list)
    P = stacked_params(n_heads, sig, run_seeds, value=value, qk=qk, qk_scale=qk_scale)
    names = ["a", "theta"] + (["b"] if value == "factored" else [])
    if qk == "factored":
        names = ["a", "q", "k"] + (["b"] if value == "factored" else [])
    return descend(P, names, setup, steps, lr, record_every, meta={"n_heads": n_heads, "sigma": sig,
                                                                    "seeds": run_seeds, "value": value})


@threads.one_thread
def descend(P: Params, names: list[str], setup: Setup, steps: int, lr: float, record_every: int = 20,
            meta: dict | None = None) -> Run:
    """Full-batch gradient descent on the population loss of ``P``'s parameters ``names`` (changed in place);
    ``meta``: the :class:`Run`'s ``n_heads``, ``sigma``, ``seeds`` and ``value``."""
    for nme in names:
        getattr(P, nme).requires_grad_(True)
    params = [getattr(P, nme) for nme in names]
    counts = torch.tensor(setup.counts, dtype=torch.float64)
    rho = torch.tensor(setup.rho, dtype=torch.float64)
    W_star, L_star = optimum(setup)
    hist = {"loss": [], "att": [], "kappa": [], "value": [], "a": [], "b": []}
    rec_steps = []

    def record(step, W, Wh, att):
        rec_steps.append(step)
        hist["loss"].append(joint_loss(W.detach(), setup).numpy())
        hist["att"].append((att.detach() * counts).numpy())
        hist["kappa"].append(Wh.detach()[..., 2].numpy())
        hist["value"].append(P.values().detach().numpy())
        hist["a"].append(P.a.detach().numpy().copy())
        hist["b"].append(P.b.detach().numpy().copy())

    for step in range(steps + 1):
        att = head_attention(P.scores(), counts, P.attention)
        Wh = P.values()[..., None] * att
        W = Wh.sum(1)
        if step % record_every == 0 or step == steps:
            record(step, W, Wh, att)
        if step == steps:
            break
        loss = 0.5 * (task_loss(W, rho[0], counts) + task_loss(W, rho[1], counts))
        grads = torch.autograd.grad(loss.sum(), params)
        with torch.no_grad():
            for prm, g in zip(params, grads):
                prm -= lr * g
    with torch.no_grad():
        W, Wh = effective_weights(P, counts)
        att = head_attention(P.scores(), counts, P.attention) * counts
    m = meta or {}
    return Run(setup=setup, n_heads=m.get("n_heads", P.a.shape[1]), sigma=m.get("sigma"), seeds=m.get("seeds"),
               steps=steps, lr=lr, history={k: np.stack(v) for k, v in hist.items()},
               record_steps=np.array(rec_steps), final_W=W.numpy(), final_Wh=Wh.numpy(), final_att=att.numpy(),
               L_star=L_star, W_star=W_star, value=m.get("value", "factored"))


def run(n_heads: int = 4, sigma: float = 1e-4, seed: int = 0, steps: int = 4000, lr: float = 0.5,
        setup: Setup = DEFAULT, **kw) -> Run:
    """One training run (the ``cel theory`` command)."""
    return train(n_heads=n_heads, sigma=sigma, seeds=(seed,), steps=steps, lr=lr, setup=setup, **kw)


def sweep(sigmas=(1e-6, 1e-4, 1e-2, 0.1, 0.3, 1.0), heads=(2, 4, 8), n_seeds: int = 20, steps: int = 10000,
          lr: float = 0.5, setup: Setup = DEFAULT, progress: bool = False):
    """Per (heads, sigma) cell over ``n_seeds`` runs: how concentrated the conflicting feature is (C-share, the
    fraction of runs with a single C-carrier) *and* how large the effect is (the best single-head ablation's
    change in task A's loss and accuracy: mean, sd, min, max over seeds; the runner-up head's change in A's loss).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    rows = []
    for H in tqdm(heads, desc="sweep over head counts", disable=not progress_enabled(progress)):
        r = train(n_heads=H, sigma=list(sigmas), seeds=range(n_seeds), steps=steps, lr=lr, setup=setup,
                  record_every=steps)
        eff = r.effects()
        best = best_head_for_a(eff)
        for i, s in enumerate(sigmas):
            sl = slice(i * n_seeds, (i + 1) * n_seeds)
            e = eff.iloc[sl]
            rows.append({"heads": H, "sigma": s, "runs": n_seeds,
                         "c_share": float(r.c_shares[sl].mean()),
                         "c_share_sd": float(r.c_shares[sl].std()),
                         "single_c_head": float((r.n_c_carriers[sl] == 1).mean()),
                         "best_ablation_is_c_head": float((best[sl] == r.c_heads[sl]).mean()),
                         **summarise_effects(e),
                         "max_gap": float(r.gaps[sl].max()),
                         "not_converged": int((r.gaps[sl] > 1e-6).sum())})
    return pd.DataFrame(rows)


def best_head_for_a(eff) -> np.ndarray:
    """From rows of :meth:`Run.effects`: each run's best head for task A, or -1 where no removal lowers A's loss."""
    return np.where(eff["best_delta_loss_a"].to_numpy() < 0, eff["best_head"].to_numpy(), -1)


def summarise_effects(eff) -> dict:
    """Mean, sd and range over runs of the best single-head ablation's effect on task A (rows of
    :meth:`Run.effects`)."""
    d, a, ru = eff["best_delta_loss_a"], eff["best_delta_acc_a"], eff["runner_up_delta_loss_a"]
    return {"best_dloss_a": float(d.mean()), "best_dloss_a_sd": float(d.std(ddof=0)),
            "best_dloss_a_min": float(d.min()), "best_dloss_a_max": float(d.max()),
            "best_dacc_a": float(a.mean()), "best_dacc_a_min": float(a.min()), "best_dacc_a_max": float(a.max()),
            "runner_up_dloss_a": float(ru.mean()), "runner_up_dloss_a_min": float(ru.min()),
            "runs_helped": int((d < -THEORY_EFFECT).sum())}  # runs where some head's removal helps A


CONTROLS = {
    "the model (factored values, small init)": dict(),
    "large initialization (sigma = 1)": dict(sigma=1.0),
    "(a) one value scalar per head": dict(value="scalar"),
    "(b) weak conflict": dict(setup=WEAK_CONFLICT),
}


def controls(n_heads: int = 4, sigma: float = 1e-4, seeds=range(10), steps: int = 4000, lr: float = 0.5):
    """The model and its controls, each over ``seeds``: C-share, gap and the size of the effect
    (:func:`summarise_effects`). One row per control; ``name`` as in :data:`CONTROLS`."""
    import pandas as pd

    rows = []
    for name, kw in CONTROLS.items():
        kw = {"sigma": sigma, **kw}
        r = train(n_heads=n_heads, seeds=seeds, steps=steps, lr=lr, record_every=steps, **kw)
        rows.append({"control": name, "sigma": kw["sigma"], "runs": len(r.sigma),
                     "W_star_C": float(r.W_star[2]), "c_share": float(r.c_shares.mean()),
                     **summarise_effects(r.effects()), "max_gap": float(r.gaps.max())})
    return pd.DataFrame(rows)


def signed(x: float) -> str:
    """A signed number for prose: three decimals, or two significant digits when it is that small."""
    return f"{x:+.3f}" if x == 0 or abs(x) >= 5e-4 else f"{x:+.1e}"


def describe_effect(row, threshold: float = THEORY_EFFECT) -> str:
    """One sentence on the size and the localization of the effect in a row of :func:`controls` or
    :func:`sweep`, read from its numbers: *present* when the best single-head removal lowers task A's loss by
    more than ``threshold`` in every run, *localized* when no other head's removal does so in any run."""
    r = dict(row)
    size = (f"the best single-head removal changes task A's loss by {signed(r['best_dloss_a'])} on average "
            f"({signed(r['best_dloss_a_min'])} to {signed(r['best_dloss_a_max'])} over {r['runs']} runs) and "
            f"its accuracy by {signed(r['best_dacc_a'])}; C-share {r['c_share']:.2f}")
    if r["best_dloss_a_min"] > -threshold:
        return f"{size}: no head's removal helps task A (every change is above {-threshold:+.2f})."
    if r["best_dloss_a_max"] > -threshold:
        return f"{size}: a head whose removal helps task A appears in some runs only."
    if r["runner_up_dloss_a_min"] > -threshold:
        return f"{size}: the effect is there in every run and sits in one head (no other head's removal " \
               f"changes A's loss by more than {threshold:.2f})."
    return f"{size}: the effect is there in every run but is shared: the second-best head's removal lowers " \
           f"A's loss too (by up to {-r['runner_up_dloss_a_min']:.3f})."


# ----------------------------------------------------------------------------------------------
# The literal attention layer on sampled sequences (checks the effective-weight form)
# ----------------------------------------------------------------------------------------------
def sample_sequences(n: int, task: int, setup: Setup = DEFAULT, seed: int = 0):
    """Sequences with shuffled positions: ``types [n, T]`` (0..3), ``z [n, T]``, ``y [n]``."""
    rng = np.random.default_rng(seed)
    base_types = np.array([0, 1, 2] + [3] * setup.m)
    T = len(base_types)
    types = np.stack([rng.permutation(base_types) for _ in range(n)])
    y = rng.choice([-1.0, 1.0], size=n)
    rho = setup.rho[task][types]  # [n, T]
    z = rho * y[:, None] + np.sqrt(1 - rho ** 2) * rng.standard_normal((n, T))
    return types, z, y


def attention_forward(a, b, theta, types, z):
    """The literal multi-head attention output f for each sequence (query attends to content tokens).

    ``a, b [head]``, ``theta [head, type]``, ``types [n, T]``, ``z [n, T]`` -> ``f [n]``.
    """
    scores = np.asarray(theta)[:, types]  # [head, n, T]
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    head_out = (p * z[None]).sum(-1)  # [head, n]
    return (np.asarray(a)[:, None] * np.asarray(b)[:, None] * head_out).sum(0)
