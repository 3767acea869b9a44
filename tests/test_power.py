"""Power of the whole pipeline (cel_utils.power): the shift, the p-value table, exact stage checks,
monotonicity, and a direct simulation of search -> confirm -> held-out in a synthetic world that the
estimate, made from single realisations of the world's screen, must reproduce."""

import numpy as np
import pytest
from scipy.stats import norm

from cel_utils.design import Design
from cel_utils.power import PowerInputs, mcnemar_table, shift_for_gain
from cel_utils.power import pipeline_power as _pipeline_power
from cel_utils.screening import Screen
from cel_utils.scoring import ItemResults
from cel_utils.stats import confirm_decisions, fixes_breaks, holm, mcnemar_exact, mcnemar_power

# --- the synthetic world --------------------------------------------------------------------------------------
# 60 heads; an item's unablated margin ~ N(MU0, 1); head h changes it by MU[h] + TAU * noise (MU ~ N(0, S)).
# The planted head: a host (uniform over the heads outside the true top 2K) plus the shift that gains g in the
# population on the search items; on the confirm and held-out items it fixes g + b and breaks b of all items.
H, K, N_S, N_C, N_H, FDR, ALPHA = 60, 5, 32, 250, 200, 0.10, 0.05
S, TAU, MU0, B = 0.05, 0.3, 0.3, 0.01
MU = np.random.default_rng(123).normal(0, S, H)
A0 = norm.cdf(MU0)  # population accuracy
HOSTS = np.argsort(-MU)[2 * K:]


def _items(rng, n):
    """Fresh items: unablated margins [n] and every head's change [H, n]."""
    return rng.normal(MU0, 1, n), MU[:, None] + TAU * rng.normal(size=(H, n))


def _top(base, delta):
    """The library's ranking (Screen.top by the change in mean margin): the top K head indices."""
    m = base + delta
    sc = Screen(heads=[(0, h) for h in range(H)], baseline=ItemResults(base[None] > 0, base[None]),
                results=ItemResults(m > 0, m), mode="zero")
    return sc.top(K)["head_index"].to_numpy()


def _planted(rng, ok, g, b):
    """The planted head's correctness: fixes a wrong item w.p. (g + b) / (1 - A0), breaks a right one w.p. b / A0."""
    u = rng.random(len(ok))
    return np.where(ok, u >= b / A0, u < (g + b) / (1 - A0))


def _direct(rng, g, b):
    """One run of the pipeline with a planted head: (ranked, confirmed, holds)."""
    host = rng.choice(HOSTS)
    base, delta = _items(rng, N_S)
    delta[host] += norm.ppf(A0 + g) - MU0  # population gain g: P(-d < margin <= 0) = g
    top = list(_top(base, delta))
    if host not in top:
        return False, False, False
    base, delta = _items(rng, N_C)
    ok = base > 0
    conf = confirm_decisions(ok, np.stack([_planted(rng, ok, g, b) if h == host else base + delta[h] > 0
                                           for h in top]), FDR)["confirmed"]
    if not conf[top.index(host)]:
        return True, False, False
    heads = [h for h, c in zip(top, conf) if c]
    base, delta = _items(rng, N_H)
    ok = base > 0
    pc = _planted(rng, ok, g, b)
    rows = [pc if h == host else base + delta[h] > 0 for h in heads]
    if len(heads) > 1:  # all together: the real heads' changes add up, the planted head's flips on top
        together = base + sum(delta[h] for h in heads if h != host) > 0
        rows.append(np.where(pc != ok, pc, together))
    f, br = fixes_breaks(ok, np.stack(rows))
    p = holm(mcnemar_exact(f, br))
    i = heads.index(host)
    return True, True, bool(p[i] < ALPHA and f[i] > br[i])


