"""Screening: ablate heads one at a time (or many head sets) and measure the task.

The exact engine (:func:`evaluate_head_sets`) gives the same numbers as the plain loop
(:func:`plain_screen`: one full forward per head over every (item, choice) sequence) and uses the
structure of the problem:

* layers below the first ablated layer ``l`` are unchanged, so one clean pass per batch caches every
  layer's input residual ``[batch, pos, d_model]`` and ablated passes start at layer ``l`` (the
  decoder layers below ``l`` are swapped for stubs that return the cached residual);
* several head sets are evaluated in one batched forward, one head set per group of rows;
* logits are computed only at the positions that scoring reads;
* each item's prompt is run once for all its one-token choices (see :mod:`cel_utils.scoring`).

Example:
    >>> from cel_utils import models, tasks, screening        # doctest: +SKIP
    >>> lm = models.load_model("smollm2-135m")                 # doctest: +SKIP
    >>> task = tasks.load_task("addition", n=20)               # doctest: +SKIP
    >>> df = screening.screen(lm, task).table                 # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .ablation import HeadAblator, Head, all_heads, compute_head_means, head_name, pad_id, pad_right, row_masks
from .models import FAMILIES, _get_attr
from .scoring import EncodedTask, ItemResults, aggregate, batches_by_tokens, encode_task, logits_at, \
    plain_evaluate, read_stats


class _Stub(torch.nn.Module):
    """Stands in for a decoder layer below the first ablated layer: returns a cached residual."""

    def __init__(self, out: torch.Tensor | None):
        super().__init__()
        self.out = out

    def forward(self, *args, **kwargs):
        if self.out is not None:
            return self.out
        return args[0] if args else kwargs["hidden_states"]


def _layer_list(lm) -> torch.nn.ModuleList:
    return _get_attr(lm.model, FAMILIES[lm.family][0])


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


def _cache_kw(base) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _prefix_kwargs(base, prefix_ids: torch.Tensor, ids: torch.Tensor, att: torch.Tensor, repeat: int):
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
    kw = {_cache_kw(base): pkv, "use_cache": True,
          "position_ids": (torch.arange(ids.shape[1], device=dev) + P)[None].expand(ids.shape[0], -1)}
    return att, kw


def evaluate_head_sets(lm, enc: EncodedTask, head_sets: Sequence[Sequence[Head]], mode: str = "zero",
                       means: torch.Tensor | None = None, max_tokens: int = 8192, progress: bool = True,
                       desc: str = "evaluating head sets", share_prefix: bool = True,
                       use_cache: bool | None = None) -> ItemResults:
    """Evaluate each head set (heads in a set ablated together) on every item.

    Returns per-item results ``[len(head_sets), n_items]``. An empty head set gives the unablated model.
    ``max_tokens`` bounds the padded tokens per forward (memory). With ``share_prefix`` a prompt prefix
    common to all items (few-shot demonstrations) is run once per head set and its keys/values reused.
    Results are cached on disk (see :mod:`cel_utils.cache`) unless ``use_cache=False`` or ``CEL_NO_CACHE=1``.
    """
    from . import cache

    use_cache = cache.enabled() if use_cache is None else use_cache
    key = None
    if use_cache:
        extra = {}
        if mode == "mean" and means is not None:
            extra["means"] = hashlib.sha256(means.detach().cpu().float().numpy().tobytes()).hexdigest()
        key = cache.make_key(lm, enc, head_sets, mode, "exact", extra)
        hit = cache.load(key)
        if hit is not None and hit["correct"].shape == (len(head_sets), enc.n_items):
            secs = float(hit["seconds"]) if "seconds" in hit else None
            return ItemResults(hit["correct"], hit["margin"], hit.get("choice_scores"), seconds=secs, cached=True)
    t0 = time.perf_counter()
    res = _evaluate_head_sets(lm, enc, head_sets, mode, means, max_tokens, progress, desc, share_prefix)
    res.seconds = time.perf_counter() - t0
    if key is not None:
        arrays = {"correct": res.correct, "margin": res.margin, "seconds": np.array(res.seconds)}
        if res.choice_scores is not None:
            arrays["choice_scores"] = res.choice_scores
        cache.store(key, arrays)
    return res


@torch.no_grad()
def _evaluate_head_sets(lm, enc: EncodedTask, head_sets, mode, means, max_tokens, progress, desc,
                        share_prefix) -> ItemResults:
    S = len(head_sets)
    masks = row_masks(lm, head_sets)  # [S, n_layers, n_heads]
    first_layer = [min(l for l, _ in hs) if len(hs) else -1 for hs in head_sets]
    groups: dict[int, list[int]] = {}
    for s, l in enumerate(first_layer):
        groups.setdefault(l, []).append(s)
    lp_out = np.zeros((S, enc.n_reads), dtype=np.float64)
    gap_out = np.zeros((S, enc.n_reads), dtype=np.float64)

    prefix = common_prefix(enc) if share_prefix else []
    P = len(prefix)
    suffixes = [x[P:] for x in enc.inputs]
    lengths = [len(x) for x in suffixes]
    batches = batches_by_tokens(lengths, max_tokens)
    order = np.argsort(enc.read_seq, kind="stable")
    bounds = np.searchsorted(enc.read_seq[order], np.arange(len(enc.inputs) + 1))
    reads_of_seq = {s: order[bounds[s]:bounds[s + 1]] for s in range(len(enc.inputs))}

    plan: dict[int, list] = {}
    n_fwd = 0
    for bi, seqs in enumerate(batches):
        T = max(lengths[i] for i in seqs)
        per_fwd = max(1, max_tokens // ((T + P) * len(seqs)))
        for l in sorted(k for k in groups if k >= 0):
            ss = groups[l]
            for c in range(0, len(ss), per_fwd):
                plan.setdefault(bi, []).append((l, ss[c:c + per_fwd]))
                n_fwd += 1
    bar = tqdm(total=len(batches) + n_fwd, desc=desc, disable=not progress, leave=False)

    layers = _layer_list(lm)
    originals = list(layers)
    base = lm.model.base_model
    ablator = HeadAblator(lm, mode=mode, means=means).attach()
    captured: list = [None] * lm.n_layers
    dev = lm.device
    prefix_ids = torch.tensor([prefix], dtype=torch.long, device=dev) if P else None

    def capture(j):
        def hook(module, args, kwargs):
            captured[j] = args[0] if args else kwargs["hidden_states"]
        return hook

    def run(ids, att, k, B, prefix_masks, body_masks, stub_below=0, stub_out=None):
        """Forward k head sets x B sequences; rows are [set, sequence].

        Layers below ``stub_below`` are skipped in the body pass: the last of them returns ``stub_out``.
        """
        kw = {"use_cache": False}
        if P:
            ablator.set_masks(prefix_masks)
            att, kw = _prefix_kwargs(base, prefix_ids.repeat(k, 1), ids, att, B)
        ablator.set_masks(body_masks)
        try:
            for j in range(stub_below):
                layers[j] = _Stub(stub_out if j == stub_below - 1 else None)
            return base(input_ids=ids, attention_mask=att, **kw).last_hidden_state
        finally:
            for j in range(stub_below):
                layers[j] = originals[j]

    try:
        pad = pad_id(lm)
        for bi, seqs in enumerate(batches):
            ids, att = pad_right([suffixes[i] for i in seqs], pad)
            ids, att = ids.to(dev), att.to(dev)
            B = len(seqs)
            reads = np.concatenate([reads_of_seq[s] for s in seqs])
            row_of_seq = {s: r for r, s in enumerate(seqs)}
            r_rows = torch.tensor([row_of_seq[int(enc.read_seq[r])] for r in reads], device=dev)
            r_pos = torch.tensor(enc.read_pos[reads] - P, device=dev)
            r_tok = torch.tensor(enc.read_tok[reads], device=dev)

            # clean pass, caching every layer's input
            handles = [originals[j].register_forward_pre_hook(capture(j), with_kwargs=True)
                       for j in range(lm.n_layers)]
            try:
                hidden = run(ids, att, 1, B, None, None)
            finally:
                for h in handles:
                    h.remove()
            cache = [c.detach() for c in captured]
            lp, gap = read_stats(logits_at(lm, hidden[r_rows, r_pos]), r_tok)
            for s in groups.get(-1, []):
                lp_out[s, reads] = lp.cpu().numpy()
                gap_out[s, reads] = gap.cpu().numpy()
            bar.update(1)

            for l, ss in plan.get(bi, []):
                k = len(ss)
                # rows are [set, sequence]: set j occupies rows j*B .. (j+1)*B-1
                hidden = run(ids.repeat(k, 1), att.repeat(k, 1), k, B, masks[ss],
                             masks[ss].repeat_interleave(B, dim=0), stub_below=l,
                             stub_out=cache[l].repeat(k, 1, 1) if l > 0 else None)  # [k*B, pos, d_model]
                rows = (torch.arange(k, device=dev)[:, None] * B + r_rows[None]).reshape(-1)
                lp, gap = read_stats(logits_at(lm, hidden[rows, r_pos.repeat(k)]), r_tok.repeat(k))
                lp = lp.view(k, -1).cpu().numpy()
                gap = gap.view(k, -1).cpu().numpy()
                for j, s in enumerate(ss):
                    lp_out[s, reads] = lp[j]
                    gap_out[s, reads] = gap[j]
                bar.update(1)
            captured[:] = [None] * lm.n_layers
    finally:
        ablator.detach()
        for j in range(lm.n_layers):
            layers[j] = originals[j]
        bar.close()
    return aggregate(enc, lp_out, gap_out)


@dataclass
class Screen:
    """A screen: baseline and per-head results, with the per-item arrays kept for statistics."""

    heads: list[Head]
    baseline: ItemResults  # [1, n_items]
    results: ItemResults  # [n_heads, n_items]
    mode: str
    method: str = "exact"
    seconds: float = 0.0  # compute time (for a cached result: the time it took when it was computed)
    meta: dict = field(default_factory=dict)
    n_layers: int | None = None  # the model's depth (for cost accounting)

    @property
    def table(self) -> pd.DataFrame:
        acc = self.results.accuracy
        mm = self.results.mean_margin
        b_acc = float(self.baseline.accuracy[0])
        b_m = float(self.baseline.mean_margin[0])
        return pd.DataFrame({
            "head": [head_name(h) for h in self.heads],
            "layer": [h[0] for h in self.heads],
            "head_index": [h[1] for h in self.heads],
            "accuracy": acc,
            "mean_margin": mm,
            "delta_accuracy": acc - b_acc,
            "delta_margin": mm - b_m,
        })

    def stats(self, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05, fdr: float = 0.10) -> pd.DataFrame:
        """Per-head statistics on these items, with the candidate rule applied.

        Paired bootstrap (same items with and without the ablation) 95% CIs of the change in accuracy
        (``ci_low``, ``ci_high``, ``p_value``; ``q_value`` = Benjamini-Hochberg over all screened heads) and
        in mean margin (``margin_ci_low``, ``margin_ci_high``).

        **Candidate rule**: removal helps on both measures — the accuracy gain is significant after FDR
        correction (``delta_accuracy > 0`` and ``q_value < fdr``) and the margin CI lies above zero.
        """
        from .stats import benjamini_hochberg, paired_bootstrap_many

        acc = paired_bootstrap_many(self.baseline.correct[0].astype(float), self.results.correct.astype(float),
                                    n_boot=n_boot, seed=seed, alpha=alpha)
        mar = paired_bootstrap_many(self.baseline.margin[0], self.results.margin, n_boot=n_boot, seed=seed,
                                    alpha=alpha)
        tab = self.table
        tab["ci_low"], tab["ci_high"], tab["p_value"] = acc["ci_low"], acc["ci_high"], acc["p_value"]
        tab["q_value"] = benjamini_hochberg(acc["p_value"])
        tab["margin_ci_low"], tab["margin_ci_high"] = mar["ci_low"], mar["ci_high"]
        tab["candidate"] = (tab.delta_accuracy > 0) & (tab.q_value < fdr) & (tab.margin_ci_low > 0)
        return tab

    def top(self, k: int = 10, by: str = "delta_margin") -> pd.DataFrame:
        return self.table.sort_values([by, "delta_accuracy" if by != "delta_accuracy" else "delta_margin"],
                                      ascending=False).head(k).reset_index(drop=True)


def screen(lm, task, heads: Sequence[Head] | None = None, mode: str = "zero", means=None,
           max_tokens: int = 8192, progress: bool = True, enc: EncodedTask | None = None,
           use_cache: bool | None = None) -> Screen:
    """Ablate each head alone (all heads by default) with the exact engine (results cached on disk)."""
    heads = list(heads) if heads is not None else all_heads(lm)
    enc = enc if enc is not None else encode_task(lm, task)
    if mode == "mean" and means is None:
        means = compute_head_means(lm, [enc_i for enc_i in enc.inputs])
    t0 = time.perf_counter()
    res = evaluate_head_sets(lm, enc, [[]] + [[h] for h in heads], mode=mode, means=means,
                             max_tokens=max_tokens, progress=progress, desc=f"screening {len(heads)} heads",
                             use_cache=use_cache)
    secs = time.perf_counter() - t0
    if res.cached and res.seconds is not None:
        secs = res.seconds  # the compute time when the result was made, not the time to read it back
    base = ItemResults(res.correct[:1], res.margin[:1], None if res.choice_scores is None else res.choice_scores[:1])
    rest = ItemResults(res.correct[1:], res.margin[1:], None if res.choice_scores is None else res.choice_scores[1:])
    return Screen(heads=heads, baseline=base, results=rest, mode=mode, seconds=secs, n_layers=lm.n_layers,
                  meta={"from_cache": bool(res.cached)})


def plain_screen(lm, task, heads: Sequence[Head] | None = None, mode: str = "zero", means=None,
                 batch_size: int = 16, progress: bool = True, enc: EncodedTask | None = None) -> Screen:
    """The plain loop: for each head, one full forward over every (item, choice) sequence."""
    heads = list(heads) if heads is not None else all_heads(lm)
    enc = enc if enc is not None else encode_task(lm, task)
    if mode == "mean" and means is None:
        means = compute_head_means(lm, [enc_i for enc_i in enc.inputs])
    t0 = time.perf_counter()
    ablator = HeadAblator(lm, mode=mode, means=means).attach()
    try:
        base = plain_evaluate(lm, enc, (), batch_size=batch_size, ablator=ablator)
        outs = [plain_evaluate(lm, enc, [h], batch_size=batch_size, ablator=ablator)
                for h in tqdm(heads, desc="plain loop", disable=not progress, leave=False)]
    finally:
        ablator.detach()
    secs = time.perf_counter() - t0
    res = ItemResults(np.concatenate([o.correct for o in outs]), np.concatenate([o.margin for o in outs]))
    return Screen(heads=heads, baseline=base, results=res, mode=mode, method="plain", seconds=secs,
                  n_layers=lm.n_layers)


def recheck(lm, task, head_sets: dict[str, Sequence[Head]], mode: str = "zero", means=None,
            n_boot: int = 2000, seed: int = 0, progress: bool = False, use_cache: bool | None = None) -> pd.DataFrame:
    """Evaluate named head sets on (held-out) items: accuracy, change vs baseline with a paired bootstrap CI.

    ``head_sets`` maps a label (e.g. ``"L14H8"`` or ``"top 5 together"``) to the heads to ablate together.
    """
    from .stats import paired_bootstrap_many

    enc = encode_task(lm, task)
    names = list(head_sets)
    res = evaluate_head_sets(lm, enc, [[]] + [list(head_sets[k]) for k in names], mode=mode, means=means,
                             progress=progress, desc="re-checking", use_cache=use_cache)
    base_c, base_m = res.correct[0].astype(float), res.margin[0]
    acc = paired_bootstrap_many(base_c, res.correct[1:].astype(float), n_boot=n_boot, seed=seed)
    mar = paired_bootstrap_many(base_m, res.margin[1:], n_boot=n_boot, seed=seed)
    return pd.DataFrame({
        "heads": names,
        "n_items": enc.n_items,
        "baseline_accuracy": float(base_c.mean()),
        "accuracy": res.correct[1:].mean(axis=1),
        "delta_accuracy": acc["delta"], "ci_low": acc["ci_low"], "ci_high": acc["ci_high"],
        "p_value": acc["p_value"],
        "delta_margin": mar["delta"], "margin_ci_low": mar["ci_low"], "margin_ci_high": mar["ci_high"],
    })


# ---------------------------------------------------------------------------------------------
# Approximate screens, and how they compare with the exact one
# ---------------------------------------------------------------------------------------------
def forward_equivalents(lm, head_sets: Sequence[Sequence[Head]]) -> float:
    """Cost of evaluating head sets with the engine, in clean full forwards: 1 (the clean pass) plus, per set,
    the fraction of layers it recomputes (from its first ablated layer up)."""
    return 1.0 + sum((lm.n_layers - min(l for l, _ in hs)) / lm.n_layers for hs in head_sets if hs)


@dataclass
class ApproxScreen:
    """Estimated change in mean margin per head, from an approximate method."""

    heads: list[Head]
    estimate: np.ndarray  # [n_heads] estimated delta_margin
    method: str
    seconds: float
    forward_equivalents: float
    n_evaluations: int
    meta: dict = field(default_factory=dict)

    @property
    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"head": [head_name(h) for h in self.heads], "layer": [h[0] for h in self.heads],
                             "head_index": [h[1] for h in self.heads], "estimated_delta_margin": self.estimate})


def _differentiable_margins(enc: EncodedTask, lp: torch.Tensor, gap: torch.Tensor, reads: np.ndarray,
                            items: np.ndarray) -> torch.Tensor:
    """Per-item margins (torch, differentiable) for the reads of a batch; ``items`` are the batch's items."""
    dev = lp.device
    pos = {int(i): k for k, i in enumerate(items)}
    ri = torch.tensor([pos[int(i)] for i in enc.read_item[reads]], device=dev)
    if enc.kind == "em":
        m = torch.full((len(items),), float("inf"), dtype=gap.dtype, device=dev)
        return m.scatter_reduce(0, ri, gap, reduce="amin", include_self=True)
    C = int(enc.n_choices.max())
    flat = ri * C + torch.tensor(enc.read_choice[reads], device=dev)
    scores = torch.zeros(len(items) * C, dtype=lp.dtype, device=dev).index_add(0, flat, lp).view(len(items), C)
    valid = torch.arange(C, device=dev)[None] < torch.tensor(enc.n_choices[items], device=dev)[:, None]
    scores = scores.masked_fill(~valid, float("-inf"))
    ans = torch.tensor(enc.answers[items], device=dev)
    a = scores.gather(1, ans[:, None])[:, 0]
    others = scores.scatter(1, ans[:, None], float("-inf")).max(dim=1).values
    return a - others


