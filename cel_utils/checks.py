"""Checks for the "implement it yourself" exercises: your function against the library's, on tiny inputs.

Each ``check_*`` runs your function and the library's on the same inputs and prints one line saying what
passed, or raises ``AssertionError`` naming the input that differed, by how much, and (when it recognises
it) the likely mistake.

* :func:`check_ablation` -- remove heads at the input of the attention output projection
  (against :func:`cel_utils.ablation.ablate_heads`), on three tiny random models built here, offline.
* :func:`check_screen` -- the screen loop: each head removed alone, the change in accuracy and mean margin
  (against :func:`cel_utils.screening.plain_screen`).
* :func:`check_mcnemar` -- fixes, breaks and the two-sided exact McNemar p-value
  (against :func:`cel_utils.stats.fixes_breaks` and :func:`cel_utils.stats.mcnemar_exact`).
* :func:`check_delta_accuracy` -- one head set's change in accuracy, by hand (against
  :func:`cel_utils.engine.evaluate_head_sets`).
* :func:`check_rates` -- chapter 3's linearised rates (against :func:`cel_utils.dynamics.rates`).

Example:
    >>> from cel_utils.checks import check_mcnemar
    >>> from cel_utils.stats import fixes_breaks, mcnemar_exact
    >>> check_mcnemar(lambda base, ablated: mcnemar_exact(*fixes_breaks(base, ablated))[0])
    check_mcnemar passed: 9 cases (0 to 20 fixes, 0 to 9 breaks), largest difference 0
"""

from __future__ import annotations

import random
import string
from contextlib import contextmanager
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from . import hooks
from .ablation import Head, ablate_heads, all_heads, format_heads, head_name, parse_heads
from .dynamics import rates
from .engine import evaluate_head_sets
from .screening import plain_screen
from .scoring import encode_task, plain_evaluate
from .stats import fixes_breaks, mcnemar_exact
from .tasks import Task
from .theory import DEFAULT, WEAK_CONFLICT, Setup
from .tiny import tiny_model

# The tiny models: each catches a different mistake in a head ablation. llama: grouped key/value heads (4 query
# heads share 2 key/value heads); gemma3: head_dim 16 while hidden_size / heads = 12; gpt_neox: the output
# projection has a bias.
CHECK_FAMILIES = ("llama", "gemma3", "gpt_neox")


def tiny_lm(family: str = "llama", seed: int = 0):
    """A tiny random model of ``family`` for the checks (:func:`cel_utils.tiny.tiny_model` with a random output
    bias, so that a bias mistake shows). Built anew on every call: a check's mistake, such as a hook left
    attached, cannot leak into the next check."""
    return tiny_model(family, seed=seed, bias_noise=True)


@contextmanager
def _one_thread(on: bool):
    """Tiny models run fastest on one thread (and far faster than on several when the cores are shared)."""
    before = torch.get_num_threads()
    if on:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _describe(lm) -> str:
    return f"{lm.name} ({lm.n_layers} layers x {lm.n_heads} heads, head_dim {lm.head_dim})"


def _logits(out) -> torch.Tensor:
    out = getattr(out, "logits", out)
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"your function returned {type(out).__name__}; return the logits tensor "
                             "[batch, pos, vocab] (or the model's output, which has .logits)")
    return out.detach().float()


def _plain(lm, ids, heads=()) -> torch.Tensor:
    with torch.no_grad(), ablate_heads(lm, list(heads)):
        return lm.model(input_ids=ids, use_cache=False).logits.float()


