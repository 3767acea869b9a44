"""Held-back checks of the exercises: the same comparisons as :mod:`cel_utils.checks` and
:mod:`cel_utils.checks_numeric`, on inputs the public checks do not use (other tiny-model families and seeds and
other head sets, other fixes and breaks counts including a large one, other models and items, other set-ups).
:mod:`cel_utils.exercises` runs them after each public check; the chapters never show them.

Example:
    >>> from scipy.stats import false_discovery_control
    >>> bh_other_sizes(lambda p: false_discovery_control(p, method="bh"))
    check_bh passed: 7 cases (2 to 300 p-values)
"""

from __future__ import annotations

import random
import string
from typing import Callable

import numpy as np
import torch

from .ablation import ablate_heads, format_heads
from .checks import check_ablation, check_delta_accuracy, check_rates, check_screen, tiny_lm
from .checks_numeric import (check_bh, check_direct, check_equal_rate_null, check_greedy, check_interaction,
                             check_kind, check_reading, check_threshold, direct_cases, interaction_case, pair_score,
                             reading_cases)
from .stats import fixes_breaks, mcnemar_exact
from .tasks import Task
from .theory import Setup


# families and seeds the public check_ablation does not use: qwen2 (a bias on q/k/v), mistral (4 query heads
# share 1 key/value head), gpt2 (the output projection is a Conv1D, its weight stored [in, out])
ABLATION_MODELS = (("qwen2", 1), ("mistral", 2), ("gpt2", 3), ("llama", 4))


def ablation_other_models(fn: Callable) -> None:
    for family, seed in ABLATION_MODELS:
        check_ablation(fn, lm=tiny_lm(family, seed=seed))


