"""The battery's checks and label (cel_utils.labels) on outcomes built here: each word needs a check that holds,
"no effect" and "inconclusive" have their place, and formats without room do not count."""

import numpy as np
import pytest
from scipy.stats import norm

from cel_utils.labels import LABELS, Outcomes, checks, label, label_distribution, mean_ci

RNG = np.random.default_rng(0)
N = 300


def _base(acc=0.4, n=N, formats=("default", "a", "b", "c")):
    item = RNG.normal(0, 1, n)
    return {f: norm.ppf(acc) + item + 0.5 * RNG.normal(0, 1, n) for f in formats}


def _outcomes(shift=None, kinds_shift=None, gen=True, base=None, signs=None, nll=0.0):
    """Every format shifted by ``shift[f]`` (default 0), mean and resample by ``kinds_shift``, generation following
    the default format's flips, the text cost ``nll`` per chunk."""
    base = base or _base()
    shift = shift or {}
    m = {f: (b, b + shift.get(f, 0.0) + 0.3 * RNG.normal(0, 1, len(b))) for f, b in base.items()}
    b0 = base["default"]
    ks = kinds_shift if kinds_shift is not None else shift.get("default", 0.0)
    kinds = {k: b0 + ks + 0.3 * RNG.normal(0, 1, len(b0)) for k in ("mean", "resample")}
    g = None
    if gen:
        g0 = (b0 > 0).astype(float)
        g = (g0, (m["default"][1] > 0).astype(float))
    return Outcomes(m, kinds, g, signs, np.full(20, nll) + RNG.normal(0, 0.002, 20), False)


@pytest.mark.filterwarnings("ignore:Precision loss")   # scipy on nearly constant 0/1 differences
def test_mean_ci_is_scipys_t_interval():
    """mean_ci against scipy.stats.ttest_1samp's confidence interval (the library's, a separate implementation),
    at several sizes and levels, paired 0/1 differences included."""
    from scipy.stats import ttest_1samp

    for n, alpha in ((3, 0.05), (20, 0.05), (50, 0.05), (50, 0.01), (400, 0.1)):
        for d in (RNG.normal(0.2, 1, n), RNG.integers(-1, 2, n).astype(float)):
            est, lo, hi = mean_ci(d, alpha=alpha)
            ci = ttest_1samp(d, 0.0).confidence_interval(1 - alpha)
            assert est == pytest.approx(d.mean()) and (lo, hi) == pytest.approx((ci.low, ci.high), rel=1e-9), (n, alpha)


def test_each_truth_gets_its_word():
    everywhere = {f: 1.0 for f in ("default", "a", "b", "c")}
    cap = checks(_outcomes(everywhere))
    assert [cap[k]["reading"] for k in ("effect", "transfer", "survives", "generation", "cost")] == \
        ["holds"] * 4 + ["fails"] and label(cap) == "capability"
    assert label(checks(_outcomes({"default": 1.0}))) == "format-specific"
    assert label(checks(_outcomes(everywhere, kinds_shift=0.0))) == "offset"
    assert label(checks(_outcomes(everywhere, nll=0.2))) == "costly"
    assert label(checks(_outcomes({}))) == "no effect"


def test_teacher_forcing_only_and_label_shift():
    everywhere = {f: 1.0 for f in ("default", "a", "b", "c")}
    o = _outcomes(everywhere)
    o.generation = (o.generation[0], o.generation[0])   # no gain in free generation
    c = checks(o)
    assert c["generation"]["reading"] != "holds" and c["teacher_forcing"]["reading"] == "holds"
    assert label(c) == "teacher-forcing only"
    signs = np.where(np.arange(N) % 2 == 0, 1, -1)
    base = _base(acc=0.5)
    m = {f: (b, b + 1.5 * signs + 0.3 * RNG.normal(0, 1, N)) for f, b in base.items()}   # toward one label
    c = checks(Outcomes(m, {k: m["default"][1] for k in ("mean", "resample")}, None, signs,
                        np.zeros(20), False))
    assert c["label_shift"]["reading"] == "holds" and c["label_shift"]["estimate"] > 1
    if c["effect"]["reading"] == "holds":
        assert label(c) in ("label shift", "format-specific")


def test_no_effect_needs_a_narrow_interval_and_inconclusive_takes_the_rest():
    wide = _outcomes({}, base=_base(n=20))   # 20 items: the interval cannot rule out a gain of 0.05
    c = checks(wide)
    assert c["effect"]["reading"] != "holds"
    assert label(c) == ("no effect" if c["effect"]["ci_high"] < 0.05 else "inconclusive")
    assert label({"effect": {"reading": "cannot tell", "ci_high": 0.2}}) == "inconclusive"
    assert label({"effect": {"reading": "fails", "ci_high": -0.1}}) == "no effect"   # a loss is no gain


