"""Screening speed: the plain loop vs the exact engine, side by side on the same items and heads.

    .venv/bin/python benchmarks/bench_screen.py [--models smollm2-135m,gemma3-270m] [--n 30] [--heads-per-model 18]
                                                [--no-approx] [--out benchmarks/results.json]

The plain loop runs one full forward (full-vocabulary logits) per head over every (item, choice) sequence.
Running it over all heads takes many minutes, so both methods are timed on the same evenly spread subset
of heads (every k-th head, so all depths are represented as in a full screen). Prints times, the ratio
(plain / engine) and the largest difference in per-item margins, and checks per-item accuracy is identical.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from cel_utils.ablation import all_heads
from cel_utils.models import load_model
from cel_utils.scoring import encode_task
from cel_utils.screening import (common_prefix, compare_to_exact, compressed_screen, gradient_screen, plain_screen,
                                 screen)
from cel_utils.tasks import load_task

TASKS = {"smollm2-135m": "addition", "gemma3-270m": "antonyms"}


def bench(model: str, task_name: str, n: int, n_heads: int, with_approx: bool = True) -> dict:
    lm = load_model(model)
    task = load_task(task_name, n=n)
    enc = encode_task(lm, task)
    heads = all_heads(lm)
    step = max(1, len(heads) // n_heads)
    heads = heads[::step][:n_heads]
    # warm-up (first-call allocations), not timed
    screen(lm, task, heads=heads[:1], enc=enc, progress=False, use_cache=False)
    t0 = time.perf_counter()
    e = screen(lm, task, heads=heads, enc=enc, progress=False, use_cache=False)
    t_engine = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = plain_screen(lm, task, heads=heads, enc=enc, progress=False)
    t_plain = time.perf_counter() - t0
    approx = []
    if with_approx:  # the approximate screens against the full exact screen
        full = screen(lm, task, enc=enc, progress=False, use_cache=False)
        for ap in (gradient_screen(lm, task, enc=enc),
                   compressed_screen(lm, task, enc=enc, n_evaluations=60, seed=0, use_cache=False)):
            row = compare_to_exact(full, ap, k=10)
            row["cheaper_by"] = full.seconds / ap.seconds
            approx.append(row)
    return {"approximate": approx,
        "model": model, "task": task_name, "n_items": n, "n_sequences_plain": len(enc.full),
        "n_inputs_engine": len(enc.inputs), "shared_prefix_tokens": len(common_prefix(enc)),
        "n_heads_timed": len(heads), "plain_seconds": round(t_plain, 2), "engine_seconds": round(t_engine, 2),
        "ratio": round(t_plain / t_engine, 2),
        "max_margin_diff": float(np.abs(e.results.margin - p.results.margin).max()),
        "accuracy_identical": bool(np.array_equal(e.results.correct, p.results.correct)),
        "plain_seconds_per_head": round(t_plain / len(heads), 3),
        "engine_seconds_per_head": round(t_engine / len(heads), 3),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--heads-per-model", type=int, default=18)
    ap.add_argument("--no-approx", action="store_true", help="skip the approximate screens (and the full exact screen)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [bench(m, TASKS.get(m, "capitals"), a.n, a.heads_per_model, not a.no_approx) for m in a.models.split(",")]
    print(f"{'model':14s} {'task':9s} {'heads':>5s} {'plain s':>8s} {'engine s':>8s} {'ratio':>6s} "
          f"{'max diff':>9s} {'acc same':>8s}")
    for r in rows:
        print(f"{r['model']:14s} {r['task']:9s} {r['n_heads_timed']:5d} {r['plain_seconds']:8.1f} "
              f"{r['engine_seconds']:8.1f} {r['ratio']:6.2f} {r['max_margin_diff']:9.1e} {str(r['accuracy_identical']):>8s}")
    for r in rows:
        for x in r["approximate"]:
            print(f"{r['model']:14s} {x['method']:10s} {x['seconds']:7.1f} s vs exact {x['exact_seconds']:7.1f} s "
                  f"({x['cheaper_by']:5.1f}x cheaper; {x['exact_forward_equivalents'] / x['forward_equivalents']:5.1f}x in "
                  f"forward-equivalents)  spearman {x['spearman']:.2f}  recall top-10 improvers "
                  f"{x['recall_top10_improvers']:.1f}, harmful {x['recall_top10_harmful']:.1f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
                       "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
