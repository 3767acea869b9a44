"""Where the book's time goes, chapter by chapter and stage by stage, from a profiled run.

    CEL_PROFILE=/tmp/book.jsonl CEL_CACHE_DIR=$(mktemp -d) make book      # a cold, profiled build
    python benchmarks/profile_book.py /tmp/book.jsonl [--status book/chapters/execution_status.json] [--csv out.csv]

Each line of the profile is one call of a model-running function (``cel_utils.profiling``). A chapter's *stage* is
the outermost ``cel_utils`` function that led to the call (called from the notebook itself: the function). Prints
per chapter the seconds of each stage (calls inside another timed call are not counted twice), the share of the
chapter's time they explain (the status file's seconds), and the engine's repeated work: head sets whose numbers
(same model, items, ablation) were computed more than once in the run, and the seconds they cost.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd


def read(path: Path) -> pd.DataFrame:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    df = pd.DataFrame(rows)
    for col, fill in (("cached", False), ("sets", 0), ("items", 0)):
        df[col] = df[col].fillna(fill) if col in df else fill
    df["stage"] = df["stage"].where(df["stage"].astype(bool), df["function"])
    return df


def stages(df: pd.DataFrame) -> pd.DataFrame:
    """Seconds per chapter and stage, top-level calls only."""
    top = df[~df["nested"]]
    return (top.groupby(["chapter", "stage"])
            .agg(calls=("seconds", "size"), seconds=("seconds", "sum"))
            .reset_index().sort_values(["chapter", "seconds"], ascending=[True, False]))


def repeats(df: pd.DataFrame) -> pd.DataFrame:
    """Per chapter: engine head-set evaluations computed (not read from the cache), how many of them repeat a set
    computed earlier in the run, and the seconds those repeats cost (each call's seconds shared over its sets)."""
    eng = df[(df["function"] == "engine.evaluate_head_sets") & ~df["cached"].astype(bool)]
    seen: Counter = Counter()
    out = defaultdict(lambda: {"sets computed": 0, "repeated sets": 0, "engine seconds": 0.0, "repeat seconds": 0.0})
    for _, r in eng.iterrows():
        keys = r.get("set_keys") or []
        per = r["seconds"] / max(1, len(keys))
        o = out[r["chapter"]]
        o["engine seconds"] += r["seconds"]
        for k in keys:
            o["sets computed"] += 1
            if seen[k]:
                o["repeated sets"] += 1
                o["repeat seconds"] += per
            seen[k] += 1
    return pd.DataFrame([{"chapter": c, **v} for c, v in out.items()]).round(1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--status", type=Path, default=Path("book/chapters/execution_status.json"))
    ap.add_argument("--csv", type=Path, default=None, help="write the stage table here")
    a = ap.parse_args(argv)
    df = read(a.profile)
    st = stages(df)
    totals = {}
    if a.status.exists():
        totals = {r["notebook"]: r["seconds"] for r in json.loads(a.status.read_text())}
    pd.set_option("display.width", 160)
    for ch, g in st.groupby("chapter", sort=True):
        total = totals.get(ch)
        explained = g["seconds"].sum()
        head = f"== {ch}: {explained:.0f} s in timed calls"
        print(head + (f" of {total:.0f} s ({explained / total:.0%})" if total else ""))
        print(g[g["seconds"] >= 1].drop(columns="chapter").to_string(index=False, float_format="%.1f"))
    print("\n== the engine's repeated work (a set's numbers computed again later in the run)")
    print(repeats(df).to_string(index=False))
    if a.csv:
        st.to_csv(a.csv, index=False)


if __name__ == "__main__":
    main()
