"""Ways of choosing heads: one :class:`Selector` protocol and one registry.

A selector reads the search split alone (its :class:`Context`) and *offers* head sets, one of each size
``k = 1..max_k`` (an :class:`Offer`, with what choosing cost); the pipeline of :mod:`cel_utils.pipeline` tests
what it offers. :data:`REGISTRY` is the one list of ways to choose heads: ``cel search --strategy`` offers every
key, ``cel screen --method`` every selector that ranks single heads (its ``method``), chapter 2's comparison
(:func:`cel_utils.comparison.compare_selectors`) every selector marked ``compared``, and the selection-aware control
is the ``random`` selector's offers through the same pipeline. A new way of choosing heads is one class with
:func:`register`.

========================  ====================================================================================
key (label)               what it offers for size k
========================  ====================================================================================
``topk`` (top-k screen)   the k heads whose removal alone raises the search margin most (the exact screen)
``pool`` (pool search)    the best set of size k among the top ``pool_size`` screened heads: every subset when
                          there are at most ``SELECTOR_SWEEP_MAX``, else a beam search (chapter 2's score)
``exhaustive``, ``greedy``, ``beam``   the same search with one strategy on the model (``cel search``)
``gradient``              the top k of the gradient screen (one forward and one backward)
``compressed``            the top k of the compressed-sensing screen (random knockouts, a sparse regression)
``gates``                 the learned gates' set of size k (:func:`cel_utils.gates.learn_gates`)
``boost``                 the top k heads whose direct effect most reliably promotes the answer
                          (:func:`cel_utils.direct.direct_ranking`), *boosted*: multiplied by a dose above 1
``random``                random orders of all heads (the control; its curve is their mean)
========================  ====================================================================================

Example (a tiny random model, so the sets mean nothing):
    >>> from cel_utils.tiny import tiny_model
    >>> from cel_utils.tasks import load_task
    >>> lm = tiny_model("llama")
    >>> ctx = Context.make(lm, load_task("ioi", "search", n=6), Design(seed=0))
    >>> [len(s) for s in REGISTRY["topk"].offer(ctx, 3).sets], "gates" in REGISTRY
    ([1, 2, 3], True)
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd

from .ablation import Ablation, Head, all_heads, format_set, head_name
from .approximate import compressed_screen, gradient_screen
from .compare import compare_sets
from .defaults import BEAM_WIDTH, BOOST_ALPHAS, SELECTOR_RANDOM_SETS, SELECTOR_SWEEP_MAX
from .design import Design
from .direct import direct_ranking
from .engine import evaluate_head_sets, forward_equivalents
from .errors import CELError
from .gates import GateSettings, LearnedGates, learn_gates
from .joint import graded_sets, model_scorer, sweep_pool, sweep_scores
from .pipeline import Run, encoded, resolved, run
from .scoring import EncodedTask, encode_task
from .screening import Screen, screen
from .search import beam, exhaustive, greedy


@dataclass(frozen=True)
class Options:
    """Selector parameters beyond the :class:`~cel_utils.design.Design`."""

    pool_size: int = 5                    # the pool selectors: the top m screened heads
    beam_width: int = BEAM_WIDTH
    compressed_evals: int | None = None   # compressed sensing: random knockouts (None: its default)
    gates: GateSettings | None = None     # the learned gates (None: the defaults)
    random_sets: int = SELECTOR_RANDOM_SETS  # random orders of all heads
    leave_out: tuple = ()                 # keys of compared selectors a comparison leaves out


@dataclass
class Context:
    """What a selector may read: the search split and the design, never the confirm or held-out items.

    ``lm``: the model every forward evaluation runs on (the design's dtype); ``grad_lm``: the model gradients run
    on (the gradient screen, the gates). ``ranked``: a ranking of heads made elsewhere (``cel search --screen``);
    ``screen_result``: an exact screen of these search items made elsewhere (chapter 2's ranking screen)."""

    lm: object
    grad_lm: object
    search: object
    enc: EncodedTask
    design: Design
    options: Options = field(default_factory=Options)
    ranked: list[Head] | None = None
    screen_result: Screen | None = None
    progress: bool = False

    @classmethod
    def make(cls, lm, search, design: Design, options: Options | None = None, **kw) -> "Context":
        """A context on ``search`` (a task); the design's ablation resolved there; evaluations in ``design.dtype``."""
        from .models import cast

        enc = encode_task(lm, search)
        d = resolved(design, lm, enc)
        ev = cast(lm, d.dtype) if d.dtype else lm
        return cls(lm=ev, grad_lm=lm, search=search, enc=enc, design=d, options=options or Options(), **kw)

    def screen(self) -> Screen:
        """The exact single-head screen of the search split (made once, or the one given)."""
        if self.screen_result is None:
            self.screen_result = screen(self.lm, self.search, mode=self.design.mode, enc=self.enc,
                                        progress=self.progress)
        return self.screen_result

    def ranking(self) -> list[Head]:
        """Every head, best first by the change in search margin when removed alone (or the ranking given)."""
        if self.ranked is not None:
            return list(self.ranked)
        sc = self.screen()
        return [(int(r.layer), int(r.head_index)) for r in sc.top(len(sc.heads)).itertuples()]

    def screen_cost(self) -> dict:
        """The exact screen's cost (forward-equivalents over these search items, seconds, heads evaluated)."""
        if self.ranked is not None and self.screen_result is None:
            return {"forward_equivalents": 0.0, "seconds": 0.0, "n_evaluations": 0}
        sc = self.screen()
        fe = sc.forward_equivalents * sc.results.correct.shape[1] / self.enc.n_items
        return {"forward_equivalents": fe, "seconds": sc.seconds, "n_evaluations": len(sc.heads)}


@dataclass
class Offer:
    """What a selector offers: ``sets[k - 1]`` is its set of size ``k``; ``cost`` (``forward_equivalents``,
    ``seconds``, ``n_evaluations``); ``replicates`` (the random selector: several offers); ``search``: the sets'
    search-split figures when the selector has them (``heads`` and ``search_*`` columns); ``pool``: the heads it
    chose among; ``info``: what else it learned (the gates' :class:`~cel_utils.gates.LearnedGates`)."""

    sets: list[list[Head]]
    cost: dict
    pool: list[Head]
    replicates: list[list[list[Head]]] | None = None
    search: pd.DataFrame | None = None
    info: dict = field(default_factory=dict)
    mode: object = None   # how its sets are applied when not the design's (the boost selector: scale alpha > 1)

    def named(self) -> dict[str, list[Head]]:
        return {format_set(x): list(x) for x in self.sets}


class Selector:
    """The protocol: ``key`` (the registry's and the command line's name), ``label`` (tables and figures),
    ``method`` (set when it ranks single heads: ``cel screen --method``), ``compared`` (in chapter 2's comparison),
    ``pool_based`` (it searches a pool of top screened heads), and :meth:`offer`."""

    key = ""
    label = ""
    method: str | None = None
    compared = True
    pool_based = False

    def offer(self, ctx: Context, max_k: int) -> Offer:
        raise NotImplementedError

    def rank(self, ctx: Context):
        """Per-head scores (an exact or approximate screen) of a ranking selector."""
        raise CELError(f"the {self.key} selector does not rank single heads")


REGISTRY: dict[str, Selector] = {}


def register(cls):
    """Class decorator: add a selector to :data:`REGISTRY` under its ``key`` (the order of registration is the
    order of tables and figures)."""
    if not cls.key or cls.key in REGISTRY:
        raise CELError(f"a selector needs a new key, got {cls.key!r}")
    REGISTRY[cls.key] = cls()
    return cls


def compared(leave_out: Sequence[str] = ()) -> list[Selector]:
    """The selectors chapter 2 compares, in registry order (but those in ``leave_out``)."""
    return [s for s in REGISTRY.values() if s.compared and s.key not in leave_out]


def ranked_sets(order: Sequence[Head], max_k: int) -> list[list[Head]]:
    """The nested sets of a ranking: its first ``k`` heads (sorted), ``k = 1..max_k``."""
    return [sorted(order[:k]) for k in range(1, max_k + 1)]


@register
class TopKScreen(Selector):
    key, label, method = "topk", "top-k screen", "exact"

    def rank(self, ctx):
        return ctx.screen()

    def offer(self, ctx, max_k):
        return Offer(ranked_sets(ctx.ranking(), max_k), ctx.screen_cost(), ctx.ranking())


@register
class PoolSearch(Selector):
    """Chapter 2's search over the top ``pool_size`` heads: every subset of sizes 1..max_k in the joint search's
    order (a pool the joint search swept is read back from the result cache) when that is at most
    ``SELECTOR_SWEEP_MAX`` subsets, else a beam search; both maximise accuracy + the margin tie-break."""

    key, label, pool_based = "pool", "pool search", True

    def offer(self, ctx, max_k):
        pool = ctx.ranking()[:max(ctx.options.pool_size, max_k)]
        t0 = time.perf_counter()
        if sum(math.comb(len(pool), k) for k in range(1, max_k + 1)) <= SELECTOR_SWEEP_MAX:
            top = len(pool) if len(pool) - max_k <= 1 else max_k   # the whole pool when that costs one size more
            d = ctx.design
            score_of = sweep_scores(*sweep_pool(ctx.lm, ctx.enc, pool, d.mode, top, n_boot=d.n_boot, seed=d.seed,
                                                progress=ctx.progress))
            found = exhaustive(pool, lambda sets: [score_of[tuple(sorted(x))] for x in sets], max_k)
            evaluated = [list(c) for k in range(1, max_k + 1) for c in itertools.combinations(pool, k)]
        else:
            evaluated = []
            scorer = model_scorer(ctx.lm, ctx.enc, mode=ctx.design.mode, progress=ctx.progress)

            def score(sets):
                evaluated.extend(list(x) for x in sets if x)
                return scorer(sets)

            found = beam(pool, score, width=ctx.options.beam_width, max_size=max_k)
        sc = ctx.screen_cost()
        cost = {"forward_equivalents": sc["forward_equivalents"] + forward_equivalents(ctx.lm.n_layers, evaluated),
                "seconds": sc["seconds"] + time.perf_counter() - t0,
                "n_evaluations": sc["n_evaluations"] + found.n_evaluations}
        return Offer([sorted(found.best[k].heads) for k in range(1, max_k + 1)], cost, pool)


class _Strategy(Selector):
    """One strategy of :mod:`cel_utils.search` over the pool, scored on the model (``cel search``)."""

    compared, pool_based = False, True

    def search(self, pool, score, ctx, max_k):
        raise NotImplementedError

    def offer(self, ctx, max_k):
        pool = ctx.ranking()[:ctx.options.pool_size]
        t0 = time.perf_counter()
        res = self.search(pool, model_scorer(ctx.lm, ctx.enc, mode=ctx.design.mode), ctx, max_k)
        sizes = sorted(k for k in res.best if k > 0)
        return Offer([sorted(res.best[k].heads) for k in sizes],
                     {"forward_equivalents": np.nan, "seconds": time.perf_counter() - t0,
                      "n_evaluations": res.n_evaluations}, pool)


@register
class Exhaustive(_Strategy):
    key = label = "exhaustive"

    def search(self, pool, score, ctx, max_k):
        return exhaustive(pool, score, max_k)


@register
class Greedy(_Strategy):
    key = label = "greedy"

    def search(self, pool, score, ctx, max_k):
        return greedy(pool, score, max_k)


@register
class Beam(_Strategy):
    key = label = "beam"

    def search(self, pool, score, ctx, max_k):
        return beam(pool, score, ctx.options.beam_width, max_k)


class _Approximate(Selector):
    """The top k of an approximate screen of every head."""

    def offer(self, ctx, max_k):
        ap = self.rank(ctx)
        sets, info = top_sets(ap.estimate, ap.heads, max_k, ctx.design.seed)
        return Offer(sets, {"forward_equivalents": ap.forward_equivalents, "seconds": ap.seconds,
                            "n_evaluations": ap.n_evaluations}, all_heads(ctx.lm), info=info)


def top_sets(estimate, heads: Sequence[Head], max_k: int, seed: int = 0) -> tuple[list[list[Head]], dict]:
    """The nested top-k sets of per-head estimates (largest first), ties broken at random (seeded), never in the
    heads' index order, and what the estimates can tell: ``signal`` is ``"none"`` when every estimate is equal
    (the sets are then random heads), ``"ties"`` when a tie straddles the top ``max_k``, else ``"ok"``.

    Example:
        >>> sets, info = top_sets([0.0, 0.0, 0.0, 0.0], [(0, 0), (0, 1), (1, 0), (1, 1)], 2)
        >>> info["signal"], sets[0] != [(0, 0)] or sets[1] != [(0, 0), (0, 1)]
        ('none', True)
    """
    est = np.asarray(estimate, float)
    order = np.lexsort((np.random.default_rng(seed).permutation(len(est)), -est))   # by estimate, ties at random
    k = min(max_k, len(est))
    straddles = k < len(est) and np.isclose(est[order[k - 1]], est[order[k]], rtol=0, atol=1e-12)
    signal = "none" if np.ptp(est) <= 1e-12 else "ties" if straddles else "ok"
    return ([sorted(heads[i] for i in order[:j]) for j in range(1, max_k + 1)],
            {"signal": signal, "distinct_estimates": int(len(np.unique(est)))})


@register
class Gradient(_Approximate):
    key = label = method = "gradient"

    def rank(self, ctx):
        return gradient_screen(ctx.grad_lm, ctx.search, mode=ctx.design.mode, enc=ctx.enc)


@register
class Compressed(_Approximate):
    key, label, method = "compressed", "compressed sensing", "compressed"

    def rank(self, ctx):
        return compressed_screen(ctx.lm, ctx.search, n_evaluations=ctx.options.compressed_evals,
                                 mode=ctx.design.mode, seed=ctx.design.seed, enc=ctx.enc)


@register
class Gates(Selector):
    """The learned gates (learning in ``grad_lm``'s dtype); their sets' search-split figures come with them."""

    key, label = "gates", "learned gates"

    def settings(self, ctx, max_k) -> GateSettings:
        d = ctx.design
        return replace(ctx.options.gates or GateSettings(), max_k=max_k, mode=d.mode, seed=d.seed, fdr=d.fdr,
                       n_boot=d.n_boot, progress=ctx.progress)

    def offer(self, ctx, max_k):
        s = self.settings(ctx, max_k)
        s.check(ctx.lm.n_layers * ctx.lm.n_heads)
        lg = learn_gates(ctx.grad_lm, ctx.search, s)
        sets = [lg.sets[k] for k in sorted(lg.sets)]
        named = {format_set(x): x for x in sets}
        on_search = compare_sets(ctx.lm, ctx.enc, named, mode=s.mode, n_boot=s.n_boot, seed=s.seed).table
        search = pd.DataFrame({"heads": list(named), "search_delta_accuracy": on_search["delta_accuracy"].to_numpy()})
        return Offer(sets, {"forward_equivalents": lg.forward_equivalents, "seconds": lg.seconds,
                            "n_evaluations": lg.n_steps * len(lg.penalties)}, lg.heads, search=search,
                     info={"gates": lg})


def choose_boost(lm, enc, sets, alphas=BOOST_ALPHAS) -> tuple[float, pd.DataFrame]:
    """The dose above 1 for boosting ``sets`` (each scaled by alpha) chosen on ``enc`` (the search split): the
    largest mean gain in accuracy over the sets (ties: margin, then the smaller alpha). Returns it and the table
    (``alpha``, ``heads``, ``search_delta_accuracy``, ``search_delta_margin``)."""
    grid = [(a, x) for a in alphas for x in sets]          # one engine call: each (dose, set) its own factor
    res = evaluate_head_sets(lm, enc, [[]] + [list(x) for _, x in grid],
                             mode=Ablation("scale", alphas=(1.0, *(float(a) for a, _ in grid))), progress=False)
    rows = [{"alpha": a, "heads": format_set(x),
             "search_delta_accuracy": float(res.correct[j + 1].mean() - res.correct[0].mean()),
             "search_delta_margin": float(res.margin[j + 1].mean() - res.margin[0].mean())}
            for j, (a, x) in enumerate(grid)]
    t = pd.DataFrame(rows)
    m = t.groupby("alpha")[["search_delta_accuracy", "search_delta_margin"]].mean().reset_index()
    best = m.sort_values(["search_delta_accuracy", "search_delta_margin", "alpha"],
                         ascending=[False, False, True]).iloc[0]
    return float(best.alpha), t


@register
class Boost(Selector):
    """The heads whose direct effect most reliably promotes the right answer on the search split, *boosted*: the
    top ``k`` of :func:`direct_ranking`, tested with their outputs multiplied by a dose above 1 (the offer's
    ``mode``) chosen on the search split by :func:`choose_boost`. Its held-out control in chapter 2's comparison
    is the random selector's sets *removed*, as for every selector; chapter 2b sets it beside removal."""

    key, label = "boost", "boost (direct effect)"

    def offer(self, ctx, max_k):
        t0 = time.perf_counter()
        ranking = direct_ranking(ctx.grad_lm, ctx.search)
        order = [(int(r.layer), int(r.head_index)) for r in ranking.itertuples()]
        sets = ranked_sets(order, max_k)
        alpha, table = choose_boost(ctx.lm, ctx.enc, sets)
        n_eval = len(sets) * len(BOOST_ALPHAS) + 1
        cost = {"forward_equivalents": 1.0 + n_eval, "seconds": time.perf_counter() - t0, "n_evaluations": n_eval}
        return Offer(sets, cost, order[:max_k], info={"alpha": alpha, "ranking": ranking, "doses": table},
                     mode=Ablation.of("scale", alpha=alpha))


@register
class RandomSets(Selector):
    """``random_sets`` random orders of all heads (seeded by the design): its sets are the first order's, its
    ``replicates`` all of them (the comparison's curve is their mean; the control puts each through the
    pipeline)."""

    key, label = "random", "random"

    def offer(self, ctx, max_k):
        reps = random_rankings(ctx.lm, ctx.options.random_sets, max_k, ctx.design.seed)
        return Offer(reps[0] if reps else [], {"forward_equivalents": 0.0, "seconds": 0.0, "n_evaluations": 0},
                     all_heads(ctx.lm), replicates=reps)


def random_rankings(lm, n: int, max_k: int, seed: int = 0) -> list[list[list[Head]]]:
    """``n`` random orders of all heads, each as its nested sets of size 1..max_k (sorted).

    Example:
        >>> from cel_utils.tiny import tiny_model
        >>> r = random_rankings(tiny_model("llama"), 2, 3)
        >>> [len(s) for s in r[0]], set(r[0][0]) <= set(r[0][1]) <= set(r[0][2])
        ([1, 2, 3], True)
    """
    rng = np.random.default_rng(seed)
    heads = all_heads(lm)
    return [ranked_sets([heads[i] for i in rng.permutation(len(heads))[:max_k]], max_k) for _ in range(n)]


def selector(key: str) -> Selector:
    """The registered selector ``key``, or a :class:`~cel_utils.errors.CELError` listing the keys."""
    if key not in REGISTRY:
        raise CELError(f"unknown strategy {key!r}; use one of {', '.join(REGISTRY)}")
    return REGISTRY[key]


def search(lm, search_task, heldout_task, key: str, design: Design, options: Options | None = None,
           ranked: Sequence[Head] | None = None) -> dict:
    """``cel search``: the selector ``key`` offers sets of size ``1..design.max_k`` on the search split, each graded
    on held-out items (:func:`cel_utils.joint.graded_sets`: both splits, held-out CI, interaction, percentile among
    ``options.random_sets`` random sets of its size). ``ranked``: a ranking for the pool selectors (else an exact
    screen ranks). The gates' record joins as ``gates``.

    Example:
        >>> out = search(lm, search_split, heldout_split, "greedy", Design(max_k=3))   # doctest: +SKIP
    """
    sel = selector(key)
    ctx = Context.make(lm, search_task, design, options, ranked=list(ranked) if ranked is not None else None)
    off = sel.offer(ctx, design.max_k)
    enc_h = encode_task(ctx.lm, heldout_task)
    out = {"strategy": key, "pool": [head_name(h) for h in off.pool], "n_evaluations": off.cost["n_evaluations"],
           "search_seconds": off.cost["seconds"],
           **graded_sets(ctx.lm, ctx.enc, enc_h, off.sets, ctx.design.mode if off.mode is None else off.mode,
                         options.random_sets if options else 0, design.n_boot, design.seed)}
    if off.mode is not None:
        out["mode"] = off.mode.describe()
    if "gates" in off.info:
        out["gates"] = off.info["gates"].record()
    return out


def pipeline_run(ctx: Context, off: Offer, sel: Selector, encs: dict, control=None) -> Run:
    """An offer through :func:`cel_utils.pipeline.run` (every offered set confirmed and tested) with ``control``
    (a control table already computed for these splits) attached."""
    d = ctx.design if off.mode is None else replace(ctx.design, mode=off.mode)
    r = run(ctx.lm, encs, off.named(), d, "offered", search=off.search, selector=sel.label)
    if control is not None:
        r.control = control
    return r


def gate_pipeline(lm, splits: dict, settings: GateSettings | None = None, **overrides) -> tuple[Run, LearnedGates]:
    """Learn gates on ``splits["search"]`` (nothing else is read to learn them), then put the set of every size
    through the book's pipeline (:func:`cel_utils.pipeline.run`: confirm with BH over the sizes, choose, held-out
    with Holm over the sizes) with ``random_sets`` random rankings of all heads through the same pipeline (the
    selection-aware control). Evaluations run in ``settings.dtype`` (None: ``lm``'s own); the gates learn in
    ``lm``'s. Returns the run and the gates.

    Example:
        >>> r, lg = gate_pipeline(lm, {s: load_task("agreement", s, n=50) for s in SPLITS}, max_k=5)  # doctest: +SKIP
        >>> r.chosen(), r.control_percentile()                                                     # doctest: +SKIP
    """
    s = replace(settings or GateSettings(), **overrides)
    s.check(lm.n_layers * lm.n_heads)
    ctx = Context.make(lm, splits["search"], s.design(), Options(gates=s, random_sets=s.random_sets),
                       progress=s.progress)
    off = REGISTRY["gates"].offer(ctx, s.max_k)
    encs = encoded(ctx.lm, splits)
    reps = REGISTRY["random"].offer(ctx, s.max_k).replicates
    r = run(ctx.lm, encs, off.named(), ctx.design, "offered", search=off.search, selector="learned gates",
            control_offers=reps)
    return r, off.info["gates"]
