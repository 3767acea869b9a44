"""The battery: every measurement of :mod:`cel_utils.robust` made on head sets, read into checks and a label by
:mod:`cel_utils.labels` (chapter 1c, ``cel robust``), with each label's bootstrap distribution over items and the
rule's operating characteristics on the pair's own items (:mod:`cel_utils.operating`).

:func:`battery` measures several sets of one task in shared passes (the unablated runs once) on items no choice used
(:func:`battery_items`: the tails of the held-out and confirm splits after the items the verdicts used) and gives
one :class:`Battery` per set.

Example:
    >>> battery_items("addition", RobustSettings(n=150, items=(("heldout", 200), ("confirm", 200)))).items[0]["split"]
    'heldout'
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd

from .ablation import Head, compute_head_means, format_set, parse_set
from .defaults import COLLATERAL_NLL, LABEL_BOOT, LABEL_FIRM, N_BOOT, OC_SIMS, ROBUST_ITEMS, TEXT_TOKENS
from .effects import item_labels
from .engine import screen_work
from .errors import CELError
from .formats import FORMATS
from .io import json_safe
from .labels import HOLDS, Outcomes, checks, label, label_distribution
from .models import load_model
from .operating import operating_characteristics
from .robust import ablation_types, format_changes, generation, other_tasks, text_nll
from .scoring import encode_task
from .tasks import Task, load_task

# the control task of each task: the same answer format, another computation (specificity)
CONTROL_TASKS = {"addition": "subtraction", "subtraction": "addition", "agreement_rc": "agreement",
                 "agreement": "agreement_rc", "comparison": "addition", "ioi": "agreement", "toy_a": "toy_b",
                 "toy_b": "toy_a"}


@dataclass(frozen=True)
class RobustSettings:
    """The parameters of :func:`battery` (defaults from :mod:`cel_utils.defaults`)."""

    n: int = ROBUST_ITEMS        # items per check (as many as the sources hold, up to this)
    items: tuple = (("heldout", 0),)   # (split, first item) sources, in order: the items are their tails
    n_search: int = 32           # search items: head means and the best constant
    seed: int = 0
    n_boot: int = N_BOOT
    constant_steps: int = 5      # 0: the best-constant ablation is not fit
    fit_dtype: str = "float32"   # the best constant's fit on the search split ("auto": bfloat16 where native)
    text_tokens: int = TEXT_TOKENS  # 0: no general-text NLL
    text_max_tokens: int = 0     # above text_tokens: where a set's NLL CI is wider than nll_width, every measured
    nll_width: float = COLLATERAL_NLL   # set is measured again on this many tokens (one window for the pair)
    other_tasks: tuple = ()      # tasks on which the cost is measured
    n_other: int = 100
    generate: bool = True        # free generation (exact-match tasks)
    nll_sets: tuple | None = None       # the sets whose text NLL is measured (None: all); a set not named here is
    #                                     measured anyway when the cost decides its label (every other check holds)
    constant_sets: tuple | None = None  # the sets for which the best constant is fit (None: all)
    brief_sets: tuple = ()              # sets whose battery stops at the formats when they decide the label
    label_boot: int = LABEL_BOOT        # item resamples of each label's bootstrap distribution
    oc_sims: int = OC_SIMS              # planted heads per truth in the operating characteristics (0: none)
    null_set: str | None = None         # a real null head: the semi-synthetic row plants fixes into its outcomes


def battery_items(task_name: str, s: RobustSettings) -> Task:
    """The battery's items: the tail of each source split (``s.items``: (split, first item)) in order, up to
    ``s.n``; each item keeps the ``split`` it came from. A :class:`~cel_utils.errors.CELError` when they hold
    fewer than 2 items."""
    items, src = [], None
    for split, start in s.items:
        src = load_task(task_name, split, seed=s.seed)
        items += [dict(it, split=split) for it in src.items[start:]]
    if len(items[:s.n]) < 2:
        raise CELError(f"{task_name}: the sources {list(s.items)} hold {len(items)} items, the battery needs at least 2")
    return replace(src, items=items[:s.n], split=None)


@dataclass
class Battery:
    """One head set's checks on one task (:func:`battery`): the measurements behind them, each check's estimate,
    CI and reading, the label, its bootstrap distribution over items, and the rule's operating characteristics
    on the pair's items."""

    model: str
    task: str
    heads: str                   # the set's name (:func:`cel_utils.ablation.format_set`)
    n: int
    items: list                  # the sources of the items: (split, first item)
    formats: pd.DataFrame
    ablations: dict
    generation: dict
    collateral: dict
    control_task: dict
    checks: dict = field(default_factory=dict)
    label: str = ""
    label_distribution: dict = field(default_factory=dict)
    operating: pd.DataFrame | None = None
    outcomes: Outcomes | None = None   # the per-item outcomes the checks read (not recorded)

    def record(self) -> dict:
        """The JSON of ``cel robust`` (one set): the items, ``formats`` (the default first), ``ablations``,
        ``generation`` (exact-match tasks, with replayable items), ``fixes_by_kind`` (addition), ``collateral``,
        ``control_task``, ``checks`` (estimate, CI and reading each), ``label``, ``label_distribution`` and
        ``operating_characteristics`` (P(label | planted truth))."""
        f = self.formats[self.formats["set"] == self.heads]
        g = self.generation.get("sets", {}).get(self.heads) if self.generation else None
        return json_safe({
            "model": self.model, "task": self.task, "heads": self.heads, "n": self.n, "items": self.items,
            "formats": [{"name": r["format"], "n": r["n"], "baseline": r["baseline"], "delta": r["delta"],
                         "ci_low": r["ci_low"], "ci_high": r["ci_high"], "delta_margin": r["delta_margin"]}
                        for r in f.to_dict("records")],
            "ablations": {k: {x: y for x, y in v.items() if x != "margins"} for k, v in self.ablations.items()},
            "generation": None if g is None else {
                "baseline_accuracy": self.generation["baseline_accuracy"], "prefix": self.generation["prefix"],
                **{k: v for k, v in g.items() if k != "fixes_by_kind"}},
            "fixes_by_kind": None if g is None else g.get("fixes_by_kind"),
            "collateral": self.collateral, "control_task": self.control_task, "checks": self.checks,
            "label": self.label, "label_distribution": self.label_distribution,
            "operating_characteristics": None if self.operating is None else
            self.operating.reset_index().to_dict("records")})


