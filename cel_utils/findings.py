"""The book's answer to its own question, written from the chapters' records (:mod:`cel_utils.records`): per model,
whether removing one head makes it better at a task on items that chose nothing, what the battery calls each such
head (with how often its rule is right on planted truths), and what the pipeline could not have seen.

Example:
    >>> import tempfile
    >>> bottom_line(Records(tempfile.mkdtemp()))
    ['Chapter 1a has not run: there is no verdict to summarise.']
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .defaults import ALPHA, LABEL_FIRM, OC_TARGET_CAPABILITY, POWER_GAIN, ROOM_BAND
from .records import Records


def _oc_phrase(b: dict) -> str:
    oc = pd.DataFrame(b.get("operating_characteristics") or [])
    if oc.empty:
        return ""
    oc = oc.set_index("truth")
    return (f"; on planted truths at those items the rule calls a true capability of gain {POWER_GAIN:.2f} one "
            f"{oc.loc['capability', 'capability']:.0%} of the time and a null one "
            f"{oc.loc['null', 'capability']:.0%}")


def _num(x) -> bool:
    return x is not None and np.isfinite(x)


def label_phrase(r) -> str:
    """What chapter 1c's battery says about one head set (a row of :meth:`Records.labels`): its label, how often
    item resamples give the same one, and each check's estimate.

    Example:
        >>> r = pd.Series({"label": "offset", "label_share": 0.71, "gain": 0.12, "transfer_est": 0.05,
        ...                "survives_est": -0.01, "generation_est": None})
        >>> label_phrase(r)
        'labelled **offset** (weak: the same label on 71% of item resamples): +0.120 in its own format, +0.050 over the other formats with room, -0.010 under mean or resample ablation'
    """
    bits = [f"{r['gain']:+.3f} in its own format"]
    for k, what in (("transfer_est", "over the other formats with room"),
                    ("survives_est", "under mean or resample ablation"), ("generation_est", "in free generation")):
        if _num(r.get(k)):
            bits.append(f"{r[k]:+.3f} {what}")
    share = (f" ({strength(r['label_share'])}: the same label on {r['label_share']:.0%} of item resamples)"
             if _num(r.get("label_share")) else "")
    return f"labelled **{r['label']}**{share}: " + ", ".join(bits)


def strength(share: float) -> str:
    """A label's strength from its stability (the share of item resamples that read it again): ``firm`` at
    :data:`cel_utils.defaults.LABEL_FIRM` or more, else ``weak`` (a label read on about half of the resamples is
    nearly a coin flip between it and another).

        >>> strength(0.95), strength(0.545), strength(float("nan"))
        ('firm', 'weak', 'weak')
    """
    return "firm" if _num(share) and share >= LABEL_FIRM else "weak"


def chosen_battery(rec: Records, model: str, task: str, head: str) -> dict | None:
    """Chapter 1c's battery of a pair's chosen head (None: 1c did not test it)."""
    return next((b for b in rec.raw.get("01c_capability", {}).get("batteries", [])
                 if (b["model"], b["task"], b["heads"], b["role"]) == (model, task, head, "chosen head")), None)


def oc_misses(b: dict) -> float | None:
    """P(capability | a true capability of gain POWER_GAIN) of a battery's operating characteristics when it falls
    short of the rule's target (None when it meets it or was not simulated)."""
    oc = pd.DataFrame(b.get("operating_characteristics") or [])
    if oc.empty:
        return None
    # the Gaussian and the semi-synthetic row (truths "capability", "capability (semi-synthetic)"): the lower
    p = float(oc[oc["truth"].str.startswith("capability")]["capability"].min())
    return p if p < OC_TARGET_CAPABILITY else None


def _chosen_label(rec: Records, model: str, task: str, head: str) -> str:
    b = chosen_battery(rec, model, task, head)
    if b is None:
        return "; chapter 1c did not test it"
    share = b.get("label_distribution", {}).get(b["label"], np.nan)
    return (f"; chapter 1c labels it **{b['label']}** ({strength(share)}: the same label on {share:.0%} of item "
            f"resamples) on {b['n']} fresh items{_oc_phrase(b)}")


