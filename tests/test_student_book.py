"""The student edition (``make student-book``, cel_utils.book.student): built from the same staged sources and
executed chapters as the instructor book, without executing anything (the tests that build are marked notebook);
no page has a solution, every exercise is still there, and the instructor build of the same chapters does have the
solutions.

To stay fast the chapters are small hand-made *executed* notebooks (one per chapter of ``book.CHAPTERS``, so the
real ``_toc.yml`` and pages build unchanged); chapter 1's carries an exercise, its solution and a
``solution-check`` cell with an output, as ``book.execute(solutions=True)`` leaves them."""

import re

import nbformat
import pytest

from cel_utils import book

SOLUTION_CODE = "solution_only_name = 'answer'"           # in the solution's code block
CHECK_OUTPUT = "solution-check output 1234"                # printed by the solution-check cell
EXERCISE_TEXT = "Write the function the exercise asks for"

EXERCISE_MD = f"""## Exercises

:::{{exercise}}
:label: ex-stub

{EXERCISE_TEXT}.
:::

:::{{solution}} ex-stub
:class: dropdown

```python
{SOLUTION_CODE}
```
:::

After the solution.
"""


def stub_chapters(folder):
    """One executed notebook per chapter (its real title), the run-time table and the status page."""
    folder.mkdir(parents=True)
    for name in book.CHAPTERS:
        nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                "language": "python"},
                                                 "language_info": {"name": "python"}})
        nb.cells = [nbformat.v4.new_markdown_cell(f"# {book.title(book.NOTEBOOKS / f'{name}.ipynb')}\n\nA stub.")]
        # the chapter's own exercise labels, so that the course guide's links to them resolve in the strict build
        labels = re.findall(r":label: (ex-[\w-]+)", (book.NOTEBOOKS / f"{name}.ipynb").read_text())
        nb.cells += [nbformat.v4.new_markdown_cell("".join(f":::{{exercise}} {lab}\n:label: {lab}\n\nA stub.\n:::\n\n"
                                                           for lab in labels))] if labels else []
        if name == "01_screening":
            code = nbformat.v4.new_code_cell(f"print({CHECK_OUTPUT!r})", execution_count=1,
                                             metadata={"tags": ["solution-check"]})
            code.outputs = [nbformat.v4.new_output("stream", name="stdout", text=CHECK_OUTPUT + "\n")]
            nb.cells += [nbformat.v4.new_markdown_cell(EXERCISE_MD), code]
        nbformat.write(nb, folder / f"{name}.ipynb")
    (folder / "run_times.md").write_text("| chapter | run time at default parameters |\n|---|---|\n| stub | 1 s |\n")
    (folder / "execution_status.md").write_text("# Execution status\n\nStub chapters.\n")
    return folder


@pytest.fixture(scope="module")
def editions(tmp_path_factory):
    """(instructor html, student html): both built from the same stub chapters."""
    chapters = stub_chapters(tmp_path_factory.mktemp("executed") / "chapters")
    root = book.stage(tmp_path_factory.mktemp("instructor"))
    import shutil

    shutil.copytree(chapters, root / "book" / "chapters")
    instructor = book.build(root)
    student = book.student(out=tmp_path_factory.mktemp("student"), chapters=chapters)
    return instructor, student


SOLUTION_CLASS = re.compile(r'class="[^"]*\bsolution\b')


def pages(html_root):
    return {p.relative_to(html_root).as_posix(): p.read_text(encoding="utf-8") for p in html_root.rglob("*.html")}


@pytest.mark.notebook   # builds two books
def test_the_instructor_build_has_the_solution(editions):
    instructor, _ = editions
    page = (instructor / "book" / "chapters" / "01_screening.html").read_text(encoding="utf-8")
    assert SOLUTION_CLASS.search(page) and "solution_only_name" in page and CHECK_OUTPUT in page
    assert EXERCISE_TEXT in page


@pytest.mark.notebook   # builds two books
def test_the_student_build_has_no_solution_on_any_page(editions):
    _, student = editions
    found = pages(student)
    assert "book/chapters/01_screening.html" in found and "book/intro.html" in found
    bad = [name for name, text in found.items()
           if SOLUTION_CLASS.search(text) or "solution_only_name" in text or CHECK_OUTPUT in text]
    assert bad == []


@pytest.mark.notebook   # builds two books
def test_the_student_build_keeps_the_exercises_and_the_text_around_them(editions):
    _, student = editions
    page = (student / "book" / "chapters" / "01_screening.html").read_text(encoding="utf-8")
    assert re.search(r'class="[^"]*\bexercise\b', page) and EXERCISE_TEXT in page and "After the solution." in page


@pytest.mark.notebook   # builds two books
def test_the_student_notebooks_have_no_solutions(editions):
    _, student = editions
    notebooks = sorted((student.parent / "notebooks").glob("*.ipynb"))
    assert [p.stem for p in notebooks] == sorted(book.CHAPTERS)
    texts = {p.stem: p.read_text() for p in notebooks}
    assert not [name for name, text in texts.items() if "{solution}" in text]
    assert "{exercise}" in texts["01_screening"]


def test_the_student_build_stops_with_one_line_when_chapters_are_missing(tmp_path):
    with pytest.raises(SystemExit) as e:
        book.student(out=tmp_path / "student", chapters=tmp_path / "nothing")
    assert "make book" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "student").exists()


@pytest.mark.notebook   # builds two books
def test_the_instructor_pages_are_left_out_of_the_student_build(editions):
    instructor, student = editions
    assert (instructor / "book" / "instructor_notes.html").exists()
    assert "instructor_notes.html" in (instructor / "book" / "course_guide.html").read_text(encoding="utf-8")
    assert not (student / "book" / "instructor_notes.html").exists()
    linking = [name for name, text in pages(student).items() if "instructor_notes" in text]
    assert linking == []
    guide = (student / "book" / "course_guide.html").read_text(encoding="utf-8")
    assert "For instructors" not in guide and "Session 1" in guide