def gradient_screen(lm, task, mode: str = "zero", means=None, max_tokens: int = 4096, enc: EncodedTask | None = None,
                    progress: bool = False, share_prefix: bool = True) -> ApproxScreen:
    """First-order estimate of every head's ablation effect on the mean margin (Michel et al. 2019).

    A differentiable mask ``m [n_layers, n_heads]`` scales each head's output (``zero``: ``m * x``; ``mean``:
    ``mean + m * (x - mean)``); one forward and one backward at ``m = 1`` give ``d margin / d m``, and
    removing head h (``m_h: 1 -> 0``) changes the margin by about ``-d margin / d m_h``.
    """
    enc = enc if enc is not None else encode_task(lm, task)
    if mode == "mean" and means is None:
        means = compute_head_means(lm, enc.inputs)
    H, D = lm.n_heads, lm.head_dim
    mask = torch.ones(lm.n_layers, H, dtype=torch.float32, device=lm.device, requires_grad=True)

    def make_hook(layer):
        def pre_hook(module, args):
            x = args[0]
            b, t = x.shape[:2]
            xh = x.view(b, t, H, D)
            m = mask[layer].to(x.dtype)[None, None, :, None]
            if mode == "mean":
                mu = means[layer].to(x)[None, None]
                xh = mu + m * (xh - mu)
            else:
                xh = xh * m
            return (xh.reshape(b, t, H * D),) + tuple(args[1:])
        return pre_hook

    t0 = time.perf_counter()
    handles = [lm.out_proj(l).register_forward_pre_hook(make_hook(l)) for l in range(lm.n_layers)]
    order = np.argsort(enc.read_seq, kind="stable")
    bounds = np.searchsorted(enc.read_seq[order], np.arange(len(enc.inputs) + 1))
    # group inputs so that every item's reads are in one batch (its margin needs all its choices)
    seqs_of_item: dict[int, set] = {}
    for r in range(enc.n_reads):
        seqs_of_item.setdefault(int(enc.read_item[r]), set()).add(int(enc.read_seq[r]))
    prefix = common_prefix(enc) if share_prefix else []
    P = len(prefix)
    lengths = [len(x) - P for x in enc.inputs]
    batches, cur, cur_tok = [], [], 0
    for i in range(enc.n_items):
        s = sorted(seqs_of_item[i])
        tok = sum(lengths[j] for j in s)
        if cur and cur_tok + tok > max_tokens:
            batches.append(cur)
            cur, cur_tok = [], 0
        cur.append(i)
        cur_tok += tok
    if cur:
        batches.append(cur)
    total = 0.0
    was_training = lm.model.training
    base = lm.model.base_model
    dev = lm.device
    try:
        for items in tqdm(batches, desc="gradient screen", disable=not progress, leave=False):
            seqs = sorted({j for i in items for j in seqs_of_item[i]})
            row = {s: k for k, s in enumerate(seqs)}
            ids, att = pad_right([enc.inputs[s][P:] for s in seqs], pad_id(lm))
            ids, att = ids.to(dev), att.to(dev)
            kw = {"use_cache": False}
            if P:  # the shared few-shot prefix: run once (with gradients), reuse its keys/values
                att, kw = _prefix_kwargs(base, torch.tensor([prefix], device=dev), ids, att, len(seqs))
            hidden = base(input_ids=ids, attention_mask=att, **kw).last_hidden_state
            reads = np.concatenate([order[bounds[s]:bounds[s + 1]] for s in seqs])
            rows = torch.tensor([row[int(enc.read_seq[r])] for r in reads], device=dev)
            pos = torch.tensor(enc.read_pos[reads] - P, device=dev)
            lp, gap = read_stats(logits_at(lm, hidden[rows, pos]), torch.tensor(enc.read_tok[reads], device=dev))
            margins = _differentiable_margins(enc, lp, gap, reads, np.asarray(items))
            (margins.sum() / enc.n_items).backward()
            total += float(margins.sum().detach())
    finally:
        for h in handles:
            h.remove()
        lm.model.train(was_training)
        lm.model.zero_grad(set_to_none=True)
    grad = mask.grad.detach().cpu().numpy()  # [n_layers, n_heads]
    heads = all_heads(lm)
    est = np.array([-grad[l, h] for l, h in heads])
    return ApproxScreen(heads=heads, estimate=est, method="gradient", seconds=time.perf_counter() - t0,
                        forward_equivalents=3.0, n_evaluations=1, meta={"baseline_mean_margin": total / enc.n_items})


