"""Same command, same seed: identical JSON (apart from the timing field). That shards merge into the unsharded
screen, and what `cel merge` refuses, is tests/test_shards.py."""

import json

import pytest

from cel_utils.cli import main


@pytest.fixture(scope="module")
def model_dir(tiny_folder):
    return tiny_folder("gemma3")


def _strip_timing(path):
    d = json.loads(path.read_text())
    d.pop("timing", None)
    return d


@pytest.mark.subprocess
def test_same_command_same_bytes(model_dir, tmp_path):
    """Two separate processes, no cache: the same command writes the same bytes (apart from the timing field)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CEL_CACHE_DIR"}
    outs = [tmp_path / f"run{i}.json" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "cel_utils.cli", "screen", "--model", model_dir, "--task",
                               "addition", "--n", "5", "--quiet", "--no-cache", "--out", str(out)], env=env,
                              cwd=str(tmp_path)) for out in outs]   # two processes at once: nothing shared
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    a, b = (_strip_timing(o) for o in outs)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    raw = [o.read_text().split('"timing"')[0] for o in outs]
    assert raw[0] == raw[1]                                           # byte for byte up to the timing field
    prov = a["provenance"]
    assert prov["cel_utils"] and prov["weights_hash"] and prov["task_items_hash"]
    assert a["method"] == "exact" and a["mode"] == "zero" and a["seed"] == 0
