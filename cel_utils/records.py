"""The one reader of the chapters' records: what a chapter needs from the others, typed, in one place.

Each executed chapter writes ``<chapter>.record.json`` (:func:`cel_utils.book.record`); chapters 1c, 2a, 3, 4 and
5 read earlier ones through :class:`Records` instead of picking through the JSON by hand: a pair's verdict
(:class:`Pair`: its screen, its re-tested heads and held-out tests), the chosen sets of chapter 2, the labels of
chapter 1c, the selectors' summary, the costs on other tasks, and each chapter's parameters.

Example:
    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> pair = {"model": "m", "task": "t", "screened_heads": ["L0H0", "L0H1"], "delta_margin": [0.5, 0.1],
    ...         "delta_accuracy": [0.1, 0.0], "confirmed": ["L0H0"], "chosen": "L0H0",
    ...         "sets": [{"heads": "L0H0", "offered": True, "confirmed": True, "confirm_delta_accuracy": 0.2,
    ...                   "heldout_p_holm": 0.01, "holds": True}]}
    >>> _ = (d / "01a_landscape.record.json").write_text(json.dumps({"pairs": [pair], "verdict": [], "n_heldout": 9}))
    >>> r = Records(d)
    >>> r.pair("m", "t").confirm_gain("L0H0"), r.n_heldout(), "02_joint_search" in r
    (0.2, 9, False)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

LANDSCAPE, CAPABILITY, JOINT, MECHANISM, THEORY = ("01a_landscape", "01c_capability", "02_joint_search",
                                                   "02a_mechanism", "03_theory")


@dataclass
class Pair:
    """One (model, task) verdict of chapter 1a (:meth:`cel_utils.verdict.Verdict.record`)."""

    record: dict

    model = property(lambda self: self.record["model"])
    task = property(lambda self: self.record["task"])
    screened_heads = property(lambda self: list(self.record["screened_heads"]))
    delta_margin = property(lambda self: np.asarray(self.record["delta_margin"], float))
    delta_accuracy = property(lambda self: np.asarray(self.record["delta_accuracy"], float))
    confirmed = property(lambda self: list(self.record.get("confirmed", [])))
    chosen = property(lambda self: self.record.get("chosen"))

    def sets(self) -> pd.DataFrame:
        """Every set of the pair's pipeline run: the re-tested heads and, when tested, all confirmed together."""
        return pd.DataFrame(self.record.get("sets", []))

    def confirm_rows(self) -> pd.DataFrame:
        """The re-tested heads (best-ranked first) with their search and confirm figures."""
        s = self.sets()
        return s[s["offered"].astype(bool)].reset_index(drop=True) if len(s) else s

    def heldout_rows(self) -> pd.DataFrame:
        """The sets tested on held-out items (``heldout_*``, ``holds``)."""
        s = self.sets()
        return s[s["heldout_p_holm"].notna()].reset_index(drop=True) if len(s) else s

    def confirm_gain(self, head: str) -> float:
        """A re-tested head's change in accuracy on the confirm split (0 for a head not re-tested)."""
        c = self.confirm_rows()
        row = c[c["heads"] == head] if len(c) else c
        return float(row["confirm_delta_accuracy"].iloc[0]) if len(row) else 0.0

    def null_control(self, head: str) -> str | None:
        """The null control of ``head``: the head of its layer, other than itself and not confirmed, whose removal
        changed the search margin least (chapters 1c and 2a); None when the layer has no other such head.

            >>> Pair({"screened_heads": ["L0H0", "L0H1", "L0H2", "L1H0"], "delta_margin": [0.5, 0.2, -0.3, 0.0],
            ...       "confirmed": ["L0H0"]}).null_control("L0H0")
            'L0H1'
        """
        layer = head[:head.index("H")]            # "L3H1" -> "L3"
        same = [(abs(d), h) for h, d in zip(self.screened_heads, self.delta_margin)
                if h[:h.index("H")] == layer and h != head and h not in self.confirmed]
        return min(same)[1] if same else None

    def search_order(self) -> list[str]:
        """The screened heads, best first by the change in search margin."""
        return [h for _, h in sorted(zip(self.delta_margin, self.screened_heads), key=lambda x: -x[0])]


