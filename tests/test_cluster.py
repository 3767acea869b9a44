"""`cel screen --ray`: a local Ray with two workers on a tiny model gives the one-process screen, also when a worker
is killed mid-run (its chunk retried on the other) and when the driver is killed and started again (finished chunks
read back from the result cache, not recomputed: the engine's forward calls are counted); a worker that cannot load
the model fails the run with one line. One local Ray (2 CPUs) is shared by the module: starting one takes seconds.

The tests that need Ray are marked ``cluster`` (``make test`` runs them, ``make test-fast`` does not); the ones at
the end check the command's one-line errors without starting Ray.
"""

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cel_utils import engine
from cel_utils.cli import main
from cel_utils.errors import CELError
from tests.screen_json import assert_same_screen, candidates

ROOT = Path(__file__).resolve().parent.parent
cluster = pytest.mark.cluster


@pytest.fixture(scope="module")
def ray_address():
    """One local Ray for the module, 2 CPUs (two workers): its address, for the CLI and for subprocess drivers."""
    try:
        import ray
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs the Ray tests: pip install -e '.[cluster]'")
        pytest.skip("ray is not installed (pip install -e '.[cluster]')")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def harm(harmful_folder):
    """(model folder, task file, the driver's model, encoded search items): 3 layers, one planted harmful head."""
    from cel_utils.models import load_model
    from cel_utils.scoring import encode_task
    from cel_utils.tasks import load_task

    folder, task = harmful_folder
    lm = load_model(folder)
    return folder, task, lm, encode_task(lm, load_task(task, split="search"))


ARGS = ["--split", "search", "--quiet"]


