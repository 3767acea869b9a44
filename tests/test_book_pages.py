"""The built book (``built`` fixture of conftest.py): it builds with warnings as errors and requests nothing
from outside itself; every chapter page has its figures and is clean; the execution status page is complete."""

import re
from html.parser import HTMLParser

import pytest

from cel_utils import book, lockfile

pytestmark = pytest.mark.notebook


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs = []

    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        for key in ("src", "href", "data"):
            if key in d and d[key] and tag in ("script", "link", "img", "iframe", "embed", "object", "source"):
                self.refs.append((tag, d[key]))


def test_book_builds_offline(built):
    pages = [p for p in built.rglob("*.html") if "_static" not in p.parts]
    assert len(pages) >= 5
    for p in pages:
        parser = _Refs()
        parser.feed(p.read_text(encoding="utf-8"))
        external = [r for r in parser.refs if re.match(r"^(https?:)?//", r[1])]
        assert not external, f"{p.name} requests {external}"
        text = p.read_text(encoding="utf-8")
        assert "cdn.jsdelivr" not in text and "cdnjs" not in text
        assert "unpkg.com" not in text and "THEBE_JS_URL" not in text   # not even an unused script reference
    assert (built / "_static" / "vendor" / "plotly.min.js").exists()
    assert (built / "_static" / "vendor" / "mathjax" / "tex-chtml.js").exists()


@pytest.mark.parametrize("chapter,min_figs", [("01_screening", 4), ("01a_landscape", 6), ("01b_screening_at_scale", 1),
                                              ("02_joint_search", 6), ("02a_mechanism", 4),
                                              ("02b_remove_scale_boost", 3), ("03_theory", 4),
                                              ("03a_conflict_or_noise", 2)])
def test_figures_in_html(built, chapter, min_figs):
    html = (built / "book" / "chapters" / f"{chapter}.html").read_text(encoding="utf-8")
    assert html.count("Plotly.newPlot") >= min_figs
    assert "vendor/plotly.min.js" in html


def test_execution_status_page(built, staged):
    import html as H

    html = (built / "book" / "chapters" / "execution_status.html").read_text(encoding="utf-8")
    for ch in book.expected_chapters():
        assert ch in html and H.escape(book.title(book.NOTEBOOKS / f"{ch}.ipynb"), quote=False) in html
    assert "commit" in html and "torch" in html and "reused" in html
    assert "other processes (cores)" in html and ("in float32 (the CPU has no native bfloat16)" in html or
                                                  "in bfloat16 (the CPU multiplies it natively)" in html)
    _, status = staged
    assert all(s["others_cores"] is not None and s["others_cores"] >= 0 for s in status)
    assert "requirements.lock" in html and lockfile.digest() in html   # the lock every install read
    guide = (built / "book" / "course_guide.html").read_text(encoding="utf-8")
    _, status = staged
    assert all(f"{s['seconds']:.0f} s" in guide or f"{s['seconds'] / 60:.1f} min" in guide for s in status)


@pytest.mark.parametrize("chapter", book.expected_chapters())
def test_pages_are_clean(built, chapter):
    """Every plotly figure has a numbered caption; no progress bar, log or traceback in any output; every
    widget view appears once."""
    html = (built / "book" / "chapters" / f"{chapter}.html").read_text(encoding="utf-8")
    n_figs = html.count('class="plotly-graph-div')
    captions = re.findall(r'class="cel-caption"><strong>Figure ([0-9a-z]+)\.(\d+)\.</strong>', html)
    assert len(captions) == n_figs
    assert [int(n) for _, n in captions] == list(range(1, n_figs + 1))
    for bad in ("it/s]", "s/it]", "Traceback (most recent call last)", "Converting and de-quantizing", "%|"):
        assert bad not in html, bad
    views = re.findall(r'"model_id": "([0-9a-f]+)"', html.split("application/vnd.jupyter.widget-state+json")[0])
    assert len(views) == len(set(views))
    # tables for people (cel_utils.tables): no raw DataFrame (snake_case headers, a 0..n index), no long decimals
    assert '<table border="1" class="dataframe"' not in html, "a raw DataFrame is displayed"
    assert html.count('class="cel-table"') >= (0 if chapter in ("04_findings", "05_closing") else 1)
    cells = re.findall(r"<t[dh]>([^<]*)</t[dh]>", html)
    assert not [c for c in cells if re.search(r"\d\.\d{5,}|\d\.\d{4,}e", c)], "a number with too many digits"
    heads = re.findall(r"<th>([^<]*)</th>", html)
    assert not [h for h in heads if re.fullmatch(r"[a-z]+(_[a-z0-9]+)+", h.strip())], "a snake_case header"


