"""Remove, scale or boost a head: dose curves, boosting the heads that promote the answer, the per-item ceiling.

Chapter 2b asks which intervention on a head helps, not only whether removal does:

* :func:`dose_curve` -- a head set's output multiplied by ``alpha`` (``alpha = 0`` is removal, ``1`` the intact
  model) on the confirm and held-out items; the dose is chosen on confirm items and graded on held-out items,
  where removal is tested against it (paired: exact McNemar on the items where the two disagree);
* :func:`collateral_curve` -- the same doses' cost on general text (change in NLL per token, CI over chunks);
* :func:`boost_vs_remove` -- the ``boost`` selector of :mod:`cel_utils.selectors` (the heads whose *direct*
  effect most reliably promotes the right answer, :func:`cel_utils.direct.direct_ranking`, their outputs
  multiplied by a dose above 1 chosen on the search split) beside removal, and both at once (:func:`together`
  joins each boosted set with a removed set: one ablation, a factor per head);
* :func:`recall_at_budget` -- how many of the exact screen's top k heads the gradient, compressed-sensing and
  gate selectors find at a fixed budget of forward-equivalents, with a bootstrap CI over items of the reference;
* :func:`per_item_ceiling` -- the fraction of wrong items that *some* single-head removal fixes (an oracle that
  chooses on the item itself) beside the same fraction with the item-head link broken (each head's flips
  permuted over the wrong items): the gap is what per-item head choice could at most add.

    >>> import numpy as np
    >>> base = np.array([0, 0, 0, 0, 1], bool)
    >>> flips = np.array([[1, 0, 0, 0, 1], [0, 1, 0, 0, 1]], bool)   # [head, item]: right after removal
    >>> c = per_item_ceiling(base, flips, n_perm=50)
    >>> c["oracle"], c["wrong_items"]
    (0.5, 4)
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from .ablation import Ablation, format_set
from .compare import paired_table
from .defaults import ALPHA, GRADIENT_FORWARD_EQUIVALENTS
from .design import Design
from .engine import evaluate_head_sets
from .pipeline import Run, run
from .robust import text_nll
from .scoring import encode_task
from .screening import screen
from .selectors import REGISTRY, Context, pipeline_run
from .stats import bootstrap_mean, head_to_head, mcnemar_exact, paired_bootstrap

ALPHAS = (-0.5, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)   # the grid: 0 removes, 1 is the intact model


def shape_of(alpha: float) -> str:
    """What the dose chosen on confirm items says about the curve.

        >>> shape_of(0.0), shape_of(0.5), shape_of(-0.5), shape_of(1.5), shape_of(1.0)
        ('removal is the best dose', 'an interior optimum', 'beyond removal (negative alpha)', 'boosting helps', 'no dose helps')
    """
    if alpha == 0:
        return "removal is the best dose"
    if 0 < alpha < 1:
        return "an interior optimum"
    if alpha < 0:
        return "beyond removal (negative alpha)"
    return "boosting helps" if alpha > 1 else "no dose helps"


@dataclass
class DoseCurve:
    """One head set's dose curve: ``table`` (one row per split and alpha), the chosen dose and removal's test."""

    heads: str
    table: pd.DataFrame
    chosen_alpha: float
    removal_vs_best: dict

    @property
    def shape(self) -> str:
        return shape_of(self.chosen_alpha)

    def record(self) -> dict:
        return {"heads": self.heads, "chosen_alpha": self.chosen_alpha, "shape": self.shape,
                "removal_vs_best": self.removal_vs_best, "curve": self.table.to_dict("records")}


def _evaluate(lm, enc, heads, alphas, progress=False):
    """Per alpha the (correct, margin) rows of the head set scaled by alpha; alpha = 1 is the intact model. One
    engine call: the intact pass once, every dose a head set with its own factor."""
    doses = [a for a in alphas if a != 1]
    sets = [[]] + [list(heads)] * len(doses)
    res = evaluate_head_sets(lm, enc, sets, mode=Ablation("scale", alphas=(1.0, *map(float, doses))),
                             progress=progress)
    out = {1.0: res.rows(slice(0, 1))} if 1 in alphas else {}
    out.update({a: res.rows(slice(j + 1, j + 2)) for j, a in enumerate(doses)})
    return out


def dose_curve(lm, encs: dict, heads, alphas=ALPHAS, n_boot: int = 1000, seed: int = 0) -> DoseCurve:
    """The curve of ``heads`` (removed together, scaled by each alpha) on ``encs["confirm"]`` and
    ``encs["heldout"]`` (encoded tasks); the dose with the largest confirm gain in accuracy (ties: margin, then
    the alpha nearest 0) is the chosen one, and on held-out items removal is tested against it."""
    alphas = sorted(set(alphas) | {0.0, 1.0})
    rows, per = [], {}
    for split in ("confirm", "heldout"):
        res = _evaluate(lm, encs[split], heads, alphas)
        base = res[1.0]
        for a in alphas:
            t = paired_table([f"alpha {a:g}"], base, res[a], n_boot=n_boot, seed=seed).iloc[0]
            rows.append({"split": split, "alpha": a, **t.to_dict()})
        per[split] = res
    table = pd.DataFrame(rows)
    chosen = choose_dose(table)
    held = per["heldout"]
    test = removal_vs(held[0.0].correct[0], held[chosen].correct[0], n_boot=n_boot, seed=seed)
    return DoseCurve(format_set(heads), table, chosen, test)


def collateral_curve(lm, heads, alphas=ALPHAS, n_tokens: int = 1000, chunk: int = 128, n_boot: int = 1000,
                     seed: int = 0) -> pd.DataFrame:
    """The collateral cost along the dose: the change in next-token NLL per token on general English text
    (:func:`cel_utils.robust.text_nll`, ``n_tokens`` in chunks of ``chunk``) with ``heads`` scaled by each alpha,
    with the bootstrap CI over chunks (``alpha``, ``nll_delta``, ``nll_low``, ``nll_high``). alpha = 1 is the intact
    model: its row is 0 with no pass (the unablated pass is the baseline of every other row)."""
    rows, tokens = [], None
    for a in sorted(set(alphas)):
        if a == 1:
            rows.append({"alpha": 1.0, "nll_delta": 0.0, "nll_low": 0.0, "nll_high": 0.0})
            continue
        res = text_nll(lm, {"set": list(heads)}, n_tokens, chunk=chunk, n_boot=n_boot, seed=seed,
                       mode=Ablation.of("scale", alpha=a))
        t, tokens = res["sets"]["set"], res["text_tokens"]
        rows.append({"alpha": float(a), "nll_delta": t["text_nll_delta"], "nll_low": t["ci_low"],
                     "nll_high": t["ci_high"]})
    return pd.DataFrame(rows).assign(tokens=tokens)   # the text's tokens: every cost says on how much text


def verdict_line(r) -> str:
    """One dose curve's sentence (a row of chapter 2b's dose table: ``model``, ``heads``, ``chosen_alpha``,
    ``shape``, ``removal_delta``, ``best_minus_removal``, ``ci_low``, ``ci_high``, ``p_value``), its words from
    the graded items' exact McNemar test: the chosen dose beats removal (p below ALPHA and above it), loses to it,
    or ties with it.

        >>> from types import SimpleNamespace as R
        >>> verdict_line(R(model="m", heads="L1H1", chosen_alpha=-0.5, shape="peak", removal_delta=0.1,
        ...                best_minus_removal=0.0, ci_low=0.0, ci_high=0.0, p_value=1.0)).split("; ")[1][:60]
        'on the graded items it ties with removal (not shown to diffe'
    """
    if r.chosen_alpha == 0:
        return f"- **{r.model}**, {r.heads}: removal is the dose the choose items pick (held-out gain {r.removal_delta:+.3f})."
    word = ("ties with removal (not shown to differ on these items)" if not r.p_value < ALPHA else
            "beats removal" if r.best_minus_removal > 0 else "loses to removal")
    return (f"- **{r.model}**, {r.heads}: the choose items pick alpha = {r.chosen_alpha:g} ({r.shape}); on the "
            f"graded items it {word} ({r.best_minus_removal:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}], "
            f"McNemar p = {r.p_value:.2g}; removal alone {r.removal_delta:+.3f}).")


def choose_dose(table: pd.DataFrame) -> float:
    """The alpha with the largest confirm gain in accuracy (ties: margin, then the alpha nearest 0); 1 (the
    intact model) when no dose gains.

        >>> t = pd.DataFrame({"split": "confirm", "alpha": [0.0, 0.5, 1.0, 2.0],
        ...                   "delta_accuracy": [0.05, 0.08, 0.0, 0.08], "delta_margin": [0.1, 0.3, 0.0, 0.2]})
        >>> choose_dose(t)
        0.5
    """
    conf = table[(table.split == "confirm") & (table.alpha != 1.0)].copy()
    conf["dist"] = conf.alpha.abs()
    best = conf.sort_values(["delta_accuracy", "delta_margin", "dist"], ascending=[False, False, True]).iloc[0]
    return float(best.alpha) if best.delta_accuracy > 0 else 1.0


def removal_vs(removed: np.ndarray, other: np.ndarray, n_boot: int = 1000, seed: int = 0) -> dict:
    """Another dose against removal on the same items: mean(other - removed) with a paired-bootstrap CI, and the
    exact McNemar test on the items where they disagree (``better``: right only under the other dose).

        >>> removal_vs(np.array([1, 0, 0, 1]), np.array([1, 1, 1, 1]))["better"]
        2
    """
    r, o = np.asarray(removed, bool), np.asarray(other, bool)
    better, worse = int((o & ~r).sum()), int((r & ~o).sum())
    b = paired_bootstrap(r.astype(float), o.astype(float), n_boot=n_boot, seed=seed)
    return {"delta": b["delta"], "ci_low": b["ci_low"], "ci_high": b["ci_high"], "better": better, "worse": worse,
            "p_value": float(mcnemar_exact(np.array([better]), np.array([worse]))[0])}


def per_item_ceiling(base_correct: np.ndarray, head_correct: np.ndarray, n_perm: int = 1000, seed: int = 0,
                     static_correct: np.ndarray | None = None, strata: np.ndarray | None = None) -> dict:
    """The oracle share of wrong items some single-head removal fixes, and its null.

    ``base_correct [n]``: the intact model; ``head_correct [heads, n]``: each head removed alone. The null keeps
    every head's number of fixes and permutes which wrong items they fall on (independently per head; within each
    ``strata [n]`` label when given, e.g. bins of the intact margin, so that items near the decision boundary, which
    any head flips more easily, are only exchanged with each other), so it is the oracle's value if the link between
    item and head carried nothing beyond that. ``static_correct [n]``: one fixed set removed on all items, for
    comparison (the share of wrong items it fixes), and the oracle minus it per item with an item-bootstrap 95% CI
    (``oracle_minus_static``, ``oms_low``, ``oms_high``): how much choosing a head per item, with hindsight, could
    add over the static set. The null asks a different question (do the heads' fixes overlap less than chance).
    """
    wrong = ~np.asarray(base_correct, bool)
    fixes = np.asarray(head_correct, bool)[:, wrong]                 # [heads, wrong items]
    n = int(wrong.sum())
    if n == 0:
        nan = float("nan")
        return {"wrong_items": 0, "fixes_per_head": [], "oracle": nan, "null_mean": nan, "null_low": nan,
                "null_high": nan, "gap": nan, "p_value": nan, "static": nan, "oracle_minus_static": nan,
                "oms_low": nan, "oms_high": nan}
    oracle = float(fixes.any(axis=0).mean())
    rng = np.random.default_rng(seed)
    groups = [np.arange(n)] if strata is None else \
        [np.flatnonzero(np.asarray(strata)[wrong] == g) for g in np.unique(np.asarray(strata)[wrong])]
    null = np.empty(n_perm)
    for i in range(n_perm):
        perm = fixes.copy()
        for idx in groups:                                         # permute within each stratum, per head
            perm[:, idx] = rng.permuted(fixes[:, idx], axis=1)
        null[i] = perm.any(axis=0).mean()
    static = float(np.asarray(static_correct, bool)[wrong].mean()) if static_correct is not None else float("nan")
    over = {"oracle_minus_static": float("nan"), "oms_low": float("nan"), "oms_high": float("nan")}
    if static_correct is not None:      # what choosing a head per item (with hindsight) adds over the static set
        d = fixes.any(axis=0).astype(float) - np.asarray(static_correct, bool)[wrong]
        over = dict(zip(over, bootstrap_mean(d, 2000, seed)))
    return {"wrong_items": n, "oracle": oracle, "null_mean": float(null.mean()), **over,
            "fixes_per_head": fixes.sum(axis=1).astype(int).tolist(),
            "null_low": float(np.quantile(null, 0.025)), "null_high": float(np.quantile(null, 0.975)),
            "gap": oracle - float(null.mean()), "p_value": float((1 + (null >= oracle).sum()) / (n_perm + 1)),
            "static": static}


def boost_vs_remove(lm, search_task, encs: dict, cel_set, design: Design, max_k: int = 3) -> dict:
    """The boost selector's offer (sizes ``1..max_k``, chosen on ``search_task``) and the removal of ``cel_set``
    (a set chosen elsewhere, e.g. by chapter 2) through the same pipeline on ``encs["confirm"]`` and
    ``encs["heldout"]`` (items that chose neither): ``boost`` and ``remove`` (:class:`~cel_utils.pipeline.Run`),
    the boost dose ``alpha``, the ``ranking`` and the ``doses`` it was chosen from."""
    ctx = Context.make(lm, search_task, design)
    off = REGISTRY["boost"].offer(ctx, max_k)
    boost = pipeline_run(ctx, off, REGISTRY["boost"], encs)
    remove = run(ctx.lm, encs, {format_set(cel_set): list(cel_set)}, ctx.design, "offered", selector="removal")
    both_sets, both_mode = together(off.sets, cel_set, off.info["alpha"])
    both = run(ctx.lm, encs, {format_set(x): x for x in both_sets}, replace(ctx.design, mode=both_mode), "offered",
               selector="boost and remove")
    return {"boost": boost, "remove": remove, "both": both, "alpha": off.info["alpha"],
            "ranking": off.info["ranking"], "doses": off.info["doses"], "mode": off.mode, "both_mode": both_mode}


def _graded(r: Run, base: np.ndarray | None) -> np.ndarray | None:
    """Each held-out item right or not under the run's chosen set (the intact model's ``base`` when it chose
    nothing: the pipeline then removes nothing); None when no held-out item was graded."""
    c, cmp = r.chosen(), r.heldout_comparison
    if c is None:
        return base
    return None if cmp is None else np.asarray(cmp.results.correct[cmp.names.index(c["heads"])], bool)


def boost_against_removal(b: dict) -> dict | None:
    """Boosting against removing, head to head (:func:`cel_utils.stats.head_to_head`): each pipeline's chosen set
    on the same held-out items (:func:`boost_vs_remove`'s ``boost`` and ``remove``); a pipeline that chose nothing
    counts as the intact model. None when neither graded a held-out item."""
    cmps = [r.heldout_comparison for r in (b["boost"], b["remove"]) if r.heldout_comparison is not None]
    if not cmps:
        return None
    base = np.asarray(cmps[0].baseline.correct[0], bool)
    d = b["boost"].design
    return head_to_head(_graded(b["boost"], base), _graded(b["remove"], base), d.n_boot, d.seed, d.alpha)


def versus_line(model: str, hh: dict | None, costs: pd.DataFrame) -> str:
    """Chapter 2b's sentence on boosting against removal for one model: the head-to-head on the graded items
    (:func:`boost_against_removal`) worded from its exact test, and each one's cost on general text beside it
    (``costs``: chapter 2b's cost table, rows ``model``, ``intervention``, ``measured on``, ``change``,
    ``ci_low``, ``ci_high``)."""
    if hh is None:
        return f"- **{model}**: neither boosting nor removal graded a held-out item, so they are not compared."
    word = {"more": "boosting helps more than removal", "less": "boosting helps less than removal",
            "tie": "boosting and removal are not shown to differ (a tie on these items)"}[hh["word"]]
    text = costs[(costs.model == model) & costs["measured on"].str.startswith("general text")] if len(costs) else costs
    cost = "; ".join(f"{r['intervention']} {r['change']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] nats/token "
                     f"on {r['measured on'].removeprefix('general text (').rstrip(')')}"
                     for r in text.to_dict("records") if r["intervention"] in ("boost", "remove"))
    return (f"- **{model}**, head to head on the same graded items: boosting minus removal {hh['delta']:+.3f} "
            f"[{hh['ci_low']:+.3f}, {hh['ci_high']:+.3f}] (exact McNemar p = {hh['p_value']:.2g}): {word}"
            + (f". Their costs on general text: {cost}." if cost else "."))


def together(boost_sets, cel_set, alpha: float) -> tuple[list, Ablation]:
    """"Boost and remove together": each boosted set (sizes 1..k) joined with ``cel_set``, and the ablation that
    removes ``cel_set``'s heads and multiplies the boosted ones by ``alpha`` (a head in both is removed).

    Example:
        >>> sets, ab = together([[(3, 1)], [(3, 1), (5, 0)]], [(5, 0), (2, 2)], 1.5)
        >>> [format_set(x) for x in sets], ab.describe()
        (['L2H2+L3H1+L5H0', 'L2H2+L3H1+L5H0'], 'scale 0 (L3H1 x1.5)')
    """
    cel = [tuple(h) for h in cel_set]
    boosted = list(dict.fromkeys(tuple(h) for x in boost_sets for h in x if tuple(h) not in cel))
    sets = [sorted(set(cel) | {tuple(h) for h in x}) for x in boost_sets]
    return sets, Ablation("scale", alpha=0.0, head_alphas=tuple((l, h, float(alpha)) for l, h in boosted))


def ceiling(lm, task, static_heads, n_wrong: int = 32, n_perm: int = 2000, seed: int = 0,
            progress: bool = False) -> dict:
    """:func:`per_item_ceiling` on the first ``n_wrong`` items of ``task`` the intact model gets wrong: every
    single head removed on each (an exact screen of those items), ``static_heads`` removed on all of them.
    Adds ``items_read`` (items of ``task`` read to find them) and ``heads``."""
    enc = encode_task(lm, task)
    base = evaluate_head_sets(lm, enc, [[]], progress=False)
    wrong = np.flatnonzero(~base.correct[0].astype(bool))[:n_wrong]
    sub = replace(task, items=[task.items[i] for i in wrong])
    if not len(wrong):
        return {**per_item_ceiling(np.ones(1, bool), np.ones((1, 1), bool)), "items_read": len(task.items),
                "heads": 0}
    sc = screen(lm, sub, progress=progress)                                  # results.correct: [heads, n_wrong]
    static = evaluate_head_sets(lm, encode_task(lm, sub), [list(static_heads)], progress=False).correct[0]
    margin = sc.baseline.margin[0]                                           # items of like margin exchanged
    bins = np.searchsorted(np.quantile(margin, [0.25, 0.5, 0.75]), margin) if len(margin) >= 8 else None
    out = per_item_ceiling(sc.baseline.correct[0], sc.results.correct, n_perm, seed, static, strata=bins)
    return {**out, "items_read": len(task.items), "heads": len(sc.heads)}


def recall_ci(per_item: np.ndarray, chosen: dict, k: int, n_boot: int = 1000, seed: int = 0) -> dict:
    """Per named head set (indices into the rows of ``per_item [heads, items]``, each head's change in margin per
    item): the share of the top ``k`` heads by mean change that it holds, and a percentile 95% CI over items
    (the items resampled, the top ``k`` recomputed; the sets stay fixed).

        >>> per_item = np.array([[3.0, 3.0, 3.0], [0.0, 0.1, 0.0], [1.0, -1.0, 0.2]])
        >>> recall_ci(per_item, {"a": [0]}, k=1, n_boot=50)["a"]
        (1.0, 1.0, 1.0)
    """
    rng = np.random.default_rng(seed)

    def recall(mean, idx):
        top = set(np.lexsort((np.arange(len(mean)), -mean))[:k])
        return len(top & set(idx)) / k

    n = per_item.shape[1]
    out = {}
    boots = [per_item[:, rng.integers(0, n, n)].mean(1) for _ in range(n_boot)]
    for name, idx in chosen.items():
        b = np.array([recall(m, idx) for m in boots])
        out[name] = (recall(per_item.mean(1), idx), float(np.quantile(b, 0.025)), float(np.quantile(b, 0.975)))
    return out


def recall_at_budget(ctx: Context, budgets=(12.0, 48.0), k: int = 5, n_boot: int = 1000) -> pd.DataFrame:
    """Recall of the exact screen's top ``k`` heads (by change in search margin) by the gradient selector (at its
    own cost) and by compressed sensing and the learned gates at each budget of forward-equivalents over the
    search items (knockouts = budget; gate steps = budget over the forward-equivalents of one step of every
    gate run), each with its actual cost and a CI over items of the reference (:func:`recall_ci`)."""
    from .gates import GateSettings

    sc = ctx.screen()
    index = {h: i for i, h in enumerate(sc.heads)}
    per_item = sc.results.margin - sc.baseline.margin                 # [heads, items]
    gs = ctx.options.gates or GateSettings()
    per_step = GRADIENT_FORWARD_EQUIVALENTS * min(1.0, gs.batch_size / ctx.enc.n_items) * len(gs.penalties) * \
        len(gs.inits)
    runs = [("gradient", GRADIENT_FORWARD_EQUIVALENTS, ctx)]
    for b in budgets:
        runs.append(("compressed", b, replace(ctx, options=replace(ctx.options, compressed_evals=int(b)))))
        steps = max(1, int(b // per_step))
        runs.append(("gates", b, replace(ctx, options=replace(ctx.options, gates=replace(gs, steps=steps)))))
    rows, chosen = [], {}
    for key, budget, c in runs:
        off = REGISTRY[key].offer(c, k)
        name = f"{key} @ {budget:g}"
        chosen[name] = [index[h] for h in off.sets[k - 1]]
        rows.append({"selector": key, "budget": budget, "forward_equivalents": off.cost["forward_equivalents"],
                     "heads": format_set(off.sets[k - 1]), "name": name})
    ci = recall_ci(per_item, chosen, k, n_boot, ctx.design.seed)
    t = pd.DataFrame(rows)
    t["recall"], t["ci_low"], t["ci_high"] = zip(*(ci[n] for n in t["name"]))
    t["exact_forward_equivalents"] = ctx.screen_cost()["forward_equivalents"]
    return t.drop(columns=["name"])
