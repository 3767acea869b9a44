"""Chapters 2a and 3 as sources: no cell shows the record or prints a run time, and their Markdown tables keep
their columns (no '|' inside maths)."""

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
