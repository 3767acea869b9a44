"""lm-evaluation-harness with heads removed: the lm-eval model type ``cel``.

lm-eval's ``steered`` model adds or clamps a vector on a module's output; it cannot remove a head, whose slice
must be taken at the output projection's *input*, per query head. :class:`CELLM` is lm-eval's own HF model
(``HFLM``) on a model loaded by :func:`cel_utils.models.load_model` (a built-in name, a local folder or a cached
Hugging Face id), and each of its forward passes runs with the heads removed by the book's hooks
(:func:`cel_utils.ablation.ablate_heads`), so log-likelihoods, multiple choice and generation all see the
ablated model. Importing this module registers the type. lm-eval 0.4.13's command line only knows the model
types it ships (it reads no plugin entry point), so ``cel lm-eval`` runs lm-eval's command line with ``cel``
registered (every argument is lm-eval's own)::

    cel lm-eval --model cel --model_args model=smollm2-135m,heads=L14H8,mode=zero --tasks my_task \\
        --include_path my_tasks/

``model_args``: ``model`` (default smollm2-135m), ``heads`` (``L14H8`` or ``L0H7+L11H6``: ``+`` between heads,
since lm-eval splits model_args at commas; empty = the intact model), ``mode`` (``zero``, ``scale`` with
``alpha``, ``mean`` with ``means_task``: the task whose search-split prompts give the head means), ``dtype``
(float32), ``batch_size``. ``resample`` is refused: its donors pair items of one batch, and lm-eval's batches
are not the book's items. In Python: ``import cel_utils.lm_eval_model`` and then
``lm_eval.simple_evaluate(model="cel", model_args="model=smollm2-135m,heads=L14H8")``.

    >>> parse_model_args(heads="L1H2+L3H4", mode="scale", alpha="0.5")["heads"]
    [(1, 2), (3, 4)]
    >>> parse_model_args(mode="resample")
    Traceback (most recent call last):
    ...
    cel_utils.errors.CELError: lm-eval's model type cel takes mode zero, mean (with means_task) or scale (with alpha); resample pairs the book's items within a batch, which lm-eval's batches are not
"""
from __future__ import annotations

import sys

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from .ablation import Ablation, ablate_heads, parse_set
from .errors import CELError
from .export import task_means
from .models import load_model

MODES = ("zero", "mean", "scale")


def parse_model_args(heads: str = "", mode: str = "zero", alpha: str | float | None = None,
                     means_task: str | None = None) -> dict:
    """The ablation part of ``model_args``, checked before any model is loaded (one-line errors)."""
    if mode not in MODES:
        raise CELError("lm-eval's model type cel takes mode zero, mean (with means_task) or scale (with alpha); "
                       "resample pairs the book's items within a batch, which lm-eval's batches are not")
    if (mode == "scale") != (alpha is not None):
        raise CELError("alpha goes with mode=scale (the factor the heads' output is multiplied by)")
    if (mode == "mean") != (means_task is not None):
        raise CELError("means_task goes with mode=mean (the task whose search-split prompts give the head means)")
    return {"heads": parse_set(str(heads)) if heads else [], "mode": mode,
            "alpha": None if alpha is None else float(alpha), "means_task": means_task}


@register_model("cel")
class CELLM(HFLM):
    """lm-eval's HF model with heads removed in every forward pass (see the module docstring).

    Example:
        >>> import lm_eval                                                          # doctest: +SKIP
        >>> lm_eval.simple_evaluate(model="cel", model_args="model=smollm2-135m,heads=L14H8", tasks=[...])  # doctest: +SKIP
    """

    def __init__(self, model: str = "smollm2-135m", heads: str = "", mode: str = "zero",
                 alpha: str | float | None = None, means_task: str | None = None, dtype: str = "float32",
                 **kwargs):
        spec = parse_model_args(heads, mode, alpha, means_task)
        self.cel_lm = load_model(model, dtype=dtype)
        lm = self.cel_lm
        bad = [h for h in spec["heads"] if not (0 <= h[0] < lm.n_layers and 0 <= h[1] < lm.n_heads)]
        if bad:
            raise CELError(f"head L{bad[0][0]}H{bad[0][1]} out of range: {model} has {lm.n_layers} layers x "
                           f"{lm.n_heads} heads")
        means = task_means(lm, means_task) if mode == "mean" else None
        self.cel_heads = spec["heads"]
        self.cel_ablation = Ablation.of(mode, means=means, alpha=spec["alpha"])
        kwargs.setdefault("device", "cpu")
        super().__init__(pretrained=lm.model, tokenizer=lm.tokenizer, **kwargs)

    def _model_call(self, inps, attn_mask=None, labels=None):
        with ablate_heads(self.cel_lm, self.cel_heads, self.cel_ablation):
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        with ablate_heads(self.cel_lm, self.cel_heads, self.cel_ablation):
            return super()._model_generate(context, max_length, stop, **generation_kwargs)


def run_cli(argv: list[str]) -> int:
    """lm-eval's own command line (``lm_eval ...``) with the model type ``cel`` registered."""
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm_eval", *argv]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0
