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
    named = set(re.findall(r"`(ex-[\w-]+)`", sessions))
    assert named and named <= labels, named - labels
