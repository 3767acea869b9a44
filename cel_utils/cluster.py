"""Screens on a Ray cluster: the chunks of a screen evaluated by a pool of Ray actors, each holding the model once,
and put together into the screen one process gives (``cel screen --ray [ADDRESS]``).

* The driver (this process) encodes the items, resolves the ablation and keys every chunk
  (:func:`cel_utils.screening.chunk_sets`) in its result cache; chunks already there are read back, not recomputed,
  so a driver killed mid-run and started again resumes.
* Each worker loads the model once (``device="cuda"``: one actor per GPU, otherwise one per CPU core, one torch
  thread each) and must have the driver's weights and code; a worker that cannot load the model fails the run with
  one line.
* Chunks go to idle workers, the most expensive first; a worker that dies mid-run (killed, its node lost) has its
  chunk retried on another, and the output is the same.
* Each finished chunk is stored in the driver's result cache at once; one progress bar counts the chunks.
* Without an address, a local Ray with the machine's cores is started (and stopped at the end).

``ray`` is an optional extra (``pip install -e '.[cluster]'``), imported only inside these functions.

Example:
    >>> from cel_utils.cluster import PoolOptions, ray_screen                       # doctest: +SKIP
    >>> sc = ray_screen(lm, enc, model="smollm2-135m", options=PoolOptions(workers=2))  # doctest: +SKIP
    >>> sc.record()["heads"][0]["delta_accuracy"]                                   # doctest: +SKIP
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from . import __version__, cache
from .ablation import Ablation, Head, all_heads, head_name
from .defaults import CLUSTER_INSTALL, MAX_TOKENS, RAY_VERSION, progress_enabled
from .engine import STATS, cached_result, forward_equivalents, result_key, store_result
from .errors import CELError
from .scoring import EncodedTask, ItemResults
from .screening import Screen, assemble_screen, chunk_head_sets, chunk_sets, screen_chunks



def require_ray():
    """The ``ray`` module, or a :class:`CELError` saying in one line how to install it.

    Example:
        >>> ray = require_ray()                     # doctest: +SKIP
    """
    try:
        import ray
    except ImportError:
        raise CELError(f"--ray needs the optional package ray: {CLUSTER_INSTALL} "
                       f"(or pip install ray=={RAY_VERSION})") from None
    return ray


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message.

    Example:
        >>> one_line(ValueError("bad\\nmore"))
        'ValueError: bad'
    """
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class ChunkWorker:
    """What one Ray actor holds: the model, loaded once, and :meth:`run` to evaluate a chunk on it (a plain class;
    :func:`start_pool` turns it into actors). A model that cannot be loaded is kept as an error for :meth:`info`."""

    def __init__(self, model: str, device: str, dtype: str, threads: int = 1):
        import torch

        from .models import load_model

        torch.set_num_threads(max(1, int(threads)))
        self.lm, self.error = None, None
        try:
            self.lm = load_model(model, device=device, dtype=dtype)
        except Exception as e:  # reported by info(): the driver fails the run with one line
            self.error = one_line(e)

    def info(self) -> dict:
        """Where this worker runs and what it loaded (the weights' and the numeric code's hashes), or its error."""
        return {"host": socket.gethostname(), "pid": os.getpid(), "error": self.error,
                "weights_hash": self.lm.weights_hash if self.lm is not None else None,
                "code": cache.code_hash(), "version": __version__}

    def run(self, index: int, chunk: list, enc: EncodedTask, ablation: Ablation, max_tokens: int) -> dict:
        """Evaluate one chunk (:func:`cel_utils.screening.screen_chunks`, no cache: the driver keeps it); the
        engine's forward calls it took are counted in ``forwards``."""
        before = STATS["forwards"]
        part = screen_chunks(self.lm, enc, [chunk], ablation, max_tokens=max_tokens, progress=False,
                             result_cache=False)[0]
        return {"index": index, "correct": part.correct, "margin": part.margin, "choice_scores": part.choice_scores,
                "seconds": part.seconds, "forwards": STATS["forwards"] - before, "pid": os.getpid()}


@dataclass
class Worker:
    """One actor of the pool, with where it runs."""

    actor: Any
    host: str
    pid: int