READ = {"holds": "holds", "fails": "fails", "cannot tell": "?"}   # a check's reading in chapter 1c's label table


def row(b: Battery, role: str) -> dict:
    """One set's row of chapter 1c's label tables: its label with how often item resamples give it again
    (``label_share``), the gain in its own format with CI, each check's reading (``READ``), the transfer, survival,
    offset and generation estimates with CIs, the text cost (with its token count) and the control task's change."""
    c = b.checks
    f = b.formats[b.formats["set"] == b.heads].set_index("format")
    r = {"model": b.model, "task": b.task, "heads": b.heads, "role": role, "label": b.label,
         "label_share": b.label_distribution.get(b.label, float("nan")), "n": b.n,
         "gain": f.loc["default", "delta"], "gain_ci_low": c["effect"]["ci_low"], "gain_ci_high": c["effect"]["ci_high"]}
    for k in ("transfer", "format_specific", "survives", "offset", "generation", "teacher_forcing", "label_shift",
              "cost"):
        r[k] = READ.get(c[k]["reading"]) if k in c else None
    for k in ("transfer", "survives", "offset", "generation"):
        r[f"{k}_est"] = c[k]["estimate"] if k in c else None
        r[f"{k}_lo"], r[f"{k}_hi"] = (c[k]["ci_low"], c[k]["ci_high"]) if k in c else (None, None)
    r["text_nll_delta"], r["nll_ci_low"], r["nll_ci_high"] = (b.collateral["text_nll_delta"],
                                                             b.collateral.get("text_nll_ci_low"),
                                                             b.collateral.get("text_nll_ci_high"))
    r["text_tokens"] = b.collateral.get("text_tokens") or None
    r["control_task"], r["control_delta"] = b.control_task.get("task"), b.control_task.get("delta")
    return r


