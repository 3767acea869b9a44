"""Screening: ablate every head alone and measure the task, with per-head statistics.

:func:`screen` runs the exact engine (:mod:`cel_utils.engine`) on the baseline and one set per head;
:func:`plain_screen` is the plain loop it must reproduce (one full forward per head over every
(item, choice) sequence). A :class:`Screen` keeps the per-item results, so its statistics
(:meth:`Screen.stats`) need no further forward passes. Approximate screens are in
:mod:`cel_utils.approximate`.

Example:
    >>> from cel_utils import models, tasks, screening        # doctest: +SKIP
    >>> lm = models.load_model("smollm2-135m")                 # doctest: +SKIP
    >>> task = tasks.load_task("addition", n=20)               # doctest: +SKIP
    >>> df = screening.screen(lm, task).table                 # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from .ablation import Ablation, Head, HeadAblator, all_heads, head_name
from .compare import paired_table
from .errors import CELError
from .defaults import (ALPHA, FDR, MAX_TOKENS, N_BOOT, POWER, SCREEN_CHUNK_LAYERS,
                       candidate_rule, progress_enabled)
from .io import json_safe
from .engine import evaluate_head_sets, forward_equivalents
from .scoring import EncodedTask, ItemResults, encode_task, plain_evaluate
from .stats import confirm_decisions, min_detectable_gain


def is_candidate(delta_accuracy, q_value, margin_ci_low, fdr: float = FDR):
    """The candidate rule (:func:`cel_utils.defaults.candidate_rule` states it in words): removal helps on both
    measures, a gain in accuracy significant after FDR correction and a margin CI above zero. Works on numbers
    and on arrays alike.

    Example:
        >>> bool(is_candidate(0.1, 0.05, 0.2)), bool(is_candidate(0.1, 0.05, -0.1))
        (True, False)
    """
    return (delta_accuracy > 0) & (q_value < fdr) & (margin_ci_low > 0)


@dataclass
class Screen:
    """A screen: baseline and per-head results, with the per-item arrays kept for statistics."""

    heads: list[Head]
    baseline: ItemResults  # [1, n_items]
    results: ItemResults  # [n_heads, n_items]
    mode: str
    method: str = "exact"
    seconds: float = 0.0  # compute time (for a cached result: the time it took when it was computed)
    meta: dict = field(default_factory=dict)
    n_layers: int | None = None  # the model's depth (for cost accounting)

    @property
    def table(self) -> pd.DataFrame:
        acc = self.results.accuracy
        mm = self.results.mean_margin
        b_acc = float(self.baseline.accuracy[0])
        b_m = float(self.baseline.mean_margin[0])
        return pd.DataFrame({
            "head": [head_name(h) for h in self.heads],
            "layer": [h[0] for h in self.heads],
            "head_index": [h[1] for h in self.heads],
            "accuracy": acc,
            "mean_margin": mm,
            "delta_accuracy": acc - b_acc,
            "delta_margin": mm - b_m,
        })

    @property
    def forward_equivalents(self) -> float:
        """The screen's cost in clean full forwards (see :func:`cel_utils.engine.forward_equivalents`)."""
        L = self.n_layers if self.n_layers is not None else max(l for l, _ in self.heads) + 1
        return forward_equivalents(L, [[h] for h in self.heads])

    def stats(self, n_boot: int = N_BOOT, seed: int = 0, alpha: float = ALPHA, fdr: float = FDR) -> pd.DataFrame:
        """Per-head statistics on these items, with the candidate rule applied.

        ``fixes`` / ``breaks``: items the removal turns wrong -> right / right -> wrong; ``p_value``: the exact
        McNemar test on them; ``q_value``: Benjamini-Hochberg over all screened heads. Paired-bootstrap CIs
        (same items with and without the ablation) of the change in accuracy (``ci_low``, ``ci_high``) and in
        mean margin (``margin_ci_low``, ``margin_ci_high``), from :func:`cel_utils.compare.paired_table`.

        **Candidate rule**: removal helps on both measures — the accuracy gain is significant after FDR
        correction (``delta_accuracy > 0`` and ``q_value < fdr``) and the margin CI lies above zero.
        """
        pt = paired_table(self.table["head"], self.baseline, self.results, n_boot=n_boot, seed=seed, alpha=alpha)
        tab = self.table
        for c in ("ci_low", "ci_high"):
            tab[c] = pt[c].to_numpy()
        flips = confirm_decisions(self.baseline.correct[0], self.results.correct, fdr)
        for c in ("fixes", "breaks", "p_value", "q_value"):
            tab[c] = flips[c]
        tab["margin_ci_low"], tab["margin_ci_high"] = pt["margin_ci_low"].to_numpy(), pt["margin_ci_high"].to_numpy()
        tab["candidate"] = is_candidate(tab.delta_accuracy, tab.q_value, tab.margin_ci_low, fdr)
        return tab

    def record(self, seed: int = 0, fdr: float = FDR, n_boot: int = N_BOOT) -> dict:
        """The JSON-ready record of this screen (``cel screen``'s fields): the baseline, the candidate rule, one
        row per head with its statistics (:meth:`stats`), and the compute time."""
        tab = self.stats(n_boot=n_boot, seed=seed, fdr=fdr)
        cols = ["accuracy", "mean_margin", "delta_accuracy", "delta_margin", "ci_low", "ci_high", "p_value",
                "q_value", "margin_ci_low", "margin_ci_high", "candidate"]
        timing = {"seconds": round(self.seconds, 3)}
        if self.meta.get("resumed_chunks"):
            timing["resumed_chunks"] = self.meta["resumed_chunks"]
        return json_safe({
            "baseline": {"accuracy": float(self.baseline.accuracy[0]), "mean_margin": float(self.baseline.mean_margin[0])},
            "candidate_rule": candidate_rule(fdr), "fdr": fdr,
            "heads": [{"layer": int(r["layer"]), "head": int(r["head_index"]), **{c: r[c] for c in cols}}
                      for r in tab.to_dict("records")],
            "timing": timing})

    def top(self, k: int = 10, by: str = "delta_margin") -> pd.DataFrame:
        return self.table.sort_values([by, "delta_accuracy" if by != "delta_accuracy" else "delta_margin"],
                                      ascending=False).head(k).reset_index(drop=True)

    def selection_stability(self, head: str, k: int, n_boot: int = N_BOOT, seed: int = 0) -> dict:
        """How stable the screen's choice of ``head`` is: over ``n_boot`` resamples of its items (with
        replacement), the share in which ``head`` ranks in the top ``k`` by change in mean margin (ties: accuracy,
        as :meth:`top` orders), so that it would be offered to the confirm split at all (``offered``), and the
        share in which it ranks first (``first``).

        Example:
            >>> base = ItemResults(np.ones((1, 4), bool), np.zeros((1, 4)))
            >>> res = ItemResults(np.ones((2, 4), bool), np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 2.0]]))
            >>> Screen([(0, 0), (0, 1)], base, res, "zero").selection_stability("L0H0", 1, n_boot=200)["first"]
            0.96
        """
        names = [head_name(h) for h in self.heads]
        i = names.index(head)
        dm = self.results.margin - self.baseline.margin[0]             # [heads, items]
        da = self.results.correct.astype(float) - self.baseline.correct[0]
        rng = np.random.default_rng(seed)
        n, offered, first = dm.shape[1], 0, 0
        for _ in range(n_boot):
            idx = rng.integers(0, n, n)
            order = np.lexsort((-da[:, idx].mean(1), -dm[:, idx].mean(1)))   # margin first, then accuracy
            offered += int(i in order[:k])
            first += int(order[0] == i)
        return {"offered": offered / n_boot, "first": first / n_boot, "n_boot": n_boot}


