"""How many threads torch may use, chosen by measurement of what else the CPU is doing.

Measured on a 2-core machine (benchmarks/bench_load.py and chapter 3 under papermill): with torch's default of
one intra-op thread per core, a chapter beside *one* other busy process in another session (Linux shares the CPU
between sessions before nice values apply, so even a ``nice -n 19`` loop started from another shell takes half a
core) ran 3.9x (a real-model screen) to 15x (the toy's small tensors) slower than alone: each parallel region
waits for the thread that shares its core. One thread per free core removes that; alone, the toy loses nothing
with one thread, while the real models' large products are 1.7x faster on two.

* :func:`single`: one thread for the toy's small tensors (chapters 3 and 3a), always;
* :func:`adapt`: called between batches of the real-model loops; every :data:`EVERY` seconds it reads how much
  CPU other processes used since the last reading (``/proc/stat`` less this process's ``/proc/self/stat``) and
  sets torch's threads to the cores they leave free (:func:`threads_for`). ``CEL_THREADS`` = a number fixes it.

Example:
    >>> threads_for(cores=2, others=0.0), threads_for(cores=2, others=0.5), threads_for(cores=2, others=1.0)
    (2, 1, 1)
"""
from __future__ import annotations

import contextlib
import functools
import os
import time

import torch

EVERY = 2.0          # seconds between readings of the CPU's use
FIRST_LOOK = 0.1     # seconds of the first reading (this process idle meanwhile)
MARGIN = 0.3         # a core counts as free while others use less than MARGIN of it
_state: dict = {}


def threads_for(cores: int, others: float) -> int:
    """The intra-op threads for ``cores`` cores when other processes keep ``others`` cores busy: the free cores
    (a core others use less than 30% of counts as free), at least 1."""
    return max(1, min(cores, int(cores - others + MARGIN)))


def cpu_ticks(stat: str, self_stat: str, children: bool = False) -> tuple[int, int]:
    """(busy clock ticks of the whole CPU, of this process) from the text of ``/proc/stat`` and
    ``/proc/self/stat`` (user, nice, system, irq, softirq, steal; utime + stime).

        >>> cpu_ticks("cpu  10 2 3 100 5 1 1 4 0 0\\n", "1 (python) R " + " ".join(["0"] * 10) + " 7 8 0 0")
        (21, 15)
    """
    f = [int(x) for x in stat.split("\n", 1)[0].split()[1:]]
    busy = f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)
    rest = self_stat.rsplit(")", 1)[1].split()       # fields after the command name: state is the first
    own = int(rest[11]) + int(rest[12])
    return busy, own + (int(rest[13]) + int(rest[14]) if children else 0)   # cutime + cstime: finished children


def others_busy(before: tuple[int, int], after: tuple[int, int], seconds: float) -> float:
    """Cores other processes kept busy between two :func:`busy_ticks` readings ``seconds`` apart (0 or more).

        >>> others_busy((1000, 400), (1300, 500), 1.0) == 200 / os.sysconf("SC_CLK_TCK")
        True
    """
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / hz / max(seconds, 1e-3))


def busy_ticks() -> tuple[int, int] | None:
    """(busy ticks of the whole CPU, of this process with its waited-for children: a chapter's kernel once it
    has exited), for :func:`others_busy` over a run such as a chapter's execution; None where /proc is missing."""
    try:
        with open("/proc/stat") as a, open("/proc/self/stat") as b:
            return cpu_ticks(a.read(), b.read(), children=True)
    except (OSError, ValueError, IndexError):
        return None


def _read() -> tuple[int, int] | None:
    try:
        with open("/proc/stat") as a, open("/proc/self/stat") as b:
            return cpu_ticks(a.read(), b.read())
    except (OSError, ValueError, IndexError):
        return None


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def adapt() -> int:
    """Set torch's intra-op threads to the cores other processes leave free (at most every :data:`EVERY` s; the
    first call of a process looks for :data:`FIRST_LOOK` s). Returns the threads in use. ``CEL_THREADS=N`` fixes
    them at N."""
    fixed = os.environ.get("CEL_THREADS", "")
    if fixed.isdigit() and int(fixed) > 0:
        if torch.get_num_threads() != int(fixed):
            torch.set_num_threads(int(fixed))
        return int(fixed)
    now = time.monotonic()
    if now - _state.get("t", -1e9) < EVERY:
        return torch.get_num_threads()
    if "reading" not in _state:              # the first call: a short look, so that the first forward is right
        _state.update(t=now, reading=_read())
        time.sleep(FIRST_LOOK)
        now = time.monotonic()
    reading, last = _read(), _state.get("reading")
    if reading is not None and last is not None:
        hz = os.sysconf("SC_CLK_TCK")
        others = max(0.0, ((reading[0] - last[0]) - (reading[1] - last[1])) / hz / max(now - _state["t"], 1e-3))
        n = threads_for(cores(), others)
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
    _state.update(t=now, reading=reading)
    return torch.get_num_threads()


def one_thread(fn):
    """Decorator: ``fn`` runs under :func:`single` (the toy's gradient descent)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with single():
            return fn(*args, **kwargs)
    return wrapped


@contextlib.contextmanager
def single():
    """One intra-op thread for the duration (the toy's small tensors: no loss alone, no collapse under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
