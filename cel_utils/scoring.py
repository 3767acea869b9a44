"""Scoring items, following the lm-eval-harness convention.

For an item and a continuation (a choice, or the exact-match target):
  trailing whitespace of the prompt is moved to the front of the continuation (as lm-eval-harness does)
  context       = tokens of ``prompt`` (tokenizer defaults, special tokens included)
  whole         = tokens of ``prompt + continuation``; ``context`` must be a prefix of it (else an error)
  continuation  = ``whole[len(context):]``
The logits at positions ``len(context)-1 .. len(whole)-2`` predict the continuation tokens. A *read* is one
(input sequence, position, token) triple.

Per read we keep ``lp`` (log-prob of the token) and ``gap`` (its logit minus the largest other logit).
  multiple choice: score(choice) = sum of lp; correct iff the answer's score beats every other choice
                   (a tie is wrong); margin = score(answer) - max other score.
  exact match:     one more read after the target (token ``STOP``): its gap is the best logit of a token that
                   ends the answer minus the best logit of a token that would continue it (:func:`continuation_mask`:
                   the token's text starts with a letter or digit, e.g. "0" after "79"). margin = min of the
                   target tokens' gaps and that gap; correct iff margin > 0, i.e. greedy decoding writes the
                   target *and stops there*.

Choices of an item share their prompt: input sequences that are equal, or a prefix of another input of
the same item, are run once (one-token choices need a single pass over the prompt).

Example:
    >>> from cel_utils.scoring import encode_task, plain_evaluate  # doctest: +SKIP
    >>> enc = encode_task(lm, task)                                  # doctest: +SKIP
    >>> res = plain_evaluate(lm, enc)                                # doctest: +SKIP
    >>> res.accuracy, res.mean_margin                                # doctest: +SKIP
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from . import hooks, profiling
from .ablation import Ablation, HeadAblator, head_mask
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
    continues: torch.Tensor | None = None  # [vocab] bool: tokens that would continue an answer (em)
    name: str = ""  # the task's name (not part of the result-cache key: it changes no number)

    @property
    def n_reads(self) -> int:
        return len(self.read_seq)

    @functools.cached_property
    def _reads_by_seq(self) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(self.read_seq, kind="stable")
        return order, np.searchsorted(self.read_seq[order], np.arange(len(self.inputs) + 1))

    def reads_of(self, seqs) -> np.ndarray:
        """Indices of the reads made on the input sequences ``seqs``, sequence by sequence, in read order."""
        order, bounds = self._reads_by_seq
        parts = [order[bounds[s]:bounds[s + 1]] for s in seqs]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


STOP = -1  # the token of an exact-match item's last read: "the answer ends here"


def _tokens(tok, text: str) -> list[int]:
    return list(tok(text)["input_ids"])


@functools.lru_cache(maxsize=8)
def continuation_mask(tok) -> torch.Tensor:
    """``[vocab]`` bool: tokens whose text starts with a letter or digit, so that written right after an answer
    they would extend its last word or number ("0" after "79", "ian" after "Paris"); a token that starts with
    a space, punctuation, a newline or a special token ends the answer.

    Each token's text is read by decoding it after an anchor character (single-token decoding drops leading
    spaces in some tokenizers).
    """
    anchor = _tokens(tok, "a")[-1]
    head = tok.decode([anchor])
    n = len(tok)
    texts = tok.batch_decode([[anchor, i] for i in range(n)], skip_special_tokens=False,
                             clean_up_tokenization_spaces=False)
    special = set(getattr(tok, "all_special_ids", []) or [])
    return torch.tensor([i not in special and len(t) > len(head) and t[len(head)].isalnum()
                         for i, t in enumerate(texts)], dtype=torch.bool)


def split_prompt(prompt: str, continuation: str) -> tuple[str, str]:
    """Move the prompt's trailing whitespace to the front of the continuation (lm-eval-harness's convention).

    Example:
        >>> split_prompt("12 + 7 = ", "19")
        ('12 + 7 =', ' 19')
    """
    n = len(prompt) - len(prompt.rstrip())
    return (prompt[:-n], prompt[-n:] + continuation) if n else (prompt, continuation)


def _where(task, i: int) -> str:
    line = task.items[i].get("_line")
    return f"{task.source}:{line}" if line is not None else f"item {i}"


def encode_task(lm, task) -> EncodedTask:
    """Tokenize a task's items into unique input sequences and reads."""
    tok = lm.tokenizer
    inputs: list[list[int]] = []
    index: dict[tuple, int] = {}
    rs, rp, rt, ri, rc = [], [], [], [], []
    full = []
    answers, n_choices = [], []
    em = task.kind == "em"
    for i, item in enumerate(task.items):
        conts = item["choices"] if not em else [item["target"]]
        answers.append(item.get("answer", 0))
        n_choices.append(len(conts))
        item_inputs = []
        for c, cont0 in enumerate(conts):
            prompt, cont = split_prompt(item["prompt"], cont0)
            ctx = _tokens(tok, prompt)
            whole = _tokens(tok, prompt + cont)
            if len(ctx) == 0:
                raise CELError(f"{_where(task, i)}: the prompt has no tokens (the model needs a context)")
            if whole[:len(ctx)] != ctx:
                raise CELError(f"{_where(task, i)}: the prompt's tokens are not a prefix of the tokens of prompt + "
                               f"continuation {cont!r} (the tokenizer merges across the boundary)")
            if len(whole) <= len(ctx):
                raise CELError(f"{_where(task, i)}: continuation {cont0!r} adds no tokens after the prompt")
            full.append((i, c, whole, len(ctx)))
            toks = whole[len(ctx):] + ([STOP] if em else [])  # em: one more read, after the answer
            item_inputs.append((c, whole if em else whole[:-1], toks, len(ctx)))
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
                       read_choice=a(rc), full=full, continues=continuation_mask(tok) if em else None,
                       name=task.name)


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


