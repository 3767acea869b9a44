"""cel_utils.hooks on the tiny random model of every family: each named hook point receives the tensor its table
documents (checked against plain torch hooks on the transformers modules, named here independently of
``hooks.ARCHS``, and against the model's own ``output_hidden_states`` / ``output_attentions``); a hook returning
None changes no bit of the logits and a returned tensor is used in place of the model's; :func:`hooked` and
:func:`skip_layers_below` always put the model back; a pass from a layer up on a captured residual gives the full
pass's logits; and the padded batches are right-padded as documented.

This file registers plain torch hooks as oracles; the package registers hooks only in ``cel_utils/hooks.py``.
"""

from types import SimpleNamespace

import pytest
import torch

from cel_utils import hooks
from cel_utils.errors import CELError

# where transformers keeps the modules of each family (the oracle's own table, not hooks.ARCHS):
# (decoder layers from the model, attention output projection inside a layer, final norm from the model)
MODULES = {
    "llama": ("model.layers", "self_attn.o_proj", "model.norm"),
    "gemma3": ("model.layers", "self_attn.o_proj", "model.norm"),
    "qwen2": ("model.layers", "self_attn.o_proj", "model.norm"),
    "mistral": ("model.layers", "self_attn.o_proj", "model.norm"),
    "gpt2": ("transformer.h", "attn.c_proj", "transformer.ln_f"),
    "gpt_neox": ("gpt_neox.layers", "attention.dense", "gpt_neox.final_layer_norm"),
}
GEMMA_POST_ATTENTION_NORM = "post_attention_layernorm"  # Gemma 3: a norm on the attention output before the add


