import numpy as np
import pytest
import torch

from cel_utils.ablation import (Ablation, HeadAblator, ablate_heads, compute_head_means, format_heads, head_mask,
                                parse_heads)
from cel_utils.hooks import pad_right
from cel_utils.errors import CELError


def _batch(lm, texts=("12 + 34 = 46", "The keys to the cabinet are")):
    ids = [lm.tokenizer(t)["input_ids"] for t in texts]
    ids, att = pad_right(ids, 0)
    return ids, att


def _logits(lm, ids, att):
    with torch.no_grad():
        return lm.model(input_ids=ids, attention_mask=att, use_cache=False).logits


def test_parse_and_format_heads():
    assert parse_heads("L0H6,L1H1") == [(0, 6), (1, 1)]
    assert parse_heads("l2h3, L2H3") == [(2, 3)]
    assert parse_heads("L1", n_layers=3, n_heads=2) == [(1, 0), (1, 1)]
    assert len(parse_heads("all", n_layers=3, n_heads=2)) == 6
    assert format_heads([(0, 6), (14, 8)]) == "L0H6,L14H8"
    with pytest.raises(CELError, match="malformed"):
        parse_heads("L0-H6")
    with pytest.raises(CELError, match="out of range"):
        parse_heads("L3H0", n_layers=3, n_heads=4)
    with pytest.raises(CELError, match="out of range"):
        parse_heads("L0H4", n_layers=3, n_heads=4)


def test_empty_ablation_is_exact(tiny):
    ids, att = _batch(tiny)
    ref = _logits(tiny, ids, att)
    with ablate_heads(tiny, []):
        out = _logits(tiny, ids, att)
    assert torch.equal(ref, out)


def test_one_head_changes_logits_and_model_is_restored(tiny):
    ids, att = _batch(tiny)
    ref = _logits(tiny, ids, att)
    with ablate_heads(tiny, [(0, 1)]):
        out = _logits(tiny, ids, att)
    assert (ref - out).abs().max() > 1e-4
    assert torch.equal(_logits(tiny, ids, att), ref)  # hooks removed


def test_restored_after_exception(tiny_llama):
    lm = tiny_llama
    ids, att = _batch(lm)
    ref = _logits(lm, ids, att)
    with pytest.raises(RuntimeError):
        with ablate_heads(lm, [(0, 0)]):
            raise RuntimeError("boom")
    assert torch.equal(_logits(lm, ids, att), ref)


def _zero_columns(lm, layer, head):
    """Equivalent ablation through the weights: zero the head's input columns of the output projection."""
    proj = lm.out_proj(layer)
    D = lm.head_dim
    w = proj.weight
    saved = w.detach().clone()
    with torch.no_grad():
        if lm.family == "gpt2":  # Conv1D: weight [in, out]
            w[head * D:(head + 1) * D, :] = 0
        else:
            w[:, head * D:(head + 1) * D] = 0
    return saved


def test_query_head_ablation_matches_weight_zeroing(tiny):
    """Ablating query head h equals zeroing its o_proj input columns, even when KV heads are shared."""
    ids, att = _batch(tiny)
    layer, head = tiny.n_layers - 1, 1
    with ablate_heads(tiny, [(layer, head)]):
        hooked = _logits(tiny, ids, att)
    proj = tiny.out_proj(layer)
    saved = _zero_columns(tiny, layer, head)
    try:
        by_weight = _logits(tiny, ids, att)
    finally:
        with torch.no_grad():
            proj.weight.copy_(saved)
    assert (hooked - by_weight).abs().max() < 1e-5


def test_gqa_siblings_are_distinct():
    """Query heads sharing one KV head (MQA: all of them) have different ablation effects."""
    from cel_utils.tiny import tiny_model

    lm = tiny_model("mistral")  # 4 query heads, 1 KV head
    assert lm.n_kv_heads == 1 and lm.n_heads == 4
    ids, att = _batch(lm)
    outs = []
    for h in range(lm.n_heads):
        with ablate_heads(lm, [(1, h)]):
            outs.append(_logits(lm, ids, att))
    for i in range(4):
        for j in range(i + 1, 4):
            assert (outs[i] - outs[j]).abs().max() > 1e-5


