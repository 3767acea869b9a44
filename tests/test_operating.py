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


def _gemma_like(n=200, seed=0, drift=0.1):
    """Gemma sentiment_1shot's shape: every error in one class (class accuracies about 0.3 and 1.0), and a real
    null head whose removal lowers the other class's margins a little (significantly, on 100 items)."""
    rng = np.random.default_rng(seed)
    signs = np.where(np.arange(n) % 2 == 0, 1, -1)
    item = rng.normal(0, 1, n)
    m = {}
    for f in ("default", "a", "b", "c", "d"):
        b = np.where(signs == 1, -0.5, 4.0) + item + 0.5 * rng.normal(0, 1, n)
        m[f] = (b, b + 0.3 * rng.normal(0, 1, n) - drift * (signs == -1))
    g0 = (m["default"][0] > 0).astype(float)
    kinds = {k: m["default"][1] + 0.05 * rng.normal(0, 1, n) for k in ("mean", "resample")}
    return Outcomes(m, kinds, (g0, g0.copy()), signs, rng.normal(0, 0.005, 20), False)


def test_fixes_concentrated_in_one_class_are_not_a_label_shift():
    """Issue 50: planting +0.10 of genuine fixes into a null head's outcomes on a task whose errors sit in one class
    was labelled 'label shift' in 90-100% of draws. Now the semi-synthetic capability is labelled a capability
    (or 'shift or capability' where the items cannot separate them), a planted shift a label shift."""
    from cel_utils.labels import checks, label
    from cel_utils.operating import SEMI, plant_fixes

    real = _gemma_like()
    right = real.margins["default"][0] > 0
    assert right[real.signs == -1].mean() == 1.0 and right[real.signs == 1].mean() < 0.4
    rng = np.random.default_rng(1)
    draws = [plant_fixes(real, 0.10, rng, real.nll) for _ in range(100)]
    for o in draws[:5]:    # the fixes: 20 items, all in class +1, each wrong before and right after
        b, a = o.margins["default"]
        fixed = (a > 0) & ~(real.margins["default"][1] > 0)
        assert fixed.sum() == 20 and set(real.signs[fixed]) == {1}
    got = [label(checks(o)) for o in draws]
    assert got.count("label shift") <= 5 and got.count("capability") >= 80
    base = Outcomes({f: (b, b) for f, (b, _) in real.margins.items()}, generation=(real.generation[0],) * 2,
                    signs=real.signs, nll=real.nll)
    oc = operating_characteristics(base, tau=0.5, n_sim=100, seed=3, real=real)
    assert oc.loc[SEMI, "capability"] >= 0.8 and oc.loc[SEMI, "label shift"] <= 0.05
    assert oc.loc["label shift", "label shift"] >= 0.8 and oc.loc["null", "label shift"] <= 0.05
    assert "label shift" not in operating_characteristics(_addition_like(), n_sim=5).index   # no classes


def test_a_planted_label_shift_gains_what_is_asked():
    from cel_utils.operating import plant

    base = _gemma_like()
    base = Outcomes({f: (b, b) for f, (b, _) in base.margins.items()}, signs=base.signs)
    rng = np.random.default_rng(2)
    got = np.mean([(o.margins["default"][1] > 0).mean() - (o.margins["default"][0] > 0).mean()
                   for o in (plant(base, "label shift", 0.10, 0.5, rng) for _ in range(300))])
    assert got == pytest.approx(0.10, abs=0.01)


def test_the_summary_says_the_rule_misses_where_either_capability_row_does():
    import pandas as pd

    from cel_utils.operating import SEMI, summary

    cols = {"capability": 0.0, "format-specific": 0.0, "label shift": 0.0, "shift or capability": 0.0, "n": 200,
            "gain": 0.1}
    rows = {"capability": 0.95, SEMI: 0.6, "label shift": 0.0, "null": 0.01}
    oc = pd.DataFrame([dict(cols, truth=t, capability=p) for t, p in rows.items()]).set_index("truth")
    oc.loc["label shift", "label shift"] = 0.9
    line = summary(oc, "m / t")
    assert "misses the book's targets here (P(capability | capability (semi-synthetic)) = 0.60)" in line
    assert "a planted label shift is labelled one 90% of the time" in line
    oc.loc[SEMI, "capability"] = 0.85
    assert summary(oc, "m / t").endswith("The rule meets the book's targets here.")
