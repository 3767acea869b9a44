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
* :func:`gate_pipeline`: the learned set of each size confirmed on the confirm split (exact McNemar, BH over
  the sizes offered), the chosen one (:func:`cel_utils.compare.pick_chosen`) graded on held-out items (Holm over
  the sizes), and the same pipeline run on random rankings (the selection-aware control);
* :func:`compare_selectors`: every way of choosing ``k`` heads side by side on the held-out split: exact top-k by
  the single-head screen, chapter 2's pool search, the gradient screen, compressed sensing, learned gates and
  random sets; for each the held-out gain at every ``k`` with a CI, the area under that curve (mean gain over
  ``k = 1..max_k``) with a bootstrap CI, and the cost of choosing in forward-equivalents and seconds.

Example (a tiny random model, so the numbers mean nothing):
    >>> from cel_utils.tiny import tiny_model
    >>> from cel_utils.tasks import load_task
    >>> lm = tiny_model("llama")
    >>> lg = learn_gates(lm, load_task("ioi", n=4), GateSettings(steps=2, max_k=2, progress=False))
    >>> sorted(lg.sets), len(lg.curve)   # 2 steps from each of the two starting points
    ([1, 2], 4)
"""

from __future__ import annotations

import itertools
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .ablation import Ablation, Head, all_heads, format_set, head_name
from .approximate import backprop_mean_margin, compressed_screen, gradient_screen
from .compare import compare_sets, heldout_test, paired_table, pick_chosen
from .defaults import (ALPHA, BEAM_WIDTH, FDR, GATE_BATCH, GATE_INITS, GATE_LR, GATE_MAX_K, GATE_PENALTIES,
                       GATE_STEPS, GATE_TEMPERATURE, GRADIENT_FORWARD_EQUIVALENTS, N_BOOT, SELECTOR_RANDOM_SETS,
                       SELECTOR_SWEEP_MAX, progress_enabled)
from .engine import forward_equivalents
from .errors import CELError
from .io import json_safe
from .joint import graded_sets, model_scorer, sweep_pool, sweep_scores
from .models import cast
from .scoring import EncodedTask, ItemResults, encode_task
from .screening import Screen, screen
from .search import beam, exhaustive, percentile_among
from .stats import confirm_decisions

# the hard-concrete stretch (gamma, zeta) of Louizos et al. 2018: a gate is 0 or 1 with positive probability
HC_LOW, HC_HIGH = -0.1, 1.1
SELECTORS = ("top-k screen", "pool search", "gradient", "compressed sensing", "learned gates", "random")


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
class GateSettings:
    """The parameters of :func:`learn_gates` and :func:`gate_pipeline` (defaults from :mod:`cel_utils.defaults`)."""

    steps: int = GATE_STEPS                  # gradient steps per run
    lr: float = GATE_LR
    penalties: tuple = GATE_PENALTIES        # the sweep: one run per penalty (per expected head removed)
    temperature: float = GATE_TEMPERATURE    # hard-concrete beta
    inits: tuple = GATE_INITS                # initial log_alpha of every gate: one run per value (and penalty)
    batch_size: int = GATE_BATCH             # search items per step
    max_k: int = GATE_MAX_K                  # one set per size 1..max_k
    seed: int = 0
    mode: str | Ablation = "zero"
    fdr: float = FDR                         # gate_pipeline: confirmation (BH over the sizes)
    random_sets: int = SELECTOR_RANDOM_SETS  # gate_pipeline: random rankings through the same pipeline
    eval_dtype: str | None = None            # gate_pipeline: dtype of its evaluations (None: the model's own)
    n_boot: int = N_BOOT
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
        """The settings as JSON-ready values (the ablation by its mode's name)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["mode"] = Ablation.of(self.mode).mode
        d["penalties"] = list(self.penalties)
        d["inits"] = list(self.inits)
        return d


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
    t0 = time.perf_counter()
    runs = [(p, a) for p in s.penalties for a in s.inits]
    bar = tqdm(total=s.steps * len(runs), desc=f"learning {L * H} head gates",
               disable=not progress_enabled(s.progress), leave=False)
    try:
        with frozen(lm):
            for run, (penalty, init) in enumerate(runs):
                gen = torch.Generator().manual_seed(s.seed)
                log_alpha = torch.full((L, H), float(init), dtype=torch.float32, requires_grad=True)
                opt = SharedAdam(log_alpha, lr=s.lr)
                for step, idx in enumerate(batches):
                    key = tuple(idx)
                    if key not in encs:
                        encs[key] = enc_all if len(idx) == enc_all.n_items else \
                            encode_task(lm, replace(items, items=[items.items[i] for i in idx]))
                    u = torch.rand((L, H), generator=gen).clamp(1e-6, 1 - 1e-6)  # [layer, head]
                    log_alpha.grad = None
                    gate = lambda l: sample_gates(log_alpha[l], u[l], s.temperature).to(lm.device)  # noqa: E731
                    margin = backprop_mean_margin(lm, encs[key], gate_points(lm, gate, ablation))
                    with torch.no_grad():   # descend on -margin
                        log_alpha.grad.neg_()
                    pen = penalty * prob_removed(log_alpha, s.temperature).sum()
                    pen.backward()
                    opt.step()
                    rows.append({"run": run, "penalty": penalty, "init": init, "step": step,
                                 "loss": -margin + float(pen.detach()), "mean_margin": margin,
                                 "expected_removed": float(prob_removed(log_alpha.detach(), s.temperature).sum())})
                    bar.update(1)
                alphas.append(log_alpha.detach().reshape(-1).cpu().numpy().astype(float))
    finally:
        bar.close()
    log_alpha = np.stack(alphas)   # [n_runs, n_heads]
    fe = sum(GRADIENT_FORWARD_EQUIVALENTS * len(idx) / enc_all.n_items for idx in batches) * len(runs)
    lg = LearnedGates(heads=heads, log_alpha=log_alpha, penalties=[p for p, _ in runs],
                      inits=[a for _, a in runs], sets={}, run_of={},
                      curve=pd.DataFrame(rows), seconds=0.0, forward_equivalents=fe, n_steps=s.steps,
                      n_items=enc_all.n_items, settings=s)
    rankings = [lg.ranking(r) for r in range(len(runs))]
    if len(rankings) == 1:
        lg.sets = {k: sorted(rankings[0][:k]) for k in range(1, s.max_k + 1)}
        lg.run_of = {k: 0 for k in lg.sets}
    else:   # each run offers its first k heads; the search split's score picks (ties: the earlier run)
        cands = {k: [sorted(r[:k]) for r in rankings] for k in range(1, s.max_k + 1)}
        unique = list({format_set(c): c for cs in cands.values() for c in cs}.values())
        score = dict(zip(map(format_set, unique), model_scorer(lm, enc_all, mode=ablation)(unique)))
        lg.forward_equivalents += forward_equivalents(L, unique)
        for k, cs in cands.items():
            best = max(range(len(cs)), key=lambda r: (score[format_set(cs[r])], -r))
            lg.sets[k], lg.run_of[k] = cs[best], best
    lg.seconds = time.perf_counter() - t0
    return lg


def search_gates(lm, search_task, heldout_task, settings: GateSettings | None = None, random_sets: int = 0,
                 **overrides) -> dict:
    """``cel search --strategy gates``: gates learned on the search split, the set of each size ``1..max_k``
    graded on held-out items exactly as :func:`cel_utils.joint.search_heads` grades the other strategies' sets
    (:func:`cel_utils.joint.graded_sets`: both splits, held-out CI, interaction, percentile among ``random_sets``
    random sets of its size), plus ``gates``: the gate values and the loss curve (:meth:`LearnedGates.record`).
    ``pool`` lists every head (the gates' pool) and ``n_evaluations`` counts gradient steps.

    Example:
        >>> out = search_gates(lm, search, heldout, max_k=3)   # doctest: +SKIP
        >>> out["best"][0]["heads"], out["gates"]["loss_curve"][-1]["loss"]   # doctest: +SKIP
    """
    s = replace(settings or GateSettings(), **overrides)
    s.check(lm.n_layers * lm.n_heads)
    enc_s, enc_h = encode_task(lm, search_task), encode_task(lm, heldout_task)
    ablation = Ablation.of(s.mode).resolved(lm, enc_s.inputs)  # means (if any) from the search split only
    lg = learn_gates(lm, search_task, replace(s, mode=ablation))
    best_sets = [lg.sets[k] for k in sorted(lg.sets)]
    return {"strategy": "gates", "pool": [head_name(h) for h in lg.heads],
            "n_evaluations": lg.n_steps * len(lg.penalties), "search_seconds": lg.seconds,
            **graded_sets(lm, enc_s, enc_h, best_sets, ablation, random_sets, s.n_boot, s.seed),
            "gates": lg.record()}


# ------------------------------------------------------------------------------------------------------------
# Through the same gates as everything else: confirm, choose, held-out, selection-aware control
# ------------------------------------------------------------------------------------------------------------
def random_rankings(lm, n: int, max_k: int, seed: int = 0) -> list[list[list[Head]]]:
    """``n`` random orders of all heads, each as its nested sets of size 1..max_k (sorted): the random selector
    and the selection-aware control of :func:`gate_pipeline`.

    Example:
        >>> from cel_utils.tiny import tiny_model
        >>> r = random_rankings(tiny_model("llama"), 2, 3)
        >>> [len(s) for s in r[0]], set(r[0][0]) <= set(r[0][1]) <= set(r[0][2])
        ([1, 2, 3], True)
    """
    rng = np.random.default_rng(seed)
    heads = all_heads(lm)
    out = []
    for _ in range(n):
        order = [heads[i] for i in rng.permutation(len(heads))[:max_k]]
        out.append([sorted(order[:k]) for k in range(1, max_k + 1)])
    return out


def confirm_choose(conf_base: np.ndarray, conf_rows: np.ndarray, held_gain: np.ndarray, fdr: float) -> tuple:
    """The pipeline's choice among sets offered for one selection (one per size): exact McNemar on the confirm
    split with BH over the sets (:func:`cel_utils.stats.confirm_decisions`), the confirmed set with the largest
    confirm gain (:func:`cel_utils.compare.pick_chosen`); returns (index of the chosen set or None, its held-out
    gain or 0 when none is chosen: the pipeline then removes nothing)."""
    d = confirm_decisions(conf_base, conf_rows, fdr)
    gain = (d["fixes"] - d["breaks"]) / conf_rows.shape[1]
    c = pick_chosen(pd.DataFrame({"gain": gain, "confirmed": d["confirmed"]}), gain="gain")
    return (None, 0.0) if c is None else (int(c.name), float(held_gain[int(c.name)]))


@dataclass
class GatePipeline:
    """Learned sets (one per size) through confirm -> choose -> held-out, with the selection-aware control.

    ``sets``: one row per size ``k``: ``heads``, ``size``, ``search_delta_accuracy``, ``confirm_baseline``,
    ``confirm_delta_accuracy``,
    ``confirm_fixes``, ``confirm_breaks``, ``confirm_p_value``, ``confirm_q_value`` (BH over the sizes),
    ``confirmed``; held-out ``heldout_baseline``, ``heldout_delta_accuracy`` with ``ci_low``/``ci_high``,
    ``fixes``, ``breaks``, ``p_value``, ``p_holm`` (Holm over the sizes), ``holds``, ``heldout_delta_margin``.
    ``control``: per random ranking, the set the same pipeline would choose and its held-out gain.
    """

    model: str
    task: str
    gates: LearnedGates
    sets: pd.DataFrame
    control: pd.DataFrame
    heldout: object                   # the held-out Comparison of the learned sets
    control_heldout: object           # the held-out Comparison of the random rankings' sets (None without any)
    control_sets: list                # the random rankings' nested sets
    n_search: int
    n_confirm: int
    n_heldout: int

    def chosen(self) -> pd.Series | None:
        """The reported set: of the learned sets confirmed on the confirm split, the one with the largest confirm
        gain (ties: the smaller); None when none is confirmed. Its held-out row is the honest figure."""
        return pick_chosen(self.sets, gain="confirm_delta_accuracy")

    def chosen_gain(self) -> float:
        c = self.chosen()
        return 0.0 if c is None else float(c["heldout_delta_accuracy"])

    def control_percentile(self) -> float:
        """Where the chosen set's held-out gain falls among the random rankings' pipelines (mid-rank; NaN
        without a control)."""
        return percentile_among(self.control["heldout_delta_accuracy"].to_numpy(), self.chosen_gain())

    def record(self) -> dict:
        """JSON-ready: the sets with their three splits' figures, the chosen set, the control, the gates."""
        c = self.chosen()
        return json_safe({
            "model": self.model, "task": self.task, "n_search": self.n_search, "n_confirm": self.n_confirm,
            "n_heldout": self.n_heldout, "sets": self.sets.to_dict("records"),
            "chosen": None if c is None else c["heads"], "chosen_gain": self.chosen_gain(),
            "control": self.control.to_dict("records"), "control_percentile": self.control_percentile(),
            "gates": self.gates.record()})


def gate_pipeline(lm, splits: dict, settings: GateSettings | None = None, **overrides) -> GatePipeline:
    """Learn gates on ``splits["search"]`` (:func:`learn_gates`: nothing else is read to learn them), then put
    the set of every size through the book's gates: confirm (exact McNemar, BH over the sizes offered), choose
    (:meth:`GatePipeline.chosen`), held-out (:func:`cel_utils.compare.heldout_test`: Holm over the sizes), and the
    same confirm -> choose -> held-out on ``random_sets`` random rankings of all heads (the selection-aware
    control). ``splits``: the three :class:`~cel_utils.tasks.Task` splits by name. The gates learn in ``lm``'s
    dtype; every evaluation runs in ``eval_dtype`` (e.g. ``"bfloat16"``, about twice as fast on this CPU).

    Example:
        >>> gp = gate_pipeline(lm, {s: load_task("agreement", s, n=50) for s in SPLITS}, max_k=5)  # doctest: +SKIP
        >>> gp.chosen(), gp.control_percentile()                                                   # doctest: +SKIP
    """
    s = replace(settings or GateSettings(), **overrides)
    s.check(lm.n_layers * lm.n_heads)
    encs = {k: encode_task(lm, splits[k]) for k in ("search", "confirm", "heldout")}
    ablation = Ablation.of(s.mode).resolved(lm, encs["search"].inputs)  # means (if any) from the search split
    lg = learn_gates(lm, splits["search"], replace(s, mode=ablation))
    lm = cast(lm, s.eval_dtype) if s.eval_dtype else lm   # the gates learn in lm's dtype; sets are graded in this
    named = {format_set(lg.sets[k]): lg.sets[k] for k in sorted(lg.sets)}
    on_search = compare_sets(lm, encs["search"], named, mode=ablation, n_boot=s.n_boot, seed=s.seed)
    conf = compare_sets(lm, encs["confirm"], named, mode=ablation, n_boot=s.n_boot, seed=s.seed)
    d = confirm_decisions(conf.baseline.correct[0], conf.results.correct, s.fdr)
    held, held_cmp = heldout_test(lm, encs["heldout"], named, mode=ablation, n_boot=s.n_boot, seed=s.seed)
    tab = pd.DataFrame({"heads": list(named), "size": [len(v) for v in named.values()],
                        "search_delta_accuracy": on_search.table["delta_accuracy"].to_numpy(),
                        "confirm_baseline": conf.table["baseline_accuracy"].to_numpy(),
                        "confirm_delta_accuracy": conf.table["delta_accuracy"].to_numpy()})
    for k in ("fixes", "breaks", "p_value", "q_value"):
        tab[f"confirm_{k}"] = d[k]
    tab["confirmed"] = d["confirmed"]
    tab["heldout_baseline"] = held["baseline_accuracy"].to_numpy()
    tab["heldout_delta_accuracy"] = held["delta_accuracy"].to_numpy()
    for k in ("ci_low", "ci_high", "fixes", "breaks", "p_value", "p_holm", "holds"):
        tab[k] = held[k].to_numpy()
    tab["heldout_delta_margin"] = held["delta_margin"].to_numpy()
    # the selection-aware control: random rankings through the same confirm -> choose -> held-out
    rankings = random_rankings(lm, s.random_sets, s.max_k, s.seed)
    rows, ctrl_held = [], None
    if rankings:
        flat = {format_set(x): x for r in rankings for x in r}
        c_conf = compare_sets(lm, encs["confirm"], flat, mode=ablation, n_boot=s.n_boot, seed=s.seed)
        ctrl_held = compare_sets(lm, encs["heldout"], flat, mode=ablation, n_boot=s.n_boot, seed=s.seed)
        row_of = {n: j for j, n in enumerate(flat)}
        for rep, r in enumerate(rankings):
            idx = [row_of[format_set(x)] for x in r]
            j, gain = confirm_choose(c_conf.baseline.correct[0], c_conf.results.correct[idx],
                                     ctrl_held.table["delta_accuracy"].to_numpy()[idx], s.fdr)
            rows.append({"replicate": rep, "chosen": None if j is None else format_set(r[j]),
                         "heldout_delta_accuracy": gain})
    control = pd.DataFrame(rows, columns=["replicate", "chosen", "heldout_delta_accuracy"])
    return GatePipeline(model=lm.name, task=splits["search"].name, gates=lg, sets=tab, control=control,
                        heldout=held_cmp, control_heldout=ctrl_held, control_sets=rankings,
                        n_search=encs["search"].n_items, n_confirm=encs["confirm"].n_items,
                        n_heldout=encs["heldout"].n_items)


# ------------------------------------------------------------------------------------------------------------
# Every selector side by side on held-out items
# ------------------------------------------------------------------------------------------------------------
@dataclass
class SelectorComparison:
    """Ways of choosing ``k`` heads, each graded on the same held-out items at every ``k = 1..max_k``.

    ``table``: one row per selector and ``k``: ``heads`` (the set; for ``random``, how many random sets are
    averaged), ``outside_pool`` (its heads not in the pool), ``heldout_delta_accuracy`` with a paired-bootstrap
    95% CI (``ci_low``, ``ci_high``), ``heldout_delta_margin``.
    ``summary``: one row per selector: ``area`` (the mean held-out gain over ``k = 1..max_k``: the area under the
    curve divided by ``max_k``) with a bootstrap CI over items (``scipy.stats.bootstrap``), ``area_vs_pool`` (its
    difference from the pool search's area, paired over items, with a CI), ``best_k`` and ``best_gain``, and the
    cost of choosing: ``forward_equivalents`` (clean full forwards over the search items; a backward pass counts
    two), ``seconds`` (wall time on this CPU; for a result read back from the cache, the time it took when
    computed), ``n_evaluations`` (head sets evaluated, or gradient steps).
    ``pipeline``: the learned gates' :class:`GatePipeline` (confirmed, chosen, held-out, control).
    """

    model: str
    task: str
    max_k: int
    pool: list
    table: pd.DataFrame
    summary: pd.DataFrame
    pipeline: GatePipeline
    n_search: int
    n_heldout: int
    timings: dict = field(default_factory=dict)   # wall seconds of each stage of this comparison, and the total

    def record(self) -> dict:
        """JSON-ready: the table, the summary, the pool, the stages' times and the gates' pipeline."""
        return json_safe({"model": self.model, "task": self.task, "max_k": self.max_k,
                          "pool": [head_name(h) for h in self.pool], "n_search": self.n_search,
                          "n_heldout": self.n_heldout, "table": self.table.to_dict("records"),
                          "summary": self.summary.to_dict("records"), "timings": self.timings,
                          "gates": self.pipeline.record()})

    def sentence(self) -> str:
        """What this comparison finds, in one markdown paragraph written from its numbers: whether the learned
        gates reach beyond the pool, their area against the pool search's (with the difference's CI), the best
        selector by area, the gates' pipeline (its chosen set's held-out gain, Holm p, the random rankings that
        beat it) and against the pool search's set of the same size, and what learning the gates cost."""
        s = self.summary.set_index("selector")
        t = self.table.set_index(["selector", "k"])
        g, p = s.loc["learned gates"], s.loc["pool search"]
        outside = int(self.table[self.table.selector == "learned gates"]["outside_pool"].max())
        diff = (f"{g.area_vs_pool:+.3f} [{g.area_vs_pool_ci_low:+.3f}, {g.area_vs_pool_ci_high:+.3f}]")
        if g.area_vs_pool_ci_low > 0:
            verdict = "above the pool search's"
        elif g.area_vs_pool_ci_high < 0:
            verdict = "below the pool search's"
        else:
            verdict = "not distinguishable from the pool search's"
        top = s.index[np.isclose(s["area"], s["area"].max(), atol=1e-12)].tolist()
        best = (f"the largest area is the {top[0]} selector's ({s.loc[top[0], 'area']:+.3f})" if len(top) == 1 else
                f"every selector has the same area ({s['area'].max():+.3f})" if len(top) == len(s) else
                f"{', '.join(top)} tie for the largest area ({s['area'].max():+.3f})")
        text = (f"**{self.model} / {self.task}**: the learned gates' sets hold up to {outside} head"
                f"{'' if outside == 1 else 's'} outside the pool of {len(self.pool)}. Over k = 1..{self.max_k} "
                f"their mean held-out gain (the area) is {g.area:+.3f} [{g.area_ci_low:+.3f}, {g.area_ci_high:+.3f}], "
                f"{verdict} ({p.area:+.3f} [{p.area_ci_low:+.3f}, {p.area_ci_high:+.3f}]; difference {diff}); "
                f"{best}. ")
        c = self.pipeline.chosen()
        if c is None:
            text += ("The gates' pipeline confirmed none of its sets on the confirm split, so it reports nothing "
                     "(it removes no head). ")
        else:
            k = int(c["size"])
            ctrl = self.pipeline.control["heldout_delta_accuracy"].to_numpy()
            beat = int((ctrl > c["heldout_delta_accuracy"] + 1e-12).sum())
            pr = t.loc[("pool search", k)]
            text += (f"The gates' pipeline chose {c['heads']} (confirmed on the confirm split): it changes held-out "
                     f"accuracy by {c['heldout_delta_accuracy']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}], Holm "
                     f"p = {c['p_holm']:.2g} ({'holds' if c['holds'] else 'does not hold'}); {beat} of {len(ctrl)} "
                     f"random rankings put through the same pipeline chose a set with a larger held-out gain. The "
                     f"pool search's set of the same size, {pr['heads']}, changes it by "
                     f"{pr['heldout_delta_accuracy']:+.3f} [{pr['ci_low']:+.3f}, {pr['ci_high']:+.3f}]. ")
        lg = self.pipeline.gates
        n3 = min(3, lg.n_steps)
        runs = []
        for run, c in lg.curve.groupby("run"):
            n_sets = sum(r == run for r in lg.run_of.values())
            runs.append(f"from log-alpha {lg.inits[run]:g} (penalty {lg.penalties[run]:g}) the loss went from "
                        f"{c['loss'].iloc[:n3].mean():.2f} to {c['loss'].iloc[-n3:].mean():.2f}, with "
                        f"{c['expected_removed'].iloc[-1]:.1f} heads removed in expectation at the end, and gave "
                        f"{n_sets} of the {len(lg.sets)} sets")
        text += (f"Over {lg.n_steps} steps per run (means of the first and last {n3} steps), " + "; ".join(runs)
                 + f". Learning the gates cost {g.forward_equivalents:.0f} forward-equivalents ({g.seconds:.0f} s); "
                 f"the screen and pool search {p.forward_equivalents:.0f} ({p.seconds:.0f} s).")
        return text


def bootstrap_mean(d: np.ndarray, n_boot: int = N_BOOT, seed: int = 0, alpha: float = ALPHA) -> tuple:
    """Mean of per-item values ``d [n_items]`` with a percentile bootstrap CI over items
    (``scipy.stats.bootstrap``); a constant ``d`` gives a CI of zero width.

    Example:
        >>> bootstrap_mean(np.array([0.0, 0.0, 1.0, 1.0]), n_boot=200)[0]
        0.5
    """
    from scipy.stats import bootstrap

    d = np.asarray(d, dtype=float)
    point = float(d.mean())
    if np.ptp(d) == 0:
        return point, point, point
    ci = bootstrap((d,), np.mean, n_resamples=n_boot, confidence_level=1 - alpha, method="percentile",
                   random_state=np.random.default_rng(seed)).confidence_interval
    return point, float(ci.low), float(ci.high)


def compare_selectors(lm, splits: dict, max_k: int = 5, pool_size: int = 5, screen_result: Screen | None = None,
                      gate_settings: GateSettings | None = None, random_sets: int = SELECTOR_RANDOM_SETS,
                      compressed: bool = True, compressed_evals: int | None = None, mode: str | Ablation = "zero",
                      beam_width: int = BEAM_WIDTH, dtype: str | None = None, seed: int = 0, n_boot: int = N_BOOT,
                      progress: bool = True) -> SelectorComparison:
    """Choose ``k = 1..max_k`` heads on ``splits["search"]`` in six ways and grade every set on
    ``splits["heldout"]`` (the confirm split serves the gates' pipeline only):

    * ``top-k screen``: the ``k`` heads whose removal alone raises the search margin most (the exact screen;
      ``screen_result`` reuses one made on search items, e.g. chapter 2's ranking screen, else one is computed);
    * ``pool search``: chapter 2's search over the top ``pool_size`` screened heads on the search split
      (``pool_size >= max_k``): exhaustive, the best of every subset of size ``k``, when the pool has at most
      ``SELECTOR_SWEEP_MAX`` subsets of sizes 1..max_k, else a beam search of width ``beam_width``;
    * ``gradient``: the top ``k`` of the gradient screen (one forward and one backward);
    * ``compressed sensing``: the top ``k`` of the compressed-sensing screen (``compressed=False`` leaves it out);
    * ``learned gates``: :func:`gate_pipeline` with ``gate_settings`` (``max_k``, ``random_sets``, ``mode`` and
      ``seed`` from here);
    * ``random``: ``random_sets`` random rankings of all heads (the gates' selection-aware control); at each
      ``k`` the mean over the rankings.

    Every forward evaluation (the pool search, compressed sensing's knockouts, the gates' pipeline and all
    grading) runs in ``dtype`` (None: ``lm``'s own; ``"bfloat16"`` is about twice as fast on this CPU); the
    gradient screen and the gates learn in ``lm``'s dtype.

    Example:
        >>> sc = compare_selectors(lm, splits, max_k=5, pool_size=5)    # doctest: +SKIP
        >>> sc.summary[["selector", "area", "area_ci_low", "area_ci_high", "seconds"]]   # doctest: +SKIP
    """
    if max_k < 1 or pool_size < max_k:
        raise CELError(f"max_k must be at least 1 and pool_size at least max_k, got max_k={max_k}, "
                       f"pool_size={pool_size}")
    if beam_width < 1:
        raise CELError(f"beam_width must be at least 1, got {beam_width}")
    gs = replace(gate_settings or GateSettings(), max_k=max_k, random_sets=random_sets, mode=mode, seed=seed,
                 n_boot=n_boot, progress=progress, eval_dtype=dtype)
    gs.check(lm.n_layers * lm.n_heads)
    t_start = time.perf_counter()
    clock: dict[str, float] = {}
    enc_s, enc_h = encode_task(lm, splits["search"]), encode_task(lm, splits["heldout"])
    ablation = Ablation.of(mode).resolved(lm, enc_s.inputs)
    ev = cast(lm, dtype) if dtype else lm     # the model every forward evaluation runs on
    L = lm.n_layers
    sel: dict[str, list[list[Head]]] = {}
    cost: dict[str, dict] = {}
    # the exact single-head screen, and the pool search on it
    t0 = time.perf_counter()
    sc = screen_result if screen_result is not None else screen(ev, splits["search"], mode=ablation, enc=enc_s,
                                                                 progress=progress)
    clock["screen"] = time.perf_counter() - t0
    if len(sc.heads) < pool_size:
        raise CELError(f"the screen has {len(sc.heads)} heads, fewer than pool_size = {pool_size}")
    ranked = [(int(r.layer), int(r.head_index)) for r in sc.top(len(sc.heads)).itertuples()]
    screen_items = sc.results.correct.shape[1]
    screen_fe = sc.forward_equivalents * screen_items / enc_s.n_items
    sel["top-k screen"] = [sorted(ranked[:k]) for k in range(1, max_k + 1)]
    cost["top-k screen"] = {"forward_equivalents": screen_fe, "seconds": sc.seconds, "n_evaluations": len(sc.heads)}
    pool = ranked[:pool_size]
    t0 = time.perf_counter()
    n_subsets = sum(math.comb(len(pool), k) for k in range(1, max_k + 1))
    if n_subsets <= SELECTOR_SWEEP_MAX:
        # every subset of the pool in chapter 2's order (joint.sweep_pool): a pool chapter 2's joint search
        # already swept is read back from the result cache, not evaluated again
        top = len(pool) if len(pool) - max_k <= 1 else max_k  # the whole pool when that costs at most one size more
        score_of = sweep_scores(*sweep_pool(ev, enc_s, pool, ablation, top, n_boot=n_boot, seed=seed,
                                            progress=progress))
        found = exhaustive(pool, lambda sets: [score_of[tuple(sorted(x))] for x in sets], max_k)
        evaluated = [list(c) for k in range(1, max_k + 1) for c in itertools.combinations(pool, k)]
    else:   # too many subsets: chapter 2's beam search, with the same score (accuracy + the margin tie-break)
        evaluated = []
        scorer = model_scorer(ev, enc_s, mode=ablation, progress=progress)

        def score(sets):
            evaluated.extend(list(x) for x in sets if x)
            return scorer(sets)

        found = beam(pool, score, width=beam_width, max_size=max_k)
    sel["pool search"] = [sorted(found.best[k].heads) for k in range(1, max_k + 1)]
    clock["pool search"] = time.perf_counter() - t0
    cost["pool search"] = {"forward_equivalents": screen_fe + forward_equivalents(L, evaluated),
                           "seconds": sc.seconds + clock["pool search"],
                           "n_evaluations": len(sc.heads) + found.n_evaluations}
    # the approximate screens
    approx = [("gradient", lambda: gradient_screen(lm, splits["search"], mode=ablation, enc=enc_s))]
    if compressed:
        approx.append(("compressed sensing", lambda: compressed_screen(
            ev, splits["search"], n_evaluations=compressed_evals, mode=ablation, seed=seed, enc=enc_s)))
    for name, run in approx:
        t0 = time.perf_counter()
        ap = run()
        clock[name] = time.perf_counter() - t0
        order = np.argsort(-ap.estimate, kind="stable")
        sel[name] = [sorted(ap.heads[i] for i in order[:k]) for k in range(1, max_k + 1)]
        cost[name] = {"forward_equivalents": ap.forward_equivalents, "seconds": ap.seconds,
                      "n_evaluations": ap.n_evaluations}
    # the learned gates, through their own pipeline, and the random rankings of its control
    t0 = time.perf_counter()
    gp = gate_pipeline(lm, splits, gs)
    clock["learned gates: learning"] = gp.gates.seconds
    clock["learned gates: search, confirm and held-out, random control"] = time.perf_counter() - t0 - gp.gates.seconds
    sel["learned gates"] = [gp.gates.sets[k] for k in range(1, max_k + 1)]
    cost["learned gates"] = {"forward_equivalents": gp.gates.forward_equivalents, "seconds": gp.gates.seconds,
                             "n_evaluations": gp.gates.n_steps * len(gp.gates.penalties)}
    # every set on the held-out items: the pipeline's comparisons, and one engine call for the rest
    per_set: dict[str, tuple] = {}
    for cmp in (gp.heldout, gp.control_heldout):
        if cmp is not None:
            for j, n in enumerate(cmp.names):
                per_set[n] = (cmp.results.correct[j], cmp.results.margin[j])
    rest = {format_set(x): x for sets in sel.values() for x in sets if format_set(x) not in per_set}
    base = gp.heldout.baseline   # the unablated model on the held-out items (the same in every comparison)
    t0 = time.perf_counter()
    if rest:
        held = compare_sets(ev, enc_h, rest, mode=ablation, n_boot=n_boot, seed=seed, progress=progress)
        for j, n in enumerate(held.names):
            per_set[n] = (held.results.correct[j], held.results.margin[j])
    clock["held-out grading of the other selectors' sets"] = time.perf_counter() - t0
    rows, summary = [], []
    pool_names = {head_name(h) for h in pool}
    item_delta: dict[str, np.ndarray] = {}   # per selector: per-item change averaged over k  [n_items]
    curves: dict[str, list] = {}
    for name in [n for n in SELECTORS if n in sel or n == "random"]:
        if name == "random":
            if not gp.control_sets:
                continue
            groups = [[format_set(r[k - 1]) for r in gp.control_sets] for k in range(1, max_k + 1)]
            label = f"mean of {len(gp.control_sets)} random sets"
        else:
            groups = [[format_set(x)] for x in sel[name]]
            label = None
        correct = np.stack([np.mean([per_set[n][0] for n in g], axis=0) for g in groups])  # [k, n_items]
        margin = np.stack([np.mean([per_set[n][1] for n in g], axis=0) for g in groups])
        tab = paired_table([label or g[0] for g in groups], base, ItemResults(correct, margin), n_boot=n_boot,
                           seed=seed)
        for k, (g, r) in enumerate(zip(groups, tab.itertuples()), start=1):
            rows.append({"model": lm.name, "task": splits["search"].name, "selector": name, "k": k,
                         "heads": r.heads, "outside_pool": None if label else
                         sum(h not in pool_names for h in g[0].split("+")),
                         "heldout_delta_accuracy": float(r.delta_accuracy), "ci_low": float(r.ci_low),
                         "ci_high": float(r.ci_high), "heldout_delta_margin": float(r.delta_margin)})
        item_delta[name] = (correct - base.correct[0][None]).mean(axis=0)
        curves[name] = tab["delta_accuracy"].to_numpy()
    for name, d in item_delta.items():
        area = bootstrap_mean(d, n_boot, seed)
        vs = bootstrap_mean(d - item_delta["pool search"], n_boot, seed)
        best = int(np.argmax(curves[name]))
        c = cost.get(name, {"forward_equivalents": 0.0, "seconds": 0.0, "n_evaluations": 0})
        summary.append({"model": lm.name, "task": splits["search"].name, "selector": name, "area": area[0],
                        "area_ci_low": area[1], "area_ci_high": area[2], "area_vs_pool": vs[0],
                        "area_vs_pool_ci_low": vs[1], "area_vs_pool_ci_high": vs[2], "best_k": best + 1,
                        "best_gain": float(curves[name][best]), **c})
    clock["total"] = time.perf_counter() - t_start
    return SelectorComparison(model=lm.name, task=splits["search"].name, max_k=max_k, pool=pool,
                              table=pd.DataFrame(rows), summary=pd.DataFrame(summary), pipeline=gp,
                              n_search=enc_s.n_items, n_heldout=enc_h.n_items, timings=clock)