def test_per_row_head_sets_match_separate_runs(tiny):
    ids, att = _batch(tiny, ("12 + 34 = 46", "12 + 34 = 46", "12 + 34 = 46"))
    sets = [[], [(0, 0)], [(tiny.n_layers - 1, 2), (0, 3)]]
    with ablate_heads(tiny, per_row=sets):
        joint = _logits(tiny, ids, att)
    for r, hs in enumerate(sets):
        with ablate_heads(tiny, hs):
            sep = _logits(tiny, ids[r:r + 1], att[r:r + 1])
        assert (joint[r] - sep[0]).abs().max() < 1e-5


def test_mean_ablation_replaces_by_mean(tiny_llama):
    lm = tiny_llama
    prompts = [lm.tokenizer(t)["input_ids"] for t in ["abc def", "hello world", "12 + 3"]]
    means = compute_head_means(lm, prompts)
    assert means.shape == (lm.n_layers, lm.n_heads, lm.head_dim)
    # check one layer's mean by hand
    captured = []
    h = lm.out_proj(0).register_forward_pre_hook(lambda m, a: captured.append(a[0].detach()))
    try:
        for p in prompts:
            lm.model(input_ids=torch.tensor([p]), use_cache=False)
    finally:
        h.remove()
    allpos = torch.cat([c[0] for c in captured])  # [positions, n_heads*head_dim]
    assert torch.allclose(means[0].reshape(-1), allpos.mean(0), atol=1e-5)
    # mean ablation: the head's slice is replaced by its mean
    seen = []
    ab = HeadAblator(lm, Ablation("mean", means)).attach()
    hk = lm.out_proj(0).register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))  # runs after ours
    try:
        ab.set_masks(head_mask(lm, [(0, 2)]))
        lm.model(input_ids=torch.tensor([prompts[0]]), use_cache=False)
    finally:
        hk.remove()
        ab.detach()
    x = seen[0].view(1, -1, lm.n_heads, lm.head_dim)
    assert torch.allclose(x[0, :, 2], means[0, 2].expand_as(x[0, :, 2]))


def test_bad_mode():
    from cel_utils.tiny import tiny_model

    with pytest.raises(CELError):
        HeadAblator(tiny_model("llama"), "resample")


def test_resample_gives_each_sequence_another_items_output(monkeypatch):
    """Resample ablation of an input-dependent head changes the margins (another item's output is not the item's
    own); donors that are the items themselves count as having no partner, and sequences without a
    partner of their length get the head's mean (a constant, like mean ablation)."""
    from cel_utils.ablation import Ablation, compute_head_means
    from cel_utils.engine import evaluate
    from cel_utils.scoring import encode_task
    from cel_utils.tasks import load_task

    from cel_utils import ablation
    from cel_utils.tiny import tiny_model

    lm = tiny_model("llama")
    task = load_task("ioi", "heldout", n=12)
    enc = encode_task(lm, task)
    means = compute_head_means(lm, enc.inputs)
    base = evaluate(lm, enc, result_cache=False)
    r = evaluate(lm, enc, [(1, 2)], mode=Ablation("resample", means, seed=0), result_cache=False)
    from cel_utils.engine import common_prefix

    P = len(common_prefix(enc))
    lengths = [len(x) - P for x in enc.inputs]
    partnered = [i for i in range(enc.n_items)   # items whose every input sequence has a partner of its length
                 if all(lengths.count(lengths[s]) > 1 for s in set(enc.read_seq[enc.read_item == i]))]
    assert partnered and np.abs(r.margin - base.margin)[0, partnered].max() > 1e-3
    assert len(set(lengths)) > 1 and max(lengths.count(L) for L in set(lengths)) > 1
    d = ablation.donors(lengths, seed=0)
    assert all(lengths[int(d[i])] == lengths[i] for i in range(len(d)))
    alone = [i for i, L in enumerate(lengths) if lengths.count(L) == 1]
    assert all(d[i] == i for i in alone) and all(d[i] != i for i in range(len(d)) if i not in alone)
    # donors that are the items themselves
    monkeypatch.setattr(ablation, "donors", lambda lengths, seed=0: np.arange(len(lengths)))
    same = evaluate(lm, enc, [(1, 2)], mode=Ablation("resample", means), result_cache=False)
    # every sequence is its own donor: each counts as "no partner" and gets the mean, i.e. mean ablation
    mean_abl = evaluate(lm, enc, [(1, 2)], mode=Ablation("mean", means), result_cache=False)
    assert np.abs(same.margin - mean_abl.margin).max() < 1e-4


