"""Model internals in one room: how the rest of the package reaches inside a Hugging Face causal LM.

* :data:`ARCHS`: one :class:`Arch` record per architecture family: where the decoder layers, the attention module,
  its output projection and the norms live, the config's logit soft-cap and the config model types. Adding a
  family is one record here (and the six-family oracle tests). The KV-cache keyword depends on the
  ``transformers`` release, not on the family: :func:`kv_cache_kwarg` reads it from the forward's signature.
* Named hook points, in the manner of TransformerLens's ``hook_points``:

  ===============  =========================================================================  ==========
  point            what the hook function receives (and may return a replacement of)          layer
  ===============  =========================================================================  ==========
  ``z``            the attention output projection's input, ``[batch, pos, head, d_head]``    each layer
  ``proj_out``     the output projection's output ``[batch, pos, d_model]``                   each layer
  ``attn_out``     what attention adds to the residual (Gemma: after its post-attention norm)  each layer
  ``resid_pre``    a decoder layer's input residual ``[batch, pos, d_model]``                 each layer
  ``resid_post``   a decoder layer's output residual ``[batch, pos, d_model]``                each layer
  ``final``        the final norm's input ``[batch, pos, d_model]``                           ``None``
  ``pattern``      attention weights ``[batch, head, query, key]`` (eager attention only)     each layer
  ===============  =========================================================================  ==========

* :func:`hooked`: one context manager that registers a list of ``(point, layer, fn)`` and always removes them.
  ``fn(x)`` returns ``None`` (the model's own value is used, bit for bit) or a tensor of the same shape.
* :func:`skip_layers_below` (run from a layer up on a cached residual), :func:`capture_layer_inputs`,
  :func:`eager_attention`, and the padded batches every forward loop uses (:func:`pad_right`,
  :func:`padded_batches`, :func:`hidden_states`).

No other module registers a hook or holds a per-family table.

Example:
    >>> import torch
    >>> from cel_utils.tiny import tiny_model
    >>> lm = tiny_model("llama")
    >>> ids = torch.tensor([[5, 6, 7]])
    >>> def zero_head_1(z):                      # z: [batch, pos, head, d_head]
    ...     z = z.clone(); z[:, :, 1] = 0; return z
    >>> with hooked(lm, [("z", 0, zero_head_1)]):
    ...     ablated = lm.model(input_ids=ids).logits
    >>> bool((ablated != lm.model(input_ids=ids).logits).any())   # and the hook is gone again
    True
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from . import threads
from .errors import CELError


@dataclass(frozen=True)
class Arch:
    """Where one architecture family keeps what head ablation and attribution need (dotted attribute paths)."""

    family: str
    model_types: tuple[str, ...]      # config.model_type values of this family
    layers: str                       # from the model: the list of decoder layers
    attention: str                    # inside a layer: the attention module
    out_proj: str                     # inside a layer: the attention output projection (its input: the heads)
    final_norm: str                   # from the model: the norm before the unembedding
    post_attention_norm: str | None = None  # inside a layer: a norm on the attention output before the residual add
    softcap: str | None = None        # config attribute: the final logits' soft-cap (tanh(x / c) * c)
    # a bias on the output projection (what exporting mean ablation adds): "always" (the family's projection has
    # one), a config attribute that turns it on together with the projections named in `bias_with` (which then get
    # zero biases), or None (no bias possible: mean ablation cannot be written into the weights)
    out_bias: str | None = None
    bias_with: tuple[str, ...] = ()


_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
ARCHS: dict[str, Arch] = {a.family: a for a in [
    Arch("llama", ("llama",), "model.layers", "self_attn", "self_attn.o_proj", "model.norm",
         out_bias="attention_bias", bias_with=_QKV),
    Arch("gemma3", ("gemma3", "gemma3_text"), "model.layers", "self_attn", "self_attn.o_proj", "model.norm",
         post_attention_norm="post_attention_layernorm", softcap="final_logit_softcapping",
         out_bias="attention_bias", bias_with=_QKV),
    Arch("qwen2", ("qwen2",), "model.layers", "self_attn", "self_attn.o_proj", "model.norm"),
    Arch("mistral", ("mistral",), "model.layers", "self_attn", "self_attn.o_proj", "model.norm"),
    Arch("gpt2", ("gpt2",), "transformer.h", "attn", "attn.c_proj", "transformer.ln_f", out_bias="always"),
    Arch("gpt_neox", ("gpt_neox",), "gpt_neox.layers", "attention", "attention.dense", "gpt_neox.final_layer_norm",
         out_bias="attention_bias", bias_with=("attention.query_key_value",)),
]}
POINTS = ("z", "proj_out", "attn_out", "resid_pre", "resid_post", "final", "pattern")

HookFn = Callable[[torch.Tensor], "torch.Tensor | None"]


def family_of(model_type: str) -> str:
    """The family of a config ``model_type`` (a :class:`CELError` naming the supported ones otherwise).

    Example:
        >>> family_of("gemma3_text")
        'gemma3'
    """
    for a in ARCHS.values():
        if model_type in a.model_types:
            return a.family
    raise CELError(f"unsupported model family {model_type!r}; supported: {', '.join(sorted(ARCHS))}")


def get_attr(obj: Any, dotted: str) -> Any:
    """``obj.a.b.c`` for ``dotted = "a.b.c"``."""
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def arch(lm) -> Arch:
    return ARCHS[lm.family]


def decoder_layers(lm) -> torch.nn.ModuleList:
    """The model's live list of decoder layers (assigning an entry replaces that layer in the model)."""
    return get_attr(lm.model, arch(lm).layers)


