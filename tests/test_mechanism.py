"""cel_utils.mechanism on tiny models: the decomposition against the model's own logits, a head's direct effect
against a hand computation from the weights, the path split where the model after the head is linear, and the
attention weights against the head's output."""

import json
import random

import numpy as np
import pytest
import torch

from cel_utils import explanation as E
from cel_utils import mechanism as M
from cel_utils.cli import main
from cel_utils.tasks import Task
from cel_utils.tiny import HARMFUL_HEAD, harm_items, tiny_model


def _task(kind: str, n: int = 12) -> Task:
    rng = random.Random(0)
    items = []
    for i in range(n):
        p = "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(4, 9))).strip()
        if kind == "mc":
            items.append({"prompt": p + ":", "choices": [" x", " yz", " q"], "answer": i % 3})
        else:
            items.append({"prompt": p + "=", "target": "ab"[i % 2] + "c"})
    return Task(name=f"t_{kind}", kind=kind, items=items, split=None, seed=0, description="",
                metric="accuracy" if kind == "mc" else "exact_match")


def _model_diff(lm, reads):
    """logit(answer) - logit(competitor) at each read, from the model's own forward (no hooks)."""
    out = []
    with torch.no_grad():
        for s, a, b in zip(reads.inputs, reads.answer, reads.competitor):
            lg = lm.model(input_ids=torch.tensor([s])).logits[0, -1]
            out.append(float(lg[a] - lg[b]))
    return np.array(out)


@pytest.mark.parametrize("kind", ["mc", "em"])
def test_components_add_up_to_the_clean_logit_difference(tiny, kind):
    task = _task(kind)
    reads = M.choose_reads(tiny, task)
    assert len(reads) == len(task.items)
    tr = M.trace(tiny, reads)
    comps = M.components(tiny, tr)
    assert sum(1 for n in comps if "H" in n and "." not in n) == tiny.n_layers * tiny.n_heads
    total = sum(M.direct_diff(tiny, tr, c) for c in comps.values()) + M.bias_diff(tiny, tr)
    np.testing.assert_allclose(total.numpy(), _model_diff(tiny, reads), atol=1e-4)


@pytest.mark.parametrize("kind", ["mc", "em"])
def test_the_read_is_where_the_score_is_decided(tiny_llama, kind):
    """The logit difference at the chosen read equals the task's own margin (plain loop) when the choices are one
    character after a shared space (mc: log-prob differences of the differing token; em: the smallest gap)."""
    from cel_utils.scoring import encode_task, plain_evaluate

    task = _task(kind)
    if kind == "mc":
        for it in task.items:
            it["choices"] = [" x", " y", " q"]
    reads = M.choose_reads(tiny_llama, task)
    margin = plain_evaluate(tiny_llama, encode_task(tiny_llama, task)).margin[0]
    np.testing.assert_allclose(_model_diff(tiny_llama, reads), margin[reads.items], atol=1e-4)


def _by_hand_llama(lm, reads, head):
    """The head's direct effect from the weights: its slice of W_O, the final RMS norm with its scale frozen."""
    l, h = head
    D = lm.head_dim
    got = {}
    hooks = [lm.out_proj(l).register_forward_pre_hook(lambda m, a: got.__setitem__("x", a[0].detach())),
             lm.model.model.norm.register_forward_pre_hook(lambda m, a: got.__setitem__("r", a[0].detach()))]
    W_O = lm.out_proj(l).weight.detach()  # [d, n_heads * head_dim]
    norm = lm.model.model.norm
    U = lm.model.lm_head.weight.detach()
    out = []
    try:
        with torch.no_grad():
            for s, a, b in zip(reads.inputs, reads.answer, reads.competitor):
                lm.model(input_ids=torch.tensor([s]))
                x, r = got["x"][0, -1], got["r"][0, -1]
                c = x[h * D:(h + 1) * D] @ W_O[:, h * D:(h + 1) * D].T
                scale = torch.rsqrt(r.pow(2).mean() + norm.variance_epsilon)
                before = (r * scale * norm.weight) @ (U[a] - U[b])
                after = ((r - c) * scale * norm.weight) @ (U[a] - U[b])
                out.append(float(after - before))
    finally:
        for k in hooks:
            k.remove()
    return np.array(out)


@pytest.mark.parametrize("head", [(0, 1), (2, 3)])
def test_direct_effect_equals_removing_the_head_from_the_final_residual(tiny_llama, head):
    task = _task("em")
    reads = M.choose_reads(tiny_llama, task)
    ex = M.explain(tiny_llama, task, head, reads=reads)
    np.testing.assert_allclose(ex.direct, _by_hand_llama(tiny_llama, reads, head), atol=1e-4)
    assert np.abs(ex.direct).max() > 1e-3  # not vacuous


