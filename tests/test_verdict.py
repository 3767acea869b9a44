"""The three-stage verdict (search -> confirm -> held-out) against a hand computation on the plain loop.

The oracle re-scores every head and set with ``plain_evaluate`` (full forward passes, no engine, no cache) and
applies the decisions with scipy and a hand-written Holm step-down, so a slip in the pipeline's ranking, its
split use, its BH or its Holm step shows up as a disagreement.
"""

import numpy as np
import pytest

from cel_utils.ablation import head_name, parse_heads
from cel_utils.scoring import encode_task, plain_evaluate
from cel_utils.tasks import load_task
from cel_utils.ablation import format_set
from cel_utils.landscape import verdict_markdown, verdict_table
from cel_utils.verdict import single_head_verdict
from tests.oracles import bh_q, holm_p, mcnemar_p


@pytest.fixture(scope="module")
def splits():
    return {s: load_task("ioi", s, n=n, seed=0) for s, n in (("search", 12), ("confirm", 60), ("heldout", 60))}


def test_verdict_matches_a_hand_computation(monkeypatch, tiny_llama, splits):
    monkeypatch.setenv("CEL_NO_CACHE", "1")
    # an fdr above 1 confirms every re-tested head that fixes more than it breaks, so that the random tiny
    # model reaches the held-out stage with several sets (checked below)
    lm, fdr, top_k = tiny_llama, 1.01, 4
    v = single_head_verdict(lm, splits, top_k=top_k, fdr=fdr)
    heads = parse_heads("all", lm.n_layers, lm.n_heads)
    # stage 1 by hand: rank every head by the change in mean margin on the search split
    enc_s = encode_task(lm, splits["search"])
    b = plain_evaluate(lm, enc_s)
    d_margin = [plain_evaluate(lm, enc_s, [h]).margin.mean() - b.margin.mean() for h in heads]
    top = [heads[i] for i in np.argsort(-np.asarray(d_margin), kind="stable")[:top_k]]
    assert v.confirm["heads"].tolist() == [head_name(h) for h in top]
    # stage 2 by hand: exact McNemar on the confirm split, BH over the top_k
    enc_c = encode_task(lm, splits["confirm"])
    bc = plain_evaluate(lm, enc_c).correct[0]
    fb, ablated = [], {}
    for h in top:
        a = ablated[head_name(h)] = plain_evaluate(lm, enc_c, [h]).correct[0]
        fb.append((int((~bc & a).sum()), int((bc & ~a).sum())))
    q = bh_q([mcnemar_p(f, k) for f, k in fb])
    confirmed = [head_name(h) for h, (f, k), qq in zip(top, fb, q) if qq < fdr and f > k]
    assert v.confirmed == confirmed
    np.testing.assert_allclose(v.confirm["confirm_q_value"], q, rtol=1e-9)
    assert len(confirmed) >= 2
    # stage 3 by hand: each confirmed head and all together on the held-out split, Holm over the sets
    enc_h = encode_task(lm, splits["heldout"])
    bh = plain_evaluate(lm, enc_h).correct[0]
    sets = [[h] for h in parse_heads(",".join(confirmed))]
    if len(confirmed) > 1:
        sets.append(parse_heads(",".join(confirmed)))
    p = []
    for s in sets:
        a = plain_evaluate(lm, enc_h, s).correct[0]
        p.append(mcnemar_p((~bh & a).sum(), (bh & ~a).sum()))
    np.testing.assert_allclose(v.heldout["heldout_p_holm"], holm_p(p), rtol=1e-9)
    row = v.row()
    gains = {head_name(h): (f - k) / len(splits["confirm"]) for h, (f, k) in zip(top, fb)}
    best = max(confirmed, key=lambda h: gains[h])  # the confirmed head with the largest confirm gain
    assert row["chosen"] == best
    # the chosen head's equals: each other confirmed head against it on the confirm items, exact test, Holm
    others = [h for h in confirmed if h != best]
    p_eq = [mcnemar_p(int((ablated[best] & ~ablated[h]).sum()), int((~ablated[best] & ablated[h]).sum())) for h in others]
    eq = v.equals()
    assert eq["heads"].tolist() == others and eq["p_holm"].to_numpy() == pytest.approx(holm_p(p_eq))
    assert row["equals"].split(", ") == [best] + [h for h, q in zip(others, holm_p(p_eq)) if q >= 0.05]
    assert row["heldout_p_holm"] == pytest.approx(holm_p(p)[confirmed.index(best)])
    assert row["together_delta"] == pytest.approx(
        v.heldout.set_index("heads").loc[format_set(parse_heads(confirmed)), "heldout_delta_accuracy"])


