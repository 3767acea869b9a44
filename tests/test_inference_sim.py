"""The screen -> confirm pipeline on simulated items (no model): false confirmations under the null stay at
the stated level, and an effect of the stated minimum detectable size is confirmed with the stated power."""

import numpy as np

from cel_utils.defaults import FDR, POWER
from cel_utils.stats import confirm_decisions, min_detectable_gain

HEADS, K, N_SEARCH, N_CONFIRM, R = 100, 5, 32, 200, 400


def _ablate(rng, base, p_fix, p_break):
    """Each wrong item is fixed with probability p_fix / (1 - acc), each right one broken with p_break / acc:
    overall, p_fix and p_break of all items."""
    acc = base.mean()
    u = rng.random(base.shape)
    return np.where(base, u >= p_break / acc, u < p_fix / (1 - acc))


def _pipeline(rng, planted_gain=0.0, break_rate=0.03):
    """Rank all heads on the search split by their net gain, re-test the top K on fresh confirm items."""
    base_s = rng.random(N_SEARCH) < 0.5
    base_c = rng.random(N_CONFIRM) < 0.5
    rates = [(break_rate + (planted_gain if h == 0 else 0.0), break_rate) for h in range(HEADS)]
    search = np.stack([_ablate(rng, base_s, f, b) for f, b in rates])
    order = np.argsort(-(search.mean(1) + 1e-6 * rng.random(HEADS)))[:K]
    if planted_gain:
        order = np.concatenate([[0], [h for h in order if h != 0][:K - 1]])  # condition on reaching confirm
    confirm = np.stack([_ablate(rng, base_c, *rates[h]) for h in order])
    return order, confirm_decisions(base_c, confirm, FDR)["confirmed"]


def test_null_false_confirmation_rate_at_most_the_level():
    rng = np.random.default_rng(0)
    any_false = np.mean([_pipeline(rng)[1].any() for _ in range(R)])
    assert any_false <= FDR + 3 * np.sqrt(FDR * (1 - FDR) / R)


def test_effect_of_the_minimum_detectable_size_is_confirmed():
    rng = np.random.default_rng(1)
    mde = min_detectable_gain(N_CONFIRM, FDR / K, break_rate=0.03, power=POWER)
    assert mde <= 0.10  # 200 confirm items detect a gain of 10 points
    hits = np.mean([_pipeline(rng, planted_gain=mde)[1][0] for _ in range(R)])
    assert hits >= POWER - 3 * np.sqrt(POWER * (1 - POWER) / R)
