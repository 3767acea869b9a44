"""The label rule's operating characteristics (cel_utils.operating) on planted truths through the real label code,
at an addition-like pair's size and per-format baselines: a true capability of gain 0.10 is labelled one at
least 80% of the time, a null almost never."""

import numpy as np
import pytest
from scipy.stats import norm

from cel_utils.labels import Outcomes
from cel_utils.operating import operating_characteristics, plant, shift_for

ACCS = {"default": 0.27, "other demos (1)": 0.3, "other demos (2)": 0.25, "more demos": 0.4, "no demos": 0.0,
        "no spaces": 0.1, "instruction": 0.5, "separator": 0.2}   # addition's formats, roughly (SmolLM2)


def _addition_like(n=267, seed=0):
    rng = np.random.default_rng(seed)
    item = rng.normal(0, 1, n)
    m = {f: ((norm.ppf(a) * 1.5 if 0 < a < 1 else -6.0) + item + 1.1 * rng.normal(0, 1, n), None)
         for f, a in ACCS.items()}
    g0 = (m["default"][0] > 0).astype(float)
    return Outcomes.of(m, generation=(g0, g0))


@pytest.mark.parametrize("tau", [0.5, 1.5])
def test_the_rule_meets_its_operating_targets(tau):
    oc = operating_characteristics(_addition_like(), gain=0.10, tau=tau, n_sim=200, seed=1)
    assert oc.loc["capability", "capability"] >= 0.8
    assert oc.loc["null", "capability"] <= 0.05
    assert oc.loc["null", "format-specific"] <= 0.025   # only when chance shows a gain in the default format
    assert oc.loc["format-specific", "format-specific"] >= 0.8 and oc.loc["offset", "offset"] >= 0.7
    assert np.allclose(oc.drop(columns=["n", "gain", "tau", "n_sim"]).sum(axis=1), 1.0)


def test_planted_gains_are_the_gains_asked():
    """Each planted format gains ``gain`` in expected accuracy (an independent check of shift_for: the mean over
    many planted heads), and the null's noise changes no expected accuracy."""
    base = _addition_like()
    rng = np.random.default_rng(3)
    for truth, want in (("capability", 0.10), ("null", 0.0)):
        got = np.mean([[(o.margins[f][1] > 0).mean() - (o.margins[f][0] > 0).mean() for f in ("default", "more demos")]
                       for o in (plant(base, truth, 0.10, 1.0, rng) for _ in range(300))], axis=0)
        assert got == pytest.approx([want, want], abs=0.01), truth
    assert shift_for(np.array([-2.0, -1.0, 1.0]), 0.9, 0.5) > 0   # more than the room: the ceiling's shift


def test_each_label_gets_its_own_sets_noise():
    """The battery's operating characteristics take tau from the set being labelled (chapter 1c once simulated
    every label with the first set's noise: a stopped-early set's, inserted first)."""
    from cel_utils.battery import RobustSettings, pair_operating

    base = _addition_like()
    rng = np.random.default_rng(5)
    outs = {}
    for name, spread in (("stopped early", 0.1), ("chosen", 3.0)):
        m = {f: (b, b + rng.normal(0, spread, b.size)) for f, (b, _) in base.margins.items()}
        outs[name] = Outcomes(m, generation=base.generation)
    s = RobustSettings(oc_sims=40, seed=2)
    for name in outs:
        got = pair_operating(outs, s, name)
        a = outs[name].margins["default"]
        want = operating_characteristics(
            Outcomes({f: (b, b) for f, (b, _) in outs[name].margins.items()},
                     generation=(base.generation[0], base.generation[0])),
            tau=float(np.std(a[1] - a[0], ddof=1)), n_sim=40, seed=2)
        assert got["tau"].iloc[0] == pytest.approx(want["tau"].iloc[0])
        assert got.equals(want)
    assert pair_operating(outs, s, "chosen")["tau"].iloc[0] > 10 * pair_operating(outs, s, "stopped early")["tau"].iloc[0]