def _ablation_cases(lm) -> list[list[Head]]:
    L, H = lm.n_layers, lm.n_heads
    cases = [[(0, 0)], [(L // 2, 1 % H)], [(L - 1, H - 1)], [(0, H - 1), (0, 1 % H)], [(0, 1 % H), (L - 1, 0)]]
    return [c for i, c in enumerate(cases) if c not in cases[:i]]


def check_ablation(fn: Callable, lm=None) -> None:
    """Check ``fn(lm, input_ids, heads) -> logits``: run ``lm.model`` on ``input_ids [batch, pos]`` with the
    heads in ``heads`` (a list of ``(layer, head)``) zeroed at the input of each layer's attention output
    projection (``lm.out_proj(layer)``), and return the logits ``[batch, pos, vocab]``; the model must be left
    as it was. Compared with :func:`cel_utils.ablation.ablate_heads` on single heads and pairs.

    ``lm=None`` checks on three tiny random models, each with a trap: grouped key/value heads (llama),
    ``head_dim`` different from ``hidden_size / n_heads`` (gemma3), a bias on the output projection (gpt_neox).
    Pass your own ``lm`` to check on it instead.

    Example:
        >>> check_ablation(my_ablate)              # doctest: +SKIP
        check_ablation passed: 15 head sets on tiny-llama, tiny-gemma3, tiny-gpt_neox, ...
    """
    with _one_thread(lm is None):
        _check_ablation(fn, [lm] if lm is not None else [tiny_lm(f) for f in CHECK_FAMILIES])


def _check_ablation(fn: Callable, lms: list) -> None:
    worst, n = 0.0, 0
    for m in lms:
        gen = torch.Generator().manual_seed(0)
        vocab = m.model.get_input_embeddings().weight.shape[0]
        ids = torch.randint(2, min(vocab, 100), (2, 9), generator=gen)
        base = _plain(m, ids)
        for heads in _ablation_cases(m):
            with torch.no_grad():
                got = _logits(fn(m, ids.clone(), list(heads)))
            ref = _plain(m, ids, heads)
            where = f"ablating {format_heads(heads)} on {_describe(m)}"
            if got.shape != ref.shape:
                raise AssertionError(f"{where}: your logits have shape {tuple(got.shape)}, expected "
                                     f"{tuple(ref.shape)} [batch, pos, vocab]")
            diff = (got - ref).abs()
            tol = 1e-4 * max(1.0, float(ref.abs().max()))
            if float(diff.max()) > tol:
                b, t, _ = np.unravel_index(int(diff.argmax()), diff.shape)
                raise AssertionError(f"{where}: your logits differ from cel_utils.ablation.ablate_heads by up to "
                                     f"{float(diff.max()):.4g} (batch row {b}, position {t}); the ablation itself "
                                     f"moves them by {float((ref - base).abs().max()):.4g}. "
                                     + _ablation_hint(m, ids, heads, got, base, tol))
            after = _plain(m, ids)
            if not torch.equal(after, base):
                raise AssertionError(f"after {where}, the model's unablated output changed by "
                                     f"{float((after - base).abs().max()):.4g}: remove your hooks (try/finally) and "
                                     "restore any weight you edited")
            worst, n = max(worst, float(diff.max())), n + 1
    print(f"check_ablation passed: {n} head sets on {', '.join(m.name for m in lms)}, "
          f"largest difference {worst:.2g}")


def _run_variant(lm, ids, slices: dict, bias_count: dict | None = None) -> torch.Tensor:
    """Logits with ``slices[layer]`` (a list of ``(start, stop)``) of the o_proj input zeroed and, for
    ``bias_count[layer] = k``, ``k`` times the o_proj bias subtracted from its output (a wrong ablation)."""
    def zero_spans(spans):
        def fn(z):  # [batch, pos, head, d_head], zeroed as the flat o_proj input [batch, pos, head * d_head]
            x = z.reshape(*z.shape[:2], -1).clone()
            for a, b in spans:
                x[..., a:b] = 0
            return x.view(z.shape)
        return fn

    def minus_bias(layer, k):
        return lambda out: out - k * lm.out_proj(layer).bias

    points = [("z", layer, zero_spans(spans)) for layer, spans in slices.items()]
    points += [("proj_out", layer, minus_bias(layer, k)) for layer, k in (bias_count or {}).items()]
    with torch.no_grad(), hooks.hooked(lm, points):
        return lm.model(input_ids=ids, use_cache=False).logits.float()


def _ablation_hint(lm, ids, heads, got, base, tol) -> str:
    """The likely mistake, when the learner's logits match a recognisable wrong ablation."""
    close = lambda ref: ref.shape == got.shape and float((got - ref).abs().max()) <= tol  # noqa: E731
    D, H = lm.head_dim, lm.n_heads
    by_layer: dict = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)
    if close(base):
        return ("They equal the unablated model's: nothing was removed (is the hook on lm.out_proj(layer), and "
                "does it return the modified input?).")
    for other in all_heads(lm):
        if [other] != list(heads) and close(_plain(lm, ids, [other])):
            return (f"They match removing {head_name(other)} instead: check which layer you hook and the slice "
                    f"[h * head_dim:(h + 1) * head_dim] of that layer's o_proj input.")
    hidden = lm.model.get_input_embeddings().weight.shape[1]
    if hidden // H != D:
        d = hidden // H
        if close(_run_variant(lm, ids, {l: [(h * d, (h + 1) * d) for h in hs] for l, hs in by_layer.items()})):
            return (f"They match a slice of width hidden_size / n_heads = {d}: a head's output here is "
                    f"lm.head_dim = {D} wide.")
    if lm.n_kv_heads != H:
        g = H // lm.n_kv_heads
        group = [(l, j) for l, h in heads for j in range(H) if j // g == h // g]
        if close(_plain(lm, ids, group)):
            return (f"They match removing every query head that shares the key/value head ({format_heads(group)}): "
                    f"{H} query heads share {lm.n_kv_heads} key/value heads here; zero only the query head's slice "
                    "of the o_proj input.")
    if getattr(lm.out_proj(0), "bias", None) is not None:
        spans = {l: [(h * D, (h + 1) * D) for h in hs] for l, hs in by_layer.items()}
        if close(_run_variant(lm, ids, spans, {l: len(hs) for l, hs in by_layer.items()})):
            return ("They match subtracting the head's term *and the bias* after the output projection: the bias "
                    "belongs to no head; zero the head's slice of the projection's input, so the bias stays.")
    return (f"Zero the slice [h * head_dim:(h + 1) * head_dim] (head_dim = {D}) of the input of "
            "lm.out_proj(layer), which is [batch, pos, n_heads * head_dim], for each (layer, h) in heads.")


def _check_task(lm, n_items: int = 12, seed: int = 0) -> Task:
    """Two-choice items (' a' or ' b' after a random lowercase prompt ending in ':')."""
    rng = random.Random(seed)
    items = []
    for i in range(n_items):
        prompt = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 8))) + ":"
        items.append({"prompt": prompt, "choices": [" a", " b"], "answer": i % 2})
    return Task(name="check", kind="mc", items=items)


