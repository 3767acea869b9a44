"""Chapter 3a's trained transformer (cel_utils.toynet): the batched training forward against the Llama it exports
(Hugging Face's implementation as the oracle), softmax-1's exact zero, the hooks and the engine on the exported
model, the token tasks against their correlations, and the readings on planted tables."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest

from cel_utils import hooks, toynet
from cel_utils.defaults import TOY_RHO
from cel_utils.engine import evaluate_head_sets
from cel_utils.formats import formats_of, in_format
from cel_utils.models import load_model
from cel_utils.scoring import encode_task
from cel_utils.tasks import load_task


def _params(attention, runs=3, scale=1.0):
    tok = toynet.tokenizer(attention)
    P = toynet.init_params(runs, len(tok), scale, seeds=range(runs))
    if attention == "softmax1":
        P["embed"][:, tok.convert_tokens_to_ids(toynet.NULL)] = 0.0
    return P, tok


def _sample(tok, attention, runs, batch, seed=0):
    null = tok.convert_tokens_to_ids(toynet.NULL) if attention == "softmax1" else None
    return toynet.sample(torch.Generator().manual_seed(seed), runs, batch, toynet.token_table(tok),
                         tok.convert_tokens_to_ids(toynet.QUERY), null)


@pytest.mark.parametrize("attention", toynet.ATTENTIONS)
def test_batched_forward_equals_the_exported_llama_with_and_without_a_head(attention):
    """Training's forward (tables over tokens, one query) against Hugging Face's LlamaForCausalLM run on the same
    ids: intact, and with head 2 removed by the book's hook before the output projection."""
    P, tok = _params(attention)
    ids, _, _, _ = _sample(tok, attention, 3, 6)
    keep = torch.ones(3, toynet.N_HEADS)
    keep[:, 2] = 0
    mine, mine_removed = toynet.query_logits(P, ids), toynet.query_logits(P, ids, keep)
    for r in range(3):
        lm = toynet.llama(P, r, attention)
        with torch.no_grad():
            hf = lm.model(input_ids=ids[r]).logits[:, -1]

            def zero_2(z):
                z = z.clone()
                z[:, :, 2] = 0
                return z

            with hooks.hooked(lm, [("z", 0, zero_2)]):
                hf_removed = lm.model(input_ids=ids[r]).logits[:, -1]
        assert torch.allclose(mine[r], hf, atol=1e-5), (mine[r] - hf).abs().max()
        assert torch.allclose(mine_removed[r], hf_removed, atol=1e-5)
        assert (hf - hf_removed).abs().max() > 1e-3       # the head mattered


def test_the_tokenizer_writes_the_null_token_first_only_for_softmax1():
    text = "AbCd?"
    assert toynet.tokenizer("softmax")(text)["input_ids"] == toynet.tokenizer("softmax")(text, add_special_tokens=False)["input_ids"]
    ids1 = toynet.tokenizer("softmax1")(text)["input_ids"]
    tok = toynet.tokenizer("softmax1")
    assert ids1[0] == tok.convert_tokens_to_ids(toynet.NULL) and len(ids1) == len(text) + 1


def _abstaining(attention):
    """A network whose head 0 scores every real token about -1e5 (one key direction, the query opposite, in the
    slowest rotary pair) and has a non-zero value: softmax must still average the values, softmax-1 gives the null
    token all the weight."""
    P, tok = _params(attention, runs=1, scale=0.0)
    used = [tok.convert_tokens_to_ids(c) for c in "AaBbCcDd?"]
    P["embed"][0, used, 0] = 1.0
    row = toynet.HEAD_DIM - 1                      # head 0's last dimension: the pair rotated slowest by RoPE
    P["wk"][0, row, 0] = 100.0
    P["wq"][0, row, 0] = -100.0
    P["wv"][0, :toynet.HEAD_DIM, 0] = 1.0
    return P, tok


@pytest.mark.parametrize("attention", toynet.ATTENTIONS)
def test_softmax1_head_outputs_exactly_zero_when_it_abstains(attention):
    P, tok = _abstaining(attention)
    lm = toynet.llama(P, 0, attention)
    seen = []
    with hooks.hooked(lm, [("z", 0, lambda z: seen.append(z.detach().clone()))]):
        lm.model(input_ids=torch.tensor([tok("AbCdDdDd?")["input_ids"]]))
    z0 = seen[0][0, -1, 0]                          # [d_head] of head 0 at the query
    if attention == "softmax1":
        assert torch.equal(z0, torch.zeros_like(z0))
    else:
        assert z0.abs().min() > 1.0                 # the mean of the values (sqrt(32) each), not zero


