"""A whole folder of submissions graded at once (``cel exercises check FOLDER --summary FILE``): one row per
student and exercise, written as CSV or JSON for an instructor's spreadsheet or script.

Every ``.ipynb`` under the folder is one submission (checkpoints skipped); the student is its first path part
below the folder (``alice/01_screening.ipynb`` -> ``alice``; a notebook directly in the folder: its file stem).
Each notebook is graded on its own chapter's exercises (:func:`cel_utils.exercises.grade_file`); a file that is not
a notebook gives one ``FAIL`` row with stage ``file``, and grading goes on.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "bob").mkdir()
    >>> _ = (d / "bob" / "01_screening.ipynb").write_text('{"cells": [], "nbformat": 4, "nbformat_minor": 5}')
    >>> t = grade_folder(d)
    >>> sorted(set(t.student)), sorted(set(t.outcome))
    (['bob'], ['MISSING'])
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .errors import CELError
from .exercises import grade_file
from .io import write_json_atomic, write_text_atomic

COLUMNS = ["student", "notebook", "chapter", "exercise", "function", "outcome", "stage", "message"]


def submissions(folder) -> list[Path]:
    """Every notebook under ``folder`` (sorted; ``.ipynb_checkpoints`` skipped); a :class:`CELError` when there
    is none."""
    root = Path(folder)
    found = sorted(p for p in root.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not found:
        raise CELError(f"no notebook (.ipynb) under {root}")
    return found


def grade_folder(folder, chapter: str | None = None) -> pd.DataFrame:
    """One row per (submission, exercise) of every notebook under ``folder`` (:data:`COLUMNS`)."""
    root = Path(folder)
    rows = []
    for nb in submissions(root):
        rel = nb.relative_to(root)
        student = rel.parts[0] if len(rel.parts) > 1 else nb.stem
        try:
            results = grade_file(nb, chapter)
        except CELError as e:
            rows.append({"student": student, "notebook": str(rel), "chapter": None, "exercise": None,
                         "function": None, "outcome": "FAIL", "stage": "file", "message": str(e)})
            continue
        rows += [{"student": student, "notebook": str(rel), "chapter": r.exercise.chapter,
                  "exercise": r.exercise.label, "function": r.exercise.function, "outcome": r.outcome,
                  "stage": r.stage, "message": r.message} for r in results]
    return pd.DataFrame(rows, columns=COLUMNS)


def write_summary(table: pd.DataFrame, path) -> None:
    """``table`` to ``path``: CSV for ``.csv``, JSON (a list of rows) for ``.json``; written whole or not at all."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        write_text_atomic(path, table.to_csv(index=False))
    elif suffix == ".json":
        write_json_atomic(path, table.to_dict("records"))
    else:
        raise CELError(f"--summary takes a .csv or .json file, got {path}")
