"""The offline autograder of the "implement it yourself" exercises (``cel exercises``).

* :data:`EXERCISES` -- the registry: one :class:`Exercise` per checked exercise (its label, chapter, the function
  the learner writes, the public check the chapter calls, and held-back checks the chapter does not show). A
  chapter that adds a checked exercise adds one entry here.
* :func:`find_functions` -- a learner's functions from a notebook *without running it*: each code cell is parsed
  with :mod:`ast`; only its top-level imports and the ``def`` of the exercise functions are executed, in a fresh
  namespace. A cell that does not parse fails the exercises it defines (nothing else in it runs).
* :func:`grade` -- each exercise's public check, then its held-back checks, one :class:`Result` per exercise.

The held-back checks (:mod:`cel_utils.heldback`) use the same machinery as :mod:`cel_utils.checks` (the
library's functions as the reference) on inputs the public check does not use.

Example:
    >>> print(grade({"cells": []})[0].line())
    MISSING ex-ch1-hook my_ablate: the notebook has no top-level def my_ablate
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import heldback as held
from .checks import check_ablation, check_delta_accuracy, check_mcnemar, check_rates, check_screen
from .checks_numeric import (check_bh, check_direct, check_equal_rate_null, check_greedy, check_interaction,
                             check_kind, check_reading, check_threshold)
from .errors import CELError


# ---------------------------------------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Exercise:
    """One checked exercise: where it is, the function the learner writes, the chapter's public check and the
    held-back checks, each ``(what it adds, check(fn))``."""

    label: str
    chapter: str
    function: str
    signature: str
    check: Callable
    held_back: tuple[tuple[str, Callable], ...] = ()

    def line(self) -> str:
        """One line for ``cel exercises list``.

        Example:
            >>> print(EXERCISES[1].line())  # doctest: +NORMALIZE_WHITESPACE
            ex-ch1-mcnemar  01_screening  my_mcnemar(base, ablated) -> p-value
              check_mcnemar(my_mcnemar) + 1 held-back (other fixes and breaks counts, up to 1200 flips)
        """
        held = f" + {len(self.held_back)} held-back ({'; '.join(w for w, _ in self.held_back)})" if self.held_back \
            else ""
        return (f"{self.label:15s} {self.chapter:23s} {self.function}{self.signature}  "
                f"{self.check.__name__}({self.function}){held}")


EXERCISES: tuple[Exercise, ...] = (
    Exercise("ex-ch1-hook", "01_screening", "my_ablate", "(lm, input_ids, heads) -> logits", check_ablation,
             (("tiny qwen2, mistral, gpt2 and llama of other seeds", held.ablation_other_models),
              ("three heads of a layer, a whole layer, a head per layer, no head", held.ablation_other_sets))),
    Exercise("ex-ch1-mcnemar", "01_screening", "my_mcnemar", "(base, ablated) -> p-value", check_mcnemar,
             (("other fixes and breaks counts, up to 1200 flips", held.mcnemar_other_counts),)),
    Exercise("ex-ch1-manual", "01_screening", "my_delta_accuracy", "(lm, enc, heads) -> change in accuracy",
             check_delta_accuracy, (("tiny gpt2 with three-choice items, tiny gemma3 with other items", held.delta_other_models),)),
    Exercise("ex-ch1a-bh", "01a_landscape", "my_bh", "(p) -> q-values", check_bh,
             (("unsorted p-values of other sizes, zeros and ones", held.bh_other_sizes),)),
    Exercise("ex-ch1b-loop", "01b_screening_at_scale", "my_screen", "(lm, task, heads) -> table", check_screen,
             (("tiny gpt2 with three-choice items, tiny gemma3 with other items", held.screen_other_models),)),
    Exercise("ex-ch2-forward", "02_joint_search", "my_greedy", "(pool, score, max_size) -> path", check_greedy,
             (("heads as (layer, head) with a tie, max_size below the pool", held.greedy_other_pools),)),
    Exercise("ex-ch2-interaction", "02_joint_search", "my_interaction", "(base, joint, singles) -> interaction",
             check_interaction, (("sets of three and four heads, margins as lists", held.interaction_other_sets),)),
    Exercise("ex-ch1c-reading", "01c_capability", "my_reading", "(d, above) -> reading", check_reading,
             (("other items, thresholds other than 0", held.reading_other_items),)),
    Exercise("ex-ch2a-frozen", "02a_mechanism", "my_direct", "(outs, scale, gamma, w_diff) -> contributions",
             check_direct, (("a residual with a component not in outs", held.direct_other_shapes),)),
    Exercise("ex-ch3-derive", "03_theory", "my_rates", "(setup, lr) -> dict of rates", check_rates,
             (("set-ups with correlated distractors and other m", held.rates_other_setups),)),
    Exercise("ex-ch3-threshold", "03_theory", "my_threshold", "(setup) -> B's C-correlation", check_threshold,
             (("distractors correlated with A, m = 60, A's C-correlation 0.7", held.threshold_other_setups),)),
    Exercise("ex-ch2b-null", "02b_remove_scale_boost", "my_equal_rate_null", "(fixes, n_wrong) -> share",
             check_equal_rate_null, (("fixes as a list, a head fixing all, one item in many, twelve heads", held.null_other_counts),)),
    Exercise("ex-ch3a-kind", "03a_conflict_or_noise", "my_kind", "(gain_a, change_b, eps) -> kinds", check_kind,
             (("eps of 0 and of 0.1, changes at the edge", held.kind_other_eps),)),
)


# The exercises without a check, and why none: their answer is an argument (``discussion``), a comparison the
# solution prints beside the chapter's own number, equal when right (``compare``), or a reading of a run at other
# settings (``explore``). An exercise whose answer is code or a number the chapter does not print has a check.
UNCHECKED_KINDS = {"discussion": "the answer is an argument; the instructor notes give the expected answer",
                   "compare": "the solution prints the learner's number beside the chapter's own: equal when right",
                   "explore": "a run at other settings, read and discussed"}
UNCHECKED: dict[str, str] = {
    "ex-ch1-mean": "explore", "ex-ch1a-bias": "explore", "ex-ch1a-rule": "discussion", "ex-ch1b-engine": "compare",
    "ex-ch1b-gradient": "explore", "ex-ch1c-format": "explore", "ex-ch1c-offset": "discussion",
    "ex-ch2-greedy": "compare", "ex-ch2-random": "discussion", "ex-ch2-gates": "explore", "ex-ch2a-share": "explore",
    "ex-ch2a-direct": "compare", "ex-ch2b-grid": "explore", "ex-ch3-flip": "explore", "ex-ch3-rates": "explore",
    "ex-ch3a-gate": "explore", "ex-ch3a-net": "explore"}


def unchecked_lines() -> list[str]:
    """One line per exercise without a check: its label, its kind and what that kind means.

    Example:
        >>> unchecked_lines()[0]
        'ex-ch1-mean     not checked: explore (a run at other settings, read and discussed)'
    """
    return [f"{label:<15} not checked: {kind} ({UNCHECKED_KINDS[kind]})" for label, kind in UNCHECKED.items()]


# ---------------------------------------------------------------------------------------------------------
# finding the learner's functions without running the notebook
# ---------------------------------------------------------------------------------------------------------
def load_notebook(path) -> dict:
    """A notebook file as a dict, or a :class:`CELError` naming what is wrong with ``path``.

    Example:
        >>> load_notebook("no_such_file.ipynb")
        Traceback (most recent call last):
        ...
        cel_utils.errors.CELError: cannot read no_such_file.ipynb: no such file
    """
    p = Path(path)
    if not p.exists():
        raise CELError(f"cannot read {path}: no such file")
    if not p.is_file():
        raise CELError(f"cannot read {path}: it is not a file")
    try:
        nb = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CELError(f"{path} is not a notebook: not JSON ({type(e).__name__})") from None
    if not (isinstance(nb, dict) and isinstance(nb.get("cells"), list)
            and all(isinstance(c, dict) for c in nb["cells"])):
        raise CELError(f"{path} is not a notebook: no list of cells (an nbformat 4 .ipynb file is expected)")
    return nb


MAGIC = re.compile(r"^([ \t]*)[%!].*$", re.M)
DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)", re.M)


def _python(source: str) -> str:
    """A code cell's source as Python: a cell magic (``%%time``) makes the whole cell not Python; a line magic or
    shell line (``%pip``, ``!ls``) becomes ``pass`` at its indentation (so line numbers stay the cell's)."""
    if source.lstrip().startswith("%%"):
        return ""
    return MAGIC.sub(lambda m: m.group(1) + "pass", source)


@dataclass
class Found:
    """The namespace the kept statements ran in, and per exercise function found: ``"ok"`` or why it failed
    (a syntax error in its cell, an error while defining it)."""

    namespace: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)
    failed_imports: list = field(default_factory=list)