def test_gemma_direct_effect_goes_through_the_post_attention_norm():
    """Gemma normalises the attention output before adding it: the head's piece is frozen-scaled there too."""
    lm = tiny_model("gemma3")
    task = _task("mc")
    reads = M.choose_reads(lm, task)
    tr = M.trace(lm, reads)
    l, h = 1, 2
    D = lm.head_dim
    layer = lm.decoder_layers[l]
    post, fin = layer.post_attention_layernorm, lm.model.model.norm
    W_O = lm.out_proj(l).weight.detach()
    U = lm.model.lm_head.weight.detach()
    a, b = torch.as_tensor(reads.answer), torch.as_tensor(reads.competitor)
    x = tr.head_in[l]
    o_all = x @ W_O.T  # [n, d]
    c = x[:, h * D:(h + 1) * D] @ W_O[:, h * D:(h + 1) * D].T
    c = c * torch.rsqrt(o_all.pow(2).mean(-1, keepdim=True) + post.eps) * (1 + post.weight.detach())
    y = tr.final
    contrib = (c * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + fin.eps) * (1 + fin.weight.detach()))
    by_hand = (contrib * (U[a] - U[b])).sum(-1)
    np.testing.assert_allclose(M.direct_diff(lm, tr, M.head_output(lm, tr, (l, h))).numpy(), by_hand.numpy(),
                               atol=1e-4)


def _linear_after(layer: int):
    """A tiny Llama that is linear after ``layer``'s attention: every norm is the identity, later attention
    attends uniformly (zero queries) and every MLP from ``layer`` on writes nothing."""
    lm = tiny_model("llama", seed=3)
    m = lm.model.model
    m.norm = torch.nn.Identity()
    for l, dec in enumerate(m.layers):
        dec.input_layernorm = torch.nn.Identity()
        dec.post_attention_layernorm = torch.nn.Identity()
        with torch.no_grad():
            if l > layer:
                dec.self_attn.q_proj.weight.zero_()
            if l >= layer:
                dec.mlp.down_proj.weight.zero_()
    return lm


def test_path_split_adds_up_when_the_model_after_the_head_is_linear():
    lm = _linear_after(0)
    task = _task("mc")
    ex = M.explain(lm, task, (0, 1))
    assert np.abs(ex.indirect_path).max() > 2e-3  # later layers do carry the head's output
    np.testing.assert_allclose(ex.direct_path + ex.indirect_path, ex.total, atol=2e-5)
    # with no norm in the way, the direct path is the direct effect
    np.testing.assert_allclose(ex.direct_path, ex.direct, atol=1e-4)
    # and in the ordinary model the split is not additive (the check above is not an identity)
    ex2 = M.explain(tiny_model("llama", seed=3), task, (0, 1))
    assert np.abs(ex2.direct_path + ex2.indirect_path - ex2.total).max() > 1e-3


def test_attention_weights_rebuild_the_head_output(tiny_llama):
    """Weights at the read position times the values give the head's slice of the o_proj input (GQA mapped)."""
    task = _task("mc")
    reads = M.choose_reads(tiny_llama, task)
    tr = M.trace(tiny_llama, reads)
    l, h = 1, 3
    D, group = tiny_llama.head_dim, tiny_llama.n_heads // tiny_llama.n_kv_heads
    before = _model_diff(tiny_llama, reads)
    w = M.attention(tiny_llama, reads, [(l, h), (l, 0)])
    assert tiny_llama.model.config._attn_implementation != "eager"  # restored
    np.testing.assert_array_equal(_model_diff(tiny_llama, reads), before)  # nothing else changed
    attn = tiny_llama.decoder_layers[l].self_attn
    for i, s in enumerate(reads.inputs):
        got = {}
        hook = attn.v_proj.register_forward_hook(lambda m, a, o: got.__setitem__("v", o.detach()))
        try:
            with torch.no_grad():
                tiny_llama.model(input_ids=torch.tensor([s]))
        finally:
            hook.remove()
        kv = h // group
        v = got["v"][0, :, kv * D:(kv + 1) * D]  # [pos, head_dim]
        wi = torch.tensor(w[(l, h)][i])
        assert len(wi) == len(s) and abs(float(wi.sum()) - 1) < 1e-5
        np.testing.assert_allclose((wi @ v).numpy(), tr.head_in[l][i, h * D:(h + 1) * D].numpy(), atol=1e-4)
    assert not np.allclose(w[(l, h)][0], w[(l, 0)][0])  # two heads, two patterns


def test_top_tokens_are_the_heads_largest_direct_logits(tiny_llama):
    task = _task("em")
    ex = M.explain(tiny_llama, task, (2, 1))
    promoted, suppressed = M.top_tokens(tiny_llama, ex.head_logits, k=3)
    mean = ex.head_logits.mean(0)
    assert [p["token_id"] for p in promoted] == list(np.argsort(-mean)[:3])
    assert [p["token_id"] for p in suppressed] == list(np.argsort(mean)[:3])
    assert promoted[0]["mean_logit"] > 0 > suppressed[0]["mean_logit"]


