"""Per-class effects, the capability/bias classification and flips, on hand-made per-item results."""

import numpy as np
import pytest

from cel_utils.effects import class_effects, class_table, flips, item_labels
from cel_utils.tasks import load_task


def test_bias_shift_is_not_capability():
    # every error is on "negative"; the ablation fixes negatives but breaks positives: raw accuracy rises
    labels = ["positive"] * 10 + ["negative"] * 10
    base = np.array([1] * 10 + [0] * 6 + [1] * 4, bool)
    abl = np.array([1] * 7 + [0] * 3 + [1] * 10, bool)
    e = class_effects(labels, base, abl)
    assert abl.mean() > base.mean()
    assert e["kind"] == "bias-like"
    assert e["classes"]["positive"]["delta"] == pytest.approx(-0.3)
    assert e["classes"]["negative"]["delta"] == pytest.approx(0.6)
    assert e["delta_balanced"] == pytest.approx(0.15)


def test_capability_harmful_none():
    labels = ["a", "a", "b", "b"]
    base = np.array([0, 1, 0, 1], bool)
    assert class_effects(labels, base, np.array([1, 1, 1, 1], bool))["kind"] == "capability-like"
    assert class_effects(labels, base, np.array([0, 0, 0, 1], bool))["kind"] == "harmful"
    assert class_effects(labels, base, base)["kind"] == "none"
    with pytest.raises(ValueError):
        class_effects(labels, base, base[:3])


def test_class_table_on_tasks():
    t = load_task("sentiment", n=20)
    assert item_labels(t) is not None
    base = np.zeros(20, bool)
    abl = np.stack([np.ones(20, bool), np.zeros(20, bool)])
    tab = class_table(t, ["all right", "no change"], base, abl)
    assert tab["kind"].tolist() == ["capability-like", "none"]
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