def compressed_screen(lm, task, n_evaluations: int | None = None, p: float | None = None, mode: str = "zero",
                      means=None, seed: int = 0, enc: EncodedTask | None = None, progress: bool = False,
                      use_cache: bool | None = None) -> ApproxScreen:
    """Compressed-sensing screen (Bair et al. 2026): random knockouts, then a sparse regression.

    Each of ``n_evaluations`` evaluations ablates a random subset of heads (each head with probability
    ``p``); a cross-validated Lasso of the change in mean margin on the 0/1 knockout pattern estimates each
    head's effect with fewer evaluations than heads.
    """
    from sklearn.linear_model import LassoCV

    enc = enc if enc is not None else encode_task(lm, task)
    if mode == "mean" and means is None:
        means = compute_head_means(lm, enc.inputs)
    heads = all_heads(lm)
    N = len(heads)
    n_evaluations = n_evaluations or max(20, N // 2)
    p = p if p is not None else min(0.2, 4.0 / N ** 0.5)
    rng = np.random.default_rng(seed)
    X = (rng.random((n_evaluations, N)) < p)
    X[X.sum(1) == 0, rng.integers(0, N)] = True
    sets = [[heads[j] for j in np.flatnonzero(x)] for x in X]
    t0 = time.perf_counter()
    res = evaluate_head_sets(lm, enc, [[]] + sets, mode=mode, means=means, progress=progress,
                             desc="compressed-sensing knockouts", use_cache=use_cache)
    y = res.mean_margin[1:] - res.mean_margin[0]
    model = LassoCV(cv=5, alphas=30, random_state=seed, max_iter=20000).fit(X.astype(float), y)
    secs = time.perf_counter() - t0
    return ApproxScreen(heads=heads, estimate=model.coef_, method="compressed", seconds=secs,
                        forward_equivalents=forward_equivalents(lm, sets), n_evaluations=n_evaluations,
                        meta={"p": p, "alpha": float(model.alpha_), "intercept": float(model.intercept_)})


def compare_to_exact(exact: Screen, approx: ApproxScreen, k: int = 10) -> dict:
    """Agreement of an approximate screen with the exact one on the change in mean margin."""
    from scipy.stats import spearmanr

    tab = exact.table.set_index("head")
    est = pd.Series(approx.estimate, index=[head_name(h) for h in approx.heads]).loc[tab.index]
    true = tab["delta_margin"]
    top_true, top_est = set(true.nlargest(k).index), set(est.nlargest(k).index)
    bot_true, bot_est = set(true.nsmallest(k).index), set(est.nsmallest(k).index)
    return {"method": approx.method, "spearman": float(spearmanr(true, est).statistic),
            f"recall_top{k}_improvers": len(top_true & top_est) / k,
            f"recall_top{k}_harmful": len(bot_true & bot_est) / k,
            "seconds": approx.seconds, "forward_equivalents": approx.forward_equivalents,
            "exact_seconds": exact.seconds,
            "exact_forward_equivalents": forward_equivalents_for_screen(exact),
            "n_evaluations": approx.n_evaluations}


def forward_equivalents_for_screen(sc: Screen) -> float:
    L = sc.n_layers if sc.n_layers is not None else max(l for l, _ in sc.heads) + 1
    return 1.0 + sum((L - l) / L for l, _ in sc.heads)
