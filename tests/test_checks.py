"""The exercise checks (cel_utils.checks): each passes on the library's own function and on an independent
correct implementation written here, and fails, with a message that names the mistake, on a subtly wrong one."""

from math import comb

import numpy as np
import pandas as pd
import pytest
import torch

from cel_utils import checks
from cel_utils.ablation import ablate_heads, head_name
from cel_utils.dynamics import rates
from cel_utils.screening import plain_screen
from cel_utils.stats import fixes_breaks, mcnemar_exact
from cel_utils.theory import joint_loss


# ---------------------------------------------------------------------------------------------------------
# check_ablation
# ---------------------------------------------------------------------------------------------------------
def library_ablate(lm, input_ids, heads):
    with ablate_heads(lm, heads):
        return lm.model(input_ids=input_ids).logits


def weight_ablate(lm, input_ids, heads):
    """Independent: zero the heads' columns of the output projection's weight, run, restore (no hooks)."""
    D = lm.head_dim
    saved = {l: lm.out_proj(l).weight.detach().clone() for l, _ in heads}
    try:
        with torch.no_grad():
            for l, h in heads:
                w = lm.out_proj(l).weight  # Linear: [out, in], the input is the concatenated heads
                w[:, h * D:(h + 1) * D] = 0
            return lm.model(input_ids=input_ids).logits
    finally:
        with torch.no_grad():
            for l, w in saved.items():
                lm.out_proj(l).weight.copy_(w)


def hook_ablate(lm, input_ids, heads, width=None, group=1, keep_hooks=False):
    """A forward pre-hook on each output projection zeroing slices of its input; ``width`` (the slice width,
    default ``lm.head_dim``) and ``group`` (how many neighbouring query heads go with each) make it wrong."""
    D = width or lm.head_dim

    def pre(layer):
        def hook(module, args):
            x = args[0].clone()
            for l, h in heads:
                if l == layer:
                    first = h // group * group
                    x[..., first * D:(first + group) * D] = 0
            return (x,) + args[1:]
        return hook

    handles = [lm.out_proj(l).register_forward_pre_hook(pre(l)) for l in range(lm.n_layers)]
    try:
        return lm.model(input_ids=input_ids).logits
    finally:
        if not keep_hooks:
            for h in handles:
                h.remove()


def after_o_proj_with_bias(lm, input_ids, heads):
    """Wrong: subtract the head's term after the projection, computed with the bias (which belongs to no head)."""
    D = lm.head_dim

    def post(layer):
        def hook(module, args, out):
            for l, h in heads:
                if l == layer:
                    x = args[0][..., h * D:(h + 1) * D]
                    out = out - torch.nn.functional.linear(x, module.weight[:, h * D:(h + 1) * D], module.bias)
            return out
        return hook

    handles = [lm.out_proj(l).register_forward_hook(post(l)) for l in range(lm.n_layers)]
    try:
        return lm.model(input_ids=input_ids).logits
    finally:
        for h in handles:
            h.remove()


def wrong_head(lm, input_ids, heads):
    return hook_ablate(lm, input_ids, [(l, (h + 1) % lm.n_heads) for l, h in heads])


