"""Each chapter's run time at the course's live parameters (book/live_parameters.json), from a cold result cache.

    python benchmarks/live_times.py [--out /tmp/live] [--write book/live_times.md]

Executes every chapter with papermill at the live parameters, in the book's order (each chapter reads the records
of the ones before it), with a fresh, empty result cache (``CEL_CACHE_DIR`` in a new temporary folder; the
converted model copies are reused from ``CEL_MODELS_DIR`` or the usual cache, as on a machine where the
set-up page's first load has been done). Writes a table the course guide includes: chapter, run time, what
the live parameters change, and the machine, date and commit it was measured on. Run it with nothing else on
the machine.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from cel_utils import book
from cel_utils.cache import cache_dir
from cel_utils.models import native_bfloat16


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def table(rows: list[dict], live: dict, machine: str, commit: str) -> str:
    lines = [f"Measured on {machine} on {datetime.date.today().isoformat()} (commit `{commit}`), from an empty "
             "result cache, one chapter after another as listed, nothing else running; "
             "`benchmarks/live_times.py` writes this table.", "",
             "| chapter | run time at the live parameters | what they change |", "|---|---|---|"]
    for r in rows:
        change = ", ".join(f"`{k}`" for k in live.get(r["notebook"], {})) or "nothing (the chapter only reads records)"
        lines.append(f"| {r['title']} | {minutes(r['seconds']) if r['ok'] else 'FAILED'} | {change} |")
    total = sum(r["seconds"] for r in rows)
    lines += ["", f"Total: {minutes(total)}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="live-")))
    ap.add_argument("--write", type=Path, default=None, help="write the table here (book/live_times.md)")
    a = ap.parse_args(argv)
    live = book.read_parameters(book.ROOT / "book" / "live_parameters.json")
    os.environ.setdefault("CEL_MODELS_DIR", str(cache_dir() / "models"))
    os.environ["CEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="live-cache-")
    rows = book.execute(a.out, parameters=live)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=book.ROOT).stdout.strip() or "unknown"
    cpu = "native bfloat16" if native_bfloat16() else "no native bfloat16"
    machine = f"a {os.cpu_count()}-core {platform.machine()} CPU ({cpu})"
    text = table(rows, live, machine, commit)
    print(text)
    if a.write:
        a.write.write_text(text)


if __name__ == "__main__":
    main()
