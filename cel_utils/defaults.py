"""Defaults in one place: every function, the CLI help and the rule texts read them from here.

Example:
    >>> from cel_utils import defaults
    >>> defaults.N_BOOT, defaults.FDR
    (2000, 0.1)
"""

import os

# Engine: padded tokens per forward pass (bounds memory). The gradient screen keeps activations for the
# backward pass, so it takes half as many tokens per batch.
MAX_TOKENS = 8192
# Result cache: lists of at most this many head sets (confirm, held-out, selectors) are also cached set by set, so a
# later chapter evaluating a set again in another list reads it back (the screens' long lists are cached whole only)
PER_SET_MAX = 16
GRADIENT_MAX_TOKENS = 4096
SCREEN_CHUNK_LAYERS = 6  # a screen is computed and cached this many layers at a time (a killed screen resumes)

# Screens on a Ray cluster (cel screen --ray): the optional extra and the version it pins
RAY_VERSION = "2.60.0"
CLUSTER_INSTALL = "pip install -e '.[cluster]'"

# The verdict's splits (chapter 1a and cel verdict)
N_SEARCH = 32        # items on which every head is screened
N_CONFIRM = 250      # items on which the top heads are re-tested
N_HELDOUT = 200      # items for the final test of what was confirmed

# Statistics over items
N_BOOT = 2000        # bootstrap resamples
ALPHA = 0.05         # two-sided level of the confidence intervals (95%)
FDR = 0.10           # false-discovery rate of the candidate rule and of confirmation (Benjamini-Hochberg)
CONFIRM_TOP_K = 5    # heads, ranked on the search split, re-tested on the confirm split
POWER = 0.80         # power at which minimum detectable gains are stated
POWER_GAIN = 0.10    # the gain at which the power of the whole pipeline is stated
POWER_SIMS = 2000    # simulations of the whole pipeline per (model, task) (cel_utils.power)

# Joint search
TIE_BREAK = 1e-3     # weight of the mean margin in a set's search score (orders sets with equal accuracy)
POOL_MAX = 10        # largest pool whose 2^m subsets the joint search evaluates
SEARCH_POOL_MAX = 12  # largest pool `cel search` accepts (its strategies evaluate far fewer than 2^m sets)
EXPLORER_POOL_MAX = 8  # largest pool the kernel-free explorer embeds (2^8 subsets per page)
RANDOM_SETS = 100    # random head sets per size in the plain random-set control
RANDOM_POOLS = 5     # random pools put through the whole joint pipeline (the selection-aware control)
BEAM_WIDTH = 3

# Learned head gates (cel_utils.gates): one hard-concrete gate per head, trained on the search split
GATE_STEPS = 30          # Adam steps, each one forward and one backward over GATE_BATCH search items
GATE_LR = 0.2            # Adam's learning rate on the gates' log-alphas
GATE_PENALTIES = (0.05,)  # penalty per expected head removed (a removal must raise the mean margin by this, in
                         # nats, to pay for itself); one training run per value
GATE_TEMPERATURE = 2 / 3  # hard-concrete temperature beta (Louizos et al. 2018; Voita et al. 2019)
GATE_INITS = (3.0, 0.0)  # initial log-alpha of every gate, one run per value (and penalty), the search split's
                         # score picking at each size. 3: P(removed) = 0.010, the intact model, where the gradient
                         # sees heads that help alone (from 0 alone, 40 steps on SmolLM2's agreement_rc ranked L0H0
                         # first, a head whose removal costs 0.2 accuracy; from 3, L0H7, the screen's best head);
                         # 0: P(removed) = 0.17, where a pair that helps only together is seen (tests/test_gates.py)
GATE_BATCH = 32          # search items per step (the whole default search split)
GATE_MAX_K = 10          # one learned set per size k = 1..GATE_MAX_K
SELECTOR_RANDOM_SETS = 3  # random rankings: the random selector and the gates' selection-aware control
SELECTOR_SWEEP_MAX = 256  # compare_selectors' pool search: every subset up to this many, else a beam search

