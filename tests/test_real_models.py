"""Integration tests on the real built-in models (loaded offline from their PyPI packages)."""

import numpy as np
import pytest
import torch

from cel_utils.ablation import ablate_heads
from cel_utils.hooks import pad_right
from cel_utils.errors import CELError
from cel_utils.models import load_model
from cel_utils.engine import evaluate
from cel_utils.scoring import encode_task
from cel_utils.screening import plain_screen, screen
from cel_utils.tasks import load_task

pytestmark = pytest.mark.real


def _batch(lm):
    toks = [lm.tokenizer(t)["input_ids"] for t in ["The capital of France is", "12 + 34 = "]]
    return pad_right(toks, 0)


def test_smollm2_geometry(smol):
    assert (smol.family, smol.n_layers, smol.n_heads, smol.n_kv_heads, smol.head_dim) == ("llama", 30, 9, 3, 64)
    assert len(smol.weights_hash) == 16
    assert smol.out_proj(0).in_features == 576


def test_smollm2_empty_ablation_exact_and_one_head_changes(smol):
    ids, att = _batch(smol)
    with torch.no_grad():
        ref = smol.model(input_ids=ids, attention_mask=att).logits
        with ablate_heads(smol, []):
            same = smol.model(input_ids=ids, attention_mask=att).logits
        with ablate_heads(smol, "L14H8"):
            diff = smol.model(input_ids=ids, attention_mask=att).logits
    assert torch.equal(ref, same)
    assert (ref - diff).abs().max() > 1e-3


def test_smollm2_capitals_baseline(smol):
    task = load_task("capitals", n=28)  # the whole search split (three splits of the 82 items)
    res = evaluate(smol, encode_task(smol, task))
    assert res.accuracy[0] >= 0.8


def test_smollm2_engine_matches_plain_loop(smol):
    task = load_task("addition", n=12)
    enc = encode_task(smol, task)
    heads = [(0, 0), (11, 8), (14, 8), (29, 3)]
    a = screen(smol, task, heads=heads, enc=enc, progress=False)
    b = plain_screen(smol, task, heads=heads, enc=enc, progress=False)
    assert np.abs(a.results.margin - b.results.margin).max() < 1e-4
    assert np.array_equal(a.results.correct, b.results.correct)


def test_hub_id_without_network_fails_cleanly():
    with pytest.raises(CELError, match="not available locally"):
        load_model("HuggingFaceTB/definitely-not-cached-model")


def test_gemma_geometry_exactness_and_engine():
    lm = load_model("gemma3-270m")
    assert (lm.family, lm.n_layers, lm.n_heads, lm.n_kv_heads, lm.head_dim) == ("gemma3", 18, 4, 1, 256)
    assert lm.out_proj(0).in_features == 1024  # heads x head_dim, not the hidden size 640
    ids, att = _batch(lm)
    with torch.no_grad():
        ref = lm.model(input_ids=ids, attention_mask=att).logits
        with ablate_heads(lm, []):
            assert torch.equal(ref, lm.model(input_ids=ids, attention_mask=att).logits)
    for name in ("antonyms", "antonyms_em"):  # exact match: the stop read over Gemma's 262k-token vocabulary
        task = load_task(name, n=5)
        enc = encode_task(lm, task)
        a = screen(lm, task, heads=[(0, 1), (9, 2)], enc=enc, progress=False, result_cache=False)
        b = plain_screen(lm, task, heads=[(0, 1), (9, 2)], enc=enc, progress=False, batch_size=4)
        assert np.abs(a.results.margin - b.results.margin).max() < 1e-4
        assert np.array_equal(a.results.correct, b.results.correct)


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_converted_copy_gives_identical_logits(name, tmp_path, monkeypatch):
    """The safetensors copy written on the first load reproduces the GGUF-loaded model exactly."""
    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CEL_MODELS_DIR", raising=False)  # the copy goes to the cache folder's models/
    first = load_model(name, cache=False)  # from the GGUF file; writes the copy
    copies = list((tmp_path / "models").glob(f"{name}-*"))
    assert len(copies) == 1 and (copies[0] / "COMPLETE").exists()
    second = load_model(name, cache=False)  # from the copy
    assert second.weights_hash == first.weights_hash
    toks = [first.tokenizer(t)["input_ids"] for t in ["The capital of France is", "12 + 34 = "]]
    assert toks == [second.tokenizer(t)["input_ids"] for t in ["The capital of France is", "12 + 34 = "]]
    ids, att = pad_right(toks, 0)
    with torch.no_grad():
        a = first.model(input_ids=ids, attention_mask=att).logits
        b = second.model(input_ids=ids, attention_mask=att).logits
    assert torch.equal(a, b)
    if name != "smollm2-135m":
        return
    # a damaged copy is ignored and rewritten
    (copies[0] / "config.json").write_text("{not json")
    third = load_model(name, cache=False)
    assert third.weights_hash == first.weights_hash and (copies[0] / "COMPLETE").exists()


def test_smollm2_token_boundary_and_stop_tokens(smol, tmp_path):
    """The real BPE tokenizer: a prompt ending in a space keeps its choice's first token (" Paris" is one
    token), a JSONL item whose prompt tokens are not a prefix of prompt + choice is refused with its line, and
    the answer-continuation mask reads digits and word pieces as continuing, spaces and newlines as stopping."""
    import json

    from cel_utils.scoring import STOP, continuation_mask
    from cel_utils.tasks import Task

    tok = smol.tokenizer
    enc = encode_task(smol, Task("t", "mc", [{"prompt": "The capital of France is ", "choices": ["Paris", "Rome"],
                                              "answer": 0}]))
    assert tok.convert_ids_to_tokens(enc.read_tok[enc.read_choice == 0].tolist()) == ["ĠParis"]
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"prompt": "ok", "choices": [" a", " b"], "answer": 0}) + "\n" +
                 json.dumps({"prompt": "The capital is Par", "choices": ["is", "ma"], "answer": 0}) + "\n")
    with pytest.raises(CELError, match=r"bad.jsonl:2: the prompt's tokens are not a prefix"):
        encode_task(smol, load_task(str(p)))
    mask = continuation_mask(tok)
    ids = lambda text: tok(text)["input_ids"]  # noqa: E731
    assert mask[ids("0")[-1]] and mask[ids("ian")[0]]
    assert not mask[ids(" is")[0]] and not mask[ids("\n")[0]] and not mask[tok.eos_token_id]
    em = encode_task(smol, load_task("addition", n=2))
    assert (em.read_tok == STOP).sum() == 2
