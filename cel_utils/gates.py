"""Learned head gates on the frozen model: one gate per head over *all* heads, trained on the search split.

Chapter 2's joint search looks only inside a pool of the top few screened heads, so a set holding a head whose
removal alone does nothing is never seen. Here every head gets a gate ``g`` in [0, 1] that scales its output at
the hook room's ``z`` point (:mod:`cel_utils.hooks`; zero ablation: ``g * z``, mean ablation: ``mean + g * (z -
mean)``), and the gates are learned, the model frozen (Voita et al. 2019; Louizos et al. 2018's L0 relaxation):

* the relaxation: each gate is a **hard-concrete** variable with a learned ``log_alpha``
  (:func:`sample_gates`); it is exactly 0 (head removed) with probability :func:`prob_removed` and its mean is
  :func:`expected_gate`;
* :func:`learn_gates`: gradient steps (:class:`SharedAdam`) on the search split only, to raise the mean margin
  minus ``penalty`` x the expected number of heads removed; one run per penalty of the sweep and starting point
  (by default two: the intact model, and gates half open); each run ranks the heads (most wanted removed first)
  and the set of size ``k`` is the first ``k`` heads of a ranking (with several runs, the candidate of each run
  scored on the search split by the joint search's score). Deterministic for a seed; the loss curve is kept;

The learned sets go through the book's pipeline like every other selector's (:mod:`cel_utils.selectors`: the
``gates`` selector, :func:`cel_utils.selectors.gate_pipeline`).

Example (a tiny random model, so the numbers mean nothing):
    >>> from cel_utils.tiny import tiny_model
    >>> from cel_utils.tasks import load_task
    >>> lm = tiny_model("llama")
    >>> lg = learn_gates(lm, load_task("ioi", n=4), GateSettings(steps=2, max_k=2, progress=False))
    >>> sorted(lg.sets), len(lg.curve)   # 2 steps from each of the two starting points
    ([1, 2], 4)
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import profiling, threads
from .ablation import Ablation, Head, all_heads, format_set, head_name
from .approximate import backprop_mean_margin
from .defaults import (GATE_BATCH, GATE_INITS, GATE_LR, GATE_MAX_K, GATE_PENALTIES, GATE_STEPS, GATE_TEMPERATURE,
                       GRADIENT_FORWARD_EQUIVALENTS, SELECTOR_RANDOM_SETS, progress_enabled)
from .design import Design
from .engine import forward_equivalents
from .errors import CELError
from .io import json_safe
from .joint import model_scorer
from .scoring import EncodedTask, encode_task

# the hard-concrete stretch (gamma, zeta) of Louizos et al. 2018: a gate is 0 or 1 with positive probability
HC_LOW, HC_HIGH = -0.1, 1.1


# ------------------------------------------------------------------------------------------------------------
# The relaxation
# ------------------------------------------------------------------------------------------------------------
def sample_gates(log_alpha: torch.Tensor, u: torch.Tensor, beta: float = GATE_TEMPERATURE) -> torch.Tensor:
    """Hard-concrete gates for uniform noise ``u`` (same shape as ``log_alpha``): ``s = sigmoid((logit(u) +
    log_alpha) / beta)``, stretched to ``(HC_LOW, HC_HIGH)`` and clipped to [0, 1]. Differentiable in
    ``log_alpha`` (zero gradient where clipped).

    Example:
        >>> g = sample_gates(torch.tensor([-9.0, 0.0, 9.0]), torch.full((3,), 0.5))
        >>> g.tolist()
        [0.0, 0.5, 1.0]
    """
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / beta)
    return (s * (HC_HIGH - HC_LOW) + HC_LOW).clamp(0.0, 1.0)


def prob_removed(log_alpha, beta: float = GATE_TEMPERATURE):
    """P(gate = 0) of a hard-concrete gate, in closed form: ``sigmoid(beta * log(-HC_LOW / HC_HIGH) -
    log_alpha)``. Works on torch tensors (differentiable: the penalty) and on numpy arrays.

    Example:
        >>> round(float(prob_removed(np.array(0.0))), 4)
        0.1682
    """
    c = beta * np.log(-HC_LOW / HC_HIGH)
    if isinstance(log_alpha, torch.Tensor):
        return torch.sigmoid(c - log_alpha)
    return 1.0 / (1.0 + np.exp(-(c - np.asarray(log_alpha, dtype=float))))


def prob_kept(log_alpha, beta: float = GATE_TEMPERATURE):
    """P(gate = 1) of a hard-concrete gate: ``sigmoid(log_alpha - beta * log((1 - HC_LOW) / (HC_HIGH - 1)))``.

    Example:
        >>> round(float(prob_kept(np.array(0.0))), 4)
        0.1682
    """
    c = beta * np.log((1 - HC_LOW) / (HC_HIGH - 1))
    if isinstance(log_alpha, torch.Tensor):
        return torch.sigmoid(log_alpha - c)
    return 1.0 / (1.0 + np.exp(-(np.asarray(log_alpha, dtype=float) - c)))


def expected_gate(log_alpha, beta: float = GATE_TEMPERATURE) -> np.ndarray:
    """E[gate] of hard-concrete gates (numpy, any shape): ``integral over t in [0, 1] of P(gate > t)``, where
    ``P(gate > t) = sigmoid(log_alpha - beta * logit((t - HC_LOW) / (HC_HIGH - HC_LOW)))``, by adaptive quadrature
    (``scipy.integrate.quad``).

    Example:
        >>> round(float(expected_gate(0.0)), 6)   # symmetric: as often 0 as 1
        0.5
    """
    from scipy.integrate import quad

    def one(a: float) -> float:
        def above(t):
            x = (t - HC_LOW) / (HC_HIGH - HC_LOW)
            return 1.0 / (1.0 + np.exp(-(a - beta * np.log(x / (1 - x)))))
        return quad(above, 0.0, 1.0, epsabs=1e-10, epsrel=1e-10)[0]

    la = np.asarray(log_alpha, dtype=float)
    return np.array([one(float(a)) for a in la.ravel()]).reshape(la.shape)


def gate_points(lm, gate_of_layer, ablation: Ablation) -> list:
    """Hook points (:func:`cel_utils.hooks.hooked`) that scale every head's output by its gate:
    ``gate_of_layer(l)`` gives layer ``l``'s gates ``[n_heads]`` (computed inside the hook, so that each forward
    builds its own graph), applied by the ablation's :meth:`~cel_utils.ablation.Ablation.blend` (zero mode
    ``g * z``, mean mode ``mean + g * (z - mean)``)."""
    return [("z", l, lambda z, l=l: ablation.blend(z, l, gate_of_layer(l))) for l in range(lm.n_layers)]


@contextmanager
def frozen(lm):
    """The model's parameters without gradients (only the gates learn; a backward pass then skips the weights'
    gradients); their ``requires_grad`` flags are restored on exit."""
    params = list(lm.model.parameters())
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p, f in zip(params, flags):
            p.requires_grad_(f)


# ------------------------------------------------------------------------------------------------------------
# Learning the gates
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GateSettings(Design):
    """The parameters of :func:`learn_gates` (the shared ones from :class:`~cel_utils.design.Design`; ``max_k``: one
    set per size 1..max_k; ``random_sets``: random rankings through the same pipeline, the control)."""

    steps: int = GATE_STEPS                  # gradient steps per run
    lr: float = GATE_LR
    penalties: tuple = GATE_PENALTIES        # the sweep: one run per penalty (per expected head removed)
    temperature: float = GATE_TEMPERATURE    # hard-concrete beta
    inits: tuple = GATE_INITS                # initial log_alpha of every gate: one run per value (and penalty)
    batch_size: int = GATE_BATCH             # search items per step
    max_k: int = GATE_MAX_K                  # one set per size 1..max_k
    random_sets: int = SELECTOR_RANDOM_SETS  # random rankings through the same pipeline (the control)
    progress: bool = True

    def check(self, n_heads: int | None = None) -> None:
        """A :class:`CELError` naming the first bad value."""
        if self.steps < 1 or self.batch_size < 1 or self.max_k < 1:
            raise CELError(f"gate steps, batch size and max_k must be at least 1, got {self.steps}, "
                           f"{self.batch_size}, {self.max_k}")
        if not self.penalties or any(not np.isfinite(p) or p < 0 for p in self.penalties):
            raise CELError(f"gate penalties must be a non-empty list of numbers >= 0, got {self.penalties!r}")
        if not self.inits or any(not np.isfinite(a) for a in self.inits):
            raise CELError(f"gate inits must be a non-empty list of finite numbers, got {self.inits!r}")
        if not self.lr > 0 or not self.temperature > 0:
            raise CELError(f"gate lr and temperature must be positive, got {self.lr}, {self.temperature}")
        if self.random_sets < 0:
            raise CELError(f"random_sets must be at least 0, got {self.random_sets}")
        if n_heads is not None and self.max_k > n_heads:
            raise CELError(f"max_k = {self.max_k} but the model has only {n_heads} heads")

    def record(self) -> dict:
        """The settings as JSON-ready values (the ablation by its mode's name, the sweeps as lists)."""
        return Design.record(self)


class SharedAdam:
    """Adam with one second moment shared by all gates: each step is ``lr * m / sqrt(v)`` with ``m`` the
    per-gate first moment and ``v`` the running mean over gates of the squared gradient (bias-corrected).

    Per-gate Adam moves every gate by about ``lr`` per step whatever the size of its gradient, so a head whose
    removal helps a little but steadily would rank like one whose removal helps a lot, and a head pushed one way
    by the penalty alone would outrun one whose gradient is large but noisy. Sharing the second moment keeps the
    gates' relative gradient sizes and makes the step size independent of the margin's scale.

    Example:
        >>> p = torch.zeros(2, requires_grad=True); opt = SharedAdam(p, lr=0.1)
        >>> p.grad = torch.tensor([1.0, 0.1]); opt.step()
        >>> [round(x, 3) for x in p.detach().tolist()]   # the larger gradient moves ten times as far
        [-0.141, -0.014]
    """

    def __init__(self, param: torch.Tensor, lr: float, betas: tuple = (0.9, 0.999), eps: float = 1e-12):
        self.param, self.lr, self.betas, self.eps = param, lr, betas, eps
        self.m = torch.zeros_like(param)
        self.v = 0.0
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.betas
        g = self.param.grad
        self.t += 1
        self.m.mul_(b1).add_(g, alpha=1 - b1)
        self.v = b2 * self.v + (1 - b2) * float((g * g).mean())
        m_hat, v_hat = self.m / (1 - b1 ** self.t), self.v / (1 - b2 ** self.t)
        self.param.sub_(self.lr * m_hat / (v_hat ** 0.5 + self.eps))


@dataclass
class LearnedGates:
    """Gates learned on a task's search split: one ``log_alpha`` per head and run of the penalty sweep.

    ``sets``: size ``k`` -> the heads removed at that size (sorted); ``run_of``: which run's ranking gave it.
    ``curve``: one row per run and step: ``run``, ``penalty``, ``init``, ``step``, ``loss`` (minus the mean margin
    on the step's items plus the penalty term), ``mean_margin`` (with gates sampled), ``expected_removed`` (after
    the step).
    """

    heads: list[Head]                 # every head, in all_heads order
    log_alpha: np.ndarray             # [n_runs, n_heads]
    penalties: list[float]            # per run
    inits: list[float]                # per run: the starting log_alpha of every gate
    sets: dict[int, list[Head]]
    run_of: dict[int, int]
    curve: pd.DataFrame
    seconds: float
    forward_equivalents: float        # clean full forwards over the search items (a backward counts two)
    n_steps: int
    n_items: int
    settings: GateSettings = field(default_factory=GateSettings)

    def ranking(self, run: int = 0) -> list[Head]:
        """The heads of one run, most wanted removed first (lowest log_alpha; ties by layer, then head)."""
        order = sorted(range(len(self.heads)), key=lambda i: (self.log_alpha[run, i], self.heads[i]))
        return [self.heads[i] for i in order]

    def values(self) -> pd.DataFrame:
        """One row per head and run: ``log_alpha``, ``prob_removed``, ``expected_gate``."""
        beta = self.settings.temperature
        rows = []
        for r, (pen, init) in enumerate(zip(self.penalties, self.inits)):
            la = self.log_alpha[r]
            eg = expected_gate(la, beta)
            pr = prob_removed(la, beta)
            rows += [{"run": r, "penalty": pen, "init": init, "head": head_name(h), "log_alpha": float(a),
                      "prob_removed": float(p), "expected_gate": float(e)}
                     for h, a, p, e in zip(self.heads, la, pr, eg)]
        return pd.DataFrame(rows)

    def record(self) -> dict:
        """JSON-ready: the settings, the sets per size, every head's gate values and the loss curve."""
        return json_safe({
            "settings": self.settings.record(), "n_items": self.n_items, "n_steps": self.n_steps,
            "seconds": self.seconds, "forward_equivalents": self.forward_equivalents,
            "sets": [{"size": k, "heads": [head_name(h) for h in self.sets[k]], "run": self.run_of[k],
                      "penalty": self.penalties[self.run_of[k]], "init": self.inits[self.run_of[k]]}
                     for k in sorted(self.sets)],
            "values": self.values().to_dict("records"), "loss_curve": self.curve.to_dict("records")})


def _minibatches(task, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """Item indices of each step: the items in a seeded random order, epoch after epoch (all items when the
    batch holds them all)."""
    n = len(task.items)
    if batch_size >= n:
        return [list(range(n))] * steps
    rng = np.random.default_rng(seed)
    order: list[int] = []
    out = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += rng.permutation(n).tolist()
        out.append(sorted(order[:batch_size]))
        order = order[batch_size:]
    return out


def choose_sets(lm, lg: LearnedGates, enc, ablation: Ablation) -> None:
    """The set of each size ``k = 1..max_k`` from the runs' rankings (``lg.sets``, ``lg.run_of``): each run offers
    its first ``k`` heads and the search items ``enc``'s score (the joint search's: accuracy + the margin tie-break)
    picks (ties: the earlier run); the candidates' evaluations are added to ``lg.forward_equivalents``."""
    rankings = [lg.ranking(r) for r in range(len(lg.penalties))]
    max_k = lg.settings.max_k
    if len(rankings) == 1:
        lg.sets = {k: sorted(rankings[0][:k]) for k in range(1, max_k + 1)}
        lg.run_of = {k: 0 for k in lg.sets}
        return
    cands = {k: [sorted(r[:k]) for r in rankings] for k in range(1, max_k + 1)}
    unique = list({format_set(c): c for cs in cands.values() for c in cs}.values())
    score = dict(zip(map(format_set, unique), model_scorer(lm, enc, mode=ablation)(unique)))
    lg.forward_equivalents += forward_equivalents(lm.n_layers, unique)
    for k, cs in cands.items():
        best = max(range(len(cs)), key=lambda r: (score[format_set(cs[r])], -r))
        lg.sets[k], lg.run_of[k] = cs[best], best


def _one_run(lm, run: int, penalty: float, init: float, step_encs: list, ablation: Ablation, s: GateSettings,
             rows: list, bar) -> np.ndarray:
    """One training run from log-alpha ``init`` (the noise seeded by ``s.seed``): a :class:`SharedAdam` step per
    encoded minibatch on ``-mean margin + penalty * sum P(removed)``; the loss curve goes to ``rows``. Returns the
    final log-alphas ``[n_heads]``."""
    L, H = lm.n_layers, lm.n_heads
    gen = torch.Generator().manual_seed(s.seed)
    log_alpha = torch.full((L, H), float(init), dtype=torch.float32, requires_grad=True)
    opt = SharedAdam(log_alpha, lr=s.lr)
    for step, enc in enumerate(step_encs):
        threads.adapt()
        u = torch.rand((L, H), generator=gen).clamp(1e-6, 1 - 1e-6)  # [layer, head]
        log_alpha.grad = None
        gate = lambda l: sample_gates(log_alpha[l], u[l], s.temperature).to(lm.device)  # noqa: E731
        margin = backprop_mean_margin(lm, enc, gate_points(lm, gate, ablation))
        with torch.no_grad():   # descend on -margin
            log_alpha.grad.neg_()
        pen = penalty * prob_removed(log_alpha, s.temperature).sum()
        pen.backward()
        opt.step()
        rows.append({"run": run, "penalty": penalty, "init": init, "step": step,
                     "loss": -margin + float(pen.detach()), "mean_margin": margin,
                     "expected_removed": float(prob_removed(log_alpha.detach(), s.temperature).sum())})
        bar.update(1)
    return log_alpha.detach().reshape(-1).cpu().numpy().astype(float)


@profiling.timed
def learn_gates(lm, items, settings: GateSettings | None = None, **overrides) -> LearnedGates:
    """Learn one hard-concrete gate per head on ``items`` (a :class:`~cel_utils.tasks.Task`: the search split;
    nothing else is read), the model frozen.

    Each step draws one noise sample per head (seeded), runs the step's items with the sampled gates
    (:func:`gate_points`, one forward and one backward: :func:`cel_utils.approximate.backprop_mean_margin`) and
    takes a :class:`SharedAdam` step on ``-mean margin + penalty * sum P(removed)``. One run per penalty of
    ``settings.penalties`` and starting point of ``settings.inits`` (a high start is the intact model, where the
    gradient sees heads that help alone; a start at 0 removes a sixth of the heads, where a pair that helps only
    together is seen); a set per size ``k = 1..max_k`` from the runs' rankings (see the module docstring).
    Mean ablation takes its head means from ``items``.

    Example:
        >>> from cel_utils.tiny import tiny_model                      # doctest: +SKIP
        >>> lg = learn_gates(tiny_model("llama"), load_task("ioi", n=8), steps=5, max_k=3)  # doctest: +SKIP
        >>> lg.sets[1], lg.curve.loss.iloc[-1]                         # doctest: +SKIP
    """
    s = replace(settings or GateSettings(), **overrides)
    s.check(lm.n_layers * lm.n_heads)
    L, H = lm.n_layers, lm.n_heads
    heads = all_heads(lm)
    enc_all = encode_task(lm, items)
    ablation = Ablation.of(s.mode).resolved(lm, enc_all.inputs)
    batches = _minibatches(items, s.batch_size, s.steps, s.seed)
    encs: dict[tuple, EncodedTask] = {}
    rows, alphas = [], []

    def step_enc(idx):   # the step's items, encoded once per distinct minibatch
        if tuple(idx) not in encs:
            encs[tuple(idx)] = enc_all if len(idx) == enc_all.n_items else \
                encode_task(lm, replace(items, items=[items.items[i] for i in idx]))
        return encs[tuple(idx)]

    t0 = time.perf_counter()
    runs = [(p, a) for p in s.penalties for a in s.inits]
    bar = tqdm(total=s.steps * len(runs), desc=f"learning {L * H} head gates",
               disable=not progress_enabled(s.progress), leave=False)
    try:
        with frozen(lm):
            for run, (penalty, init) in enumerate(runs):
                alphas.append(_one_run(lm, run, penalty, init, [step_enc(idx) for idx in batches], ablation, s,
                                       rows, bar))
    finally:
        bar.close()
    log_alpha = np.stack(alphas)   # [n_runs, n_heads]
    fe = sum(GRADIENT_FORWARD_EQUIVALENTS * len(idx) / enc_all.n_items for idx in batches) * len(runs)
    lg = LearnedGates(heads=heads, log_alpha=log_alpha, penalties=[p for p, _ in runs],
                      inits=[a for _, a in runs], sets={}, run_of={},
                      curve=pd.DataFrame(rows), seconds=0.0, forward_equivalents=fe, n_steps=s.steps,
                      n_items=enc_all.n_items, settings=s)
    choose_sets(lm, lg, enc_all, ablation)
    lg.seconds = time.perf_counter() - t0
    return lg