def check_screen(fn: Callable, lm=None, task=None) -> None:
    """Check ``fn(lm, task, heads)``, a screen: remove each head of ``heads`` *alone* and return, one row per head
    in the given order, its change in accuracy and in mean margin against the unablated model (ablated minus
    unablated): a DataFrame (or dict of lists) with columns ``delta_accuracy`` and ``delta_margin``; a ``head``
    column (``"L1H2"`` or ``(1, 2)``), if present, must follow ``heads``. Compared with
    :func:`cel_utils.screening.plain_screen` on a tiny random Llama and 12 two-choice items (or on ``lm`` and
    ``task``).

    Example:
        >>> check_screen(my_screen)                # doctest: +SKIP
        check_screen passed: 5 heads on tiny-llama, 12 items, ...
    """
    with _one_thread(lm is None):
        lm = lm if lm is not None else tiny_lm("llama")
        _check_screen(fn, lm, task if task is not None else _check_task(lm))


def check_delta_accuracy(fn: Callable, lm=None, task=None) -> None:
    """Check ``fn(lm, enc, heads) -> float``: the accuracy on the encoded items ``enc`` with ``heads`` removed
    together, minus the accuracy of the intact model (as a fraction: 0.25 is 25 points). Compared with the exact
    engine (:func:`cel_utils.engine.evaluate_head_sets`, a different code path from the plain loop) on a tiny
    random Llama and 12 two-choice items (or on ``lm`` and ``task``), for no head, one head and two heads.

    Example:
        >>> check_delta_accuracy(my_delta_accuracy)     # doctest: +SKIP
        check_delta_accuracy passed: 2 head sets on tiny-llama, 12 items
    """
    with _one_thread(lm is None):
        lm = lm if lm is not None else tiny_lm("llama")
        task = task if task is not None else _check_task(lm)
        enc = encode_task(lm, task)
        sets = [[], [(1, 2)], [(0, 0), (lm.n_layers - 1, lm.n_heads - 1)]]
        ref = evaluate_head_sets(lm, enc, sets, progress=False, result_cache=False).accuracy   # [sets]
        for heads, acc in zip(sets[1:], ref[1:]):
            want = float(acc - ref[0])
            got = float(fn(lm, enc, list(heads)))
            if abs(got - want) > 1e-9:
                hint = (" That is the intact accuracy minus the ablated one: the change is ablated minus intact."
                        if abs(got + want) < 1e-9 and want else
                        " Ablated accuracy is the share of items answered right with the heads removed.")
                raise AssertionError(f"removing {format_heads(heads)} on {_describe(lm)}, {enc.n_items} items: your "
                                     f"change is {got:+.4f}, the engine's {want:+.4f}.{hint}")
        print(f"check_delta_accuracy passed: {len(sets) - 1} head sets on {lm.name}, {enc.n_items} items")