def test_the_hooks_reproduce_the_trained_networks_logits_bit_for_bit_when_nothing_is_removed():
    """Every z hook of the book attached (the head ablator with no head masked, and a hook that returns nothing):
    the exported network's logits are the plain forward's, bit for bit."""
    from cel_utils.ablation import ablate_heads

    tr = toynet.train("softmax", seeds=[1], steps=20, every=20, n_eval=16, progress=False)
    lm = tr.model(0)
    ids = torch.tensor([lm.tokenizer("aBcDdDdD?")["input_ids"]])
    with torch.no_grad():
        plain = lm.model(input_ids=ids).logits
        with ablate_heads(lm, [], "zero"):
            none_removed = lm.model(input_ids=ids).logits
        with hooks.hooked(lm, [("z", 0, lambda z: None)]):
            noop = lm.model(input_ids=ids).logits
    assert torch.equal(plain, none_removed) and torch.equal(plain, noop)


def test_engine_reproduces_the_networks_own_margins_when_nothing_is_removed():
    """The book's engine (encode -> evaluate, no head removed) on a task against training's forward: the margin
    (log-prob of the answer minus the other choice) per item."""
    P, tok = _params("softmax1", runs=1)
    lm = toynet.llama(P, 0, "softmax1")
    task = load_task("toy_a", "heldout", n=24)
    res = evaluate_head_sets(lm, encode_task(lm, task), [[]], progress=False)
    ids = torch.tensor([tok(it["prompt"])["input_ids"] for it in task.items])[None]
    lp = torch.log_softmax(toynet.query_logits(P, ids)[0], -1)
    plus, minus = (tok.convert_tokens_to_ids(a) for a in toynet.ANSWERS)
    sign = torch.tensor([1.0 if it["answer"] == 0 else -1.0 for it in task.items])
    margin = (lp[:, plus] - lp[:, minus]) * sign
    assert np.allclose(res.margin[0], margin.numpy(), atol=1e-5)


def test_export_is_a_model_folder_the_model_room_opens(tmp_path, capfd):
    tr = toynet.train("softmax1", seeds=[3], steps=5, every=5, n_eval=16, progress=False)
    folder = toynet.export(tr, 0, tmp_path / "net")
    assert "it/s]" not in capfd.readouterr().err              # no progress bar left in a page
    lm = load_model(folder, cache=False)
    assert (lm.family, lm.n_layers, lm.n_heads) == ("llama", 1, toynet.N_HEADS)
    ids = torch.tensor([lm.tokenizer("AbcDd?")["input_ids"]])
    assert ids[0, 0] == lm.tokenizer.convert_tokens_to_ids(toynet.NULL)
    with torch.no_grad():
        assert torch.equal(lm.model(input_ids=ids).logits, tr.model(0).model(input_ids=ids).logits)


@pytest.mark.parametrize("task", list(TOY_RHO))
def test_text_tasks_and_training_sampler_hold_the_toys_correlations(task):
    """Each token type's sign agrees with the answer with probability (1 + rho) / 2, in the task's items (text) and
    in training's sampler (tensors): an exact binomial test on each at level 0.001."""
    items = [it for s in ("search", "confirm", "heldout") for it in load_task(task, s).items]
    tok = toynet.tokenizer("softmax")
    t = list(TOY_RHO).index(task)
    _, y, _, types = toynet.sample(torch.Generator().manual_seed(1), 1, 4000, toynet.token_table(tok),
                                   tok.convert_tokens_to_ids(toynet.QUERY), None, torch.full((1, 4000), t))
    ids, _, _, _ = toynet.sample(torch.Generator().manual_seed(1), 1, 4000, toynet.token_table(tok),
                                 tok.convert_tokens_to_ids(toynet.QUERY), None, torch.full((1, 4000), t))
    upper = torch.tensor([c.isupper() for c in tok.convert_ids_to_tokens(list(range(len(tok))))])
    tensor_sign = torch.where(upper[ids[0, :, :-1]], 1.0, -1.0)       # [batch, position]
    for ty, rho in enumerate(TOY_RHO[task]):
        agree = sum(s == (1 if it["answer"] == 0 else -1) for it in items
                    for tt, s in zip(it["fields"]["types"], it["fields"]["signs"]) if tt == ty)
        n = sum(tt == ty for it in items for tt in it["fields"]["types"])
        assert binomtest(agree, n, (1 + rho) / 2).pvalue > 1e-3, (task, ty, agree / n)
        mask = types[0, :, :-1] == ty
        k = int((tensor_sign[mask] == y[0][:, None].expand_as(mask)[mask]).sum())
        assert binomtest(k, int(mask.sum()), (1 + rho) / 2).pvalue > 1e-3, (task, ty, k / int(mask.sum()))
    assert all(it["prompt"].endswith("?") and len(it["prompt"]) == 19 for it in items)