def _is_helper(node) -> str | None:
    """The name a top-level statement defines when it can be a helper of an exercise: a ``def`` or ``class``, or
    a constant (``NAME = <literal>``); None otherwise (nothing else in a notebook is run)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        try:
            ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        return node.targets[0].id
    return None


def _needed(defs: dict, names: set) -> set:
    """The top-level helpers the exercise functions reach, directly or through other helpers."""
    need, todo = set(), [n for n in names if n in defs]
    while todo:
        name = todo.pop()
        if name in need:
            continue
        need.add(name)
        todo += [x.id for x in ast.walk(defs[name][1]) if isinstance(x, ast.Name) and x.id in defs and x.id not in need]
    return need


def find_functions(nb: dict, names) -> Found:
    """Run only the top-level imports, the ``def`` of the functions ``names`` of notebook ``nb``'s code cells and
    the top-level helpers they call (a ``def``, a ``class`` or a literal constant they name, and those helpers'
    own), in order, in a fresh namespace. The last definition of a name wins; a cell that does not parse fails
    the names it defines.

    Example:
        >>> cell = "import math\\nx = 1 / 0\\nK = 2\\ndef root(a):\\n    return math.sqrt(a) * K\\ndef my_f(a):\\n    return root(a)"
        >>> nb = {"cells": [{"cell_type": "code", "source": cell},
        ...                 {"cell_type": "code", "source": "def my_g(:\\n    pass"}]}
        >>> found = find_functions(nb, ["my_f", "my_g", "my_h"])   # x = 1 / 0 never runs
        >>> found.namespace["my_f"](4.0), found.status["my_g"]
        (4.0, 'SyntaxError in cell 2, line 1: invalid syntax')
    """
    names = set(names)
    body, status, defs = [], {}, {}
    for i, cell in enumerate(nb.get("cells", []), 1):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = _python("".join(src) if isinstance(src, list) else str(src))
        try:
            tree = ast.parse(src, filename=f"<cell {i}>")
        except SyntaxError as e:
            for name in set(DEF.findall(src)) & names:
                status[name] = f"SyntaxError in cell {i}, line {e.lineno}: {e.msg}"
            continue
        for node in tree.body:
            body.append((i, node))
            name = _is_helper(node)
            if name is not None:
                defs[name] = (i, node)   # the last definition wins, as when the notebook runs
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name in names:
                    status[name] = "ok"
    need = _needed(defs, {n for n in names if status.get(n) == "ok"})
    kept = [(i, node) for i, node in body if isinstance(node, (ast.Import, ast.ImportFrom))
            or (_is_helper(node) in need)]
    found = Found(namespace={"__name__": "__cel_exercise__"}, status=status)
    out = io.StringIO()
    for i, node in kept:
        code = compile(ast.Module(body=[node], type_ignores=[]), f"<cell {i}>", "exec")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                exec(code, found.namespace)  # noqa: S102 (an import or a def: the point of the grader)
        except (Exception, SystemExit) as e:  # noqa: BLE001 (whatever the learner's line raises)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                if status.get(node.name) == "ok":
                    status[node.name] = f"defining it raised {_error(e)}"
            elif not isinstance(node, (ast.Import, ast.ImportFrom)):
                found.failed_imports.append(f"helper {_is_helper(node)} (cell {i}): {type(e).__name__}")
            else:
                found.failed_imports.append(f"{ast.unparse(node)} (cell {i}): {type(e).__name__}")
    return found


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _error(e: BaseException) -> str:
    """``Type: message (cell N, line L)``, at the learner's innermost frame when there is one."""
    cells = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith("<cell ")]
    where = f" ({cells[-1].filename[1:-1]}, line {cells[-1].lineno})" if cells else ""
    msg = _first_line(e)
    return f"{type(e).__name__}{': ' + msg if msg else ''}{where}"


