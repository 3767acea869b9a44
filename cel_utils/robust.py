"""Is it a capability? The measurements a skeptical reviewer makes on a head set whose removal helps (chapter 1c,
``cel robust``): :mod:`cel_utils.battery` runs them together on the same items and :mod:`cel_utils.labels`
reads them into checks and a label.

A verdict speaks for one prompt format, one way of scoring (teacher forcing) and one ablation (zero). The
battery asks each in turn, on items that took no part in choosing the heads:

* :func:`format_changes`: the change in every meaning-preserving prompt format of :mod:`cel_utils.formats`, with
  every item's margins;
* :func:`generation`: free greedy decoding with the heads removed (exact-match tasks): the answer is the
  generated text up to the task's stop; for addition the fixes split into *content* and *termination*;
* :func:`ablation_types`: zero, mean (means from the search split), resample (the head's output on another item
  of the same length) and the best constant (fit on the search split);
* :func:`text_nll`, :func:`other_tasks`: the cost on general English text and on the model's other tasks.

Example:
    >>> answer_of(" 79\\n12 + 4")
    '79'
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import cache, hooks, profiling
from .ablation import Ablation, Head, ablate_heads, compute_head_means
from .approximate import backprop_mean_margin
from .compare import compare_sets
from .defaults import ALPHA, N_BOOT, TEXT_TOKENS
from .engine import evaluate
from .formats import formats_of, in_format
from .models import cast
from .scoring import encode_task, split_prompt
from .stats import fixes_breaks, holm, mcnemar_exact, paired_bootstrap
from .tasks import Task, load_task

# ------------------------------------------------------------------------------------------------------------
# Formats
# ------------------------------------------------------------------------------------------------------------
@profiling.timed
def format_changes(lm, task: Task, sets: dict[str, Sequence[Head]], n_boot: int = N_BOOT, seed: int = 0
                   ) -> tuple[pd.DataFrame, dict]:
    """Every format of ``task``'s :data:`~cel_utils.formats.FORMATS` (the default first): per named head set its
    baseline accuracy, change and paired-bootstrap CI (``format``, ``set``, ``n``, ``baseline``, ``delta``,
    ``ci_low``, ``ci_high``, ``delta_margin``), and the per-item margins behind them: ``{set: {format: (unablated
    [n], ablated [n])}}``."""
    rows, margins = [], {k: {} for k in sets}
    for fmt in formats_of(task.name):
        cmp = compare_sets(lm, in_format(task, fmt.name), sets, n_boot=n_boot, seed=seed)
        for j, name in enumerate(cmp.names):
            r = cmp.table.iloc[j]
            rows.append({"format": fmt.name, "set": name, "n": int(r.n_items), "baseline": float(r.baseline_accuracy),
                         "delta": float(r.delta_accuracy), "ci_low": float(r.ci_low), "ci_high": float(r.ci_high),
                         "delta_margin": float(r.delta_margin)})
            margins[name][fmt.name] = (cmp.baseline.margin[0], cmp.results.margin[j])
    return pd.DataFrame(rows), margins


# ------------------------------------------------------------------------------------------------------------
# Free generation
# ------------------------------------------------------------------------------------------------------------
ANSWER = re.compile(r"[A-Za-z0-9]+(?: [A-Za-z0-9]+)*")


def answer_of(text: str) -> str:
    """The answer in a generated text: after leading whitespace, the longest run of words and numbers (single
    spaces inside, for answers like "Buenos Aires"); it ends where the task's stop is (a newline, a sign).

    Example:
        >>> answer_of(" 79\\n12 + 4"), answer_of(" 790"), answer_of(" Buenos Aires.")
        ('79', '790', 'Buenos Aires')
    """
    m = ANSWER.match(text.lstrip())
    return m.group(0) if m else ""


@torch.no_grad()
def greedy(lm, prompts: Sequence[str], max_new: int, heads: Sequence[Head] = (), batch_size: int = 16) -> list[str]:
    """Greedy continuations of ``prompts`` (``max_new`` tokens each) with ``heads`` removed (zero), decoded.
    Batched with left padding and the model's KV cache (``generate``)."""
    tok = lm.tokenizer
    out = []
    with ablate_heads(lm, list(heads)):
        for b in range(0, len(prompts), batch_size):
            ids = [tok(p)["input_ids"] for p in prompts[b:b + batch_size]]
            T = max(len(x) for x in ids)
            pad = hooks.pad_id(lm)
            inp = torch.tensor([[pad] * (T - len(x)) + x for x in ids], device=lm.device)
            att = torch.tensor([[0] * (T - len(x)) + [1] * len(x) for x in ids], device=lm.device)
            gen = lm.model.generate(input_ids=inp, attention_mask=att, max_new_tokens=max_new, do_sample=False,
                                    pad_token_id=pad, eos_token_id=None, top_p=None, top_k=None, temperature=None)
            out += tok.batch_decode(gen[:, T:], skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return out


@profiling.timed
def generation(lm, task: Task, sets: dict[str, Sequence[Head]], n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Free greedy generation on an exact-match task, unablated and with each named set removed: accuracy (the
    answer, :func:`answer_of`, equals the target), the change with a paired-bootstrap CI and exact McNemar p,
    the per-item agreement with the teacher-forced score, and the texts (each prompt replayable: the part every
    prompt shares, ``prefix``, once, and each item's own ``prompt`` after it); ``right``: per set (and ``""``, the
    unablated model) whether each item was answered right ``[n]``. ``{}`` for a multiple-choice task."""
    import os

    if task.kind != "em":
        return {}
    ctx = [split_prompt(it["prompt"], it["target"])[0] for it in task.items]
    prefix = os.path.commonprefix(ctx)
    prefix = prefix[:prefix.rfind("\n") + 1]   # whole lines: the shared demonstrations
    targets = [it["target"].strip() for it in task.items]
    max_new = max(len(lm.tokenizer(" " + t, add_special_tokens=False)["input_ids"]) for t in targets) + 2
    texts = {name: greedy(lm, ctx, max_new, heads) for name, heads in {"": [], **sets}.items()}
    right = {k: np.array([answer_of(t) == y for t, y in zip(v, targets)]) for k, v in texts.items()}
    enc = encode_task(lm, task)
    tf = {k: evaluate(lm, enc, list(h)).correct[0] for k, h in {"": [], **sets}.items()}
    out = {"baseline_accuracy": float(right[""].mean()), "teacher_forced_baseline": float(tf[""].mean()),
           "prefix": prefix, "sets": {}, "right": right}
    for name in sets:
        f, b = fixes_breaks(right[""], right[name][None])
        bs = paired_bootstrap(right[""].astype(float), right[name].astype(float), n_boot=n_boot, seed=seed)
        out["sets"][name] = {
            "ablated_accuracy": float(right[name].mean()), "delta": bs["delta"], "ci_low": bs["ci_low"],
            "ci_high": bs["ci_high"], "fixes": int(f[0]), "breaks": int(b[0]), "p_value": float(mcnemar_exact(f, b)[0]),
            "agreement_with_teacher_forced": float(np.mean(right[name] == tf[name])),
            "teacher_forced_delta": float(tf[name].mean() - tf[""].mean()),
            "fixes_by_kind": fixes_by_kind(texts[""], texts[name], targets) if task.name == "addition" else None,
            "items": [{"prompt": p[len(prefix):], "target": y, "baseline_text": t0, "ablated_text": t1}
                      for p, y, t0, t1 in zip(ctx, targets, texts[""], texts[name])]}
    out["agreement_with_teacher_forced"] = float(np.mean(right[""] == tf[""]))
    return out


def fixes_by_kind(before: Sequence[str], after: Sequence[str], targets: Sequence[str]) -> dict:
    """Addition's fixes (wrong -> right in free generation) by kind: ``termination`` when the digits written
    before were already the target's (the number ran on or stopped early), ``content`` otherwise.

    Example:
        >>> fixes_by_kind([" 790", " 78", " 7\\n"], [" 79", " 79", " 79"], ["79", "79", "79"])
        {'content': 1, 'termination': 2}
    """
    out = {"content": 0, "termination": 0}
    for t0, t1, y in zip(before, after, targets):
        a0, a1 = answer_of(t0), answer_of(t1)
        if a0 == y or a1 != y:
            continue
        out["termination" if (a0.startswith(y) or (a0 and y.startswith(a0))) else "content"] += 1
    return out


# ------------------------------------------------------------------------------------------------------------
# Ablation types
# ------------------------------------------------------------------------------------------------------------
@profiling.timed
def best_constant(lm, search_enc, heads: Sequence[Head], means: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The constant outputs of ``heads`` that raise the mean margin on the search items most (``[n_layers,
    n_heads, d_head]``, the other heads' rows are their means): from the means, ``steps`` rounds of a gradient step
    (:func:`cel_utils.approximate.backprop_mean_margin`) with a line search over four step sizes, each candidate
    scored exactly by the engine. Fit on the search split only."""
    C = means.clone()
    enc = search_enc
    score = lambda c: float(evaluate(lm, enc, list(heads), mode=Ablation("constant", c)).mean_margin[0])  # noqa: E731
    best = score(C)
    unit = float(np.mean([C[l, h].norm() for l, h in heads])) or 1.0
    for _ in range(steps):
        params = {(l, h): C[l, h].clone().requires_grad_(True) for l, h in heads}

        def fn_for(l):
            def fn(z):
                z = z.clone()
                for (ll, h), p in params.items():
                    if ll == l:
                        z[:, :, h] = p.to(z.dtype)
                return z
            return fn

        backprop_mean_margin(lm, enc, [("z", l, fn_for(l)) for l in sorted({l for l, _ in heads})])
        g = torch.stack([params[k].grad for k in heads])  # [k, d_head]
        if not torch.isfinite(g).all() or float(g.norm()) == 0:
            break
        direction = g / g.norm()
        tried = []
        for t in (0.25, 0.5, 1.0, 2.0):
            cand = C.clone()
            for j, (l, h) in enumerate(heads):
                cand[l, h] = C[l, h] + t * unit * direction[j]
            tried.append((score(cand), cand))
        s, cand = max(tried, key=lambda x: x[0])
        if s <= best:
            break
        best, C = s, cand
    return C


@profiling.timed
def ablation_types(lm, task: Task, search: Task, heads: Sequence[Head], n_boot: int = N_BOOT, seed: int = 0,
                   constant_steps: int = 5, means: torch.Tensor | None = None, fit_dtype: str = "float32") -> dict:
    """The held-out change in accuracy when ``heads`` are removed four ways, each with a paired-bootstrap CI:
    ``zero``, ``mean`` (means over the search prompts, or ``means`` when given: ``[n_layers, n_heads, d_head]``
    computed there), ``resample`` (another item's output) and ``constant`` (the best constant, fit on the search
    split, in ``fit_dtype``: a choice, like a ranking screen; ``constant_steps=0`` skips it); ``margins``: each
    kind's per-item ablated margins ``[n]``, every one evaluated in the model's own dtype."""
    enc, search_enc = encode_task(lm, task), encode_task(lm, search)
    means = compute_head_means(lm, search_enc.inputs) if means is None else means
    base = evaluate(lm, enc)
    results = {"zero": evaluate(lm, enc, list(heads)),
               "mean": evaluate(lm, enc, list(heads), mode=Ablation("mean", means)),
               "resample": evaluate(lm, enc, list(heads), mode=Ablation("resample", means, seed=seed))}
    if constant_steps > 0:
        fitted = best_constant(cast(lm, fit_dtype), search_enc, heads, means, constant_steps).float()
        results["constant"] = evaluate(lm, enc, list(heads), mode=Ablation("constant", fitted))
    out = {}
    for k, r in results.items():
        bs = paired_bootstrap(base.correct[0].astype(float), r.correct[0].astype(float), n_boot=n_boot, seed=seed)
        out[k] = {"delta": bs["delta"], "ci_low": bs["ci_low"], "ci_high": bs["ci_high"],
                  "delta_margin": float(r.mean_margin[0] - base.mean_margin[0]), "margins": r.margin[0]}
    return out


# ------------------------------------------------------------------------------------------------------------
# Collateral
# ------------------------------------------------------------------------------------------------------------
def english_text() -> tuple[str, str]:
    """General English prose available offline: the explanatory paragraphs of the Python reference
    documentation shipped with CPython (``pydoc_data.topics``), without its indented code and grammar lines
    (so the text is prose, not code). Returns (text, a description of the source)."""
    import pydoc_data.topics as topics

    keep = []
    for name in sorted(topics.topics):
        for para in topics.topics[name].split("\n\n"):
            lines = para.splitlines()
            if lines and not any(l.startswith((" ", "\t", "*", "=", "-")) or "::=" in l or ">>>" in l for l in lines):
                text = " ".join(l.strip() for l in lines)
                if len(text.split()) >= 12 and text[-1:] in ".:)":
                    keep.append(text)
    return "\n\n".join(keep), "explanatory paragraphs of the Python reference documentation (pydoc_data.topics)"


def start_tokens(tok) -> list[int]:
    """The tokens ``tok`` puts before any text when it adds its special tokens (Gemma's ``<bos>``; none for
    SmolLM2): what every task prompt starts with, and so what the model expects at the start of a sequence."""
    plain = tok("a", add_special_tokens=False)["input_ids"]
    full = tok("a")["input_ids"]
    k = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), 0)
    return list(full[:k])


