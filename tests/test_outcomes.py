"""`cel stats`: the book's verdict on anyone's per-item outcomes (cel_utils.outcomes)."""

import json

import numpy as np
import pandas as pd
import pytest

from cel_utils.cli import main
from cel_utils.design import Design
from cel_utils.outcomes import outcome_verdict
from cel_utils.pipeline import CONFIRM_COLUMNS, HELDOUT_COLUMNS
from tests.oracles import bh_q, holm_p, mcnemar_p


def test_cel_stats_reproduces_cel_verdict_from_its_exported_items(harmful_folder, tmp_path):
    """`cel verdict --items` exports the run's confirm and held-out outcomes; `cel stats` on that table alone (no
    model) gives the verdict's sets, chosen head, equals and minimum detectable gain, number for number."""
    folder, task = harmful_folder
    v_out, items, s_out = tmp_path / "v.json", tmp_path / "items.csv", tmp_path / "s.json"
    assert main(["verdict", "--model", folder, "--task", task, "--n-search", "20", "--n-confirm", "20",
                 "--n-heldout", "20", "--top-k", "4", "--power-sims", "0", "--no-cache", "--fdr", "0.5",
                 "--items", str(items), "--out", str(v_out)]) == 0
    assert main(["stats", str(items), "--fdr", "0.5", "--out", str(s_out)]) == 0
    v, s = json.loads(v_out.read_text()), json.loads(s_out.read_text())
    assert v["confirmed"], "the planted head should be confirmed (else the test checks little)"
    assert s["chosen"] == v["chosen"] and s["confirmed"] == v["confirmed"] and s["verdict"] == v["verdict"]
    cols = ["heads", *CONFIRM_COLUMNS, *HELDOUT_COLUMNS]
    for a, b in zip(v["sets"], s["sets"], strict=True):
        for c in cols:
            assert a[c] == pytest.approx(b[c], nan_ok=True) if isinstance(a[c], float) else a[c] == b[c], c
    assert s["equals"] == v["equals"]
    for k in ("min_detectable_gain", "mde", "mde_worst", "break_rate_worst", "n_confirm", "n_heldout"):
        assert s[k] == pytest.approx(v[k]), k


def _table(rng, n=80):
    """Three conditions on confirm and held-out items: a strong helper, a weak one and a harmful one."""
    rows = []
    for split in ("confirm", "heldout"):
        base = rng.random(n) < 0.5
        conds = {"baseline": base, "L1H0": base | (rng.random(n) < 0.4), "L2H0": base ^ (rng.random(n) < 0.1),
                 "L3H0": base & (rng.random(n) < 0.6)}
        rows += [{"item": f"{split}-{i}", "split": split, "condition": c, "correct": int(x[i])}
                 for c, x in conds.items() for i in range(n)]
    return pd.DataFrame(rows)


def test_outcome_verdict_against_scipy_by_hand():
    """The stages on a planted table against an independent computation: McNemar as scipy's binomial test on the
    discordant items, BH from scipy, Holm written out (tests.oracles), the choice by hand."""
    df = _table(np.random.default_rng(3))
    rec = outcome_verdict(df, Design(n_boot=200, fdr=0.1))
    wide = {s: df[df.split == s].pivot(index="item", columns="condition", values="correct").astype(bool)
            for s in ("confirm", "heldout")}
    c = wide["confirm"]
    fb = {h: (int((c[h] & ~c.baseline).sum()), int((~c[h] & c.baseline).sum())) for h in ("L1H0", "L2H0", "L3H0")}
    q = bh_q([mcnemar_p(*fb[h]) for h in fb])
    confirmed = [h for h, qq in zip(fb, q) if qq < 0.1 and fb[h][0] > fb[h][1]]
    sets = {r["heads"]: r for r in rec["sets"]}
    assert [sets[h]["confirm_q_value"] for h in fb] == pytest.approx(list(q))
    assert rec["confirmed"] == confirmed == ["L1H0"]
    assert rec["chosen"] == max(confirmed, key=lambda h: fb[h][0] - fb[h][1])
    h = wide["heldout"]
    fix, brk = int((h.L1H0 & ~h.baseline).sum()), int((~h.L1H0 & h.baseline).sum())
    assert sets["L1H0"]["heldout_p_holm"] == pytest.approx(holm_p([mcnemar_p(fix, brk)])[0])
    assert sets["L1H0"]["heldout_delta_accuracy"] == pytest.approx((fix - brk) / len(h))
    assert rec["verdict"].startswith("localized: removing L1H0")
    # the offered family grades every condition on held-out items, Holm over the three
    off = {r["heads"]: r for r in outcome_verdict(df, Design(n_boot=200), policy="offered")["sets"]}
    fbh = [(int((h[k] & ~h.baseline).sum()), int((~h[k] & h.baseline).sum())) for k in ("L1H0", "L2H0", "L3H0")]
    assert [off[k]["heldout_p_holm"] for k in ("L1H0", "L2H0", "L3H0")] == pytest.approx(
        list(holm_p([mcnemar_p(*x) for x in fbh])))


@pytest.mark.parametrize("change, message", [
    (lambda d: d[d.condition != "baseline"], "has no 'baseline' condition"),
    (lambda d: d.assign(item=d["item"].str.replace("heldout-", "confirm-")), "is in two splits"),
    (lambda d: d.assign(correct=d["correct"] * 2), "'correct' must be 0/1"),
    (lambda d: d.drop(columns="condition"), "lacks column(s) condition"),
    (lambda d: d.iloc[1:], "every condition needs every item"),
    (lambda d: d.assign(split=d["split"].replace("heldout", "test")), "unknown split(s) test"),
    (lambda d: d.assign(margin=["x"] + [0.5] * (len(d) - 1)), "'margin' must be a number; got 'x'"),
])
def test_cel_stats_refuses_malformed_tables_and_writes_nothing(tmp_path, capsys, change, message):
    src, out = tmp_path / "t.csv", tmp_path / "out.json"
    change(_table(np.random.default_rng(0), n=20)).to_csv(src, index=False)
    assert main(["stats", str(src), "--out", str(out)]) == 2 and not out.exists()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_margins_alone_and_json_lines(tmp_path):
    """Without a correct column, correct means margin > 0; a JSONL table reads the same as its CSV."""
    df = _table(np.random.default_rng(1), n=30)
    df["margin"] = np.where(df["correct"] == 1, 0.7, -0.4)
    jl = tmp_path / "t.jsonl"
    df.drop(columns="correct").to_json(jl, orient="records", lines=True)
    out = tmp_path / "o.json"
    assert main(["stats", str(jl), "--out", str(out), "--n-boot", "100"]) == 0
    a = json.loads(out.read_text())
    b = outcome_verdict(df, Design(n_boot=100))
    assert [r["confirm_fixes"] for r in a["sets"]] == [r["confirm_fixes"] for r in b["sets"]]
    assert a["sets"][0]["confirm_delta_margin"] == pytest.approx(1.1 * a["sets"][0]["confirm_delta_accuracy"])
