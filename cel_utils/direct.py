"""Direct logit attribution: one *read* per item, the clean run kept at the reads, and each component's direct
contribution to the logit difference there; :func:`direct_ranking` ranks every head by it.

For each item we take one *read*: a position, the answer token and the competitor token the score reads there.
Multiple choice: the first position where the answer and the runner-up choice (highest-scoring wrong choice in
the clean run) differ. Exact match: the read whose gap is smallest in the clean run (the one that decides the
item); the competitor is the highest other token there (after the answer: the best token that would continue
it, against the best one that ends it). The *logit difference* is logit(answer) - logit(competitor) at the read.

The final residual at the read is a sum of components: the embedding, every head's output (its slice of the
output projection's input through the projection, and through Gemma's post-attention norm with that norm's scale
frozen from the clean run), every projection bias and every MLP. With the final norm's scale frozen from the
clean run the logits are linear in these, so each component's contribution to the logit difference adds up,
exactly, to the clean logit difference. A head's *direct effect* is what removing its output from the final
residual alone does: minus its contribution. What a head does beyond it (total effect, the path split):
:mod:`cel_utils.mechanism`.

Example (a tiny random model, so the ranking means nothing):
    >>> from cel_utils.tiny import tiny_model
    >>> from cel_utils.tasks import load_task
    >>> lm = tiny_model("llama")
    >>> ranking = direct_ranking(lm, load_task("ioi", "search", n=4))
    >>> len(ranking) == lm.n_layers * lm.n_heads, list(ranking.columns[-2:])
    (True, ['share_positive', 'mean_direct'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import hooks, profiling
from .ablation import Head, ablate_heads, head_name
from .engine import evaluate
from .errors import CELError
from .models import cast
from .scoring import STOP, encode_task, logits_at, read_stats


def final_norm(lm) -> torch.nn.Module:
    return hooks.final_norm(lm)


def post_attention_norm(lm, layer: int) -> torch.nn.Module | None:
    return hooks.post_attention_norm(lm, layer)


def frozen_norm(norm: torch.nn.Module, ref: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The norm's map with its scale frozen at ``ref`` (the clean input): linear in ``c`` ``[..., d]``, no bias.

    ``frozen_norm(norm, x, x)`` is ``norm(x)`` minus the norm's bias, and ``frozen_norm(norm, x, a + b)`` is
    ``frozen_norm(norm, x, a) + frozen_norm(norm, x, b)``.

    Example:
        >>> import torch
        >>> ln = torch.nn.LayerNorm(4)
        >>> x = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
        >>> torch.allclose(frozen_norm(ln, x, x) + ln.bias, ln(x))
        True
    """
    if isinstance(norm, torch.nn.Identity):
        return c
    if isinstance(norm, torch.nn.LayerNorm):
        var = ref.float().var(-1, unbiased=False, keepdim=True)
        y = (c - c.mean(-1, keepdim=True)) / torch.sqrt(var + norm.eps)
        return y * norm.weight if norm.weight is not None else y
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if eps is None:
        raise CELError(f"cannot freeze the scale of {type(norm).__name__}: not an RMS or layer norm")
    # an RMS norm is c * rsqrt(mean(c^2) + eps) * gain (gain = weight, or 1 + weight in Gemma): keep the gain,
    # swap the scale of c for the scale of ref
    s_ref = torch.rsqrt(ref.float().pow(2).mean(-1, keepdim=True) + eps)
    s_c = torch.rsqrt(c.float().pow(2).mean(-1, keepdim=True) + eps)
    return norm(c) * (s_ref / s_c)


def norm_bias(norm: torch.nn.Module) -> torch.Tensor | None:
    b = getattr(norm, "bias", None)
    return b if isinstance(b, torch.Tensor) else None


@dataclass
class Reads:
    """One read per item: the token ids up to the read position, the answer and the competitor token there."""

    items: np.ndarray        # [n] item indices of the task
    inputs: list[list[int]]  # the read position is the last token of each input
    answer: np.ndarray       # [n] token id
    competitor: np.ndarray   # [n] token id
    target_index: np.ndarray  # [n] which continuation token is read (0 = first; exact match: len(target) = after it)

    def __len__(self) -> int:
        return len(self.items)


@torch.no_grad()
def _logits_rows(lm, seqs: Sequence[Sequence[int]], positions: Sequence[Sequence[int]], batch_size: int = 16
                 ) -> list[torch.Tensor]:
    """Model logits ``[len(positions[i]), vocab]`` at the given positions of each sequence."""
    out = []
    for b, ids, att in hooks.padded_batches(lm, seqs, batch_size):
        hidden = hooks.hidden_states(lm, ids, att)  # [batch, pos, d]
        for r, pos in enumerate(positions[b:b + batch_size]):
            out.append(logits_at(lm, hidden[r, list(pos)]).float().cpu())  # [len(pos), vocab]
    return out


