"""Head ablation at the input of the attention output projection.

A head is a *query* head ``(layer, head)``, written ``L{layer}H{head}``. The input of the output
projection (``o_proj`` / ``c_proj`` / ``dense``) is the concatenation of the query heads' outputs,
``[batch, pos, n_heads * head_dim]``; we view it as ``[batch, pos, n_heads, head_dim]`` and replace
the slice of the ablated heads, so exactly one query head's contribution is removed even when
several query heads share a key/value head (GQA/MQA).

Example:
    >>> from cel_utils.ablation import parse_heads, format_heads
    >>> parse_heads("L0H6,L1H1")
    [(0, 6), (1, 1)]
    >>> format_heads([(0, 6)])
    'L0H6'
"""

from __future__ import annotations

import hashlib
import re
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np
import torch

from . import hooks
from .errors import CELError

Head = tuple[int, int]
KINDS = ("zero", "mean", "resample", "constant", "scale")
_HEAD_RE = re.compile(r"^L(\d+)H(\d+)$", re.IGNORECASE)


def head_name(head: Head) -> str:
    return f"L{head[0]}H{head[1]}"


def format_heads(heads: Iterable[Head]) -> str:
    """A *list* of heads as the command line takes it: ``"L0H6,L1H1"`` (see :func:`format_set` for a set's name)."""
    return ",".join(head_name(h) for h in heads)


def format_set(heads: Iterable[Head]) -> str:
    """The name of a head set removed together: its heads joined by ``+`` (one head: its own name).

    Example:
        >>> format_set([(1, 2), (3, 4)]), format_set([(13, 0)])
        ('L1H2+L3H4', 'L13H0')
    """
    return "+".join(head_name(h) for h in heads)


def parse_set(name: str) -> list[Head]:
    """The heads of a set named by :func:`format_set` (``+``; a ``,``-separated list is read too).

    Example:
        >>> parse_set("L1H2+L3H4")
        [(1, 2), (3, 4)]
    """
    return parse_heads(name.replace("+", ","))


def layer_of(name: str) -> int:
    """The layer of a head named ``L{layer}H{head}``.

    Example:
        >>> layer_of("L13H0")
        13
    """
    return parse_heads(name)[0][0]


def parse_heads(spec: str | Iterable, n_layers: int | None = None, n_heads: int | None = None) -> list[Head]:
    """Parse ``"L0H6,L1H1"`` (or a list of such names / tuples) and check the range if geometry is given.

    ``"L3"`` (a whole layer) and ``"all"`` are accepted when the geometry is known.
    """
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",") if p.strip()]
    else:
        parts = list(spec)
    heads: list[Head] = []
    for p in parts:
        if isinstance(p, (tuple, list)) and len(p) == 2:
            heads.append((int(p[0]), int(p[1])))
            continue
        p = str(p)
        if p.lower() == "all" and n_layers is not None and n_heads is not None:
            heads.extend((l, h) for l in range(n_layers) for h in range(n_heads))
            continue
        m_layer = re.fullmatch(r"L(\d+)", p, re.IGNORECASE)
        if m_layer and n_heads is not None:
            heads.extend((int(m_layer.group(1)), h) for h in range(n_heads))
            continue
        m = _HEAD_RE.match(p)
        if not m:
            raise CELError(f"malformed head {p!r}: write heads as L<layer>H<head>, e.g. L0H6")
        heads.append((int(m.group(1)), int(m.group(2))))
    if n_layers is not None and n_heads is not None:
        for l, h in heads:
            if not (0 <= l < n_layers and 0 <= h < n_heads):
                raise CELError(f"head {head_name((l, h))} out of range: the model has {n_layers} layers "
                               f"x {n_heads} heads (L0H0..L{n_layers - 1}H{n_heads - 1})")
    # keep order, drop duplicates
    seen: set = set()
    return [h for h in heads if not (h in seen or seen.add(h))]


