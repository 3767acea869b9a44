"""The ``cel`` commands that screen heads and choose among them: ``cel screen`` (exact, sharded, on a Ray pool,
or an approximate ranking selector; with held-out and confirm re-checks), ``cel search`` (a selector of the
registry, its sets graded on held-out items) and ``cel merge``."""

from __future__ import annotations

from . import defaults
from .cli_common import ablation_of, check_out, check_sizes, emit, header, load_run
from .errors import CELError


def _approximate_screen(lm, task, enc, heads, ablation, args) -> dict:
    """An approximate screen: the ranking selector of the registry whose ``method`` is ``--method``."""
    from .design import Design
    from .selectors import REGISTRY, Context

    sel = next(x for x in REGISTRY.values() if x.method == args.method)
    ctx = Context(lm=lm, grad_lm=lm, search=task, enc=enc, design=Design(mode=ablation, seed=args.seed),
                  progress=not args.quiet)
    ap = sel.rank(ctx)
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


def _check_screen_options(args) -> None:
    """``cel screen``'s options checked before anything is loaded (``--confirm`` screens the search split)."""
    check_out(args.out)
    from .ablation import check_head_spec

    check_head_spec(args.heads or "")
    check_sizes(args)
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


def _screened_heads(lm, args) -> list:
    """The heads ``cel screen`` screens: ``--heads`` (default all), the shard's share of them with ``--shard``."""
    from .ablation import all_heads, parse_heads

    heads = parse_heads(args.heads, lm.n_layers, lm.n_heads) if args.heads else all_heads(lm)
    if args.shard:
        from .shards import shard_heads

        k, n = args.shard
        heads = shard_heads(heads, k, n)
        if not heads:
            raise CELError(f"shard {k}/{n} holds no heads: it screens the layers {k - 1} modulo {n}, and no screened "
                           f"head is in one (the model has {lm.n_layers} layers): use fewer shards")
    return heads


def _exact_screen(lm, task, enc, heads, ablation, args):
    """The exact screen (on a Ray pool with ``--ray``) and its record; the timing apart."""
    from .screening import screen

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
        timing.update({k: sc.meta[k] for k in ("workers", "computed_chunks", "retried_chunks", "forwards")},
                      wall_seconds=round(sc.meta["wall_seconds"], 3))
    return sc, rec, timing


def cmd_screen(args):
    """``cel screen``: every head ablated alone (exact, or an approximate ranking selector), with the optional
    re-checks of its candidates on held-out items and of its top heads on confirm items."""
    from .scoring import encode_task

    _check_screen_options(args)
    # with --ray the driver's copy of the model (encoding, cache keys, mean-mode head means) stays on the CPU
    lm, task = load_run(args, device="cpu" if args.ray is not None else None)
    if args.heldout and task.split is None:
        raise CELError("--heldout needs a built-in task (a JSONL task has no held-out split)")
    heads = _screened_heads(lm, args)
    enc = encode_task(lm, task)
    ablation = ablation_of(lm, enc, args)
    out = header(lm, task, args)
    out["method"] = args.method
    if args.shard:
        from .shards import screen_heads_record

        out["shard"] = f"{args.shard[0]}/{args.shard[1]}"
        out["screen_heads"] = screen_heads_record(args.heads, lm.n_layers, lm.n_heads)
    if args.method != "exact":
        out.update(_approximate_screen(lm, task, enc, heads, ablation, args))
        emit(out, args.out)
        return
    sc, rec, timing = _exact_screen(lm, task, enc, heads, ablation, args)
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
    """The top --top heads of the screen re-tested on --confirm items of the confirm split
    (:func:`cel_utils.pipeline.confirm`)."""
    from .design import Design
    from .pipeline import confirm
    from .screening import confirmation_power
    from .tasks import load_task

    task = load_task(args.task, split="confirm", n=args.confirm, seed=args.seed)
    top = sc.top(args.top, by="delta_margin")
    offer = {name: [(int(l), int(h))] for name, l, h in zip(top["head"], top["layer"], top["head_index"])}
    tab, _ = confirm(lm, task, offer, Design(fdr=args.fdr, mode=ablation, seed=args.seed))
    n = len(task.items)
    pw = confirmation_power(tab["confirm_breaks"].to_numpy(), n, len(tab), args.fdr, defaults.POWER)
    cols = ["confirm_delta_accuracy", "confirm_ci_low", "confirm_ci_high", "confirm_fixes", "confirm_breaks",
            "confirm_p_value", "confirm_q_value"]
    return {"n_items": n, "fdr": args.fdr, "top": int(len(tab)),
            "rule": f"confirm_q_value < {args.fdr:g} (exact McNemar on fixes/breaks, Benjamini-Hochberg over the top "
                    f"{len(tab)} heads of the search split) and confirm_delta_accuracy > 0",
            "min_detectable_gain": pw["min_detectable_gain"],
            "min_detectable_gain_worst": pw["min_detectable_gain_worst"],
            "min_detectable_gain_assumes": {k: pw[k] for k in ("power", "alpha", "break_rate", "break_rate_worst")},
            "min_detectable_gain_note": "the confirm test alone, for heads already ranked in the top on the search "
                                        "split; cel verdict gives the power of the whole pipeline",
            "heads": [{"head": r["heads"], **{c: (int(r[c]) if c.endswith(("fixes", "breaks")) else float(r[c]))
                                              for c in cols}, "confirmed": bool(r["confirmed"])}
                      for r in tab.to_dict("records")]}