def model_line(rec: Records, model: str, v: pd.DataFrame) -> str:
    """One model's answer: its localized pairs with the chosen head's held-out gain and label, and its pairs where
    nothing was found, with the pipeline's power there."""
    held, missed = v[v.holds], v[~v.holds]
    parts = [f"**{model}**: removing one head raises held-out accuracy in {len(held)} of its {len(v)} tasks"]
    for r in held.itertuples():
        parts.append(f"{r.task}: {r.chosen} changes it by {r.heldout_delta:+.3f} [{r.heldout_ci_low:+.3f}, "
                     f"{r.heldout_ci_high:+.3f}] on held-out items 1-{r.n_heldout}"
                     + (f" (first of {int(r.n_equals)} confirmed heads it cannot be told apart from)"
                        if getattr(r, "n_equals", 0) and r.n_equals > 1 else "")
                     + _chosen_label(rec, model, r.task, r.chosen))
    for r in missed.itertuples():
        room = 1 - r.baseline
        parts.append(f"{r.task}: nothing localized, " + (
            f"where a head of gain {POWER_GAIN:.2f} would have been found with probability {r.pipeline_power:.2f}"
            if np.isfinite(r.pipeline_power) else f"and no room to test: the baseline leaves {room:.2f} to gain"))
    return parts[0] + ". " + "; ".join(parts[1:]) + "."


def families_on_room(v: pd.DataFrame, band: tuple[float, float] = ROOM_BAND) -> str:
    """The two families compared on the pairs where a gain could show (confirm baseline in ``band``): how many
    localize, and the pipeline's power there, per model.

    Example:
        >>> v = pd.DataFrame({"model": ["a", "a", "b"], "task": ["x", "y", "z"], "baseline": [0.5, 0.97, 0.4],
        ...                   "holds": [True, False, False], "pipeline_power": [0.9, 0.0, 0.7]})
        >>> families_on_room(v)
        '**On pairs with room** (confirm baseline in [0.2, 0.8]): a localizes a head in 1 of 1 (pipeline power at 0.10: 0.90); b in 0 of 1 (0.70). Without room: a / y.'
    """
    room = v[v.baseline.between(*band)]
    parts = []
    for i, (m, g) in enumerate(v.groupby("model", sort=False)):
        r = room[room.model == m]
        pw = ", ".join(f"{p:.2f}" for p in r.pipeline_power if np.isfinite(p)) or "none"
        parts.append(f"{m} localizes a head in {int(r.holds.sum())} of {len(r)} (pipeline power at {POWER_GAIN:.2f}: "
                     f"{pw})" if i == 0 else f"{m} in {int(r.holds.sum())} of {len(r)} ({pw})")
    none = v[~v.baseline.between(*band)]
    return (f"**On pairs with room** (confirm baseline in [{band[0]:g}, {band[1]:g}]): " + "; ".join(parts) + "."
            + (" Without room: " + ", ".join(f"{r.model} / {r.task}" for r in none.itertuples()) + "."
               if len(none) else ""))


def bottom_line(rec: Records) -> list[str]:
    """The book's answer per model (markdown lines), every number from the records, each saying which items it
    is on."""
    v = rec.verdicts()
    if v.empty:
        return ["Chapter 1a has not run: there is no verdict to summarise."]
    lines = [model_line(rec, m, g) for m, g in v.groupby("model", sort=False)] + [families_on_room(v)]
    lines.append(so_line(rec, v))
    return lines


SHIFT_WORDS = {"a class loses items": "yes: a class loses items", "no class loses items": "no: no class loses items",
               "harmful": "no (a loss)", "none": "no change", "unclear": "cannot tell"}


def bottom_table(rec: Records) -> pd.DataFrame:
    """The bottom line as a table, one row per pair whose chosen head helps on held-out items (chapter 1a): the
    head, its held-out gain with CI and the items it is on, whether answers moved toward one label (chapter 1a's
    per-class test on the same items: ``a class loses items`` is a shift), and chapter 1c's transfer reading and
    label with its stability (firm or weak), or "not tested".

        >>> import tempfile
        >>> bottom_table(Records(tempfile.mkdtemp())).empty
        True
    """
    v = rec.verdicts()
    if v.empty:
        return pd.DataFrame()
    classes = pd.DataFrame(rec.raw.get("01a_landscape", {}).get("classes", []))
    rows = []
    for r in v[v.holds.astype(bool)].itertuples():
        c = classes[(classes.model == r.model) & (classes.task == r.task) & (classes.heads == r.chosen)] \
            if len(classes) else classes
        b = chosen_battery(rec, r.model, r.task, r.chosen)
        share = (b or {}).get("label_distribution", {}).get((b or {}).get("label"), np.nan)
        rows.append({"model": r.model, "task": r.task, "head": r.chosen, "heldout_delta": r.heldout_delta,
                     "heldout_ci_low": r.heldout_ci_low, "heldout_ci_high": r.heldout_ci_high,
                     "items": f"held-out 1-{int(r.n_heldout)}",
                     "one_label_shift": SHIFT_WORDS.get(c["kind"].iloc[0], c["kind"].iloc[0]) if len(c) else
                     "no per-class test",
                     "transfer": (b["checks"].get("transfer", {}).get("reading") or "not measured") if b else
                     "not tested",
                     "label": b["label"] if b else "not tested",
                     "stability": f"{share:.0%}, {strength(share)}" if b and _num(share) else ""})
    return pd.DataFrame(rows)