def text_nll_key(lm, chunks: list[list[int]], batch_size: int, heads: Sequence[Head], mode="zero") -> str:
    """The result-cache key (:func:`cel_utils.cache.key_of`) of one :func:`text_nll` pass: the token chunks, the
    batch size (padding) and the heads removed (the unablated pass is shared by every call on the same text, e.g.
    chapter 1c's several batteries of one model)."""
    ab = Ablation.of(mode)
    extra = {} if ab.mode == "zero" else {"ablation": ab.describe()}   # zero keeps the keys it always had
    return cache.key_of(lm, {"chunks": chunks, "batch_size": batch_size, "heads": sorted(map(list, heads)),
                             "method": "text_nll", "nll": "rows", **extra})


def _nll_rows(logits: torch.Tensor, x: torch.Tensor, att: torch.Tensor, n_pre: int) -> list[tuple[float, int]]:
    """(summed NLL, tokens scored) per row of a batch of chunks: every position predicts the next token, except
    the start tokens' (the chunk's first text token follows only them: not scored) and the padding."""
    rows, pos, vocab = logits[:, :-1].shape
    # one row per predicted token (the vocabulary last and contiguous): on Gemma's 262k-token vocabulary this is 7x
    # faster than the class-dimension-second form, and 10x closer to a float64 computation
    scored = att[:, 1:].clone()
    scored[:, :n_pre] = 0
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(rows * pos, vocab), x[:, 1:].reshape(-1),
                                            reduction="none").view(rows, pos) * scored  # [batch, pos]
    return [(float(nll[r].sum()), int(scored[r].sum())) for r in range(len(x))]