def _gate_settings(args):
    """The gate options of ``cel search``, checked before anything is loaded (None for the other strategies)."""
    given = [f"--{k.replace('_', '-')}" for k in ("gate_steps", "gate_penalty") if getattr(args, k) is not None]
    if args.strategy != "gates":
        if given:
            raise CELError(f"{' and '.join(given)} only apply to --strategy gates")
        return None
    from .gates import GateSettings

    try:
        penalties = tuple(float(p) for p in args.gate_penalty.split(",")) if args.gate_penalty is not None \
            else defaults.GATE_PENALTIES
    except ValueError:
        raise CELError(f"--gate-penalty takes numbers separated by commas, got {args.gate_penalty!r}") from None
    s = GateSettings(steps=args.gate_steps if args.gate_steps is not None else defaults.GATE_STEPS,
                     penalties=penalties, max_k=args.max_size, seed=args.seed, progress=False)
    s.check()
    return s


def cmd_search(args):
    """``cel search``: a selector of the registry offers sets on the search split; each is graded on held-out
    items (:func:`cel_utils.selectors.search`)."""
    from .ablation import parse_heads
    from .design import Design
    from .selectors import Options, selector, search
    from .shards import ranked_from_screen_file
    from .tasks import load_task

    check_out(args.out)
    check_sizes(args)
    if args.max_size < 1 or args.random_sets < 0:
        raise CELError("--max-size must be at least 1 and --random-sets at least 0")
    sel = selector(args.strategy)
    gate_settings = _gate_settings(args)
    if not sel.pool_based and (args.screen is not None or args.pool is not None):
        raise CELError(f"--strategy {args.strategy} chooses among every head: leave out --screen and --pool")
    if sel.key == "boost" and (args.mode != "zero" or args.alpha is not None):
        raise CELError("--strategy boost chooses its own dose (a scale above 1, on the search split): leave out "
                       "--mode and --alpha")
    pool = 8 if args.pool is None else args.pool
    if sel.pool_based and not 1 <= pool <= defaults.SEARCH_POOL_MAX:
        raise CELError(f"--pool must be between 1 and {defaults.SEARCH_POOL_MAX}")
    args.split = "search"  # the search runs on the search split and is graded on the held-out split
    task = load_task(args.task, split="search", n=args.n, seed=args.seed)
    ranked = ranked_from_screen_file(args.screen, {"model": args.model, "task": task.name, "split": task.split,
                                                   "seed": args.seed, "n_items": len(task.items)}) \
        if args.screen else None
    lm, task = load_run(args, task)
    held = load_task(args.task, split="heldout", n=args.n, seed=args.seed)
    from .ablation import Ablation

    d = Design(max_k=args.max_size, mode=Ablation.of(args.mode, alpha=args.alpha), seed=args.seed)
    opts = Options(pool_size=pool, gates=gate_settings, random_sets=args.random_sets)
    res = search(lm, task, held, args.strategy, d, opts, ranked=None if ranked is None else parse_heads(
        [(h["layer"], h["head"]) for h in ranked], lm.n_layers, lm.n_heads))
    out = header(lm, task, args)
    secs = res.pop("search_seconds")
    out.update(res)
    out["timing"] = {"seconds": round(secs, 3)}
    emit(out, args.out)


def cmd_merge(args):
    """Combine shard outputs of one screen into the screen an unsharded run gives."""
    from .shards import merge

    check_out(args.out)
    emit(merge(args.files), args.out)