def _get(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _layers(lm):
    return _get(lm.model, MODULES[lm.family][0])


def _o_proj(lm, layer):
    return _get(_layers(lm)[layer], MODULES[lm.family][1])


def _final_norm(lm):
    return _get(lm.model, MODULES[lm.family][2])


def _attn_out_module(lm, layer):
    """The module whose output attention adds to the residual: Gemma's post-attention norm, else the projection."""
    if lm.family == "gemma3":
        return getattr(_layers(lm)[layer], GEMMA_POST_ATTENTION_NORM)
    return _o_proj(lm, layer)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _batch():
    """Two sequences of different lengths, right-padded by hand, with their attention mask."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    att = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    return ids, att


def _logits(lm, ids, att, **kw):
    with torch.no_grad():
        return lm.model(input_ids=ids, attention_mask=att, use_cache=False, **kw)


def _all_hook_counts(lm) -> int:
    """How many forward (pre-)hooks the whole model holds."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in lm.model.modules())


# ---- each hook point receives the documented tensor


def _oracle_captures(lm, ids, att):
    """What each point should receive, from plain torch hooks and the model's hidden states (no cel_utils hooks):
    {(point, layer): tensor}."""
    got, handles = {}, []

    def keep(key, out=False):
        return (lambda m, a, o: got.__setitem__(key, _first(o).detach())) if out else \
            (lambda m, a: got.__setitem__(key, a[0].detach()))

    for l in range(lm.n_layers):
        handles.append(_o_proj(lm, l).register_forward_pre_hook(keep(("z", l))))
        handles.append(_o_proj(lm, l).register_forward_hook(keep(("proj_out", l), out=True)))
        handles.append(_attn_out_module(lm, l).register_forward_hook(keep(("attn_out", l), out=True)))
    handles.append(_final_norm(lm).register_forward_pre_hook(keep(("final", None))))
    try:
        with hooks.eager_attention(lm):
            out = _logits(lm, ids, att, output_hidden_states=True, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    states = out.hidden_states  # [embeddings, layer 0's output, ..., the last layer's output after the final norm]
    for l in range(lm.n_layers):
        got["resid_pre", l] = states[l]
        got["resid_post", l] = states[l + 1] if l + 1 < lm.n_layers else got["final", None]
        got["pattern", l] = out.attentions[l]
    return got


def test_each_point_receives_the_documented_tensor(tiny):
    """Every point at every layer (``final`` once) receives the tensor of its documented shape, equal to what the
    plain torch hooks and the model's own hidden states and attention weights see."""
    lm = tiny
    ids, att = _batch()
    B, T, d_model = ids.shape[0], ids.shape[1], lm.model.get_input_embeddings().weight.shape[1]
    want = _oracle_captures(lm, ids, att)
    store = {}
    points = [(p, l, hooks.reader(store, (p, l))) for p in hooks.POINTS if p != "final" for l in range(lm.n_layers)]
    with hooks.eager_attention(lm), hooks.hooked(lm, points + [("final", None, hooks.reader(store, ("final", None)))]):
        _logits(lm, ids, att)
    assert set(store) == set(want)
    shapes = {"z": (B, T, lm.n_heads, lm.head_dim), "pattern": (B, lm.n_heads, T, T)}
    for (point, layer), x in store.items():
        assert tuple(x.shape) == shapes.get(point, (B, T, d_model)), (point, layer, tuple(x.shape))
        oracle = want[point, layer].reshape(x.shape) if point == "z" else want[point, layer]
        assert torch.equal(x, oracle), (lm.family, point, layer)
    if lm.family == "gemma3":  # the point is after the post-attention norm, not the projection's output
        assert not torch.allclose(store["attn_out", 0], store["proj_out", 0])
    real = att[1].bool()  # attention rows of real queries sum to 1, no weight on later keys
    p = store["pattern", 0][1][:, real][:, :, real]
    assert torch.allclose(p.sum(-1), torch.ones_like(p.sum(-1)), atol=1e-5) and not p.triu(1).any()


def test_capture_layer_inputs_are_the_layers_input_residuals(tiny):
    lm = tiny
    ids, att = _batch()
    want = _logits(lm, ids, att, output_hidden_states=True).hidden_states
    before = _all_hook_counts(lm)
    with torch.no_grad(), hooks.capture_layer_inputs(lm) as captured:
        lm.model(input_ids=ids, attention_mask=att, use_cache=False)
    assert len(captured) == lm.n_layers
    assert all(torch.equal(captured[l], want[l]) for l in range(lm.n_layers))
    assert _all_hook_counts(lm) == before


def test_pattern_needs_eager_attention(tiny_llama):
    """Without eager attention the layer returns no weights: a CELError naming eager_attention, hooks removed."""
    ids, att = _batch()
    assert tiny_llama.model.config._attn_implementation != "eager"
    before = _all_hook_counts(tiny_llama)
    with pytest.raises(CELError, match="eager_attention"):
        with hooks.hooked(tiny_llama, [("pattern", 0, lambda w: None)]):
            _logits(tiny_llama, ids, att)
    assert _all_hook_counts(tiny_llama) == before


# ---- what a hook function returns


def test_hooks_returning_none_leave_the_logits_bit_identical(tiny):
    lm = tiny
    ids, att = _batch()
    seen = []

    def none(x):
        seen.append(1)
        return None

    points = [(p, l, none) for p in hooks.POINTS if p != "final" for l in range(lm.n_layers)] + [("final", None, none)]
    with hooks.eager_attention(lm):  # the pattern point needs it; the reference runs with it too
        ref = _logits(lm, ids, att).logits
        with hooks.hooked(lm, points):
            got = _logits(lm, ids, att).logits
    assert len(seen) == len(points)  # every hook ran
    assert torch.equal(got, ref)


def _plain_replace(lm, point, layer, fn):
    """The same replacement as the point ``(point, layer)`` with ``fn``, by a plain torch hook: its handle."""
    if point == "z":
        def pre(m, args):
            x = args[0]
            return (fn(x.view(*x.shape[:2], lm.n_heads, lm.head_dim)).reshape(x.shape),) + tuple(args[1:])
        return _o_proj(lm, layer).register_forward_pre_hook(pre)
    if point == "resid_pre":
        def pre_layer(m, args, kwargs):
            if args:
                return (fn(args[0]),) + tuple(args[1:]), kwargs
            return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}
        return _layers(lm)[layer].register_forward_pre_hook(pre_layer, with_kwargs=True)
    if point == "final":
        return _final_norm(lm).register_forward_pre_hook(lambda m, args: (fn(args[0]),) + tuple(args[1:]))
    module = {"proj_out": _o_proj, "attn_out": _attn_out_module, "resid_post": lambda lm, l: _layers(lm)[l]}[point]

    def post(m, args, out):
        return (fn(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else fn(out)
    return module(lm, layer).register_forward_hook(post)


@pytest.mark.parametrize("point", [p for p in hooks.POINTS if p != "pattern"])
def test_a_returned_tensor_replaces_the_models_value(tiny, point):
    """A hook that returns a tensor (the value with its last axis reversed, which no norm undoes; at ``z`` head 1
    zeroed) gives the logits of the same change made by a plain torch hook, and those differ from the clean
    logits."""
    lm = tiny
    ids, att = _batch()
    layer = None if point == "final" else lm.n_layers - 1 if point == "resid_post" else 0

    def change(x):
        if point == "z":
            x = x.clone()
            x[:, :, 1] = 0
            return x
        return x.flip(-1)

    clean = _logits(lm, ids, att).logits
    with hooks.hooked(lm, [(point, layer, change)]):
        got = _logits(lm, ids, att).logits
    h = _plain_replace(lm, point, layer, change)
    try:
        want = _logits(lm, ids, att).logits
    finally:
        h.remove()
    assert torch.equal(got, want)
    assert (got - clean).abs().max() > 1e-4


# ---- hooked: always removed, bad input refused before anything is attached


def test_hooked_removes_its_hooks_when_the_body_raises(tiny):
    lm = tiny
    ids, att = _batch()
    ref = _logits(lm, ids, att).logits
    before = _all_hook_counts(lm)
    zero = lambda x: torch.zeros_like(x)  # noqa: E731
    points = [(p, l, zero) for p in ("z", "proj_out", "attn_out", "resid_pre", "resid_post")
              for l in range(lm.n_layers)]
    with pytest.raises(RuntimeError, match="boom"):
        with hooks.hooked(lm, points + [("final", None, zero)]):
            assert _all_hook_counts(lm) == before + len(points) + 1
            raise RuntimeError("boom")
    assert _all_hook_counts(lm) == before
    assert torch.equal(_logits(lm, ids, att).logits, ref)


@pytest.mark.parametrize("point, layer, msg", [
    ("q", 0, "unknown hook point 'q'"),
    ("z", 99, "has layers 0.."),
    ("z", -1, "has layers 0.."),
    ("resid_pre", None, "has layers 0.."),
    ("final", 0, "'final' takes no layer"),
])
def test_hooked_refuses_a_bad_point_or_layer_before_attaching_anything(tiny_llama, point, layer, msg):
    reached, before = [], _all_hook_counts(tiny_llama)
    with pytest.raises(CELError, match=msg):
        with hooks.hooked(tiny_llama, [("z", 0, lambda x: None), (point, layer, lambda x: None)]):
            reached.append(1)
    assert not reached and _all_hook_counts(tiny_llama) == before


# ---- skip_layers_below


def test_skip_layers_below_from_a_captured_residual_gives_the_full_logits(tiny):
    """From every layer up, on that layer's input captured by a plain torch hook in a clean pass: the full pass's
    logits, bit for bit, without running the layers below; the layers are put back after."""
    lm = tiny
    ids, att = _batch()
    layers = _layers(lm)
    inputs = {}
    handles = [layers[l].register_forward_pre_hook(
        lambda m, args, kwargs, l=l: inputs.__setitem__(l, (args[0] if args else kwargs["hidden_states"]).detach()),
        with_kwargs=True) for l in range(lm.n_layers)]
    try:
        full = _logits(lm, ids, att).logits
    finally:
        for h in handles:
            h.remove()
    originals = list(layers)
    ran = []
    handles = [layers[l].register_forward_hook(lambda m, a, o, l=l: ran.append(l)) for l in range(lm.n_layers)]
    try:
        for start in range(lm.n_layers):
            ran.clear()
            with hooks.skip_layers_below(lm, start, inputs[start] if start else None):
                got = _logits(lm, ids, att).logits
            assert ran == list(range(start, lm.n_layers)), (start, ran)  # the layers below did not run
            assert torch.equal(got, full), (lm.family, start)
            assert list(layers) == originals
    finally:
        for h in handles:
            h.remove()


def test_skip_layers_below_puts_the_layers_back_when_the_body_raises(tiny_llama):
    lm = tiny_llama
    ids, att = _batch()
    ref = _logits(lm, ids, att).logits
    originals = list(_layers(lm))
    with pytest.raises(RuntimeError, match="boom"):
        with hooks.skip_layers_below(lm, 2, torch.zeros(2, 6, 64)):
            assert _layers(lm)[0] is not originals[0] and _layers(lm)[2] is originals[2]
            raise RuntimeError("boom")
    assert list(_layers(lm)) == originals
    assert torch.equal(_logits(lm, ids, att).logits, ref)


# ---- padded batches


def test_pad_right_pads_each_sequence_to_the_longest():
    seqs = [[5, 6, 7], [8], [9, 10]]
    ids, att = hooks.pad_right(seqs, 42)
    assert ids.dtype == att.dtype == torch.long and ids.shape == att.shape == (3, 3)
    assert ids.tolist() == [[5, 6, 7], [8, 42, 42], [9, 10, 42]]
    assert att.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]


def test_padded_batches_are_consecutive_and_padded_per_batch():
    """Batches of ``batch_size`` in order (the last one shorter), each right-padded to its own longest sequence
    with the tokenizer's pad token, else its end-of-sequence token."""
    seqs = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11], [12]]
    for tok, pad in [(SimpleNamespace(pad_token_id=3, eos_token_id=7), 3),
                     (SimpleNamespace(pad_token_id=None, eos_token_id=7), 7),
                     (SimpleNamespace(pad_token_id=None, eos_token_id=None), 0)]:
        lm = SimpleNamespace(tokenizer=tok, device=torch.device("cpu"))
        got = list(hooks.padded_batches(lm, seqs, batch_size=2))
        assert [b for b, _, _ in got] == [0, 2, 4]
        assert [ids.shape for _, ids, _ in got] == [(2, 3), (2, 5), (1, 1)]
        for b, ids, att in got:
            for r, s in enumerate(seqs[b:b + 2]):
                assert ids[r].tolist() == s + [pad] * (ids.shape[1] - len(s))
                assert att[r].tolist() == [1] * len(s) + [0] * (ids.shape[1] - len(s))


def test_padded_batches_of_a_tiny_model_pad_with_its_pad_token(tiny_llama):
    seqs = [tiny_llama.tokenizer(t)["input_ids"] for t in ("ab", "abcd", "a")]
    (start, ids, att), = hooks.padded_batches(tiny_llama, seqs)
    assert start == 0 and ids.device == tiny_llama.device
    assert ids[2, 1:].tolist() == [tiny_llama.tokenizer.pad_token_id] * 3 and att.sum(1).tolist() == [2, 4, 1]
