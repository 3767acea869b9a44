"""Chapter 3's data as tokens, learned by a real transformer: a one-layer, four-head, attention-only Llama trained on
CPU (chapter 3a, ``cel toy-train``).

The tasks ``toy_a`` and ``toy_b`` (:mod:`cel_utils.generators`) write chapter 3's sequences as characters: one
signal token of each type A, B and C and 15 distractors D, shuffled, then the query ``?``; a token's case is its
sign (``A`` +1, ``a`` -1) and agrees with the answer (``+`` or ``-``) with the type's correlation of
:data:`cel_utils.defaults.TOY_RHO`. The two tasks share every token; nothing in a prompt says which task it is.

The network is a Llama of the model room with one layer, :data:`N_HEADS` heads and its MLP's output fixed at zero
(attention only), so every tool of the book (hooks, the engine, the verdict pipeline, the battery) runs on it
unchanged once :func:`export` has written it as a local model folder. Training runs many networks at once
(:func:`train`: the same arithmetic as the Llama's forward, written over a leading run axis and only at the query
position, checked against the exported model's logits in ``tests/test_toynet.py``). Two attentions:

* ``softmax``: the prompt as written; a head must spread its weight over the tokens it sees;
* ``softmax1``: the tokenizer puts :data:`NULL` first, a token whose embedding is fixed at zero. Its key and value
  are then exactly zero, so it adds a zero logit and a zero value to every head: softmax-1, a head that can
  attend to nothing (an attention sink that writes nothing).

Example:
    >>> r = train(seeds=range(2), steps=20, every=10, n_eval=64)
    >>> r.gains.shape   # [checkpoint, run, head, task]
    (3, 2, 4, 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from . import profiling, threads
from .defaults import TOY_DISTRACTORS, TOY_RHO, TOYNET_EFFECT, TOYNET_STEPS, progress_enabled
from .rival import combine, kind_of, reading, share_ci
from .tiny import char_tokenizer

TYPES = "ABCD"                 # token types; the upper case is sign +1, the lower case -1
QUERY, NULL = "?", "^"
ANSWERS = ("+", "-")           # the choices: y = +1, y = -1
TASKS = tuple(TOY_RHO)         # ("toy_a", "toy_b")
ATTENTIONS = ("softmax", "softmax1")
N_HEADS, HEAD_DIM, D_MODEL = 4, 8, 32
EPS = 1e-6                     # the RMSNorm epsilon (the exported config's rms_norm_eps)
ROPE_THETA = 10000.0


def tokenizer(attention: str = "softmax"):
    """The character tokenizer of :mod:`cel_utils.tiny`; for ``softmax1`` it puts :data:`NULL` before every text."""
    from tokenizers import processors

    tok = char_tokenizer()
    if attention == "softmax1":
        null = tok.convert_tokens_to_ids(NULL)
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{NULL} $A", pair=f"{NULL} $A $B", special_tokens=[(NULL, null)])
    return tok


def token_table(tok) -> torch.Tensor:
    """``[type, sign]`` token ids (sign 0: +1, 1: -1)."""
    return torch.tensor([[tok.convert_tokens_to_ids(c), tok.convert_tokens_to_ids(c.lower())] for c in TYPES])


def sample(gen: torch.Generator, runs: int, batch: int, table: torch.Tensor, query: int, null: int | None,
           task: torch.Tensor | None = None):
    """Sequences for ``runs`` networks: ``ids [runs, batch, T]`` (the query last; :data:`NULL` first when given),
    ``y [runs, batch]`` (+1 or -1), ``task [runs, batch]`` (0: toy_a, 1: toy_b; drawn when not given) and each
    position's type ``[runs, batch, T]`` (0-3: A-D, 4: the query, 5: :data:`NULL`)."""
    base = torch.tensor([0, 1, 2] + [3] * TOY_DISTRACTORS)
    n = len(base)
    types = base[torch.rand(runs, batch, n, generator=gen).argsort(-1)]             # [runs, batch, n]
    if task is None:
        task = (torch.rand(runs, batch, generator=gen) < 0.5).long()
    y = torch.where(torch.rand(runs, batch, generator=gen) < 0.5, 1.0, -1.0)
    rho = torch.tensor([TOY_RHO[t] for t in TASKS], dtype=torch.float32)             # [task, type]
    agree = torch.rand(runs, batch, n, generator=gen) < (1 + rho[task[..., None], types]) / 2
    sign = torch.where(agree, y[..., None], -y[..., None])
    ids = table[types, (sign < 0).long()]
    pad = [(torch.full((runs, batch, 1), null), torch.full((runs, batch, 1), 5))] if null is not None else []
    parts = pad + [(ids, types), (torch.full((runs, batch, 1), query), torch.full((runs, batch, 1), 4))]
    return torch.cat([a for a, _ in parts], -1), y, task, torch.cat([b for _, b in parts], -1)


