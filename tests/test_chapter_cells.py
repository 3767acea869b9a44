"""Chapters as sources: in 2a and 3 no cell shows the record or prints a run time, and their Markdown tables keep
their columns (no '|' inside maths); chapter 1c's choice of head sets (battery.pick_sets), run on hand-made
records."""

import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _code_cells(name):
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("name", ["02a_mechanism", "03_theory"])
def test_chapter_cells_show_no_record_and_no_run_time(name):
    """A cell whose last line is a call to ``record`` would show the record (a raw dict of hundreds of lines);
    no cell prints a run time (they belong on the status page)."""
    for src in _code_cells(name):
        tree = ast.parse("\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))))
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
            f = last.value.func
            assert getattr(f, "id", getattr(f, "attr", None)) != "record" or src.rstrip().endswith(";"), src[:80]
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("print", "display", "Markdown"):
                shown = ast.unparse(node)
                assert not any(w in shown for w in ("seconds", "t_start", "time.time")), shown


@pytest.mark.parametrize("name", ["02a_mechanism", "03_theory"])
def test_markdown_table_rows_keep_their_maths_in_one_cell(name):
    """A '|' inside $...$ in a Markdown table row splits the row: each cell must hold whole maths spans."""
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    rows = [line for c in nb["cells"] if c["cell_type"] == "markdown"
            for line in "".join(c["source"]).splitlines() if line.startswith("|")]
    assert rows or name != "03_theory"
    for row in rows:
        cells = row.strip().strip("|").split("|")
        assert all(cell.replace("\\$", "").count("$") % 2 == 0 for cell in cells), row


def _picks(land, joint, tmp_path, battery_pairs=1, cost=None):
    """Chapter 1c's choice of head sets for the battery (``battery.pick_sets``, the call the chapter makes), on the
    given records (no model; ``cost``: each task's screen cost, standing in for ``screen_work``)."""
    from unittest import mock

    from cel_utils import battery
    from cel_utils.records import Records

    for name, r in (("01a_landscape", land), ("02_joint_search", joint)):
        (tmp_path / f"{name}.record.json").write_text(json.dumps(r))
    with mock.patch.object(battery, "load_model", lambda m: m), \
            mock.patch.object(battery, "load_task", lambda t, *a, **k: t), \
            mock.patch.object(battery, "screen_work", lambda lm, task: (cost or {}).get(task, 0.0)):
        t, _, _ = battery.pick_sets(Records(tmp_path), battery_pairs=battery_pairs, other_confirmed=10,
                                    random_heads=2, n_search=6, seed=0)
    return [tuple(p) for p in t.itertuples(index=False)]


def test_capability_chapter_picks_the_learned_gates_set(tmp_path):
    """Chapter 1c puts the set chapter 2's learned gates chose through the battery, as its own role, unless it
    is already there as the chosen head or chapter 2's chosen set."""
    pair = {"model": "m", "task": "addition", "screened_heads": ["L1H1", "L2H2", "L3H3", "L4H4"],
            "delta_margin": [0.4, 0.3, 0.2, 0.1], "confirmed": ["L1H1", "L2H2"],
            "delta_accuracy": [0.0] * 4,
            "sets": [{"heads": "L1H1", "offered": True, "confirm_delta_accuracy": 0.1},
                     {"heads": "L2H2", "offered": True, "confirm_delta_accuracy": 0.05}]}
    land = {"verdict": [{"model": "m", "task": "addition", "holds": True, "chosen": "L1H1"}], "pairs": [pair]}
    joint = {"pairs": [{"model": "m", "task": "addition", "chosen": "L1H1+L2H2"}],
             "selectors": {"pairs": [{"model": "m", "task": "addition", "gates": {"chosen": "L1H1+L4H4"}}]}}
    roles = {role: heads for _, _, role, heads in _picks(land, joint, tmp_path)}
    assert roles["learned gates' set (chapter 2)"] == "L1H1+L4H4"
    assert roles["chosen set (chapter 2)"] == "L1H1+L2H2" and roles["chosen head"] == "L1H1"
    for same in ("L1H1", "L1H1+L2H2", None):   # already tested under another role, or nothing chosen
        joint["selectors"]["pairs"][0]["gates"]["chosen"] = same
        assert "learned gates' set (chapter 2)" not in {p[2] for p in _picks(land, joint, tmp_path)}
    del joint["selectors"]   # a chapter-2 record from before the section
    assert "learned gates' set (chapter 2)" not in {p[2] for p in _picks(land, joint, tmp_path)}


def test_capability_chapter_takes_battery_pairs_per_model_in_calibration_order(tmp_path):
    """Two localized pairs of one model: with battery_pairs = 1 only one goes through the battery, chapter 2's
    pair first, else the one whose screen costs least (ties: chapter 1a's order); with 2 both do."""
    def pair(task):
        return {"model": "m", "task": task, "screened_heads": ["L1H1", "L2H2", "L3H3"], "delta_margin": [0.4, 0.3, 0.2],
                "confirmed": ["L1H1"], "delta_accuracy": [0.0] * 3,
                "sets": [{"heads": "L1H1", "offered": True, "confirm_delta_accuracy": 0.1}]}
    land = {"verdict": [{"model": "m", "task": t, "holds": True, "chosen": "L1H1"} for t in ("comparison", "addition")],
            "pairs": [pair("comparison"), pair("addition")]}
    assert {p[1] for p in _picks(land, {}, tmp_path)} == {"comparison"}
    assert {p[1] for p in _picks(land, {}, tmp_path, battery_pairs=2)} == {"comparison", "addition"}
    assert {p[1] for p in _picks(land, {}, tmp_path, cost={"comparison": 2.0, "addition": 1.0})} == {"addition"}
    ran = {"tasks": {"m": ["comparison"]}}   # chapter 2 searched comparison: it goes first, whatever it costs
    assert {p[1] for p in _picks(land, ran, tmp_path, cost={"comparison": 2.0, "addition": 1.0})} == {"comparison"}


def test_joint_chapter_takes_its_tasks_from_the_calibration(tmp_path):
    """Chapter 2's default tasks (Records.tasks_for) are each model's first task of chapter 1a's calibration, or
    the localized one whose screen costs least, and its cost tasks all of them (read from 1a's record); a
    dictionary is used as given; a model 1a calibrated nothing for is a clear error naming it; without 1a's record
    the error names the chapter to run. The chapters 1b and 2 call it in their set-up cells."""
    from cel_utils.records import Records

    def setup(cost=None, models=("m1", "m2"), tasks="calibrated"):
        rec = Records(tmp_path)
        price = (lambda m, t: (cost or {}).get(t, 0.0))
        return rec.tasks_for(list(models), tasks, cost=price), rec.tasks_for(list(models), "calibrated", every=True)

    with pytest.raises(FileNotFoundError, match="run 01a_landscape first"):
        setup(models=["m1"])
    rec = {"tasks": {"m1": ["a", "b"], "m2": ["c"]}, "verdict": []}
    (tmp_path / "01a_landscape.record.json").write_text(json.dumps(rec))
    tasks, cost_tasks = setup()   # nothing localized: each model's first calibrated task
    assert tasks == {"m1": ["a"], "m2": ["c"]} and cost_tasks == {"m1": ["a", "b"], "m2": ["c"]}
    assert Records(tmp_path).tasks_for(["m1", "m2"], "calibrated") == {"m1": ["a"], "m2": ["c"]}
    rec["verdict"] = [{"model": "m1", "task": t, "holds": True} for t in ("a", "b")]
    (tmp_path / "01a_landscape.record.json").write_text(json.dumps(rec))
    assert setup(cost={"a": 2.0, "b": 1.0})[0] == {"m1": ["b"], "m2": ["c"]}   # localized: the cheapest screen
    rec["verdict"][1]["holds"] = False
    (tmp_path / "01a_landscape.record.json").write_text(json.dumps(rec))
    assert setup(cost={"a": 2.0, "b": 1.0}, models=["m1"])[0] == {"m1": ["a"]}
    assert setup(models=["m1"], tasks={"m1": ["x"]})[0] == {"m1": ["x"]}
    assert setup(models=["m1"], tasks={"m1": "x"})[0] == {"m1": ["x"]}
    with pytest.raises(ValueError, match="calibrated no task with room for m3"):
        setup(models=["m1", "m3"])
    with pytest.raises(ValueError, match='must be "calibrated" or a dictionary'):
        setup(models=["m1"], tasks="agreement")