def _realisation(rng, n_s=N_S):
    """One run of the real pipeline (no planted head): what pipeline_power is given."""
    base, delta = _items(rng, n_s)
    top = _top(base, delta)
    bc, dc = _items(rng, N_C)
    d = confirm_decisions(bc > 0, bc + dc[top] > 0, FDR)
    conf = top[d["confirmed"]]
    held = None
    if len(conf):
        bh, dh = _items(rng, N_H)
        rows = [bh + dh[h] > 0 for h in conf] + ([bh + dh[conf].sum(0) > 0] if len(conf) > 1 else [])
        held = mcnemar_exact(*fixes_breaks(bh > 0, np.stack(rows)))
    return dict(search_base=base, search_heads=base + delta, calib_margins=bc, n_confirm=N_C, n_heldout=N_H,
                top_k=K, fdr=FDR, alpha=ALPHA, confirm_others=list(zip(d["fixes"], d["breaks"])),
                heldout_others=held)


def pipeline_power(search_base, search_heads, calib_margins, *, n_confirm, n_heldout, confirm_others, top_k=K,
                   fdr=FDR, alpha=ALPHA, heldout_others=None, seed=0, **rest):
    """The library's pipeline_power with this file's keyword arguments: the run's inputs and its Design."""
    inputs = PowerInputs(search_base, search_heads, calib_margins, confirm_others, heldout_others)
    return _pipeline_power(inputs, Design(n_confirm=n_confirm, n_heldout=n_heldout, top_k=top_k, fdr=fdr,
                                          alpha=alpha, seed=seed), **rest)


GAINS = (0.04, 0.08)  # low and high power in this world
R, REALISATIONS = 500, 30


def test_direct_simulation_matches_the_estimate():
    """Fraction of direct runs localized vs the mean of pipeline_power over single realisations. Tolerance:
    3 combined Monte Carlo standard errors (direct: binomial; estimate: spread over realisations / sqrt(n)).
    With ``match_spread`` the estimate must agree both ways; without it (resampling adds the search noise a
    second time) it must not overstate power, and its confirm and held-out stages must agree."""
    rng = np.random.default_rng(7)
    direct = np.array([[_direct(rng, g, B) for _ in range(R)] for g in GAINS])  # [gain, R, stage]
    d_rank = direct[..., 0].mean(1)
    d_conf = direct[..., 1].sum(1) / direct[..., 0].sum(1)
    d_hold = direct[..., 2].sum(1) / direct[..., 1].sum(1)
    d_pow = direct[..., 2].mean(1)
    d_se = np.sqrt(d_pow * (1 - d_pow) / R)
    est = {m: [] for m in (False, True)}
    for k in range(REALISATIONS):
        kw = _realisation(np.random.default_rng(1000 + k))
        for m in est:
            t = pipeline_power(**kw, gains=GAINS, break_rates=[B], match_spread=m, n_sim=1000, seed=k)
            est[m].append(t[["power", "p_rank", "p_confirm_given_rank", "p_hold_given_confirm"]].to_numpy())
    for m, e in est.items():
        e = np.array(e)  # [realisation, gain, column]
        mean, se = e.mean(0), e.std(0, ddof=1) / np.sqrt(len(e))
        tol = 3 * np.sqrt(d_se ** 2 + se[:, 0] ** 2)
        print(f"match_spread={m}: direct power {d_pow.round(3)} (rank {d_rank.round(3)}, confirm {d_conf.round(3)}, "
              f"held-out {d_hold.round(3)}); estimate {mean[:, 0].round(3)} +- {se[:, 0].round(3)} (rank "
              f"{mean[:, 1].round(3)}, confirm {mean[:, 2].round(3)}, held-out {mean[:, 3].round(3)}); tol {tol.round(3)}")
        assert (mean[:, 0] <= d_pow + tol).all()  # never overstates
        if m:
            assert (mean[:, 0] >= d_pow - tol).all()
        for j, dj in ((2, d_conf), (3, d_hold)):  # the stages after the search, whichever centring
            n_j = direct[..., j - 1].sum(1)
            tol_j = 3 * np.sqrt(dj * (1 - dj) / n_j + se[:, j] ** 2)
            assert (np.abs(mean[:, j] - dj) <= tol_j).all(), (j, mean[:, j], dj, tol_j)
    assert d_pow[0] < 0.5 < d_pow[1]  # one low-power and one high-power gain


