"""Conflict or noise? Chapter 3a's test of the book's explanation against its rival.

Chapter 3 explains a helpful removal by a *conflicting feature* that training concentrates in one head. The rival
account is *noise*: softmax attention must put its weight somewhere, so a head that has nothing to add still
writes something. The two predict different things:

* **conflict**: removal raises task A and lowers task B (a two-sided trade-off), and that survives when heads
  can abstain;
* **noise**: removal helps without a trade-off, and the gain vanishes once heads can output about zero.

Here the toy of :mod:`cel_utils.theory` is trained with three kinds of heads (:data:`VARIANTS`): softmax (the
book's), softmax-1 (one more zero logit: a head can attend to nothing) and a learned per-head output gate
(``sigmoid(g_h)`` times the head's output), on a setting with a conflicting feature (:data:`SETTINGS`) and one
without; :func:`outcomes` classifies every run and :func:`summary` gives each cell's shares with exact CIs.
:func:`signature` asks the same question of the real models' screens (chapter 1a): does removing a head move
two tasks in opposite directions more often than random pairs of heads do?

Example:
    >>> r = train_variant("softmax1", n_heads=3, sigma=0.3, seeds=range(2), steps=50)
    >>> bool(outcomes(r).kind.isin(["two-sided", "one-sided", "none"]).all())
    True
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy.stats import binomtest

from . import profiling
from .defaults import THEORY_EFFECT
from .theory import DEFAULT, Run, Setup, descend, stacked_params

NO_CONFLICT = Setup(rho_a=(0.8, 0.0, 0.0, 0.0), rho_b=(0.0, 0.4, 0.0, 0.0))   # C carries nothing for either task
SETTINGS = {"conflict": DEFAULT, "no conflict": NO_CONFLICT}
VARIANTS = ("softmax", "softmax1", "gated")
KINDS = ("two-sided", "one-sided", "none")


@profiling.timed
def train_variant(variant: str, n_heads: int = 4, sigma: float = 1e-4, seeds=range(20), steps: int = 4000,
                  lr: float = 0.5, setup: Setup = DEFAULT) -> Run:
    """The toy trained with heads of kind ``variant`` (:data:`VARIANTS`), one run per seed (the same initial
    ``a``, ``b`` and scores as :func:`cel_utils.theory.train` for that seed; a gate starts at 0, i.e. 1/2)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    seeds = list(seeds)
    P = stacked_params(n_heads, [sigma] * len(seeds), seeds)
    P.attention = "softmax1" if variant == "softmax1" else "softmax"
    names = ["a", "theta", "b"]
    if variant == "gated":
        P.gate = torch.zeros(len(seeds), n_heads, dtype=torch.float64)
        names.append("gate")
    return descend(P, names, setup, steps, lr, record_every=steps,
                   meta={"n_heads": n_heads, "sigma": np.full(len(seeds), float(sigma)), "seeds": seeds})


def kind_of(gain_a, change_b, eps: float = THEORY_EFFECT) -> np.ndarray:
    """What a removal does to two tasks, each change signed so that positive is better (a gain in accuracy, a
    fall in loss): ``two-sided`` (A gains more than ``eps`` and B loses more than ``eps``: the conflict
    account's trade-off), ``one-sided`` (A gains, B does not lose: the noise account's free gain) or ``none``.

        >>> kind_of([0.1, 0.1, 0.0], [-0.1, 0.0, -0.1], eps=0.02).tolist()
        ['two-sided', 'one-sided', 'none']
    """
    gain_a, change_b = np.asarray(gain_a), np.asarray(change_b)
    return np.where(gain_a > eps, np.where(change_b < -eps, "two-sided", "one-sided"), "none")


