"""cel_utils.compare against independent oracles: hand-computed changes in accuracy and margin, scipy's paired
percentile bootstrap for the CIs, separate plain-loop runs per head set, fixes and breaks counted by hand, and
the McNemar and Holm references of tests/oracles.py."""

import random

import numpy as np
import pytest
from scipy.stats import bootstrap

from cel_utils.compare import compare_sets, paired_table
from cel_utils.scoring import ItemResults, encode_task, plain_evaluate
from cel_utils.tasks import Task


def _scipy_bootstrap(base, ablated, alpha, n_resamples=20000):
    """scipy's paired percentile bootstrap of mean(ablated - base): (ci_low, ci_high, the resampled means)."""
    r = bootstrap((base, ablated), lambda b, a, axis: np.mean(a - b, axis=axis), paired=True, vectorized=True,
                  n_resamples=n_resamples, method="percentile", confidence_level=1 - alpha,
                  rng=np.random.default_rng(123))
    return r.confidence_interval.low, r.confidence_interval.high, r.bootstrap_distribution


def test_paired_table_against_a_hand_computation_and_scipys_bootstrap():
    """Changes by hand; CIs and the accuracy p-value against scipy's paired percentile bootstrap (20000
    resamples) within the Monte Carlo error of the table's 2000 resamples. alpha = 0.1 so that a CI at the
    default level would not pass."""
    rng = np.random.default_rng(0)
    n, alpha = 80, 0.1
    b_correct = rng.random(n) < 0.5
    b_margin = rng.normal(0, 1, n)
    # three sets: a clear gain, a small gain, a loss (accuracy); margins shifted by +0.4, +0.1, -0.3 plus noise
    flips = [(0.35, 0.05), (0.2, 0.08), (0.02, 0.4)]            # (P(wrong -> right), P(right -> wrong))
    correct = np.array([np.where(b_correct, rng.random(n) >= pb, rng.random(n) < pf) for pf, pb in flips])
    margin = b_margin[None] + np.array([[0.4], [0.1], [-0.3]]) + rng.normal(0, 1, (3, n))
    names = ["gain", "small", "loss"]
    t = paired_table(names, ItemResults(b_correct[None], b_margin[None]), ItemResults(correct, margin), alpha=alpha)

    assert t["heads"].tolist() == names and (t["n_items"] == n).all()
    assert t["baseline_accuracy"].to_numpy() == pytest.approx(np.full(3, b_correct.mean()))
    assert t["accuracy"].to_numpy() == pytest.approx(correct.mean(1))
    d_acc = np.array([(c.astype(int) - b_correct.astype(int)).sum() / n for c in correct])
    assert t["delta_accuracy"].to_numpy() == pytest.approx(d_acc)
    assert d_acc[0] > 0.1 and d_acc[2] < -0.1          # the data have the gain and the loss they were made with
    assert t["mean_margin"].to_numpy() == pytest.approx(margin.mean(1))
    assert t["delta_margin"].to_numpy() == pytest.approx([np.mean(m - b_margin) for m in margin])
    for i in range(3):
        dists = {}
        for kind, base, abl, lo_col, hi_col, step in (
                ("accuracy", b_correct.astype(float), correct[i].astype(float), "ci_low", "ci_high", 1 / n),
                ("margin", b_margin, margin[i], "margin_ci_low", "margin_ci_high", 0)):
            lo, hi, dists[kind] = _scipy_bootstrap(base, abl, alpha)
            se = np.std(abl - base, ddof=1) / np.sqrt(n)
            tol = 0.2 * se + step       # Monte Carlo error of both bootstraps, and one grid step of a mean of 0/1s
            assert t[lo_col].iloc[i] == pytest.approx(lo, abs=tol), (names[i], lo_col)
            assert t[hi_col].iloc[i] == pytest.approx(hi, abs=tol), (names[i], hi_col)
        # the centred bootstrap p-value of the accuracy change, from scipy's resampled means
        dist, est = dists["accuracy"], d_acc[i]
        p = (np.sum(np.abs(dist - est) >= abs(est)) + 1) / (len(dist) + 1)
        assert t["p_value"].iloc[i] == pytest.approx(p, abs=0.03), names[i]
    assert 0.05 < t["p_value"].iloc[1] < 0.9    # a p-value in the range where a slip would show


def _mc_task(n=10):
    rng = random.Random(1)
    items = []
    for i in range(n):
        prompt = "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(5, 9))).strip() + ":"
        items.append({"prompt": prompt, "choices": [" x", " yz", " q"], "answer": i % 3})
    return Task(name="t_mc", kind="mc", items=items, split=None, seed=0, description="", metric="accuracy")


def test_compare_sets_against_separate_plain_loop_runs(tiny_llama):
    """Each named set's row equals a plain-loop run of that set alone; the baseline equals an unablated plain
    run; the table's changes are the differences of those runs; row(name) is that set's row."""
    lm, task = tiny_llama, _mc_task()
    sets = {"L0H1": [(0, 1)], "L2H3": [(2, 3)], "L1H0+L1H2": [(1, 0), (1, 2)]}
    cmp = compare_sets(lm, task, sets, result_cache=False)
    enc = encode_task(lm, task)
    base = plain_evaluate(lm, enc)
    runs = {k: plain_evaluate(lm, enc, heads) for k, heads in sets.items()}
    assert cmp.names == list(sets) == cmp.table["heads"].tolist()
    np.testing.assert_array_equal(cmp.baseline.correct, base.correct)
    np.testing.assert_allclose(cmp.baseline.margin, base.margin, atol=1e-4)
    for i, (k, r) in enumerate(runs.items()):
        np.testing.assert_array_equal(cmp.results.correct[i], r.correct[0])
        np.testing.assert_allclose(cmp.results.margin[i], r.margin[0], atol=1e-4)
        row = cmp.row(k)
        assert row["accuracy"] == pytest.approx(r.correct.mean())
        assert row["delta_accuracy"] == pytest.approx(r.correct.mean() - base.correct.mean())
        assert row["delta_margin"] == pytest.approx(r.margin.mean() - base.margin.mean(), abs=1e-5)
        assert row["baseline_accuracy"] == pytest.approx(base.correct.mean())
    # the sets differ from each other and from the baseline, so a row given to the wrong label shows
    dm = [runs[k].margin.mean() - base.margin.mean() for k in sets]
    assert min(abs(a - b) for i, a in enumerate(dm) for b in dm[i + 1:]) > 1e-3 and min(map(abs, dm)) > 1e-3