def out_proj(lm, layer: int) -> torch.nn.Module:
    """The attention output projection of ``layer`` (its input is the concatenated query heads)."""
    return get_attr(decoder_layers(lm)[layer], arch(lm).out_proj)


def attention_module(lm, layer: int) -> torch.nn.Module:
    return get_attr(decoder_layers(lm)[layer], arch(lm).attention)


def final_norm(lm) -> torch.nn.Module:
    return get_attr(lm.model, arch(lm).final_norm)


def post_attention_norm(lm, layer: int) -> torch.nn.Module | None:
    """The norm on the attention output before the residual add (Gemma), else None."""
    name = arch(lm).post_attention_norm
    return None if name is None else get_attr(decoder_layers(lm)[layer], name)


def softcap(lm) -> float | None:
    """The final logits' soft-cap of the model's config (Gemma), else None."""
    name = arch(lm).softcap
    if name is None:
        return None
    cfg = lm.model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(cfg, name, None) or None


def kv_cache_kwarg(base) -> str:
    """The keyword under which ``base`` (the base model) takes a KV cache, read from its forward's signature:
    ``cache`` where the forward takes it (as every family's does in ``transformers`` 5.25), else ``past_key_values``
    (older ``transformers`` releases)."""
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# ------------------------------------------------------------------------------------------------------------
# Hook points
# ------------------------------------------------------------------------------------------------------------
def _first(x):
    return x[0] if isinstance(x, tuple) else x


def _with_first(out, new):
    return (new,) + tuple(out[1:]) if isinstance(out, tuple) else new


