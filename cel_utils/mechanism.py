"""Inside a head: what it writes into the logits, through which path, and where it reads.

For each item we take one *read*: a position, the answer token and the competitor token the score reads there.
Multiple choice: the first position where the answer and the runner-up choice (highest-scoring wrong choice in
the clean run) differ. Exact match: the read whose gap is smallest in the clean run (the one that decides the
item); the competitor is the highest other token there (after the answer: the best token that would continue
it, against the best one that ends it). The *logit difference* is logit(answer) - logit(competitor) at the read.

Direct effect (direct logit attribution). The final residual at the read is a sum of components: the embedding,
every head's output (its slice of the output projection's input through the projection, and through Gemma's
post-attention norm with that norm's scale frozen from the clean run), every projection bias and every MLP.
With the final norm's scale frozen from the clean run the logits are linear in these, so each component's
contribution to the logit difference adds up, exactly, to the clean logit difference. A head's *direct effect*
is what removing its output from the final residual alone does: minus its contribution.

Total effect: the change in the logit difference when the head is ablated (zero at the output projection's
input, every position, as everywhere in the book). Path split (path patching with the clean run as reference,
norms recomputed): *direct path* = remove the head's clean output from the final residual only; *indirect
path* = ablate the head, then add its clean output back to the final residual (only later layers lose it).
The two add up to the total when the model after the head is linear.

Where the head attends at the read, averaged over items by role: :mod:`cel_utils.attention`.

Example:
    >>> from cel_utils.mechanism import choose_reads, explain  # doctest: +SKIP
    >>> reads = choose_reads(lm, task)                          # doctest: +SKIP
    >>> ex = explain(lm, task, (13, 0), reads=reads)            # doctest: +SKIP
    >>> ex.summary["direct_share"]                              # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from . import hooks
from .ablation import Head, ablate_heads, head_name
from .errors import CELError
from .engine import evaluate
from .scoring import STOP, encode_task, logits_at, read_stats

TOP_TOKENS = 10  # promoted / suppressed tokens listed per head


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


def _diff(lm, reads: Reads, final: torch.Tensor) -> torch.Tensor:
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
                 logit_diff=_diff(lm, reads, s["final"]))


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


@dataclass
class Explanation:
    """The measurements of one head on one task (see :func:`explain`)."""

    head: Head
    task: str
    reads: Reads
    clean_diff: np.ndarray        # [n] logit difference, clean
    total: np.ndarray             # [n] change in the logit difference when the head is ablated
    direct: np.ndarray            # [n] minus the head's direct contribution (frozen final norm)
    direct_path: np.ndarray       # [n] change when its output leaves the final residual only (norm recomputed)
    indirect_path: np.ndarray     # [n] change when only later layers lose it
    fixed: np.ndarray             # [n] bool: wrong clean, right with the head removed (the task's own score)
    broken: np.ndarray            # [n] bool
    task_delta_margin: np.ndarray  # [n] change in the task's margin
    head_logits: np.ndarray       # [n, vocab] the head's direct contribution to every logit, centred per read
    summary: dict = field(default_factory=dict)
    ablated: Trace | None = field(default=None, repr=False)  # the run with the head ablated


@torch.no_grad()
def explain(lm, task, head: Head, reads: Reads | None = None, tr: Trace | None = None,
            clean=None) -> Explanation:
    """Direct and total effects, the path split and the task outcome of removing ``head``, item by item.

    ``reads``, ``tr`` (the clean :func:`trace`) and ``clean`` (the clean :func:`~cel_utils.engine.evaluate`
    result) are computed when not given; pass them to share them across heads.
    """
    reads = reads if reads is not None else choose_reads(lm, task)
    tr = tr if tr is not None else trace(lm, reads)
    enc = encode_task(lm, task)
    clean = clean if clean is not None else evaluate(lm, enc, ())
    abl = evaluate(lm, enc, [head])
    c = head_output(lm, tr, head)  # [n, d]
    direct = -direct_diff(lm, tr, c)
    ab = trace(lm, reads, heads=[head])
    total = ab.logit_diff - tr.logit_diff
    direct_path = _diff(lm, reads, tr.final - c) - tr.logit_diff
    indirect_path = _diff(lm, reads, ab.final + c) - tr.logit_diff
    hl = direct_logits(lm, tr, c)
    hl = hl - hl.mean(-1, keepdim=True)
    idx = reads.items
    ex = Explanation(head=head, task=task.name, reads=reads, clean_diff=tr.logit_diff.numpy(), total=total.numpy(),
                     direct=direct.numpy(), direct_path=direct_path.numpy(), indirect_path=indirect_path.numpy(),
                     fixed=(~clean.correct[0] & abl.correct[0])[idx], broken=(clean.correct[0] & ~abl.correct[0])[idx],
                     task_delta_margin=(abl.margin[0] - clean.margin[0])[idx], head_logits=hl.numpy(),
                     ablated=ab)
    ex.summary = summarise(ex)
    return ex


@torch.no_grad()
def mediators(lm, tr: Trace, ex: Explanation, k: int = 5) -> list[dict]:
    """Where a head's indirect effect lands: the other components whose direct contribution to the logit
    difference changes most when the head is ablated (both runs read through the clean run's frozen final norm),
    largest mean change first: ``[{"component", "mean_change"}]``."""
    ab = Trace(**{**ex.ablated.__dict__, "final": tr.final})  # frozen at the clean run's final norm scale
    before, after = components(lm, tr), components(lm, ab)
    change = {name: float((direct_diff(lm, tr, after[name]) - direct_diff(lm, tr, before[name])).mean())
              for name in before if name != head_name(ex.head)}
    top = sorted(change, key=lambda n: -abs(change[n]))[:k]
    return [{"component": n, "mean_change": change[n]} for n in top]


def direct_share(direct: float, total: float) -> float | None:
    """How much of the effect goes through the direct path: ``|direct| / (|direct| + |total - direct|)``, in
    [0, 1]; None when both are 0.

    Example:
        >>> round(direct_share(0.3, 0.4), 3)
        0.75
        >>> round(direct_share(0.5, 0.4), 3)   # later layers undo part of the direct effect
        0.833
    """
    a, b = abs(direct), abs(total - direct)
    return None if a + b == 0 else a / (a + b)


def summarise(ex: Explanation) -> dict:
    t, d = float(ex.total.mean()), float(ex.direct.mean())
    return {"head": head_name(ex.head), "task": ex.task, "n_items": len(ex.reads),
            "total_delta_margin": t, "direct_delta_margin": d, "direct_share": direct_share(d, t),
            "direct_path": float(ex.direct_path.mean()), "indirect_path": float(ex.indirect_path.mean()),
            "n_fixed": int(ex.fixed.sum()), "n_broken": int(ex.broken.sum()),
            "task_delta_margin": float(ex.task_delta_margin.mean())}


def token_text(tok, t: int) -> str:
    """A token as it reads in text (leading spaces kept), e.g. ``' 7'``."""
    return tok.decode([int(t)], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def readable(text: str) -> bool:
    """Whether a token's text is shown in the book's token figures: ASCII letters only or digits only, with or
    without leading spaces (no punctuation, whitespace, special tokens, bytes that do not decode alone, or other
    scripts). Such a token can still be a piece of a word (``' miscon'``): the vocabulary has them.

    Example:
        >>> [readable(t) for t in (" the", "7", " 42", "adays", "'),", "\\n", "<bos>", "\ufffd", "υπ", " ")]
        [True, True, True, True, False, False, False, False, False, False]
    """
    s = text.lstrip(" ")
    return bool(s) and s.isascii() and (s.isalpha() or s.isdigit())


def top_tokens(lm, head_logits: np.ndarray, rows=None, k: int = TOP_TOKENS, only_readable: bool = False
               ) -> tuple[list[dict], list[dict]]:
    """The tokens the head's output promotes and suppresses most (its direct logits, centred, averaged over
    ``rows``): two lists of ``{"token", "token_id", "mean_logit"}``. With ``only_readable``, the ``k`` largest
    among the tokens :func:`readable` accepts (special tokens never)."""
    m = head_logits if rows is None else head_logits[np.asarray(rows)]
    if len(m) == 0:
        return [], []
    mean = m.mean(0)  # [vocab]
    order = np.argsort(mean)
    tok = lm.tokenizer
    special = set(getattr(tok, "all_special_ids", []) or [])

    def pick(ids):
        out = []
        for i in ids:
            if len(out) == k:
                break
            text = token_text(tok, i)
            if not only_readable or (int(i) not in special and readable(text)):
                out.append({"token": text, "token_id": int(i), "mean_logit": float(mean[i])})
        return out

    return pick(order[::-1]), pick(order)