class Records:
    """The chapters' records in ``folder`` (those that exist), read once."""

    def __init__(self, folder: str | Path = "."):
        self.folder = Path(folder)
        self.raw = {f.name[:-len(".record.json")]: json.loads(f.read_text())
                    for f in sorted(self.folder.glob("*.record.json"))}

    def __contains__(self, chapter: str) -> bool:
        return chapter in self.raw

    def __getitem__(self, chapter: str) -> dict:
        return self.raw[chapter]

    def require(self, chapter: str, why: str) -> dict:
        """A chapter's record, or a clear error naming the chapter to run first."""
        if chapter not in self.raw:
            raise FileNotFoundError(f"{self.folder / (chapter + '.record.json')} not found: run {chapter} first "
                                    f"({why})")
        return self.raw[chapter]

    def param(self, chapter: str, name: str, default=None):
        """A parameter the chapter ran with (:func:`cel_utils.book.record` keeps them)."""
        return self.raw.get(chapter, {}).get("parameters", {}).get(name, default)

    # --- chapter 1a ----------------------------------------------------------------------------------------------
    def pairs(self, model: str | None = None) -> list[Pair]:
        return [Pair(p) for p in self.raw.get(LANDSCAPE, {}).get("pairs", []) if model in (None, p["model"])]

    def pair(self, model: str, task: str) -> Pair | None:
        return next((p for p in self.pairs(model) if p.task == task), None)

    def tasks_for(self, models: list[str], tasks: dict | str, cost=None, every: bool = False) -> dict[str, list[str]]:
        """The tasks a later chapter runs per model: ``tasks`` itself when it is a dictionary ``{model: [tasks]}``
        (a single task name is made a list); for ``"calibrated"``, of the tasks chapter 1a calibrated for the model
        (each with room for a gain), the first, every one (``every``), or with ``cost(model, task)`` the localized
        one of least cost (the first calibrated task when none was localized). A wrong value, or a model 1a
        calibrated nothing for, is one clear error.

            >>> Records("/nonexistent").tasks_for(["m"], {"m": "addition"})
            {'m': ['addition']}
        """
        if isinstance(tasks, dict):
            return {m: [t] if isinstance(t, str) else list(t) for m, t in tasks.items()}
        if tasks != "calibrated":
            raise ValueError(f'tasks must be "calibrated" or a dictionary {{model: [tasks]}}, not {tasks!r}')
        calibrated = self.require(LANDSCAPE, "its calibrated tasks")["tasks"]
        missing = [m for m in models if not calibrated.get(m)]
        if missing:
            raise ValueError(f"chapter 1a calibrated no task with room for {', '.join(missing)}: name its tasks in "
                             "`tasks`")
        if cost is None:
            return {m: list(calibrated[m]) if every else calibrated[m][:1] for m in models}
        held = {(r["model"], r["task"]) for r in self.verdicts().to_dict("records") if r["holds"]}
        options = {m: [t for t in calibrated[m] if (m, t) in held] or calibrated[m][:1] for m in models}
        return {m: [min(options[m], key=lambda t: cost(m, t))] for m in models}

    def verdicts(self) -> pd.DataFrame:
        """Chapter 1a's verdict table (one row per pair)."""
        return pd.DataFrame(self.raw.get(LANDSCAPE, {}).get("verdict", []))

    def n_heldout(self) -> int:
        """How many held-out items chapter 1a graded (later chapters use the items after them)."""
        return int(self.param(LANDSCAPE, "n_heldout", self.raw.get(LANDSCAPE, {}).get("n_heldout", 0)))

    def landscape(self) -> pd.DataFrame:
        """Every screened head of every pair: ``model``, ``task``, ``head``, ``delta_margin``, ``delta_accuracy``."""
        return pd.DataFrame([{"model": p.model, "task": p.task, "head": h, "delta_margin": m, "delta_accuracy": a}
                             for p in self.pairs() for h, m, a in zip(p.screened_heads, p.delta_margin,
                                                                       p.delta_accuracy)])

    def confirmed(self) -> dict[tuple[str, str], list[str]]:
        return {(p.model, p.task): p.confirmed for p in self.pairs()}

    # --- chapter 1c ----------------------------------------------------------------------------------------------
    def labels(self) -> pd.DataFrame:
        return pd.DataFrame(self.raw.get(CAPABILITY, {}).get("labels", []))

    def label_of(self, model: str, task: str, heads: str) -> str | None:
        lab = self.labels()
        if not len(lab):
            return None
        row = lab[(lab.model == model) & (lab.task == task) & (lab.heads == heads)]
        return str(row["label"].iloc[0]) if len(row) else None

    # --- chapter 2 -----------------------------------------------------------------------------------------------
    def joint_verdicts(self) -> pd.DataFrame:
        return pd.DataFrame(self.raw.get(JOINT, {}).get("verdict", []))

    def joint_chosen(self, model: str, task: str) -> str | None:
        """The set chapter 2's joint search chose for a pair (None: nothing chosen, or not searched)."""
        return next((q.get("chosen") for q in self.raw.get(JOINT, {}).get("pairs", [])
                     if q["model"] == model and q["task"] == task), None)

    def selectors(self, part: str = "summary") -> pd.DataFrame:
        """Chapter 2's selector comparison: its ``summary`` (one row per selector) or its ``table`` (per k)."""
        return pd.DataFrame(self.raw.get(JOINT, {}).get("selectors", {}).get(part, []))

    def gates_runs(self) -> list[dict]:
        """Per pair of chapter 2, the learned gates' pipeline (its record: ``sets``, ``chosen``, ``control``)."""
        return [dict(p["gates"], model=p["model"], task=p["task"])
                for p in self.raw.get(JOINT, {}).get("selectors", {}).get("pairs", []) if p.get("gates")]

    def gates_chosen(self, model: str, task: str) -> str | None:
        return next((g.get("chosen") for g in self.gates_runs() if g["model"] == model and g["task"] == task), None)

    # --- across chapters -----------------------------------------------------------------------------------------
    def costs(self) -> pd.DataFrame:
        """Every chosen set's change on a task other than its own (chapters 1a and 2), with the chapter."""
        rows = [dict(c, chapter=LANDSCAPE) for c in self.raw.get(LANDSCAPE, {}).get("cost", [])]
        rows += [dict(c, chapter=JOINT) for c in self.raw.get(JOINT, {}).get("cross_task", [])]
        return pd.DataFrame([r for r in rows if r["task"] != r["own_task"]])

    def explained_heads(self) -> pd.DataFrame:
        return pd.DataFrame(self.raw.get(MECHANISM, {}).get("heads", []))
