"""What a head does, in words and records: chapter 2a's per-head profile and ``cel explain`` (one computation).

:func:`profile` runs the measurements of :mod:`cel_utils.mechanism` and :mod:`cel_utils.attention` for one head
(and a same-layer control head): its direct and total effect item by item, the path split, the mediators, the
tokens it raises and lowers (on the items its removal fixes, breaks, and on all items), its attention at the read
position, and, for addition, the kind of error its removal fixes; then :func:`describe` writes one sentence from
those numbers.
:meth:`Profile.record` is the JSON both chapter 2a and ``cel explain`` write.

Attention is averaged over items by *role* (:func:`cel_utils.attention.slots`): the first token of the prompt
(the attention sink position) apart, the read's own line counted back from the read, earlier lines (a few-shot
prompt's demonstrations) each counted back from its end. The sentence names the sink's weight and the most
attended *content* position (the largest mean weight apart from the sink); :func:`attention_panel` lays out the
same slots for the chapter's figure, the sink and the named position always among them.

The sentence is Markdown: token texts in it are HTML-escaped (``<bos>`` is written ``&lt;bos&gt;``), so a page
that shows it as Markdown shows the token instead of swallowing it as a tag.

Example:
    >>> from cel_utils.explanation import profile        # doctest: +SKIP
    >>> p = profile(lm, task, (13, 0), control=(13, 8))   # doctest: +SKIP
    >>> p.summary["sentence"]                              # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from html import escape

import numpy as np
import pandas as pd

from .ablation import Head, head_name
from .attention import (SINK, attention, attention_rows, mean_attention, slot_label, slot_order, slot_token, slot_words,
                        slots)
from .direct import Reads, Trace, choose_reads, trace
from .mechanism import TOP_TOKENS, Explanation, explain, mediators, token_text, top_tokens
from .tasks import load_task, split_tail

N_MEDIATORS = 5


@dataclass
class Profile:
    """Everything chapter 2a shows of one head on one task (see :func:`profile`)."""

    head: Head
    task: object
    control: Head | None
    explanation: Explanation
    weights: dict                 # head (and control) -> attention at the read, one vector per item
    mediators: list[dict]
    tokens: dict                  # promoted/suppressed on fixed items (also readable ones only), broken items, all items
    summary: dict = field(default_factory=dict)  # the numbers and the sentence

    def items(self, tok, first_item: int = 0) -> pd.DataFrame:
        """One row per item: total and direct change, outcome, answer and competitor, the prompt's end; items are
        numbered from ``first_item`` (the number the task's first item has on the page)."""
        ex, reads = self.explanation, self.explanation.reads
        texts = lambda ids: [token_text(tok, t) for t in ids]  # noqa: E731
        df = pd.DataFrame({"item": first_item + reads.items, "total": ex.total, "direct": ex.direct,
                           "outcome": np.where(ex.fixed, "fixed", np.where(ex.broken, "broken", "unchanged")),
                           "answer": texts(reads.answer), "competitor": texts(reads.competitor),
                           "prompt end": [tok.decode(s[-12:]) for s in reads.inputs]})
        df["text"] = [f"item {i}: {a!r} vs {c!r}" for i, a, c in zip(df["item"], df["answer"], df["competitor"])]
        return df

    def record(self, tok) -> dict:
        """The JSON of ``cel explain`` and of chapter 2a per head: the summary with its sentence, the mediators,
        the tokens raised and lowered, the attention at the read position, and one row per item."""
        ex = self.explanation
        strip = lambda rows: [{"token": r["token"], "token_id": r["token_id"], "mean_logit": r["mean_logit"]}  # noqa
                              for r in rows]
        return {**self.summary, "mediators": self.mediators,
                **{k: strip(v) for k, v in self.tokens.items()},
                "attention": attention_rows(tok, ex.reads, self.weights[self.head]),
                "items": [{"index": int(i), "fixed": bool(f), "broken": bool(b), "total_delta_margin": float(t),
                           "direct_delta_margin": float(d), "answer": token_text(tok, a),
                           "competitor": token_text(tok, c)}
                          for i, f, b, t, d, a, c in zip(ex.reads.items, ex.fixed, ex.broken, ex.total, ex.direct,
                                                         ex.reads.answer, ex.reads.competitor)]}


def shown(text: str | None) -> str:
    """A token's text as the book's sentences write it: quoted (``repr``) and HTML-escaped for Markdown.

    Example:
        >>> shown("<bos>"), shown(" ="), shown(None)
        ("'&lt;bos&gt;'", "' ='", 'nothing')
    """
    return "nothing" if text is None else escape(repr(text), quote=False)


def top_attended(tok, reads: Reads, weights) -> dict:
    """Where the head attends at the read position, averaged over items by role (see the module's docstring):
    the sink's token (the most common first token), its share of items and its mean weight, and the most attended
    *content* slot (largest mean weight apart from the sink): its slot ``(line, back)``, its words, its most common
    token and that token's share of items, its mean weight. ``top_slot`` is None when the reads have no position
    but the sink."""
    read_slots = [slots(tok, s) for s in reads.inputs]
    keys, mean = mean_attention(weights, read_slots)
    sink_tok, sink_share = slot_token(tok, reads, read_slots, SINK)
    out = {"sink_token": sink_tok, "sink_share": sink_share, "sink_weight": float(mean[keys.index(SINK)]),
           "top_slot": None, "top_where": None, "top_token": None, "top_share": 0.0, "top_weight": 0.0}
    content = [i for i, k in enumerate(keys) if k != SINK]
    if content:
        j = max(content, key=lambda i: mean[i])
        t, share = slot_token(tok, reads, read_slots, keys[j])
        out.update(top_slot=list(keys[j]), top_where=slot_words(keys[j]), top_token=t, top_share=share,
                   top_weight=float(mean[j]))
    return out


def unused_heldout(task_name: str, start: int, n: int, seed: int = 0):
    """The held-out items of a built-in task that an earlier chapter did not use: items ``start`` to
    ``start + n - 1`` of the held-out split (0-based; fewer when the split ends first). Chapter 1a grades its
    verdicts on the first ``n_heldout`` held-out items, so chapter 2a explains heads on the items after them.

    Example:
        >>> t = unused_heldout("addition", 200, 100)
        >>> len(t.items), t.items[0] == load_task("addition", "heldout").items[200]
        (100, True)
    """
    return split_tail(task_name, "heldout", start, n, seed)


def profile(lm, task, head: Head, control: Head | None = None, reads: Reads | None = None, tr: Trace | None = None,
            clean=None, n_tokens: int = TOP_TOKENS, n_mediators: int = N_MEDIATORS, status: str | None = None
            ) -> Profile:
    """Profile ``head`` on ``task``'s items (``reads``, the clean ``tr`` and ``clean`` results are computed when not
    given; pass them to share them across heads of one task). ``control``: a same-layer head whose attention is
    measured beside it. ``status`` (e.g. ``confirmed``, ``exploratory``) is carried into the summary. The tokens
    raised and lowered on the items its removal fixes are also listed among readable tokens only
    (``promoted_fixed_readable``, ``suppressed_fixed_readable``: :func:`cel_utils.mechanism.readable`)."""
    reads = reads if reads is not None else choose_reads(lm, task)
    tr = tr if tr is not None else trace(lm, reads)
    ex = explain(lm, task, head, reads=reads, tr=tr, clean=clean)
    weights = attention(lm, reads, [head] + ([control] if control else []))
    med = mediators(lm, tr, ex, k=n_mediators)
    fixed_rows, broken_rows = np.where(ex.fixed)[0], np.where(ex.broken)[0]
    tokens = dict(zip(("promoted_fixed", "suppressed_fixed"), top_tokens(lm, ex.head_logits, fixed_rows, n_tokens)))
    tokens.update(zip(("promoted_broken", "suppressed_broken"), top_tokens(lm, ex.head_logits, broken_rows, n_tokens)))
    tokens.update(zip(("promoted", "suppressed"), top_tokens(lm, ex.head_logits, None, n_tokens)))
    tokens.update(zip(("promoted_fixed_readable", "suppressed_fixed_readable"),
                      top_tokens(lm, ex.head_logits, fixed_rows, n_tokens, only_readable=True)))
    tok = lm.tokenizer
    s = dict(ex.summary, control=None if control is None else head_name(control),
             mediator=med[0]["component"] if med else None, mediator_change=med[0]["mean_change"] if med else 0.0,
             fixed_total=float(ex.total[fixed_rows].mean()) if len(fixed_rows) else 0.0,
             fixed_direct=float(ex.direct[fixed_rows].mean()) if len(fixed_rows) else 0.0,
             **top_attended(tok, reads, weights[head]))
    if status is not None:
        s["status"] = status
    if task.name == "addition" and len(fixed_rows):
        kinds = Counter(addition_error(task.items[reads.items[r]], int(reads.target_index[r]),
                                       token_text(tok, reads.competitor[r])) for r in fixed_rows)
        kind, count = kinds.most_common(1)[0]
        s.update(error_kind=kind, error_share=count / len(fixed_rows), error_kinds=dict(kinds))
    s["sentence"] = describe(s)
    return Profile(head=head, task=task, control=control, explanation=ex, weights=weights, mediators=med,
                   tokens=tokens, summary=s)


def addition_error(item: dict, target_index: int, competitor: str) -> str:
    """What kind of wrong token an addition item's competitor is, at the digit being written: ``off by one``
    (a carry slip), ``operand digit`` (the digit of either operand at the same place), ``other digit``,
    ``not a digit``, or ``runs on or stops early`` (the decisive read is the one after the answer: the model
    would continue the number, or end it too soon).

    Example:
        >>> addition_error({"key": "47+38", "target": "85"}, 1, "4")
        'off by one'
        >>> addition_error({"key": "47+38", "target": "85"}, 0, "4")
        'operand digit'
    """
    a, b = item["key"].split("+")
    target = item["target"]
    if target_index >= len(target):
        return "runs on or stops early"
    c = competitor.strip()
    if not (len(c) == 1 and c.isdigit()):
        return "not a digit"
    right = int(target[target_index])
    if abs(int(c) - right) in (1, 9):
        return "off by one"
    place = len(target) - 1 - target_index  # 0 = units
    if any(place < len(x) and x[-1 - place] == c for x in (a, b)):
        return "operand digit"
    return "other digit"


def attended_words(s: dict) -> str:
    """The attention part of the sentence: the sink's weight, then the most attended content position.

    Example:
        >>> attended_words({"sink_token": "<bos>", "sink_share": 1.0, "sink_weight": 0.62, "top_where": "2 "
        ...                 "positions before the read", "top_token": " =", "top_share": 1.0, "top_weight": 0.2})  # doctest: +NORMALIZE_WHITESPACE
        "at the read position it puts 0.62 of its attention on the first token of the prompt ('&lt;bos&gt;'), the
        attention sink position; of the rest, most on ' =', 2 positions before the read, mean weight 0.20"
    """
    sink = (f"it puts {s['sink_weight']:.2f} of its attention on the first token of the prompt ("
            + (shown(s["sink_token"]) if s["sink_share"] == 1 else
               f"{shown(s['sink_token'])} in {s['sink_share']:.0%} of items") + "), the attention sink position")
    if s.get("top_where") is None:
        return f"at the read position {sink}, the only position there is"
    where, t, share = s["top_where"], s["top_token"], s["top_share"]
    content = f"{shown(t)}, {where}" if share == 1 else f"{where} (where {share:.0%} of items have {shown(t)})"
    return f"at the read position {sink}; of the rest, most on {content}, mean weight {s['top_weight']:.2f}"


def describe(s: dict) -> str:
    """One line naming the mechanism the numbers support, written from them (``s``: a chapter's summary row with
    ``head``, ``task``, ``n_items``, ``n_fixed``, ``n_broken``, ``direct_share``, ``total_delta_margin``,
    ``direct_delta_margin``, ``mediator``, ``mediator_change``, ``fixed_total``, ``fixed_direct`` (mean total and
    direct change on the items its removal fixes), the attention fields of :func:`top_attended` and optionally
    ``error_kind``/``error_share``). Markdown: token texts are HTML-escaped.

    Example:
        >>> describe({"head": "L1H2", "task": "t", "n_items": 10, "n_fixed": 3, "n_broken": 0, "direct_share": 0.9,
        ...           "total_delta_margin": 1.0, "direct_delta_margin": 0.9, "mediator": "L2.mlp",
        ...           "mediator_change": 0.05, "fixed_total": 2.0, "fixed_direct": 1.8, "sink_token": "a",
        ...           "sink_share": 1.0, "sink_weight": 0.3, "top_where": "the read position itself",
        ...           "top_token": " =", "top_share": 1.0, "top_weight": 0.5})[:60]
        'L1H2 (t): removing it fixes 3 and breaks 0 of 10 items; 90% '
    """
    share = s["direct_share"]
    if share is None:
        path = "its removal does not change the logit difference"
    elif share >= 0.5:
        path = f"{share:.0%} of its effect on the logit difference is direct: its own output pushes the competitor up"
    else:
        pct = "under 1%" if share < 0.005 else f"only {share:.0%}"
        path = (f"{pct} of its effect is direct; the rest reaches the logits through later layers, the largest single "
                f"part through {s['mediator']} ({s['mediator_change']:+.2f} when the head is removed)")
    favour = ""
    if s["n_fixed"]:
        own = s["fixed_direct"]
        favour = (f"; on the {s['n_fixed']} items its removal fixes, the logit difference rises by "
                  f"{s['fixed_total']:.2f} on average, "
                  + (f"{own:.2f} of it because the head's own output, which favoured the competitor, is gone"
                     if own > 0 else f"though the head's own output favoured the answer (by {-own:.2f})"))
    kind = (f"; the errors its removal fixes are mostly '{s['error_kind']}' ({s['error_share']:.0%})"
            if s.get("error_kind") else "")
    return (f"{s['head']} ({s['task']}): removing it fixes {s['n_fixed']} and breaks {s['n_broken']} of "
            f"{s['n_items']} items; {path}{favour}{kind}; {attended_words(s)}.")


def attention_panel(prof: Profile, tok, n_positions: int = 10, n_rows: int = 6, first_item: int = 0) -> dict:
    """The chapter's attention heatmap as data: columns are slots (see the module's docstring) in reading order,
    always the sink and the content slot the sentence names, then the last ``n_positions`` slots of the read's
    line; rows are the head's mean over items, the control's mean, and up to ``n_rows`` single items whose
    outcome the head's removal flips (blank where an item has no such position), named ``item {first_item + i}``
    (``first_item``: the number the task's first item has on the page). Returns ``{"slots",
    "x_labels", "y_labels", "z"}``; a label is the slot's short name and its most common token (``*``: not
    every item has that token there), HTML-escaped for plotly.
    """
    ex, reads = prof.explanation, prof.explanation.reads
    read_slots = [slots(tok, s) for s in reads.inputs]
    keys, _ = mean_attention(prof.weights[prof.head], read_slots)
    window = [k for k in keys if k != SINK][-n_positions:] if n_positions > 0 else []
    named = prof.summary.get("top_slot")
    cols = sorted({SINK, *window, *([tuple(named)] if named is not None else [])}, key=slot_order)
    labels = []
    for k in cols:
        t, share = slot_token(tok, reads, read_slots, k)
        labels.append(f"{slot_label(k)}: " + ("" if t is None else shown(t) + ("" if share == 1 else "*")))

    def row_of_mean(weights):
        ks, m = mean_attention(weights, read_slots)
        d = dict(zip(ks, m))
        return [d.get(k, 0.0) for k in cols]

    z = [row_of_mean(prof.weights[prof.head])]
    y = [f"{head_name(prof.head)}, mean"]
    if prof.control is not None:
        z.append(row_of_mean(prof.weights[prof.control]))
        y.append(f"{head_name(prof.control)} (control), mean")
    for r in np.where(ex.fixed | ex.broken)[0][:n_rows]:
        d = dict(zip(read_slots[r], prof.weights[prof.head][r]))
        z.append([float(d[k]) if k in d else np.nan for k in cols])
        y.append(f"item {first_item + int(reads.items[r])} ({'fixed' if ex.fixed[r] else 'broken'})")
    return {"slots": cols, "x_labels": labels, "y_labels": y, "z": np.array(z, dtype=float)}