def screen(lm, task, heads: Sequence[Head] | None = None, mode: str | Ablation = "zero", means=None,
           max_tokens: int = MAX_TOKENS, progress: bool = True, enc: EncodedTask | None = None,
           result_cache: bool | None = None, layers_per_chunk: int | None = None) -> Screen:
    """Ablate each head alone (all heads by default) with the exact engine.

    The heads are evaluated in chunks of ``layers_per_chunk`` layers (default ``SCREEN_CHUNK_LAYERS``; see
    :func:`chunk_sets`), each cached on disk as it
    finishes: a screen that is interrupted (killed, out of time) resumes from its finished chunks when run again,
    with the same numbers. ``meta["resumed_chunks"]`` counts the chunks read back from the cache.
    :func:`cel_utils.cluster.ray_screen` evaluates the same chunks on a pool of Ray workers.
    """
    heads = list(heads) if heads is not None else all_heads(lm)
    if not heads:
        raise CELError("no heads to screen")
    enc = enc if enc is not None else encode_task(lm, task)
    ablation = Ablation.of(mode, means).resolved(lm, enc.inputs)
    chunks = chunk_sets(heads, layers_per_chunk)
    parts = screen_chunks(lm, enc, chunks, ablation, max_tokens=max_tokens, progress=progress,
                          result_cache=result_cache, n_heads=len(heads))
    return assemble_screen(heads, chunks, parts, ablation.mode, lm.n_layers)