def check_head_spec(spec: str) -> None:
    """Syntax check of a head spec (``L0H6``, ``L3`` for a whole layer, ``all``) before any model is loaded."""
    for p in [p.strip() for p in spec.split(",") if p.strip()]:
        if not (p.lower() == "all" or re.fullmatch(r"L\d+(H\d+)?", p, re.IGNORECASE)):
            raise CELError(f"malformed head {p!r}: write heads as L<layer>H<head>, e.g. L0H6 (or L3, or all)")


def all_heads(lm) -> list[Head]:
    return [(l, h) for l in range(lm.n_layers) for h in range(lm.n_heads)]


@dataclass(frozen=True)
class Ablation:
    """How a head is removed: one of :data:`KINDS`, resolved once by every entry point that ablates.

    * ``zero``: the head's output set to 0;
    * ``mean``: set to its mean output ``means [n_layers, n_heads, d_head]`` (computed over the prompts being
      scored when not given: :meth:`resolved`) -- minus zero, the head's *constant* part;
    * ``constant``: set to fitted constants in ``means`` (the best constant of :mod:`cel_utils.robust`);
    * ``resample``: set to its output on another item's sequence of the same length (:func:`donors`, seeded by
      ``seed``; a sequence with no partner gets the ``means``) -- it keeps the head's constant part and removes
      what it reads from this item (two passes: :func:`cel_utils.engine.evaluate_head_sets` runs them);
    * ``scale``: the output multiplied by ``alpha`` (``alpha = 0`` is zero ablation, ``alpha = 1`` the intact
      model, ``alpha > 1`` boosts the head); with ``alphas`` (one factor per head set of an engine call) each set
      gets its own factor in one batched call (chapter 2b's dose curves); with ``head_alphas`` (``((layer, head,
      factor), ...)``) the heads named there get their own factor and the set's other heads ``alpha`` (chapter
      2b's "boost and remove together": ``alpha = 0`` removes, the boosted heads are named with their dose).

    :meth:`replacement` gives the removed value (the engine puts it where a head is masked, bit-identical
    elsewhere); :meth:`blend` moves each head part of the way (a gate or a mask in [0, 1]: the gates and the
    gradient screen). No other module writes a replacement.

    Example:
        >>> Ablation.of("zero")
        Ablation(mode='zero', means=None, alpha=0.0, seed=0, alphas=(), head_alphas=())
        >>> Ablation.of("scale", alpha=0.5).describe()
        'scale 0.5'
        >>> Ablation.of("median")
        Traceback (most recent call last):
        ...
        cel_utils.errors.CELError: unknown ablation mode 'median'; use one of zero, mean, resample, constant, scale
    """

    mode: str = "zero"
    means: torch.Tensor | None = None   # [n_layers, n_heads, d_head]: head means, fitted constants, or fallback
    alpha: float = 0.0                  # scale: the factor the output is multiplied by
    seed: int = 0                       # resample: the donors' permutation
    alphas: tuple = ()                  # scale: one factor per head set of an engine call (instead of alpha)
    head_alphas: tuple = ()             # scale: ((layer, head, factor), ...) for heads whose factor is not alpha

    def __post_init__(self):
        if self.mode not in KINDS:
            raise CELError(f"unknown ablation mode {self.mode!r}; use one of {', '.join(KINDS)}")
        if self.mode == "scale" and not np.isfinite([self.alpha, *self.alphas]).all():
            raise CELError(f"scale ablation needs finite factors, got {self.alpha!r}"
                           + (f" and per-set factors {list(self.alphas)!r}" if self.alphas else ""))
        if self.alphas and self.mode != "scale":
            raise CELError(f"per-set factors (alphas) are for scale ablation, not {self.mode}")
        if self.head_alphas and (self.mode != "scale" or self.alphas):
            raise CELError("per-head factors (head_alphas) are for scale ablation without per-set factors")
        if self.head_alphas and not np.isfinite([a for _, _, a in self.head_alphas]).all():
            raise CELError(f"scale ablation needs finite factors, got {self.head_alphas!r}")

    @classmethod
    def of(cls, mode: "str | Ablation" = "zero", means: torch.Tensor | None = None,
           alpha: float | None = None) -> "Ablation":
        if isinstance(mode, Ablation):
            return mode if means is None else replace(mode, means=means)
        if mode == "scale" and alpha is None:
            raise CELError("scale ablation needs alpha (the factor the head's output is multiplied by)")
        return cls(mode, means if mode in ("mean", "constant", "resample") else None,
                   float(alpha) if alpha is not None and mode == "scale" else 0.0)

    def describe(self) -> str:
        """The kind as a short name (``"scale 0.5"`` for a scale factor)."""
        if self.alphas:
            return "scale per set (" + ", ".join(f"{a:g}" for a in self.alphas) + ")"
        if self.head_alphas:
            return f"scale {self.alpha:g} (" + ", ".join(f"L{l}H{h} x{a:g}" for l, h, a in self.head_alphas) + ")"
        return f"scale {self.alpha:g}" if self.mode == "scale" else self.mode

    def resolved(self, lm, token_lists: Sequence[Sequence[int]]) -> "Ablation":
        """The same ablation with head means computed over ``token_lists`` when mean or resample mode has none yet
        (a ``constant`` ablation must be given its constants: they are fit, not computed here)."""
        if self.mode in ("mean", "resample") and self.means is None:
            return replace(self, means=compute_head_means(lm, token_lists))
        if self.mode == "constant" and self.means is None:
            raise CELError("constant ablation needs its fitted constants (cel_utils.robust.best_constant)")
        return self

    def fingerprint(self) -> dict:
        """What the numbers depend on beyond the mode (for cache keys): a hash of the means, alpha, the seed."""
        out = {}
        if self.means is not None:
            out["means"] = hashlib.sha256(self.means.detach().cpu().float().numpy().tobytes()).hexdigest()
        if self.mode == "scale":
            out["alpha"] = self.alpha
            if self.alphas:
                out["alphas"] = list(self.alphas)
            if self.head_alphas:
                out["head_alphas"] = [list(x) for x in self.head_alphas]
        if self.mode == "resample":
            out["seed"] = self.seed
        return out

    def replacement(self, z: torch.Tensor, layer: int) -> torch.Tensor:
        """The removed value of every head of ``layer`` for ``z [batch, pos, head, d_head]`` (broadcastable to it;
        the caller keeps the heads it does not remove). Not for ``resample`` (its value comes from a donor)."""
        if self.mode == "scale":
            if not self.head_alphas:
                return z * self.alpha
            f = torch.full((z.shape[2],), float(self.alpha))          # [head]: this layer's factor per head
            for l, h, a in self.head_alphas:
                if l == layer:
                    f[h] = float(a)
            return z * f.to(z)[None, None, :, None]
        if self.mode in ("mean", "constant"):
            return self.means[layer].to(device=z.device, dtype=z.dtype)[None, None]  # [1, 1, head, d_head]
        if self.mode == "resample":
            raise CELError("resample ablation replaces a head by a donor's output: evaluate it with the engine")
        return torch.zeros((), dtype=z.dtype, device=z.device)

    def blend(self, z: torch.Tensor, layer: int, keep: torch.Tensor) -> torch.Tensor:
        """Each head of ``layer`` moved part of the way to its removed value: ``keep [head]`` in [0, 1] (1: intact,
        0: removed), differentiable in ``keep`` (the gates' gate, the gradient screen's mask).
        ``z [batch, pos, head, d_head]``."""
        k = keep.to(z.dtype)[None, None, :, None]  # [1, 1, head, 1]
        if self.mode in ("mean", "constant"):
            mu = self.means[layer].to(z)[None, None]  # [1, 1, head, d_head]
            return mu + k * (z - mu)
        if self.mode == "scale":
            return z * (k + (1 - k) * self.alpha)
        if self.mode == "resample":
            raise CELError("resample ablation has no soft form: use zero, mean or scale for gates and gradients")
        return z * k