def outcomes(run: Run, eps: float = THEORY_EFFECT) -> pd.DataFrame:
    """One row per run: the head whose removal lowers task A's loss most, its changes on both tasks, and the
    run's ``kind``: ``two-sided`` (A's loss falls by more than ``eps`` and B's rises by more than ``eps``),
    ``one-sided`` (A's falls, B's does not rise), ``none`` (no removal lowers A's loss by ``eps``); with the share
    of the run's heads whose removal lowers *both* losses (``heads_help_both``, the noise account's heads)."""
    rows = []
    for r in range(len(run.seeds)):
        abl = pd.DataFrame(run.ablation(r))
        best = abl.loc[abl.delta_loss_a.idxmin()]
        kind = str(kind_of(-best.delta_loss_a, -best.delta_loss_b, eps))   # a fall in loss is the gain
        both = ((abl.delta_loss_a < -eps) & (abl.delta_loss_b < -eps)).mean()
        rows.append({"seed": run.seeds[r], "c_share": float(run.c_shares[r]), "gap": float(run.gaps[r]),
                     "best_head": int(best["head"]), "delta_loss_a": float(best.delta_loss_a),
                     "delta_loss_b": float(best.delta_loss_b), "delta_acc_a": float(best.delta_acc_a),
                     "delta_acc_b": float(best.delta_acc_b), "kind": kind, "heads_help_both": float(both)})
    return pd.DataFrame(rows)


def share_ci(k: int, n: int) -> tuple[float, float, float]:
    """A share with its exact (Clopper-Pearson) 95% CI (``scipy.stats.binomtest``).

        >>> share_ci(10, 20)[0], round(share_ci(10, 20)[1], 3)
        (0.5, 0.272)
    """
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    ci = binomtest(int(k), int(n)).proportion_ci(0.95, method="exact")
    return k / n, float(ci.low), float(ci.high)


def reading(low: float, high: float, want_high: bool = True) -> str:
    """A prediction about a share, read from its CI: ``met`` when the CI lies on the predicted side of one half,
    ``not met`` when it lies on the other side, else ``cannot tell``.

        >>> reading(0.6, 0.9), reading(0.6, 0.9, want_high=False), reading(0.3, 0.7)
        ('met', 'not met', 'cannot tell')
    """
    if low > 0.5:
        return "met" if want_high else "not met"
    if high < 0.5:
        return "not met" if want_high else "met"
    return "cannot tell"


@profiling.timed
def summary(sigmas=(1e-4, 1.0), n_seeds: int = 20, steps: int = 4000, n_heads: int = 4, lr: float = 0.5) -> tuple:
    """Every (setting, variant, sigma) cell over ``n_seeds`` runs: ``table`` (C-share, the share of runs of each
    kind with exact CIs, the best removal's mean change in A's and B's accuracy, the share of heads helping both
    tasks) and ``runs`` (every run's :func:`outcomes` row with its cell)."""
    rows, runs = [], []
    for setting, setup in SETTINGS.items():
        for variant in VARIANTS:
            for sigma in sigmas:
                o = outcomes(train_variant(variant, n_heads, sigma, range(n_seeds), steps, lr, setup))
                runs.append(o.assign(setting=setting, variant=variant, sigma=sigma))
                row = {"setting": setting, "variant": variant, "sigma": sigma, "runs": len(o),
                       "c_share": float(o.c_share.mean()), "max_gap": float(o.gap.max())}
                for kind in KINDS:
                    s, lo, hi = share_ci(int((o.kind == kind).sum()), len(o))
                    key = kind.replace("-", "_")
                    row.update({key: s, f"{key}_low": lo, f"{key}_high": hi})
                row.update({"delta_acc_a": float(o.delta_acc_a.mean()), "delta_acc_b": float(o.delta_acc_b.mean()),
                            "heads_help_both": float(o.heads_help_both.mean())})
                rows.append(row)
    return pd.DataFrame(rows), pd.concat(runs, ignore_index=True)


