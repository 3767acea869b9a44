"""The one reader of the chapters' records (cel_utils.records) on records written here: a pair's re-tested and
held-out sets, its search order, the parameters a chapter ran with, the chosen sets of chapter 2."""

import json

import pytest

from cel_utils.records import Pair, Records


def _write(tmp_path, name, rec):
    (tmp_path / f"{name}.record.json").write_text(json.dumps(rec))


PAIR = {"model": "m", "task": "t", "screened_heads": ["L0H0", "L0H1", "L1H0"], "delta_margin": [0.1, 0.5, 0.3],
        "delta_accuracy": [0.0, 0.1, 0.05], "confirmed": ["L0H1", "L1H0"], "chosen": "L0H1",
        "sets": [{"heads": "L0H1", "offered": True, "confirmed": True, "confirm_delta_accuracy": 0.2,
                  "heldout_p_holm": 0.01, "holds": True},
                 {"heads": "L1H0", "offered": True, "confirmed": True, "confirm_delta_accuracy": 0.1,
                  "heldout_p_holm": 0.2, "holds": False},
                 {"heads": "L0H0", "offered": True, "confirmed": False, "confirm_delta_accuracy": 0.0,
                  "heldout_p_holm": None, "holds": False},
                 {"heads": "L0H1+L1H0", "offered": False, "confirmed": False, "heldout_p_holm": 0.02,
                  "holds": True}]}


def test_a_pair_reads_its_sets(tmp_path):
    p = Pair(PAIR)
    assert p.confirm_rows()["heads"].tolist() == ["L0H1", "L1H0", "L0H0"]
    assert p.heldout_rows()["heads"].tolist() == ["L0H1", "L1H0", "L0H1+L1H0"]
    assert p.confirm_gain("L1H0") == 0.1 and p.confirm_gain("L9H9") == 0.0
    assert p.search_order() == ["L0H1", "L1H0", "L0H0"]


def test_records_read_each_chapter_and_its_parameters(tmp_path):
    _write(tmp_path, "01a_landscape", {"pairs": [PAIR], "verdict": [{"model": "m", "task": "t", "holds": True}],
                                       "parameters": {"n_heldout": 40}})
    _write(tmp_path, "02_joint_search", {"pairs": [{"model": "m", "task": "t", "chosen": "L0H1+L1H0"}],
                                         "selectors": {"pairs": [{"model": "m", "task": "t",
                                                                  "gates": {"chosen": "L1H0", "sets": []}}]},
                                         "parameters": {"selector_max_k": 10}})
    r = Records(tmp_path)
    assert "01a_landscape" in r and "01c_capability" not in r
    assert r.n_heldout() == 40 and r.param("02_joint_search", "selector_max_k") == 10
    assert r.pair("m", "t").chosen == "L0H1" and r.pair("m", "x") is None
    assert r.joint_chosen("m", "t") == "L0H1+L1H0" and r.gates_chosen("m", "t") == "L1H0"
    assert r.landscape()["head"].tolist() == PAIR["screened_heads"] and r.confirmed() == {("m", "t"): PAIR["confirmed"]}
    assert r.labels().empty and r.label_of("m", "t", "L0H1") is None
    with pytest.raises(FileNotFoundError, match="run 01c_capability first"):
        r.require("01c_capability", "why")
