"""The package's layout: imports flow one way, no module reaches into another's private names."""

import ast
from pathlib import Path

import cel_utils

PKG = Path(cel_utils.__file__).parent
# the order imports flow in: a module may import only from modules listed before it
ORDER = ["errors", "defaults", "io", "hooks", "cache", "models", "tiny", "tasks", "formats", "ablation", "scoring", "engine",
         "stats", "power", "compare", "screening", "approximate", "search", "joint", "gates", "effects", "robust", "verdict", "mechanism",
         "attention", "explanation", "theory", "dynamics", "checks", "exercises", "tables", "plots", "joint_plots",
         "theory_plots", "widgets", "shards", "cluster", "book", "cli"]


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported from inside the package, names imported) for every relative import, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.append((node.module.split(".")[0], [a.name for a in node.names]))
            else:  # from . import x, y
                out.extend((a.name, []) for a in node.names)
    return out


def test_every_module_is_placed():
    mods = {p.stem for p in PKG.glob("*.py")} - {"__init__", "__main__"}
    assert mods == set(ORDER), f"unplaced: {mods ^ set(ORDER)}"


def test_package_docstring_lists_every_module_in_order():
    """cel_utils/__init__.py's docstring names, in its bullet lines, every module of the package once, in the
    order imports flow (ORDER)."""
    import re

    modules = {p.stem for p in PKG.glob("*.py")} - {"__init__", "__main__"}
    bullets = [line for line in (cel_utils.__doc__ or "").splitlines() if line.startswith("* ")]
    named = [m for line in bullets for m in re.findall(r"``([a-z_]+)``", line) if m in modules]
    assert named == ORDER, f"missing: {[m for m in ORDER if m not in named]}; listed: {named}"


def test_no_upward_import_and_no_private_names():
    problems = []
    for name in ORDER:
        for mod, names in _imports(PKG / f"{name}.py"):
            if mod == "__version__" or mod not in ORDER:
                continue
            if ORDER.index(mod) >= ORDER.index(name):
                problems.append(f"{name} imports {mod} (upward or circular)")
            problems += [f"{name} imports {mod}.{n} (private)" for n in names if n.startswith("_")]
    assert problems == []


def test_the_checker_sees_a_violation(tmp_path):
    """The checker itself: an upward import and a private name are both found."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from .cli import main\n    from .models import _get_attr\n")
    assert _imports(f) == [("cli", ["main"]), ("models", ["_get_attr"])]


def test_bibliography_is_complete_and_every_entry_cited():
    """Every {cite} key in the book's pages and notebooks is in references.bib, and every entry is cited."""
    import json
    import re

    root = PKG.parent
    keys = set(re.findall(r"^@\w+\{([^,]+),", (root / "book" / "references.bib").read_text(), flags=re.M))
    texts = [p.read_text() for p in (root / "book").glob("*.md")]
    for nb in (root / "notebooks").glob("*.ipynb"):
        texts += ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]]
    cited = {k.strip() for t in texts for group in re.findall(r"\{cite[a-z:]*\}`([^`]+)`", t)
             for k in group.split(",")}
    assert cited - keys == set(), "cited but missing from references.bib"
    assert keys - cited == set(), "in references.bib but never cited"
    assert not any(re.search(r"\b[A-Z][a-z]+ et al\.,? \d{4}", t) for t in texts), "a typed citation"


def test_the_toc_lists_every_chapter_once():
    """``_toc.yml`` names each executed chapter of ``book.CHAPTERS`` exactly once (the one list of chapters)."""
    from cel_utils import book

    toc = book.toc_chapters()
    assert sorted(toc) == sorted(book.CHAPTERS) and len(toc) == len(set(toc))


def test_bibliography_names_are_plain_text():
    """Author names with LaTeX accent commands make malformed citation labels (e.g. '[JGcSimcsek+21]'): write
    them in Unicode."""
    import re

    bib = (PKG.parent / "book" / "references.bib").read_text(encoding="utf-8")
    authors = re.findall(r"author\s*=\s*\{(.*)\},?\s*$", bib, flags=re.M)
    assert authors and not [a for a in authors if "\\" in a]