@torch.no_grad()
def chunk_nll(lm, chunks: list[list[int]], n_pre: int, head_sets: list[Sequence[Head]], batch_size: int = 4,
              mode="zero") -> list[np.ndarray]:
    """Per head set, ``[chunks, (summed NLL, tokens scored)]`` on token ``chunks`` (each starting with ``n_pre``
    start tokens) with the set removed (``mode``: how it is applied; the empty set is the intact model). Sets in
    the result cache are read back; for the others each batch runs once intact, keeping every layer's input, and
    each set from its first ablated layer up (the layers below it are the intact model's), as the engine does.

        >>> from cel_utils.tiny import tiny_model
        >>> lm = tiny_model("llama"); chunks = [[1, 5, 9, 4, 7], [1, 8, 3, 3]]
        >>> [r.shape for r in chunk_nll(lm, chunks, 1, [[], [(1, 2)]])]
        [(2, 2), (2, 2)]
    """
    keys = [text_nll_key(lm, chunks, batch_size, hs, mode if hs else "zero") for hs in head_sets]
    out = [(cache.load(k) or {}).get("per_chunk") if cache.enabled() else None for k in keys]
    todo = [j for j, r in enumerate(out) if r is None]
    rows = {j: [] for j in todo}
    for _, x, att in hooks.padded_batches(lm, chunks, batch_size) if todo else ():
        with hooks.capture_layer_inputs(lm) as captured:
            clean = _nll_rows(lm.model(input_ids=x, attention_mask=att, use_cache=False).logits, x, att, n_pre)
        for j in todo:
            hs = list(head_sets[j])
            if not hs:
                rows[j] += clean
                continue
            start = min(l for l, _ in hs)
            with ablate_heads(lm, hs, mode), hooks.skip_layers_below(lm, start, captured[start] if start else None):
                rows[j] += _nll_rows(lm.model(input_ids=x, attention_mask=att, use_cache=False).logits, x, att, n_pre)
    for j in todo:
        out[j] = np.array(rows[j])   # [chunks, (sum, count)]
        if cache.enabled():
            cache.store(keys[j], {"per_chunk": out[j]})
    return out


