"""Screening speed: the plain loop vs the exact engine, side by side on the same items and heads.

    .venv/bin/python benchmarks/bench_screen.py [--models smollm2-135m,gemma3-270m] [--n 40] [--heads-per-model 27]
                                                [--out benchmarks/results.json]

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
from cel_utils.screening import common_prefix, plain_screen, screen
from cel_utils.tasks import load_task

TASKS = {"smollm2-135m": "capitals", "gemma3-270m": "antonyms"}


def bench(model: str, task_name: str, n: int, n_heads: int) -> dict:
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
    return {
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
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--heads-per-model", type=int, default=18)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [bench(m, TASKS.get(m, "capitals"), a.n, a.heads_per_model) for m in a.models.split(",")]
    print(f"{'model':14s} {'task':9s} {'heads':>5s} {'plain s':>8s} {'engine s':>8s} {'ratio':>6s} "
          f"{'max diff':>9s} {'acc same':>8s}")
    for r in rows:
        print(f"{r['model']:14s} {r['task']:9s} {r['n_heads_timed']:5d} {r['plain_seconds']:8.1f} "
              f"{r['engine_seconds']:8.1f} {r['ratio']:6.2f} {r['max_margin_diff']:9.1e} {str(r['accuracy_identical']):>8s}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
                       "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