# ----------------------------------------------------------------------------------------------
# Many networks at once: parameters with a leading run axis, the forward at the query position only
# ----------------------------------------------------------------------------------------------
NAMES = ("embed", "norm1", "wq", "wk", "wv", "wo", "norm", "unembed")


def init_params(runs: int, vocab: int, scale: float | list = 1.0, seeds=None) -> dict[str, torch.Tensor]:
    """Each run's parameters from its own generator (seed ``seeds[r]``): matrices N(0, (scale / sqrt(d))^2),
    norms 1. ``scale`` is one number or one per run (the initial-scale axis)."""
    seeds = list(range(runs)) if seeds is None else list(seeds)
    scales = [float(scale)] * runs if np.isscalar(scale) else [float(s) for s in scale]
    inner = N_HEADS * HEAD_DIM
    shapes = {"embed": (vocab, D_MODEL), "wq": (inner, D_MODEL), "wk": (inner, D_MODEL), "wv": (inner, D_MODEL),
              "wo": (D_MODEL, inner), "unembed": (vocab, D_MODEL)}
    out = {k: [] for k in shapes}
    for s, sc in zip(seeds, scales):
        g = torch.Generator().manual_seed(int(s))
        for k, shape in shapes.items():
            out[k].append(torch.randn(shape, generator=g) * sc / np.sqrt(shape[1]))
    P = {k: torch.stack(v) for k, v in out.items()}
    P["norm1"] = torch.ones(runs, D_MODEL)
    P["norm"] = torch.ones(runs, D_MODEL)
    return P


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Llama's RMSNorm: ``x / sqrt(mean(x^2) + eps) * w`` (``w [runs, d]`` broadcast over the middle axes)."""
    w = w.view(w.shape[0], *([1] * (x.dim() - 2)), w.shape[-1])
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x [..., pos, head, d_head]`` at positions ``pos [pos]`` (Llama's: the
    halves of each head's vector rotated by ``pos * theta^(-2i/d)``)."""
    half = HEAD_DIM // 2
    freq = pos.float()[:, None] * ROPE_THETA ** (-torch.arange(half, dtype=torch.float32) * 2 / HEAD_DIM)
    cos, sin = freq.cos()[:, None, :], freq.sin()[:, None, :]       # [pos, 1, half]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def head_outputs(P: dict, ids: torch.Tensor, pattern: bool = False) -> torch.Tensor:
    """Each head's output at the last position, before the output projection: ``z [runs, batch, head, d_head]`` for
    ``ids [runs, batch, T]`` whose last token is one query token at one position for every sequence (as in
    :func:`sample`). The query's vector is then one per run and a key or value depends only on its token (and the
    key on its position), so scores and values are read from tables over the tokens present. With ``pattern`` the
    attention weights from the query ``[runs, batch, head, T]`` instead."""
    R, B, T = ids.shape
    q_tok = ids[:, :, -1]
    if not bool((q_tok == q_tok[:1, :1]).all()):
        raise ValueError("every sequence must end with the same query token")
    used, cid = torch.unique(ids, return_inverse=True)                  # cid [runs, batch, T]: index into used
    h = rms(P["embed"][:, used], P["norm1"])                            # [runs, U, d]
    U = len(used)
    k = torch.einsum("rud,rfd->ruf", h, P["wk"]).view(R, U, 1, N_HEADS, HEAD_DIM)
    k = rope(k.expand(R, U, T, N_HEADS, HEAD_DIM), torch.arange(T))     # [runs, U, T, head, d_head]
    v = torch.einsum("rud,rfd->ruf", h, P["wv"]).view(R, U, N_HEADS, HEAD_DIM)
    qi = int((used == q_tok[0, 0]).nonzero())
    q = rope(torch.einsum("rd,rfd->rf", h[:, qi], P["wq"]).view(R, 1, N_HEADS, HEAD_DIM), torch.tensor([T - 1]))
    table = torch.einsum("rhe,ruthe->rthu", q[:, 0], k) * HEAD_DIM ** -0.5   # [runs, T, head, U]: every score
    onehot = torch.nn.functional.one_hot(cid, U).to(h.dtype)            # [runs, batch, T, U]
    scores = torch.einsum("rthu,rbtu->rbht", table, onehot)             # [runs, batch, head, T]
    p = torch.softmax(scores, -1)
    if pattern:
        return p
    return torch.einsum("rbht,rbtu,ruhe->rbhe", p, onehot, v)           # [runs, batch, head, d_head]


def logits_from(P: dict, ids: torch.Tensor, z: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """The logits at the last position ``[runs, batch, vocab]`` from the heads' outputs ``z`` (:func:`head_outputs`);
    ``keep [runs, head]`` (or ``[runs, batch, head]``) multiplies each head's output before the output projection
    (0: removed)."""
    R, B, _ = ids.shape
    if keep is not None:
        z = z * (keep[:, None, :, None] if keep.dim() == 2 else keep[..., None])
    x = P["embed"][torch.arange(R)[:, None], ids[:, :, -1]]            # [runs, batch, d]: the query's residual
    out = x + torch.einsum("rbf,rdf->rbd", z.reshape(R, B, -1), P["wo"])
    return torch.einsum("rbd,rvd->rbv", rms(out, P["norm"]), P["unembed"])


def query_logits(P: dict, ids: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """The logits at the last position ``[runs, batch, vocab]`` of ``ids [runs, batch, T]`` with heads scaled by
    ``keep`` (:func:`logits_from`)."""
    return logits_from(P, ids, head_outputs(P, ids), keep)


# ----------------------------------------------------------------------------------------------
# One run as a Llama of the model room
# ----------------------------------------------------------------------------------------------
def llama(P: dict, run: int, attention: str = "softmax", name: str = "toynet"):
    """Run ``run`` of ``P`` as a :class:`~cel_utils.models.LoadedModel`: a ``LlamaForCausalLM`` with one layer
    whose MLP writes exactly zero (its down projection is zero), and the tokenizer of ``attention``."""
    import transformers

    from .models import state_hash, wrap_model

    tok = tokenizer(attention)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=D_MODEL, intermediate_size=1, num_hidden_layers=1,
        num_attention_heads=N_HEADS, num_key_value_heads=N_HEADS, head_dim=HEAD_DIM, rms_norm_eps=EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA}, max_position_embeddings=64,
        tie_word_embeddings=False, pad_token_id=tok.pad_token_id, bos_token_id=None, eos_token_id=tok.eos_token_id)
    model = transformers.LlamaForCausalLM(cfg).eval()
    w = {k: v[run].detach().clone() for k, v in P.items()}
    layer = model.model.layers[0]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(w["embed"])
        layer.input_layernorm.weight.copy_(w["norm1"])
        for proj, key in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv"), ("o_proj", "wo")):
            getattr(layer.self_attn, proj).weight.copy_(w[key])
        layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.copy_(w["norm"])
        model.lm_head.weight.copy_(w["unembed"])
    return wrap_model(model, tok, name=name, weights_hash=state_hash(model))


# ----------------------------------------------------------------------------------------------
# Training, with each head's removal gain on both tasks at checkpoints
# ----------------------------------------------------------------------------------------------
@dataclass
class Training:
    """Runs of one attention trained together: final parameters, and at each checkpoint step the intact accuracy
    ``accuracy [checkpoint, run, task]`` and each head's removal gain ``gains [checkpoint, run, head, task]`` on a
    fixed evaluation set, and the final mean attention of each head on each token type ``attention [run, head,
    type]`` (types A, B, C, D, then the query, then :data:`NULL` when present)."""

    attention: str
    seeds: list
    scales: list
    steps: list
    accuracy: np.ndarray
    gains: np.ndarray
    loss: np.ndarray                 # [checkpoint, run]: the training loss at the checkpoint
    attention_by_type: np.ndarray
    params: dict = field(repr=False, default_factory=dict)

    def model(self, run: int, name: str | None = None):
        """Run ``run`` as a Llama of the model room (:func:`llama`)."""
        return llama(self.params, run, self.attention,
                     name or f"toynet-{self.attention}-scale{self.scales[run]:g}-seed{self.seeds[run]}")


def _evaluate(P: dict, ids: torch.Tensor, y: torch.Tensor, plus: int, minus: int) -> torch.Tensor:
    """Accuracy ``[runs, 1 + head]`` on shared ``ids [1, n, T]``: intact, then each head removed."""
    R = P["embed"].shape[0]
    ids = ids.expand(R, -1, -1)
    z = head_outputs(P, ids)
    out = []
    for h in range(-1, N_HEADS):
        keep = torch.ones(R, N_HEADS)
        if h >= 0:
            keep[:, h] = 0
        lg = logits_from(P, ids, z, keep)
        out.append(((lg[..., plus] - lg[..., minus]) * y > 0).float().mean(-1))
    return torch.stack(out, -1)


def attention_by_type(P: dict, ids: torch.Tensor, types: torch.Tensor) -> np.ndarray:
    """Mean attention of each head from the query on each token type: ``[runs, head, type]``."""
    R, B = P["embed"].shape[0], ids.shape[1]
    p = head_outputs(P, ids.expand(R, -1, -1), pattern=True)          # [runs, batch, head, T]
    onehot = torch.nn.functional.one_hot(types[0], int(types.max()) + 1).float()     # [batch, T, type]
    return (torch.einsum("rbht,btk->rhk", p, onehot) / B).numpy()


@profiling.timed
def train(attention: str = "softmax", seeds=range(20), scales=(1.0,), steps: int = TOYNET_STEPS, batch: int = 128,
          lr: float = 3e-3, every: int = 50, n_eval: int = 1000, progress: bool = True) -> Training:
    """Train one network per (scale, seed) on an even mix of ``toy_a`` and ``toy_b`` (fresh sequences every
    step, cross-entropy of the answer at the query), all at once with Adam; evaluate at step 0, every ``every``
    steps and at the end on ``n_eval`` fixed sequences per task."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    from tqdm.auto import tqdm

    tok = tokenizer(attention)
    table, query = token_table(tok), tok.convert_tokens_to_ids(QUERY)
    null = tok.convert_tokens_to_ids(NULL) if attention == "softmax1" else None
    plus, minus = (tok.convert_tokens_to_ids(a) for a in ANSWERS)
    runs = [(sc, s) for sc in scales for s in seeds]
    P = init_params(len(runs), len(tok), [r[0] for r in runs], [r[1] for r in runs])
    if null is not None:
        P["embed"][:, null] = 0.0
    for v in P.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam(list(P.values()), lr=lr)
    gen = torch.Generator().manual_seed(12345)
    ev = [sample(torch.Generator().manual_seed(999 + t), 1, n_eval, table, query, null,
                 torch.full((1, n_eval), t)) for t in range(len(TASKS))]
    marks = sorted({0, steps, *range(every, steps, every)})
    acc, losses = [], []
    loss = torch.tensor(float("nan"))
    for step in tqdm(range(steps + 1), desc=f"training ({attention})", disable=not progress_enabled(progress)):
        if step in marks:
            with torch.no_grad():
                acc.append(torch.stack([_evaluate(P, e[0], e[1], plus, minus) for e in ev], -1))
                losses.append(loss.detach().clone() if step else torch.full((len(runs),), float("nan")))
        if step == steps:
            break
        ids, y, _, _ = sample(gen, len(runs), batch, table, query, null)
        lg = query_logits(P, ids)
        target = torch.where(y > 0, plus, minus)
        loss = torch.nn.functional.cross_entropy(lg.flatten(0, 1), target.flatten(), reduction="none").view(
            len(runs), batch).mean(-1)
        opt.zero_grad()
        loss.sum().backward()
        threads.adapt()
        if null is not None:
            P["embed"].grad[:, null] = 0.0
        opt.step()
    A = torch.stack(acc).numpy()                                           # [checkpoint, run, 1 + head, task]
    P = {k: v.detach() for k, v in P.items()}
    with torch.no_grad():
        by_type = attention_by_type(P, ev[0][0], ev[0][3])
    return Training(attention=attention, seeds=[r[1] for r in runs], scales=[r[0] for r in runs], steps=marks,
                    accuracy=A[:, :, 0], gains=A[:, :, 1:] - A[:, :, :1], loss=torch.stack(losses).numpy(),
                    attention_by_type=by_type, params=P)


# ----------------------------------------------------------------------------------------------
# Reading the runs: which account each run's best removal fits, and when it formed
# ----------------------------------------------------------------------------------------------
def outcomes(tr: Training, checkpoint: int = -1, eps: float = TOYNET_EFFECT) -> pd.DataFrame:
    """One row per run at a checkpoint (the last by default): the head whose removal raises toy_a's accuracy most,
    its changes on both tasks, the run's ``kind`` (:func:`cel_utils.rival.kind_of`), whether some head's removal raises both
    tasks by more than ``eps`` (``helps_both``), the intact accuracies, and the share of that head's attention on
    the conflicting token C."""
    g = tr.gains[checkpoint]                                              # [run, head, task]
    best = g[:, :, 0].argmax(1)
    idx = np.arange(len(best))
    return pd.DataFrame({
        "attention": tr.attention, "scale": tr.scales, "seed": tr.seeds, "head": [f"L0H{h}" for h in best],
        "gain_a": g[idx, best, 0], "change_b": g[idx, best, 1], "kind": kind_of(g[idx, best, 0], g[idx, best, 1], eps),
        "helps_both": ((g[:, :, 0] > eps) & (g[:, :, 1] > eps)).any(1),
        "accuracy_a": tr.accuracy[checkpoint, :, 0], "accuracy_b": tr.accuracy[checkpoint, :, 1],
        "head_attention_c": tr.attention_by_type[idx, best, 2]})


def formation(tr: Training, eps: float = TOYNET_EFFECT) -> pd.DataFrame:
    """Per checkpoint and initial scale: the share of runs whose best removal is a two-sided trade-off, and the mean
    gain of that removal on toy_a (when in training the enhancement head forms)."""
    rows = []
    for c, step in enumerate(tr.steps):
        o = outcomes(tr, c, eps)
        for sc, g in o.groupby("scale"):
            rows.append({"attention": tr.attention, "scale": sc, "step": step, "runs": len(g),
                         "two_sided": float((g.kind == "two-sided").mean()), "gain_a": float(g.gain_a.mean()),
                         "accuracy_a": float(g.accuracy_a.mean()), "accuracy_b": float(g.accuracy_b.mean())})
    return pd.DataFrame(rows)


def cells(table: pd.DataFrame) -> pd.DataFrame:
    """Per (attention, initial scale): runs, the share of each kind with its exact (Clopper-Pearson) 95% CI,
    runs where some removal helps both tasks, and the mean intact accuracies."""
    rows = []
    for (att, sc), g in table.groupby(["attention", "scale"], sort=False):
        n = len(g)
        two, lo, hi = share_ci(int((g.kind == "two-sided").sum()), n)
        one, olo, ohi = share_ci(int((g.kind == "one-sided").sum()), n)
        rows.append({"attention": att, "scale": sc, "runs": n, "two_sided": two, "two_sided_low": lo,
                     "two_sided_high": hi, "one_sided": one, "one_sided_low": olo, "one_sided_high": ohi,
                     "helps_both": int(g.helps_both.sum()), "gain_a": float(g.gain_a.mean()),
                     "accuracy_a": float(g.accuracy_a.mean()), "accuracy_b": float(g.accuracy_b.mean())})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# The book's own pipeline and battery on the trained networks
# ----------------------------------------------------------------------------------------------
def export(tr: Training, run: int, folder) -> str:
    """Write run ``run`` as a local model folder (``config.json``, weights, tokenizer) that
    :func:`cel_utils.models.load_model` opens like any user's model; returns the folder."""
    from pathlib import Path

    from transformers.utils import logging as hf_logging

    lm = tr.model(run)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()          # no "Writing model shards" bar left in a rendered page
    try:
        lm.model.save_pretrained(folder)
        lm.tokenizer.save_pretrained(folder)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    return str(folder)


@profiling.timed
def verdicts(tr: Training, runs=None, task: str = "toy_a", partner: str = "toy_b", progress: bool = True,
             **settings) -> pd.DataFrame:
    """The book's verdict (:func:`cel_utils.verdict.single_head_verdict`) on ``task`` for each run, every head
    re-tested on the confirm split (``top_k`` = :data:`N_HEADS`: with four heads there is no ranking to simulate, so
    the planted-power simulation is off and the confirm test's best-case MDE is reported); for a localized run, the
    chosen head's held-out change on ``partner`` (exact McNemar) and whether it is the head training's evaluation
    named (:func:`outcomes`)."""
    from tqdm.auto import tqdm

    from .ablation import parse_heads
    from .compare import compare_sets
    from .defaults import N_HELDOUT
    from .stats import fixes_breaks, mcnemar_exact
    from .tasks import load_task
    from .verdict import single_head_verdict

    best = outcomes(tr)
    partner_items = load_task(partner, "heldout", n=settings.get("n_heldout", N_HELDOUT), clip=True)
    rows = []
    for i in tqdm(list(range(len(tr.seeds)) if runs is None else runs), desc=f"verdicts ({tr.attention})",
                  disable=not progress_enabled(progress)):
        lm = tr.model(i)
        v = single_head_verdict(lm, task, **{"top_k": N_HEADS, "power_sims": 0, **settings})
        rec, sets = v.run.record(), v.run.sets.set_index("heads")
        chosen = rec.get("chosen")
        row = {"attention": tr.attention, "scale": tr.scales[i], "seed": tr.seeds[i], "run": i, "chosen": chosen,
               "confirmed": int(sets["confirmed"].sum()), "mde": v.power["min_detectable_gain"],
               "training_head": best["head"][i], "training_kind": best["kind"][i]}
        if chosen:
            cmp = compare_sets(lm, partner_items, {chosen: parse_heads(chosen, 1, N_HEADS)})
            t = cmp.table.iloc[0]
            fixes, breaks = fixes_breaks(cmp.baseline.correct[0], cmp.results.correct[0])
            row.update(heldout_gain=float(sets.loc[chosen, "heldout_delta_accuracy"]),
                       heldout_low=float(sets.loc[chosen, "heldout_ci_low"]),
                       heldout_high=float(sets.loc[chosen, "heldout_ci_high"]), holds=bool(sets.loc[chosen, "holds"]),
                       partner_change=float(t.delta_accuracy), partner_low=float(t.ci_low),
                       partner_high=float(t.ci_high), partner_p=float(mcnemar_exact(fixes, breaks)[0]),
                       same_head=chosen == best["head"][i])
        rows.append(row)
    return pd.DataFrame(rows)


def holding(v: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`verdicts` whose chosen head's held-out gain holds (none when no run chose a head)."""
    return v[v.get("holds", pd.Series(False, index=v.index)).fillna(False).astype(bool)]


def localized(v: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Per (attention, initial scale) from :func:`verdicts`: the runs, the share the pipeline localizes (a head whose
    held-out gain holds) with its exact CI, and among those the share whose removal lowers the partner task (exact
    McNemar p below ``alpha``: a tested two-sided trade-off) with its CI; whether the pipeline chose training's head."""
    rows = []
    for (att, sc), g in v.groupby(["attention", "scale"], sort=False):
        held = holding(g)
        two = held[(held.partner_change < 0) & (held.partner_p < alpha)]
        s, lo, hi = share_ci(len(held), len(g))
        t, tlo, thi = share_ci(len(two), len(held))
        rows.append({"attention": att, "scale": sc, "runs": len(g), "localized": len(held), "localized_share": s,
                     "localized_low": lo, "localized_high": hi, "two_sided": len(two), "two_sided_share": t,
                     "two_sided_low": tlo, "two_sided_high": thi,
                     "same_head": int(held.same_head.astype(bool).sum()) if len(held) else 0,
                     "heldout_gain": float(held.heldout_gain.mean()) if len(held) else float("nan"),
                     "partner_change": float(held.partner_change.mean()) if len(held) else float("nan")})
    return pd.DataFrame(rows)


def predictions(loc: pd.DataFrame) -> pd.DataFrame:
    """Per initial scale, each account's prediction read from :func:`localized`'s CIs
    (:func:`cel_utils.rival.reading`): conflict, a tested two-sided trade-off in most localized runs under both
    attentions; noise, one-sided gains (the partner not lowered) in most localized softmax runs and in fewer than
    half of the softmax-1 runs."""
    rows = []
    for sc, g in loc.groupby("scale", sort=False):
        g = g.set_index("attention")
        conflict = [reading(g.loc[a, "two_sided_low"], g.loc[a, "two_sided_high"]) for a in ATTENTIONS]
        one = lambda a: (1 - g.loc[a, "two_sided_high"], 1 - g.loc[a, "two_sided_low"])  # noqa: E731
        noise = [reading(*one("softmax")), reading(*one("softmax1"), want_high=False)]
        rows.append({"scale": sc, "conflict": combine(conflict), "noise": combine(noise),
                     "conflict_parts": ", ".join(conflict), "noise_parts": ", ".join(noise)})
    return pd.DataFrame(rows)


@profiling.timed
def batteries(tr: Training, v: pd.DataFrame, per_scale: int = 1, **settings) -> list:
    """The battery of chapter 1c (:func:`cel_utils.battery.battery`) on the head the pipeline chose, for the first
    ``per_scale`` localized runs of each initial scale: toy_a's six orderings of the same tokens as its formats,
    toy_b as the control task; no general text (the network has never seen any). Returns ``(row, Battery)``."""
    from .ablation import parse_heads
    from .battery import RobustSettings, battery
    from .defaults import N_CONFIRM, N_HELDOUT

    s = RobustSettings(**{"n": 200, "items": (("heldout", N_HELDOUT), ("confirm", N_CONFIRM)), "text_tokens": 0,
                          **settings})
    out = []
    held = holding(v[v.attention == tr.attention])
    for _, g in held.groupby("scale", sort=False):
        for r in g.head(per_scale).itertuples():
            b = battery(tr.model(int(r.run)), "toy_a", {r.chosen: parse_heads(r.chosen, 1, N_HEADS)}, s)[0]
            out.append((r._asdict(), b))
    return out