# ---------------------------------------------------------------------------------------------------------
# grading
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Result:
    """One exercise's outcome: ``PASS``, ``FAIL`` or ``MISSING``; ``stage`` says which check failed
    (``public``, ``held-back``, ``definition``)."""

    exercise: Exercise
    outcome: str
    message: str = ""
    stage: str = ""

    def line(self) -> str:
        head = f"{self.outcome} {self.exercise.label} {self.exercise.function}"
        return f"{head}: {self.message}" if self.message else head


@contextlib.contextmanager
def _quiet_one_thread():
    """Checks print a line when they pass (not wanted here); tiny models run fastest on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            yield
    finally:
        torch.set_num_threads(before)


def _run_check(check: Callable, fn: Callable, found: Found) -> str | None:
    """None when ``check(fn)`` passes; else the first line of what it raised."""
    try:
        with _quiet_one_thread():
            check(fn)
    except AssertionError as e:
        return _first_line(e) or _error(e)
    except (Exception, SystemExit) as e:  # noqa: BLE001 (the learner's function raised)
        msg = _error(e)
        if isinstance(e, NameError):
            msg += ("; the grader runs only the notebook's imports, the exercise functions' defs and the top-level "
                    "defs, classes and literal constants they name: compute other values inside the function")
            if found.failed_imports:
                msg += f" (failed imports: {', '.join(found.failed_imports)})"
        return msg
    return None


def grade(nb: dict, exercises=EXERCISES) -> list[Result]:
    """Grade notebook ``nb`` (a dict, as :func:`load_notebook` returns): per exercise, ``MISSING`` when it does
    not define the function, else its public check and then each held-back check, stopping at the first failure.

    Example:
        >>> nb = {"cells": [{"cell_type": "code", "source": "def my_mcnemar(base, ablated):\\n    return 0.5"}]}
        >>> print(grade(nb, EXERCISES[1:2])[0].line().split(": your")[0])
        FAIL ex-ch1-mcnemar my_mcnemar: 5 fixes, 0 breaks, 15 unchanged items
    """
    found = find_functions(nb, [e.function for e in exercises])
    results = []
    for ex in exercises:
        state = found.status.get(ex.function)
        if state is None:
            results.append(Result(ex, "MISSING", f"the notebook has no top-level def {ex.function}"))
            continue
        if state != "ok":
            results.append(Result(ex, "FAIL", state, "definition"))
            continue
        fn = found.namespace[ex.function]
        failure = _run_check(ex.check, fn, found)
        if failure is not None:
            results.append(Result(ex, "FAIL", failure, "public"))
            continue
        for what, check in ex.held_back:
            failure = _run_check(check, fn, found)
            if failure is not None:
                results.append(Result(ex, "FAIL", f"held-back check ({what}): {failure}", "held-back"))
                break
        else:
            results.append(Result(ex, "PASS"))
    return results


def chapter_exercises(nb: dict, path=None, chapter: str | None = None) -> tuple[Exercise, ...]:
    """The exercises to grade: those of ``chapter`` (a chapter's file stem, e.g. ``01_screening``; ``"all"``: every
    one), else those whose labels the notebook's markdown carries, else those of the chapter the file is named
    after, else every one.

    Example:
        >>> [e.label for e in chapter_exercises({"cells": []}, "03_theory.ipynb")]
        ['ex-ch3-derive', 'ex-ch3-threshold']
    """
    chapters = sorted({e.chapter for e in EXERCISES})
    if chapter == "all":
        return EXERCISES
    if chapter is not None:
        if chapter not in chapters:
            raise CELError(f"no checked exercise in chapter {chapter!r}; chapters with one: {', '.join(chapters)}")
        return tuple(e for e in EXERCISES if e.chapter == chapter)
    text = "".join("".join(c.get("source", "")) for c in nb.get("cells", []) if c.get("cell_type") == "markdown")
    by_label = tuple(e for e in EXERCISES if re.search(rf"\b{re.escape(e.label)}\b", text))
    if by_label:
        return tuple(e for e in EXERCISES if e.chapter in {x.chapter for x in by_label})
    stem = Path(path).stem if path is not None else ""
    return tuple(e for e in EXERCISES if e.chapter == stem) or EXERCISES


def grade_file(path, chapter: str | None = None) -> list[Result]:
    """:func:`grade` of the notebook file ``path`` on its chapter's exercises (:func:`chapter_exercises`); a
    :class:`CELError` for a missing or non-notebook file or an unknown chapter."""
    nb = load_notebook(path)
    return grade(nb, chapter_exercises(nb, path, chapter))
