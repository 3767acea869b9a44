"""cel_utils.mechanism and cel_utils.attention on tiny models: the decomposition against the model's own logits,
a head's direct effect against a hand computation from the weights, the path split where the model after the head
is linear, and the attention weights against the head's output."""

import json
import random

import numpy as np
import pytest
import torch

from cel_utils import attention as A
from cel_utils import explanation as E
from cel_utils import direct as DLA
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
    reads = DLA.choose_reads(tiny, task)
    assert len(reads) == len(task.items)
    tr = DLA.trace(tiny, reads)
    comps = DLA.components(tiny, tr)
    assert sum(1 for n in comps if "H" in n and "." not in n) == tiny.n_layers * tiny.n_heads
    total = sum(DLA.direct_diff(tiny, tr, c) for c in comps.values()) + DLA.bias_diff(tiny, tr)
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
    reads = DLA.choose_reads(tiny_llama, task)
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
    reads = DLA.choose_reads(tiny_llama, task)
    ex = M.explain(tiny_llama, task, head, reads=reads)
    np.testing.assert_allclose(ex.direct, _by_hand_llama(tiny_llama, reads, head), atol=1e-4)
    assert np.abs(ex.direct).max() > 1e-3  # not vacuous


def test_gemma_direct_effect_goes_through_the_post_attention_norm():
    """Gemma normalises the attention output before adding it: the head's piece is frozen-scaled there too."""
    lm = tiny_model("gemma3")
    task = _task("mc")
    reads = DLA.choose_reads(lm, task)
    tr = DLA.trace(lm, reads)
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
    np.testing.assert_allclose(DLA.direct_diff(lm, tr, DLA.head_output(lm, tr, (l, h))).numpy(), by_hand.numpy(),
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
    reads = DLA.choose_reads(tiny_llama, task)
    tr = DLA.trace(tiny_llama, reads)
    l, h = 1, 3
    D, group = tiny_llama.head_dim, tiny_llama.n_heads // tiny_llama.n_kv_heads
    before = _model_diff(tiny_llama, reads)
    w = A.attention(tiny_llama, reads, [(l, h), (l, 0)])
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
    # slots by role, the sink first and the read last; every read counts in every slot, so the means sum to 1
    att = d["attention"]
    assert att[0]["sink"] and (att[0]["line"], att[0]["back"]) == (-1, 0) and not any(a["sink"] for a in att[1:])
    assert (att[-1]["line"], att[-1]["back"]) == (0, 0) and att[-1]["where"] == "the read position itself"
    assert all(0 <= a["mean_weight"] <= 1 for a in att) and abs(sum(a["mean_weight"] for a in att) - 1) < 1e-6
    assert d["sink_weight"] == pytest.approx(att[0]["mean_weight"])
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
    reads = DLA.choose_reads(lm, task)
    tr = DLA.trace(lm, reads)
    ex = M.explain(lm, task, (0, 1), reads=reads, tr=tr)
    med = M.mediators(lm, tr, ex, k=10_000)
    assert abs(sum(m["mean_change"] for m in med) - ex.indirect_path.mean()) < 1e-5
    assert med[0]["component"].startswith(("L1", "L2"))  # carried by a later layer


def test_describe_reads_the_numbers():
    """The per-head sentence follows the measurements: which path carries the effect, by how much the head's own
    output mattered on the items its removal fixes, and in which direction."""
    base = {"head": "L3H1", "task": "addition", "n_items": 100, "n_fixed": 19, "n_broken": 1,
            "total_delta_margin": 1.39, "direct_delta_margin": 0.003, "mediator": "L29.mlp", "mediator_change": 0.38,
            "fixed_total": 2.5, "sink_token": "9", "sink_share": 1.0, "sink_weight": 0.29,
            "top_where": "1 position before the read", "top_token": " =", "top_share": 1.0, "top_weight": 0.41}
    indirect = E.describe(dict(base, direct_share=0.002, fixed_direct=-0.04))
    assert "; under 1% of its effect is direct" in indirect and "largest single part through L29.mlp (+0.38" in indirect
    assert "rises by 2.50 on average, though the head's own output favoured the answer (by 0.04)" in indirect
    direct = E.describe(dict(base, direct_share=0.7, fixed_direct=1.9))
    assert direct.startswith("L3H1 (addition): removing it fixes 19 and breaks 1 of 100 items; 70% of its effect")
    assert "1.90 of it because the head's own output, which favoured the competitor, is gone" in direct
    assert "L29.mlp" not in direct and "weight 0.41" in direct
    assert "rises by" not in E.describe(dict(base, n_fixed=0, direct_share=None, fixed_direct=0.0))
    # the sink apart, then the content position, with the share of items that have its token when not all do
    assert "it puts 0.29 of its attention on the first token of the prompt ('9'), the attention sink position; " \
           "of the rest, most on ' =', 1 position before the read, mean weight 0.41" in direct
    varied = E.describe(dict(base, direct_share=0.7, fixed_direct=1.9, top_share=0.43, top_token=" "))
    assert "most on 1 position before the read (where 43% of items have ' '), mean weight 0.41" in varied


def test_slot_token_counts_the_items_that_have_the_token_there():
    """The label of a slot: the most common token there, and the share of all reads (those without the slot
    included) that have it."""
    from types import SimpleNamespace

    tok = SimpleNamespace(decode=lambda ids, **kw: f"<{ids[0]}>")
    reads = SimpleNamespace(inputs=[[5, 6, 7], [1, 6, 7], [9, 7], [4, 3, 8, 7]])
    read_slots = [A.slots(tok, s) for s in reads.inputs]
    assert A.slot_token(tok, reads, read_slots, (0, 0)) == ("<7>", 1.0)
    assert A.slot_token(tok, reads, read_slots, (0, 1)) == ("<6>", 0.5)
    assert A.slot_token(tok, reads, read_slots, (0, 2)) == ("<3>", 0.25)  # position 0 is the sink, not (0, 2)
    assert A.slot_token(tok, reads, read_slots, A.SINK) == ("<5>", 0.25)
    assert A.slot_token(tok, reads, read_slots, (0, 3)) == (None, 0.0)


def test_slots_align_few_shot_prompts_by_role():
    """Lines of different lengths: the read's line counts back from the read, each earlier line from its line
    break, and position 0 is the sink; the same role gets the same slot in every prompt."""
    from cel_utils.tiny import char_tokenizer

    tok = char_tokenizer()
    a, b = "1+2=3\n10+20=30\n5+6=1", "11+22=33\n1+2=3\n55+66=12"
    sa, sb = A.slots(tok, tok.encode(a)), A.slots(tok, tok.encode(b))
    assert sa[0] == sb[0] == A.SINK and A.SINK not in sa[1:] + sb[1:]
    assert sa[-1] == sb[-1] == (0, 0)                                   # the read (an answer digit)
    assert sa[a.rindex("=")] == (0, 1) and sb[b.rindex("=")] == (0, 2)  # the query's '=' (answers of 1 and 2 digits)
    # the last demonstration's line break and answer digits, the first demonstration's line break
    assert sa[a.rindex("\n")] == sb[b.rindex("\n")] == (1, 0)
    assert sa[a.rindex("\n") - 1] == sb[b.rindex("\n") - 1] == (1, 1)
    assert sa[a.index("\n")] == sb[b.index("\n")] == (2, 0)
    assert sa[1] == (2, 4) and sb[1] == (2, 7)                          # the first line's second token


def _multiline_task(n: int = 10) -> Task:
    """Few-shot-like items whose prompts differ in length and number of lines."""
    rng = random.Random(1)
    items = []
    for i in range(n):
        demos = "".join(f"{rng.randint(1, 99)}+{rng.randint(1, 99)}=x\n" for _ in range(rng.randint(0, 2)))
        items.append({"prompt": demos + "".join(rng.choice("abcdef") for _ in range(rng.randint(2, 7))) + "=",
                      "choices": [" x", " yz"], "answer": i % 2})
    return Task(name="lines", kind="mc", items=items, split=None, seed=0, description="", metric="accuracy")


def test_mean_attention_sums_to_one_on_prompts_of_different_lengths(tiny_llama):
    """A real head's mean attention by role over reads of different lengths and line counts: every read counts in
    every slot, so the mean weights sum to 1 (averaging a slot over only the reads that have it would not)."""
    reads = DLA.choose_reads(tiny_llama, _multiline_task())
    assert len({len(s) for s in reads.inputs}) > 3                      # lengths differ
    assert len({sum(tiny_llama.tokenizer.decode([t]) == "\n" for t in s) for s in reads.inputs}) > 1
    w = A.attention(tiny_llama, reads, [(1, 3)])[(1, 3)]
    read_slots = [A.slots(tiny_llama.tokenizer, s) for s in reads.inputs]
    keys, mean = A.mean_attention(w, read_slots)
    assert abs(mean.sum() - 1) < 1e-6 and keys[0] == A.SINK and keys[-1] == (0, 0)
    assert len(keys) == len(set(keys))
    rows = A.attention_rows(tiny_llama.tokenizer, reads, w)
    assert abs(sum(r["mean_weight"] for r in rows) - 1) < 1e-6
    # each slot's mean is its total weight over all reads divided by the number of reads
    k = (0, 5)
    total = sum(float(x) for wi, si in zip(w, read_slots) for x, s in zip(wi, si) if s == k)
    assert any(k not in si for si in read_slots)                        # some reads lack the slot
    assert mean[keys.index(k)] == pytest.approx(total / len(reads))


def _planted_sink(monkeypatch, sink=0.5, content=0.3, back=2):
    """Make every head attend ``sink`` to position 0 and ``content`` to ``back`` positions before the read, the
    rest spread evenly (the profile's attention pass only)."""
    def planted(lm, reads, heads, batch_size=16):
        out = {}
        for h in heads:
            ws = []
            for s in reads.inputs:
                w = np.full(len(s), (1 - sink - content) / (len(s) - 2))
                w[0], w[len(s) - 1 - back] = sink, content
                ws.append(w)
            out[h] = ws
        return out
    monkeypatch.setattr(E, "attention", planted)


def test_a_sink_head_is_reported_as_a_sink_and_its_content_position_is_the_next_largest(tiny_llama, monkeypatch):
    """A head that puts most of its attention on the first token: the sentence names it as the sink with its
    weight, and names the next-largest position as where it attends; the figure's columns hold both, with the
    sentence's token as the label."""
    _planted_sink(monkeypatch)
    task = _task("em")
    p = E.profile(tiny_llama, task, (2, 1), control=(2, 0))
    s = p.summary
    assert s["sink_weight"] == pytest.approx(0.5) and s["top_slot"] == [0, 2]
    assert s["top_weight"] == pytest.approx(0.3) and s["top_where"] == "2 positions before the read"
    assert "it puts 0.50 of its attention on the first token of the prompt" in s["sentence"]
    named = s["sentence"][s["sentence"].index("; of the rest, most on"):]
    assert "2 positions before the read" in named and E.shown(s["top_token"]) in named
    assert named.endswith("mean weight 0.30.")
    # the figure: a window of the last position only still holds the sink and the position the sentence names
    panel = E.attention_panel(p, tiny_llama.tokenizer, n_positions=1, n_rows=3)
    assert panel["slots"] == [A.SINK, (0, 2), (0, 0)]
    assert panel["x_labels"][1].startswith("read-2: " + E.shown(s["top_token"]))
    assert panel["x_labels"][0].startswith("sink: ")
    np.testing.assert_allclose(panel["z"][0, :2], [0.5, 0.3])
    assert panel["y_labels"][:2] == ["L2H1, mean", "L2H0 (control), mean"]
    # cel explain's record names the same slot, and its rows sum to 1
    rec = p.record(tiny_llama.tokenizer)
    top = max((r for r in rec["attention"] if not r["sink"]), key=lambda r: r["mean_weight"])
    assert [top["line"], top["back"]] == rec["top_slot"] and top["where"] == rec["top_where"]
    assert abs(sum(r["mean_weight"] for r in rec["attention"]) - 1) < 1e-6


def test_the_sentence_escapes_tokens_for_markdown():
    """A token like '<bos>' is written so that Markdown shows it instead of swallowing it as an HTML tag."""
    s = {"head": "L1H2", "task": "t", "n_items": 4, "n_fixed": 0, "n_broken": 0, "direct_share": None,
         "sink_token": "<bos>", "sink_share": 1.0, "sink_weight": 0.6, "top_where": "the read position itself",
         "top_token": "<eos>", "top_share": 1.0, "top_weight": 0.1}
    text = E.describe(s)
    assert "<bos>" not in text and "<eos>" not in text
    assert "('&lt;bos&gt;')" in text and "most on '&lt;eos&gt;', the read position itself" in text


def test_unused_heldout_starts_after_the_graded_items():
    """Chapter 2a's items: the held-out split's items after the first ``start`` (which chapter 1a graded), no
    overlap with them, clipped at the split's end; an empty tail is an error."""
    from cel_utils.errors import CELError
    from cel_utils.tasks import load_task

    held = load_task("agreement_rc", "heldout")
    tail = E.unused_heldout("agreement_rc", 200, 100)
    assert tail.items == held.items[200:300] and tail.split == "heldout"
    assert not {it["key"] for it in tail.items} & {it["key"] for it in held.items[:200]}
    assert len(E.unused_heldout("agreement_rc", len(held.items) - 7, 100).items) == 7
    with pytest.raises(CELError, match="none after the first"):
        E.unused_heldout("agreement_rc", len(held.items), 10)


def test_readable_top_tokens_are_the_largest_readable_ones(tiny_llama):
    """``only_readable``: the k tokens of largest (smallest) mean direct logit among letters-or-digits tokens,
    in order; without it a punctuation token is among the top ones here (the filter does something)."""
    ex = M.explain(tiny_llama, _task("em"), (2, 1))
    mean = ex.head_logits.mean(0)
    tok = tiny_llama.tokenizer
    ok = [i for i in range(len(mean)) if i not in tok.all_special_ids and M.readable(M.token_text(tok, i))]
    promoted, suppressed = M.top_tokens(tiny_llama, ex.head_logits, k=5, only_readable=True)
    assert [p["token_id"] for p in promoted] == sorted(ok, key=lambda i: -mean[i])[:5]
    assert [p["token_id"] for p in suppressed] == sorted(ok, key=lambda i: mean[i])[:5]
    raw = M.top_tokens(tiny_llama, ex.head_logits, k=5)
    assert any(not M.readable(r["token"]) for r in raw[0] + raw[1])
