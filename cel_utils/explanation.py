"""What a head does, in words and records: chapter 2a's per-head profile and ``cel explain`` (one computation).

:func:`profile` runs the measurements of :mod:`cel_utils.mechanism` for one head (and a same-layer control head):
its direct and total effect item by item, the path split, the mediators, the tokens it raises and lowers (on the
items its removal fixes, breaks, and on all items), its attention at the read position, and, for addition, the
kind of error its removal fixes; then :func:`describe` writes one sentence from those numbers.
:meth:`Profile.record` is the JSON both chapter 2a and ``cel explain`` write.

Example:
    >>> from cel_utils.explanation import profile        # doctest: +SKIP
    >>> p = profile(lm, task, (13, 0), control=(13, 8))   # doctest: +SKIP
    >>> p.summary["sentence"]                              # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .ablation import Head, head_name
from .mechanism import (TOP_TOKENS, Explanation, Reads, Trace, attention, attention_rows, choose_reads, explain,
                        mean_attention, mediators, token_at, token_text, top_tokens, trace)

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
    tokens: dict                  # promoted/suppressed on fixed items, on broken items, and on all items
    summary: dict = field(default_factory=dict)  # the numbers and the sentence

    def items(self, tok) -> pd.DataFrame:
        """One row per item: total and direct change, outcome, answer and competitor, the prompt's end."""
        ex, reads = self.explanation, self.explanation.reads
        texts = lambda ids: [token_text(tok, t) for t in ids]  # noqa: E731
        df = pd.DataFrame({"item": reads.items, "total": ex.total, "direct": ex.direct,
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


def top_attended(tok, reads: Reads, weights) -> tuple[str, float]:
    """Where the head attends most at the read position (averaged over items) as words, and the mean weight."""
    mean_att = mean_attention(weights)
    top_j = int(np.argmax(mean_att))
    back = len(mean_att) - top_j
    top_tok, top_share = token_at(tok, reads, back)
    where = f"{back - 1} position{'s' if back > 2 else ''} before the read" if back > 1 else "the read position itself"
    text = f"{top_tok!r}, {where}" if top_share == 1 else f"{where} (where {top_share:.0%} of items have {top_tok!r})"
    return text, float(mean_att[top_j])


def profile(lm, task, head: Head, control: Head | None = None, reads: Reads | None = None, tr: Trace | None = None,
            clean=None, n_tokens: int = TOP_TOKENS, n_mediators: int = N_MEDIATORS, status: str | None = None
            ) -> Profile:
    """Profile ``head`` on ``task``'s items (``reads``, the clean ``tr`` and ``clean`` results are computed when not
    given; pass them to share them across heads of one task). ``control``: a same-layer head whose attention is
    measured beside it. ``status`` (e.g. ``confirmed``, ``exploratory``) is carried into the summary."""
    reads = reads if reads is not None else choose_reads(lm, task)
    tr = tr if tr is not None else trace(lm, reads)
    ex = explain(lm, task, head, reads=reads, tr=tr, clean=clean)
    weights = attention(lm, reads, [head] + ([control] if control else []))
    med = mediators(lm, tr, ex, k=n_mediators)
    fixed_rows, broken_rows = np.where(ex.fixed)[0], np.where(ex.broken)[0]
    tokens = dict(zip(("promoted_fixed", "suppressed_fixed"), top_tokens(lm, ex.head_logits, fixed_rows, n_tokens)))
    tokens.update(zip(("promoted_broken", "suppressed_broken"), top_tokens(lm, ex.head_logits, broken_rows, n_tokens)))
    tokens.update(zip(("promoted", "suppressed"), top_tokens(lm, ex.head_logits, None, n_tokens)))
    tok = lm.tokenizer
    attended, weight = top_attended(tok, reads, weights[head])
    s = dict(ex.summary, control=None if control is None else head_name(control),
             mediator=med[0]["component"] if med else None, mediator_change=med[0]["mean_change"] if med else 0.0,
             fixed_total=float(ex.total[fixed_rows].mean()) if len(fixed_rows) else 0.0,
             fixed_direct=float(ex.direct[fixed_rows].mean()) if len(fixed_rows) else 0.0,
             top_attended=attended, top_weight=weight)
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


def describe(s: dict) -> str:
    """One line naming the mechanism the numbers support, written from them (``s``: a chapter's summary row with
    ``head``, ``task``, ``n_items``, ``n_fixed``, ``n_broken``, ``direct_share``, ``total_delta_margin``,
    ``direct_delta_margin``, ``mediator``, ``mediator_change``, ``fixed_total``, ``fixed_direct`` (mean total and
    direct change on the items its removal fixes), ``top_attended``, ``top_weight`` and optionally
    ``error_kind``/``error_share``).

    Example:
        >>> describe({"head": "L1H2", "task": "t", "n_items": 10, "n_fixed": 3, "n_broken": 0, "direct_share": 0.9,
        ...           "total_delta_margin": 1.0, "direct_delta_margin": 0.9, "mediator": "L2.mlp",
        ...           "mediator_change": 0.05, "fixed_total": 2.0, "fixed_direct": 1.8, "top_attended": "' ='",
        ...           "top_weight": 0.5})[:60]
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
            f"{s['n_items']} items; {path}{favour}{kind}; at the read position it attends most to "
            f"{s['top_attended']}, mean weight {s['top_weight']:.2f}.")
