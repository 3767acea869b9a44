"""The ``cel`` command's argument parser and the helpers every command uses (output, the run's header, the
model and task, the ablation, the numeric checks); the commands are in :mod:`cel_utils.cli_screen` and
:mod:`cel_utils.cli`.

The choices of ``--mode`` come from :data:`cel_utils.ablation.KINDS`, those of ``cel search --strategy`` and
``cel screen --method`` from the selector registry (:data:`cel_utils.selectors.REGISTRY`): a kind or a selector
added there is offered here with no other edit.

Example:
    >>> build_parser().parse_args(["eval", "--model", "m", "--task", "t", "--mode", "scale", "--alpha", "2"]).alpha
    2.0
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import __version__, defaults
from .ablation import KINDS
from .errors import CELError
from .io import dumps, write_json_atomic
from .selectors import REGISTRY
from .tasks import SPLITS


class Parser(argparse.ArgumentParser):
    """argparse with the command's convention for bad input: one line on stderr, exit status 2."""

    def error(self, message):
        print(f"cel: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_shard_arg(text: str) -> tuple[int, int]:
    """``--shard K/N`` for argparse (:func:`cel_utils.shards.parse_shard`, its error as argparse's)."""
    from .shards import parse_shard

    try:
        return parse_shard(text)
    except CELError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def common(sp) -> None:
    """The options every model command takes."""
    sp.add_argument("--model", required=True, help="built-in name, local folder or Hugging Face id")
    sp.add_argument("--task", required=True, help="built-in task name or path to a .jsonl file")
    sp.add_argument("--split", default=None, choices=list(SPLITS),
                    help="built-in tasks: search (default), confirm or heldout; a JSONL file: all items unless given")
    sp.add_argument("--n", type=int, default=None, help="number of items (default: all of the split)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--mode", default="zero", choices=list(KINDS),
                    help="how a head is removed (cel_utils.ablation.KINDS): zero, mean, resample, scale "
                         "(with --alpha); constant is fit by cel robust")
    sp.add_argument("--alpha", type=float, default=None,
                    help="--mode scale: the factor a removed head's output is multiplied by (0: zero ablation, "
                         "1: the intact model, above 1: boosted)")
    sp.add_argument("--out", default=None, help="write JSON here (default: stdout)")
    sp.add_argument("--device", default="cpu", help="cpu (default, tested) or cuda")
    sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="weights dtype (float32 default and tested; bfloat16 on GPUs)")
    sp.add_argument("--no-cache", action="store_true",
                    help="do not read or write the result cache ($CEL_CACHE_DIR, default ~/.cache/cel_utils)")
    sp.add_argument("--max-tokens", type=int, default=defaults.MAX_TOKENS,
                    help=f"padded tokens per forward pass: bounds memory (default {defaults.MAX_TOKENS})")


def add_screen(sub) -> None:
    """``cel screen``: every head ablated alone (shards, Ray, confirm and held-out checks)."""
    sp = sub.add_parser("screen", help="ablate each head alone")
    common(sp)
    sp.add_argument("--heads", default=None, help="heads to screen (default: all), e.g. L0H6,L3 or all")
    methods = [x.method for x in REGISTRY.values() if x.method]
    sp.add_argument("--method", default="exact", choices=methods,
                    help="exact (default) or an approximate screen of the selector registry (margins only): "
                        + ", ".join(m for m in methods if m != "exact"))
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.add_argument("--heldout", action="store_true",
                    help="re-check the candidate heads on the held-out split (same --n) in the same run")
    sp.add_argument("--confirm", type=int, default=None, metavar="C",
                    help="re-test the top --top heads (by margin) on C items of the confirm split")
    sp.add_argument("--top", type=int, default=defaults.CONFIRM_TOP_K,
                    help=f"heads re-tested with --confirm (default {defaults.CONFIRM_TOP_K})")
    sp.add_argument("--fdr", type=float, default=defaults.FDR,
                    help=f"false-discovery rate of the candidate and confirmation rules (default {defaults.FDR:g})")
    sp.add_argument("--shard", type=parse_shard_arg, default=None,
                    help="K/N: screen only shard K of N (by layer); combine the outputs with `cel merge`")
    sp.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                    help="evaluate the chunks on a pool of Ray workers, each loading the model once: the Ray cluster at "
                        "ADDRESS (host:port, ray://host:port or auto), or without it a local Ray with this machine's "
                        f"cores; needs the extra: {defaults.CLUSTER_INSTALL}")
    sp.add_argument("--workers", type=int, default=None,
                    help="with --ray: workers in the pool (default: one per GPU with --device cuda, else one per "
                        "--threads CPUs), never more than the chunks")
    sp.add_argument("--threads", type=int, default=None,
                    help="with --ray: CPU threads each worker reserves and gives torch (default 1)")
    sp.add_argument("--chunk-layers", type=int, default=defaults.SCREEN_CHUNK_LAYERS,
                    help=f"layers per chunk, the unit of work and of the result cache (default "
                        f"{defaults.SCREEN_CHUNK_LAYERS}); the output does not depend on it")