def _outputs(staged, chapter):
    """(mime type, text) of every output of every code cell of the executed chapter, solutions included."""
    import json

    root, _ = staged
    nb = json.loads((root / "book" / "chapters" / f"{chapter}.ipynb").read_text())
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            if o["output_type"] == "stream":
                yield "stream", "".join(o["text"])
            for mime, data in o.get("data", {}).items():
                yield mime, "".join(data) if isinstance(data, list) else str(data)


def _table_rows_unequal(markdown: str) -> list[str]:
    """Rows of a markdown table whose cell count differs from the header's (a ``|`` inside a cell, e.g. LaTeX)."""
    bad, width = [], None
    for line in markdown.splitlines():
        s = line.strip()
        if not s.startswith("|"):
            width = None
            continue
        n = len(re.findall(r"(?<!\\)\|", s)) - 1
        if width is None:
            width = n
        elif n != width:
            bad.append(s)
    return bad


def test_the_table_row_check_sees_a_broken_row():
    good = "| a | b |\n|---|---|\n| 1 | 2 |"
    assert _table_rows_unequal(good) == []
    assert _table_rows_unequal(good + "\n| $|a \\pm b|$ | 3 |")
    assert _table_rows_unequal(good + "\n| $\\|a\\|$ | 3 |") == []


@pytest.mark.parametrize("chapter", book.expected_chapters())
def test_outputs_are_for_readers(staged, chapter):
    """No output prints a dict or record, a bare figure label or a run time; no prose an output emits says "nan"
    (a check that did not run prints nothing); every markdown table an output emits has rows of equal width; no
    token renders as empty quotes; the static build leaves no live widget (it shows a note or the kernel-free
    explorer instead)."""
    for mime, text in _outputs(staged, chapter):
        t = text.strip()
        if mime in ("text/plain", "stream"):
            assert not re.match(r"^\{['\"]", t), f"a dict is printed: {t[:80]}"
            assert not re.fullmatch(r"'?Figure \d+[a-z]?\.\d+'?", t), f"a bare figure label: {t}"
            assert not re.search(r"(\b(in|took|ran for)|:) \d+(\.\d+)? ?(s|min|seconds|minutes)\b", t), \
                f"a timing line: {t[:80]}"
        if mime in ("text/markdown", "stream"):
            assert not re.search(r"(?<![\w.])[+-]?nan\b", t, re.I), f"'nan' in prose: {t[:160]}"
        if mime == "text/markdown":
            assert not _table_rows_unequal(t), f"a table row of another width: {_table_rows_unequal(t)[:1]}"
            assert not re.search(r"(\"\"|''|“”|``)(?!`)", t.replace("```", "")), f"an empty quoted token: {t[:120]}"
        assert mime != "application/vnd.jupyter.widget-view+json", "a live widget in the static build"


@pytest.mark.parametrize("chapter", book.expected_chapters())
def test_each_exercise_shows_its_label(built, chapter):
    """Issue 53: the guide, the notes and the grader name exercises by label; the page shows the same label in each
    exercise's title ("Exercise 22 (ex-ch2b-null)")."""

    labels = re.findall(r":label: (ex-[\w-]+)", (book.NOTEBOOKS / f"{chapter}.ipynb").read_text())
    html = (built / "book" / "chapters" / f"{chapter}.html").read_text(encoding="utf-8")
    assert [lab for lab in labels if f"({lab})" not in html] == []
