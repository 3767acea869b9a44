"""The book's speed beside another process: each workload timed alone and beside one single-threaded busy loop at
the lowest priority (``nice -n 19``), under several thread settings, each run in a fresh Python process; the loop runs in a session of its own, as a
process started from another terminal does.

    .venv/bin/python benchmarks/bench_load.py [--workloads toy,screen] [--repeats 1]

Workloads: ``toy`` (chapter 3's toy model: a sweep of small full-batch gradient descents, small tensors, many
steps), ``screen`` (an exact single-head screen of SmolLM2's first 9 heads on 16 items: the large matrix products
of chapters 1-2). Settings: the book's own (:mod:`cel_utils.threads`: one thread for the toy, the free cores for
the real models), and torch's intra-op threads fixed at 2 (this machine's cores) or 1. Prints
one row per (workload, setting): seconds alone, seconds beside the loop, and their ratio. Run it with nothing else
on the machine: the ratios are the point, not the seconds.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

WORK = {
    "toy": "from cel_utils import theory\n"      # chapter 3's sweep at its head counts, fewer scales and steps
           "theory.sweep(sigmas=[1e-4, 1e-2, 0.3], heads=[2, 4, 8], n_seeds=20, steps=2000, lr=0.5)\n",
    "screen": "from cel_utils.models import load_model\nfrom cel_utils.engine import evaluate_head_sets\n"
              "from cel_utils.scoring import encode_task\nfrom cel_utils.tasks import load_task\n"
              "lm = load_model('smollm2-135m')\nenc = encode_task(lm, load_task('sentiment_1shot', n=16))\n"
              "import time as _t; _t0 = _t.time()\n"
              "evaluate_head_sets(lm, enc, [[(l, h)] for l in (3,) for h in range(9)], progress=False, "
              "result_cache=False)\n",
}
SETTINGS = {
    "adaptive (the book's)": {"CEL_BENCH_THREADS": "0"},
    "2 threads": {"CEL_BENCH_THREADS": "2", "CEL_THREADS": "2"},
    "1 thread": {"CEL_BENCH_THREADS": "1", "CEL_THREADS": "1"},
}
PRELUDE = ("import os, time, torch\nn = int(os.environ['CEL_BENCH_THREADS'])\n"
           "torch.set_num_threads(n) if n else None\nt0 = time.time()\n")


def timed(code: str, env: dict) -> float:
    """Seconds of ``code`` (after the imports it makes) in a fresh process with ``env`` added."""
    src = PRELUDE + code + "print('SECONDS', time.time() - (globals().get('_t0') or t0))\n"
    out = subprocess.run([sys.executable, "-c", src], env={**os.environ, **env, "CEL_NO_CACHE": "1"},
                         capture_output=True, text=True, check=True)
    return float(next(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("SECONDS")))


def beside_busy_loop(code: str, env: dict) -> float:
    # a session of its own, as a process from another terminal has: Linux shares the CPU between sessions before
    # nice applies (autogroup), so this niced loop takes half a core from the workload
    loop = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        time.sleep(0.5)
        return timed(code, env)
    finally:
        loop.kill()
        loop.wait()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="toy,screen")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv)
    print(f"{'workload':8s} {'setting':24s} {'alone s':>8s} {'loaded s':>9s} {'ratio':>6s}")
    for w in args.workloads.split(","):
        for name, env in SETTINGS.items():
            alone = min(timed(WORK[w], env) for _ in range(args.repeats))
            loaded = min(beside_busy_loop(WORK[w], env) for _ in range(args.repeats))
            print(f"{w:8s} {name:24s} {alone:8.1f} {loaded:9.1f} {loaded / alone:6.2f}", flush=True)


if __name__ == "__main__":
    main()