def test_shift_for_gain_by_hand():
    m = np.array([0.9, -0.2, 0.1, -0.5, 0.0, 0.4, -0.2, 0.7])  # 4 wrong at distances 0, 0.2, 0.2, 0.5
    assert shift_for_gain(m, 0.0) == 0.0
    assert shift_for_gain(m, 0.125) == pytest.approx(0.1)  # fix the 0.0 item: midway to the next (0.2)
    assert shift_for_gain(m, 0.25) == pytest.approx(0.35)  # passing 0.2 fixes both tied items: midway to 0.5
    assert shift_for_gain(m, 0.5) == pytest.approx(0.5) and shift_for_gain(m, 0.5) > 0.5  # every wrong item
    assert shift_for_gain(m, 0.51) is None  # ceiling: only 0.5 to gain
    rng = np.random.default_rng(0)
    x = rng.normal(0.5, 1, 101)
    for g in (0.01, 0.05, 0.1, 0.2):
        d = shift_for_gain(x, g)
        gain = lambda s: np.mean(x + s > 0) - np.mean(x > 0)  # noqa: E731
        assert gain(d) >= g - 1e-12
        wrong = np.sort(-x[x <= 0])
        assert gain(wrong[wrong < d].max()) < g  # stopping at the last item passed gains less than g


def test_ceiling_row():
    kw = _realisation(np.random.default_rng(0))
    kw["calib_margins"] = np.r_[np.full(96, 1.0), np.full(4, -1.0)]  # room 0.04
    t = pipeline_power(**kw, gains=[0.02, 0.05], break_rates=[0.0, 0.03], n_sim=200)
    assert t.reason.isna().tolist() == [True, False, False, False]
    assert t.power[2] == 0 and t.reason[2].startswith("ceiling") and np.isnan(t.power[1])  # 0.02 + 0.03 > 0.04


def test_mcnemar_table_is_the_exact_test():
    rng = np.random.default_rng(0)
    f, b = rng.integers(0, 120, 300), rng.integers(0, 120, 300)
    assert mcnemar_table(250)[f, b] == pytest.approx(mcnemar_exact(f, b), abs=1e-12)


STAGE_CASES = [  # (top_k, confirm_others, heldout_others, level of the confirm test, level of the held-out test)
    (1, [], None, FDR, ALPHA),  # BH and Holm over one test are that test
    (5, [(0, 0)], None, FDR / 5, ALPHA),  # others never flip (p = 1): BH gives q = 5 p; the planted head tested alone
    (5, [(0, 60)], None, FDR, ALPHA),  # others significant but harmful: q = p, never confirmed (fixes < breaks)
    (5, [(60, 0)], [0.009], FDR, ALPHA / 6),  # others always confirmed: q = p; Holm over 5 heads + together, the
]                                              # others at 0.009: 6 * 0.009 > alpha, so it holds iff 6 p < alpha