def test_formats_without_room_do_not_count():
    base = _base()
    base["ceiling"] = np.full(N, 5.0)    # right whatever happens: no room
    base["floor"] = np.full(N, -9.0)     # the model does not do the task in this format at all
    o = _outcomes({"default": 1.0}, base=base)
    o.margins["a"] = (o.margins["a"][0], o.margins["a"][0])   # exactly no change in format a
    c = checks(o)
    assert set(c["transfer"]["formats"]) == {"a", "b", "c"}
    st = c["transfer"]["sign_test"]
    assert st["ties"] == 1 and st["positive"] + st["negative"] == 2   # a tie is left out of the sign test


def test_the_label_distribution_covers_every_label():
    d = label_distribution(_outcomes({f: 1.0 for f in ("default", "a", "b", "c")}), n_boot=50)
    assert set(d) == set(LABELS) and sum(d.values()) == pytest.approx(1.0) and d["capability"] > 0.9


def test_welch_ci_is_scipys_welch_interval():
    from scipy.stats import ttest_ind

    from cel_utils.labels import welch_ci

    rng = np.random.default_rng(4)
    for nx, ny, sx, sy in ((5, 9, 1.0, 3.0), (40, 12, 0.2, 0.05), (200, 200, 1.0, 1.0)):
        x, y = rng.normal(0.3, sx, nx), rng.normal(0, sy, ny)
        want = ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
        got = welch_ci(x, y, 0.05)
        assert got[0] == pytest.approx(x.mean() - y.mean())
        assert got[1:] == pytest.approx((want.low, want.high), rel=1e-9)
    assert welch_ci(np.ones(4), np.zeros(3)) == (1.0, 1.0, 1.0)
    assert welch_ci(np.ones(1), np.zeros(3))[1:] == (-np.inf, np.inf)


def _two_class(change_pos, change_neg, n=200):
    """Margins of a two-class task whose ablation changes class +1's margins by ``change_pos`` and class -1's by
    ``change_neg`` (each with its own noise)."""
    rng = np.random.default_rng(6)
    signs = np.where(np.arange(n) % 2 == 0, 1, -1)
    b = rng.normal(0.5, 1.5, n)
    d = np.where(signs == 1, change_pos + rng.normal(0, 1.0, n), change_neg + rng.normal(0, 0.3, n))
    return Outcomes.of({"default": (b, b + d)}, signs=signs)


def test_the_label_shift_check_tells_a_shift_from_a_lopsided_change():
    """A shift moves both classes alike (holds); a change as lopsided as Gemma L10H1's (+1.54 in one class, -0.20
    in the other: the other class moves by far less than half) is no shift (fails), though both classes' CIs lie
    away from 0 in opposite directions, which was all the check used to ask."""
    shift = checks(_two_class(1.0, -1.0))["label_shift"]
    assert shift["reading"] == "holds" and shift["balance"]["reading"] == "holds"
    lop = checks(_two_class(1.54, -0.20))["label_shift"]
    assert lop["per_class"]["+1"]["reading"] == "holds" and lop["per_class"]["-1"]["reading"] == "fails"
    assert lop["balance"]["reading"] == "fails" and lop["reading"] == "fails"
    near = checks(_two_class(1.54, -0.20, n=12))["label_shift"]   # few items: the balance cannot tell
    assert near["reading"] != "holds"


def test_capability_needs_a_label_shift_ruled_out_on_two_class_tasks():
    c = {"effect": {"reading": "holds"}, "transfer": {"reading": "holds"}, "survives": {"reading": "holds"},
         "cost": {"reading": "fails"}}
    assert label(c) == "capability"                                         # not a two-class task
    assert label(dict(c, label_shift={"reading": "fails"})) == "capability"
    assert label(dict(c, label_shift={"reading": "cannot tell"})) == "shift or capability"
    assert label(dict(c, label_shift={"reading": "holds"})) == "label shift"


def test_one_value_gives_no_interval_and_no_reading():
    """A text cost measured on one chunk had an interval of zero width, so the cost check read 'fails' (no cost)
    from a single number: one value now gives no interval and 'cannot tell'; two equal values still give zero width."""
    from cel_utils.labels import check

    est, lo, hi = mean_ci(np.array([0.02]))
    assert est == 0.02 and (lo, hi) == (-np.inf, np.inf)
    assert check(np.array([0.02]), above=0.05)["reading"] == "cannot tell"
    assert check(np.array([0.02, 0.02]), above=0.05)["reading"] == "fails"
