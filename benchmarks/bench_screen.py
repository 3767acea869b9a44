"""Screening speed: the plain loop vs the exact engine, side by side on the same items and heads.

    .venv/bin/python benchmarks/bench_screen.py [--models smollm2-135m,gemma3-270m] [--n 30] [--heads-per-model 18]
                                                [--no-approx] [--out benchmarks/results.json]

The plain loop runs one full forward (full-vocabulary logits) per head over every (item, choice) sequence.
Running it over all heads takes many minutes, so both methods are timed on the same evenly spread subset
of heads (every k-th head, so all depths are represented as in a full screen). Prints times, the ratio
(plain / engine) and the largest difference in per-item margins, and checks per-item accuracy is identical.
The measurement itself is :func:`cel_utils.approximate.benchmark` (chapter 1b calls it too); here the full
exact screen is always recomputed (never read from the result cache).
"""

from __future__ import annotations

import argparse
import json
import os
import platform

from cel_utils.approximate import benchmark
from cel_utils.models import load_model
from cel_utils.tasks import load_task

TASKS = {"smollm2-135m": "addition", "gemma3-270m": "antonyms"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--heads-per-model", type=int, default=18)
    ap.add_argument("--no-approx", action="store_true", help="skip the approximate screens (and the full exact screen)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for m in a.models.split(","):
        task = load_task(TASKS.get(m, "capitals"), n=a.n)
        rows.append(benchmark(load_model(m), task, n_plain_heads=a.heads_per_model, approx=not a.no_approx,
                              exact_from_cache=False))
    print(f"{'model':14s} {'task':9s} {'heads':>5s} {'plain s':>8s} {'engine s':>8s} {'ratio':>6s} "
          f"{'max diff':>9s} {'acc same':>8s}")
    for r in rows:
        s = r["speed"]
        n = s["heads timed"]
        print(f"{s['model']:14s} {s['task']:9s} {n:5d} {s['plain s/head'] * n:8.1f} "
              f"{s['engine s/head'] * n:8.1f} {s['ratio']:6.2f} {s['max margin diff']:9.1e} "
              f"{str(s['accuracy identical']):>8s}")
    for r in rows:
        for x in r["agreement"]:
            if x["method"] == "exact":
                continue
            print(f"{x['model']:14s} {x['method']:10s} {x['seconds']:7.1f} s vs exact {x['exact_seconds']:7.1f} s "
                  f"({x['cheaper_by']:5.1f}x cheaper; {x['cheaper_by_forward_equivalents']:5.1f}x in "
                  f"forward-equivalents)  spearman {x['spearman']:.2f}  recall top-10 improvers "
                  f"{x['recall_top10_improvers']:.1f}, harmful {x['recall_top10_harmful']:.1f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "results": rows},
                      f, indent=2)


if __name__ == "__main__":
    main()
