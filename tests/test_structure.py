"""The package's layout: imports flow one way, no module reaches into another's private names."""

import ast
from pathlib import Path

import cel_utils

PKG = Path(cel_utils.__file__).parent
# the order imports flow in: a module may import only from modules listed before it
ORDER = ["errors", "defaults", "design", "io", "threads", "profiling", "lockfile", "records", "findings", "hooks", "cache", "models", "tiny", "generators", "variants", "tasks", "formats",
         "ablation", "scoring", "export", "engine", "calibration", "stats", "labels", "operating", "search", "power", "compare", "pipeline", "screening", "approximate", "joint",
         "gates", "direct", "selectors", "comparison", "effects", "robust", "battery", "verdict", "outcomes", "landscape", "mechanism", "attention", "sinks", "explanation", "dose",
         "theory", "dynamics", "rival", "toynet", "checks", "checks_numeric", "heldback", "exercises", "gradebook", "tables", "figcheck", "plots", "joint_plots", "explanation_plots", "theory_plots", "widgets",
         "shards", "cluster", "book", "lm_eval_model", "cli_common", "cli_screen", "cli"]


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


# ---- size budgets: one concept per module, short functions, small signatures ---------------------------------
MODULE_LINES, FUNCTION_LINES, PARAMETERS, TEST_FILE_LINES = 500, 60, 10, 600
# what may exceed a budget, by name, with the reason (empty: nothing does)
LONG_MODULES: dict[str, str] = {}
LONG_FUNCTIONS: dict[str, str] = {}
MANY_PARAMETERS: dict[str, str] = {}


def budget_violations(path: Path) -> list[str]:
    """Every budget a module breaks: its lines, and each function's lines (docstring included) and parameters."""
    src = path.read_text()
    out = []
    if src.count("\n") > MODULE_LINES and path.stem not in LONG_MODULES:
        out.append(f"{path.stem} has {src.count(chr(10))} lines (budget {MODULE_LINES})")
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{path.stem}:{node.name}"
            a = node.args
            n_params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
            n_lines = node.end_lineno - node.lineno + 1
            if n_lines > FUNCTION_LINES and name not in LONG_FUNCTIONS:
                out.append(f"{name} is {n_lines} lines (budget {FUNCTION_LINES})")
            if n_params > PARAMETERS and name not in MANY_PARAMETERS:
                out.append(f"{name} takes {n_params} parameters (budget {PARAMETERS})")
    return out


def test_every_module_keeps_the_size_budgets():
    """Every module of the package, placed in ORDER or not (a new module is held to the budgets too)."""
    assert [v for path in sorted(PKG.glob("*.py")) for v in budget_violations(path)] == []


def test_every_test_file_keeps_its_size_budget():
    """Issue 52: the tests are held to a budget too (a file of tests over 600 lines is two concepts)."""
    tests = Path(__file__).parent
    assert [f"{p.name}: {p.read_text().count(chr(10))} lines" for p in sorted(tests.glob("*.py"))
            if p.read_text().count("\n") > TEST_FILE_LINES] == []


def test_the_budget_checker_sees_a_long_module_a_long_function_and_a_long_signature(tmp_path):
    f = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    f.write_text(f"def wide(a, b, c, d, e, f, g, h, i, j, k):\n    pass\n\n\ndef long():\n{body}\n"
                 + "\n" * (500 - 66) + "X = 1\n")
    assert f.read_text().count("\n") == 501
    assert budget_violations(f) == ["m has 501 lines (budget 500)", "m:wide takes 11 parameters (budget 10)",
                                    "m:long is 62 lines (budget 60)"]
    f.write_text("def ok(a, b, c, d, e, f, g, h, i, j):\n    pass\n")
    assert budget_violations(f) == []
    f.write_text("def hidden(a, b, c, d, e, f, g, h, i, *args, **kwargs):\n    pass\n")   # *args, **kwargs count
    assert budget_violations(f) == ["m:hidden takes 11 parameters (budget 10)"]


def _calls(path: Path):
    """(called name, first argument if a constant, imported names) of every call and import in a module."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            owner = fn.value.value if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Constant) else None
            yield name, owner
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scipy"):
            for a in node.names:
                yield f"import {a.name}", None


def seams(path: Path) -> list[str]:
    """What a module does that belongs to one other module: registering a hook (hooks.py), joining a head set's
    name (ablation.format_set) or bootstrapping (stats.py)."""
    out = []
    for name, owner in _calls(path):
        if name.startswith("register_") and name.endswith("hook") and path.stem != "hooks":
            out.append(f"{path.stem} registers a hook ({name})")
        if name == "join" and owner == "+" and path.stem != "ablation":
            out.append(f"{path.stem} joins a head set's name by hand (use ablation.format_set)")
        if name in ("bootstrap", "import bootstrap") and path.stem != "stats":
            out.append(f"{path.stem} bootstraps by itself (use cel_utils.stats)")
    return out


def test_hooks_names_and_bootstraps_each_live_in_one_module():
    assert [v for name in ORDER for v in seams(PKG / f"{name}.py")] == []


def test_the_seam_checker_sees_each_violation(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from scipy.stats import bootstrap\n"
                 "def f(lm, heads):\n"
                 "    lm.out_proj(0).register_forward_pre_hook(print)\n"
                 "    return '+'.join(heads), bootstrap((heads,), len)\n")
    assert seams(f) == ["m bootstraps by itself (use cel_utils.stats)",
                        "m registers a hook (register_forward_pre_hook)",
                        "m joins a head set's name by hand (use ablation.format_set)",
                        "m bootstraps by itself (use cel_utils.stats)"]