@pytest.mark.parametrize("n_c,n_h,g,b", [(250, 200, 0.04, 0.0), (120, 80, 0.08, 0.03), (250, 200, 0.06, 0.05)])
def test_confirm_and_heldout_stages_are_exact_mcnemar_power(n_c, n_h, g, b):
    """Where BH and Holm reduce to one McNemar test at a known level, the confirm and held-out stages must give
    its exact power (stats.mcnemar_power), within 3 Monte Carlo standard errors."""
    kw = _realisation(np.random.default_rng(0))
    kw.update(n_confirm=n_c, n_heldout=n_h)
    n = 4000
    for top_k, others, held, lev_c, lev_h in STAGE_CASES:
        kw.update(top_k=top_k, confirm_others=others, heldout_others=held)
        r = pipeline_power(**kw, gains=[g], break_rates=[b], n_sim=n, seed=1).iloc[0]
        p_c = mcnemar_power(n_c, g + b, b, lev_c)
        p_h = mcnemar_power(n_h, g + b, b, lev_h)
        assert abs(r.p_confirm_given_rank - p_c) <= 3 * np.sqrt(p_c * (1 - p_c) / n) + 1e-9, (top_k, others, r, p_c)
        assert abs(r.p_hold_given_confirm - p_h) <= 3 * np.sqrt(p_h * (1 - p_h) / (n * p_c)) + 1e-9, (others, r, p_h)


def test_ties_count_against_the_planted_head():
    base = np.zeros(16)
    heads = np.zeros((30, 16))  # no head changes anything
    kw = dict(n_confirm=100, n_heldout=100, confirm_others=[(0, 0)], n_sim=200)
    t = pipeline_power(base, heads, np.r_[np.full(50, 1.0), -np.arange(1, 51) / 50], gains=[0.0, 0.01], **kw)
    assert t.margin_shift[0] == 0 < t.margin_shift[1] and t.p_rank.tolist() == [0.0, 1.0]  # a tie loses, any shift wins


def test_hosts_are_outside_the_real_top():
    heads = np.zeros((20, 16))
    heads[:10] = 5.0  # the real top 2 * top_k: every item changed by 5
    calib = np.r_[np.full(30, -1.0), np.full(20, -6.0), np.full(50, 1.0)]
    t = pipeline_power(np.zeros(16), heads, calib, n_confirm=100, n_heldout=100, gains=[0.3, 0.5],
                       confirm_others=[(0, 0)], n_sim=500)
    assert t.margin_shift.tolist() == [3.5, pytest.approx(6.0)] and t.p_rank.tolist() == [0.0, 1.0]


def test_monotone_in_gain():
    kw = _realisation(np.random.default_rng(3))
    t = pipeline_power(**kw, gains=np.arange(0.0, 0.2, 0.01), break_rates=[0.02], n_sim=2000)
    assert (np.diff(t.p_rank) >= 0).all()  # the same resamples and hosts for every gain
    assert (np.diff(t.power) >= -3 * np.hypot(t.se[1:].to_numpy(), t.se[:-1].to_numpy())).all()
    assert t.power.iloc[-1] > 0.9 > 0.1 > t.power.iloc[1]


def test_monotone_in_n_search():
    """More search items: the planted head (above the top-K threshold in expectation) ranks at least as often."""
    p = {}
    for n_s in (16, 64):
        p[n_s] = [pipeline_power(**_realisation(np.random.default_rng(50 + k), n_s), gains=[0.08], n_sim=2000,
                                 seed=k).p_rank[0] for k in range(4)]
    se = np.hypot(np.std(p[16], ddof=1), np.std(p[64], ddof=1)) / 2
    assert np.mean(p[64]) >= np.mean(p[16]) - 3 * se
    assert np.mean(p[64]) > np.mean(p[16])


def test_fewer_or_more_items_drawn_from_one_screen():
    """``n_draw``: a search on fewer items, estimated from the same screen, ranks the planted head less often, and
    one on more items more often; drawing the screen's own number of items is the default."""
    kw = _realisation(np.random.default_rng(7), 32)
    p = {m: pipeline_power(**kw, gains=[0.08], n_sim=3000, seed=1, n_draw=m).p_rank[0] for m in (8, 32, 128)}
    assert p[8] < p[32] < p[128]
    assert pipeline_power(**kw, gains=[0.08], n_sim=500, seed=2).equals(
        pipeline_power(**kw, gains=[0.08], n_sim=500, seed=2, n_draw=32))
