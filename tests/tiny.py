"""Tiny random-init models of every supported family, built from a config (no download)."""

from __future__ import annotations

import string

import torch

from cel_utils.models import wrap_model

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


def tiny_model(family: str = "llama", seed: int = 0):
    import transformers

    tok = char_tokenizer()
    cls_name, kw = FAMILY_CONFIGS[family]
    cfg = getattr(transformers, cls_name)(vocab_size=len(tok), **kw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    # random init is small; scale up so that heads matter and logits differ visibly
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    return wrap_model(model.float().eval(), tok, name=f"tiny-{family}")


def save_tiny(folder, family: str = "llama") -> str:
    """Save a tiny model and its tokenizer as a local folder, as a user's own model would be."""
    lm = tiny_model(family)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return str(folder)