@dataclass
class PoolStats:
    """What a pooled run did: workers started, chunks computed, retried after a worker died, read back from the
    cache, the engine's forward calls on the workers, the wall time, and where each chunk ran (``host:pid``)."""

    workers: int = 0
    computed: int = 0
    retried: int = 0
    resumed: int = 0
    forwards: int = 0
    wall_seconds: float = 0.0
    died: list = field(default_factory=list)
    ran_on: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PoolOptions:
    """How a screen runs on the pool of Ray workers (:func:`ray_screen`, :func:`run_chunks`): the Ray cluster's
    ``address`` (None: a local Ray with this machine's cores, or the Ray this process is already connected to), the
    number of ``workers`` (None: one per GPU with ``device="cuda"``, else one per ``threads`` CPUs of the cluster;
    never more than the chunks), the CPU ``threads`` each worker reserves and gives torch, the workers' ``device``,
    the most padded tokens per forward (``max_tokens``), the layers per chunk (``layers_per_chunk``, None:
    ``SCREEN_CHUNK_LAYERS``) and whether the driver draws a progress bar (``progress``).

    Example:
        >>> PoolOptions(workers=2, layers_per_chunk=1).threads
        1
    """

    address: str | None = None
    workers: int | None = None
    threads: int = 1
    device: str = "cpu"
    max_tokens: int = MAX_TOKENS
    layers_per_chunk: int | None = None
    progress: bool = True


def connect(address: str | None = None) -> bool:
    """Join the Ray cluster at ``address`` (``"auto"``, ``"host:port"``, ``"ray://host:10001"``), or start a local one
    with this machine's cores when there is none; nothing when this process is already connected. Returns whether
    this call connected (then :func:`disconnect` at the end).

    Example:
        >>> started = connect()            # doctest: +SKIP
    """
    import logging

    ray = require_ray()
    if ray.is_initialized():
        return False
    if address and not address.startswith(("ray://", "auto")):
        _check_reachable(address)
    kw = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        if address:
            ray.init(address=address, **kw)
        else:
            ray.init(num_cpus=os.cpu_count() or 1, **kw)
    except Exception as e:
        raise CELError(f"cannot join the Ray cluster at {address or 'a new local Ray'}: {one_line(e)}") from None
    return True


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """A ``host:port`` address answers on TCP (Ray itself retries an unreachable address for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise CELError(f"a Ray address is host:port, ray://host:port or auto, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise CELError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def disconnect() -> None:
    """Leave Ray (stops a local Ray that :func:`connect` started).

    Example:
        >>> if connect(): disconnect()       # doctest: +SKIP
    """
    import ray

    ray.shutdown()


def _dtype_name(lm) -> str:
    return str(next(lm.model.parameters()).dtype).removeprefix("torch.")


def start_pool(model: str, n_workers: int | None, device: str, dtype: str, weights_hash: str,
               threads: int = 1, at_most: int | None = None) -> list[Worker]:
    """``n_workers`` actors (default: one per GPU of the cluster for ``device="cuda"``, else one per CPU; never more
    than ``at_most``, the chunks to do) each loading
    ``model`` once; a :class:`CELError` in one line if the cluster cannot hold them, a worker cannot load the model,
    or loads other weights or runs other code than the driver. The workers import this process's ``cel_utils``
    first (its folder is put on their ``PYTHONPATH``); on other machines, install the same version.

    Example:
        >>> pool = start_pool("smollm2-135m", 2, "cpu", "float32", lm.weights_hash)   # doctest: +SKIP
        >>> [w.host for w in pool]                                                    # doctest: +SKIP
    """
    import ray

    res = ray.cluster_resources()
    gpu = device.startswith("cuda")
    have = int(res.get("GPU", 0) if gpu else res.get("CPU", 0) // max(1, threads))
    if gpu and have < 1:
        raise CELError("--device cuda: the Ray cluster has no GPU (leave out --device for CPU workers)")
    n = have if n_workers is None else int(n_workers)
    if n < 1:
        raise CELError(f"--workers must be at least 1, got {n}")
    if n > have:
        raise CELError(f"{n} workers asked for, but the Ray cluster has room for {have} "
                       f"({'one per GPU' if gpu else f'{threads} CPU each'})")
    n = min(n, at_most) if at_most else n
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    actor_cls = ray.remote(ChunkWorker).options(num_cpus=threads, num_gpus=1 if gpu else 0, max_restarts=0,
                                                runtime_env={"env_vars": {"PYTHONPATH": path}})
    actors = [actor_cls.remote(model, device, dtype, threads) for _ in range(n)]
    try:
        infos = ray.get([a.info.remote() for a in actors])
    except ray.exceptions.RayError as e:
        _kill(actors)
        raise CELError(f"a Ray worker died while loading the model {model!r}: {_cause(e)}") from None
    want_code = cache.code_hash()
    for info in infos:
        problem = None
        if info["error"]:
            problem = f"the Ray worker on {info['host']} cannot load the model {model!r}: {info['error']}"
        elif info["code"] != want_code:
            problem = (f"the Ray worker on {info['host']} runs other cel_utils code ({info['version']}, code "
                       f"{info['code']}) than the driver ({__version__}, code {want_code}): install the same version "
                       f"on every node")
        elif info["weights_hash"] != weights_hash:
            problem = (f"the Ray worker on {info['host']} loaded other weights for {model!r} (hash "
                       f"{info['weights_hash']}) than the driver ({weights_hash}): give every node the same "
                       f"model files")
        if problem:
            _kill(actors)
            raise CELError(problem)
    return [Worker(a, i["host"], i["pid"]) for a, i in zip(actors, infos)]


def _kill(actors) -> None:
    import ray

    for a in actors:
        try:
            ray.kill(a)
        except Exception:  # already gone
            pass


def _cause(e: BaseException) -> str:
    """The first line that says what went wrong inside a Ray error (its cause when Ray wraps one)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return one_line(cause)
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith((" ", "Traceback"))]
    return lines[-1] if lines else type(e).__name__