def test_verdict_table_and_text(tiny_llama, splits):
    v = single_head_verdict(tiny_llama, splits, top_k=2, fdr=1e-9)  # nothing can be confirmed at this level
    tab = verdict_table([v])
    assert tab["confirmed"].tolist() == [""] and not tab["holds"].any()
    # not detected, said with the power of the whole pipeline (nothing can pass BH at 1e-9: probability 0) and
    # the confirm test's own MDE at both break rates; never "ruled out"
    text = tab["verdict"].iloc[0]
    assert text.startswith("not detected: a single head with gain 0.10") and "localized with probability 0.00" in text
    assert tab["pipeline_power"].iloc[0] == 0 and "ruled out" not in text
    assert f"{tab['mde'].iloc[0]:.3f} with 80% power at best" in text and tab["mde_worst"].iloc[0] >= tab["mde"].iloc[0]
    assert f"accuracy {tab['baseline'].iloc[0]:.3f} on 60 confirm items" in verdict_markdown(tab)
    assert tab["baseline"].iloc[0] == v.confirm["confirm_baseline"].iloc[0]


def test_cel_verdict_matches_the_library_and_refuses_bad_input(harmful_folder, tmp_path, capsys):
    """`cel verdict` on a tiny model with a planted harmful head (items in three splits): it localizes that head,
    its record equals single_head_verdict's row at the same parameters (run in this process, after the command:
    the result cache is off, so nothing is read back), and bad input exits 2 with one line and writes nothing."""
    import json

    from cel_utils.cli import main
    from cel_utils.models import load_model
    from cel_utils.tasks import SPLITS, load_task
    from cel_utils.tiny import HARMFUL_HEAD

    folder, task = harmful_folder
    out = tmp_path / "v.json"
    argv = ["verdict", "--model", folder, "--task", task, "--n-search", "20", "--n-confirm", "20", "--n-heldout", "20",
            "--top-k", "3", "--power-sims", "300", "--no-cache"]
    assert main(argv + ["--out", str(out)]) == 0
    d = json.loads(out.read_text())
    head = "L{}H{}".format(*HARMFUL_HEAD)
    assert d["row"]["chosen"] == head and d["confirmed"][0] == head
    assert d["row"]["holds"] and d["verdict"].startswith(f"localized: removing {head}")
    assert 0 <= d["pipeline_power"] <= 1 and d["mde_worst"] >= d["mde"]
    lm = load_model(folder, cache=False)
    splits = {s: load_task(task, s, n=20, clip=True) for s in SPLITS}
    row = single_head_verdict(lm, splits, top_k=3, power_sims=300).row()
    for k in ("chosen", "heldout_delta", "heldout_ci_low", "heldout_ci_high", "heldout_p_holm", "mde", "mde_worst", "pipeline_power",
              "pipeline_power_best", "verdict"):
        assert d["row"][k] == pytest.approx(row[k]) if isinstance(row[k], float) else d["row"][k] == row[k], k
    for bad, msg in [(["--top-k", "0"], "--top-k must be at least 1"), (["--fdr", "0"], "--fdr must be positive"),
                     (["--n", "5"], "not --split/--n"), (["--power-sims", "-1"], "--power-sims")]:
        capsys.readouterr()
        bad_out = tmp_path / "bad.json"
        assert main(argv + bad + ["--out", str(bad_out)]) == 2 and not bad_out.exists()
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and msg in err, err


def test_selection_stability_matches_resampled_screens_ranked_by_top():
    """The share of search resamples whose screen offers (top k) and ranks first a head, against a second
    implementation: the same resamples as Screens of their own, ranked by Screen.top."""
    import numpy as np

    from cel_utils.screening import Screen
    from cel_utils.scoring import ItemResults

    rng = np.random.default_rng(0)
    n, heads = 40, [(0, h) for h in range(6)]
    bm = rng.normal(0, 1, (1, n))
    shift = np.array([0.5, 0.5, 0.1, 0.0, -0.2, 0.3])[:, None]      # two heads at the top: unstable
    m = bm + shift + rng.normal(0, 1, (6, n))
    sc = Screen(heads, ItemResults(bm > 0, bm), ItemResults(m > 0, m), "zero")
    got = sc.selection_stability("L0H0", 2, n_boot=150, seed=3)
    r = np.random.default_rng(3)
    offered = first = 0
    for _ in range(150):
        idx = r.integers(0, n, n)
        top = Screen(heads, ItemResults((bm > 0)[:, idx], bm[:, idx]), ItemResults((m > 0)[:, idx], m[:, idx]),
                     "zero").top(2)["head"].tolist()
        offered, first = offered + ("L0H0" in top), first + (top[0] == "L0H0")
    assert (got["offered"], got["first"]) == (offered / 150, first / 150)
    assert 0 < got["first"] < 1 and got["offered"] >= got["first"]
    far = Screen(heads, ItemResults(bm > 0, bm), ItemResults(m > 0, m + 5 * (np.arange(6) == 3)[:, None]), "zero")
    assert far.selection_stability("L0H3", 1, n_boot=50)["first"] == 1.0