def donors(lengths: Sequence[int], seed: int = 0) -> np.ndarray:
    """For each sequence another sequence of the same length (a derangement within each length; a sequence with
    no partner of its length is its own donor, marked by the caller): ``[n]`` indices. Resample ablation's donors.

    Example:
        >>> d = donors([5, 5, 5, 7, 9, 9], seed=0)
        >>> bool(all(d[i] != i for i in (0, 1, 2, 4, 5))), int(d[3])
        (True, 3)
    """
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    out = np.arange(len(lengths))
    for L in np.unique(lengths):
        idx = np.flatnonzero(lengths == L)
        if len(idx) > 1:
            perm = rng.permutation(idx)
            out[perm] = np.roll(perm, 1)  # a cycle through the shuffled group: nobody is its own donor
    return out


class Resampler:
    """Resample ablation's two passes as hook points (:func:`cel_utils.hooks.hooked`): :meth:`keep` stores every
    sequence's clean outputs of the given layers, :meth:`patch` replaces a head set's outputs, at every position
    after the shared prompt prefix, by its donor's (:func:`donors`; the means where a sequence has none).
    ``lengths[i]``: sequence ``i``'s tokens after the prefix."""

    def __init__(self, ablation: Ablation, lengths: Sequence[int], layers: Iterable[int]):
        self.ablation, self.lengths = ablation, list(lengths)
        self.donor = donors(self.lengths, ablation.seed)
        self.stored: dict[int, dict[int, torch.Tensor]] = {l: {} for l in layers}  # layer -> seq -> [pos, head, d]

    def keep(self, seqs: Sequence[int]) -> list:
        def fn_for(l):
            def fn(z):  # [batch, pos, head, d_head]
                for r, i in enumerate(seqs):
                    self.stored[l][i] = z[r, :self.lengths[i]].detach().clone()
            return fn
        return [("z", l, fn_for(l)) for l in self.stored]

    def patch(self, heads: Sequence[Head]):
        """The points for one head set (a function of the batch's sequences, for
        :func:`cel_utils.engine.read_stats_with`)."""
        means = self.ablation.means

        def points(seqs):
            def fn_for(l):
                hs = [h for ll, h in heads if ll == l]

                def fn(z):
                    z = z.clone()
                    for r, i in enumerate(seqs):
                        d, T = int(self.donor[i]), self.lengths[i]
                        z[r, :T, hs] = (self.stored[l][d][:T, hs] if d != i else
                                        means[l, hs].to(z.dtype)[None].expand(T, -1, -1))
                    return z
                return fn
            return [("z", l, fn_for(l)) for l in sorted({l for l, _ in heads})]
        return points