def sentence(b: Battery, role: str) -> str:
    """Chapter 1c's sentence for one set (a markdown list item): its label, firm or weak (:data:`LABEL_FIRM` of
    item resamples), the gain in its own format, and each measured check's estimate with CI and reading."""
    c, share = b.checks, b.label_distribution.get(b.label, float("nan"))
    e = c["effect"]
    firm = "firm" if share >= LABEL_FIRM else "weak"
    bits = [f"**{b.heads}** ({b.model}, {b.task}, {role}) is labelled **{b.label}** ({firm}: the same label on "
            f"{share:.0%} of item resamples): gain {e['estimate']:+.3f} [{e['ci_low']:+.3f}, "
            f"{e['ci_high']:+.3f}] in the task's own format on {b.n} items"]
    t = c.get("transfer", {})
    if t.get("estimate") is not None:
        bits.append(f"over the {len(t['formats'])} other formats with room {t['estimate']:+.3f} "
                    f"[{t['ci_low']:+.3f}, {t['ci_high']:+.3f}] ({t['reading']})")
    elif "transfer" in c:
        bits.append("no other format leaves room to tell whether it transfers")
    for k, what in (("survives", "under mean or resample ablation"), ("offset", "zero minus resample"),
                    ("generation", "in free generation")):
        if k in c and c[k].get("estimate") is not None:
            bits.append(f"{what} {c[k]['estimate']:+.3f} [{c[k]['ci_low']:+.3f}, {c[k]['ci_high']:+.3f}] "
                        f"({c[k]['reading']})")
    if not b.ablations:
        bits.append("the battery stopped at the formats, which decide the label")
    col = b.collateral
    if col["text_nll_delta"] is not None:
        lo, hi = col.get("text_nll_ci_low"), col.get("text_nll_ci_high")
        ci = f"[{lo:+.4f}, {hi:+.4f}]" if lo is not None and np.isfinite(lo) else "(one chunk: no interval)"
        bits.append(f"NLL on general text {col['text_nll_delta']:+.4f} nats/token {ci} on {col['text_tokens']} tokens")
    if b.control_task.get("task"):
        bits.append(f"on {b.control_task['task']} (control task) {b.control_task['delta']:+.3f}")
    return "- " + "; ".join(bits) + "."


def decided_by_formats(c: dict) -> bool:
    """Whether the formats alone decide a set's label: no gain shown in the task's own format, or a gain shown
    there and not in the others (the first words of :func:`cel_utils.labels.label`)."""
    return c["effect"]["reading"] != HOLDS or c.get("format_specific", {}).get("reading") == HOLDS


def needs_cost(c: dict) -> bool:
    """Whether the text cost decides a set's label: every other word's check fails or cannot tell, and every
    other part of ``capability`` holds."""
    if decided_by_formats(c):
        return False
    if any(c.get(k, {}).get("reading") == HOLDS for k in ("label_shift", "offset", "teacher_forcing")):
        return False
    return all(c.get(k, {}).get("reading") == HOLDS for k in ("transfer", "survives") + (
        ("generation",) if "generation" in c else ()))


@dataclass
class Shared:
    """What the sets of one battery share: the items and their classes, the search split, the passes made once."""

    task: Task
    search: Task
    signs: np.ndarray | None
    gen: dict
    others: pd.DataFrame | None
    control: pd.DataFrame | None
    means: object


