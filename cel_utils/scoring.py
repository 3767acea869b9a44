"""Scoring items, following the lm-eval-harness convention.

For an item and a continuation (a choice, or the exact-match target):
  context       = tokens of ``prompt`` (tokenizer defaults, special tokens included)
  whole         = tokens of ``prompt + continuation``
  continuation  = ``whole[len(context):]``
The model reads ``whole[:-1]``; the logits at positions ``len(context)-1 .. len(whole)-2`` predict the
continuation tokens. A *read* is one (input sequence, position, token) triple.

Per read we keep ``lp`` (log-prob of the token) and ``gap`` (its logit minus the largest other logit).
  multiple choice: score(choice) = sum of lp; correct iff the answer's score beats every other choice;
                   margin = score(answer) - max other score.
  exact match:     margin = min over target tokens of gap; correct iff margin > 0 (greedy decoding
                   would produce the target).

Choices of an item share their prompt: input sequences that are equal, or a prefix of another input of
the same item, are run once (one-token choices need a single pass over the prompt).

Example:
    >>> from cel_utils.scoring import encode_task, plain_evaluate  # doctest: +SKIP
    >>> enc = encode_task(lm, task)                                  # doctest: +SKIP
    >>> res = plain_evaluate(lm, enc)                                # doctest: +SKIP
    >>> res.accuracy, res.mean_margin                                # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .ablation import Ablation, HeadAblator, head_mask, pad_id, pad_right
from .errors import CELError


@dataclass
class EncodedTask:
    kind: str
    n_items: int
    answers: np.ndarray  # [item] (mc)
    n_choices: np.ndarray  # [item]
    inputs: list[list[int]]  # unique input sequences (token ids)
    read_seq: np.ndarray  # [read] index into inputs
    read_pos: np.ndarray  # [read]
    read_tok: np.ndarray  # [read]
    read_item: np.ndarray  # [read]
    read_choice: np.ndarray  # [read] (0 for em)
    full: list[tuple[int, int, list[int], int]] = field(default_factory=list)  # (item, choice, whole, n_ctx)

    @property
    def n_reads(self) -> int:
        return len(self.read_seq)

    def reads_of(self, seqs) -> np.ndarray:
        """Indices of the reads made on the input sequences ``seqs``, sequence by sequence, in read order."""
        order = np.argsort(self.read_seq, kind="stable")
        bounds = np.searchsorted(self.read_seq[order], np.arange(len(self.inputs) + 1))
        parts = [order[bounds[s]:bounds[s + 1]] for s in seqs]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _tokens(tok, text: str) -> list[int]:
    return list(tok(text)["input_ids"])


def encode_task(lm, task) -> EncodedTask:
    """Tokenize a task's items into unique input sequences and reads."""
    tok = lm.tokenizer
    inputs: list[list[int]] = []
    index: dict[tuple, int] = {}
    rs, rp, rt, ri, rc = [], [], [], [], []
    full = []
    answers, n_choices = [], []
    for i, item in enumerate(task.items):
        conts = item["choices"] if task.kind == "mc" else [item["target"]]
        answers.append(item.get("answer", 0))
        n_choices.append(len(conts))
        ctx = _tokens(tok, item["prompt"])
        item_inputs = []
        for c, cont in enumerate(conts):
            whole = _tokens(tok, item["prompt"] + cont)
            if len(whole) <= len(ctx):
                raise CELError(f"item {i}: continuation {cont!r} adds no tokens after the prompt")
            if len(ctx) == 0:
                raise CELError(f"item {i}: the prompt has no tokens (the model needs a context)")
            full.append((i, c, whole, len(ctx)))
            item_inputs.append((c, whole[:-1], whole[len(ctx):], len(ctx)))
        # Run each distinct input once; an input that is a prefix of another input of this item reuses it.
        longest = sorted({tuple(x[1]) for x in item_inputs}, key=len, reverse=True)
        for c, inp, cont_toks, nctx in item_inputs:
            host = next(h for h in longest if len(h) >= len(inp) and h[:len(inp)] == tuple(inp))
            if host not in index:
                index[host] = len(inputs)
                inputs.append(list(host))
            s = index[host]
            for j, t in enumerate(cont_toks):
                rs.append(s); rp.append(nctx - 1 + j); rt.append(t); ri.append(i); rc.append(c)
    a = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    return EncodedTask(kind=task.kind, n_items=len(task.items), answers=a(answers), n_choices=a(n_choices),
                       inputs=inputs, read_seq=a(rs), read_pos=a(rp), read_tok=a(rt), read_item=a(ri),
                       read_choice=a(rc), full=full)


@dataclass
class ItemResults:
    """Per-item outcomes for one or more head sets: arrays ``[n_sets, n_items]``."""

    correct: np.ndarray
    margin: np.ndarray
    choice_scores: np.ndarray | None = None  # [n_sets, n_items, max_choices] (mc)
    seconds: float | None = None  # compute time of these results (kept by the result cache)
    cached: bool = False  # read back from the result cache

    @property
    def accuracy(self):
        return self.correct.mean(axis=-1)

    @property
    def mean_margin(self):
        return self.margin.mean(axis=-1)

    def rows(self, idx) -> "ItemResults":
        """The results of some head sets (``idx``: a slice or a list of row indices)."""
        cs = None if self.choice_scores is None else self.choice_scores[idx]
        return ItemResults(self.correct[idx], self.margin[idx], cs, seconds=self.seconds, cached=self.cached)