class HeadAblator:
    """Hooks at the ``z`` point (:mod:`cel_utils.hooks`) of every layer; which heads they remove is set per forward.

    ``masks`` is a bool tensor ``[rows or 1, n_layers, n_heads]`` (True = ablate), so each batch row can
    carry its own head set. Rows not ablated in a layer are returned bit-identical (``torch.where``); the
    removed value is the :class:`Ablation`'s :meth:`~Ablation.replacement`.
    """

    def __init__(self, lm, ablation: "str | Ablation" = "zero"):
        ablation = Ablation.of(ablation)
        if ablation.mode in ("mean", "constant") and ablation.means is None:
            raise CELError(f"{ablation.mode} ablation needs head means or constants: see compute_head_means")
        if ablation.mode == "resample":
            raise CELError("resample ablation replaces a head by a donor's output: evaluate it with the engine")
        self.lm = lm
        self.ablation = ablation
        self.masks: torch.Tensor | None = None  # [rows, n_layers, n_heads]
        self.scales: torch.Tensor | None = None  # [rows]: per-row scale factors (scale ablation with alphas)
        self.layer_active: list[bool] = [False] * lm.n_layers
        self.hooks = None

    def set_masks(self, masks: torch.Tensor | None, scales: torch.Tensor | None = None) -> None:
        """``masks [rows or 1, n_layers, n_heads]``; ``scales [rows]``: scale ablation's factor per row (the
        ablation's ``alphas`` laid out like the rows), else the ablation's own replacement."""
        self.masks, self.scales = masks, scales
        if masks is None:
            self.layer_active = [False] * self.lm.n_layers
        else:
            self.layer_active = masks.any(dim=(0, 2)).tolist()

    def replace(self, layer: int):
        """The ``z`` hook function of ``layer``: the masked heads' outputs replaced."""

        def fn(z):  # [batch, pos, head, d_head]
            if not self.layer_active[layer]:
                return None
            b = z.shape[0]
            m = self.masks[:, layer]  # [rows, head]
            if m.shape[0] not in (1, b):
                raise RuntimeError(f"head mask has {m.shape[0]} rows for a batch of {b}")
            m = m.to(z.device)[:, None, :, None]  # [rows, 1, head, 1]
            if self.ablation.alphas and self.scales is None:
                raise CELError("per-set scale factors need the engine (evaluate_head_sets), not one head set")
            if self.scales is not None:         # [rows] -> [rows, 1, 1, 1]
                return torch.where(m, z * self.scales.to(z)[:, None, None, None], z)
            return torch.where(m, self.ablation.replacement(z, layer), z)

        return fn

    def attach(self) -> "HeadAblator":
        self.hooks = hooks.hooked(self.lm, [("z", l, self.replace(l)) for l in range(self.lm.n_layers)])
        self.hooks.__enter__()
        return self

    def detach(self) -> None:
        if self.hooks is not None:
            self.hooks.__exit__(None, None, None)
            self.hooks = None