def predictions(table: pd.DataFrame) -> pd.DataFrame:
    """Per setting and sigma, each account's prediction read from the cells' CIs (:func:`reading`): conflict,
    a two-sided trade-off in most runs under every variant; noise, one-sided gains in most softmax runs that are
    gone (fewer than half the runs) with softmax-1 and with gates."""
    rows = []
    for (setting, sigma), g in table.groupby(["setting", "sigma"], sort=False):
        g = g.set_index("variant")
        conflict = [reading(g.loc[v, "two_sided_low"], g.loc[v, "two_sided_high"]) for v in VARIANTS]
        noise = [reading(g.loc["softmax", "one_sided_low"], g.loc["softmax", "one_sided_high"])] + [
            reading(g.loc[v, "one_sided_low"], g.loc[v, "one_sided_high"], want_high=False) for v in VARIANTS[1:]]
        rows.append({"setting": setting, "sigma": sigma, "conflict": combine(conflict), "noise": combine(noise),
                     "conflict_parts": ", ".join(conflict), "noise_parts": ", ".join(noise)})
    return pd.DataFrame(rows)


def combine(parts: list[str]) -> str:
    """All parts met: ``met``; any not met: ``not met``; else ``cannot tell``."""
    return "met" if all(p == "met" for p in parts) else "not met" if "not met" in parts else "cannot tell"


@profiling.timed
def signature(landscape: pd.DataFrame, n_perm: int = 2000, seed: int = 0, excess: float = 0.10,
              confirmed: dict | None = None) -> pd.DataFrame:
    """The real models' version: per model and unordered task pair, over every screened head, the share whose
    removal moves the two tasks' margins in opposite directions, against random pairs of heads (the second task's
    column permuted over heads, ``n_perm`` times): the null's mean and 95% range, one-sided permutation p-values
    for more opposite moves (conflict) and for fewer (same-direction moves: a head that only adds noise helps, or
    hurts, every task), and the power to see an ``excess`` of opposite moves at the 5% level (approximated by
    the null shifted by the excess).

    ``landscape``: one row per (model, task, head) with ``delta_margin`` (:meth:`cel_utils.records.Records.landscape`).
    ``confirmed``: ``{(model, task): confirmed heads}`` (chapter 1a's verdicts); with it, the excess the confirmed
    heads could produce (``realistic_excess``: each confirmed head of either task, were it a two-sided mover,
    turns a move that is opposite with the null's probability into a sure one, so it adds ``(1 - null mean) /
    heads``) and the test's power there (``power_realistic``): an excess of 0.10 needs far more movers than the
    confirmed heads.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for model, g in landscape.groupby("model", sort=False):
        wide = g.pivot_table(index="head", columns="task", values="delta_margin", sort=False).dropna()
        tasks = list(wide.columns)
        for i, ta in enumerate(tasks):
            for tb in tasks[i + 1:]:
                a, b = np.sign(wide[ta].to_numpy()), np.sign(wide[tb].to_numpy())
                obs = float((a * b < 0).mean())
                null = np.array([(a * rng.permutation(b) < 0).mean() for _ in range(n_perm)])
                thr = np.quantile(null, 0.95)
                rows.append({"model": model, "task_a": ta, "task_b": tb, "heads": len(a), "opposite": obs,
                             "null_mean": float(null.mean()), "null_low": float(np.quantile(null, 0.025)),
                             "null_high": float(np.quantile(null, 0.975)),
                             "p_more_opposite": float((1 + (null >= obs).sum()) / (n_perm + 1)),
                             "p_more_same": float((1 + (null <= obs).sum()) / (n_perm + 1)),
                             "power_excess": float((null + excess > thr).mean())})
                if confirmed is not None:
                    k = len(set(confirmed.get((model, ta), ())) | set(confirmed.get((model, tb), ())))
                    real = k * (1 - float(null.mean())) / len(a)
                    rows[-1].update(confirmed_heads=k, realistic_excess=real,
                                    power_realistic=float((null + real > thr).mean()))
    return pd.DataFrame(rows)