def so_line(rec: Records, v: pd.DataFrame) -> str:
    """The counting sentence: of the pairs whose chosen head helps on held-out items, how many chapter 1c tested,
    how many of those it labels a capability (firm or weak), and where its rule misses its own target.

        >>> import tempfile
        >>> v = pd.DataFrame({"model": ["m", "m"], "task": ["a", "b"], "chosen": ["L1H1", "L2H2"], "holds": [True, True]})
        >>> so_line(Records(tempfile.mkdtemp()), v)
        '**So:** of the 2 heads whose removal helps on held-out items, chapter 1c tested 0: whether any is a capability is not known.'
    """
    held = v[v.holds.astype(bool)]
    tested = [(r, b) for r in held.itertuples()
              if (b := chosen_battery(rec, r.model, r.task, r.chosen)) is not None]
    if held.empty:
        return "**So:** no head's removal helps on held-out items, so none could be labelled."
    head = f"**So:** of the {len(held)} heads whose removal helps on held-out items, chapter 1c tested {len(tested)}"
    if not tested:
        return head + ": whether any is a capability is not known."
    share = lambda b: b.get("label_distribution", {}).get(b["label"], np.nan)  # noqa: E731
    cap = [(r, b) for r, b in tested if b["label"] == "capability"]
    firm = [x for x in cap if strength(share(x[1])) == "firm"]
    others = ", ".join(f"{r.chosen} ({r.model} / {r.task}) {b['label']}, {strength(share(b))}"
                       for r, b in tested if b["label"] != "capability")
    miss = [f"{r.model} / {r.task} (P(capability | a capability of gain {POWER_GAIN:.2f}) = {oc_misses(b):.2f} < "
            f"{OC_TARGET_CAPABILITY:g})" for r, b in tested if oc_misses(b) is not None]
    out = head + f" and labels {len(cap)} of them a capability ({len(firm)} firmly)"
    if others:
        out += f"; the others: {others}"
    if miss:
        out += (f". Its rule misses its own target at {', '.join(miss)}: a label other than capability there is "
                "weak evidence against one")
    untested = len(held) - len(tested)
    return out + (f"; {untested} untested." if untested else ".")


def dose_line(dose: pd.DataFrame) -> str:
    """Chapter 2b's dose curves in one sentence, each word from the graded items' exact test: which dose the choose
    items pick, and whether it beats removal, loses to it, or ties with it (McNemar p at least ALPHA: a tie).

        >>> d = pd.DataFrame({"model": ["a", "b"], "heads": ["L1H1", "L2H2"], "chosen_alpha": [-0.5, -0.5],
        ...                   "best_minus_removal": [0.0, 0.01], "ci_low": [0.0, -0.02], "ci_high": [0.0, 0.04],
        ...                   "p_value": [1.0, 0.6]})
        >>> print(dose_line(d))
        - **Dose.** Of 2 dose curves (chapter 2's chosen sets; their heads alone where traced), the choose items pick removal (alpha = 0) for 0 and another dose for 2; on the graded items no dose beats removal: a L1H1 at alpha = -0.5 ties with it (+0.000 [+0.000, +0.000]), b L2H2 at alpha = -0.5 ties with it (+0.010 [-0.020, +0.040]).
    """
    removal = int((dose.chosen_alpha == 0).sum())
    other = dose[dose.chosen_alpha != 0]
    sig = other.p_value < ALPHA
    better, worse, tie = other[sig & (other.best_minus_removal > 0)], other[sig & (other.best_minus_removal < 0)], \
        other[~sig]
    say = lambda g, verb: ", ".join(f"{x.model} {x.heads} at alpha = {x.chosen_alpha:g} {verb} "  # noqa: E731
                                    f"({x.best_minus_removal:+.3f} [{x.ci_low:+.3f}, {x.ci_high:+.3f}])"
                                    for x in g.itertuples())
    parts = [say(better, "beats it"), say(worse, "loses to it"), say(tie, "ties with it")]
    head = (f"- **Dose.** Of {len(dose)} dose curves (chapter 2's chosen sets; their heads alone where traced), the "
            f"choose items pick removal (alpha = 0) for {removal} and another dose for {len(other)}")
    if not len(other):
        return head + "."
    return (head + f"; on the graded items {'no dose beats removal' if better.empty else 'a dose beats removal'}: "
            + ", ".join(p for p in parts if p) + ".")


