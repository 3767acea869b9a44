"""The course guide's session plans add up to the session length it announces."""

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "book" / "course_guide.md"


def test_each_session_fits_its_announced_length():
    text = GUIDE.read_text(encoding="utf-8")
    length = int(re.search(r"sessions of about (\d+) minutes", text).group(1))
    sessions = re.split(r"^## Session \d+", text, flags=re.M)[1:]
    assert len(sessions) == 2
    for s in sessions:
        minutes = [int(m) for m in re.findall(r"^\| (\d+) min \|", s.split("\n## ")[0], flags=re.M)]
        assert minutes and sum(minutes) == length, (minutes, length)
