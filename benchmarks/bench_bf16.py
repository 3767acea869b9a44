"""The search screen in bfloat16 against float32, side by side on the same items and heads.

    .venv/bin/python benchmarks/bench_bf16.py [--models smollm2-135m,gemma3-270m] [--tasks addition,agreement_rc]
                                              [--n 32] [--out benchmarks/bf16.json]

For each model and task: a full exact screen (every head removed alone) of the search split in float32 and in
bfloat16 (``cel_utils.models.cast``), both computed here (the result cache is off), one after the other in one
process. Prints the wall-time ratio (float32 / bfloat16), the Spearman correlation of the per-head changes in
mean margin, the overlap of the top 10 heads by that change (the ranking the verdict uses), and the unablated
accuracy in each dtype (bfloat16 moves it: a ranker, not a reporter: every number a reader sees stays float32).
On a CPU without native bfloat16 products (``cel_utils.models.native_bfloat16()`` False, e.g. an AVX2-only AMD
EPYC) the ratio is far below 1 (bfloat16 emulated, tens of times slower) and a full screen takes hours: the book
ranks in float32 there by default.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from scipy.stats import spearmanr

from cel_utils.models import cast, load_model
from cel_utils.screening import screen
from cel_utils.tasks import load_task


def compare(lm, task_name: str, n: int) -> dict:
    task = load_task(task_name, "search", n=n, clip=True)
    out = {"model": lm.name, "task": task_name, "items": len(task)}
    screens = {}
    for dtype in ("float32", "bfloat16"):
        m = cast(lm, dtype)
        screen(m, task, heads=[(0, 0)], progress=False, result_cache=False)  # warm-up, not timed
        t0 = time.perf_counter()
        screens[dtype] = screen(m, task, progress=False, result_cache=False)
        out[f"{dtype} s"] = time.perf_counter() - t0
        out[f"{dtype} accuracy"] = float(screens[dtype].baseline.accuracy[0])
    a, b = (screens[d].table.set_index("head")["delta_margin"] for d in ("float32", "bfloat16"))
    out["ratio"] = out["float32 s"] / out["bfloat16 s"]
    out["spearman"] = float(spearmanr(a, b.loc[a.index]).statistic)
    out["top10 overlap"] = len(set(a.nlargest(10).index) & set(b.nlargest(10).index))
    out["top5 overlap"] = len(set(a.nlargest(5).index) & set(b.nlargest(5).index))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--tasks", default="addition,agreement_rc")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [compare(load_model(m), t, a.n) for m in a.models.split(",") for t in a.tasks.split(",")]
    print(f"{'model':14s} {'task':13s} {'items':>5s} {'fp32 s':>7s} {'bf16 s':>7s} {'ratio':>6s} {'spearman':>8s} "
          f"{'top10':>5s} {'top5':>4s} {'acc fp32':>8s} {'acc bf16':>8s}")
    for r in rows:
        print(f"{r['model']:14s} {r['task']:13s} {r['items']:5d} {r['float32 s']:7.1f} {r['bfloat16 s']:7.1f} "
              f"{r['ratio']:6.2f} {r['spearman']:8.3f} {r['top10 overlap']:5d} {r['top5 overlap']:4d} "
              f"{r['float32 accuracy']:8.3f} {r['bfloat16 accuracy']:8.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "results": rows},
                      f, indent=2)


if __name__ == "__main__":
    main()