def _register(lm, point: str, layer: int | None, fn: HookFn):
    """Register one hook; returns its handle."""
    if point == "z":
        H, D = lm.n_heads, lm.head_dim

        def pre(module, args, kwargs):
            x = args[0]  # [batch, pos, n_heads * d_head]
            b, t = x.shape[0], x.shape[1]
            new = fn(x.view(b, t, H, D))  # [batch, pos, head, d_head]
            return None if new is None else ((new.reshape(b, t, H * D),) + tuple(args[1:]), kwargs)

        return out_proj(lm, layer).register_forward_pre_hook(pre, with_kwargs=True)
    if point == "resid_pre":
        def pre_layer(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            new = fn(x)
            if new is None:
                return None
            if args:
                return (new,) + tuple(args[1:]), kwargs
            return args, {**kwargs, "hidden_states": new}

        return decoder_layers(lm)[layer].register_forward_pre_hook(pre_layer, with_kwargs=True)
    if point == "final":
        def pre_final(module, args):
            new = fn(args[0])
            return None if new is None else (new,) + tuple(args[1:])

        return final_norm(lm).register_forward_pre_hook(pre_final)
    if point == "pattern":
        def on_pattern(module, args, out):
            w = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if w is None:
                raise CELError(f"layer {layer} returned no attention weights (use hooks.eager_attention)")
            fn(w)  # read-only

        return attention_module(lm, layer).register_forward_hook(on_pattern)
    module = {"proj_out": lambda: out_proj(lm, layer),
              "attn_out": lambda: post_attention_norm(lm, layer) or out_proj(lm, layer),
              "resid_post": lambda: decoder_layers(lm)[layer]}[point]()

    def post(module, args, out):
        new = fn(_first(out))
        return None if new is None else _with_first(out, new)

    return module.register_forward_hook(post)


@contextmanager
def hooked(lm, hooks: Sequence[tuple[str, int | None, HookFn]]) -> Iterator[None]:
    """Run ``lm.model`` with the hooks ``(point, layer, fn)`` attached; they are always removed on exit.

    A point that needs a layer gets one in ``0 .. n_layers-1``; ``final`` takes ``None``. Bad points or layers are
    a :class:`CELError` before anything is attached.
    """
    for point, layer, _ in hooks:
        if point not in POINTS:
            raise CELError(f"unknown hook point {point!r}; use one of {', '.join(POINTS)}")
        if (point == "final") != (layer is None) or (layer is not None and not 0 <= layer < lm.n_layers):
            raise CELError(f"hook point {point!r} at layer {layer!r}: the model has layers 0..{lm.n_layers - 1}"
                           + (" and 'final' takes no layer" if point == "final" else ""))
    handles = []
    try:
        for point, layer, fn in hooks:
            handles.append(_register(lm, point, layer, fn))
        yield
    finally:
        for h in handles:
            h.remove()


def reader(store: dict, key, rows: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> HookFn:
    """A read-only hook function that keeps its input in ``store[key]`` (detached; with ``rows``/``positions``,
    only ``x[rows, positions]``, as float32 on the CPU). The first value seen is kept."""
    def fn(x):
        if rows is not None:
            x = x[rows, positions].float().cpu()
        store.setdefault(key, x.detach())
        return None

    return fn


class _Stub(torch.nn.Module):
    """Stands in for a decoder layer below the first ablated layer: returns a cached residual."""

    def __init__(self, out: torch.Tensor | None):
        super().__init__()
        self.out = out

    def forward(self, *args, **kwargs):
        if self.out is not None:
            return self.out
        return args[0] if args else kwargs["hidden_states"]


@contextmanager
def skip_layers_below(lm, layer: int, residual: torch.Tensor | None):
    """Run the model from ``layer`` up: decoder layers ``0 .. layer-1`` are replaced by stubs, the last of
    which returns ``residual`` (the input of ``layer`` from a clean pass, ``[batch, pos, d_model]``).

    The ``transformers`` contract this relies on (checked for every supported family by the engine-vs-plain
    tests): the base model calls the entries of its decoder-layer list in order, passing the hidden states
    as the first argument (or ``hidden_states=``), and uses a layer's return value, a tensor, as the next
    layer's input. Rotary embeddings, masks and caches are computed outside the layers, so they are the same
    as in a full pass. The original layers are always put back. Every forward of the engine passes here, so
    torch's threads are re-chosen here (:func:`cel_utils.threads.adapt`).
    """
    threads.adapt()
    layers = decoder_layers(lm)
    originals = [layers[j] for j in range(layer)]
    try:
        for j in range(layer):
            layers[j] = _Stub(residual if j == layer - 1 else None)
        yield
    finally:
        for j, mod in enumerate(originals):
            layers[j] = mod


@contextmanager
def capture_layer_inputs(lm):
    """Record each decoder layer's input residual during a forward: yields a list ``[n_layers]`` of tensors."""
    captured: list = [None] * lm.n_layers

    def keep(j):
        def fn(x):
            captured[j] = x.detach()
        return fn

    with hooked(lm, [("resid_pre", j, keep(j)) for j in range(lm.n_layers)]):
        yield captured


@contextmanager
def eager_attention(lm):
    """Run with the eager attention implementation (which returns attention weights); restored on exit."""
    before = getattr(lm.model.config, "_attn_implementation", None)
    if before == "eager":
        yield
        return
    lm.model.set_attn_implementation("eager")
    try:
        yield
    finally:
        lm.model.set_attn_implementation(before)


# ------------------------------------------------------------------------------------------------------------
# Padded batches
# ------------------------------------------------------------------------------------------------------------
def pad_id(lm) -> int:
    """The token used for padding: the tokenizer's pad token, else its end-of-sequence token, else 0."""
    tok = lm.tokenizer
    for cand in (tok.pad_token_id, tok.eos_token_id, 0):
        if cand is not None:
            return int(cand)
    return 0


def pad_right(seqs: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists: ``ids [batch, pos]`` and ``attention_mask [batch, pos]``.

    Example:
        >>> ids, att = pad_right([[5, 6, 7], [8]], 0)
        >>> ids.tolist(), att.tolist()
        ([[5, 6, 7], [8, 0, 0]], [[1, 1, 1], [1, 0, 0]])
    """
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    att = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        att[i, :len(s)] = 1
    return ids, att


def padded_batches(lm, seqs: Sequence[Sequence[int]], batch_size: int = 16
                   ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(start, ids, attention_mask)`` for consecutive batches of ``seqs``, right-padded, on the model's device."""
    pad, dev = pad_id(lm), lm.device
    for b in range(0, len(seqs), batch_size):
        threads.adapt()                          # torch's threads: the cores other processes leave free
        ids, att = pad_right(seqs[b:b + batch_size], pad)
        yield b, ids.to(dev), att.to(dev)


def hidden_states(lm, ids: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """The base model's last hidden states ``[batch, pos, d_model]`` (no logits, no KV cache)."""
    return lm.model.base_model(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
