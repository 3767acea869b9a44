"""Where a head reads: its attention at the read position (:func:`cel_utils.direct.choose_reads`), averaged over
items by role.

:func:`attention` gives each head's weights at the read over the tokens up to it. Prompts differ in length, so
each position gets a *slot* by role (:func:`slots`): position 0 (the sink) apart, the read's own line counted back
from the read, earlier lines each counted back from its line break. Every item counts in every slot, so the mean
weights sum to 1 (:func:`mean_attention`, :func:`attention_rows`).

Example:
    >>> from cel_utils.direct import Reads
    >>> from cel_utils.tiny import tiny_model
    >>> lm = tiny_model("llama")
    >>> inputs = [lm.tokenizer.encode("1+2=3\\n4+5="), lm.tokenizer.encode("7+1=")]
    >>> reads = Reads(items=np.arange(2), inputs=inputs, answer=np.zeros(2, int), competitor=np.ones(2, int),
    ...               target_index=np.zeros(2, int))
    >>> w = attention(lm, reads, [(1, 3)])[(1, 3)]
    >>> [len(x) for x in w], [round(float(x.sum()), 5) for x in w]
    ([10, 4], [1.0, 1.0])
    >>> rows = attention_rows(lm.tokenizer, reads, w)
    >>> rows[0]["where"], round(sum(r["mean_weight"] for r in rows), 5)
    ('the first token of the prompt', 1.0)
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np
import torch

from . import hooks, profiling
from .ablation import Head
from .errors import CELError
from .direct import Reads
from .mechanism import token_text


@torch.no_grad()
@profiling.timed
def attention(lm, reads: Reads, heads: Sequence[Head], batch_size: int = 16) -> dict[Head, list[np.ndarray]]:
    """Each head's attention at the read position over the tokens up to it: ``head -> [weights per read]``
    (each a vector of length ``len(input)`` that sums to 1). Uses the eager attention path for this pass only."""
    layers = sorted({l for l, _ in heads})
    out: dict[Head, list[np.ndarray]] = {h: [] for h in heads}

    def keep(got, l):
        def fn(w):  # [batch, head, query, key]
            got[l] = w.detach().float().cpu()
        return fn

    with hooks.eager_attention(lm):
        for b, ids, att in hooks.padded_batches(lm, reads.inputs, batch_size):
            got: dict = {}
            with hooks.hooked(lm, [("pattern", l, keep(got, l)) for l in layers]):
                hooks.hidden_states(lm, ids, att)
            for r, s in enumerate(reads.inputs[b:b + batch_size]):
                p = len(s) - 1
                for (l, h) in heads:
                    out[(l, h)].append(got[l][r, h, p, :p + 1].numpy())
    return out


# ---- attention at the read, aligned by role --------------------------------------------------------------------
# Prompts differ in length, so "the same position" has to mean the same *role*. Each position of a read's input
# gets a slot (line, back):
#   * the sink, SINK = (-1, 0): position 0, the first token of the input (the BOS token where the tokenizer adds
#     one, as Gemma's does; the prompt's first token where it does not, as SmolLM2's). Many heads park attention
#     there whatever it holds (an attention sink), so its weight is reported apart from the content positions.
#   * the read's own line, line 0: the tokens after the last line break before the read (for a few-shot prompt,
#     the final query and the answer written so far), counted back from the read (back 0 = the read position).
#   * earlier lines, line g >= 1 (g lines above the read's; for a few-shot prompt, the demonstrations, g = 1 the
#     last one), each counted back from its own last token, its line break (back 0).
# The mean over reads averages every slot over ALL reads (a read without the slot adds 0 there), so the mean
# weights sum to 1 like each read's own.
SINK = (-1, 0)


def slots(tok, ids: Sequence[int]) -> list[tuple[int, int]]:
    """The slot ``(line, back)`` of each position of one read's input (the read is its last token; see above).

    Example (a character tokenizer: one token per character):
        >>> from cel_utils.tiny import char_tokenizer
        >>> tok = char_tokenizer()
        >>> slots(tok, tok.encode("ab\\ncd\\nef"))
        [(-1, 0), (2, 1), (2, 0), (1, 2), (1, 1), (1, 0), (0, 1), (0, 0)]
    """
    n = len(ids)
    out = [SINK] * n
    line, end = 0, n - 1          # the line being walked back through, and the position its ``back`` counts from
    texts: dict[int, bool] = {}
    for p in range(n - 1, 0, -1):
        t = int(ids[p])
        if p < n - 1:
            if t not in texts:
                texts[t] = "\n" in token_text(tok, t)
            if texts[t]:          # a line break ends the line above the one walked so far
                line, end = line + 1, p
        out[p] = (line, end - p)
    return out


def slot_order(slot: tuple[int, int]) -> tuple:
    """Reading order of slots: the sink, then the earliest line to the read's, each line left to right."""
    return (slot != SINK, -slot[0], -slot[1])