VERSUS = {"more": "boosting helps more", "less": "boosting helps less", "tie": "a tie on these items"}


def _text_costs(r: dict, model: str) -> str:
    """Chapter 2b's cost on general text of the boost and the removal for one model, each with its token count."""
    c = [x for x in r.get("costs", []) if x["model"] == model and x["intervention"] in ("boost", "remove")
         and str(x["measured on"]).startswith("general text")]
    return "".join(f", text cost of the {x['intervention']} {x['change']:+.3f} [{x['ci_low']:+.3f}, "
                   f"{x['ci_high']:+.3f}] nats/token ({x['measured on'].removeprefix('general text (').rstrip(')')})"
                   for x in c)


def remove_scale_boost(rec: Records) -> list[str]:
    """Chapter 2b in three computed sentences (markdown lines): the dose, boosting against removal, the per-item
    ceiling; empty when chapter 2b has not run."""
    r = rec.raw.get("02b_remove_scale_boost")
    if not r:
        return []
    grade, choose = (r.get("items") or {}).get("grade"), (r.get("items") or {}).get("choose")
    lines = [f"- **Which items** (chapter 2b): doses and sets are chosen on confirm items {choose[0] + 1}-{choose[1]} "
             f"and graded on held-out items {grade[0] + 1}-{grade[1]}, after those chapters 1a and 2 used."] \
        if grade and choose else []
    dose = pd.DataFrame(r.get("dose", []))
    if len(dose):
        lines.append(dose_line(dose))
    boost = pd.DataFrame(r.get("boost_table", []))
    if len(boost):
        parts = []
        for m, g in boost.groupby("model", sort=False):
            both = g[g.intervention.str.endswith("+ remove")]
            b = g[(g.intervention != "remove") & ~g.intervention.str.endswith("+ remove")].iloc[0]
            rm = g[g.intervention == "remove"].iloc[0]
            gain = lambda x: f"{x.heldout_delta:+.3f}" if _num(x.heldout_delta) else "nothing confirmed"  # noqa: E731
            parts.append(f"{m}: {b.intervention} {gain(b)}{' (holds)' if b.holds else ''}, removal of chapter 2's "
                         f"set {gain(rm)}{' (holds)' if rm.holds else ''}"
                         + "".join(f", both together {gain(x)}{' (holds)' if x.holds else ''}"
                                   for x in both.head(1).itertuples()))
        vs = {x["model"]: x.get("versus") for x in r.get("boost", [])}
        parts = [p + (f", boosting minus removal {v['delta']:+.3f} [{v['ci_low']:+.3f}, {v['ci_high']:+.3f}] "
                      f"(exact McNemar p = {v['p_value']:.2g}: {VERSUS[v['word']]})" if v else "") + _text_costs(r, m)
                 for p, v, m in zip(parts, (vs.get(m) for m in boost.model.drop_duplicates()),
                                    boost.model.drop_duplicates())]
        lines.append("- **Boost or remove** (held-out gain in accuracy of each pipeline's chosen set, the two head "
                     "to head on the same items, and each one's cost on general text): " + "; ".join(parts) + ".")
    rc = pd.DataFrame(r.get("recall", []))
    if len(rc):
        best = rc.loc[rc.groupby("model", sort=False).recall.idxmax()]
        lines.append("- **Finding the heads cheaply.** " + "; ".join(
            f"{x.model}: the best cheap selector ({x.selector}, {x.forward_equivalents:.0f} forward-equivalents) finds "
            f"{x.recall:.0%} [{x.ci_low:.0%}, {x.ci_high:.0%}] of the exact screen's top heads, which cost "
            f"{x.exact_forward_equivalents:.0f}" for x in best.itertuples()) + ".")
    ceil = pd.DataFrame(r.get("ceiling", []))
    if len(ceil):
        lines.append("- **Per-item ceiling.** " + "; ".join(
            f"{x.model}: some single head fixes {x.oracle:.0%} of {x.wrong_items} wrong items and chapter 2's set "
            f"{x.static:.0%}, so choosing a head per item (with hindsight) adds {x.oracle_minus_static:+.0%} "
            f"[{x.oms_low:+.0%}, {x.oms_high:+.0%}] (item bootstrap) over the static set"
            for x in ceil.itertuples()) + ".")
    return lines


