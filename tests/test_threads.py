"""torch's threads chosen by measurement (cel_utils.threads): readings of the CPU's use planted, never the clock's."""

import pytest
import torch

from cel_utils import threads


@pytest.fixture()
def clock(monkeypatch):
    """A planted clock and planted /proc readings: ``feed(seconds, busy_ticks, own_ticks)`` then ``threads.adapt()``."""
    state = {"t": 100.0, "reading": None}
    monkeypatch.setattr(threads.time, "monotonic", lambda: state["t"])
    monkeypatch.setattr(threads, "_read", lambda: state["reading"])
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    monkeypatch.delenv("CEL_THREADS", raising=False)
    monkeypatch.setattr(threads, "_state", {})
    before = torch.get_num_threads()

    def feed(dt, busy, own):
        state["t"] += dt
        state["reading"] = (busy, own)
        return threads.adapt()

    yield feed
    torch.set_num_threads(before)


def test_threads_follow_the_cores_others_leave_free(clock):
    torch.set_num_threads(2)
    assert clock(0, 0, 0) == 2                     # the first look (the planted clock stands still): nobody busy
    assert clock(4, 800, 600) == 1                 # 4 s: 8 busy core-seconds, 6 ours: others held half a core
    assert clock(1, 1000, 700) == 1                # too soon: no new reading, the threads stay
    assert clock(3, 1600, 1000) == 1               # others kept a whole core while we had one
    assert clock(4, 2400, 1750) == 2               # the other process is gone: others 0.125 of a core


def test_a_fixed_number_wins(clock, monkeypatch):
    monkeypatch.setenv("CEL_THREADS", "1")
    torch.set_num_threads(2)
    assert clock(0, 0, 0) == 1 and torch.get_num_threads() == 1


def test_the_toys_descent_runs_on_one_thread_and_gives_it_back(monkeypatch):
    from cel_utils import theory

    seen = []
    original = theory.head_attention
    monkeypatch.setattr(theory, "head_attention", lambda *a, **k: seen.append(torch.get_num_threads()) or original(*a, **k))
    torch.set_num_threads(2)
    theory.train(n_heads=2, steps=3)
    assert set(seen) == {1} and torch.get_num_threads() == 2


@pytest.mark.subprocess
def test_a_chapters_kernel_counts_as_its_own_work_not_as_other_processes(tmp_path):
    """The execution status page's 'other processes' column: a chapter's kernel is a child of the book's process,
    so once it has exited its CPU time is in this process's children's ticks, not in 'others'. A kernel that
    burns 3 s of CPU adds at least 2.5 s to the book's own ticks."""
    import os
    import time

    import nbformat
    import papermill as pm

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import time\nt = time.process_time()\nwhile time.process_time() - t < 3:\n"
                                          "    pass")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "burn.ipynb")
    before, t0 = threads.busy_ticks(), time.time()
    pm.execute_notebook(str(tmp_path / "burn.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3",
                        progress_bar=False)
    after = threads.busy_ticks()
    own = (after[1] - before[1]) / os.sysconf("SC_CLK_TCK")
    assert own >= 2.5, own
    assert threads.others_busy(before, after, time.time() - t0) >= 0.0


def test_bfloat16_can_be_turned_off_to_stand_in_for_a_cpu_without_it(monkeypatch, tmp_path):
    """Issue 51: a machine with native bfloat16 must be able to build the book as one without it. CEL_NO_BFLOAT16=1
    makes native_bfloat16() False, and so rank_dtype "auto" resolve to float32; with a planted /proc/cpuinfo that
    has the flag, it is True otherwise."""
    from pathlib import Path

    from cel_utils import models

    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "flags : fpu avx2 avx512_bf16\n"
                        if str(self) == "/proc/cpuinfo" else real(self, *a, **k))
    monkeypatch.delenv("CEL_NO_BFLOAT16", raising=False)
    assert models.native_bfloat16() and models.resolve_dtype("auto") == "bfloat16"
    monkeypatch.setenv("CEL_NO_BFLOAT16", "1")
    assert not models.native_bfloat16() and models.resolve_dtype("auto") == "float32"
    monkeypatch.setenv("CEL_NO_BFLOAT16", "0")
    assert models.native_bfloat16()