def aggregate(enc: EncodedTask, lp: np.ndarray, gap: np.ndarray, read_item=None, read_choice=None) -> ItemResults:
    """Turn per-read ``lp``/``gap`` arrays ``[n_sets, n_reads]`` into per-item results."""
    lp = np.atleast_2d(lp).astype(np.float64)
    gap = np.atleast_2d(gap).astype(np.float64)
    ri = enc.read_item if read_item is None else read_item
    rc = enc.read_choice if read_choice is None else read_choice
    S = lp.shape[0]
    if enc.kind == "em":
        margin = np.full((S, enc.n_items), np.inf)
        for s in range(S):
            np.minimum.at(margin[s], ri, gap[s])
        return ItemResults(correct=margin > 0, margin=margin)
    C = int(enc.n_choices.max())
    scores = np.zeros((S, enc.n_items, C))
    for s in range(S):
        np.add.at(scores[s], (ri, rc), lp[s])
    valid = np.arange(C)[None, :] < enc.n_choices[:, None]  # [item, choice]
    scores = np.where(valid[None], scores, -np.inf)
    items = np.arange(enc.n_items)
    ans = scores[:, items, enc.answers]  # [S, item]
    others = scores.copy()
    others[:, items, enc.answers] = -np.inf
    margin = ans - others.max(axis=-1)
    return ItemResults(correct=margin > 0, margin=margin, choice_scores=scores)


def read_stats(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [reads, vocab]``, ``tokens [reads]`` -> (log-prob of token, logit gap to best other)."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    tgt = logits.gather(1, tokens[:, None])[:, 0]
    other = logits.scatter(1, tokens[:, None], float("-inf")).max(dim=-1).values
    return tgt - lse, tgt - other


def logits_at(lm, hidden: torch.Tensor) -> torch.Tensor:
    """Apply the LM head (and Gemma's final soft-cap, if any) to selected hidden states ``[reads, d]``."""
    logits = lm.model.get_output_embeddings()(hidden)
    cfg = lm.model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def batches_by_tokens(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group sequence indices (sorted by length) into batches of at most ``max_tokens`` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out, cur, cur_max = [], [], 0
    for i in order:
        m = max(cur_max, lengths[i])
        if cur and m * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, m = [], lengths[i]
        cur.append(i)
        cur_max = m
    if cur:
        out.append(cur)
    return out


@torch.no_grad()
def plain_evaluate(lm, enc: EncodedTask, heads=(), mode: "str | Ablation" = "zero", means=None,
                   batch_size: int = 16, ablator: HeadAblator | None = None) -> ItemResults:
    """The reference: every (item, choice) sequence run in full, full-vocabulary log-softmax, one head set.

    This is what a plain loop does; the engine (:mod:`cel_utils.engine`) must reproduce it. ``ablator``: an
    attached :class:`~cel_utils.ablation.HeadAblator` to reuse (then ``mode``/``means`` are its own).
    """
    own = ablator is None
    if own:
        ab = Ablation.of(mode, means).resolved(lm, enc.inputs)
        ablator = HeadAblator(lm, mode=ab.mode, means=ab.means).attach()
    try:
        ablator.set_masks(head_mask(lm, list(heads)) if heads else None)
        lps, gaps, ri, rc = [], [], [], []
        pad = pad_id(lm)
        for b in range(0, len(enc.full), batch_size):
            chunk = enc.full[b:b + batch_size]
            ids, att = pad_right([w for _, _, w, _ in chunk], pad)
            logits = lm.model(input_ids=ids.to(lm.device), attention_mask=att.to(lm.device),
                              use_cache=False).logits  # [batch, pos, vocab]
            logp = torch.log_softmax(logits.float(), dim=-1)
            for r, (i, c, whole, nctx) in enumerate(chunk):
                pos = torch.arange(nctx - 1, len(whole) - 1, device=logp.device)
                toks = torch.tensor(whole[nctx:], device=logp.device)
                lp_row = logp[r, pos]  # [n_cont, vocab]
                tgt = lp_row.gather(1, toks[:, None])[:, 0]
                other = lp_row.scatter(1, toks[:, None], float("-inf")).max(-1).values
                lps.append(tgt); gaps.append(tgt - other)
                ri.extend([i] * len(toks)); rc.extend([c] * len(toks))
        lp = torch.cat(lps).cpu().numpy()[None]
        gap = torch.cat(gaps).cpu().numpy()[None]
        return aggregate(enc, lp, gap, read_item=np.asarray(ri), read_choice=np.asarray(rc))
    finally:
        if own:
            ablator.detach()
        else:
            ablator.set_masks(None)
