"""The noise account's real-model proxy (cel_utils.sinks): each head's attention on position 0 and the norm of what
it writes at the read position, against a hand computation through Hugging Face's own forward, one item at a time
(no padding, no package hooks); and the rank correlations with removal gain against scipy."""

import numpy as np
import pandas as pd
import pytest
import torch

from cel_utils import hooks
from cel_utils.direct import choose_reads
from cel_utils.sinks import head_profile, tracking
from cel_utils.tasks import load_task
from cel_utils.tiny import tiny_model


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_head_profile_matches_huggingfaces_attentions_and_a_hand_projection(family):
    lm = tiny_model(family)
    task = load_task("agreement", "search", n=6)
    got = head_profile(lm, task, batch_size=4).set_index(["layer", "head_index"])
    reads = choose_reads(lm, task)
    L, H, D = lm.n_layers, lm.n_heads, lm.head_dim
    sink, norm = np.zeros((L, H)), np.zeros((L, H))
    for ids in reads.inputs:
        z = {}
        handles = [hooks.out_proj(lm, l).register_forward_pre_hook(
            lambda m, a, l=l: z.__setitem__(l, a[0][0, -1].detach().float())) for l in range(L)]
        with hooks.eager_attention(lm), torch.no_grad():
            out = lm.model(input_ids=torch.tensor([ids]), output_attentions=True)
        for h_ in handles:
            h_.remove()
        for l in range(L):
            sink[l] += out.attentions[l][0, :, -1, 0].float().numpy()                 # [head]
            W = hooks.out_proj(lm, l).weight.detach().float()                       # [d_model, head * d_head]
            for h in range(H):
                norm[l, h] += float((W[:, h * D:(h + 1) * D] @ z[l][h * D:(h + 1) * D]).norm())
    k = len(reads.inputs)
    for l in range(L):
        for h in range(H):
            assert got.loc[(l, h), "sink"] == pytest.approx(sink[l, h] / k, abs=1e-5)
            assert got.loc[(l, h), "out_norm"] == pytest.approx(norm[l, h] / k, rel=1e-4, abs=1e-6)
    assert (got["items"] == k).all()


def test_tracking_is_spearman_with_holm_over_every_test():
    from scipy.stats import spearmanr

    from cel_utils.stats import holm

    rng = np.random.default_rng(0)
    heads = [f"L{i}H0" for i in range(40)]
    gain = rng.normal(size=40)
    land = pd.concat([pd.DataFrame({"model": "m", "task": t, "head": heads, "delta_margin": gain + s})
                      for t, s in (("a", 0.0), ("b", 1.0))])
    prof = pd.concat([pd.DataFrame({"model": "m", "task": "a", "head": heads, "sink": -gain + 0.3 * rng.normal(size=40),
                                    "out_norm": rng.normal(size=40)}),
                      pd.DataFrame({"model": "m", "task": "b", "head": heads, "sink": rng.normal(size=40),
                                    "out_norm": rng.normal(size=40)})])
    t = tracking(land, prof).set_index("task")
    want = [spearmanr(gain, prof[prof.task == x][c]) for c in ("sink", "out_norm") for x in ("a", "b")]
    assert t.loc["a", "rho_sink"] == pytest.approx(want[0].statistic)
    ph = holm(np.array([w.pvalue for w in want]))
    assert [t.loc["a", "p_sink_holm"], t.loc["b", "p_sink_holm"], t.loc["a", "p_out_norm_holm"],
            t.loc["b", "p_out_norm_holm"]] == pytest.approx(list(ph))
    assert t.loc["a", "sink_reading"] == "tracks" and t.loc["b", "sink_reading"] == "not shown"