def _held_head_sets(lm) -> list[list[tuple[int, int]]]:
    """Head sets the public check does not try: three heads of one layer, a whole layer, one head in every layer
    (given from the last layer down), and no head at all (the unablated model)."""
    L, H = lm.n_layers, lm.n_heads
    return [[(0, h) for h in sorted({0, H // 2, H - 1})], [(L - 1, h) for h in range(H)],
            [(l, (l + 1) % H) for l in reversed(range(L))], []]


def _reference(lm, ids, heads) -> torch.Tensor:
    with torch.no_grad(), ablate_heads(lm, list(heads)):
        return lm.model(input_ids=ids, use_cache=False).logits.float()


def ablation_other_sets(fn: Callable) -> None:
    for family, seed in (("llama", 5), ("gemma3", 6)):
        lm = tiny_lm(family, seed=seed)
        ids = torch.randint(2, 90, (3, 13), generator=torch.Generator().manual_seed(seed))
        base = _reference(lm, ids, [])
        for heads in _held_head_sets(lm):
            where = f"ablating {format_heads(heads) or 'no head'} on {lm.name}, input of shape {tuple(ids.shape)}"
            with torch.no_grad():
                out = fn(lm, ids.clone(), list(heads))
            got = getattr(out, "logits", out)
            if not isinstance(got, torch.Tensor):
                raise AssertionError(f"{where}: your function returned {type(got).__name__}; return the logits")
            ref = _reference(lm, ids, heads)
            if got.shape != ref.shape:
                raise AssertionError(f"{where}: your logits have shape {tuple(got.shape)}, expected "
                                     f"{tuple(ref.shape)}")
            diff = float((got.detach().float() - ref).abs().max())
            if diff > 1e-4 * max(1.0, float(ref.abs().max())):
                raise AssertionError(f"{where}: your logits differ from cel_utils.ablation.ablate_heads by up to "
                                     f"{diff:.4g}")
            if not torch.equal(_reference(lm, ids, []), base):
                raise AssertionError(f"after {where}, the model's unablated output changed: remove your hooks "
                                     "and restore any weight you edited")


# (fixes, breaks, unchanged right, unchanged wrong): counts the public check does not use, up to 1200 flips
MCNEMAR_CASES = ((0, 1, 6, 3), (9, 1, 4, 2), (2, 11, 0, 1), (25, 25, 10, 10), (40, 21, 100, 50), (130, 96, 0, 0),
                 (610, 590, 30, 20))


def mcnemar_other_counts(fn: Callable) -> None:
    for i, (f, b, rr, ww) in enumerate(MCNEMAR_CASES):
        base = np.array([False] * f + [True] * b + [True] * rr + [False] * ww)
        abl = np.array([True] * f + [False] * b + [True] * rr + [False] * ww)
        order = np.random.default_rng(100 + i).permutation(len(base))
        base, abl = base[order], abl[order]
        out = np.asarray(fn(base.copy(), abl.copy()), dtype=float).reshape(-1)
        if out.size != 1:
            raise AssertionError(f"return one p-value (a float); got {out.size} numbers")
        ref = float(mcnemar_exact(*fixes_breaks(base, abl))[0])
        if not abs(float(out[0]) - ref) <= 1e-9:
            raise AssertionError(f"{f} fixes, {b} breaks, {rr + ww} unchanged items: your p-value is "
                                 f"{float(out[0]):.4g}, the exact two-sided McNemar p-value is {ref:.4g}")


def _screen_task(n: int, choices: tuple[str, ...], seed: int) -> Task:
    """Multiple-choice items after a random lowercase prompt ending in ':' (choices of several tokens)."""
    rng = random.Random(seed)
    items = [{"prompt": "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9))) + ":",
              "choices": list(choices), "answer": i % len(choices)} for i in range(n)]
    return Task(name="held-back", kind="mc", items=items)


def screen_other_models(fn: Callable) -> None:
    check_screen(fn, lm=tiny_lm("gpt2", seed=4), task=_screen_task(15, (" yes", " no", " maybe"), seed=1))
    check_screen(fn, lm=tiny_lm("gemma3", seed=2), task=_screen_task(10, (" a", " b"), seed=5))


# set-ups the public check does not use; in the first and last the distractors D correlate with the tasks
RATE_SETUPS = (("distractors correlated with A", Setup(rho_a=(0.8, 0.0, 0.5, 0.1))),
               ("one distractor", Setup(m=1)),
               ("m = 60, both tasks on every type", Setup(rho_a=(0.6, 0.1, 0.4, 0.05),
                                                           rho_b=(0.1, 0.5, -0.7, -0.05), m=60)))


def rates_other_setups(fn: Callable) -> None:
    check_rates(fn, setups=RATE_SETUPS)


def bh_other_sizes(fn: Callable) -> None:
    rng = np.random.default_rng(11)
    check_bh(fn, cases=[rng.uniform(0, 1, n).tolist() for n in (2, 7, 120, 300)]   # in no particular order
             + [[0.5, 0.0, 0.0], [1.0, 1.0], rng.beta(0.2, 5, 60).tolist()])


def reading_other_items(fn: Callable) -> None:
    rng = np.random.default_rng(8)
    check_reading(fn, cases=reading_cases(seed=7) + [(np.r_[np.ones(30), -np.ones(5)], 0.5),
                                                      (np.full(10, -0.2), -0.1), (rng.normal(0.3, 1, 400), 0.2)])


def greedy_other_pools(fn: Callable) -> None:
    heads = [(0, 1), (2, 3), (1, 0), (3, 3), (2, 2), (0, 0)]
    gains = dict(zip(heads, (0.05, 0.2, 0.2, -0.1, 0.1, 0.0)))   # (2, 3) and (1, 0) tie: the earlier wins
    check_greedy(fn, cases=(
        ("heads as (layer, head), a tie", heads, pair_score(gains, {((2, 2), (3, 3)): 0.4}), 4),
        ("max_size below the pool", list(range(8)), pair_score({i: 0.1 * (i % 3) for i in range(8)}, {}), 2)))


def direct_other_shapes(fn: Callable) -> None:
    check_direct(fn, cases=direct_cases(seed=3, rest=1.5))


def null_other_counts(fn: Callable) -> None:
    check_equal_rate_null(fn, cases=(([40, 0, 0, 0, 1], 40), ([1], 300), (list(range(12)), 64)), as_list=True)


def kind_other_eps(fn: Callable) -> None:
    check_kind(fn, cases=(([0.0, -0.3, 0.2, 0.2], [0.3, 0.3, -0.2, -0.19], 0.0),
                          ([0.1, 0.11, 0.11], [-0.11, -0.1, 0.5], 0.1)))


def delta_other_models(fn: Callable) -> None:
    check_delta_accuracy(fn, lm=tiny_lm("gpt2", seed=4), task=_screen_task(15, (" yes", " no", " maybe"), seed=1))
    check_delta_accuracy(fn, lm=tiny_lm("gemma3", seed=2), task=_screen_task(10, (" a", " b"), seed=5))


def interaction_other_sets(fn: Callable) -> None:
    check_interaction(fn, cases=tuple(interaction_case(s, k, n) for s, k, n in ((7, 3, 20), (8, 4, 9))),
                      as_list=True)


def threshold_other_setups(fn: Callable) -> None:
    check_threshold(fn, cases=(RATE_SETUPS[0], RATE_SETUPS[2], ("A's C-correlation 0.7", Setup(rho_a=(0.8, 0.0, 0.7, 0.0)))))