def choose_reads(lm, task) -> Reads:
    """The read of each item (see the module's docstring). Items without a position where the answer and the
    competitor differ (one choice a prefix of another) are left out."""
    enc = encode_task(lm, task)
    items, inputs, ans, comp, tidx = [], [], [], [], []
    if enc.kind == "mc":
        scores = evaluate(lm, enc, ()).choice_scores[0]  # [item, choice]
        whole = {(i, c): w for i, c, w, _ in enc.full}
        nctx = {i: n for i, _, _, n in enc.full}
        for i in range(enc.n_items):
            s = scores[i].copy()
            s[enc.answers[i]] = -np.inf
            runner = int(np.argmax(s))
            wa, wb = whole[(i, int(enc.answers[i]))], whole[(i, runner)]
            j = next((k for k in range(nctx[i], min(len(wa), len(wb))) if wa[k] != wb[k]), None)
            if j is None:
                continue
            items.append(i); inputs.append(wa[:j]); ans.append(wa[j]); comp.append(wb[j]); tidx.append(j - nctx[i])
    else:
        rows = _logits_rows(lm, [w for _, _, w, _ in enc.full],
                            [range(n - 1, len(w)) for _, _, w, n in enc.full])
        cont = enc.continues
        for (i, _, w, n), lg in zip(enc.full, rows):
            toks = torch.tensor(list(w[n:]) + [STOP])
            _, gap = read_stats(lg, toks, cont)
            k = int(torch.argmin(gap))
            row = lg[k]
            if k < len(w) - n:  # a target token
                a = int(toks[k])
                b = int(row.scatter(0, torch.tensor([a]), float("-inf")).argmax())
            else:  # after the answer: the best token that ends it against the best that would continue it
                a = int(row.masked_fill(cont, float("-inf")).argmax())
                b = int(row.masked_fill(~cont, float("-inf")).argmax())
            items.append(i); inputs.append(list(w[:n + k])); ans.append(a); comp.append(b); tidx.append(k)
    a = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    return Reads(items=a(items), inputs=inputs, answer=a(ans), competitor=a(comp), target_index=a(tidx))


@dataclass
class Trace:
    """What the clean run leaves at the read positions (all ``[n, ...]``, float32, on the CPU)."""

    reads: Reads
    head_in: list[torch.Tensor]     # per layer [n, n_heads * head_dim]: the output projection's input
    proj_out: list[torch.Tensor]    # per layer [n, d]: the output projection's output
    attn_out: list[torch.Tensor]    # per layer [n, d]: what the attention adds to the residual stream
    layer_in0: torch.Tensor         # [n, d]: the residual entering layer 0 (embeddings)
    layer_out: list[torch.Tensor]   # per layer [n, d]: the residual leaving each layer
    final: torch.Tensor             # [n, d]: the final residual (the final norm's input)
    logit_diff: torch.Tensor        # [n]: logit(answer) - logit(competitor), from the final residual

    @property
    def n_layers(self) -> int:
        return len(self.head_in)


def _capture_points(lm, store: dict, positions: torch.Tensor) -> list:
    """Read-only hooks that keep, at the read positions, the inputs and outputs a :class:`Trace` needs."""
    rows = torch.arange(len(positions))

    def keep(key, flat=False):
        def fn(x):
            x = x[rows, positions]  # [n, features] ([n, head, d_head] at z)
            store.setdefault(key, (x.reshape(len(rows), -1) if flat else x).detach().float().cpu())
        return fn

    points = [("resid_pre", 0, keep("layer_in0")), ("final", None, keep("final"))]
    for l in range(lm.n_layers):
        points += [("z", l, keep(("head_in", l), flat=True)), ("proj_out", l, keep(("proj_out", l))),
                   ("attn_out", l, keep(("attn_out", l))), ("resid_post", l, keep(("layer_out", l)))]
    return points


def unembed(lm) -> torch.Tensor:
    """The unembedding ``[vocab, d]`` (float32, CPU)."""
    return lm.model.get_output_embeddings().weight.detach().float().cpu()


@torch.no_grad()
def logits_from_final(lm, final: torch.Tensor) -> torch.Tensor:
    """Logits ``[n, vocab]`` from final residuals ``[n, d]``, norm recomputed (before any final soft-cap)."""
    return lm.model.get_output_embeddings()(final_norm(lm)(final)).float()


def logit_diff(lm, reads: Reads, final: torch.Tensor) -> torch.Tensor:
    """logit(answer) - logit(competitor) ``[n]`` from final residuals ``[n, d]``."""
    lg = logits_from_final(lm, final)
    idx = torch.arange(len(reads))
    return lg[idx, torch.as_tensor(reads.answer)] - lg[idx, torch.as_tensor(reads.competitor)]


@torch.no_grad()
def _run(lm, reads: Reads, heads: Sequence[Head] = (), batch_size: int = 16) -> dict:
    """One pass over the reads (heads ablated, if any), keeping the :class:`Trace` tensors."""
    parts: list[dict] = []
    with ablate_heads(lm, list(heads)):
        for b, ids, att in hooks.padded_batches(lm, reads.inputs, batch_size):
            pos = torch.tensor([len(s) - 1 for s in reads.inputs[b:b + batch_size]])
            store: dict = {}
            with hooks.hooked(lm, _capture_points(lm, store, pos)):  # the base model: no logits needed here
                hooks.hidden_states(lm, ids, att)
            parts.append(store)
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


