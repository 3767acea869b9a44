"""The result cache: hits give identical results, corrupt entries are recomputed, keys track what matters."""

import numpy as np

from cel_utils import cache
from cel_utils.scoring import encode_task
from cel_utils.engine import evaluate_head_sets
from cel_utils.tasks import load_task


def test_cache_hit_miss_and_corruption(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    lm = tiny_llama
    enc = encode_task(lm, load_task("addition", n=4))
    sets = [[], [(0, 1)], [(1, 2), (2, 3)]]
    a = evaluate_head_sets(lm, enc, sets, progress=False)
    files = list(tmp_path.rglob("*.npz"))
    assert len(files) == 1 and not list(tmp_path.rglob("*.tmp"))
    b = evaluate_head_sets(lm, enc, sets, progress=False)
    assert np.array_equal(a.margin, b.margin) and np.array_equal(a.correct, b.correct)
    # a different head set, mode or task is a different key
    evaluate_head_sets(lm, enc, [[], [(0, 2)]], progress=False)
    evaluate_head_sets(lm, enc, sets, mode="mean", means=__import__("torch").zeros(lm.n_layers, lm.n_heads, lm.head_dim),
                       progress=False)
    assert len(list(tmp_path.rglob("*.npz"))) == 3
    # corrupt the first entry: detected (checksum), recomputed, rewritten
    files[0].write_bytes(b"garbage")
    key = cache.make_key(lm, enc, sets, "zero")
    assert cache.load(key) is None and not files[0].exists()
    c = evaluate_head_sets(lm, enc, sets, progress=False)
    assert np.allclose(a.margin, c.margin) and files[0].exists()


def test_no_cache(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CEL_NO_CACHE", "1")
    enc = encode_task(tiny_llama, load_task("addition", n=3))
    evaluate_head_sets(tiny_llama, enc, [[]], progress=False)
    assert not list(tmp_path.rglob("*.npz"))


def test_cached_screen_keeps_its_compute_time(tiny_llama, tmp_path, monkeypatch):
    from cel_utils.screening import screen

    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    task = load_task("agreement", n=4)
    a = screen(tiny_llama, task, heads=[(0, 0), (0, 1)], progress=False)
    b = screen(tiny_llama, task, heads=[(0, 0), (0, 1)], progress=False)
    assert not a.meta["from_cache"] and b.meta["from_cache"]
    assert 0 < b.seconds <= a.seconds  # the compute time of the first run, not the time to read it back
    assert np.array_equal(a.results.margin, b.results.margin)
    # cost accounting uses the model's depth, not the deepest screened head
    assert a.n_layers == tiny_llama.n_layers > 1
    assert a.forward_equivalents == 1 + 2 * 1.0