@pytest.fixture(scope="module")
def one_process(harm, tmp_path_factory):
    """The one-process screen (`cel screen`, no cache), parsed."""
    out = tmp_path_factory.mktemp("one") / "one.json"
    assert main(["screen", "--model", harm[0], "--task", harm[1], *ARGS, "--no-cache", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def _record(sc, fdr=0.1):
    """What `cel screen` writes for a screen, without the header (for screens made in Python)."""
    rec = sc.record(seed=0, fdr=fdr)
    rec.pop("timing")
    return rec


@cluster
def test_ray_screen_is_the_one_process_screen(ray_address, harm, one_process, tmp_path, monkeypatch):
    """`cel screen --ray ADDRESS --workers 2` (a chunk per layer, three chunks): the same JSON as `cel screen`
    (margins within 1e-6, p- and q-values and candidates identical), the planted head its one candidate."""
    from cel_utils.tiny import HARMFUL_HEAD

    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "ray.json"
    assert main(["screen", "--model", harm[0], "--task", harm[1], *ARGS, "--ray", ray_address, "--workers", "2",
                 "--chunk-layers", "1", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert_same_screen(got, one_process)
    assert candidates(got) == [HARMFUL_HEAD]
    t = got["timing"]
    assert t["workers"] == 2 and t["computed_chunks"] == 3 and t["retried_chunks"] == 0 and t["forwards"] > 0
    assert len(list((tmp_path / "cache").rglob("*.npz"))) == 3           # the driver cached every chunk


@cluster
def test_a_worker_killed_mid_run_has_its_chunk_retried(ray_address, harm, one_process, tmp_path, monkeypatch):
    """The worker handed the third chunk (after the first chunk came back) is killed with SIGKILL while that chunk
    is in flight: the chunk is retried on the other worker and the screen is the same."""
    from cel_utils.cluster import PoolOptions, ray_screen

    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path / "cache"))
    folder, _, lm, enc = harm
    handed, killed = [], []

    def kill_third(i, worker):
        handed.append(i)
        if len(handed) == 3:
            os.kill(worker.pid, signal.SIGKILL)
            killed.append((i, worker.pid))

    sc = ray_screen(lm, enc, model=folder, options=PoolOptions(address=ray_address, workers=2, layers_per_chunk=1,
                                                               progress=False), on_dispatch=kill_third)
    (chunk, pid), = killed
    assert sc.meta["retried_chunks"] == 1 and sc.meta["computed_chunks"] == 3 and len(handed) == 4
    assert handed[-1] == chunk and sc.meta["ran_on"][chunk].split(":")[-1] != str(pid)   # on the other worker
    assert_same_screen({**one_process, **_record(sc)}, one_process)


_DRIVER = """
import os, signal, sys
from cel_utils.cluster import PoolOptions, ray_screen
from cel_utils.models import load_model
from cel_utils.scoring import encode_task
from cel_utils.tasks import load_task

folder, task, address = sys.argv[1:4]
lm = load_model(folder)
enc = encode_task(lm, load_task(task, split="search"))
stored = []

def die_after_two(i, part):           # called once a finished chunk is in the result cache
    stored.append(i)
    if len(stored) == 2:
        os.kill(os.getpid(), signal.SIGKILL)

ray_screen(lm, enc, model=folder, options=PoolOptions(address=address, workers=2, layers_per_chunk=1, progress=False),
           on_chunk=die_after_two)
"""


@cluster
def test_a_driver_killed_and_restarted_recomputes_nothing_finished(ray_address, harm, one_process, tmp_path,
                                                                   monkeypatch):
    """A driver (its own process, joined to the shared Ray) killed with SIGKILL after two of the three chunks were
    stored; started again on the same cache it reads those two back and computes only the third: the workers'
    forward calls are exactly those of the missing chunk (counted in-process chunk by chunk)."""
    from cel_utils.ablation import Ablation
    from cel_utils.cluster import PoolOptions, ray_screen
    from cel_utils.engine import cached_result, result_key
    from cel_utils.screening import chunk_head_sets, chunk_sets, screen_chunks

    folder, task, lm, enc = harm
    cache_dir = tmp_path / "cache"
    env = {**os.environ, "CEL_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    env.pop("CEL_NO_CACHE", None)
    p = subprocess.run([sys.executable, "-c", _DRIVER, folder, task, ray_address], env=env, timeout=600,
                       capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    monkeypatch.setenv("CEL_CACHE_DIR", str(cache_dir))
    monkeypatch.delenv("CEL_NO_CACHE", raising=False)
    chunks = chunk_sets(sorted((l, h) for l in range(lm.n_layers) for h in range(lm.n_heads)), 1)
    zero = Ablation.of("zero")
    finished = [i for i, c in enumerate(chunks)
                if cached_result(result_key(lm, enc, chunk_head_sets(c), zero), len(c) + 1, enc.n_items)]
    assert len(finished) == 2
    forwards = []                                            # each chunk's forward calls, counted here
    for c in chunks:
        before = engine.STATS["forwards"]
        screen_chunks(lm, enc, [c], zero, progress=False, result_cache=False)
        forwards.append(engine.STATS["forwards"] - before)
    sc = ray_screen(lm, enc, model=folder, options=PoolOptions(address=ray_address, workers=2, layers_per_chunk=1,
                                                               progress=False))
    assert sc.meta["resumed_chunks"] == 2 and sc.meta["computed_chunks"] == 1 and sc.meta["workers"] == 1
    assert sc.meta["forwards"] == sum(f for i, f in enumerate(forwards) if i not in finished)
    assert_same_screen({**one_process, **_record(sc)}, one_process)
    again = ray_screen(lm, enc, model=folder, options=PoolOptions(address=ray_address, layers_per_chunk=1,
                                                                  progress=False))
    assert again.meta["resumed_chunks"] == 3 and again.meta["workers"] == 0 and again.meta["forwards"] == 0


@cluster
def test_a_worker_that_cannot_load_the_model_fails_the_run_with_one_line(ray_address, harm, tmp_path, tiny_folder):
    """The workers are told to load a folder that is not there (as on a node without the model files), or a model
    with other weights than the driver's: a CELError of one line naming the problem, and nothing cached."""
    from cel_utils.cluster import PoolOptions, ray_screen

    folder, _, lm, enc = harm
    for model, workers, msg in [(str(tmp_path / "not-here"), 2, "cannot load the model"),
                                (tiny_folder("llama"), 1, "loaded other weights")]:
        with pytest.raises(CELError) as e:
            ray_screen(lm, enc, model=model, options=PoolOptions(address=ray_address, workers=workers,
                                                                 layers_per_chunk=1, progress=False),
                       result_cache=False)
        assert msg in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


@cluster
def test_when_every_worker_dies_the_run_stops_with_one_line(ray_address, harm, tmp_path, monkeypatch):
    """Each worker is killed as it is handed its first chunk: one line saying so and that a rerun resumes."""
    from cel_utils.cluster import PoolOptions, ray_screen

    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path / "cache"))
    folder, _, lm, enc = harm
    with pytest.raises(CELError) as e:
        ray_screen(lm, enc, model=folder, options=PoolOptions(address=ray_address, workers=2, layers_per_chunk=1,
                                                          progress=False),
                   on_dispatch=lambda i, w: os.kill(w.pid, signal.SIGKILL))
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "every Ray worker died" in msg and "run the same command again" in msg


@cluster
def test_more_workers_than_the_cluster_holds_is_one_line(ray_address, harm):
    from cel_utils.cluster import PoolOptions, ray_screen

    folder, _, lm, enc = harm
    with pytest.raises(CELError, match="3 workers asked for, but the Ray cluster has room for 2"):
        ray_screen(lm, enc, model=folder, options=PoolOptions(address=ray_address, workers=3, progress=False),
                   result_cache=False)
    with pytest.raises(CELError, match=r"2 workers asked for, but the Ray cluster has room for 1 \(2 CPU each\)"):
        ray_screen(lm, enc, model=folder, options=PoolOptions(address=ray_address, workers=2, threads=2,
                                                          progress=False), result_cache=False)


@cluster
@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="no CUDA GPU here: --device cuda through Ray is tested where a GPU is present "
                           "(the float32 CPU numbers stay the reference)")
def test_cuda_workers_match_the_cpu_screen(ray_address, harm, one_process, tmp_path, monkeypatch):
    """One worker per GPU with --device cuda: the same candidates and right/wrong per item as the CPU reference
    (margins within 1e-4: a GPU sums in another order)."""
    import ray

    if ray.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("the local Ray of this module was started without a GPU")
    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "cuda.json"
    assert main(["screen", "--model", harm[0], "--task", harm[1], *ARGS, "--ray", ray_address, "--device", "cuda",
                 "--chunk-layers", "1", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert_same_screen({**got, "device": "cpu"}, one_process, tol=1e-4)


# ---- the command's one-line errors (no Ray started)


def test_without_ray_the_command_says_how_to_install_it(harmful_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)            # `import ray` fails as if it were not installed
    out = tmp_path / "s.json"
    assert main(["screen", "--model", harmful_folder[0], "--task", harmful_folder[1], "--ray", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install -e '.[cluster]'" in err and not out.exists()


@pytest.mark.parametrize("extra, msg", [
    (["--ray", "--method", "gradient"], "--ray runs the exact screen"),
    (["--ray", "--confirm", "10"], "--ray screens only"),
    (["--ray", "--heldout"], "--ray screens only"),
    (["--ray", "--workers", "0"], "--workers must be at least 1"),
    (["--workers", "2"], "give --ray too"),
    (["--threads", "2"], "give --ray too"),
    (["--ray", "--threads", "0"], "--threads must be at least 1"),
    (["--chunk-layers", "0"], "--chunk-layers must be at least 1"),
])
def test_ray_options_are_checked_before_anything_loads(extra, msg, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("cel_utils.models.load_model", lambda *a, **k: pytest.fail("loaded a model"))
    assert main(["screen", "--model", "x", "--task", "ioi", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and msg in err, err


@pytest.mark.subprocess
def test_an_unreachable_address_is_one_line_and_quick(harmful_folder, tmp_path):
    """Ray itself retries an unreachable address for minutes; `cel` says in one line that nothing answers there."""
    pytest.importorskip("ray")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "s.json"
    with __import__("socket").socket() as s:                  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run([sys.executable, "-m", "cel_utils.cli", "screen", "--model", harmful_folder[0], "--task",
                        harmful_folder[1], "--quiet", "--ray", f"127.0.0.1:{port}", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=120)
    err = p.stderr.strip()
    assert p.returncode == 2 and not out.exists(), err
    assert len(err.splitlines()) == 1 and "cannot reach the Ray cluster at 127.0.0.1" in err, err