def run_chunks(model: str, lm, enc: EncodedTask, chunks: Sequence[Sequence[Head]], todo: Sequence[int],
               ablation: Ablation, *, options: PoolOptions = PoolOptions(),
               done: Callable[[int, ItemResults], None] | None = None,
               on_dispatch: Callable[[int, Worker], None] | None = None,
               stats: PoolStats | None = None) -> dict[int, ItemResults]:
    """Evaluate the chunks ``todo`` (indices into ``chunks``) on a pool of workers (:func:`start_pool`, with the
    ``workers``, ``threads`` and ``device`` of ``options``) that each load ``model`` in the dtype of ``lm``, the
    driver's copy (its weights hash is the one the workers must load; its layers price the chunks): the most
    expensive first, one chunk per idle worker; ``done(i, result)`` is called as each finishes (the driver stores it).
    A worker that dies has its chunk put back and retried on another; when none is left, a :class:`CELError`. The
    pool is stopped at the end. ``on_dispatch(i, worker)`` is called as chunk ``i`` is handed to a worker.

    Example:
        >>> parts = run_chunks("smollm2-135m", lm, enc, chunks, range(len(chunks)), Ablation.of("zero"),
        ...                    options=PoolOptions(workers=2))                            # doctest: +SKIP
    """
    import ray

    stats = stats if stats is not None else PoolStats()
    if not todo:
        return {}
    pool = start_pool(model, options.workers, options.device, _dtype_name(lm), lm.weights_hash,
                      threads=options.threads, at_most=len(todo))
    stats.workers = len(pool)
    cost = {i: forward_equivalents(lm.n_layers, [[h] for h in chunks[i]]) for i in todo}
    queue = deque(sorted(todo, key=lambda i: (-cost[i], i)))
    enc_ref, abl_ref = ray.put(enc), ray.put(ablation)
    idle, inflight, out = list(pool), {}, {}
    try:
        while queue or inflight:
            while queue and idle:
                w, i = idle.pop(0), queue.popleft()
                inflight[w.actor.run.remote(i, list(chunks[i]), enc_ref, abl_ref, options.max_tokens)] = (i, w)
                if on_dispatch:
                    on_dispatch(i, w)
            if not inflight:
                break
            [ref], _ = ray.wait(list(inflight), num_returns=1)
            i, w = inflight.pop(ref)
            try:
                r = ray.get(ref)
            except ray.exceptions.RayActorError:  # the worker died (killed, node lost): its chunk goes to another
                stats.retried += 1
                stats.died.append(f"{w.host}:{w.pid}")
                queue.appendleft(i)
                continue
            except ray.exceptions.RayError as e:
                raise CELError(f"chunk {i} ({_layers(chunks[i])}) failed on the Ray worker on {w.host}: "
                               f"{_cause(e)}") from None
            out[i] = part = _received(r, i, w, stats)
            if done:
                done(i, part)
            idle.append(w)
        if queue:
            raise CELError(f"every Ray worker died ({', '.join(stats.died)}); {len(out)} chunks finished and are in "
                           f"the result cache: run the same command again to resume")
    finally:
        _kill([w.actor for w in pool])
    return out


