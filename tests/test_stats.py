import numpy as np
import pytest

from cel_utils.screening import Screen
from cel_utils.scoring import ItemResults
from cel_utils.stats import benjamini_hochberg, paired_bootstrap, paired_bootstrap_many
from tests.oracles import mcnemar_p


def test_no_effect_ci_contains_zero():
    rng = np.random.default_rng(0)
    base = (rng.random(200) < 0.5).astype(float)
    r = paired_bootstrap(base, base.copy(), seed=1)
    assert r["delta"] == 0 and r["ci_low"] <= 0 <= r["ci_high"] and r["p_value"] == 1.0
    noisy = base.copy()
    flip = rng.choice(200, 10, replace=False)  # 5 up, 5 down: no net effect
    noisy[flip[:5]] = 1 - noisy[flip[:5]]
    r = paired_bootstrap_many(base, noisy[None], seed=2)
    assert r["ci_low"][0] <= 0 <= r["ci_high"][0] and r["p_value"][0] > 0.05


def test_planted_effect_detected_and_fdr():
    rng = np.random.default_rng(0)
    n, heads = 150, 40
    base = (rng.random(n) < 0.4).astype(float)
    abl = np.repeat(base[None], heads, axis=0)
    for h in range(heads):  # noise: a few random flips both ways
        idx = rng.choice(n, 4, replace=False)
        abl[h, idx] = 1 - abl[h, idx]
    wrong = np.flatnonzero(base == 0)
    abl[7, wrong[:30]] = 1  # planted: head 7 fixes 30 items
    sc = Screen(heads=[(h // 8, h % 8) for h in range(heads)],
                baseline=ItemResults(base[None] > 0, base[None] - 0.5),
                results=ItemResults(abl > 0, abl - 0.5), mode="zero")
    st = sc.stats(seed=0)
    assert st.candidate.sum() == 1 and bool(st.candidate.iloc[7])
    assert (st.ci_low <= st.delta_accuracy + 1e-12).all() and (st.delta_accuracy <= st.ci_high + 1e-12).all()
    assert (st.q_value >= st.p_value - 1e-12).all()


def test_bh_known_values():
    q = benjamini_hochberg(np.array([0.01, 0.04, 0.03, 0.5]))
    assert np.allclose(q, [0.04, 0.16 / 3, 0.16 / 3, 0.5], atol=1e-9)


def test_mcnemar_exact_by_hand():
    from cel_utils.stats import fixes_breaks, mcnemar_exact

    base = np.array([0, 0, 0, 0, 1, 1, 0, 1], bool)
    abl = np.array([[1, 1, 1, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 0, 1]], bool)
    f, b = fixes_breaks(base, abl)
    assert f.tolist() == [4, 0] and b.tolist() == [1, 0]
    # 4 fixes, 1 break: P(X >= 4 | 5, 1/2) = 6/32, two-sided 12/32
    assert mcnemar_exact(f, b) == pytest.approx([12 / 32, 1.0])
    # a lone head among 270 that fixes 20 of 32 items, nothing else moving: q far below 0.10
    p = np.concatenate([mcnemar_exact([20], [0]), np.ones(269)])
    assert benjamini_hochberg(p)[0] < 1e-3


def test_holm_by_hand():
    from cel_utils.stats import holm

    assert holm(np.array([0.01, 0.04, 0.03, 0.5])) == pytest.approx([0.04, 0.09, 0.09, 0.5])


def test_power_matches_simulation():
    """The exact power sum against a Monte Carlo oracle (independent: draws items, runs scipy's binomtest)."""
    from cel_utils.stats import mcnemar_power, min_detectable_gain

    rng = np.random.default_rng(1)
    for n, pf, pb, alpha in [(60, 0.12, 0.02, 0.05), (120, 0.08, 0.03, 0.01)]:
        u = rng.random((4000, n))
        f, b = (u < pf).sum(1), ((u >= pf) & (u < pf + pb)).sum(1)
        sim = np.mean([x > y and mcnemar_p(x, y) <= alpha for x, y in zip(f, b)])
        assert mcnemar_power(n, pf, pb, alpha) == pytest.approx(sim, abs=0.03)
    g = min_detectable_gain(150, 0.02, break_rate=0.02)
    assert mcnemar_power(150, g + 0.02, 0.02, 0.02) >= 0.8 > mcnemar_power(150, g - 0.0025 + 0.02, 0.02, 0.02)


def test_lone_strong_head_among_270_is_a_candidate():
    """The review's case: 270 heads, 32 items, one head fixes every wrong item; a bootstrap p-value floor
    (1/2001) under BH would give it q = 0.135 > 0.10. The exact test flags it."""
    rng = np.random.default_rng(0)
    n, heads = 32, 270
    base = np.zeros(n, bool)
    base[:10] = True
    abl = np.repeat(base[None], heads, axis=0)
    for h in range(heads):  # background: one random flip per head
        i = rng.integers(n)
        abl[h, i] = ~abl[h, i]
    abl[123] = True  # the planted head fixes all 22 wrong items
    margin = lambda c: np.where(c, 1.0, -1.0)  # noqa: E731
    sc = Screen(heads=[(h // 9, h % 9) for h in range(heads)], baseline=ItemResults(base[None], margin(base)[None]),
                results=ItemResults(abl, margin(abl)), mode="zero")
    st = sc.stats(seed=0)
    assert st.candidate.tolist() == [h == 123 for h in range(heads)]
    assert st.fixes[123] == 22 and st.breaks[123] == 0 and st.q_value[123] < 1e-3