def _check_screen(fn: Callable, lm, task) -> None:
    heads = [(1, 2), (0, 0), (lm.n_layers - 1, lm.n_heads - 1), (0, 1), (lm.n_layers - 1, 0)]
    heads = [h for i, h in enumerate(heads) if h not in heads[:i] and h[0] < lm.n_layers and h[1] < lm.n_heads]
    ref = plain_screen(lm, task, heads=heads, progress=False).table
    enc = encode_task(lm, task)
    before = plain_evaluate(lm, enc)
    out = fn(lm, task, list(heads))
    try:
        got = pd.DataFrame(out).reset_index(drop=True)
    except Exception as e:  # noqa: BLE001 (any shape the learner returned)
        raise AssertionError(f"return a DataFrame (or dict of lists), one row per head; got {type(out).__name__}: "
                             f"{e}") from e
    where = f"screening {format_heads(heads)} on {_describe(lm)}, {len(task.items)} items"
    missing = {"delta_accuracy", "delta_margin"} - set(got.columns)
    if missing:
        raise AssertionError(f"{where}: your result has no column {', '.join(sorted(missing))} "
                             f"(columns: {list(got.columns)})")
    if len(got) != len(heads):
        raise AssertionError(f"{where}: {len(got)} rows for {len(heads)} heads (one row per head, in order)")
    if "head" in got.columns:
        names = [format_heads(parse_heads([h])) if not isinstance(h, str) else h.upper() for h in got["head"]]
        if names != [head_name(h) for h in heads]:
            raise AssertionError(f"{where}: your rows are for heads {names}, expected {ref['head'].tolist()} "
                                 "(keep the order of `heads`)")
    worst = 0.0
    for col in ("delta_accuracy", "delta_margin"):
        d = np.abs(got[col].to_numpy(float) - ref[col].to_numpy(float))
        if float(d.max()) > 1e-4:
            i = int(d.argmax())
            raise AssertionError(f"{where}: {col} of {head_name(heads[i])} is {got[col].iloc[i]:.6g}, "
                                 f"cel_utils.screening.plain_screen gives {ref[col].iloc[i]:.6g} (off by "
                                 f"{float(d.max()):.3g}). " + _screen_hint(lm, enc, heads, got, ref, col, before))
        worst = max(worst, float(d.max()))
    after = plain_evaluate(lm, enc)
    if not np.array_equal(after.margin, before.margin):
        raise AssertionError(f"after {where}, the unablated model's margins changed: remove your hooks and "
                             "restore any weight you edited")
    print(f"check_screen passed: {len(heads)} heads on {lm.name}, {len(task.items)} items, "
          f"largest difference {worst:.2g}")


def _screen_hint(lm, enc, heads, got, ref, col, before) -> str:
    g = got[col].to_numpy(float)
    base = before.accuracy[0] if col == "delta_accuracy" else before.mean_margin[0]
    close = lambda x: np.allclose(g, x, atol=1e-4)  # noqa: E731
    if close(-ref[col].to_numpy(float)):
        return "Your numbers have the wrong sign: report ablated minus unablated."
    if close(ref[col].to_numpy(float) + base):
        return "Your numbers are the ablated values themselves: subtract the unablated model's."
    cum = [plain_evaluate(lm, enc, heads[:i + 1]) for i in range(len(heads))]
    cum = np.array([(r.accuracy[0] if col == "delta_accuracy" else r.mean_margin[0]) - base for r in cum])
    if close(cum):
        return ("They match removing the heads cumulatively (the first, then the first two, ...): remove each "
                "head alone, detaching the previous hook.")
    if col == "delta_margin":
        return ("The margin of an item is the answer's summed log-probability minus the best other choice's; "
                "average it over items.")
    return "An item is right when the answer's summed log-probability beats every other choice (a tie is wrong)."


