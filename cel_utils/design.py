"""What every way of choosing and testing heads shares: the :class:`Design` of a run.

The split sizes, how many heads or sets are offered, the error rates of the confirm and held-out tests, the
ablation, the bootstrap and the seed are one frozen record. Each stage of the pipeline
(:mod:`cel_utils.pipeline`), the power simulation (:mod:`cel_utils.power`) and the Settings classes that choose and
test heads (the verdict's, the joint search's, the gates': they extend it) read them from here, so a design is
written once and passed as one value. The battery's settings (:class:`cel_utils.battery.RobustSettings`) do not
extend it: the battery tests sets chosen elsewhere and has no splits of its own to choose on.

Example:
    >>> d = Design(n_confirm=200, top_k=10)
    >>> d.fdr, d.with_(seed=3).seed, d.record()["mode"]
    (0.1, 3, 'zero')
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .defaults import ALPHA, CONFIRM_TOP_K, FDR, N_BOOT, N_CONFIRM, N_HELDOUT, N_SEARCH
from .errors import CELError


@dataclass(frozen=True)
class Design:
    """The shared parameters of a choose -> confirm -> held-out run (defaults from :mod:`cel_utils.defaults`)."""

    n_search: int = N_SEARCH      # items per split (clipped to what a split holds)
    n_confirm: int = N_CONFIRM
    n_heldout: int = N_HELDOUT
    top_k: int = CONFIRM_TOP_K    # single heads re-tested on the confirm split (the verdict)
    max_k: int = 3                # sets of size 1..max_k offered (the joint search, the gates, the selectors)
    fdr: float = FDR              # Benjamini-Hochberg over the sets offered, on the confirm split
    alpha: float = ALPHA          # Holm over the sets tested on held-out items; the CIs' level
    mode: object = "zero"         # a kind of cel_utils.ablation.Ablation, or one
    n_boot: int = N_BOOT
    seed: int = 0
    dtype: str | None = None      # the dtype every evaluation runs in (None: the model's own)

    def with_(self, **changes) -> "Design":
        """A copy with some fields changed (``dataclasses.replace``), checked."""
        out = replace(self, **changes)
        out.check()
        return out

    def check(self) -> None:
        """A :class:`~cel_utils.errors.CELError` naming the first value out of range."""
        if not self.fdr > 0 or not 0 < self.alpha < 1:
            raise CELError(f"fdr must be positive and alpha between 0 and 1, got {self.fdr}, {self.alpha}")
        if min(self.top_k, self.max_k) < 1:
            raise CELError(f"top_k and max_k must be at least 1, got {self.top_k}, {self.max_k}")
        if self.n_boot < 1:
            raise CELError(f"n_boot must be at least 1, got {self.n_boot}")

    def design(self) -> "Design":
        """The shared fields alone (a Settings class that extends :class:`Design` returns its design part)."""
        return Design(**{f.name: getattr(self, f.name) for f in fields(Design)})

    def record(self) -> dict:
        """The fields as JSON-ready values (the ablation by its kind's name; a scale with its alpha, "scale 1.5")."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        kind = getattr(self.mode, "mode", self.mode)
        out["mode"] = self.mode.describe() if kind == "scale" and hasattr(self.mode, "describe") else kind
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
