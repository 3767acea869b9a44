"""Approximate screens, how they compare with the exact one, and the speed benchmark.

* :func:`gradient_screen`: first-order attribution (Michel et al. 2019), one forward and one backward.
* :func:`compressed_screen`: random knockouts and a sparse regression (Bair et al. 2026).
* :func:`compare_to_exact`: Spearman correlation and top-k recall against an exact :class:`~cel_utils.screening.Screen`.
* :func:`benchmark`: the plain loop against the exact engine on the same heads, and both approximate screens
  against a full exact screen (chapter 1b and ``benchmarks/bench_screen.py`` both call it).

Example:
    >>> from cel_utils.approximate import gradient_screen, compare_to_exact   # doctest: +SKIP
    >>> compare_to_exact(screen(lm, task), gradient_screen(lm, task))["spearman"]  # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import hooks, profiling
from .ablation import Ablation, Head, all_heads, head_name
from .defaults import (GRADIENT_FORWARD_EQUIVALENTS, GRADIENT_MAX_TOKENS, LASSO_CV, LASSO_MAX_ITER,
                       LASSO_N_ALPHAS, progress_enabled)
from .engine import (common_prefix, evaluate, evaluate_head_sets, forward_equivalents, prefix_kwargs,
                     read_batch)
from .scoring import EncodedTask, encode_task, logits_at, read_stats
from .screening import Screen, plain_screen, screen


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


# ---------------------------------------------------------------------------------------------
# Gradient attribution
# ---------------------------------------------------------------------------------------------
def differentiable_margins(enc: EncodedTask, lp: torch.Tensor, gap: torch.Tensor, reads: np.ndarray,
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


def _item_batches(enc: EncodedTask, lengths: list[int], max_tokens: int) -> tuple[list[list[int]], dict]:
    """Group items so that every item's input sequences are in one batch (its margin needs all its choices)."""
    seqs_of_item: dict[int, set] = {}
    for r in range(enc.n_reads):
        seqs_of_item.setdefault(int(enc.read_item[r]), set()).add(int(enc.read_seq[r]))
    batches, cur, cur_tok = [], [], 0
    for i in range(enc.n_items):
        tok = sum(lengths[j] for j in seqs_of_item[i])
        if cur and cur_tok + tok > max_tokens:
            batches.append(cur)
            cur, cur_tok = [], 0
        cur.append(i)
        cur_tok += tok
    if cur:
        batches.append(cur)
    return batches, seqs_of_item


def _scaling(lm, mask: torch.Tensor, ablation: Ablation) -> list:
    """``z`` hooks that move each head toward its removed value by ``mask [n_layers, n_heads]`` (1: intact; the
    :class:`~cel_utils.ablation.Ablation`'s :meth:`~cel_utils.ablation.Ablation.blend`)."""
    return [("z", l, lambda z, l=l: ablation.blend(z, l, mask[l])) for l in range(lm.n_layers)]


def backprop_mean_margin(lm, enc: EncodedTask, points: list, max_tokens: int = GRADIENT_MAX_TOKENS,
                         share_prefix: bool = True, progress: bool = False, desc: str = "gradient") -> float:
    """One forward and one backward of the mean margin over the task's items with the hook ``points`` attached
    (:func:`cel_utils.hooks.hooked`): the gradients land on the tensors the points' functions use (a mask, a
    constant). Returns the mean margin. Items are batched whole (an item's margin needs all its choices) and a
    prompt prefix shared by every item runs once per batch, with gradients, its keys/values reused."""
    prefix = common_prefix(enc) if share_prefix else []
    P = len(prefix)
    batches, seqs_of_item = _item_batches(enc, [len(x) - P for x in enc.inputs], max_tokens)
    total = 0.0
    base, dev = lm.model.base_model, lm.device
    try:
        with hooks.hooked(lm, points):
            for items in tqdm(batches, desc=desc, disable=not progress_enabled(progress), leave=False):
                b = read_batch(lm, enc, sorted({j for i in items for j in seqs_of_item[i]}), P)
                att, kw = b.att, {"use_cache": False}  # use_cache: the KV cache of transformers
                if P:  # the shared few-shot prefix: run once (with gradients), reuse its keys/values
                    att, kw = prefix_kwargs(base, torch.tensor([prefix], device=dev), b.ids, att, len(b.ids))
                hidden = base(input_ids=b.ids, attention_mask=att, **kw).last_hidden_state  # [B, pos, d_model]
                lp, gap = read_stats(logits_at(lm, hidden[b.rows, b.pos]), b.tok, enc.continues)
                margins = differentiable_margins(enc, lp, gap, b.reads, np.asarray(items))
                (margins.sum() / enc.n_items).backward()
                total += float(margins.sum().detach())
    finally:
        lm.model.zero_grad(set_to_none=True)
    return total / enc.n_items


