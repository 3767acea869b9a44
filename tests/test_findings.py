"""The book's bottom line (cel_utils.findings) written from records built here: every number is the record's."""

import json

from cel_utils.findings import bottom_line
from cel_utils.records import Records


def test_the_bottom_line_reads_every_number_from_the_records(tmp_path):
    verdict = [{"model": "m", "task": "addition", "holds": True, "chosen": "L1H2", "heldout_delta": 0.185,
                "heldout_ci_low": 0.11, "heldout_ci_high": 0.26, "n_heldout": 200, "n_equals": 3, "baseline": 0.27,
                "pipeline_power": 0.58},
               {"model": "m", "task": "ioi", "holds": False, "chosen": None, "heldout_delta": None,
                "heldout_ci_low": None, "heldout_ci_high": None, "n_heldout": 200, "n_equals": 0, "baseline": 1.0,
                "pipeline_power": None}]
    oc = [{"truth": "capability", "capability": 0.93}, {"truth": "null", "capability": 0.01}]
    bat = {"model": "m", "task": "addition", "heads": "L1H2", "role": "chosen head", "label": "offset", "n": 267,
           "label_distribution": {"offset": 0.71}, "operating_characteristics": oc}
    (tmp_path / "01a_landscape.record.json").write_text(json.dumps({"verdict": verdict, "pairs": []}))
    (tmp_path / "01c_capability.record.json").write_text(json.dumps(
        {"batteries": [bat], "labels": [{"model": "m", "task": "addition", "heads": "L1H2", "role": "chosen head",
                                         "label": "offset"}]}))
    lines = bottom_line(Records(tmp_path))
    m = lines[0]
    assert "in 1 of its 2 tasks" in m and "L1H2 changes it by +0.185 [+0.110, +0.260] on 200 held-out items" in m
    assert "first of 3 confirmed heads" in m and "**offset** on 267 fresh items" in m and "71% of item" in m
    assert "gain 0.10 one 93% of the time and a null one 1%" in m
    assert "ioi: nothing localized, and no room to test: the baseline leaves 0.00 to gain" in m
    assert lines[1] == ("**On pairs with room** (confirm baseline in [0.2, 0.8]): m localizes a head in 1 of 1 "
                        "(pipeline power at 0.10: 0.58). Without room: m / ioi.")   # ioi's baseline 1.0 has none
    assert lines[2].startswith("**So:** 0 of the 1 heads")
