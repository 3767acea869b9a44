"""The battery: every check of :mod:`cel_utils.robust` run on head sets, and the label it gives (chapter 1c,
``cel robust``).

:func:`battery` runs the checks for several sets of one task in shared passes (the unablated runs once) and gives
one :class:`Battery` per set; :func:`label` reads the sets' check results through :data:`LABEL_RULES`, the one
ordered list of what each word needs.

Example:
    >>> label({"transfers": True, "zero_helps": True, "resample_helps": False})
    'offset'
    >>> [name for name, _ in LABEL_RULES][:2]
    ['format-specific', 'label shift']
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import pandas as pd

from .ablation import Head, compute_head_means
from .defaults import COLLATERAL_NLL, N_BOOT, TEXT_TOKENS
from .engine import evaluate
from .errors import CELError
from .io import json_safe
from .robust import ablation_types, format_changes, generation, label_shift, other_tasks, text_nll, transfer
from .scoring import encode_task
from .tasks import load_task

# the control task of each task: the same answer format, another computation (specificity)
CONTROL_TASKS = {"addition": "subtraction", "subtraction": "addition", "agreement_rc": "agreement",
                 "agreement": "agreement_rc", "comparison": "addition", "ioi": "agreement"}

# what each label needs, tested in this order (a check is None when it did not run); "capability" otherwise
LABEL_RULES = [
    ("format-specific", lambda c: c.get("transfers") is False),      # the gain does not transfer across formats
    ("label shift", lambda c: bool(c.get("label_shift"))),           # a constant label offset reproduces it
    ("offset", lambda c: bool(c.get("zero_helps")) and c.get("resample_helps") is False),  # a constant, not a read
    ("teacher-forcing only", lambda c: c.get("generation_helps") is False),  # no gain in free generation
    ("costly", lambda c: bool(c.get("costly"))),                     # text NLL or another task pays for it
]
LABELS = ("capability", *(name for name, _ in LABEL_RULES))


def label(checks: dict) -> str:
    """One word for what the checks show: the first of :data:`LABEL_RULES` whose rule holds, else
    ``capability``. ``format-specific`` (the gain does not transfer across the prompt formats: the first thing a
    capability must do), ``label shift`` (a constant label offset reproduces the gain, or one class's margins fall
    while the other's rise), ``offset`` (zero or mean ablation helps, resample does not: removal changes a
    constant, not what the head reads), ``teacher-forcing only`` (no gain in free generation), ``costly`` (the NLL
    on general text rises by more than ``COLLATERAL_NLL`` or another task loses significantly).

    Example:
        >>> label({"transfers": True, "zero_helps": True, "resample_helps": True, "generation_helps": True})
        'capability'
    """
    return next((name for name, rule in LABEL_RULES if rule(checks)), "capability")


@dataclass(frozen=True)
class RobustSettings:
    """The parameters of :func:`battery` (defaults from :mod:`cel_utils.defaults`)."""

    n: int = 200                 # held-out items per check
    split: str = "heldout"
    start: int = 0               # the first item of the split used (chapter 1c: items no earlier choice used)
    n_search: int = 32           # search items: head means and the best constant
    seed: int = 0
    n_boot: int = N_BOOT
    constant_steps: int = 5      # 0: the best-constant ablation is not fit
    text_tokens: int = TEXT_TOKENS  # 0: no general-text NLL
    other_tasks: tuple = ()      # tasks on which the cost is measured
    n_other: int = 100
    generate: bool = True        # free generation (exact-match tasks)
    nll_sets: tuple | None = None       # the sets whose text NLL is measured (None: all); a set not named here is
    #                                     measured anyway when the cost decides its label (every other check passed)
    constant_sets: tuple | None = None  # the sets for which the best constant is fit (None: all)
    brief_sets: tuple = ()              # sets whose battery stops at the formats when their gain does not
    #                                     transfer (the first check decides the label: format-specific)


@dataclass
class Battery:
    """The checks of one head set on one task (:func:`battery`)."""

    model: str
    task: str
    heads: str                   # the set's name (:func:`cel_utils.ablation.format_set`)
    n: int
    formats: pd.DataFrame
    sign_test: dict
    ablations: dict
    generation: dict
    label_shift: dict
    collateral: dict
    control_task: dict
    checks: dict = field(default_factory=dict)
    label: str = ""

    def record(self) -> dict:
        """The JSON of ``cel robust`` (one set): ``formats`` (the default first), ``sign_test``, ``ablations``,
        ``generation`` (exact-match tasks), ``fixes_by_kind`` (addition), ``label_shift``, ``collateral``,
        ``control_task``, ``checks`` and ``label``."""
        f = self.formats[self.formats["set"] == self.heads]
        gen = self.generation.get("sets", {}).get(self.heads) if self.generation else None
        return json_safe({
            "model": self.model, "task": self.task, "heads": self.heads, "n": self.n,
            "formats": [{"name": r["format"], "n": r["n"], "baseline": r["baseline"], "delta": r["delta"],
                         "ci_low": r["ci_low"], "ci_high": r["ci_high"]} for r in f.to_dict("records")],
            "sign_test": self.sign_test, "ablations": self.ablations,
            "generation": None if gen is None else {
                "baseline_accuracy": self.generation["baseline_accuracy"], **{k: v for k, v in gen.items()
                                                                              if k != "fixes_by_kind"}},
            "fixes_by_kind": None if gen is None else gen.get("fixes_by_kind"),
            "label_shift": self.label_shift, "collateral": self.collateral, "control_task": self.control_task,
            "checks": self.checks, "label": self.label})


@dataclass
class Shared:
    """What the sets of one battery share: the items, the search and confirm splits, the passes made once."""

    task: object
    search: object
    confirm: object
    gen: dict
    others: pd.DataFrame | None
    control: pd.DataFrame | None
    base_h: object
    base_c: object
    means: object


def _shared(lm, task_name: str, task, rest: dict, s: RobustSettings) -> Shared:
    search = load_task(task_name, "search", n=s.n_search, seed=s.seed, clip=True)
    confirm = load_task(task_name, "confirm", seed=s.seed)
    gen = generation(lm, task, rest, s.n_boot, s.seed) if s.generate and rest else {}
    others = other_tasks(lm, rest, list(s.other_tasks), s.n_other, s.seed, s.n_boot) \
        if s.other_tasks and rest else None
    ctl_name = CONTROL_TASKS.get(task_name)
    ctl = other_tasks(lm, rest, [ctl_name], s.n_other, s.seed, s.n_boot) if ctl_name and rest else None
    enc_h, enc_c = encode_task(lm, task), encode_task(lm, confirm)
    means = compute_head_means(lm, encode_task(lm, search).inputs) if rest else None  # [layers, heads, d_head]
    return Shared(task, search, confirm, gen, others, ctl, evaluate(lm, enc_h), evaluate(lm, enc_c), means)


def _set_checks(lm, name: str, heads: list[Head], sign: dict, sh: Shared, s: RobustSettings) -> tuple:
    """One set's ablation types, label shift and check results (all but the text NLL's)."""
    steps = s.constant_steps if s.constant_sets is None or name in s.constant_sets else 0
    abl = ablation_types(lm, sh.task, sh.search, heads, s.n_boot, s.seed, steps, means=sh.means)
    shift = label_shift(sh.task, sh.confirm, sh.base_h, evaluate(lm, encode_task(lm, sh.task), heads), sh.base_c,
                        s.n_boot, s.seed)
    g = sh.gen.get("sets", {}).get(name) if sh.gen else None
    hurts = None if sh.others is None else bool(sh.others[sh.others["set"] == name]["hurts"].any())
    checks = {"transfers": sign["transfers"],
              "zero_helps": bool(abl["zero"]["ci_low"] > 0 or abl["mean"]["ci_low"] > 0),
              "mean_helps": abl["mean"]["ci_low"] > 0, "resample_helps": abl["resample"]["ci_low"] > 0,
              "generation_helps": None if g is None else g["ci_low"] > 0,
              "label_shift": None if not shift else bool(shift["offset_reproduces"] or shift["opposite_signs"]),
              "costly": hurts}
    return sign, abl, shift, checks


def _collateral(name: str, checks: dict, nll: dict, sh: Shared, brief: bool) -> dict:
    """The set's cost on general text and on the other tasks; the text NLL's verdict joins ``checks``."""
    coll = {"text_nll_delta": None, "text_tokens": 0, "other_tasks": []}
    t = nll.get("sets", {}).get(name) if nll else None
    if t is not None:
        coll.update(text_nll_delta=t["text_nll_delta"], text_nll_ci_low=t["ci_low"], text_nll_ci_high=t["ci_high"],
                    text_tokens=nll["text_tokens"], text_source=nll["source"], baseline_nll=nll["baseline_nll"])
        checks["costly"] = bool(checks["costly"] or t["text_nll_delta"] > COLLATERAL_NLL)
    if sh is not None and sh.others is not None and not brief:
        coll["other_tasks"] = sh.others[sh.others["set"] == name].drop(columns="set").to_dict("records")
    return coll


def battery(lm, task_name: str, sets: dict[str, Sequence[Head]], settings: RobustSettings | None = None,
            **overrides) -> list[Battery]:
    """Every check of :mod:`cel_utils.robust` for each named head set on ``task_name`` (a built-in task with
    formats), on ``n`` items of the ``split`` from item ``start`` on; the head means and the best constant come
    from the search split. All sets share one pass of each check, so the unablated runs (every format, free
    generation, the other tasks) are made once. The text NLL runs for the sets in ``nll_sets`` and for every set
    whose label the cost decides; the best constant is fit for those in ``constant_sets``; a set in ``brief_sets``
    whose gain does not transfer across the formats stops there (its label is decided: ``format-specific``; its
    other checks are empty). One :class:`Battery` per set, each with its :func:`label`."""
    s = replace(settings or RobustSettings(), **overrides)
    full = load_task(task_name, s.split, seed=s.seed)
    if s.start + s.n > len(full):
        raise CELError(f"{task_name}: items {s.start}..{s.start + s.n} asked, the {s.split} split has {len(full)}")
    task = replace(full, items=full.items[s.start:s.start + s.n])
    fmt, per_item = format_changes(lm, task, sets, s.n_boot, s.seed)
    signs = {name: transfer(fmt[fmt["set"] == name]["delta"].to_numpy(), per_item[name], n_boot=s.n_boot,
                            seed=s.seed) for name in sets}
    brief = [n for n in sets if n in s.brief_sets and not signs[n]["transfers"]]  # labelled by the formats
    rest = {n: list(h) for n, h in sets.items() if n not in brief}
    sh = _shared(lm, task_name, task, rest, s) if rest else None
    parts = {n: (signs[n], {}, {}, {"transfers": False}) for n in brief}
    parts.update({n: _set_checks(lm, n, h, signs[n], sh, s) for n, h in rest.items()})
    # the text NLL (the costliest check per set): where asked, and wherever the cost decides the label
    decides = [n for n, p in parts.items() if label({**p[3], "costly": None}) == "capability"]
    want = [n for n in sets if s.nll_sets is None or n in s.nll_sets or n in decides]
    nll = text_nll(lm, {n: sets[n] for n in want}, s.text_tokens, n_boot=s.n_boot, seed=s.seed) \
        if s.text_tokens > 0 and want else {}
    out = []
    for name in sets:
        sign, abl, shift, checks = parts[name]
        coll = _collateral(name, checks, nll, sh, name in brief)
        ctl_row = {} if sh is None or sh.control is None or name in brief else \
            sh.control[sh.control["set"] == name].drop(columns="set").to_dict("records")[0]
        b = Battery(model=lm.name, task=task_name, heads=name, n=len(task), formats=fmt, sign_test=sign,
                    ablations=abl, generation=sh.gen if sh is not None else {}, label_shift=shift, collateral=coll,
                    control_task=ctl_row, checks=checks)
        b.label = label(checks)
        out.append(b)
    return out