def _signs(task: Task) -> np.ndarray | None:
    labels = item_labels(task)
    if labels is None or len(set(labels)) != 2:
        return None
    first = sorted(set(labels))[0]
    return np.where(np.asarray(labels) == first, 1, -1)


def _shared(lm, task_name: str, task: Task, rest: dict, s: RobustSettings) -> Shared:
    search = load_task(task_name, "search", n=s.n_search, seed=s.seed, clip=True)
    gen = generation(lm, task, rest, s.n_boot, s.seed) if s.generate and rest else {}
    others = other_tasks(lm, rest, list(s.other_tasks), s.n_other, s.seed, s.n_boot) \
        if s.other_tasks and rest else None
    ctl_name = CONTROL_TASKS.get(task_name)
    ctl = other_tasks(lm, rest, [ctl_name], s.n_other, s.seed, s.n_boot) if ctl_name and rest else None
    means = compute_head_means(lm, encode_task(lm, search).inputs) if rest else None  # [layers, heads, d_head]
    return Shared(task, search, _signs(task), gen, others, ctl, means)


def _outcomes(lm, name: str, heads: list[Head], margins: dict, sh: Shared, s: RobustSettings) -> tuple:
    """One set's ablation kinds and its per-item outcomes (all but the text NLL)."""
    steps = s.constant_steps if s.constant_sets is None or name in s.constant_sets else 0
    abl = ablation_types(lm, sh.task, sh.search, heads, s.n_boot, s.seed, steps, means=sh.means,
                         fit_dtype=s.fit_dtype)
    right = sh.gen.get("right") if sh.gen else None
    hurts = None if sh.others is None else bool(sh.others[sh.others["set"] == name]["hurts"].any())
    o = Outcomes(margins, {k: v["margins"] for k, v in abl.items() if k != "zero"},
                 None if right is None else (right[""], right[name]), sh.signs, None, hurts)
    return abl, o


def _collateral(name: str, nll: dict, sh: Shared | None, brief: bool) -> dict:
    coll = {"text_nll_delta": None, "text_tokens": 0, "other_tasks": []}
    t = nll.get("sets", {}).get(name) if nll else None
    if t is not None:
        coll.update(text_nll_delta=t["text_nll_delta"], text_nll_ci_low=t["ci_low"], text_nll_ci_high=t["ci_high"],
                    text_tokens=nll["text_tokens"], text_source=nll["source"], baseline_nll=nll["baseline_nll"],
                    text_widened=bool(nll.get("widened_for")))
    if sh is not None and sh.others is not None and not brief:
        coll["other_tasks"] = sh.others[sh.others["set"] == name].drop(columns="set").to_dict("records")
    return coll


def battery(lm, task_name: str, sets: dict[str, Sequence[Head]], settings: RobustSettings | None = None,
            **overrides) -> list[Battery]:
    """Every measurement for each named head set on ``task_name`` (a built-in task with formats), on the items of
    :func:`battery_items`, read into checks and a label (:mod:`cel_utils.labels`). All sets share one pass of each
    measurement. A set in ``brief_sets`` whose label the formats decide (:func:`decided_by_formats`) stops there.
    The text NLL runs for the sets in ``nll_sets`` and wherever the cost decides the label (:func:`needs_cost`);
    the best constant is fit for those in ``constant_sets``. One :class:`Battery` per set."""
    s = replace(settings or RobustSettings(), **overrides)
    task = battery_items(task_name, s)
    fmt, margins = format_changes(lm, task, sets, s.n_boot, s.seed)
    signs = _signs(task)
    first = {n: checks(Outcomes(margins[n], signs=signs)) for n in sets}
    brief = [n for n in sets if n in s.brief_sets and decided_by_formats(first[n])]
    rest = {n: list(h) for n, h in sets.items() if n not in brief}
    sh = _shared(lm, task_name, task, rest, s) if rest else None
    abl = {n: {} for n in brief}
    outs = {n: Outcomes(margins[n], signs=signs) for n in brief}
    for n, h in rest.items():
        abl[n], outs[n] = _outcomes(lm, n, h, margins[n], sh, s)
    want = [n for n in rest if s.nll_sets is None or n in s.nll_sets or needs_cost(checks(outs[n]))]
    nll = text_window(lm, {n: sets[n] for n in want}, s) if s.text_tokens > 0 and want else {}
    for n in want:
        if nll:
            outs[n].nll = nll["sets"][n]["per_chunk"]
    out = []
    for name in sets:
        c = checks(outs[name])
        ctl_row = {} if sh is None or sh.control is None or name in brief else \
            sh.control[sh.control["set"] == name].drop(columns="set").to_dict("records")[0]
        gen = {k: v for k, v in sh.gen.items() if k != "right"} if sh is not None and sh.gen else {}
        out.append(Battery(model=lm.name, task=task_name, heads=name, n=len(task.items),
                           items=[list(x) for x in s.items], formats=fmt, ablations=abl[name], generation=gen,
                           collateral=_collateral(name, nll, sh, name in brief), control_task=ctl_row, checks=c,
                           label=label(c), label_distribution=label_distribution(outs[name], s.label_boot, s.seed),
                           operating=pair_operating(outs, s, name), outcomes=outs[name]))
    return out