def _received(r: dict, i: int, w: Worker, stats: PoolStats) -> ItemResults:
    """What worker ``w`` sent back for chunk ``i`` (:meth:`ChunkWorker.run`) as item results, counted in ``stats``
    (chunks computed, forward calls, where the chunk ran)."""
    part = ItemResults(r["correct"], r["margin"], r["choice_scores"], seconds=r["seconds"])
    stats.computed += 1
    stats.forwards += int(r["forwards"])
    stats.ran_on[i] = f"{w.host}:{r['pid']}"
    return part


def _cached_chunks(keys: Sequence[str], chunks: Sequence[Sequence[Head]], n_items: int) -> dict[int, ItemResults]:
    """The chunks (by index) whose results the driver's result cache holds under ``keys``, read back."""
    parts = {}
    for i, k in enumerate(keys):
        hit = cached_result(k, len(chunks[i]) + 1, n_items)
        if hit is not None:
            parts[i] = hit
    return parts


def _layers(chunk) -> str:
    ls = sorted({l for l, _ in chunk})
    return f"layer {ls[0]}" if len(ls) == 1 else f"layers {ls[0]}-{ls[-1]}"


def ray_screen(lm, enc: EncodedTask, heads: Sequence[Head] | None = None, *, model: str,
               mode: str | Ablation = "zero", options: PoolOptions = PoolOptions(), result_cache: bool | None = None,
               on_dispatch: Callable[[int, Worker], None] | None = None,
               on_chunk: Callable[[int, ItemResults], None] | None = None) -> Screen:
    """The screen :func:`cel_utils.screening.screen` gives, with its chunks evaluated on Ray workers that each load
    ``model`` (a name :func:`cel_utils.models.load_model` takes on every worker) on ``options.device``.

    ``lm`` is the driver's copy of the model (any device: it encodes, keys the cache and, in mean mode, computes the
    head means); ``enc`` the encoded items. Chunks in the driver's result cache are read back; every chunk computed
    is stored there as it finishes (``on_chunk(i, result)`` is called after). ``options`` (:class:`PoolOptions`):
    the Ray cluster (default a local Ray with this machine's cores, kept if this process is already connected), the
    workers and the chunks. Each worker reserves and uses ``options.threads`` CPU threads: float32 sums depend on the
    number of threads in their last bits, so a one-process run with as many torch threads gives byte-identical
    numbers, another number agrees to rounding. ``meta`` holds the workers, chunks computed, retried and resumed,
    the workers' forward calls and the wall time.

    Example:
        >>> sc = ray_screen(lm, enc, model="smollm2-135m",
        ...                 options=PoolOptions(address="auto", device="cuda"))          # doctest: +SKIP
    """
    t0 = time.perf_counter()
    heads = list(heads) if heads is not None else all_heads(lm)
    if not heads:
        raise CELError("no heads to screen")
    ablation = Ablation.of(mode).resolved(lm, enc.inputs)
    chunks = chunk_sets(heads, options.layers_per_chunk)
    use_cache = cache.enabled() if result_cache is None else result_cache
    keys = [result_key(lm, enc, chunk_head_sets(c), ablation, device=options.device) for c in chunks]
    parts = _cached_chunks(keys, chunks, enc.n_items) if use_cache else {}
    todo = [i for i in range(len(chunks)) if i not in parts]
    stats = PoolStats(resumed=len(parts))

    def done(i: int, part: ItemResults) -> None:
        if use_cache:
            store_result(keys[i], part)
        if on_chunk:
            on_chunk(i, part)
        bar.update(1)

    bar = tqdm(total=len(chunks), initial=len(parts), unit="chunk", leave=False,
               desc=f"screening {len(heads)} heads on Ray", disable=not progress_enabled(options.progress))
    started = False
    try:
        if todo:
            require_ray()
            started = connect(options.address)
            parts.update(run_chunks(model, lm, enc, chunks, todo, ablation, options=options, done=done,
                                    on_dispatch=on_dispatch, stats=stats))
    finally:
        bar.close()
        if started:
            disconnect()
    missing = [head_name(chunks[i][0]) for i in range(len(chunks)) if i not in parts]
    if missing:
        raise CELError(f"chunks starting at {', '.join(missing)} were never evaluated")
    sc = assemble_screen(heads, chunks, [parts[i] for i in range(len(chunks))], ablation.mode, lm.n_layers)
    stats.wall_seconds = time.perf_counter() - t0
    sc.meta.update({"workers": stats.workers, "computed_chunks": stats.computed, "retried_chunks": stats.retried,
                    "forwards": stats.forwards, "wall_seconds": stats.wall_seconds, "ran_on": stats.ran_on})
    return sc