def add_search(sub) -> None:
    """``cel search``: a selector of the registry, its sets graded on held-out items."""
    sp = sub.add_parser("search", help="joint ablation search over the top screened heads")
    common(sp)
    sp.add_argument("--screen", default=None, help="a `cel screen --out` file to take the pool from")
    sp.add_argument("--pool", type=int, default=None,
                    help=f"top m heads of the screen (default 8, m <= {defaults.SEARCH_POOL_MAX}; not with gates)")
    sp.add_argument("--max-size", type=int, default=3, help="the best set of each size up to this is graded")
    sp.add_argument("--strategy", default="greedy", choices=list(REGISTRY),
                    help="a way of choosing heads from the selector registry (cel_utils.selectors): "
                         + ", ".join(REGISTRY) + "; the pool strategies ("
                         + ", ".join(k for k, x in REGISTRY.items() if x.pool_based) + ") search the top --pool "
                         "screened heads, the others every head")
    sp.add_argument("--random-sets", type=int, default=defaults.RANDOM_SETS)
    sp.add_argument("--gate-steps", type=int, default=None,
                    help=f"gates: training steps (default {defaults.GATE_STEPS})")
    sp.add_argument("--gate-penalty", default=None,
                    help="gates: penalty per expected head removed, or a comma list (a sweep; default "
                         f"{','.join(f'{p:g}' for p in defaults.GATE_PENALTIES)})")


def add_verdict(sub) -> None:
    """``cel verdict``: search -> confirm -> held-out for one task."""
    sp = sub.add_parser("verdict", help="search -> confirm -> held-out for one task, with the power of the whole pipeline")
    common(sp)
    sp.add_argument("--n-search", type=int, default=defaults.N_SEARCH, help="search items (every head screened)")
    sp.add_argument("--n-confirm", type=int, default=defaults.N_CONFIRM, help="confirm items (the top heads re-tested)")
    sp.add_argument("--n-heldout", type=int, default=defaults.N_HELDOUT, help="held-out items (the final test)")
    sp.add_argument("--top-k", type=int, default=defaults.CONFIRM_TOP_K, help="heads re-tested on the confirm split")
    sp.add_argument("--fdr", type=float, default=defaults.FDR)
    sp.add_argument("--heads", default=None, help="heads to screen (default: all), e.g. L0H6,L3 or all")
    sp.add_argument("--power-sims", type=int, default=defaults.POWER_SIMS,
                    help="simulations of the whole pipeline's power (0: skip)")
    sp.add_argument("--items", default=None, metavar="CSV",
                    help="also write the confirm and held-out per-item outcomes here (what cel stats reads)")
    sp.add_argument("--rank-dtype", choices=["float32", "bfloat16", "auto"], default="float32",
                    help="dtype of the search screen, which only ranks (chapter 1a: bfloat16); confirm and held-out "
                        "stay float32")


def add_robust(sub) -> None:
    """``cel robust``: the battery on one head set."""
    sp = sub.add_parser("robust", help="is it a capability? formats, free generation, ablation types, label shift, "
                                      "collateral, a label")
    common(sp)
    sp.add_argument("--heads", required=True, help="the head set removed together, e.g. L13H0 or L0H7,L11H6")
    sp.add_argument("--text-tokens", type=int, default=defaults.TEXT_TOKENS,
                    help="tokens of general English text for the change in NLL (0: skip)")
    sp.add_argument("--constant-steps", type=int, default=defaults.CONSTANT_STEPS,
                    help="gradient rounds of the best-constant ablation (0: skip)")
    sp.add_argument("--other-tasks", default=None, help="tasks on which the cost is measured (comma list)")
    sp.add_argument("--items", default=None, metavar="SPLIT:FIRST[,SPLIT:FIRST]",
                    help="the battery's items: the tails of these splits from these items on, in order, up to --n "
                         "(chapter 1c: heldout:200,confirm:200, after the items its verdicts used)")


