"""Tiny random models of every supported family, built from a config (no download): the tests' models and the
exercise checks' (:mod:`cel_utils.checks`).

* :func:`tiny_model`: a random model of one family with a character tokenizer, weights scaled up so that every
  head visibly changes the logits;
* :func:`harmful_head_model`: a tiny Llama with one planted head whose removal turns every item right;
* :func:`save_tiny`, :func:`save_harmful`: the same as a local model folder, as a user's own model would be.

Example:
    >>> lm = tiny_model("gpt_neox")
    >>> lm.family, lm.n_layers, lm.n_heads
    ('gpt_neox', 2, 4)
"""

from __future__ import annotations

import string

import torch

from . import hooks
from .models import wrap_model

FAMILY_CONFIGS = {
    "llama": ("LlamaConfig", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)),
    "gemma3": ("Gemma3TextConfig", dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                        max_position_embeddings=1024, sliding_window=8,
                                        layer_types=["sliding_attention", "sliding_attention",
                                                     "full_attention"])),
    "qwen2": ("Qwen2Config", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)),
    "mistral": ("MistralConfig", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=1024)),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=1024, bos_token_id=1, eos_token_id=1)),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, max_position_embeddings=1024)),
}


def char_tokenizer():
    """A character-level fast tokenizer: one token per character, '<pad>' and '<eos>' specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(string.printable)
    vocab = {"<pad>": 0, "<eos>": 1}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()  # decoding concatenates the characters (no spaces between tokens)
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>")


def tiny_model(family: str = "llama", seed: int = 0, bias_noise: bool = False, n_layers: int | None = None):
    """A tiny random model of ``family`` with a character tokenizer, wrapped as a
    :class:`~cel_utils.models.LoadedModel`. Weights are scaled up (x4) so that every head visibly changes the
    logits; with ``bias_noise`` the output projection's bias, where the family has one, is drawn from N(0, 1) so
    that it matters; ``n_layers`` replaces the family's depth (e.g. a model deep enough for 7 shards). Built anew
    on every call; the global torch random state is left as it was.

    Example:
        >>> tiny_model("llama", n_layers=8).n_layers
        8
    """
    import transformers

    tok = char_tokenizer()
    cls_name, kw = FAMILY_CONFIGS[family]
    if n_layers is not None:
        kw = {**kw, ("n_layer" if "n_layer" in kw else "num_hidden_layers"): int(n_layers)}
        if "layer_types" in kw:  # the family's pattern of attention types, repeated to the new depth
            kw["layer_types"] = [kw["layer_types"][i % len(kw["layer_types"])] for i in range(int(n_layers))]
    cfg = getattr(transformers, cls_name)(vocab_size=len(tok), **kw)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
        lm = wrap_model(model.float().eval(), tok, name=f"tiny-{family}")
        if bias_noise:
            for layer in range(lm.n_layers):  # a bias starts at zero; make it matter
                bias = getattr(lm.out_proj(layer), "bias", None)
                if bias is not None:
                    bias.normal_(0.0, 1.0)
    return wrap_model(model, tok, name=f"tiny-{family}") if bias_noise else lm


def save_tiny(folder, family: str = "llama", n_layers: int | None = None) -> str:
    """Save a tiny model (``n_layers`` deep, default the family's) and its tokenizer as a local folder, as a user's
    own model would be."""
    lm = tiny_model(family, n_layers=n_layers)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return str(folder)


HARMFUL_HEAD = (1, 2)


def harm_items(n_per_split: int = 20) -> list[dict]:
    """Multiple-choice items for :func:`harmful_head_model`: a short random prompt ending in ":", choices "a" and
    "b" (in either order); each item carries a 'split' field (search, confirm, heldout). The answer is "a",
    except on every fourth held-out item, where it is "b" (so the held-out split differs from the other two)."""
    import random

    rng = random.Random(0)
    prompts: list[str] = []
    while len(prompts) < 3 * n_per_split:
        p = "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(rng.randint(4, 10))).strip() + ":"
        if len(p) > 1 and p not in prompts:
            prompts.append(p)
    items = [{"prompt": p, "choices": ["a", "b"] if i % 2 else ["b", "a"], "answer": 0 if i % 2 else 1,
              "split": ("search", "confirm", "heldout")[i % 3]} for i, p in enumerate(prompts)]
    for it in [it for it in items if it["split"] == "heldout"][::4]:
        it["answer"] = 1 - it["answer"]
    return items


def harmful_head_model(items: list[dict], seed: int = 3, n_layers: int | None = None):
    """A tiny Llama with one planted harmful head: with every head on, each item of ``items`` is answered wrong
    (margin about -5); with ``HARMFUL_HEAD`` removed, right (margin about +5). Every other head is made
    near-silent (output scaled by 0.001), so removing it changes no answer. ``n_layers``: the depth (default 3).

    Built from the final hidden states at the read position with and without the head: the unembedding row of
    "a" is set to the row of "b" plus a direction (least squares) that is positive on the first and negative on
    the second. Only the logits of "a" and "b" decide these items.
    """
    lm = tiny_model("llama", seed=seed, n_layers=n_layers)
    tok, D = lm.tokenizer, lm.head_dim
    ia, ib = (tok(c)["input_ids"][0] for c in "ab")
    unembed = lm.model.get_output_embeddings()

    def final_states():  # the final norm's output at the last position: what the unembedding reads
        return torch.stack([hooks.hidden_states(lm, torch.tensor([tok(it["prompt"])["input_ids"]]), None)[0, -1]
                            for it in items])

    with torch.no_grad():
        for l in range(lm.n_layers):
            w = lm.out_proj(l).weight
            for h in range(lm.n_heads):
                w[:, h * D:(h + 1) * D] *= 4.0 if (l, h) == HARMFUL_HEAD else 0.001
        with_head = final_states()
        block = lm.out_proj(HARMFUL_HEAD[0]).weight[:, HARMFUL_HEAD[1] * D:(HARMFUL_HEAD[1] + 1) * D]
        saved = block.clone()
        block.zero_()
        without = final_states()
        block.copy_(saved)
        x = torch.cat([without, with_head])
        y = torch.cat([torch.ones(len(without)), -torch.ones(len(with_head))])
        d = torch.linalg.lstsq(x, y[:, None]).solution[:, 0]
        assert (without @ d).min() > 0.5 and (with_head @ d).max() < -0.5, "the two states are not separated"
        unembed.weight[ia] = unembed.weight[ib] + 5 * d / (without @ d).min()
    return lm


PAIR_HEADS = ((1, 0), (1, 1))


def pair_heads_model(items: list[dict], seed: int = 3, margin: float = 8.0):
    """A tiny Llama with a planted *pair*: with every head on, each item of ``items`` is answered wrong; with
    either head of ``PAIR_HEADS`` removed alone, still wrong (and its margin a little lower, so a single-head
    screen ranks both heads last); with both removed, right. Every other head is near-silent and the MLPs write
    nothing.

    Built so that the geometry is the same on every item: every token shares a large embedding coordinate, so the
    pair heads' input, hence their output, is nearly constant; the two heads are made identical (same query rows,
    same key/value head, same output block ``o``), so the residual at the read is ``e + (g1 + g2) o`` with ``e`` the
    rest. ``o`` points 150 degrees away from ``e`` (``|e + o|`` perpendicular to ``e``) and the unembedding row of
    "a" minus that of "b" points 75 degrees from ``e``: after the final norm, the margin is positive at ``g1 + g2 =
    0``, lowest at 1 and a little higher at 2. Only the logits of "a" and "b" decide these items.
    """
    import math

    lm = tiny_model("llama", seed=seed)
    tok, D = lm.tokenizer, lm.head_dim
    ia, ib = (tok(c)["input_ids"][0] for c in "ab")
    (layer, h0), (_, h1) = PAIR_HEADS
    with torch.no_grad():
        lm.model.get_input_embeddings().weight[:, 0] = 2.0
        for l in range(lm.n_layers):
            hooks.get_attr(hooks.decoder_layers(lm)[l], "mlp.down_proj").weight.zero_()
            w = lm.out_proj(l).weight
            for h in range(lm.n_heads):
                if (l, h) not in PAIR_HEADS:
                    w[:, h * D:(h + 1) * D] *= 0.001
        q = hooks.attention_module(lm, layer).q_proj.weight  # [heads * d_head, d_model]
        q[h1 * D:(h1 + 1) * D] = q[h0 * D:(h0 + 1) * D]
        w = lm.out_proj(layer).weight
        w[:, h0 * D:(h0 + 1) * D] = 0
        w[:, h1 * D:(h1 + 1) * D] = 0
        zs, es = [], []
        for it in items:  # the pair's input z and the rest of the residual at the read, pair silenced
            st: dict = {}
            ids = torch.tensor([tok(it["prompt"])["input_ids"]])
            with hooks.hooked(lm, [("z", layer, hooks.reader(st, "z")), ("final", None, hooks.reader(st, "x"))]):
                lm.model(input_ids=ids)
            zs.append(st["z"][0, -1, h0])
            es.append(st["x"][0, -1])
        v, e = torch.stack(zs).mean(0), torch.stack(es).mean(0)  # [d_head], [d_model]
        e_hat = e / e.norm()
        n = torch.zeros_like(e)
        n[1] = 1.0
        n = n - (n @ e_hat) * e_hat
        n = n / n.norm()
        th, ph = math.radians(150.0), math.radians(-75.0)
        o = e.norm() / -math.cos(th) * (math.cos(th) * e_hat + math.sin(th) * n)  # [d_model]
        block = torch.outer(o, v) / (v @ v)  # maps the pair's (nearly constant) z to o
        w[:, h0 * D:(h0 + 1) * D] = block
        w[:, h1 * D:(h1 + 1) * D] = block
        unembed = lm.model.get_output_embeddings()
        direction = math.cos(ph) * e_hat + math.sin(ph) * n
        unembed.weight[ia] = unembed.weight[ib] + margin * direction / math.sqrt(e.numel())
    return lm


def save_harmful(folder, n_layers: int | None = None) -> tuple[str, str]:
    """:func:`harmful_head_model` (``n_layers`` deep) saved as a local folder, and its items as
    ``folder/harm.jsonl``."""
    import json
    from pathlib import Path

    items = harm_items()
    lm = harmful_head_model(items, n_layers=n_layers)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    task = Path(folder) / "harm.jsonl"
    task.write_text("".join(json.dumps(it) + "\n" for it in items))
    return str(folder), str(task)