@torch.no_grad()
@profiling.timed
def text_nll(lm, sets: dict[str, Sequence[Head]], n_tokens: int = TEXT_TOKENS, chunk: int = 512, batch_size: int = 4,
             n_boot: int = N_BOOT, seed: int = 0, mode="zero") -> dict:
    """Next-token NLL per token (nats) on ``n_tokens`` tokens of :func:`english_text` (each predicted once, from
    chunks of ``chunk`` tokens that overlap by one): unablated, and the change with each named set removed, with a
    bootstrap CI over chunks (``per_chunk``: each chunk's change in NLL per token). ``mode``: how the sets are
    applied (zero, the default, removes; ``scale`` multiplies by alpha: above 1 it boosts)."""
    text, source = english_text()
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"][:n_tokens + 1]
    # chunks overlap by one token (each starts with the last token of the one before, which it does not score),
    # so every one of the n_tokens tokens after the first is predicted exactly once; each chunk starts with the
    # tokens the tokenizer puts before any text (Gemma's <bos>, as every task prompt has it): without it Gemma's
    # NLL on this text was 5.76 nats/token instead of 3.52, and removing its L5H3+L6H3 cost 2.63 instead of 0.07
    pre = start_tokens(lm.tokenizer)
    chunks = [pre + ids[i:i + chunk] for i in range(0, len(ids) - 1, chunk - 1)]
    chunks = [c for c in chunks if len(c) > len(pre) + 1]

    results = chunk_nll(lm, chunks, len(pre), [[], *sets.values()], batch_size, mode)
    base, per_set = results[0], dict(zip(sets, results[1:]))
    tokens = int(base[:, 1].sum())
    out = {"source": source, "text_tokens": tokens, "baseline_nll": float(base[:, 0].sum() / tokens), "sets": {}}
    for name in sets:
        abl = per_set[name]
        d = (abl[:, 0] - base[:, 0]) / base[:, 1]  # per-chunk change in NLL per token
        bs = paired_bootstrap(np.zeros(len(d)), d, n_boot=n_boot, seed=seed) if len(d) > 1 else \
            {"ci_low": float("nan"), "ci_high": float("nan")}   # one chunk: no interval over chunks
        out["sets"][name] = {"text_nll_delta": float((abl[:, 0].sum() - base[:, 0].sum()) / tokens),
                             "ci_low": bs["ci_low"], "ci_high": bs["ci_high"], "per_chunk": d}
    return out


