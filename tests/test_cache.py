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
    key = cache.make_key(lm, enc, sets, "zero")
    entry = cache.cache_dir() / key[:2] / f"{key}.npz"
    # the list's entry, and one per set (a short list is also cached set by set)
    assert entry.exists() and len(list(tmp_path.rglob("*.npz"))) == 1 + 3 and not list(tmp_path.rglob("*.tmp"))
    b = evaluate_head_sets(lm, enc, sets, progress=False)
    assert np.array_equal(a.margin, b.margin) and np.array_equal(a.correct, b.correct)
    # a different head set, mode or task is a different key
    evaluate_head_sets(lm, enc, [[], [(0, 2)]], progress=False)   # a new list, one new set
    evaluate_head_sets(lm, enc, sets, mode="mean", means=__import__("torch").zeros(lm.n_layers, lm.n_heads, lm.head_dim),
                       progress=False)
    assert len(list(tmp_path.rglob("*.npz"))) == 4 + 2 + 4
    # corrupt the list's entry: detected (checksum), recomputed, rewritten
    entry.write_bytes(b"garbage")
    assert cache.load(key) is None and not entry.exists()
    c = evaluate_head_sets(lm, enc, sets, progress=False)
    assert np.allclose(a.margin, c.margin) and entry.exists()


def test_a_set_computed_in_one_list_is_read_back_in_another(tiny_llama, tmp_path, monkeypatch):
    """Issue 51 (nothing computed twice): a short list's sets are cached one by one, so a later list holding some of
    them computes only the others (counted in the engine's forwards), and its numbers equal a fresh computation of
    that list with the cache off (an independent run: same correctness, margins to float32 precision)."""
    from cel_utils import engine

    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    lm = tiny_llama
    enc = encode_task(lm, load_task("addition", n=6))
    evaluate_head_sets(lm, enc, [[], [(0, 1)], [(1, 2)]], progress=False)
    before = engine.STATS["forwards"]
    second = evaluate_head_sets(lm, enc, [[(1, 2)], [], [(2, 3)]], progress=False)
    only_new = engine.STATS["forwards"] - before
    fresh = evaluate_head_sets(lm, enc, [[(1, 2)], [], [(2, 3)]], progress=False, result_cache=False)
    full = engine.STATS["forwards"] - before - only_new
    assert 0 < only_new < full and not second.cached
    assert np.array_equal(second.correct, fresh.correct) and np.allclose(second.margin, fresh.margin, atol=1e-5)
    again = evaluate_head_sets(lm, enc, [[(2, 3)], [(0, 1)]], progress=False)   # every set cached: nothing runs
    assert again.cached and engine.STATS["forwards"] == before + only_new + full
    assert np.array_equal(again.margin[0], second.margin[2])


def test_no_cache(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CEL_NO_CACHE", "1")
    enc = encode_task(tiny_llama, load_task("addition", n=3))
    evaluate_head_sets(tiny_llama, enc, [[]], progress=False)
    assert not list(tmp_path.rglob("*.npz"))


def test_cached_screen_keeps_its_compute_time(tiny_llama, tmp_path, monkeypatch):
    """A screen read back from the cache reports the compute time its entries stored (the sum over its chunks),
    not the time to read them back, and says it was cached."""
    import pytest

    from cel_utils.screening import screen

    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CEL_NO_CACHE", raising=False)
    monkeypatch.setattr("cel_utils.screening.SCREEN_CHUNK_LAYERS", 1)   # heads in layers 0 and 1: two chunks
    task = load_task("agreement", n=4)
    heads = [(0, 0), (1, 1)]
    a = screen(tiny_llama, task, heads=heads, progress=False)
    assert not a.meta["from_cache"] and a.meta["resumed_chunks"] == 0
    entries = list(tmp_path.rglob("*.npz"))
    assert len(entries) == 2
    stored = []
    for f in entries:
        with np.load(f, allow_pickle=False) as z:
            stored.append(float(z["seconds"]))
    assert all(s > 0 for s in stored)
    b = screen(tiny_llama, task, heads=heads, progress=False)
    assert b.meta["from_cache"] and b.meta["resumed_chunks"] == 2
    assert b.seconds == pytest.approx(sum(stored), rel=1e-12, abs=0)
    assert np.array_equal(a.results.margin, b.results.margin)
    # cost accounting uses the model's depth (3 layers), not the deepest screened head (layer 1): a head in
    # layer l recomputes (3 - l) / 3 of a forward, 1 + 3/3 + 2/3 (the deepest head's count would give 2.5)
    assert tiny_llama.n_layers == 3
    for sc in (a, b):
        assert sc.forward_equivalents == pytest.approx(1 + 1 + 2 / 3)


def test_weights_edited_in_place_invalidate_cached_results(tmp_path, monkeypatch):
    """Editing a model's weights in place (as a test fixture or a user might) changes its hash, so a result
    cached for the old weights is not returned for the new ones."""
    import torch

    from cel_utils.engine import evaluate_head_sets
    from cel_utils.scoring import encode_task
    from cel_utils.tasks import load_task
    from cel_utils.tiny import tiny_model

    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CEL_NO_CACHE", raising=False)
    lm = tiny_model("llama", seed=5)
    enc = encode_task(lm, load_task("ioi", n=8))
    h0 = lm.weights_hash
    first = evaluate_head_sets(lm, enc, [[]], progress=False, result_cache=True)
    assert evaluate_head_sets(lm, enc, [[]], progress=False, result_cache=True).cached   # same weights: a hit
    with torch.no_grad():
        lm.out_proj(1).weight.mul_(0.0)                                              # edit in place
    assert lm.weights_hash != h0
    after = evaluate_head_sets(lm, enc, [[]], progress=False, result_cache=True)
    assert not after.cached
    assert not np.allclose(after.margin, first.margin)


def test_screen_resumes_from_finished_chunks(tmp_path, monkeypatch):
    """A screen is cached chunk by chunk: with one chunk's entry gone (never finished), a second run reads the
    others back, computes only that one, and gives the same numbers as heads evaluated one by one."""
    from cel_utils.screening import screen
    from cel_utils.tiny import tiny_model

    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CEL_NO_CACHE", raising=False)
    monkeypatch.setattr("cel_utils.screening.SCREEN_CHUNK_LAYERS", 1)   # 3 layers: 3 chunks
    lm = tiny_model("llama", seed=7)
    task = load_task("ioi", n=10)
    heads = [(2, 1), (0, 3), (1, 0), (0, 0)]                            # any order: results follow it
    first = screen(lm, task, heads=heads, progress=False)
    assert first.meta["resumed_chunks"] == 0
    entries = sorted(tmp_path.rglob("*.npz"), key=lambda p: p.stat().st_mtime)
    assert len(entries) == 3
    entries[1].unlink()                                                   # as if killed during the 2nd chunk
    again = screen(lm, task, heads=heads, progress=False)
    assert again.meta["resumed_chunks"] == 2
    assert np.array_equal(again.results.margin, first.results.margin)
    enc = encode_task(lm, task)
    one = evaluate_head_sets(lm, enc, [[h] for h in heads], progress=False, result_cache=False)
    assert np.allclose(first.results.margin, one.margin, atol=1e-5)
    assert np.array_equal(first.results.correct, one.correct)