@profiling.timed
def gradient_screen(lm, task, mode: str | Ablation = "zero", means=None, max_tokens: int = GRADIENT_MAX_TOKENS,
                    enc: EncodedTask | None = None, progress: bool = False, share_prefix: bool = True) -> ApproxScreen:
    """First-order estimate of every head's ablation effect on the mean margin (Michel et al. 2019).

    A differentiable mask ``m [n_layers, n_heads]`` scales each head's output (``zero``: ``m * x``; ``mean``:
    ``mean + m * (x - mean)``); one forward and one backward at ``m = 1`` give ``d margin / d m``, and
    removing head h (``m_h: 1 -> 0``) changes the margin by about ``-d margin / d m_h``.
    """
    enc = enc if enc is not None else encode_task(lm, task)
    ablation = Ablation.of(mode, means).resolved(lm, enc.inputs)
    mask = torch.ones(lm.n_layers, lm.n_heads, dtype=torch.float32, device=lm.device, requires_grad=True)
    t0 = time.perf_counter()
    base_margin = backprop_mean_margin(lm, enc, _scaling(lm, mask, ablation), max_tokens, share_prefix, progress,
                                       desc="gradient screen")
    grad = mask.grad.detach().cpu().numpy()  # [n_layers, n_heads]
    heads = all_heads(lm)
    return ApproxScreen(heads=heads, estimate=np.array([-grad[l, h] for l, h in heads]), method="gradient",
                        seconds=time.perf_counter() - t0, forward_equivalents=GRADIENT_FORWARD_EQUIVALENTS,
                        n_evaluations=1, meta={"baseline_mean_margin": base_margin})


