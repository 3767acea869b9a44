"""The shared Design of a run (cel_utils.design): every Settings class extends it, and a bad value is one clear
error."""

import pytest

from cel_utils.design import Design
from cel_utils.errors import CELError


def test_every_settings_class_shares_the_design_fields():
    from dataclasses import fields

    from cel_utils.gates import GateSettings
    from cel_utils.joint import JointSettings
    from cel_utils.verdict import VerdictSettings

    shared = {f.name for f in fields(Design)}
    for cls in (VerdictSettings, JointSettings, GateSettings):
        assert shared <= {f.name for f in fields(cls)}, cls
        s = cls(seed=7, fdr=0.2)
        assert s.design() == Design(**{k: getattr(s, k) for k in shared}) and s.design().seed == 7


def test_a_bad_design_is_refused():
    for bad, msg in [(dict(fdr=0), "fdr must be positive"), (dict(alpha=1.0), "alpha between 0 and 1"),
                     (dict(max_k=0), "top_k and max_k must be at least 1"), (dict(n_boot=0), "n_boot")]:
        with pytest.raises(CELError, match=msg):
            Design().with_(**bad)
    assert Design().with_(fdr=1.01).fdr == 1.01   # above 1: every set that gains is confirmed (the tests use it)


def test_the_record_names_the_ablation_kind():
    from cel_utils.ablation import Ablation

    r = Design(mode=Ablation.of("scale", alpha=0.5), top_k=3).record()
    assert r["mode"] == "scale 0.5" and r["top_k"] == 3 and r["dtype"] is None   # a scale with its alpha