def build_parser() -> argparse.ArgumentParser:
    """The ``cel`` parser: one subcommand per command of :mod:`cel_utils.cli` (``args.cmd`` names it)."""
    p = Parser(prog="cel", description="Capability enhancement localization: head-ablation tools.")
    p.add_argument("--version", action="version", version=f"cel {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    sub.add_parser("models", help="list built-in models")
    sub.add_parser("tasks", help="list built-in tasks")
    e = sub.add_parser("eval", help="evaluate with a head set ablated together")
    common(e)
    e.add_argument("--ablate", default="", help="heads, e.g. L0H6,L1H1")
    add_screen(sub)
    add_search(sub)
    mg = sub.add_parser("merge", help="combine `cel screen --shard K/N` outputs into one screen")
    mg.add_argument("files", nargs="+")
    mg.add_argument("--out", default=None)
    add_verdict(sub)
    add_robust(sub)
    add_calibrate(sub)
    add_stats(sub)
    add_export(sub)
    x = sub.add_parser("explain", help="what one head does: direct vs total effect, tokens it writes, where it reads")
    common(x)
    x.add_argument("--head", required=True, help="one head, e.g. L13H0")
    t = sub.add_parser("theory", help="train the toy multi-head attention model of chapter 3")
    for flag, typ, default in (("--heads", int, 4), ("--sigma", float, 1e-4), ("--seed", int, 0),
                               ("--steps", int, 4000), ("--lr", float, 0.5)):
        t.add_argument(flag, type=typ, default=default)
    t.add_argument("--attention", default="softmax", choices=["softmax", "softmax1", "gated"],
                   help="the heads: softmax (chapter 3), softmax1 (can attend to nothing) or gated (a learned output "
                        "gate per head; chapter 3a)")
    t.add_argument("--out", default=None)
    tt = sub.add_parser("toy-train", help="train chapter 3a's one-layer attention-only transformer on the toy's data "
                                          "as tokens, and (--verdict) run the book's pipeline on every run")
    tt.add_argument("--attention", default="softmax", choices=["softmax", "softmax1"],
                    help="softmax, or softmax1 (a null token with a zero embedding first: heads can attend to nothing)")
    tt.add_argument("--seeds", type=int, default=20, help="runs per initial scale")
    tt.add_argument("--scale", default="1.0", help="initial scale(s) of the weights, comma-separated")
    tt.add_argument("--steps", type=int, default=defaults.TOYNET_STEPS)
    tt.add_argument("--verdict", action="store_true", help="the verdict pipeline on toy_a for every run")
    tt.add_argument("--export", default=None, metavar="DIR", help="write every run as a local model folder in DIR")
    tt.add_argument("--out", default=None)
    le = sub.add_parser("lm-eval", add_help=False,
                        help="lm-evaluation-harness's command line with the model type `cel` (heads removed)")
    le.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="lm_eval's own arguments")
    ex = sub.add_parser("exercises", help="the checked exercises: list them, or grade a learner's notebook offline")
    ex_sub = ex.add_subparsers(dest="action", required=True, parser_class=Parser)
    ex_sub.add_parser("list", help="one line per checked exercise: label, chapter, function, check")
    exc = ex_sub.add_parser("check", help="grade a notebook's exercise functions (the notebook itself is not run)")
    exc.add_argument("notebook", help="a learner's .ipynb file, or a folder of submissions (every .ipynb under it; "
                                      "the student is its first path part below the folder)")
    exc.add_argument("--summary", default=None, metavar="FILE",
                     help="with a folder: write one row per student and exercise to FILE (.csv or .json)")
    exc.add_argument("--chapter", default=None,
                     help="grade this chapter's exercises (e.g. 01_screening; 'all': every one); default: the "
                          "chapter whose exercise labels the notebook carries, or that its file is named after")
    return p


def add_export(sub) -> None:
    """``cel export``: a head set's removal written into the weights, as a standard model folder."""
    text = ("write the model with a head set removed (zero, scale or mean) into its weights, as a standard Hugging "
            "Face model folder that plain transformers loads")
    c = sub.add_parser("export", help=text, description=text[0].upper() + text[1:] + ".")
    c.add_argument("--model", required=True, help="built-in name, local folder or Hugging Face id")
    c.add_argument("--heads", required=True, help="the set, e.g. L14H8 or L0H7,L11H6 (or L0H7+L11H6)")
    c.add_argument("--mode", default="zero", help="zero (default), scale (with --alpha) or mean (with --means-task)")
    c.add_argument("--alpha", type=float, default=None, help="--mode scale: the factor the heads' output is "
                                                              "multiplied by")
    c.add_argument("--means-task", default=None, help="--mode mean: the task whose search-split prompts give the "
                                                       "head means")
    c.add_argument("--record", default=None, help="a verdict or chapter record (JSON): its held-out figures for "
                                                   "this set go into the model card")
    c.add_argument("--out", required=True, help="the folder to write (must not exist or be empty)")
    c.add_argument("--force", action="store_true", help="replace a non-empty --out folder")
    c.add_argument("--device", default="cpu", help="where the model is loaded and edited (cpu, default; or cuda)")
    c.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the weights' dtype, as loaded and as written")