def test_scale_ablation_keeps_the_intact_model_at_1_and_is_zero_ablation_at_0(tiny):
    """The scale kind multiplies a head's output by alpha: alpha = 1 reproduces the intact logits bit for bit,
    alpha = 0 gives exactly zero ablation's logits, and alpha = 0.5 equals halving the head's columns of the output
    projection (an oracle written here, on the weights)."""
    import torch

    from cel_utils.ablation import Ablation, ablate_heads

    ids = torch.tensor([[3, 5, 7, 9, 11, 2]])
    with torch.no_grad():
        clean = tiny.model(input_ids=ids).logits
        with ablate_heads(tiny, [(1, 2)], mode=Ablation.of("scale", alpha=1.0)):
            one = tiny.model(input_ids=ids).logits
        with ablate_heads(tiny, [(1, 2)], mode=Ablation.of("scale", alpha=0.0)):
            zero_scaled = tiny.model(input_ids=ids).logits
        with ablate_heads(tiny, [(1, 2)]):
            zero = tiny.model(input_ids=ids).logits
        with ablate_heads(tiny, [(1, 2)], mode=Ablation.of("scale", alpha=0.5)):
            half = tiny.model(input_ids=ids).logits
        from transformers.pytorch_utils import Conv1D

        proj = tiny.out_proj(1)   # nn.Linear: weight [out, in]; GPT-2's Conv1D: [in, out]
        w = proj.weight.T if isinstance(proj, Conv1D) else proj.weight
        cols = slice(2 * tiny.head_dim, 3 * tiny.head_dim)
        saved = w[:, cols].clone()
        try:
            w[:, cols] *= 0.5
            oracle = tiny.model(input_ids=ids).logits
        finally:
            w[:, cols] = saved
    assert torch.equal(one, clean) and torch.equal(zero_scaled, zero) and not torch.equal(zero, clean)
    assert torch.allclose(half, oracle, atol=1e-5) and not torch.allclose(half, clean, atol=1e-3)


def test_every_kind_is_one_ablation_the_engine_and_the_gates_use(tiny):
    """A constant equal to the head means is mean ablation; the soft form (blend) at keep = 0 removes a head as
    the hard replacement does, at keep = 1 keeps it, for zero, mean and scale."""
    import torch

    from cel_utils.ablation import Ablation, compute_head_means
    from cel_utils.engine import evaluate
    from cel_utils.scoring import encode_task
    from cel_utils.tasks import load_task

    enc = encode_task(tiny, load_task("ioi", n=6))
    means = compute_head_means(tiny, enc.inputs)
    mean = evaluate(tiny, enc, [(0, 1)], mode=Ablation("mean", means), result_cache=False)
    const = evaluate(tiny, enc, [(0, 1)], mode=Ablation("constant", means), result_cache=False)
    assert np.array_equal(mean.margin, const.margin)
    z = torch.randn(2, 3, tiny.n_heads, tiny.head_dim)
    for ab in (Ablation("zero"), Ablation("mean", means), Ablation.of("scale", alpha=0.3)):
        keep = torch.ones(tiny.n_heads)
        keep[1] = 0
        soft = ab.blend(z, 0, keep)
        hard = torch.where(torch.arange(tiny.n_heads)[None, None, :, None] == 1, ab.replacement(z, 0), z)
        assert torch.allclose(soft, hard, atol=1e-6), ab.mode
    with pytest.raises(CELError, match="needs alpha"):
        Ablation.of("scale")
    with pytest.raises(CELError, match="fitted constants"):
        Ablation.of("constant").resolved(tiny, enc.inputs)