@profiling.timed
def trace(lm, reads: Reads, heads: Sequence[Head] = (), batch_size: int = 16) -> Trace:
    """The run at the reads: clean, or with ``heads`` ablated."""
    if len(reads) == 0:
        raise CELError("no reads to trace: every item was left out")
    s = _run(lm, reads, heads=heads, batch_size=batch_size)
    L = lm.n_layers
    attn = [s[("attn_out", l)] for l in range(L)]
    return Trace(reads=reads, head_in=[s[("head_in", l)] for l in range(L)],
                 proj_out=[s[("proj_out", l)] for l in range(L)], attn_out=attn, layer_in0=s["layer_in0"],
                 layer_out=[s[("layer_out", l)] for l in range(L)], final=s["final"],
                 logit_diff=logit_diff(lm, reads, s["final"]))


@torch.no_grad()
def head_output(lm, tr: Trace, head: Head) -> torch.Tensor:
    """What head ``(layer, head)`` adds to the residual stream at each read ``[n, d]`` (no projection bias; through
    Gemma's post-attention norm with its scale frozen from the clean run)."""
    l, h = head
    D = lm.head_dim
    x = tr.head_in[l]  # [n, n_heads * head_dim]
    keep = torch.zeros_like(x)
    keep[:, h * D:(h + 1) * D] = x[:, h * D:(h + 1) * D]
    proj = lm.out_proj(l)
    o = proj(keep) - proj(torch.zeros_like(keep))  # [n, d]
    post = post_attention_norm(lm, l)
    return o.float() if post is None else frozen_norm(post, tr.proj_out[l], o).float()


@torch.no_grad()
def components(lm, tr: Trace) -> dict[str, torch.Tensor]:
    """Every component of the final residual ``name -> [n, d]``; they sum to ``tr.final``.

    Names: ``embed``, ``L{l}H{h}`` (each head), ``L{l}.attn_bias`` (projection bias), ``L{l}.mlp`` (what the
    layer adds besides its attention: the MLP, and any other branch).
    """
    out = {"embed": tr.layer_in0}
    prev = tr.layer_in0
    for l in range(tr.n_layers):
        heads = [head_output(lm, tr, (l, h)) for h in range(lm.n_heads)]
        for h, c in enumerate(heads):
            out[head_name((l, h))] = c
        out[f"L{l}.attn_bias"] = tr.attn_out[l] - torch.stack(heads).sum(0)
        out[f"L{l}.mlp"] = tr.layer_out[l] - prev - tr.attn_out[l]
        prev = tr.layer_out[l]
    return out


@torch.no_grad()
def direct_logits(lm, tr: Trace, c: torch.Tensor) -> torch.Tensor:
    """A component's direct contribution to every logit ``[n, vocab]``: final norm frozen at the clean run."""
    return frozen_norm(final_norm(lm), tr.final, c) @ unembed(lm).T


@torch.no_grad()
def direct_diff(lm, tr: Trace, c: torch.Tensor) -> torch.Tensor:
    """A component's direct contribution to the logit difference ``[n]`` (frozen final norm)."""
    W = unembed(lm)
    d = W[torch.as_tensor(tr.reads.answer)] - W[torch.as_tensor(tr.reads.competitor)]  # [n, d]
    return (frozen_norm(final_norm(lm), tr.final, c) * d).sum(-1)


def bias_diff(lm, tr: Trace) -> torch.Tensor:
    """The final norm's bias (and the unembedding's, if any) on the logit difference ``[n]``."""
    W = unembed(lm)
    a, b = torch.as_tensor(tr.reads.answer), torch.as_tensor(tr.reads.competitor)
    out = torch.zeros(len(tr.reads))
    nb = norm_bias(final_norm(lm))
    if nb is not None:
        out = out + ((W[a] - W[b]) * nb.detach().float().cpu()).sum(-1)
    ub = getattr(lm.model.get_output_embeddings(), "bias", None)
    if isinstance(ub, torch.Tensor):
        ub = ub.detach().float().cpu()
        out = out + ub[a] - ub[b]
    return out


@torch.no_grad()
@profiling.timed
def direct_ranking(lm, task) -> pd.DataFrame:
    """Every head ranked by how reliably its direct effect promotes the answer over the competitor on ``task``'s
    items (the search split): ``share_positive`` (items where it does) first, then the mean direct effect.
    Attribution runs in float32 (on a float32 copy of a bfloat16 model: its weights, exactly)."""
    lm = cast(lm, "float32")
    tr = trace(lm, choose_reads(lm, task))
    rows = []
    for layer in range(lm.n_layers):
        for h in range(lm.n_heads):
            d = direct_diff(lm, tr, head_output(lm, tr, (layer, h))).numpy()   # [n]
            rows.append({"head": head_name((layer, h)), "layer": layer, "head_index": h,
                         "share_positive": float((d > 0).mean()), "mean_direct": float(d.mean())})
    return pd.DataFrame(rows).sort_values(["share_positive", "mean_direct"], ascending=False,
                                          ignore_index=True)
