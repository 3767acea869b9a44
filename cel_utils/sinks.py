"""The noise account's proxy in real models: does a head's removal gain track its attention-sink mass or the size of
what it writes?

The noise account (chapter 3a) says a softmax head with nothing to add must still put its weight somewhere and so
writes something; removing such a head helps. Heads that have learned to idle park their attention on the first
token (an *attention sink*, Xiao et al. 2024) and write little. If helpful removals were noise, a head's removal
gain would go with how much it writes where it has no task reason to, and against its sink mass. Two numbers per
head, at each item's read position (:func:`cel_utils.direct.choose_reads`), averaged over items
(:func:`head_profile`):

* ``sink``: its attention weight on position 0;
* ``out_norm``: the norm of what it writes into the residual stream (its output through its own slice of the
  output projection, ``W_O[:, h] z_h``; ``[batch, head, d_head] -> [batch, d_model]``).

:func:`tracking` gives, per (model, task), Spearman's rank correlation of chapter 1a's search-split removal gain
(change in mean margin) with each, its p-value (``scipy.stats.spearmanr``) and Holm over all tests.

Example:
    >>> from cel_utils.tiny import tiny_model
    >>> from cel_utils.tasks import load_task
    >>> p = head_profile(tiny_model("llama"), load_task("agreement", "search", n=4))
    >>> list(p.columns), bool(((p.sink >= 0) & (p.sink <= 1)).all())
    (['head', 'layer', 'head_index', 'sink', 'out_norm', 'items'], True)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from . import hooks, profiling
from .ablation import head_name
from .defaults import ALPHA
from .direct import choose_reads
from .stats import holm


@torch.no_grad()
@profiling.timed
def head_profile(lm, task, batch_size: int = 16) -> pd.DataFrame:
    """Each head's mean attention on position 0 and mean output norm at the read position over ``task``'s items
    (one pass, eager attention): ``head``, ``layer``, ``head_index``, ``sink``, ``out_norm``, ``items``."""
    reads = choose_reads(lm, task)
    L, H, D = lm.n_layers, lm.n_heads, lm.head_dim
    sink, norm = torch.zeros(L, H), torch.zeros(L, H)
    with hooks.eager_attention(lm):
        for b, ids, att in hooks.padded_batches(lm, reads.inputs, batch_size):
            n = len(ids)
            rows = torch.arange(n)
            pos = torch.tensor([len(s) - 1 for s in reads.inputs[b:b + n]])
            w, z = {}, {}

            def on_w(l):
                def fn(x):   # [batch, head, query, key]
                    w[l] = x[rows, :, pos, 0].float().cpu()   # [batch, head]
                return fn

            with hooks.hooked(lm, [("pattern", l, on_w(l)) for l in range(L)]
                              + [("z", l, hooks.reader(z, l, rows, pos)) for l in range(L)]):
                hooks.hidden_states(lm, ids, att)
            for l in range(L):
                W = hooks.out_proj(lm, l).weight.float().cpu().view(-1, H, D)      # [d_model, head, d_head]
                written = torch.einsum("bhd,mhd->bhm", z[l].view(n, H, D), W)     # [batch, head, d_model]
                sink[l] += w[l].sum(0)
                norm[l] += written.norm(dim=-1).sum(0)
    k = len(reads)
    heads = [(l, h) for l in range(L) for h in range(H)]
    return pd.DataFrame({"head": [head_name(x) for x in heads], "layer": [l for l, _ in heads],
                         "head_index": [h for _, h in heads], "sink": (sink / k).flatten().numpy(),
                         "out_norm": (norm / k).flatten().numpy(), "items": k})


def tracking(landscape: pd.DataFrame, profiles: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """Per (model, task): Spearman's correlation over heads of the removal gain (``landscape``'s ``delta_margin``,
    :meth:`cel_utils.records.Records.landscape`) with ``sink`` and with ``out_norm`` (``profiles``: one
    :func:`head_profile` per (model, task), with those columns), p-values, Holm over every test, and the reading:
    ``tracks`` (Holm p below ``alpha``) or ``not shown`` (the test could not tell: not evidence of no link).

        >>> land = pd.DataFrame({"model": "m", "task": "t", "head": list("abcdefgh"),
        ...                      "delta_margin": [1., 2, 3, 4, 5, 6, 7, 8]})
        >>> prof = pd.DataFrame({"model": "m", "task": "t", "head": list("abcdefgh"),
        ...                      "sink": [8., 7, 6, 5, 4, 3, 2, 1], "out_norm": [1., 3, 2, 5, 4, 7, 6, 8]})
        >>> t = tracking(land, prof)
        >>> float(t.rho_sink.iloc[0]), t.sink_reading.iloc[0]
        (-1.0, 'tracks')
    """
    from scipy.stats import spearmanr

    rows = []
    for (m, t), g in profiles.groupby(["model", "task"], sort=False):
        x = g.merge(landscape[(landscape.model == m) & (landscape.task == t)][["head", "delta_margin"]], on="head")
        r = {"model": m, "task": t, "heads": len(x)}
        for col in ("sink", "out_norm"):
            res = spearmanr(x["delta_margin"], x[col])
            r[f"rho_{col}"], r[f"p_{col}"] = float(res.statistic), float(res.pvalue)
        rows.append(r)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    p = holm(np.concatenate([out.p_sink.to_numpy(), out.p_out_norm.to_numpy()]))
    out["p_sink_holm"], out["p_out_norm_holm"] = p[:len(out)], p[len(out):]
    for col in ("sink", "out_norm"):
        out[f"{col}_reading"] = np.where(out[f"p_{col}_holm"] < alpha, "tracks", "not shown")
    return out


def sentence(t: pd.DataFrame) -> str:
    """:func:`tracking`'s table in words: over how many pairs the removal gain is shown to track each proxy, with
    the direction, and that a 'not shown' is no evidence of no link.

        >>> t = pd.DataFrame({"model": ["m"], "task": ["t"], "rho_sink": [-0.4], "sink_reading": ["tracks"],
        ...                   "rho_out_norm": [0.05], "out_norm_reading": ["not shown"]})
        >>> sentence(t)[:93]
        'Of the 1 pairs, the removal gain is shown to track sink mass in 1 (m / t: Spearman -0.40, hea'
    """
    parts = []
    for col, what in (("sink", "sink mass"), ("out_norm", "output norm")):
        hit = t[t[f"{col}_reading"] == "tracks"]
        parts.append(f"{what} in {len(hit)}" + (" (" + ", ".join(
            f"{r['model']} / {r['task']}: Spearman {r[f'rho_{col}']:+.2f}, heads with "
            f"{'more' if r[f'rho_{col}'] > 0 else 'less'} {what} gaining more" for r in hit.to_dict("records"))
            + ")" if len(hit) else ""))
    return (f"Of the {len(t)} pairs, the removal gain is shown to track " + " and ".join(parts) + " (Holm p below "
            f"{ALPHA:g}); where it is not shown, the test could not tell, which is no evidence that there is no link.")