@profiling.timed
def other_tasks(lm, sets: dict[str, Sequence[Head]], tasks: Sequence[str], n: int = 100, seed: int = 0,
                n_boot: int = N_BOOT, mode="zero") -> pd.DataFrame:
    """Each named set removed while the model does other tasks (their held-out items): change in accuracy with a
    paired-bootstrap CI, exact McNemar p and Holm over the tasks (per set): ``set``, ``task``, ``delta``,
    ``ci_low``, ``ci_high``, ``p_value``, ``p_holm``, ``hurts`` (a significant loss)."""
    rows = []
    for t in tasks:
        cmp = compare_sets(lm, load_task(t, "heldout", n=n, seed=seed, clip=True), sets, mode=mode, n_boot=n_boot,
                           seed=seed)
        f, b = fixes_breaks(cmp.baseline.correct[0], cmp.results.correct)
        for j, name in enumerate(cmp.names):
            r = cmp.table.iloc[j]
            rows.append({"set": name, "task": t, "delta": float(r.delta_accuracy), "ci_low": float(r.ci_low),
                         "ci_high": float(r.ci_high), "p_value": float(mcnemar_exact(f[j], b[j])[0])})
    tab = pd.DataFrame(rows, columns=["set", "task", "delta", "ci_low", "ci_high", "p_value"])
    tab["p_holm"] = np.nan
    for name, g in tab.groupby("set"):
        tab.loc[g.index, "p_holm"] = holm(g["p_value"].to_numpy())
    tab["hurts"] = (tab["p_holm"] < ALPHA) & (tab["delta"] < 0)
    return tab