def test_every_format_reorders_the_same_tokens():
    task = load_task("toy_b", "heldout", n=20)
    for f in formats_of("toy_b"):
        other = in_format(task, f.name)
        for a, b in zip(task.items, other.items):
            assert sorted(a["prompt"]) == sorted(b["prompt"]) and b["prompt"][-1] == "?"
            assert b["answer"] == a["answer"] and b["choices"] == a["choices"]
    first = in_format(task, "signals first").items[0]["prompt"]
    assert set(first[:3].upper()) == set("ABC")


def test_training_learns_both_tasks_and_kinds_read_planted_gains():
    tr = toynet.train("softmax", seeds=range(3), steps=150, every=50, n_eval=400, progress=False)
    assert (tr.accuracy[-1, :, 0] > 0.7).all() and (tr.accuracy[0, :, 0] < 0.65).all()
    assert tr.gains.shape == (4, 3, toynet.N_HEADS, 2) and tr.steps == [0, 50, 100, 150]
    assert np.allclose(tr.attention_by_type.sum(-1), 1.0, atol=1e-5)
    kinds = toynet.kind_of([0.1, 0.1, 0.0, 0.1], [-0.1, 0.0, -0.1, 0.05], eps=0.02)
    assert kinds.tolist() == ["two-sided", "one-sided", "none", "one-sided"]


def _verdict_rows(att, scale, holds, partner):
    """Planted verdict rows: ``holds`` localized runs of which ``partner`` lower toy_b (p = 0.001)."""
    rows = []
    for i in range(20):
        loc = i < holds
        rows.append({"attention": att, "scale": scale, "run": i, "holds": loc, "heldout_gain": 0.1 if loc else np.nan,
                     "partner_change": (-0.1 if i < partner else 0.0) if loc else np.nan,
                     "partner_p": (0.001 if i < partner else 1.0) if loc else np.nan, "same_head": loc})
    return rows


def test_predictions_read_planted_verdicts_as_each_account_says():
    conflict = pd.DataFrame(_verdict_rows("softmax", 1.0, 16, 16) + _verdict_rows("softmax1", 1.0, 16, 15))
    noise = pd.DataFrame(_verdict_rows("softmax", 1.0, 16, 0) + _verdict_rows("softmax1", 1.0, 2, 0))
    loc = toynet.localized(conflict)
    assert loc.localized.tolist() == [16, 16] and loc.two_sided.tolist() == [16, 15]
    p = toynet.predictions(loc).iloc[0]
    assert (p.conflict, p.noise) == ("met", "not met")
    p = toynet.predictions(toynet.localized(noise)).iloc[0]
    assert p.conflict == "not met" and p.noise_parts.startswith("met")


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "cel_utils.cli", "toy-train", *args], capture_output=True,
                          text=True, cwd=cwd, env={"CEL_NO_CACHE": "1", "PATH": "/usr/bin:/bin",
                                                   "HOME": str(cwd),
                                                   # one thread count for both runs: the record is bit-identical
                                                   # at a fixed count (a busy machine changed it between two runs)
                                                   "CEL_THREADS": os.environ.get("CEL_THREADS", "2")})


@pytest.mark.subprocess
def test_cli_writes_its_record_the_same_in_two_processes_and_refuses_bad_input(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        r = _cli("--seeds", "2", "--steps", "30", "--scale", "0.5,1", "--out", str(out), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    assert ra == rb and len(ra["runs"]) == 4 and {c["scale"] for c in ra["cells"]} == {0.5, 1.0}
    bad = _cli("--scale", "0,1", "--out", str(tmp_path / "c.json"), cwd=tmp_path)
    assert bad.returncode == 2 and "--scale must be positive" in bad.stderr and not (tmp_path / "c.json").exists()