def text_window(lm, sets: dict[str, Sequence[Head]], s: RobustSettings) -> dict:
    """The sets' change in NLL on general text (:func:`cel_utils.robust.text_nll`) on ``s.text_tokens`` tokens, and
    again on ``s.text_max_tokens`` for every set when any set's 95% CI is wider than ``s.nll_width`` (a cost check
    with the power to say "below the threshold"): the stop depends on the intervals' widths only, never on their
    estimates, and all sets of the pair share the window they end on."""
    nll = text_nll(lm, sets, s.text_tokens, n_boot=s.n_boot, seed=s.seed)
    wide = [n for n, v in nll["sets"].items() if v["ci_high"] - v["ci_low"] >= s.nll_width]
    if wide and s.text_max_tokens > s.text_tokens:
        nll = text_nll(lm, sets, s.text_max_tokens, n_boot=s.n_boot, seed=s.seed)
        nll["widened_for"] = wide
    return nll


def pair_operating(outs: dict[str, Outcomes], s: RobustSettings, name: str) -> pd.DataFrame | None:
    """The label rule's operating characteristics on this pair's items (:func:`cel_utils.operating.
    operating_characteristics`), with the per-item spread of the set being labelled, ``name``: its change in margin
    in the task's own format (an earlier version took the first set of ``outs``, which is a stopped-early set when
    there is one, so another set's noise went into every label's operating characteristics), and its text cost's
    per-chunk spread; with ``s.null_set`` among ``outs``, the semi-synthetic row planted into that head's outcomes."""
    if s.oc_sims <= 0 or name not in outs:
        return None
    o = outs[name]
    b0, a0 = o.margins["default"]
    tau = float(np.std(a0 - b0, ddof=1)) or 1.0
    base = Outcomes({f: (b, b) for f, (b, _) in o.margins.items()},
                    generation=None if o.generation is None else (o.generation[0], o.generation[0]), signs=o.signs,
                    nll=o.nll)
    real = outs.get(s.null_set) if s.null_set else None
    if real is not None and real.generation is None and o.generation is not None:
        real = replace(real, generation=(o.generation[0], o.generation[0]))   # a stopped-early null: no generation run
    return operating_characteristics(base, tau=tau, n_sim=s.oc_sims, seed=s.seed, real=real)


