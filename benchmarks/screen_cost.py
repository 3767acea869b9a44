"""The cost of a full exact screen from the engine's own accounting, for a model of any size (no forward pass is run;
only the items are tokenized, with the tokenizer of a model you have):

    .venv/bin/python benchmarks/screen_cost.py --tokenizer smollm2-135m --task addition --n 32 \\
        --layers 32 --heads 32 --params 8.0e9 [--chunk-layers 6] [--tflops 100] [--out cost.json]

* forward-equivalents (clean full forwards over the items): the sum over the screen's chunks
  (``cel_utils.screening.chunk_sets``) of ``cel_utils.engine.forward_equivalents(L, chunk_head_sets(chunk))``, which
  is ``chunks + heads_per_layer * (L + 1) / 2``: each chunk runs one clean pass, and a head in layer ``l`` reruns the
  layers from ``l`` up, ``(L - l) / L`` of a forward;
* tokens per clean pass: ``cel_utils.engine.pass_tokens`` of the items tokenized by ``--tokenizer`` (the shared
  few-shot prefix once per batch, sequences padded to their batch's longest);
* FLOPs ~ 2 x parameters x tokens per clean pass x forward-equivalents (the matrix products; attention over these
  short sequences adds a few per cent);
* time = FLOPs / the sustained throughput of one GPU, ``--tflops``: an assumption you supply, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import types

from cel_utils.engine import forward_equivalents, pass_tokens
from cel_utils.scoring import encode_task
from cel_utils.screening import chunk_head_sets, chunk_sets
from cel_utils.tasks import load_task


def load_tokenizer(name: str):
    """The tokenizer alone of a built-in model (read from its GGUF file) or of a local folder."""
    from transformers import AutoTokenizer

    from cel_utils.models import BUILTIN_MODELS

    if name in BUILTIN_MODELS:
        path = BUILTIN_MODELS[name].gguf_path()
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(name, local_files_only=True)


def screen_forward_equivalents(n_layers: int, n_heads: int, chunk_layers: int) -> tuple[float, int]:
    """(forward-equivalents of a full screen, chunks), from the engine's accounting chunk by chunk."""
    chunks = chunk_sets([(l, h) for l in range(n_layers) for h in range(n_heads)], chunk_layers)
    return sum(forward_equivalents(n_layers, chunk_head_sets(c)) for c in chunks), len(chunks)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="smollm2-135m", help="built-in model or local folder whose tokenizer to use")
    ap.add_argument("--task", default="addition")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32, help="query heads per layer")
    ap.add_argument("--params", type=float, default=8.0e9)
    ap.add_argument("--chunk-layers", type=int, default=6)
    ap.add_argument("--tflops", type=float, default=None, help="assumed sustained TFLOP/s of one GPU")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    enc = encode_task(types.SimpleNamespace(tokenizer=load_tokenizer(a.tokenizer)),   # encode_task reads the tokenizer
                      load_task(a.task, n=a.n))
    fe, n_chunks = screen_forward_equivalents(a.layers, a.heads, a.chunk_layers)
    tokens = pass_tokens(enc)
    flops = 2 * a.params * tokens * fe
    row = {"layers": a.layers, "heads_per_layer": a.heads, "heads": a.layers * a.heads, "chunks": n_chunks,
           "forward_equivalents": fe, "task": a.task, "n_items": enc.n_items, "tokenizer": a.tokenizer,
           "tokens_per_clean_pass": tokens, "tokens_without_prefix_sharing": pass_tokens(enc, share_prefix=False),
           "params": a.params, "flops": flops}
    if a.tflops:
        row["assumed_tflops"] = a.tflops
        row["gpu_seconds"] = flops / (a.tflops * 1e12)
    for k, v in row.items():
        print(f"{k:32s} {v:.4g}" if isinstance(v, float) else f"{k:32s} {v}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(row, f, indent=2)


if __name__ == "__main__":
    main()
