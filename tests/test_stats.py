import numpy as np

from cel_utils.screening import Screen
from cel_utils.scoring import ItemResults
from cel_utils.stats import benjamini_hochberg, paired_bootstrap, paired_bootstrap_many


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