def pick_sets(rec, battery_pairs: int = 1, other_confirmed: int = 2, random_heads: int = 2, n_search: int = 32,
              seed: int = 0) -> tuple[pd.DataFrame, list[str], bool]:
    """Chapter 1c's head sets, from chapter 1a's verdicts and chapter 2's chosen sets (``rec``: a
    :class:`~cel_utils.records.Records`): per model its first ``battery_pairs`` localized pairs with formats
    (chapter 2's pair first, so its chosen sets join, then the cheapest screens,
    :func:`cel_utils.engine.screen_work`), each with its chosen head, that head's equals, chapter 2's chosen set
    (or all confirmed heads), the learned gates' set, up to ``other_confirmed`` other confirmed heads (largest
    confirm gain first), a null control (:meth:`cel_utils.records.Pair.null_control`) and ``random_heads`` random
    unconfirmed heads (seeded by the pair); a model with nothing localized gets its first pair's strongest search
    head, marked ``exploratory``, with its null control. Returns (one row per set: ``model``, ``task``, ``role``,
    ``heads``; the localized pairs left out, named; whether nothing at all was localized)."""
    picks, left = [], []
    ran_in_2 = {(m, t) for m, ts in (rec["02_joint_search"].get("tasks") or {}).items() for t in ts} \
        if "02_joint_search" in rec else set()
    rows = sorted(rec.verdicts().to_dict("records"), key=lambda r: ((r["model"], r["task"]) not in ran_in_2, screen_work(
        load_model(r["model"]), load_task(r["task"], "search", n=n_search, seed=seed, clip=True))))
    for row in rows:
        pair = rec.pair(row["model"], row["task"])
        if not row["holds"] or row["task"] not in FORMATS:
            continue
        if len({p[1] for p in picks if p[0] == row["model"]}) >= battery_pairs:
            left.append(f"{row['model']} / {row['task']} ({row['chosen']})")
            continue
        m, t, chosen = row["model"], row["task"], row["chosen"]
        picks.append((m, t, "chosen head", chosen))
        equals = [h for h in (row.get("equals") or "").split(", ") if h and h != chosen]
        picks += [(m, t, "equal of the chosen head", h) for h in equals]
        joint_set = rec.joint_chosen(m, t)
        chosen_set = joint_set or (format_set(parse_set(",".join(pair.confirmed))) if len(pair.confirmed) > 1 else None)
        if chosen_set and chosen_set != chosen:
            picks.append((m, t, "chosen set (chapter 2)" if joint_set else "all confirmed heads", chosen_set))
        gates = rec.gates_chosen(m, t)
        if gates and gates not in (chosen, chosen_set):
            picks.append((m, t, "learned gates' set (chapter 2)", gates))
        rest = sorted((h for h in pair.confirmed if h != chosen and h not in equals), key=lambda h: -pair.confirm_gain(h))
        picks += [(m, t, "confirmed head", h) for h in rest[:other_confirmed] if h != chosen_set]
        if (control := pair.null_control(chosen)):
            picks.append((m, t, "null control", control))
        rng = np.random.default_rng([seed, len(t), len(m)])
        pool = [h for h in pair.screened_heads if h not in pair.confirmed]
        randoms = [pool[i] for i in rng.choice(len(pool), size=min(random_heads, len(pool)), replace=False)]
        picks += [(m, t, "random head", h) for h in randoms if h not in {p[3] for p in picks if p[:2] == (m, t)}]
    localized = {p[0] for p in picks if p[2] == "chosen head"}
    for m in dict.fromkeys(p.model for p in rec.pairs()):
        pair = next((p for p in rec.pairs(m) if p.task in FORMATS), None) if m not in localized else None
        if pair is not None:   # nothing localized: the strongest search head of its first pair with formats
            top = pair.search_order()[0]
            picks.append((m, pair.task, "exploratory", top))
            if (control := pair.null_control(top)):
                picks.append((m, pair.task, "null control", control))
    return pd.DataFrame(picks, columns=["model", "task", "role", "heads"]), left, not localized


def readings(b: Battery) -> dict:
    """Each check's reading (``holds``, ``fails``, ``cannot tell``) of a battery: the row chapter 1c tabulates."""
    return {k: v.get("reading") for k, v in b.checks.items()}

