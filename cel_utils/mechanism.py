"""Inside a head: what it writes into the logits, through which path, and where it reads.

The reads (one position, answer and competitor per item), the clean trace at them and each component's direct
contribution to the logit difference (direct logit attribution, adding up exactly to the clean logit difference)
come from :mod:`cel_utils.direct`; a head's *direct effect* is minus its contribution.

Total effect: the change in the logit difference when the head is ablated (zero at the output projection's
input, every position, as everywhere in the book). Path split (path patching with the clean run as reference,
norms recomputed): *direct path* = remove the head's clean output from the final residual only; *indirect
path* = ablate the head, then add its clean output back to the final residual (only later layers lose it).
The two add up to the total when the model after the head is linear.

Where the head attends at the read, averaged over items by role: :mod:`cel_utils.attention`.

Example:
    >>> from cel_utils.mechanism import choose_reads, explain  # doctest: +SKIP
    >>> reads = choose_reads(lm, task)                          # doctest: +SKIP
    >>> ex = explain(lm, task, (13, 0), reads=reads)            # doctest: +SKIP
    >>> ex.summary["direct_share"]                              # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .ablation import Head, head_name
from .direct import Reads, Trace, choose_reads, components, direct_diff, direct_logits, head_output, logit_diff, trace
from .engine import evaluate
from .scoring import encode_task

TOP_TOKENS = 10  # promoted / suppressed tokens listed per head


@dataclass
class Explanation:
    """The measurements of one head on one task (see :func:`explain`)."""

    head: Head
    task: str
    reads: Reads
    clean_diff: np.ndarray        # [n] logit difference, clean
    total: np.ndarray             # [n] change in the logit difference when the head is ablated
    direct: np.ndarray            # [n] minus the head's direct contribution (frozen final norm)
    direct_path: np.ndarray       # [n] change when its output leaves the final residual only (norm recomputed)
    indirect_path: np.ndarray     # [n] change when only later layers lose it
    fixed: np.ndarray             # [n] bool: wrong clean, right with the head removed (the task's own score)
    broken: np.ndarray            # [n] bool
    task_delta_margin: np.ndarray  # [n] change in the task's margin
    head_logits: np.ndarray       # [n, vocab] the head's direct contribution to every logit, centred per read
    summary: dict = field(default_factory=dict)
    ablated: Trace | None = field(default=None, repr=False)  # the run with the head ablated


@torch.no_grad()
def explain(lm, task, head: Head, reads: Reads | None = None, tr: Trace | None = None,
            clean=None) -> Explanation:
    """Direct and total effects, the path split and the task outcome of removing ``head``, item by item.

    ``reads``, ``tr`` (the clean :func:`trace`) and ``clean`` (the clean :func:`~cel_utils.engine.evaluate`
    result) are computed when not given; pass them to share them across heads.
    """
    reads = reads if reads is not None else choose_reads(lm, task)
    tr = tr if tr is not None else trace(lm, reads)
    enc = encode_task(lm, task)
    clean = clean if clean is not None else evaluate(lm, enc, ())
    abl = evaluate(lm, enc, [head])
    c = head_output(lm, tr, head)  # [n, d]
    direct = -direct_diff(lm, tr, c)
    ab = trace(lm, reads, heads=[head])
    total = ab.logit_diff - tr.logit_diff
    direct_path = logit_diff(lm, reads, tr.final - c) - tr.logit_diff
    indirect_path = logit_diff(lm, reads, ab.final + c) - tr.logit_diff
    hl = direct_logits(lm, tr, c)
    hl = hl - hl.mean(-1, keepdim=True)
    idx = reads.items
    ex = Explanation(head=head, task=task.name, reads=reads, clean_diff=tr.logit_diff.numpy(), total=total.numpy(),
                     direct=direct.numpy(), direct_path=direct_path.numpy(), indirect_path=indirect_path.numpy(),
                     fixed=(~clean.correct[0] & abl.correct[0])[idx], broken=(clean.correct[0] & ~abl.correct[0])[idx],
                     task_delta_margin=(abl.margin[0] - clean.margin[0])[idx], head_logits=hl.numpy(),
                     ablated=ab)
    ex.summary = summarise(ex)
    return ex


@torch.no_grad()
def mediators(lm, tr: Trace, ex: Explanation, k: int = 5) -> list[dict]:
    """Where a head's indirect effect lands: the other components whose direct contribution to the logit
    difference changes most when the head is ablated (both runs read through the clean run's frozen final norm),
    largest mean change first: ``[{"component", "mean_change"}]``."""
    ab = Trace(**{**ex.ablated.__dict__, "final": tr.final})  # frozen at the clean run's final norm scale
    before, after = components(lm, tr), components(lm, ab)
    change = {name: float((direct_diff(lm, tr, after[name]) - direct_diff(lm, tr, before[name])).mean())
              for name in before if name != head_name(ex.head)}
    top = sorted(change, key=lambda n: -abs(change[n]))[:k]
    return [{"component": n, "mean_change": change[n]} for n in top]


def direct_share(direct: float, total: float) -> float | None:
    """How much of the effect goes through the direct path: ``|direct| / (|direct| + |total - direct|)``, in
    [0, 1]; None when both are 0.

    Example:
        >>> round(direct_share(0.3, 0.4), 3)
        0.75
        >>> round(direct_share(0.5, 0.4), 3)   # later layers undo part of the direct effect
        0.833
    """
    a, b = abs(direct), abs(total - direct)
    return None if a + b == 0 else a / (a + b)


def summarise(ex: Explanation) -> dict:
    t, d = float(ex.total.mean()), float(ex.direct.mean())
    return {"head": head_name(ex.head), "task": ex.task, "n_items": len(ex.reads),
            "total_delta_margin": t, "direct_delta_margin": d, "direct_share": direct_share(d, t),
            "direct_path": float(ex.direct_path.mean()), "indirect_path": float(ex.indirect_path.mean()),
            "n_fixed": int(ex.fixed.sum()), "n_broken": int(ex.broken.sum()),
            "task_delta_margin": float(ex.task_delta_margin.mean())}


def token_text(tok, t: int) -> str:
    """A token as it reads in text (leading spaces kept), e.g. ``' 7'``."""
    return tok.decode([int(t)], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def readable(text: str) -> bool:
    """Whether a token's text is shown in the book's token figures: ASCII letters only or digits only, with or
    without leading spaces (no punctuation, whitespace, special tokens, bytes that do not decode alone, or other
    scripts). Such a token can still be a piece of a word (``' miscon'``): the vocabulary has them.

    Example:
        >>> [readable(t) for t in (" the", "7", " 42", "adays", "'),", "\\n", "<bos>", "\ufffd", "υπ", " ")]
        [True, True, True, True, False, False, False, False, False, False]
    """
    s = text.lstrip(" ")
    return bool(s) and s.isascii() and (s.isalpha() or s.isdigit())


def top_tokens(lm, head_logits: np.ndarray, rows=None, k: int = TOP_TOKENS, only_readable: bool = False
               ) -> tuple[list[dict], list[dict]]:
    """The tokens the head's output promotes and suppresses most (its direct logits, centred, averaged over
    ``rows``): two lists of ``{"token", "token_id", "mean_logit"}``. With ``only_readable``, the ``k`` largest
    among the tokens :func:`readable` accepts (special tokens never)."""
    m = head_logits if rows is None else head_logits[np.asarray(rows)]
    if len(m) == 0:
        return [], []
    mean = m.mean(0)  # [vocab]
    order = np.argsort(mean)
    tok = lm.tokenizer
    special = set(getattr(tok, "all_special_ids", []) or [])

    def pick(ids):
        out = []
        for i in ids:
            if len(out) == k:
                break
            text = token_text(tok, i)
            if not only_readable or (int(i) not in special and readable(text)):
                out.append({"token": text, "token_id": int(i), "mean_logit": float(mean[i])})
        return out

    return pick(order[::-1]), pick(order)