def test_cel_explain_writes_the_schema(tiny_folder, tmp_path, capsys):
    folder = tiny_folder("llama")
    data = tmp_path / "harm.jsonl"
    data.write_text("".join(json.dumps(it) + "\n" for it in harm_items(8)))
    out = tmp_path / "x.json"
    head = f"L{HARMFUL_HEAD[0]}H{HARMFUL_HEAD[1]}"
    assert main(["explain", "--model", folder, "--task", str(data), "--head", head, "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    for k in ("head", "n_items", "total_delta_margin", "direct_delta_margin", "direct_share", "promoted",
              "suppressed", "attention", "items", "mediators", "sentence"):
        assert k in d
    # the same profile as chapter 2a: the sentence names the head and its numbers, the mediators are components
    assert d["sentence"].startswith(f"{head} (harm): removing it fixes {sum(i['fixed'] for i in d['items'])} and breaks")
    assert d["mediators"] and all(m["component"] != head for m in d["mediators"])
    assert d["head"] == head and d["n_items"] == len(d["items"]) == 24
    assert d["direct_share"] is None or 0 <= d["direct_share"] <= 1
    vocab = set(json.loads(open(f"{folder}/tokenizer.json").read())["model"]["vocab"])
    assert all(p["token"] in vocab for p in d["promoted"] + d["suppressed"])
    # positions counted back from the read; each read's weights sum to 1, and a position some reads lack is
    # averaged over fewer reads, so the means sum to at least 1
    att = d["attention"]
    assert [a["token_position"] for a in att] == list(range(-len(att), 0))
    assert all(0 <= a["mean_weight"] <= 1 for a in att) and sum(a["mean_weight"] for a in att) >= 1 - 1e-6
    assert d["total_delta_margin"] == pytest.approx(np.mean([i["total_delta_margin"] for i in d["items"]]))
    # bad input: one line, exit 2, nothing written
    bad = tmp_path / "bad.json"
    for head_spec in ("L0H1,L0H2", "L9H0", "x"):
        capsys.readouterr()
        assert main(["explain", "--model", folder, "--task", str(data), "--head", head_spec,
                     "--out", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("cel: error:")
        assert not bad.exists()


def test_mediators_account_for_the_indirect_effect_in_a_linear_model():
    """With no norm and a linear model after the head, the changes of all other components' direct
    contributions add up to the indirect path."""
    lm = _linear_after(0)
    task = _task("mc")
    reads = M.choose_reads(lm, task)
    tr = M.trace(lm, reads)
    ex = M.explain(lm, task, (0, 1), reads=reads, tr=tr)
    med = M.mediators(lm, tr, ex, k=10_000)
    assert abs(sum(m["mean_change"] for m in med) - ex.indirect_path.mean()) < 1e-5
    assert med[0]["component"].startswith(("L1", "L2"))  # carried by a later layer


def test_describe_reads_the_numbers():
    """The per-head sentence follows the measurements: which path carries the effect, by how much the head's own
    output mattered on the items its removal fixes, and in which direction."""
    base = {"head": "L3H1", "task": "addition", "n_items": 100, "n_fixed": 19, "n_broken": 1,
            "total_delta_margin": 1.39, "direct_delta_margin": 0.003, "mediator": "L29.mlp", "mediator_change": 0.38,
            "fixed_total": 2.5, "top_attended": "' ='", "top_weight": 0.41}
    indirect = E.describe(dict(base, direct_share=0.002, fixed_direct=-0.04))
    assert "; under 1% of its effect is direct" in indirect and "largest single part through L29.mlp (+0.38" in indirect
    assert "rises by 2.50 on average, though the head's own output favoured the answer (by 0.04)" in indirect
    direct = E.describe(dict(base, direct_share=0.7, fixed_direct=1.9))
    assert direct.startswith("L3H1 (addition): removing it fixes 19 and breaks 1 of 100 items; 70% of its effect")
    assert "1.90 of it because the head's own output, which favoured the competitor, is gone" in direct
    assert "L29.mlp" not in direct and "weight 0.41" in direct
    assert "rises by" not in E.describe(dict(base, n_fixed=0, direct_share=None, fixed_direct=0.0))


def test_token_at_counts_the_items_that_have_the_token_there():
    """The label of a position counted back from the read: the most common token there, and the share of all
    reads (short ones included) that have it."""
    from types import SimpleNamespace

    tok = SimpleNamespace(decode=lambda ids, **kw: f"<{ids[0]}>")
    reads = SimpleNamespace(inputs=[[5, 6, 7], [1, 6, 7], [9, 7], [4, 3, 8, 7]])
    assert M.token_at(tok, reads, 1) == ("<7>", 1.0)
    assert M.token_at(tok, reads, 2) == ("<6>", 0.5)
    assert M.token_at(tok, reads, 4) == ("<4>", 0.25)
    assert M.token_at(tok, reads, 5) == (None, 0.0)