# ---------------------------------------------------------------------------------------------
# Compressed sensing
# ---------------------------------------------------------------------------------------------
@profiling.timed
def compressed_screen(lm, task, n_evaluations: int | None = None, p: float | None = None,
                      mode: str | Ablation = "zero", means=None, seed: int = 0, enc: EncodedTask | None = None,
                      progress: bool = False, result_cache: bool | None = None) -> ApproxScreen:
    """Compressed-sensing screen (Bair et al. 2026): random knockouts, then a sparse regression.

    Each of ``n_evaluations`` evaluations ablates a random subset of heads (each head with probability
    ``p``); a cross-validated Lasso of the change in mean margin on the 0/1 knockout pattern estimates each
    head's effect with fewer evaluations than heads.
    """
    from sklearn.linear_model import LassoCV

    enc = enc if enc is not None else encode_task(lm, task)
    ablation = Ablation.of(mode, means).resolved(lm, enc.inputs)
    heads = all_heads(lm)
    N = len(heads)
    n_evaluations = n_evaluations or max(20, N // 2)
    p = p if p is not None else min(0.2, 4.0 / N ** 0.5)
    rng = np.random.default_rng(seed)
    X = (rng.random((n_evaluations, N)) < p)
    X[X.sum(1) == 0, rng.integers(0, N)] = True
    sets = [[heads[j] for j in np.flatnonzero(x)] for x in X]
    t0 = time.perf_counter()
    res = evaluate_head_sets(lm, enc, [[]] + sets, mode=ablation, progress=progress,
                             desc="compressed-sensing knockouts", result_cache=result_cache)
    y = res.mean_margin[1:] - res.mean_margin[0]
    model = LassoCV(cv=LASSO_CV, alphas=LASSO_N_ALPHAS, random_state=seed, max_iter=LASSO_MAX_ITER)
    model.fit(X.astype(float), y)
    secs = time.perf_counter() - t0
    return ApproxScreen(heads=heads, estimate=model.coef_, method="compressed", seconds=secs,
                        forward_equivalents=forward_equivalents(lm.n_layers, sets), n_evaluations=n_evaluations,
                        meta={"p": p, "alpha": float(model.alpha_), "intercept": float(model.intercept_)})


# ---------------------------------------------------------------------------------------------
# Agreement with the exact screen, and the benchmark
# ---------------------------------------------------------------------------------------------
def compare_to_exact(exact: Screen, approx: ApproxScreen, k: int = 10) -> dict:
    """Agreement of an approximate screen with the exact one on the change in mean margin (``spearman`` is NaN,
    and ``constant_estimate`` True, when the approximate screen gives every head the same estimate)."""
    from scipy.stats import spearmanr

    tab = exact.table.set_index("head")
    est = pd.Series(approx.estimate, index=[head_name(h) for h in approx.heads]).loc[tab.index]
    true = tab["delta_margin"]
    top_true, top_est = set(true.nlargest(k).index), set(est.nlargest(k).index)
    bot_true, bot_est = set(true.nsmallest(k).index), set(est.nsmallest(k).index)
    constant = bool(np.all(est.to_numpy() == est.to_numpy()[0]))  # e.g. a Lasso that shrank every head to 0
    return {"method": approx.method,
            "spearman": float("nan") if constant else float(spearmanr(true, est).statistic),
            "constant_estimate": constant,
            f"recall_top{k}_improvers": len(top_true & top_est) / k,
            f"recall_top{k}_harmful": len(bot_true & bot_est) / k,
            "seconds": approx.seconds, "forward_equivalents": approx.forward_equivalents,
            "exact_seconds": exact.seconds, "exact_forward_equivalents": exact.forward_equivalents,
            "n_evaluations": approx.n_evaluations}


def spread_heads(lm, n: int) -> list[Head]:
    """``n`` heads evenly spread over depth (every k-th head), so that timing them represents a full screen."""
    heads = all_heads(lm)
    return heads[:: max(1, len(heads) // n)][:n]


def benchmark(lm, task, n_plain_heads: int = 6, compressed_evals: int = 60, approx: bool = True,
              exact_from_cache: bool = True, k: int = 10, reference: Screen | None = None) -> dict:
    """Time the plain loop and the exact engine on the same ``n_plain_heads`` heads (engine uncached), check
    they agree, and compare both approximate screens with a full exact screen.

    Returns ``{"speed": {...}, "agreement": [{...} per method, exact included]}``. ``reference``: the exact screen
    to compare with (e.g. the verdict's own ranking screen, read back from the result cache); else a float32
    screen, which may come from the result cache when ``exact_from_cache`` (its ``seconds`` is then the time it
    took when computed).
    """
    enc = encode_task(lm, task)
    spread = spread_heads(lm, n_plain_heads)
    screen(lm, task, heads=spread[:1], enc=enc, progress=False, result_cache=False)  # warm-up, not timed
    t0 = time.perf_counter()
    evaluate(lm, enc, result_cache=False)
    t_clean = time.perf_counter() - t0
    e = screen(lm, task, heads=spread, enc=enc, progress=False, result_cache=False)
    p = plain_screen(lm, task, heads=spread, enc=enc, progress=False)
    frac = float(np.mean([(lm.n_layers - l) / lm.n_layers for l, _ in spread]))
    speed = {"model": lm.name, "task": task.name, "items": len(task), "plain sequences": len(enc.full),
             "engine inputs": len(enc.inputs), "shared prefix tokens": len(common_prefix(enc)),
             "heads timed": len(spread), "plain s/head": p.seconds / len(spread),
             "engine s/head": e.seconds / len(spread), "ratio": p.seconds / e.seconds,
             "bound s/head": t_clean * frac,
             "max margin diff": float(np.abs(e.results.margin - p.results.margin).max()),
             "accuracy identical": bool(np.array_equal(e.results.correct, p.results.correct))}
    agreement = []
    if approx:
        ex = reference if reference is not None else screen(lm, task, enc=enc, progress=False,
                                                             result_cache=None if exact_from_cache else False)
        for ap in (gradient_screen(lm, task, enc=enc),
                   compressed_screen(lm, task, enc=enc, n_evaluations=compressed_evals or None, seed=0,
                                     result_cache=False)):
            row = compare_to_exact(ex, ap, k=k)
            row.update(model=lm.name, task=task.name, heads=len(ex.heads), cheaper_by=ex.seconds / ap.seconds,
                       cheaper_by_forward_equivalents=row["exact_forward_equivalents"] / ap.forward_equivalents)
            agreement.append(row)
        agreement.append({"model": lm.name, "task": task.name, "method": "exact", "spearman": 1.0,
                          f"recall_top{k}_improvers": 1.0, f"recall_top{k}_harmful": 1.0, "seconds": ex.seconds,
                          "forward_equivalents": ex.forward_equivalents, "heads": len(ex.heads),
                          "n_evaluations": len(ex.heads), "cheaper_by": 1.0, "cheaper_by_forward_equivalents": 1.0,
                          "from_cache": bool(ex.meta.get("from_cache"))})
    return {"speed": speed, "agreement": agreement}


def dtype_agreement(lm, task, heads, dtype: str = "bfloat16", k: int = 10) -> dict:
    """The same single-head screen of ``heads`` in float32 and in ``dtype`` (:func:`cel_utils.models.cast`), side
    by side in one process with the result cache off: the wall-time ratio, the Spearman correlation of the per-head
    changes in mean margin, the overlap of the top ``k`` heads by it, and the unablated accuracy in each dtype."""
    from scipy.stats import spearmanr

    from .models import cast

    out = {"model": lm.name, "task": task.name, "items": len(task), "heads": len(heads)}
    tabs = {}
    for name in ("float32", dtype):
        m = cast(lm, name)
        screen(m, task, heads=heads[:1], progress=False, result_cache=False)  # warm-up, not timed
        sc = screen(m, task, heads=heads, progress=False, result_cache=False)
        out[f"{name} s"], out[f"{name} accuracy"] = sc.seconds, float(sc.baseline.accuracy[0])
        tabs[name] = sc.table.set_index("head")["delta_margin"]
    a, b = tabs["float32"], tabs[dtype].loc[tabs["float32"].index]
    out.update(ratio=out["float32 s"] / out[f"{dtype} s"], spearman=float(spearmanr(a, b).statistic),
               top_overlap=len(set(a.nlargest(k).index) & set(b.nlargest(k).index)), top_k=k)
    return out
