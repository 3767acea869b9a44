"""The course guide's session plans add up to the session length it announces."""

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "book" / "course_guide.md"


def test_each_session_fits_its_announced_length():
    text = GUIDE.read_text(encoding="utf-8")
    m = re.search(r"(\w+) sessions of about (\d+) minutes", text)
    count = ["two", "three", "four", "five", "six", "seven", "eight"].index(m.group(1).lower()) + 2
    length = int(m.group(2))
    sessions = re.split(r"^## Session \d+", text, flags=re.M)[1:]
    assert len(sessions) == count >= 4          # a two-week module: at least four sessions
    for s in sessions:
        minutes = [int(m) for m in re.findall(r"^\| (\d+) min \|", s.split("\n## ")[0], flags=re.M)]
        assert minutes and sum(minutes) == length, (minutes, length)


def test_every_chapter_has_a_session_and_exercises_exist():
    """Each chapter is taught in some session (1c included: it decides the book's answer), and every exercise
    the sessions name is one the notebooks define."""
    from cel_utils import book

    text = GUIDE.read_text(encoding="utf-8")
    sessions = "".join(re.split(r"^## Session \d+", text, flags=re.M)[1:])
    for chapter in book.CHAPTERS:
        assert f"chapters/{chapter}" in sessions, chapter
    labels = set()
    for nb in book.NOTEBOOKS.glob("*.ipynb"):
        labels |= set(re.findall(r":label: (ex-[\w-]+)", nb.read_text(encoding="utf-8")))
    named = set(re.findall(r"`(ex-[\w-]+)(?: <ex-[\w-]+>)?`", sessions))
    assert named and named <= labels, named - labels
    links = re.findall(r"\{ref\}`(ex-[\w-]+) <(ex-[\w-]+)>`", sessions)
    assert links and all(a == b for a, b in links)
    assert not re.findall(r"(?<!\{ref\})`ex-[\w-]+`", sessions), "an exercise named without a link"


def test_every_session_names_its_homework():
    """Issue 53: homework named per session, so its load can be estimated."""
    sessions = re.split(r"^## Session \d+", GUIDE.read_text(encoding="utf-8"), flags=re.M)[1:]
    assert all("**Homework**" in s.split("\n## ")[0] for s in sessions)


def test_every_session_has_a_handout_and_each_discussion_an_expected_answer():
    """Issue 53: handouts existed for sessions 1 and 6 only, and the 2b and 3a prompts had no expected answer."""
    notes = (GUIDE.parent / "instructor_notes.md").read_text(encoding="utf-8")
    text = GUIDE.read_text(encoding="utf-8")
    n = len(re.findall(r"^## Session \d+", text, flags=re.M))
    assert sorted(int(k) for k in re.findall(r"^### Handout: session (\d+),", notes, flags=re.M)) == list(range(1, n + 1))
    for k in range(1, n + 1):
        section = re.split(r"^## Session \d+", text, flags=re.M)[k].split("\n## ")[0]
        if "Discussion" in section or "debrief" in section:
            assert re.search(rf"^### Session {k} (discussion|debrief)", notes, flags=re.M), k


def test_the_live_parameters_are_each_chapters_own_and_their_times_measured():
    """Issue 53: homework at the live parameters (book/live_parameters.json). Each live parameter is one the
    chapter's parameters cell defines, of the same type (papermill would pass an unknown name through silently),
    and the course guide says how to run them."""
    import ast
    import json

    from cel_utils import book

    live = book.read_parameters(GUIDE.parent / "live_parameters.json")
    assert set(live) == set(book.expected_chapters())
    for chapter, params in live.items():
        cells = json.loads((book.NOTEBOOKS / f"{chapter}.ipynb").read_text())["cells"]
        src = next("".join(c["source"]) for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
        defaults = {t.id: ast.literal_eval(n.value) for n in ast.parse(src).body if isinstance(n, ast.Assign)
                    for t in n.targets}
        for name, value in params.items():
            assert name in defaults, (chapter, name)
            want = type(defaults[name])
            assert isinstance(value, want) or (want is float and isinstance(value, int)), (chapter, name, value)
    assert "--parameters book/live_parameters.json" in GUIDE.read_text(encoding="utf-8")
