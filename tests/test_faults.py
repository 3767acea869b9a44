"""Faults: processes killed halfway, two processes sharing a cache, interrupted writes.

Each test drives the real `cel` command in subprocesses (separate processes, no shared memory), so what is
compared is what a user would see.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cel_utils import cache

CEL = [sys.executable, "-m", "cel_utils.cli"]


def _env(cache_dir, **extra):
    env = {**os.environ, "CEL_CACHE_DIR": str(cache_dir), **extra}
    env.pop("CEL_NO_CACHE", None)
    return env


def _json(path):
    d = json.loads(Path(path).read_text())
    d.pop("timing", None)
    return d


@pytest.fixture(scope="module")
def model_dir(tiny_folder):
    return tiny_folder("llama")


@pytest.mark.subprocess
def test_two_processes_share_one_cache(model_dir, tmp_path):
    """Two screens of the same items into the same (empty) cache at once: both succeed, both equal a solo run
    made without any cache, and every entry left behind is valid."""
    argv = ["screen", "--model", model_dir, "--task", "ioi", "--n", "30", "--quiet"]
    solo = tmp_path / "solo.json"
    one = {"OMP_NUM_THREADS": "1"}   # three processes side by side on a tiny model: one thread each
    ref = subprocess.Popen(CEL + argv + ["--no-cache", "--out", str(solo)], env=_env(tmp_path / "unused", **one))
    shared = tmp_path / "shared"
    procs = [subprocess.Popen(CEL + argv + ["--out", str(tmp_path / f"p{i}.json")], env=_env(shared, **one))
             for i in range(2)]
    assert [p.wait(timeout=300) for p in procs + [ref]] == [0, 0, 0]
    for i in range(2):
        assert _json(tmp_path / f"p{i}.json") == _json(solo)
    entries = list(shared.rglob("*.json"))
    assert entries and not list(shared.rglob("*.tmp"))
    os.environ["CEL_CACHE_DIR"], old = str(shared), os.environ.get("CEL_CACHE_DIR")
    try:
        for side in entries:
            if "models" not in side.parts:
                assert cache.load(json.loads(side.read_text())["key"]) is not None
    finally:
        os.environ.pop("CEL_CACHE_DIR") if old is None else os.environ.__setitem__("CEL_CACHE_DIR", old)


def test_orphan_data_file_is_not_trusted(tmp_path, monkeypatch):
    """A write interrupted after the data file but before its sidecar, or a sidecar left from an older entry,
    is never read back as a result."""
    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    cache.store("k", {"x": np.arange(3)})
    npz, side = next(tmp_path.rglob("*.npz")), next(tmp_path.rglob("*.json"))
    side.unlink()                                    # killed between the two renames: data without sidecar
    assert cache.load("k") is None
    cache.store("k", {"x": np.arange(3)})
    old_side = next(tmp_path.rglob("*.json")).read_text()
    cache.store("k", {"x": np.arange(4)})            # a newer entry ...
    next(tmp_path.rglob("*.json")).write_text(old_side)  # ... whose sidecar write was lost: the old one remains
    assert cache.load("k") is None


@pytest.mark.real
def test_screen_killed_halfway_resumes(tmp_path):
    """A screen killed with SIGKILL after part of its layers resumes from what it finished and writes the same
    output as an uninterrupted run."""
    argv = ["screen", "--model", "smollm2-135m", "--task", "addition", "--n", "8", "--quiet"]
    ref = tmp_path / "ref.json"
    subprocess.run(CEL + argv + ["--out", str(ref)], check=True, env=_env(tmp_path / "ref_cache"))
    run_cache = tmp_path / "cache"
    out = tmp_path / "out.json"
    p = subprocess.Popen(CEL + argv + ["--out", str(out)], env=_env(run_cache))
    # a cache entry is complete once its sidecar is written (the npz is renamed into place first): a kill between
    # the two leaves an npz that a resumed run rightly recomputes, so only complete entries count
    def complete():
        return [f for f in run_cache.rglob("*.npz") if "models" not in f.parts and f.with_suffix(".json").exists()]

    t0 = time.time()
    while len(complete()) < 2 and time.time() - t0 < 600:
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = complete()
    assert p.returncode == -signal.SIGKILL and not out.exists() and len(done) >= 2   # killed partway, no output
    r = subprocess.run(CEL + argv + ["--out", str(out)], env=_env(run_cache), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _json(out) == _json(ref)
    assert json.loads(out.read_text())["timing"].get("resumed_chunks", 0) >= 2


_LOAD_AND_SCORE = """
import sys, numpy as np, torch
from cel_utils import models
print(any(models.models_dir().glob("*/COMPLETE")))   # a converted copy existed before this load
lm = models.load_model("smollm2-135m")
ids = lm.tokenizer("The cat sat on the", return_tensors="pt").input_ids
with torch.no_grad():
    np.save(sys.argv[1], lm.model(ids).logits[0, -1].numpy())
"""


@pytest.mark.real
def test_two_processes_convert_the_same_model(tmp_path):
    """Two processes de-quantizing the same built-in GGUF model into an empty models folder at once: both
    succeed with the same logits, exactly one complete converted copy is left (no temporary folder), and a
    third process loading that copy gets the same logits."""
    models = tmp_path / "models"
    env = _env(tmp_path / "cache", CEL_MODELS_DIR=str(models))
    procs = [subprocess.Popen([sys.executable, "-c", _LOAD_AND_SCORE, str(tmp_path / f"p{i}.npy")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip() for o, _ in outs] == ["False", "False"]        # both converted: the race did happen
    copies = [d for d in models.iterdir()]
    assert len(copies) == 1 and (copies[0] / "COMPLETE").exists(), copies   # no ".tmp-" folder left behind
    before = (copies[0] / "model.safetensors").stat().st_mtime_ns
    subprocess.run([sys.executable, "-c", _LOAD_AND_SCORE, str(tmp_path / "p2.npy")], env=env, check=True)
    assert (copies[0] / "model.safetensors").stat().st_mtime_ns == before    # read, not rewritten
    a, b, c = (np.load(tmp_path / f"p{i}.npy") for i in range(3))
    assert np.array_equal(a, b) and np.array_equal(a, c)
    shutil.rmtree(models)   # half a gigabyte: not kept among pytest's last three runs