def _items(fixes: int, breaks: int, both_right: int, both_wrong: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    base = [False] * fixes + [True] * breaks + [True] * both_right + [False] * both_wrong
    abl = [True] * fixes + [False] * breaks + [True] * both_right + [False] * both_wrong
    order = np.random.default_rng(seed).permutation(len(base))
    return np.array(base)[order], np.array(abl)[order]


_MCNEMAR_CASES = [(5, 0, 10, 5), (0, 5, 3, 12), (3, 3, 20, 4), (0, 0, 8, 8), (12, 2, 20, 6), (1, 9, 5, 5),
                  (7, 4, 30, 9), (20, 8, 0, 2), (1, 0, 0, 0)]


def check_mcnemar(fn: Callable) -> None:
    """Check ``fn(base, ablated) -> p``: ``base`` and ``ablated`` are per-item correctness (bool arrays, the
    same items without and with an ablation); return the two-sided exact McNemar p-value, a binomial test at 1/2
    of the fixes (wrong -> right) among the items that flip (1 when none flips). Compared with
    :func:`cel_utils.stats.mcnemar_exact` of :func:`cel_utils.stats.fixes_breaks`.

    Example:
        >>> check_mcnemar(lambda base, ablated: 0.5)
        Traceback (most recent call last):
        ...
        AssertionError: 5 fixes, 0 breaks, 15 unchanged items: your p-value is 0.5, the exact two-sided McNemar p-value is 0.0625 (off by 0.438). Count the fixes (wrong -> right) and breaks (right -> wrong) and test the fixes among fixes + breaks at 1/2 (scipy.stats.binomtest), two-sided.
    """
    worst = 0.0
    for i, (f, b, rr, ww) in enumerate(_MCNEMAR_CASES):
        base, abl = _items(f, b, rr, ww, seed=i)
        out = np.asarray(fn(base.copy(), abl.copy()), dtype=float).reshape(-1)
        if out.size != 1:
            raise AssertionError(f"return one p-value (a float); got {out.size} numbers")
        f_ref, b_ref = (int(x[0]) for x in fixes_breaks(base, abl))
        ref = float(mcnemar_exact(f_ref, b_ref)[0])
        d = abs(float(out[0]) - ref)
        if not d <= 1e-9:
            raise AssertionError(f"{f} fixes, {b} breaks, {rr + ww} unchanged items: your p-value is "
                                 f"{float(out[0]):.4g}, the exact two-sided McNemar p-value is {ref:.4g} (off by "
                                 f"{d:.3g}). " + _mcnemar_hint(float(out[0]), f, b, rr + ww))
        worst = max(worst, d)
    fs, bs = [c[0] for c in _MCNEMAR_CASES], [c[1] for c in _MCNEMAR_CASES]
    print(f"check_mcnemar passed: {len(_MCNEMAR_CASES)} cases ({min(fs)} to {max(fs)} fixes, {min(bs)} to {max(bs)} "
          f"breaks), largest difference {worst:.2g}")


def _mcnemar_hint(p: float, f: int, b: int, same: int) -> str:
    from scipy.stats import binom, binomtest, chi2

    n = f + b
    wrong = {}
    if n:
        wrong["one-sided (towards more fixes): make it two-sided"] = binomtest(f, n, 0.5, "greater").pvalue
        wrong["one-sided (towards more breaks): make it two-sided"] = binomtest(f, n, 0.5, "less").pvalue
        wrong["twice a one-sided tail without capping at 1"] = 2 * binom.sf(max(f, b) - 1, n, 0.5)
        wrong["the chi-square approximation: use the exact binomial test"] = chi2.sf((f - b) ** 2 / n, 1)
        wrong["the chi-square approximation with continuity correction: use the exact binomial test"] = \
            chi2.sf(max(abs(f - b) - 1, 0) ** 2 / n, 1)
        wrong["a test over all items: only the items that flip count (n = fixes + breaks)"] = \
            binomtest(f, n + same, 0.5).pvalue
    for what, q in wrong.items():
        if abs(p - q) <= 1e-9:
            return f"Yours looks like {what}."
    if p > 1:
        return "A p-value is at most 1."
    if n == 0:
        return "When no item flips there is no evidence either way: p = 1."
    return ("Count the fixes (wrong -> right) and breaks (right -> wrong) and test the fixes among fixes + breaks "
            "at 1/2 (scipy.stats.binomtest), two-sided.")


_RATE_SETUPS = [("the default set-up", DEFAULT), ("m = 5", Setup(m=5)), ("m = 30", Setup(m=30)),
                ("the weak conflict", WEAK_CONFLICT),
                ("the tasks swapped", Setup(rho_a=(0.8, 0, 0.9, 0), rho_b=(0, 0.4, -0.3, 0)))]


def check_rates(fn: Callable, setups: Sequence[tuple[str, Setup]] | None = None) -> None:
    """Check ``fn(setup, lr) -> dict`` of chapter 3's linearised rates against :func:`cel_utils.dynamics.rates`
    on five set-ups and two learning rates. Return any of its keys (``r`` is required): ``r``, ``mu``,
    ``lambda_1``, ``lambda_d``, ``lambda_2``, ``slope_escape``, ``slope_plateau``; only the keys you return are
    checked.

    Example:
        >>> from cel_utils.dynamics import rates
        >>> check_rates(lambda setup, lr: {"r": rates(setup, lr)["r"]})
        check_rates passed: r on 5 set-ups x 2 learning rates, largest relative difference 0
    """
    setups = list(setups) if setups is not None else _RATE_SETUPS
    worst, keys = 0.0, None
    for name, s in setups:
        for lr in (0.5, 0.1):
            got = fn(s, lr)
            ref = rates(s, lr)
            if not isinstance(got, dict) or "r" not in got:
                raise AssertionError(f"return a dict with at least 'r' (and any of {', '.join(ref)}); got {got!r}")
            unknown = set(got) - set(ref)
            if unknown:
                raise AssertionError(f"unknown keys {sorted(unknown)}: use the names of cel_utils.dynamics.rates "
                                     f"({', '.join(ref)})")
            keys = [k for k in ref if k in got]
            for k in keys:
                rel = abs(float(got[k]) - ref[k]) / max(abs(ref[k]), 1e-12)
                if not rel <= 1e-6:
                    raise AssertionError(f"{name} (m = {s.m}, rho_A = {s.rho_a}, rho_B = {s.rho_b}), lr = {lr}: "
                                         f"your {k} is {float(got[k]):.6g}, cel_utils.dynamics.rates gives "
                                         f"{ref[k]:.6g} (relative difference {rel:.2g}). "
                                         + _rates_hint(k, float(got[k]), s, lr, ref))
                worst = max(worst, rel)
    print(f"check_rates passed: {', '.join(keys)} on {len(setups)} set-ups x 2 learning rates, "
          f"largest relative difference {worst:.2g}")


def _rates_hint(k: str, v: float, s: Setup, lr: float, ref: dict) -> str:
    r, mu = ref["r"], ref["mu"]
    near = lambda x: abs(v - x) <= 1e-6 * max(abs(x), 1e-12)  # noqa: E731
    if k == "r":
        if near(r / 2):
            return ("Yours is half: the joint loss is the mean of the two tasks' squared errors, but each square's "
                    "derivative brings a factor 2, so r sums over the tasks.")
        if near(r * s.counts.sum() / len(s.counts)):
            return "Divide by the number of tokens N (every token gets 1/N of a uniform head's attention), " \
                   "not by the number of token types."
        return "r = sum over token types of n_i (rho_A,i + rho_B,i) / N, with n_i tokens of type i and N in all."
    if k in ("lambda_1", "lambda_d", "lambda_2"):
        x = {"lambda_1": lr * r, "lambda_d": lr * r, "lambda_2": lr * mu}[k]
        if near(x):
            return f"That is the first-order value: the per-step factor is 1 +- lr x, so {k} is a log of it " \
                   "(log1p), not lr x."
    if k == "mu":
        return "mu is the gradient of a uniformly attending head at the plateau (cel_utils.dynamics.plateau)."
    return "See the docstring of cel_utils.dynamics for each formula."
