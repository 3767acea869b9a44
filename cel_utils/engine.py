"""The exact engine: many head sets evaluated on every item, with the plain loop's numbers.

:func:`evaluate_head_sets` gives the same per-item results as :func:`cel_utils.scoring.plain_evaluate` (one
full forward per head set over every (item, choice) sequence) and uses the structure of the problem:

* layers below the first ablated layer ``l`` are unchanged, so one clean pass per batch caches every
  layer's input residual ``[batch, pos, d_model]`` and ablated passes start at layer ``l``
  (:func:`cel_utils.hooks.skip_layers_below`);
* several head sets are evaluated in one batched forward, one head set per group of rows;
* logits are computed only at the positions that scoring reads;
* each item's prompt is run once for all its one-token choices (see :mod:`cel_utils.scoring`), and a
  prompt prefix that every item shares (few-shot demonstrations) once per head set (:func:`common_prefix`),
  itself from the first ablated layer up: its keys and values below that layer are the clean run's
  (:class:`PrefixKV`).

Example:
    >>> from cel_utils.engine import evaluate_head_sets      # doctest: +SKIP
    >>> res = evaluate_head_sets(lm, enc, [[], [(14, 8)], [(14, 8), (11, 8)]])   # doctest: +SKIP
    >>> res.accuracy                                          # doctest: +SKIP
    array([0.25, 0.41, 0.47])
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from . import cache, hooks, profiling, threads
from .ablation import Ablation, Head, HeadAblator, Resampler, row_masks
from .defaults import MAX_TOKENS, PER_SET_MAX, progress_enabled
from .errors import CELError
from .scoring import EncodedTask, ItemResults, aggregate, batches_by_tokens, encode_task, logits_at, read_stats


STATS = {"forwards": 0}  # model forward calls made by the engine in this process (a batched call counts once)


def forward_equivalents(n_layers: int, head_sets: Sequence[Sequence[Head]]) -> float:
    """Cost of evaluating head sets with the engine, in clean full forwards: 1 (the clean pass) plus, per set,
    the fraction of layers it recomputes (from its first ablated layer up).

    Example:
        >>> forward_equivalents(4, [[(0, 1)], [(2, 0), (3, 1)], []])
        2.5
    """
    return 1.0 + sum((n_layers - min(l for l, _ in hs)) / n_layers for hs in head_sets if hs)


def pass_tokens(enc: EncodedTask, max_tokens: int = MAX_TOKENS, share_prefix: bool = True) -> int:
    """Tokens one clean pass of the engine runs over the items: per batch (:func:`batches_by_tokens`), the shared
    prompt prefix once and every input sequence padded to the batch's longest. A forward-equivalent
    (:func:`forward_equivalents`) costs about ``2 * parameters * pass_tokens(enc)`` floating-point operations.

    Example:
        >>> from cel_utils.tiny import tiny_model
        >>> from cel_utils.scoring import encode_task
        >>> from cel_utils.tasks import load_task
        >>> enc = encode_task(tiny_model("llama"), load_task("addition", n=4))   # 3-shot: a 41-token shared prefix
        >>> pass_tokens(enc), pass_tokens(enc, share_prefix=False)
        (93, 216)
    """
    P = len(common_prefix(enc)) if share_prefix else 0
    lengths = [len(x) - P for x in enc.inputs]
    return sum(P + len(b) * max(lengths[i] for i in b) for b in batches_by_tokens(lengths, max_tokens))


def screen_work(lm, task) -> float:
    """The multiply-adds of a screen of every head of ``lm`` on ``task``'s items (a Task or an encoded task), up to
    a constant: per head, the tokens of one pass (:func:`pass_tokens`, the shared prefix once) through half the layers on
    average, and the logits at every read. Deterministic (no timing), so the pairs it orders are the same on every
    machine.

        >>> from cel_utils.tiny import tiny_model
        >>> from cel_utils.tasks import load_task
        >>> lm = tiny_model("llama")
        >>> screen_work(lm, load_task("addition", n=8)) > screen_work(lm, load_task("addition", n=4))
        True
    """
    enc = task if isinstance(task, EncodedTask) else encode_task(lm, task)
    layer = sum(p.numel() for p in lm.model.base_model.layers[0].parameters()) if hasattr(
        lm.model.base_model, "layers") else sum(p.numel() for p in lm.model.parameters()) / lm.n_layers
    d = lm.model.get_output_embeddings().weight.shape
    heads = lm.n_layers * lm.n_heads
    return float(heads * (pass_tokens(enc) * layer * lm.n_layers / 2 + enc.n_reads * d[0] * d[1]))


def common_prefix(enc: EncodedTask, min_len: int = 8) -> list[int]:
    """The longest token prefix shared by every input and ending before the first read of any input.

    Few-shot prompts share their demonstrations: that prefix is run once per forward and its keys and
    values are reused by every item. Returns [] when the shared part is shorter than ``min_len``.
    """
    if not enc.inputs:
        return []
    first = enc.inputs[0]
    n = min(len(x) for x in enc.inputs)
    for x in enc.inputs[1:]:
        i = 0
        while i < n and x[i] == first[i]:
            i += 1
        n = i
        if n < min_len:
            return []
    n = min(n, int(enc.read_pos.min()))  # every read must sit after the prefix
    return list(first[:n]) if n >= min_len else []


def prefix_kwargs(base, prefix_ids: torch.Tensor, ids: torch.Tensor, att: torch.Tensor, repeat: int):
    """Run the shared prefix ``prefix_ids [k, P]`` once, then give the body pass its keys/values.

    Each prefix row is repeated ``repeat`` times (rows of the body are [prefix row, sequence]). Returns the
    body's attention mask (prefix + suffix) and the keyword arguments for ``base(input_ids=ids, ...)``.
    """
    P = prefix_ids.shape[1]
    out = base(input_ids=prefix_ids, use_cache=True)
    pkv = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    pkv.batch_repeat_interleave(repeat)
    dev = ids.device
    att = torch.cat([torch.ones(att.shape[0], P, dtype=att.dtype, device=dev), att], dim=1)
    kw = {hooks.kv_cache_kwarg(base): pkv, "use_cache": True,
          "position_ids": (torch.arange(ids.shape[1], device=dev) + P)[None].expand(ids.shape[0], -1)}
    return att, kw


def _cache_of(out):
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


class PrefixKV:
    """The shared prefix ``prefix_ids [1, P]`` run once, clean: its keys/values and every layer's input residual.

    :meth:`kwargs` gives a body pass of ``k`` head sets the prefix's keys/values: below the head sets' first ablated
    layer ``start`` they are the clean run's (ablating a head of layer ``start`` changes nothing below it), from
    ``start`` up the prefix is run again with the heads removed, starting from the clean residual at ``start``.
    The hooks' masks must be set for the prefix rows before :meth:`kwargs` is called.
    """

    def __init__(self, lm, base, prefix_ids: torch.Tensor):
        self.lm, self.base, self.ids = lm, base, prefix_ids
        with hooks.capture_layer_inputs(lm) as captured:
            self.cache = _cache_of(base(input_ids=prefix_ids, use_cache=True))
        self.residuals = list(captured)   # per layer [1, P, d_model]

    def kwargs(self, ids: torch.Tensor, att: torch.Tensor, k: int, repeat: int, start: int | None):
        """The body's attention mask (prefix + suffix) and keyword arguments for ``base(input_ids=ids, ...)``:
        ``k`` head sets x ``repeat`` sequences; ``start`` the first ablated layer (None: the clean model)."""
        L, P, rows = self.lm.n_layers, self.ids.shape[1], k * repeat
        if start is None or start >= L:
            pkv, start = copy.copy(self.cache), L
            pkv.layers = list(pkv.layers)
        else:
            residual = self.residuals[start].repeat(k, 1, 1) if start > 0 else None
            with hooks.skip_layers_below(self.lm, start, residual):
                pkv = _cache_of(self.base(input_ids=self.ids.repeat(k, 1), use_cache=True))
        for j, layer in enumerate(pkv.layers):
            if j < start:   # the clean run's keys/values, one view for every row (never written: stubs below start)
                clean = copy.copy(self.cache.layers[j])
                clean.keys = clean.keys.expand(rows, -1, -1, -1)
                clean.values = clean.values.expand(rows, -1, -1, -1)
                pkv.layers[j] = clean
            else:
                layer.batch_repeat_interleave(repeat)
        dev = ids.device
        att = torch.cat([torch.ones(att.shape[0], P, dtype=att.dtype, device=dev), att], dim=1)
        kw = {hooks.kv_cache_kwarg(self.base): pkv, "use_cache": True,
              "position_ids": (torch.arange(ids.shape[1], device=dev) + P)[None].expand(ids.shape[0], -1)}
        return att, kw


@profiling.timed
def evaluate_head_sets(lm, enc: EncodedTask, head_sets: Sequence[Sequence[Head]], mode: str | Ablation = "zero",
                       means: torch.Tensor | None = None, max_tokens: int = MAX_TOKENS, progress: bool = True,
                       desc: str = "evaluating head sets", share_prefix: bool = True,
                       result_cache: bool | str | None = None) -> ItemResults:
    """Evaluate each head set (heads in a set ablated together) on every item.

    Returns per-item results ``[len(head_sets), n_items]``. An empty head set gives the unablated model.
    ``mode`` is ``"zero"``, ``"mean"`` (head means over these prompts unless ``means`` is given) or an
    :class:`~cel_utils.ablation.Ablation`. ``max_tokens`` bounds the padded tokens per forward (memory). With
    ``share_prefix`` a prompt prefix common to all items is run once per head set and its keys/values reused.
    Results are cached on disk (see :mod:`cel_utils.cache`) unless ``result_cache=False`` or ``CEL_NO_CACHE=1``,
    a short list also set by set (:func:`per_set_cached`) unless ``result_cache="whole"`` (a screen's chunks).
    """
    ablation = Ablation.of(mode, means).resolved(lm, enc.inputs)
    per_set = result_cache != "whole" and per_set_cached(head_sets, ablation)
    result_cache = cache.enabled() if result_cache in (None, "whole") else result_cache
    key = result_key(lm, enc, head_sets, ablation) if result_cache else None
    if profiling.enabled():
        profiling.note(model=lm.name, task=enc.name, sets=len(head_sets), items=enc.n_items,
                       tokens=sum(map(len, enc.inputs)), set_keys=set_keys(lm, enc, head_sets, ablation))
    if key is not None:
        hit = cached_result(key, len(head_sets), enc.n_items)
        if hit is not None:
            profiling.note(cached=True)
            return hit
    run = lambda sets: _compute(lm, enc, sets, ablation, max_tokens, progress, desc, share_prefix)  # noqa: E731
    res = by_set(lm, enc, head_sets, ablation, run) if key is not None and per_set else run(head_sets)
    if key is not None:
        store_result(key, res)
    return res


def _compute(lm, enc, head_sets, ablation, max_tokens, progress, desc, share_prefix) -> ItemResults:
    t0 = time.perf_counter()
    if ablation.mode == "resample":
        lp, gap = resample_stats(lm, enc, head_sets, ablation, max_tokens, share_prefix)
    else:
        lp, gap = _read_stats_per_set(lm, enc, head_sets, ablation, max_tokens, progress, desc, share_prefix)
    res = aggregate(enc, lp, gap)
    res.seconds = time.perf_counter() - t0
    return res


def per_set_cached(head_sets: Sequence[Sequence[Head]], ablation: Ablation) -> bool:
    """Whether a list of head sets is also cached set by set: short lists (the confirm and held-out stages, the
    selectors: at most :data:`~cel_utils.defaults.PER_SET_MAX` sets), whose sets later chapters evaluate again in
    other lists; not the screens' long lists, and not ablations whose numbers depend on the list (a scale factor per
    set, resampling).

        >>> per_set_cached([[(0, 1)], [(1, 2)]], Ablation.of("zero")), per_set_cached([[(0, 1)]] * 40, Ablation.of("zero"))
        (True, False)
    """
    return (len(head_sets) <= PER_SET_MAX and ablation.mode != "resample" and not ablation.alphas
            and not ablation.head_alphas)


def by_set(lm, enc: EncodedTask, head_sets: Sequence[Sequence[Head]], ablation: Ablation, run) -> ItemResults:
    """``run(head_sets)`` with each set's results read from the result cache where an earlier list held it (its key
    is that of the set evaluated alone): only the missing sets are computed, each then stored alone too. A set's
    numbers are those of whichever list first computed it (equal to the last bits or nearly: a batch's composition
    can move a float32 sum in its last bit). ``seconds``: the time spent computing here."""
    keys = [result_key(lm, enc, [hs], ablation) for hs in head_sets]
    hits = [cached_result(k, 1, enc.n_items) for k in keys]
    missing = [j for j, h in enumerate(hits) if h is None]
    fresh = run([head_sets[j] for j in missing]) if missing else None
    for i, j in enumerate(missing):
        hits[j] = fresh.rows([i])
        store_result(keys[j], hits[j])
    cs = None if hits[0].choice_scores is None else np.concatenate([h.choice_scores for h in hits])
    return ItemResults(np.concatenate([h.correct for h in hits]), np.concatenate([h.margin for h in hits]), cs,
                       seconds=fresh.seconds if fresh is not None else 0.0, cached=fresh is None)


def result_key(lm, enc: EncodedTask, head_sets: Sequence[Sequence[Head]], ablation: Ablation,
               device=None) -> str:
    """The result-cache key of :func:`evaluate_head_sets` on these head sets (a resolved ``ablation``), for numbers
    computed on ``device`` (default: the model's). A Ray driver holds the model on its CPU and keys what its GPU
    workers compute with ``device="cuda"``.

    Example:
        >>> from cel_utils.tiny import tiny_model
        >>> from cel_utils.scoring import encode_task
        >>> from cel_utils.tasks import load_task
        >>> lm = tiny_model("llama"); enc = encode_task(lm, load_task("ioi", n=2))
        >>> k = result_key(lm, enc, [[], [(0, 1)]], Ablation.of("zero"))
        >>> len(k), k == result_key(lm, enc, [[], [(0, 1)]], Ablation.of("zero"), device="cuda")
        (32, False)
    """
    return cache.make_key(lm, enc, head_sets, ablation.mode, "exact", ablation.fingerprint(), device=device)


def set_keys(lm, enc: EncodedTask, head_sets: Sequence[Sequence[Head]], ablation: Ablation) -> list[str]:
    """A short key per head set: that of the set evaluated alone (with its own scale factor), the key
    :func:`by_set` caches it under; equal keys in a profile (:mod:`cel_utils.profiling`) are the same numbers
    computed twice.

    Example:
        >>> from cel_utils.tiny import tiny_model
        >>> from cel_utils.scoring import encode_task
        >>> from cel_utils.tasks import load_task
        >>> lm = tiny_model("llama"); enc = encode_task(lm, load_task("ioi", n=2))
        >>> a, b = set_keys(lm, enc, [[(0, 1)], [(0, 1)], [(1, 0)]], Ablation.of("zero")), set_keys(lm, enc, [[(0, 1)]], Ablation.of("zero"))
        >>> a[0] == a[1] == b[0] != a[2]
        True
    """
    alone = [replace(ablation, alphas=(a,)) for a in ablation.alphas] if ablation.alphas else [ablation] * len(head_sets)
    return [result_key(lm, enc, [hs], ab)[:16] for hs, ab in zip(head_sets, alone)]


def cached_result(key: str, n_sets: int, n_items: int) -> ItemResults | None:
    """The results stored under ``key`` (``cached=True``, ``seconds`` the compute time when they were made), or
    None when there is no entry of shape ``[n_sets, n_items]``; counted in :data:`cel_utils.cache.STATS`.

    Example:
        >>> cached_result("no-such-key", 2, 3) is None
        True
    """
    hit = cache.load(key)
    if hit is None or hit["correct"].shape != (n_sets, n_items):
        return None
    secs = float(hit["seconds"]) if "seconds" in hit else None
    return ItemResults(hit["correct"], hit["margin"], hit.get("choice_scores"), seconds=secs, cached=True)


def store_result(key: str, res: ItemResults) -> None:
    """Store ``res`` under ``key`` (atomically; see :func:`cel_utils.cache.store`).

    Example:
        >>> import os, tempfile, numpy as np
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"CEL_CACHE_DIR": tempfile.mkdtemp()}):
        ...     store_result("k" * 32, ItemResults(np.ones((1, 2), bool), np.zeros((1, 2)), seconds=0.5))
        ...     cached_result("k" * 32, 1, 2).seconds
        0.5
    """
    arrays = {"correct": res.correct, "margin": res.margin, "seconds": np.array(res.seconds or 0.0)}
    if res.choice_scores is not None:
        arrays["choice_scores"] = res.choice_scores
    cache.store(key, arrays)


def evaluate(lm, enc: EncodedTask, heads: Sequence[Head] = (), mode: str | Ablation = "zero", means=None,
             max_tokens: int = MAX_TOKENS, result_cache: bool | None = None) -> ItemResults:
    """Evaluate one head set (ablated together): :func:`evaluate_head_sets` with a single set."""
    return evaluate_head_sets(lm, enc, [list(heads)], mode=mode, means=means, max_tokens=max_tokens,
                              progress=False, result_cache=result_cache)


@dataclass
class ReadBatch:
    """One batch of input sequences (their suffixes after the shared prefix) and the reads they hold."""

    ids: torch.Tensor  # [B, pos]
    att: torch.Tensor  # [B, pos]
    reads: np.ndarray  # [reads] indices into the task's reads
    rows: torch.Tensor  # [reads] batch row of each read
    pos: torch.Tensor  # [reads] position of each read in the suffix
    tok: torch.Tensor  # [reads] token each read scores


def _plan(lm, enc, head_sets, max_tokens, P):
    """Batches of sequences, and per batch the forwards: (first ablated layer, the sets that start there)."""
    lengths = [len(x) - P for x in enc.inputs]
    batches = batches_by_tokens(lengths, max_tokens)
    groups: dict[int, list[int]] = {}
    for s, hs in enumerate(head_sets):
        groups.setdefault(min(l for l, _ in hs) if len(hs) else -1, []).append(s)
    plan = []
    for seqs in batches:
        T = max(lengths[i] for i in seqs)
        per_fwd = max(1, max_tokens // ((T + P) * len(seqs)))
        plan.append([(l, groups[l][c:c + per_fwd]) for l in sorted(k for k in groups if k >= 0)
                     for c in range(0, len(groups[l]), per_fwd)])
    return batches, plan, groups.get(-1, [])


def set_factors(ablation: Ablation, n_sets: int) -> torch.Tensor | None:
    """A scale ablation's factor per head set (its ``alphas``) as a tensor ``[n_sets]``; None without them.

        >>> set_factors(Ablation("scale", alphas=(1.0, 0.5)), 2).tolist(), set_factors(Ablation.of("zero"), 3)
        ([1.0, 0.5], None)
    """
    if not ablation.alphas:
        return None
    if len(ablation.alphas) != n_sets:
        raise CELError(f"{len(ablation.alphas)} scale factors for {n_sets} head sets")
    return torch.tensor(ablation.alphas, dtype=torch.float32)


@torch.no_grad()
def _read_stats_per_set(lm, enc: EncodedTask, head_sets, ablation: Ablation, max_tokens, progress, desc,
                        share_prefix) -> tuple[np.ndarray, np.ndarray]:
    """Per-read log-prob (zero for exact-match tasks, which read only gaps) and logit gap ``[n_sets, n_reads]`` of
    every head set."""
    S = len(head_sets)
    masks = row_masks(lm, head_sets)  # [S, n_layers, n_heads]
    factors = set_factors(ablation, S)  # [S] or None
    lp_out = np.zeros((S, enc.n_reads), dtype=np.float64)
    gap_out = np.zeros((S, enc.n_reads), dtype=np.float64)
    prefix = common_prefix(enc) if share_prefix else []
    P = len(prefix)
    batches, plan, unablated = _plan(lm, enc, head_sets, max_tokens, P)
    bar = tqdm(total=len(batches) + sum(map(len, plan)), desc=desc, disable=not progress_enabled(progress),
               leave=False)
    base = lm.model.base_model
    dev = lm.device
    ablator = HeadAblator(lm, ablation).attach()
    pre = PrefixKV(lm, base, torch.tensor([prefix], dtype=torch.long, device=dev)) if P else None

    def run(b: ReadBatch, k, prefix_masks, body_masks, start=0, residual=None, scales=None):
        """Forward k head sets x B sequences (rows are [set, sequence]) from layer ``start`` (the shared prefix
        too), ``scales [k]`` their factors; returns the last hidden states ``[k*B, pos, d_model]``."""
        ids, att, kw = b.ids.repeat(k, 1), b.att.repeat(k, 1), {"use_cache": False}
        if P:
            ablator.set_masks(prefix_masks, scales)
            att, kw = pre.kwargs(ids, att, k, len(b.ids), None if prefix_masks is None else start)
        ablator.set_masks(body_masks, None if scales is None else scales.repeat_interleave(len(b.ids)))
        STATS["forwards"] += 1
        with hooks.skip_layers_below(lm, start, residual):
            return base(input_ids=ids, attention_mask=att, **kw).last_hidden_state

    def score(b: ReadBatch, hidden, k):
        B = len(b.ids)
        rows = (torch.arange(k, device=dev)[:, None] * B + b.rows[None]).reshape(-1)  # set j: rows j*B..
        lp, gap = stats_at(lm, enc, hidden, rows, b.pos.repeat(k), b.tok.repeat(k))
        return lp.view(k, -1).cpu().numpy(), gap.view(k, -1).cpu().numpy()

    try:
        for seqs, forwards in zip(batches, plan):
            b = read_batch(lm, enc, seqs, P)
            with hooks.capture_layer_inputs(lm) as captured:  # clean pass, caching every layer's input
                hidden = run(b, 1, None, None)
            residuals = list(captured)
            lp, gap = score(b, hidden, 1)
            for s in unablated:
                lp_out[s, b.reads], gap_out[s, b.reads] = lp[0], gap[0]
            bar.update(1)
            for l, ss in forwards:
                k = len(ss)
                hidden = run(b, k, masks[ss], masks[ss].repeat_interleave(len(seqs), dim=0), start=l,
                             residual=residuals[l].repeat(k, 1, 1) if l > 0 else None,
                             scales=None if factors is None else factors[ss])
                lp, gap = score(b, hidden, k)
                for j, s in enumerate(ss):
                    lp_out[s, b.reads], gap_out[s, b.reads] = lp[j], gap[j]
                bar.update(1)
    finally:
        ablator.detach()
        bar.close()
    return lp_out, gap_out


def stats_at(lm, enc: EncodedTask, hidden: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor,
             tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~cel_utils.scoring.read_stats` of the reads at (``rows``, ``pos``) of ``hidden [rows, pos, d_model]``
    scoring ``tokens``, each ``[reads]``: the LM head runs once per distinct position (the choices of an item read
    at one position share it), and exact-match tasks skip the log-probs they do not use."""
    key = rows * hidden.shape[1] + pos
    at, inverse = torch.unique(key, return_inverse=True)  # distinct positions, and each read's
    logits = logits_at(lm, hidden[at // hidden.shape[1], at % hidden.shape[1]])  # [positions, vocab]
    return read_stats(logits, tokens, enc.continues, rows=inverse, log_probs=enc.kind != "em")


def read_batch(lm, enc: EncodedTask, seqs: list[int], P: int = 0) -> ReadBatch:
    """Input sequences ``seqs`` of a task (their tokens after the first ``P``, the shared prefix), right-padded on
    the model's device, with the reads they hold: which batch row, which position, which token. Every batch of
    the engine starts here, so torch's threads are re-chosen here (:func:`cel_utils.threads.adapt`)."""
    threads.adapt()
    dev = lm.device
    ids, att = hooks.pad_right([enc.inputs[i][P:] for i in seqs], hooks.pad_id(lm))
    reads = enc.reads_of(seqs)
    row_of_seq = {s: r for r, s in enumerate(seqs)}
    return ReadBatch(ids=ids.to(dev), att=att.to(dev), reads=reads,
                  rows=torch.tensor([row_of_seq[int(s)] for s in enc.read_seq[reads]], device=dev),
                  pos=torch.tensor(enc.read_pos[reads] - P, device=dev),
                  tok=torch.tensor(enc.read_tok[reads], device=dev))


@torch.no_grad()
def read_stats_with(lm, enc: EncodedTask, points_for=None, max_tokens: int = MAX_TOKENS,
                    share_prefix: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per-read log-prob and logit gap ``[n_reads]`` of one forward over every input sequence, with the hook
    points ``points_for(seqs)`` (:func:`cel_utils.hooks.hooked`) attached for the batch holding input sequences
    ``seqs`` (indices into ``enc.inputs``; rows in that order, positions counted from the end of the shared prefix).
    The shared prompt prefix runs once per batch *without* the points (it is the same for every item), its
    keys/values reused. :func:`aggregate` turns the result into per-item results."""
    prefix = common_prefix(enc) if share_prefix else []
    P = len(prefix)
    lp_out, gap_out = np.zeros(enc.n_reads), np.zeros(enc.n_reads)
    base, dev = lm.model.base_model, lm.device
    prefix_ids = torch.tensor([prefix], dtype=torch.long, device=dev) if P else None
    for seqs in batches_by_tokens([len(x) - P for x in enc.inputs], max_tokens):
        b = read_batch(lm, enc, seqs, P)
        att, kw = b.att, {"use_cache": False}  # use_cache: the KV cache of transformers
        if P:
            att, kw = prefix_kwargs(base, prefix_ids, b.ids, att, len(b.ids))
        with hooks.hooked(lm, points_for(seqs) if points_for else []):
            hidden = base(input_ids=b.ids, attention_mask=att, **kw).last_hidden_state  # [B, pos, d_model]
        lp, gap = stats_at(lm, enc, hidden, b.rows, b.pos, b.tok)
        lp_out[b.reads], gap_out[b.reads] = lp.cpu().numpy(), gap.cpu().numpy()
    return lp_out, gap_out


@torch.no_grad()
def resample_stats(lm, enc: EncodedTask, head_sets, ablation: Ablation, max_tokens: int = MAX_TOKENS,
                   share_prefix: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_read_stats_per_set` for resample ablation (:class:`~cel_utils.ablation.Resampler`): one clean pass
    storing every sequence's outputs of the layers any set ablates (the donors'), then one patched pass per head
    set. On the shared prompt prefix every item's output is the same, so there is nothing to resample there.
    Returns per-read log-prob and gap ``[n_sets, n_reads]``."""
    P = len(common_prefix(enc)) if share_prefix else 0
    rs = Resampler(ablation, [len(x) - P for x in enc.inputs], sorted({l for hs in head_sets for l, _ in hs}))
    lp_out, gap_out = np.zeros((len(head_sets), enc.n_reads)), np.zeros((len(head_sets), enc.n_reads))
    clean = read_stats_with(lm, enc, rs.keep, max_tokens, share_prefix)
    for s, hs in enumerate(head_sets):
        lp_out[s], gap_out[s] = read_stats_with(lm, enc, rs.patch(list(hs)), max_tokens, share_prefix) if hs \
            else clean
    return lp_out, gap_out