def add_calibrate(sub) -> None:
    """``cel calibrate``: which candidate tasks leave room, on the search split only."""
    c = sub.add_parser("calibrate", help="which tasks leave room: each candidate's accuracy on its search split")
    c.add_argument("--model", required=True, help="built-in name, local folder or Hugging Face id")
    c.add_argument("--tasks", default="variants",
                   help="comma-separated built-in tasks, or 'variants' (every family's base task and variants)")
    c.add_argument("--n", type=int, default=defaults.CALIBRATION_ITEMS, help="search items per task")
    c.add_argument("--band", default=",".join(map(str, defaults.CALIBRATION_BAND)),
                   help="LOW,HIGH: the accuracies that leave room (default %(default)s)")
    c.add_argument("--per-model", type=int, default=4, help="tasks picked (one per family first)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default=None, help="write JSON here (default: stdout)")
    c.add_argument("--device", default="cpu")
    c.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])


def add_stats(sub) -> None:
    """``cel stats``: the book's confirm -> held-out verdict on anyone's per-item outcomes."""
    c = sub.add_parser("stats", help="the book's verdict on a table of per-item outcomes (item, split, condition, "
                                     "correct and/or margin): McNemar with BH then Holm, paired bootstrap CIs, MDE")
    c.add_argument("table", help="a .csv, .jsonl or .json table (cel_utils.outcomes describes its columns)")
    c.add_argument("--baseline", default="baseline", help="the condition naming the unablated model")
    c.add_argument("--family", default="confirmed", choices=["confirmed", "offered"],
                   help="sets tested on held-out items: the confirmed ones and all of them together (cel verdict), "
                        "or every condition offered")
    c.add_argument("--fdr", type=float, default=defaults.FDR, help="Benjamini-Hochberg level on the confirm split")
    c.add_argument("--alpha", type=float, default=defaults.ALPHA, help="Holm level on the held-out split")
    c.add_argument("--n-boot", type=int, default=defaults.N_BOOT)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--model", default="", help="recorded as is")
    c.add_argument("--task", default="", help="recorded as is")
    c.add_argument("--out", default=None, help="write JSON here (default: stdout)")


def check_out(path: str | None) -> None:
    """Fail early (before any work) if the output file cannot be written."""
    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise CELError(f"cannot write {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise CELError(f"cannot write {path}: folder {parent} is not writable")
    if Path(path).is_dir():
        raise CELError(f"cannot write {path}: it is a folder")


def emit(obj, out: str | None) -> None:
    if out:
        write_json_atomic(out, obj)
        print(f"wrote {out}", file=sys.stderr)
    else:
        print(dumps(obj), end="")


def header(lm, task, args) -> dict:
    return {"model": args.model, "task": task.name, "split": task.split, "n_items": len(task.items),
            "seed": args.seed, "mode": args.mode, **({"alpha": args.alpha} if args.mode == "scale" else {}),
            "device": args.device, "dtype": args.dtype,
            "provenance": {"cel_utils": __version__, "weights_hash": lm.weights_hash,
                           "task_items_hash": task.items_hash(), "task_source": task.source}}


def load_run(args, task=None, device=None):
    """The run's task (cheap checks first; ``task`` when already loaded) and model (on ``device``, default
    ``--device``)."""
    from .models import load_model
    from .tasks import load_task

    task = task or load_task(args.task, split=args.split, n=args.n, seed=args.seed)
    lm = load_model(args.model, device=device or args.device, dtype=args.dtype)
    return lm, task


def ablation_of(lm, enc, args):
    """The run's ablation (``--mode``, ``--alpha``), resolved once on the items of the run (mean and resample:
    their head means)."""
    from .ablation import Ablation

    return Ablation.of(args.mode, alpha=args.alpha).resolved(lm, enc.inputs)


def check_sizes(args) -> None:
    """Numeric options and the ablation kind checked before anything is loaded."""
    mode, alpha = getattr(args, "mode", "zero"), getattr(args, "alpha", None)
    if mode == "constant":
        raise CELError("constant ablation is fit on the search split by `cel robust` (its best constant): "
                       "use --mode zero, mean, resample or scale")
    if (mode == "scale") != (alpha is not None):
        raise CELError("--alpha goes with --mode scale (the factor a removed head's output is multiplied by)")
    if getattr(args, "max_tokens", 1) < 1:
        raise CELError("--max-tokens must be at least 1")
    if getattr(args, "n", None) is not None and args.n < 1:
        raise CELError(f"--n must be at least 1, got {args.n}")