# Is it a capability? (chapter 1c, cel robust)
BOOST_ALPHAS = (1.25, 1.5, 2.0)   # the boost selector's doses (chosen on the search split; 1 is the intact model)
TEXT_TOKENS = 20000     # tokens of general English text on which the change in NLL per token is measured
COLLATERAL_NLL = 0.05   # a change in NLL per token above this (nats) counts as costly
ROBUST_ITEMS = 200      # held-out items per check
NO_EFFECT = 0.05        # a set whose gain's CI lies below this (accuracy) is labelled "no effect"
ROOM = 0.05             # a format counts for transfer when its unablated accuracy lies in [ROOM, 1 - ROOM]
OC_TARGET_CAPABILITY = 0.8   # the label rule's target: P(capability | a true capability of gain POWER_GAIN) at least this
OC_TARGET_NULL = 0.05        # and P(capability | a head with no effect) at most this
OC_SIMS = 200           # planted truths per (pair, truth) in the labels' operating characteristics
LABEL_FIRM = 0.8       # a label read again on at least this share of item resamples is firm; below it, weak
LABEL_BOOT = 200        # item resamples behind each label's bootstrap distribution
CONSTANT_STEPS = 5      # gradient rounds of the best-constant ablation (fit on the search split)

# Chapter 3's toy model: a change in task A's population loss smaller than this (in magnitude) is "no effect"
THEORY_EFFECT = 0.01
# Chapter 3's data: each task's correlation of a token's sign with the answer, per token type (A, B, C, D), and
# the distractors (type D) per sequence; the toy (cel_utils.theory.Setup) and its tokens (tasks toy_a, toy_b)
TOY_RHO = {"toy_a": (0.8, 0.0, 0.5, 0.0), "toy_b": (0.0, 0.4, -0.8, 0.0)}
TOY_DISTRACTORS = 15
# Chapter 3a's trained transformer: a change in accuracy on its evaluation sequences smaller than this is "no effect"
TOYNET_EFFECT = 0.02
TOYNET_STEPS = 600      # its Adam steps (cel toy-train --steps, toynet.train)

# Approximate screens
GRADIENT_FORWARD_EQUIVALENTS = 3.0  # one forward and one backward (a backward costs about two forwards)
LASSO_CV = 5                        # compressed sensing: folds, grid size and iteration cap of LassoCV
LASSO_N_ALPHAS = 30
LASSO_MAX_ITER = 20000


def candidate_rule(fdr: float = FDR) -> str:
    """The candidate rule as the CLI and the book state it.

    Example:
        >>> candidate_rule(0.1)[:40]
        'delta_accuracy > 0 and q_value < 0.1 (ex'
    """
    return (f"delta_accuracy > 0 and q_value < {fdr:g} (exact McNemar test on fixes and breaks, "
            "Benjamini-Hochberg over screened heads) and margin_ci_low > 0")


def static_book() -> bool:
    """Whether the chapters are being executed for the static book (``CEL_STATIC_BOOK=1``, set by
    ``cel_utils.book.execute``): then a live ipywidgets grid, which needs a kernel to react, is replaced by a note."""
    return os.environ.get("CEL_STATIC_BOOK", "") == "1"


def progress_enabled(progress: bool = True) -> bool:
    """Whether to draw a progress bar: ``progress``, unless ``CEL_PROGRESS=0`` (set while the book's chapters
    are executed, so that no bar is left in the rendered pages; a live notebook still shows them)."""
    return bool(progress) and os.environ.get("CEL_PROGRESS", "1") != "0"

# Tasks with room (cel_utils.calibration, cel calibrate, chapter 1a): a variant is used when the unablated model's
# accuracy on its first CALIBRATION_ITEMS search items lies in CALIBRATION_BAND (read before any head is screened)
CALIBRATION_BAND = (0.25, 0.75)
CALIBRATION_ITEMS = 32
ROOM_BAND = (0.2, 0.8)   # a verdict pair "has room" when its confirm baseline lies here