def mean_attention(weights: list[np.ndarray], read_slots: list[list[tuple[int, int]]]
                   ) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Mean attention per slot over all reads: ``(slots in reading order, mean weights)``; every read counts in
    every slot (0 where it has no such position), so the means sum to 1 when each read's weights do.

    Example:
        >>> w = [np.array([0.5, 0.5]), np.array([0.2, 0.3, 0.5])]
        >>> s = [[SINK, (0, 0)], [SINK, (0, 1), (0, 0)]]
        >>> keys, mean = mean_attention(w, s)
        >>> keys, mean.round(2).tolist()
        ([(-1, 0), (0, 1), (0, 0)], [0.35, 0.15, 0.5])
    """
    acc: dict[tuple[int, int], float] = {}
    for w, s in zip(weights, read_slots, strict=True):
        if len(w) != len(s):
            raise CELError(f"attention over {len(w)} positions but {len(s)} slots")
        for x, key in zip(w, s):
            acc[key] = acc.get(key, 0.0) + float(x)
    keys = sorted(acc, key=slot_order)
    return keys, np.array([acc[k] / len(weights) for k in keys])


def slot_token(tok, reads: Reads, read_slots: list[list[tuple[int, int]]], slot: tuple[int, int]
               ) -> tuple[str | None, float]:
    """The most common token in ``slot`` over the reads, and the share of ALL reads that have it there (reads
    without the slot count as not having it).

    Example:
        >>> from types import SimpleNamespace
        >>> from cel_utils.tiny import char_tokenizer
        >>> tok = char_tokenizer()
        >>> reads = SimpleNamespace(inputs=[tok.encode("ab="), tok.encode("c=")])
        >>> slot_token(tok, reads, [slots(tok, s) for s in reads.inputs], (0, 0))
        ('=', 1.0)
    """
    ids = [int(s[i]) for s, sl in zip(reads.inputs, read_slots) for i, k in enumerate(sl) if k == slot]
    if not ids:
        return None, 0.0
    tid, count = Counter(ids).most_common(1)[0]
    return token_text(tok, tid), count / len(reads.inputs)


def slot_words(slot: tuple[int, int]) -> str:
    """Where a slot is, in words.

    Example:
        >>> [slot_words(s) for s in (SINK, (0, 0), (0, 2), (1, 0), (2, 3))]  # doctest: +NORMALIZE_WHITESPACE
        ['the first token of the prompt', 'the read position itself', '2 positions before the read',
         "the line break ending the line above the read's", "3 positions before the end of the line 2 above the read's"]
    """
    line, back = slot
    if slot == SINK:
        return "the first token of the prompt"
    if line == 0:
        return "the read position itself" if back == 0 else f"{back} position{'s' if back > 1 else ''} before the read"
    above = "the line above the read's" if line == 1 else f"the line {line} above the read's"
    return f"the line break ending {above}" if back == 0 else \
        f"{back} position{'s' if back > 1 else ''} before the end of {above}"


def slot_label(slot: tuple[int, int]) -> str:
    """A short axis label for a slot.

    Example:
        >>> [slot_label(s) for s in (SINK, (0, 0), (0, 2), (1, 0), (2, 3))]
        ['sink', 'read', 'read-2', 'line-1 end', 'line-2 end-3']
    """
    line, back = slot
    if slot == SINK:
        return "sink"
    if line == 0:
        return "read" if back == 0 else f"read-{back}"
    return f"line-{line} end" + (f"-{back}" if back else "")


def attention_rows(tok, reads: Reads, weights: list[np.ndarray]) -> list[dict]:
    """Mean attention at the read position per slot (see above), in reading order, with the most common token
    there and the share of reads that have it: ``[{"line", "back", "sink", "where", "token", "token_share",
    "mean_weight"}]``; the ``mean_weight`` column sums to 1."""
    read_slots = [slots(tok, s) for s in reads.inputs]
    keys, mean = mean_attention(weights, read_slots)
    rows = []
    for key, m in zip(keys, mean):
        text, share = slot_token(tok, reads, read_slots, key)
        rows.append({"line": key[0], "back": key[1], "sink": key == SINK, "where": slot_words(key), "token": text,
                     "token_share": share, "mean_weight": float(m)})
    return rows
