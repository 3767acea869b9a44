"""Chapter 2a's view of an explained head (:func:`show_head`): the figures and tables of one head's profile
(:mod:`cel_utils.explanation`), rendered like every figure of the book (:func:`cel_utils.plots.figure`)."""

from __future__ import annotations

import pandas as pd
from IPython.display import Markdown, display

from . import attention, explanation
from .plots import attention_map, direct_vs_total, figure, token_bars
from .tables import table


def show_head(prof, tok, s, first_item: int, n_positions: int, n_flipped_rows: int) -> None:
    """Chapter 2a's view of one explained head: its sentence, direct against total effect per item, the tokens it
    raises and lowers, items its removal fixes, its attention beside its same-layer control, and its mediators.
    ``prof`` is its :class:`~cel_utils.explanation.Profile`, ``tok`` the tokenizer, ``s`` its summary row (with
    ``model``), ``first_item`` the number of the first held-out item shown."""
    m, name, task_name = s["model"], s["head"], s["task"]
    items = prof.items(tok, first_item=first_item)
    display(Markdown(f"### {m} · {task_name} · {name} ({s['status']})\n\n{s['sentence']}"))
    figure(direct_vs_total(items, title=f"{name} on {task_name}: direct vs total, per item"),
           f"{m}, {task_name}, {name}: each held-out item's change in logit difference when the head is "
           "removed (x) against the part that is its direct effect (y). On the diagonal all of the change is "
           "direct; green items are right only without the head, red ones only with it.")
    prom_f, sup_f = prof.tokens["promoted_fixed_readable"], prof.tokens["suppressed_fixed_readable"]
    prom_b = prof.tokens["promoted_broken"]
    if prom_f:
        figure(token_bars(prom_f, sup_f, title=f"{name}: tokens it raises and lowers (items its "
                            "removal fixes)"),
               f"{m}, {task_name}, {name}: the head's direct contribution to each token's logit at the read "
               f"position, centred over the vocabulary and averaged over the {int(s['n_fixed'])} items its "
               "removal fixes; readable tokens only (letters or digits, with or without a leading space: "
               "punctuation, whitespace, special and non-Latin tokens are left out, the record lists them "
               "all). Even these are vocabulary entries, not always whole words: a token can be the start "
               "of a longer word.")
    ex_rows = items[items["outcome"] == "fixed"].sort_values("total", ascending=False).head(5)
    if len(ex_rows):
        display(Markdown("Items its removal fixes (the clean model wrote the competitor):"))
        display(table(ex_rows, ["prompt end", "answer", "competitor", "total", "direct"],
                      rename={"total": "total change", "direct": "direct effect"}))
    if prom_b:
        nb_ = int(s['n_broken'])
        display(Markdown(f"On the {nb_} item{'s' if nb_ != 1 else ''} its removal breaks it raises "
                         + ", ".join(explanation.shown(t["token"]) for t in prom_b[:5]) + "."))
    panel = explanation.attention_panel(prof, tok, n_positions, n_flipped_rows, first_item=first_item)
    top = prof.summary["top_slot"]
    named = attention.slot_label(tuple(top)) if top is not None else None
    figure(attention_map(panel["z"], panel["x_labels"], panel["y_labels"],
                         title=f"{name}: attention at the read position"),
           f"{m}, {task_name}: attention of {name} at the read position, averaged over the "
           f"{int(s['n_items'])} items by role, beside the same-layer head {s['control']} and for single "
           "items its removal flips (numbered as held-out items; blank: the item has no such position). "
           f"Columns: 'sink' is the prompt's first token ({s['sink_weight']:.2f} of {name}'s attention), "
           + (f"'{named}' the content position the sentence names ({s['top_weight']:.2f}), " if named else "")
           + f"then the last {n_positions} positions of the read's line; each label gives the most common "
           "token there (* where items differ).")
    if prof.mediators:
        display(Markdown("Where its indirect effect lands (change in each component's direct contribution to the "
                         "logit difference when the head is removed, largest first):"))
        display(table(pd.DataFrame(prof.mediators), rename={"mean_change": "mean change"}))
