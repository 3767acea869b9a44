"""Per-class effects, the capability/bias classification and flips, on hand-made per-item results."""

import numpy as np
import pytest

from cel_utils.effects import class_effects, class_table, flips, item_labels
from cel_utils.tasks import load_task


def _shifted(shift, n=100, seed=0):
    """Two classes of ``n`` items scored by a margin for the correct label; a constant shift of ``shift`` toward
    label "a" raises every "a" margin and lowers every "b" margin by the same amount (a pure calibration move)."""
    rng = np.random.default_rng(seed)
    m_a, m_b = rng.normal(-0.5, 1.0, n), rng.normal(2.0, 1.0, n)  # most errors are "a" items
    labels = ["a"] * n + ["b"] * n
    base = np.r_[m_a > 0, m_b > 0]
    return labels, base, np.r_[m_a + shift > 0, m_b - shift > 0]


def test_pure_constant_shift_is_bias_like():
    labels, base, abl = _shifted(1.0)
    e = class_effects(labels, base, abl)
    assert abl.mean() > base.mean()                     # raw accuracy rises: it looks like an enhancement
    assert e["classes"]["b"]["breaks"] > 0 and e["classes"]["b"]["fixes"] == 0
    assert e["share_label"] == "a" and e["share_ci_low"] > 0
    assert e["kind"] == "a class loses items"


def test_fixing_one_class_without_breaks_is_capability_like():
    labels, base, _ = _shifted(0.0)
    abl = np.ones(len(base), bool)                      # every error (nearly all "a") fixed, nothing broken
    e = class_effects(labels, base, abl)
    assert e["share_ci_low"] > 0                        # the label share moves too ...
    assert e["kind"] == "no class loses items"               # ... but no class loses: not a bias shift
    assert e["balanced_ci_low"] > 0


def test_single_items_do_not_decide():
    # five fixes in one class and one break in the other used to be called a class loses items
    labels = ["a"] * 100 + ["b"] * 100
    base = np.r_[np.arange(100) >= 20, np.ones(100, bool)]
    abl = base.copy()
    abl[:5] = True
    abl[150] = False
    e = class_effects(labels, base, abl)
    assert e["classes"]["b"]["p_value"] == 1.0
    assert e["kind"] != "a class loses items"


def test_balanced_and_share_by_hand():
    labels = ["p"] * 10 + ["n"] * 10
    base = np.array([1] * 10 + [0] * 6 + [1] * 4, bool)
    abl = np.array([1] * 7 + [0] * 3 + [1] * 10, bool)
    e = class_effects(labels, base, abl)
    assert e["classes"]["p"]["delta"] == pytest.approx(-0.3)
    assert e["classes"]["n"]["delta"] == pytest.approx(0.6)
    assert e["delta_balanced"] == pytest.approx(0.15)
    # answers given as "n": before 6 (the wrong "n" items are answered "p") ... by hand: before, "n" answers are
    # the 4 right "n" items; after, the 10 right "n" items plus the 3 wrong "p" items = 13: share +9/20
    assert e["share_label"] == "n" and e["delta_share"] == pytest.approx(9 / 20)
    assert e["balanced_ci_low"] <= e["delta_balanced"] <= e["balanced_ci_high"]


def test_capability_harmful_none():
    labels = ["a"] * 50 + ["b"] * 50
    base = np.r_[np.arange(50) < 25, np.arange(50) < 25]
    assert class_effects(labels, base, np.ones(100, bool))["kind"] == "no class loses items"
    assert class_effects(labels, base, np.zeros(100, bool))["kind"] == "harmful"
    assert class_effects(labels, base, base)["kind"] == "none"
    with pytest.raises(ValueError):
        class_effects(labels, base, base[:3])


def test_class_table_on_tasks():
    t = load_task("sentiment", n=20)
    assert item_labels(t) is not None
    base = np.zeros(20, bool)
    abl = np.stack([np.ones(20, bool), np.zeros(20, bool)])
    tab = class_table(t, ["all right", "no change"], base, abl)
    assert tab["kind"].tolist() == ["no class loses items", "none"]
    assert {"positive: change", "negative: change"} <= set(tab.columns)
    em = load_task("addition", n=5)
    assert item_labels(em) is None and class_table(em, ["x"], np.zeros(5, bool), np.ones((1, 5), bool)).empty


def test_flips_counts_and_examples():
    t = load_task("addition", n=6)
    base = np.array([1, 1, 0, 0, 1, 0], bool)
    abl = np.array([0, 1, 1, 1, 1, 0], bool)
    f = flips(t, base, abl, n_examples=5)
    assert (f["fixed"], f["broken"], f["net"]) == (2, 1, 1)
    assert len(f["fixed_examples"]) == 2 and t.items[2]["target"] in f["fixed_examples"][0]