def chunk_sets(heads: Sequence[Head], layers_per_chunk: int | None = None) -> list[list[Head]]:
    """The units of work of a screen: the heads grouped by ``layer // layers_per_chunk`` (default
    ``SCREEN_CHUNK_LAYERS``), in the order their groups
    first appear, heads in the order given. A layer's heads always share a chunk, so a chunk's batched forwards are
    those of a one-process screen and the numbers do not depend on how the chunks are spread over processes.

    Example:
        >>> chunk_sets([(7, 0), (0, 1), (6, 2), (0, 0), (13, 1)], 6)
        [[(7, 0), (6, 2)], [(0, 1), (0, 0)], [(13, 1)]]
    """
    layers_per_chunk = SCREEN_CHUNK_LAYERS if layers_per_chunk is None else layers_per_chunk
    if layers_per_chunk < 1:
        raise CELError(f"chunks must hold at least 1 layer, got {layers_per_chunk}")
    groups: dict[int, list[Head]] = {}
    for h in heads:
        groups.setdefault(h[0] // layers_per_chunk, []).append(h)
    return list(groups.values())


def chunk_head_sets(chunk: Sequence[Head]) -> list[list[Head]]:
    """The head sets a chunk evaluates: the unablated model (its clean pass is run anyway), then each head alone.

    Example:
        >>> chunk_head_sets([(0, 1), (0, 2)])
        [[], [(0, 1)], [(0, 2)]]
    """
    return [[]] + [[h] for h in chunk]


def screen_chunks(lm, enc: EncodedTask, chunks: Sequence[Sequence[Head]], ablation: Ablation,
                  max_tokens: int = MAX_TOKENS, progress: bool = True, result_cache: bool | None = None,
                  n_heads: int | None = None) -> list[ItemResults]:
    """Evaluate chunks of heads (:func:`chunk_sets`) over the items with a resolved ``ablation``: per chunk, the
    results of :func:`chunk_head_sets` (row 0 the unablated model), each cached on disk as it finishes (a chunk
    read back has ``cached=True``). ``n_heads`` (the whole screen's) only labels the progress bar.

    Example:
        >>> from cel_utils.tiny import tiny_model
        >>> from cel_utils.tasks import load_task
        >>> lm = tiny_model("llama"); enc = encode_task(lm, load_task("ioi", n=3))
        >>> parts = screen_chunks(lm, enc, [[(0, 1)], [(2, 0), (2, 3)]], Ablation.of("zero"), progress=False,
        ...                       result_cache=False)
        >>> [p.correct.shape for p in parts]
        [(2, 3), (3, 3)]
    """
    n = n_heads if n_heads is not None else sum(map(len, chunks))
    return [evaluate_head_sets(lm, enc, chunk_head_sets(c), mode=ablation, max_tokens=max_tokens, progress=progress,
                               result_cache="whole" if result_cache is not False else False,   # resumes by chunk
                               desc=f"screening {n} heads (layers {min(l for l, _ in c)}-{max(l for l, _ in c)})")
            for c in chunks]


def assemble_screen(heads: Sequence[Head], chunks: Sequence[Sequence[Head]], parts: Sequence[ItemResults],
                    mode: str, n_layers: int | None = None) -> Screen:
    """The screen of ``heads`` from its chunks' results (``parts[i]``: :func:`chunk_head_sets` of ``chunks[i]``,
    computed anywhere, in any order of completion): the heads back in the order given, the baseline from the first
    chunk, ``seconds`` the sum of the chunks' compute times and ``meta["resumed_chunks"]`` the chunks read back
    from the cache. A :class:`~cel_utils.errors.CELError` if a head is in no chunk or in two, or a part does not
    match its chunk.

    Example:
        >>> import numpy as np
        >>> part = lambda k: ItemResults(np.ones((k, 2), bool), np.arange(2 * k, dtype=float).reshape(k, 2))
        >>> sc = assemble_screen([(1, 0), (0, 0)], [[(0, 0)], [(1, 0)]], [part(2), part(2)], "zero")
        >>> sc.results.margin.tolist(), sc.baseline.margin.tolist()
        ([[2.0, 3.0], [2.0, 3.0]], [[0.0, 1.0]])
    """
    heads = list(heads)
    if len(parts) != len(chunks) or not parts:
        raise CELError(f"a screen needs one result per chunk: {len(chunks)} chunks, {len(parts)} results")
    row_of: dict[Head, tuple[int, int]] = {}
    for c, (chunk, part) in enumerate(zip(chunks, parts)):
        if part.correct.shape[0] != len(chunk) + 1:
            raise CELError(f"chunk {c} has {len(chunk)} heads but {part.correct.shape[0] - 1} result rows")
        for i, h in enumerate(chunk):
            if h in row_of:
                raise CELError(f"head {head_name(h)} is in two chunks")
            row_of[h] = (c, i + 1)
    missing = [head_name(h) for h in heads if h not in row_of]
    if missing or len(row_of) != len(heads):
        raise CELError(f"the chunks do not cover the screened heads (missing: {', '.join(missing) or 'none'})")
    results = ItemResults(np.stack([parts[row_of[h][0]].correct[row_of[h][1]] for h in heads]),
                          np.stack([parts[row_of[h][0]].margin[row_of[h][1]] for h in heads]))
    resumed = sum(bool(p.cached) for p in parts)
    return Screen(heads=heads, baseline=parts[0].rows(slice(0, 1)), results=results, mode=mode,
                  seconds=float(sum(p.seconds or 0.0 for p in parts)), n_layers=n_layers,
                  meta={"from_cache": resumed == len(parts), "resumed_chunks": resumed})


def plain_screen(lm, task, heads: Sequence[Head] | None = None, mode: str | Ablation = "zero", means=None,
                 batch_size: int = 16, progress: bool = True, enc: EncodedTask | None = None) -> Screen:
    """The plain loop: for each head, one full forward over every (item, choice) sequence."""
    heads = list(heads) if heads is not None else all_heads(lm)
    enc = enc if enc is not None else encode_task(lm, task)
    ablation = Ablation.of(mode, means).resolved(lm, enc.inputs)
    t0 = time.perf_counter()
    ablator = HeadAblator(lm, ablation).attach()
    try:
        base = plain_evaluate(lm, enc, (), batch_size=batch_size, ablator=ablator)
        outs = [plain_evaluate(lm, enc, [h], batch_size=batch_size, ablator=ablator)
                for h in tqdm(heads, desc="plain loop", disable=not progress_enabled(progress), leave=False)]
    finally:
        ablator.detach()
    secs = time.perf_counter() - t0
    res = ItemResults(np.concatenate([o.correct for o in outs]), np.concatenate([o.margin for o in outs]))
    return Screen(heads=heads, baseline=base, results=res, mode=ablation.mode, method="plain", seconds=secs,
                  n_layers=lm.n_layers)


def confirmation_power(breaks, n_items: int, k: int, fdr: float = FDR, power: float = POWER) -> dict:
    """How large a gain the confirm test *alone* could find, for a head that has already ranked in the top ``k``
    on the search items: the minimum detectable gain at ``power`` for one head tested at ``fdr / k`` (BH's
    threshold for a lone discovery), breaking nothing (``min_detectable_gain``, the best case) and breaking as many
    items as the re-tested head that breaks most (``breaks``: each re-tested head's breaks on the ``n_items``
    confirm items; ``min_detectable_gain_worst`` at ``break_rate_worst``); ``inf`` when none is detectable. The
    search stage is not in it: see :mod:`cel_utils.power` for the power of the whole pipeline.

    Example:
        >>> confirmation_power([2, 5], 200, 5)["min_detectable_gain"]
        0.0475
    """
    alpha = fdr / max(k, 1)
    worst = float(np.max(breaks)) / n_items if len(breaks) else 0.0
    return {"min_detectable_gain": min_detectable_gain(n_items, alpha, 0.0, power),
            "min_detectable_gain_worst": min_detectable_gain(n_items, alpha, worst, power), "alpha": alpha,
            "break_rate": 0.0, "break_rate_worst": worst, "power": power}