def head_mask(lm, heads: Sequence[Head]) -> torch.Tensor:
    """Bool mask ``[1, n_layers, n_heads]`` for one head set."""
    m = torch.zeros(1, lm.n_layers, lm.n_heads, dtype=torch.bool)
    for l, h in parse_heads(heads, lm.n_layers, lm.n_heads):
        m[0, l, h] = True
    return m


def row_masks(lm, head_sets: Sequence[Sequence[Head]]) -> torch.Tensor:
    """Bool masks ``[len(head_sets), n_layers, n_heads]``: one head set per batch row."""
    return torch.cat([head_mask(lm, hs) for hs in head_sets], dim=0) if head_sets else \
        torch.zeros(0, lm.n_layers, lm.n_heads, dtype=torch.bool)


@contextmanager
def ablate_heads(lm, heads: Sequence[Head] | str = (), mode: "str | Ablation" = "zero",
                 per_row: Sequence[Sequence[Head]] | None = None):
    """Context manager: run ``lm.model`` with heads ablated (``mode``: a kind or an :class:`Ablation`); the model
    is always restored. Either one head set for every row (``heads``) or one per batch row (``per_row``).

    Example:
        >>> with ablate_heads(lm, "L14H8"):                 # doctest: +SKIP
        ...     logits = lm.model(**batch).logits
    """
    if isinstance(heads, str):
        heads = parse_heads(heads, lm.n_layers, lm.n_heads)
    ab = HeadAblator(lm, mode)
    ab.set_masks(row_masks(lm, per_row) if per_row is not None else head_mask(lm, heads))
    ab.attach()
    try:
        yield ab
    finally:
        ab.detach()


@torch.no_grad()
def compute_head_means(lm, token_lists: Sequence[Sequence[int]], batch_size: int = 16) -> torch.Tensor:
    """Mean of each head's output (o_proj input) over all positions of the given prompts.

    Returns ``[n_layers, n_heads, head_dim]``; used by ``mode="mean"``.
    """
    if not token_lists:
        raise CELError("mean ablation needs at least one reference prompt")
    sums = torch.zeros(lm.n_layers, lm.n_heads, lm.head_dim, dtype=torch.float64)
    count = 0
    current: dict = {}

    def add(layer):
        def fn(z):  # [batch, pos, head, d_head]
            x = z.detach().reshape(*z.shape[:2], -1)  # [batch, pos, head * d_head]: summed flat, as before
            keep = current["mask"].to(x.device)[..., None]  # [batch, pos, 1]
            sums[layer] += (x * keep).sum(dim=(0, 1)).double().view(z.shape[2], z.shape[3]).cpu()
        return fn

    with hooks.hooked(lm, [("z", l, add(l)) for l in range(lm.n_layers)]):
        for _, ids, att in hooks.padded_batches(lm, token_lists, batch_size):
            current["mask"] = att.float()
            lm.model(input_ids=ids, attention_mask=att, use_cache=False)
            count += int(att.sum())
    return (sums / count).float()