def hidden_over_heads(lm, input_ids, heads):
    return hook_ablate(lm, input_ids, heads, width=lm.model.config.hidden_size // lm.n_heads)


def kv_group(lm, input_ids, heads):
    return hook_ablate(lm, input_ids, heads, group=lm.n_heads // lm.n_kv_heads)


def leaves_hook(lm, input_ids, heads):
    return hook_ablate(lm, input_ids, heads, keep_hooks=True)


@pytest.mark.parametrize("fn", [library_ablate, weight_ablate, hook_ablate])
def test_check_ablation_passes(fn, capsys):
    checks.check_ablation(fn)
    assert "check_ablation passed: 15 head sets on tiny-llama, tiny-gemma3, tiny-gpt_neox" in capsys.readouterr().out


@pytest.mark.parametrize("fn, says", [
    (wrong_head, r"L0H0 on tiny-llama.*match removing L0H1 instead"),
    (after_o_proj_with_bias, r"tiny-gpt_neox.*\*and the bias\*"),
    (hidden_over_heads, r"tiny-gemma3.*width hidden_size / n_heads = 12"),
    (kv_group, r"tiny-llama.*every query head that shares the key/value head \(L0H0,L0H1\)"),
    (leaves_hook, r"unablated output changed.*remove your hooks"),
])
def test_check_ablation_fails_on_a_subtle_mistake(fn, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_ablation(fn)


def test_the_tiny_models_set_each_trap():
    """Each trap is live: the ablation moves the logits, and the wrong variants differ from it on their model."""
    ids = torch.randint(2, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    _each_trap(ids)   # one torch thread, as every tiny-model test (conftest.one_thread_for_tiny_models)
    state = torch.get_rng_state()
    checks.tiny_lm("llama")
    assert torch.equal(torch.get_rng_state(), state)  # building a model leaves the global random state alone


def _each_trap(ids):
    for family, wrong in (("llama", kv_group), ("gemma3", hidden_over_heads), ("gpt_neox", after_o_proj_with_bias)):
        lm = checks.tiny_lm(family)
        with torch.no_grad():
            base, ref, bad = (f(lm, ids, [(0, 0)]) for f in (lambda *a: library_ablate(a[0], a[1], []),
                                                              library_ablate, wrong))
        assert (ref - base).abs().max() > 0.1 and (bad - ref).abs().max() > 0.1, family


# ---------------------------------------------------------------------------------------------------------
# check_screen
# ---------------------------------------------------------------------------------------------------------
def library_screen(lm, task, heads):
    return plain_screen(lm, task, heads=heads, progress=False).table


def own_screen(lm, task, heads, cumulative=False):
    """Independent: the items' choice log-probabilities from full forwards, heads removed by zeroing weights."""
    tok, D = lm.tokenizer, lm.head_dim

    def outcomes():
        correct, margin = [], []
        for it in task.items:
            scores = []
            for choice in it["choices"]:
                ctx = tok(it["prompt"])["input_ids"]
                whole = tok(it["prompt"] + choice)["input_ids"]
                with torch.no_grad():
                    lp = torch.log_softmax(lm.model(input_ids=torch.tensor([whole])).logits[0].float(), -1)
                scores.append(sum(float(lp[p - 1, whole[p]]) for p in range(len(ctx), len(whole))))
            m = scores[it["answer"]] - max(s for j, s in enumerate(scores) if j != it["answer"])
            correct.append(m > 0)
            margin.append(m)
        return np.mean(correct), np.mean(margin)

    acc0, m0 = outcomes()
    rows, removed = [], []
    for head in heads:
        removed = removed + [head] if cumulative else [head]
        saved = {l: lm.out_proj(l).weight.detach().clone() for l, _ in removed}
        with torch.no_grad():
            for l, h in removed:
                lm.out_proj(l).weight[:, h * D:(h + 1) * D] = 0
        try:
            acc, m = outcomes()
        finally:
            with torch.no_grad():
                for l, w in saved.items():
                    lm.out_proj(l).weight.copy_(w)
        rows.append({"head": head, "delta_accuracy": acc - acc0, "delta_margin": m - m0})
    return pd.DataFrame(rows)


def ablated_values(lm, task, heads):
    """Wrong: the ablated accuracy and margin, not their change."""
    t = library_screen(lm, task, heads)
    return {"delta_accuracy": t["accuracy"].tolist(), "delta_margin": t["mean_margin"].tolist()}


@pytest.mark.parametrize("fn", [library_screen, own_screen])
def test_check_screen_passes(fn, capsys):
    checks.check_screen(fn)
    assert "check_screen passed: 5 heads on tiny-llama, 12 items" in capsys.readouterr().out


@pytest.mark.parametrize("fn, says", [
    (lambda lm, task, heads: own_screen(lm, task, heads, cumulative=True), r"match removing the heads cumulatively"),
    (ablated_values, r"the ablated values themselves"),
    (lambda lm, task, heads: library_screen(lm, task, heads[::-1]), r"keep the order"),
])
def test_check_screen_fails_on_a_subtle_mistake(fn, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_screen(fn)


# ---------------------------------------------------------------------------------------------------------
# check_mcnemar
# ---------------------------------------------------------------------------------------------------------
def library_mcnemar(base, ablated):
    return mcnemar_exact(*fixes_breaks(base, ablated))[0]


def own_mcnemar(base, ablated, sides=2, over="flips"):
    """Independent: binomial tails by hand; ``sides=1`` and ``over="items"`` are the wrong variants."""
    f, b = int(np.sum(~base & ablated)), int(np.sum(base & ~ablated))
    n = f + b if over == "flips" else len(base)
    if n == 0:
        return 1.0
    tail = lambda k: sum(comb(n, j) for j in range(k, n + 1)) / 2 ** n  # noqa: E731 (P(X >= k), X ~ Bin(n, 1/2))
    return tail(f) if sides == 1 else min(1.0, 2 * tail(max(f, n - f)))


@pytest.mark.parametrize("fn", [library_mcnemar, own_mcnemar])
def test_check_mcnemar_passes(fn, capsys):
    checks.check_mcnemar(fn)
    assert "check_mcnemar passed: 9 cases" in capsys.readouterr().out


@pytest.mark.parametrize("fn, says", [
    (lambda b, a: own_mcnemar(b, a, sides=1), r"one-sided \(towards more fixes\)"),
    (lambda b, a: own_mcnemar(b, a, over="items"), r"only the items that flip count"),
    (lambda b, a: 2 * own_mcnemar(b, a, sides=1) if (a != b).any() else 1.0, r"0 fixes, 5 breaks.*A p-value is at most 1"),
])
def test_check_mcnemar_fails_on_a_subtle_mistake(fn, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_mcnemar(fn)


# ---------------------------------------------------------------------------------------------------------
# check_rates
# ---------------------------------------------------------------------------------------------------------
def own_rates(setup, lr, r_factor=1.0, first_order=False):
    """Independent: r by the formula; mu from torch autograd of the joint loss at the plateau, itself the
    minimiser of that quadratic over (W_A, W_B) found by one Newton step from zero."""
    c, rho = setup.counts, setup.rho
    r = r_factor * float((c * rho.sum(0)).sum() / c.sum())

    def loss_ab(w):
        return joint_loss(torch.cat([w, torch.zeros(2, dtype=w.dtype)]), setup)

    w0 = torch.zeros(2, dtype=torch.float64)
    g0 = torch.autograd.functional.jacobian(loss_ab, w0)
    hess = torch.autograd.functional.hessian(loss_ab, w0)
    w_pl = torch.cat([w0 - torch.linalg.solve(hess, g0), torch.zeros(2, dtype=torch.float64)])
    grad = torch.autograd.functional.jacobian(lambda w: joint_loss(w, setup), w_pl)
    mu = float(grad.sum() / c.sum())  # a uniform head gives each of the N tokens 1/N (per-token weights)
    lam1 = lr * r if first_order else np.log1p(lr * r)
    return {"r": r, "mu": mu, "lambda_1": lam1, "lambda_d": -np.log1p(-lr * r), "lambda_2": np.log1p(lr * mu)}


@pytest.mark.parametrize("fn", [rates, own_rates])
def test_check_rates_passes(fn, capsys):
    checks.check_rates(fn)
    out = capsys.readouterr().out
    assert "check_rates passed: r, mu, lambda_1, lambda_d, lambda_2" in out and "5 set-ups x 2 learning rates" in out


@pytest.mark.parametrize("fn, says", [
    (lambda s, lr: own_rates(s, lr, r_factor=0.5), r"your r is .*Yours is half"),
    (lambda s, lr: own_rates(s, lr, first_order=True), r"your lambda_1 .*first-order value"),
    (lambda s, lr: {"rate": 1.0, "r": rates(s, lr)["r"]}, r"unknown keys \['rate'\]"),
])
def test_check_rates_fails_on_a_subtle_mistake(fn, says):
    with pytest.raises(AssertionError, match=says):
        checks.check_rates(fn)


def test_a_failure_names_the_input_and_the_size_of_the_difference():
    with pytest.raises(AssertionError) as e:
        checks.check_ablation(wrong_head)
    msg = str(e.value)
    assert "ablating L0H0 on tiny-llama (3 layers x 4 heads, head_dim 16)" in msg
    assert "differ from cel_utils.ablation.ablate_heads by up to" in msg and "batch row" in msg
    assert head_name((0, 1)) in msg
