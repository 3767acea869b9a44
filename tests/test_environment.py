"""The lock file satisfies pyproject.toml, environment.yml is the lock, and every install reads it."""

import ast
import json
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import yaml
from packaging.requirements import Requirement

from cel_utils import lockfile

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")


def _wanted() -> list[str]:
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    opt = py["optional-dependencies"]
    return py["dependencies"] + opt["book"] + opt["dev"] + opt["models"] + opt["cluster"]


def test_lock_satisfies_pyproject():
    """Every requirement of pyproject.toml is in a lock file at a version its specifier allows."""
    locked = {**lockfile.pins(lockfile.LOCK), **lockfile.pins(lockfile.NODEPS_LOCK)}
    for req in map(Requirement, _wanted()):
        name = lockfile.canonical(req.name)
        assert name in locked, f"{name} is not in the lock: run make lock"
        assert req.specifier.contains(locked[name], prereleases=True), (name, str(req.specifier), locked[name])
    assert locked["torch"] == "2.13.0+cpu"                      # the CPU wheel, never a CUDA build
    assert not any(n.startswith("nvidia-") for n in locked)


def test_lock_has_a_hash_for_every_pin():
    for path in (lockfile.LOCK, lockfile.NODEPS_LOCK):
        text = (ROOT / path).read_text()
        blocks = re.split(r"\n(?=[A-Za-z0-9])", text)
        pinned = [b for b in blocks if lockfile.PIN.match(b)]
        assert pinned and all("--hash=sha256:" in b for b in pinned), path


def test_environment_yml_is_the_lock():
    """environment.yml lists every locked package at the lock's version (make lock writes it)."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]
    have = {lockfile.canonical(r.split("==")[0]): r.split("==")[1] for r in pip if "==" in r}
    assert have == lockfile.pins(lockfile.LOCK)
    assert "python=3.11" in env["dependencies"]
    nodeps = lockfile.pins(lockfile.NODEPS_LOCK)
    text = (ROOT / "environment.yml").read_text()
    assert all(f"pip install --no-deps {n}=={v}" in text for n, v in nodeps.items())


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_third_party_import_is_locked():
    """Each module imported by cel_utils, the notebooks, the tests or the benchmarks comes from a locked package."""
    sources = [p.read_text() for d in ("cel_utils", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                lines = "".join(cell["source"]).split("\n")
                sources.append("\n".join(ln for ln in lines if not ln.lstrip().startswith(("%", "!"))))
    local = {"cel_utils", "tests"} | {p.stem for p in (ROOT / "tests").glob("*.py")}
    modules = set().union(*map(_imports, sources)) - set(sys.stdlib_module_names) - local
    dists = packages_distributions()
    locked = lockfile.pins(lockfile.LOCK)
    missing = {m: dists.get(m) for m in modules
               if not any(lockfile.canonical(d) in locked for d in dists.get(m, []))}
    assert "torch" in modules and "scipy" in modules        # the scan sees the imports
    assert not missing, f"imported but not in the lock (add to pyproject.toml, then make lock): {missing}"


def test_makefile_installs_from_the_lock():
    mk = (ROOT / "Makefile").read_text()
    assert "pip install --quiet --require-hashes -r requirements.lock" in mk
    assert "--require-hashes --no-deps -r requirements-nodeps.lock" in mk
    assert mk.index("-r requirements.lock") < mk.index("-e .")  # the project itself adds nothing unlocked
    assert "pip install --quiet --no-deps --no-build-isolation -e ." in mk
    assert "pip-compile" in mk and "--generate-hashes" in mk and "lock.in" in mk
    assert '-m "not real and not notebook and not cluster and not subprocess"' in mk  # make test-fast skips them


def test_readme_has_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make book" in readme and "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def _committed_install_files() -> list[Path]:
    """Every lock, environment file and the Makefile: what an install outside reads."""
    return sorted({*ROOT.glob("*.lock"), *ROOT.glob("*.yml"), *ROOT.glob("*.yaml"), ROOT / "Makefile",
                   ROOT / "lock.in", ROOT / ".ci" / "run"})


def test_no_machine_path_in_any_install_file():
    """No local wheel folder, link or absolute path in what an install reads (pip-compile once copied this
    machine's ``--find-links /opt/wheels`` into the lock: pip elsewhere then looked for torch's +cpu build on the
    package index, which has none)."""
    bad = []
    for path in _committed_install_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"(?<!no-emit-)find-links|(?<![\w-])-f\s", code) or re.search(r"(?<![\w:/.])/(opt|home|root|usr|tmp|work|mnt|srv|var)\b", code) \
                    or "file://" in code:
                bad.append(f"{path.name}:{n}: {line.strip()}")
    assert not bad, bad


def test_torch_is_pinned_once_and_installed_from_its_cpu_index():
    """torch's pin lives in the lock only (pyproject's requirement is what the lock is compiled from); the Makefile
    installs the lock's own torch entry, hash required, from TORCH_INDEX (default PyTorch's CPU index) before the
    rest; environment.yml names the same index for the same pin; make lock writes no find-links into the lock."""
    entry = lockfile.entry(lockfile.LOCK, "torch")
    assert entry.startswith("torch==2.13.0+cpu") and "--hash=sha256:" in entry
    mk = (ROOT / "Makefile").read_text()
    assert f"TORCH_INDEX ?= {lockfile.TORCH_INDEX}" in mk
    torch_step = "--require-hashes --no-deps --index-url $(TORCH_INDEX) -r $(VENV)/torch.lock"
    assert torch_step in mk and "-m cel_utils.lockfile torch > $(VENV)/torch.lock" in mk
    assert mk.index(torch_step) < mk.index("-r requirements.lock")
    assert "--no-emit-find-links" in mk
    for path in ("Makefile", "lock.in", ".ci/run"):   # no second pin of torch where an install reads
        assert "2.13.0" not in re.sub(r"#.*", "", (ROOT / path).read_text()), path
    env = (ROOT / "environment.yml").read_text()
    assert f"--extra-index-url {lockfile.TORCH_INDEX}" in env and "torch==2.13.0+cpu" in env


def test_readme_says_what_the_lock_covers():
    readme = (ROOT / "README.md").read_text()
    assert "CPython 3.11" in readme and "Linux x86-64" in readme and "TORCH_INDEX" in readme
    assert "another platform" in readme


def test_lm_eval_plugin_entry_point_is_the_class():
    """The installed distribution declares lm-eval's plugin entry point ``cel``, whose value is CELLM's own
    ``module:Class`` (any other value makes lm-eval's registration raise "alias already registered")."""
    from importlib.metadata import entry_points

    import pytest

    cls = pytest.importorskip("cel_utils.lm_eval_model").CELLM
    eps = {e.name: e.value for e in entry_points(group="lm_eval.models")}
    assert eps.get("cel") == f"{cls.__module__}:{cls.__qualname__}" == "cel_utils.lm_eval_model:CELLM"