def conflict_or_noise(rec: Records) -> list[str]:
    """Chapter 3a in one computed sentence per account (markdown lines); empty when it has not run."""
    r = rec.raw.get("03a_conflict_or_noise")
    if not r:
        return []
    pred, sig = pd.DataFrame(r.get("predictions", [])), pd.DataFrame(r.get("signature", []))
    t = pd.DataFrame(r.get("table", []))
    conf = pred[pred.setting == "conflict"] if len(pred) else pred
    lines = [f"- **Conflict** (a two-sided trade-off that survives an off switch): in the toy with a conflicting "
             f"feature its prediction is met at {int((conf.conflict == 'met').sum())} of {len(conf)} initial scales "
             f"({int(t.runs.max()) if len(t) else 0} runs per cell, softmax, softmax-1 and gated heads)."]
    noise = "- **Noise**: not run"
    if len(t):
        one = float(t[t.variant == "softmax"].one_sided.max()) if "one_sided" in t else float("nan")
        noise = (f"- **Noise** (a one-sided gain that vanishes when heads can abstain): the toy cannot show it. At "
                 f"the toy's joint optimum a removal that helps task A without hurting task B would lower the joint "
                 f"loss, so a trained run can have none (the largest share of softmax runs with one: {one:.3f}); its "
                 f"prediction is met in {int((pred.noise == 'met').sum())} of {len(pred)} toy cells by construction, "
                 f"not as evidence. The largest share of a run's heads both tasks are better without is "
                 f"{t.heads_help_both.max():.2f}")
    if len(sig):
        opp, same = sig[sig.p_opposite_holm < ALPHA], sig[sig.p_same_holm < ALPHA]
        noise += (f". In the real models, {len(opp)} of {len(sig)} task pairs have more heads moving the tasks "
                  f"oppositely than random head pairs, {len(same)} more moving them alike (Holm p < {ALPHA:g}; "
                  f"power at +0.10 from {sig.power_excess.min():.2f} to {sig.power_excess.max():.2f}"
                  + (f", at the excess the confirmed heads could make from {sig.power_realistic.min():.2f} to "
                     f"{sig.power_realistic.max():.2f}" if "power_realistic" in sig else "") + ")")
    px = pd.DataFrame(r.get("sinks", []))
    if len(px):
        noise += (f". The noise account's proxy: in {int((px.sink_reading == 'tracks').sum())} of {len(px)} pairs a "
                  f"head's removal gain is shown to track its attention-sink mass, in "
                  f"{int((px.out_norm_reading == 'tracks').sum())} its output norm (Spearman, Holm; not shown is not "
                  "absent)")
    lines.append(noise + ".")
    net = r.get("network") or {}
    if net.get("predictions"):
        loc, pn = pd.DataFrame(net["localized"]), pd.DataFrame(net["predictions"])
        labels = pd.Series([b["label"] for b in net.get("batteries", [])]).value_counts()
        lines.append(f"- **A trained transformer** (one layer, four heads, attention only, {int(loc.runs.sum())} runs on "
                     f"the toy's data as tokens): the book's pipeline localizes {int(loc.localized.sum())} runs, and "
                     f"toy_b falls (exact McNemar) when the chosen head of {int(loc.two_sided.sum())} of them is removed; "
                     "conflict's prediction is " + ", ".join(f"{q.conflict} at initial scale {q.scale:g}"
                                                             for q in pn.itertuples())
                     + ", noise's " + ", ".join(f"{q.noise}" for q in pn.itertuples())
                     + (f"; the battery labels " + ", ".join(f"{n} {k}" for k, n in labels.items()) if len(labels)
                        else "") + ".")
    return lines