def read_stats(logits: torch.Tensor, tokens: torch.Tensor, continues: torch.Tensor | None = None,
               rows: torch.Tensor | None = None, log_probs: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [positions, vocab]``, ``tokens [reads]`` -> (log-prob of token, logit gap to best other), each
    ``[reads]`` in float32. ``rows [reads]``: the logits row each read scores (default: row i for read i), so that
    choices read at one position share its row.

    A ``STOP`` read (exact match, after the answer) has log-prob 0 and gap = best logit among tokens that end
    the answer minus best logit among those that would continue it (``continues [vocab]``). Maxima and picked
    logits are taken in the logits' own dtype (exact) and converted to float32 before subtracting, so the result
    equals that of converting the logits first; only the log-sum-exp runs on a float32 copy. ``log_probs=False``
    (exact-match tasks read only gaps) returns zero log-probs and skips the log-sum-exp over the vocabulary.

    Example:
        >>> lg = torch.tensor([[0.0, 2.0, 1.0]])
        >>> lp, gap = read_stats(lg, torch.tensor([1, 2]), rows=torch.tensor([0, 0]))
        >>> [round(float(x), 3) for x in gap], round(float(lp[0] - lp[1]), 3)
        ([1.0, -1.0], 1.0)
    """
    rows = torch.arange(len(tokens), device=logits.device) if rows is None else rows.to(logits.device)
    stop = tokens < 0
    safe = tokens.clamp(min=0)
    tgt = logits[rows, safe]  # [reads]
    top2 = logits.topk(2, dim=-1).values[rows]  # [reads, 2]: the best logit is the best other unless the target is it
    other = torch.where(tgt >= top2[:, 0], top2[:, 1], top2[:, 0])
    tgt, other = tgt.float(), other.float()
    gap = tgt - other
    lp = tgt - torch.logsumexp(logits.float(), dim=-1)[rows] if log_probs else torch.zeros_like(gap)
    if bool(stop.any()):
        s = stop.nonzero()[:, 0]
        c = continues.to(logits.device)[None]
        last = logits[rows[s]]  # [stop reads, vocab]
        end_gap = (last.masked_fill(c, float("-inf")).amax(-1).float()
                   - last.masked_fill(~c, float("-inf")).amax(-1).float())
        gap = gap.index_put((s,), end_gap)
        lp = lp.index_put((s,), torch.zeros_like(end_gap))
    return lp, gap


def logits_at(lm, hidden: torch.Tensor) -> torch.Tensor:
    """Apply the LM head (and Gemma's final soft-cap, if any) to selected hidden states ``[reads, d]``."""
    logits = lm.model.get_output_embeddings()(hidden)
    cap = hooks.softcap(lm)
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
@profiling.timed
def plain_evaluate(lm, enc: EncodedTask, heads=(), mode: "str | Ablation" = "zero", means=None,
                   batch_size: int = 16, ablator: HeadAblator | None = None) -> ItemResults:
    """The reference: every (item, choice) sequence run in full, full-vocabulary log-softmax, one head set.

    This is what a plain loop does; the engine (:mod:`cel_utils.engine`) must reproduce it. ``ablator``: an
    attached :class:`~cel_utils.ablation.HeadAblator` to reuse (then ``mode``/``means`` are its own).
    """
    own = ablator is None
    if own:
        ab = Ablation.of(mode, means).resolved(lm, enc.inputs)
        ablator = HeadAblator(lm, ab).attach()
    try:
        ablator.set_masks(head_mask(lm, list(heads)) if heads else None)
        lps, gaps, ri, rc = [], [], [], []
        for b, ids, att in hooks.padded_batches(lm, [w for _, _, w, _ in enc.full], batch_size):
            chunk = enc.full[b:b + batch_size]
            logits = lm.model(input_ids=ids, attention_mask=att, use_cache=False).logits  # [batch, pos, vocab]
            logp = torch.log_softmax(logits.float(), dim=-1)
            for r, (i, c, whole, nctx) in enumerate(chunk):
                pos = torch.arange(nctx - 1, len(whole) - 1, device=logp.device)
                toks = torch.tensor(whole[nctx:], device=logp.device)
                lp_row = logp[r, pos]  # [n_cont, vocab]
                tgt = lp_row.gather(1, toks[:, None])[:, 0]
                other = lp_row.scatter(1, toks[:, None], float("-inf")).max(-1).values
                lps.append(tgt); gaps.append(tgt - other)
                ri.extend([i] * len(toks)); rc.extend([c] * len(toks))
                if enc.kind == "em":  # after the answer: does the best token end it or continue it?
                    last = logp[r, len(whole) - 1]  # [vocab]
                    cont = enc.continues.to(last.device)
                    gaps.append((last[~cont].max() - last.masked_fill(~cont, float("-inf")).max())[None])
                    lps.append(torch.zeros(1, device=last.device))
                    ri.append(i); rc.append(c)
        lp = torch.cat(lps).cpu().numpy()[None]
        gap = torch.cat(gaps).cpu().numpy()[None]
        return aggregate(enc, lp, gap, read_item=np.asarray(ri), read_choice=np.asarray(rc))
    finally:
        if own:
            ablator.detach()
        else:
            ablator.set_masks(None)
