"""Search strategies on synthetic scoring functions with a known best set."""

import itertools

import numpy as np
import pytest

from cel_utils.search import beam, exhaustive, greedy
from tests.oracles import holm_p, mcnemar_p


def make_score(n=10, seed=0, planted=(1, 4, 7)):
    """Additive single effects plus a strong synergy for a planted triple whose members look weak alone."""
    rng = np.random.default_rng(seed)
    single = rng.normal(0, 0.1, n)
    single[list(planted)] = [-0.05, -0.02, -0.04]  # individually useless
    calls = []

    def score(sets):
        calls.append(len(sets))
        out = []
        for s in sets:
            v = float(sum(single[h] for h in s))
            if set(planted) <= set(s):
                v += 2.0
            v -= 0.05 * max(0, len(s) - 3) ** 2  # large sets cost
            out.append(v)
        return out

    return score, single, calls


def brute_force(pool, score, k):
    sets = [tuple(sorted(c)) for c in itertools.combinations(pool, k)]
    vals = score(sets)
    return sets[int(np.argmax(vals))]


def test_exhaustive_finds_known_best():
    score, _, _ = make_score()
    pool = list(range(10))
    res = exhaustive(pool, score, max_size=4)
    assert res.best[3].heads == (1, 4, 7)
    assert set(res.overall.heads) >= {1, 4, 7}
    assert res.n_evaluations == sum(len(list(itertools.combinations(pool, k))) for k in range(5))
    for k in range(5):
        assert res.best[k].heads == brute_force(pool, score, k)


def test_greedy_misses_synergy_and_counts_evaluations():
    """Greedy adds what helps alone; a synergy among individually useless heads is invisible to it."""
    score, single, _ = make_score()
    res = greedy(list(range(10)), score, max_size=4)
    assert res.overall.heads != (1, 4, 7)
    assert res.path[0].heads == ()
    scores = [s.score for s in res.path]
    assert scores == sorted(scores) and len(set(scores)) == len(scores)  # strictly improving path
    assert res.n_evaluations <= 1 + 10 + 9 + 8 + 7


def test_greedy_finds_additive_optimum():
    gains = np.array([0.3, -0.2, 0.5, 0.1, -0.4])
    score = lambda sets: [float(sum(gains[h] for h in s)) for s in sets]  # noqa: E731
    res = greedy(list(range(5)), score)
    assert set(res.overall.heads) == {0, 2, 3}


def test_beam_between_greedy_and_exhaustive():
    score, _, _ = make_score()
    pool = list(range(10))
    ex = exhaustive(pool, score, max_size=3)
    b1 = beam(pool, score, width=1, max_size=3)
    b5 = beam(pool, score, width=5, max_size=3)
    wide = beam(pool, score, width=45, max_size=3)  # keeps every pair: as good as exhaustive at size 3
    assert wide.best[3].heads == ex.best[3].heads
    assert b1.best[3].score <= b5.best[3].score <= wide.best[3].score
    assert b5.n_evaluations < ex.n_evaluations


def test_bad_input():
    score, _, _ = make_score()
    with pytest.raises(ValueError):
        exhaustive([1, 1, 2], score)
    with pytest.raises(ValueError):
        beam([1, 2], score, width=0)
    with pytest.raises(ValueError, match="returned"):
        exhaustive([1, 2], lambda sets: [0.0])


def _check_search_figures(j, model, task, n, tmp_path):
    """Each best set's figures against separate `cel eval --ablate` runs: its change in accuracy on the search
    split, and on the held-out split its change in mean margin and its interaction (the set's change in mean
    margin minus the sum of its heads' changes alone: a mean over items, so it adds up from the evals' means)."""
    import json

    from cel_utils.cli import main

    def delta(heads, split, key):
        e = tmp_path / "eval.json"
        assert main(["eval", "--model", model, "--task", task, "--split", split, "--n", str(n),
                     "--ablate", ",".join(heads), "--out", str(e)]) == 0
        ev = json.loads(e.read_text())
        return ev["ablated"][key] - ev["baseline"][key]

    for b in j["best"]:
        assert b["search"]["delta_accuracy"] == pytest.approx(delta(b["heads"], "search", "accuracy"))
        h = b["heldout"]
        whole = delta(b["heads"], "heldout", "mean_margin")
        singles = sum(delta([x], "heldout", "mean_margin") for x in b["heads"])
        assert h["delta_margin"] == pytest.approx(whole, abs=1e-6)
        assert h["interaction"] == pytest.approx(whole - singles, abs=1e-6)
        assert h["interaction_ci_low"] - 1e-9 <= h["interaction"] <= h["interaction_ci_high"] + 1e-9


def test_cel_search_json(tiny_folder, tmp_path, capsys):
    import json

    from cel_utils.cli import main

    d = tiny_folder("llama")
    scr = tmp_path / "screen.json"
    assert main(["screen", "--model", d, "--task", "ioi", "--n", "16", "--quiet", "--out", str(scr)]) == 0
    out = tmp_path / "search.json"
    assert main(["search", "--model", d, "--task", "ioi", "--n", "16", "--screen", str(scr), "--pool", "4",
                 "--max-size", "2", "--strategy", "exhaustive", "--random-sets", "5", "--out", str(out)]) == 0
    j = json.loads(out.read_text())
    assert j["strategy"] == "exhaustive" and j["n_evaluations"] == 1 + 4 + 6
    assert [b["size"] for b in j["best"]] == [1, 2]
    for b in j["best"]:
        assert set(b["heads"]) <= set(j["pool"])
        h = b["heldout"]
        assert h["ci_low"] - 1e-9 <= h["delta_accuracy"] <= h["ci_high"] + 1e-9
        assert 0 <= h["random_percentile"] <= 100
    assert [len(c["heldout_delta_accuracy"]) for c in j["random_control"]] == [5, 5]
    # the pair's margins do not add up from its heads': a non-zero interaction, checked by `cel eval`
    assert j["best"][1]["heldout"]["interaction"] != 0
    assert j["best"][0]["heldout"]["interaction"] == pytest.approx(0, abs=1e-9)  # one head: nothing to add up
    _check_search_figures(j, d, "ioi", 16, tmp_path)
    # a screen of other items is refused before any work: seed 1's search split overlaps seed 0's held-out split
    for argv, msg in [(["--seed", "1"], "seed = 0"), (["--n", "10"], "n_items = 16")]:
        bad = tmp_path / "bad.json"
        assert main(["search", "--model", d, "--task", "ioi", "--n", "16", "--screen", str(scr),
                     "--out", str(bad), *argv]) == 2 and not bad.exists()
        assert msg in capsys.readouterr().err
    # a --screen file that is not a screen: exit 2, one line naming the file and the problem, nothing written
    eval_out = tmp_path / "eval.json"
    assert main(["eval", "--model", d, "--task", "ioi", "--n", "16", "--out", str(eval_out)]) == 0
    capsys.readouterr()
    for name, text, msg in [("layer.json", '{"heads": [{"layer": "x"}]}', "is not a screen"),
                            ("nohead.json", '{"heads": []}', "is not a screen"),
                            ("nomargin.json", '{"heads": [{"layer": 0, "head": 1}]}', "is not a screen"),
                            ("list.json", "[1, 2]", "is not a screen"),
                            ("eval.json", None, "is not a screen"),      # a `cel eval` output, not a screen
                            ("broken.json", '{"heads": [', "cannot read screen"),
                            ("missing.json", None, "cannot read screen")]:
        f = tmp_path / name
        if text is not None:
            f.write_text(text)
        bad = tmp_path / "bad.json"
        assert main(["search", "--model", d, "--task", "ioi", "--n", "16", "--screen", str(f),
                     "--out", str(bad)]) == 2 and not bad.exists(), name
        err = capsys.readouterr().err
        assert f"{f}" in err and msg in err and len(err.strip().splitlines()) == 1, (name, err)

def test_cel_search_sum_of_singles_on_planted_head(harmful_folder, tmp_path):
    """On a model with a planted harmful head and near-silent others, every best set holds the harmful head and its
    margins add up (the other heads barely act): the held-out interaction is a small fraction of the set's change;
    the figures are checked against separate `cel eval` runs."""
    import json

    from cel_utils.cli import main
    from cel_utils.tiny import HARMFUL_HEAD

    model, task = harmful_folder
    out = tmp_path / "search.json"
    assert main(["search", "--model", model, "--task", task, "--n", "12", "--pool", "3", "--max-size", "2",
                 "--strategy", "exhaustive", "--random-sets", "0", "--out", str(out)]) == 0
    j = json.loads(out.read_text())
    harmful = "L{}H{}".format(*HARMFUL_HEAD)
    assert j["pool"][0] == harmful and all(harmful in b["heads"] for b in j["best"])
    assert [b["search"]["delta_accuracy"] for b in j["best"]] == pytest.approx([1.0, 1.0])
    for b in j["best"]:
        assert abs(b["heldout"]["interaction"]) < 0.05 * abs(b["heldout"]["delta_margin"])
    _check_search_figures(j, model, task, 12, tmp_path)


def test_joint_search_on_tiny_model(tiny_llama):
    """Every subset is evaluated on the search split; the best set of each size is confirmed and tested with the
    right statistics (checked against scipy on direct evaluations); controls are consistent."""
    from cel_utils.ablation import parse_heads, parse_set
    from cel_utils.scoring import encode_task
    from cel_utils.engine import evaluate_head_sets
    from cel_utils.joint import joint_search
    from cel_utils.tasks import load_task

    lm = tiny_llama
    s, c, h = (load_task("ioi", split, n=n) for split, n in (("search", 16), ("confirm", 40), ("heldout", 40)))
    pool = parse_heads("L0H0,L1H3,L2H2,L2H3", lm.n_layers, lm.n_heads)  # three confirmed sets (see the end)
    js = joint_search(lm, s, c, h, pool, max_k=3, random_sets=7, random_pools=2, n_explore=12, fdr=1.01,
                      progress=False, n_boot=300)
    t = js.subsets
    assert len(t) == 16 and t["size"].tolist() == sorted(t["size"]) and t["mask"].iloc[0] == 0
    assert t["search_delta_accuracy"].iloc[0] == 0 and t["explore_delta_accuracy"].iloc[0] == 0
    # a row of the table equals a direct evaluation of that set (search split, and the first 12 held-out items)
    row = t[t["mask"] == 0b1011].iloc[0]
    three = [pool[0], pool[1], pool[3]]
    direct = evaluate_head_sets(lm, encode_task(lm, s), [three], progress=False, result_cache=False)
    assert row["heads"] == "L0H0+L1H3+L2H3"
    assert row["search_accuracy"] == pytest.approx(direct.accuracy[0])
    assert row["search_margin"] == pytest.approx(direct.mean_margin[0], abs=1e-4)
    first12 = load_task("ioi", "heldout", n=12)
    direct = evaluate_head_sets(lm, encode_task(lm, first12), [three], progress=False, result_cache=False)
    assert row["explore_accuracy"] == pytest.approx(direct.accuracy[0])
    # exhaustive best per size is the table's best per size (search accuracy, margin tie-break)
    key = t["search_accuracy"] + 1e-3 * t["search_margin"]
    b = js.best
    assert b["size"].tolist() == [1, 2, 3]
    for k in (1, 2, 3):
        i = key[t["size"] == k].idxmax()
        ex = js.strategies[(js.strategies.strategy == "exhaustive") & (js.strategies["size"] == k)]
        assert ex["heads"].iloc[0] == t["heads"].loc[i] == b["heads"].iloc[k - 1]
    ev = js.strategies.groupby("strategy")["n_evaluations"].first()
    assert ev["exhaustive"] == 1 + 4 + 6 + 4 and ev["greedy"] <= ev["exhaustive"]
    # confirm and held-out statistics, recomputed from direct evaluations with scipy and a hand Holm step
    sets = [parse_set(x) for x in b["heads"]]
    ps = {}
    for split, task in (("confirm", c), ("heldout", h)):
        r = evaluate_head_sets(lm, encode_task(lm, task), [[]] + sets, progress=False, result_cache=False)
        base, abl = r.correct[0], r.correct[1:]
        fixes, breaks = (~base & abl).sum(1), (base & ~abl).sum(1)
        ps[split] = np.array([mcnemar_p(f, k) for f, k in zip(fixes, breaks)])
        col = "confirm_delta_accuracy" if split == "confirm" else "heldout_delta_accuracy"
        assert b[col].to_numpy() == pytest.approx((fixes - breaks) / len(task))
        # interaction on held-out margins: the set's change minus its members' changes
        if split == "heldout":
            single = evaluate_head_sets(lm, encode_task(lm, task), [[x] for x in pool], progress=False, result_cache=False)
            dm = single.margin - r.margin[0]                           # [4, n_items]
            for j, hs in enumerate(sets):
                want = (r.margin[1 + j] - r.margin[0]) - sum(dm[pool.index(x)] for x in hs)
                assert b["interaction"].iloc[j] == pytest.approx(want.mean(), abs=1e-4)
                assert b["interaction_ci_low"].iloc[j] <= b["interaction"].iloc[j] + 1e-9
    assert b["heldout_p_holm"].to_numpy() == pytest.approx(holm_p(ps["heldout"]))
    assert b["interaction"].iloc[0] == pytest.approx(0.0, abs=1e-6)   # one head: nothing to interact with
    # the choice uses the confirm split only: of the three confirmed sets (gains checked above against direct
    # evaluations), the one with the largest confirm gain, the middle size: not the first or last confirmed,
    # nor the best on held-out items
    assert b["confirmed"].tolist() == [True, True, True]
    assert b["confirm_delta_accuracy"].to_numpy() == pytest.approx([0.025, 0.075, 0.05])
    assert b["heldout_delta_accuracy"].iloc[1] < b["heldout_delta_accuracy"].max()
    chosen = js.chosen()
    assert chosen["heads"] == "L0H0+L2H3" and chosen["size"] == 2
    assert js.random_control.groupby("size").size().tolist() == [7, 7, 7]
    assert len(js.pool_control) == 2 and 0 <= js.pool_percentile() <= 100
    assert all(len(parse_heads(p)) == 4 for p in js.pool_control["pool"])
    data = js.explorer_data()
    assert data["pool"] == ["L0H0", "L1H3", "L2H2", "L2H3"] and len(data["subsets"]) == 16 and data["n_heldout"] == 12


def test_random_pool_control_grades_each_pools_choice_on_heldout(tiny_llama):
    """The selection-aware control: each random pool's choice (made on confirm items) and its held-out gain equal
    a direct evaluation of that set on the held-out items (engine, cache off); a pool that chooses nothing scores 0."""
    from cel_utils.ablation import parse_heads, parse_set
    from cel_utils.engine import evaluate_head_sets
    from cel_utils.joint import joint_search
    from cel_utils.scoring import encode_task
    from cel_utils.tasks import load_task

    lm = tiny_llama
    splits = [load_task("ioi", split, n=n) for split, n in (("search", 16), ("confirm", 40), ("heldout", 40))]
    js = joint_search(lm, *splits, [(0, 0), (1, 3), (2, 2)], max_k=2, random_pools=4, random_sets=1, fdr=1.01,
                      progress=False, n_boot=200)
    pc = js.pool_control
    assert len(pc) == 4 and pc["chosen"].notna().any()
    enc = encode_task(lm, splits[2])
    for r in pc.itertuples():
        if r.chosen is None:
            assert r.heldout_delta_accuracy == 0.0
            continue
        assert set(parse_set(r.chosen)) <= set(parse_heads(r.pool))
        d = evaluate_head_sets(lm, enc, [[], parse_set(r.chosen)], progress=False, result_cache=False)
        assert r.heldout_delta_accuracy == pytest.approx(d.accuracy[1] - d.accuracy[0])


def test_joint_search_rejects_bad_pools(tiny_llama):
    from cel_utils.joint import joint_search
    from cel_utils.tasks import load_task

    s = load_task("agreement", n=4)
    with pytest.raises(ValueError, match="1 to 10"):
        joint_search(tiny_llama, s, s, s, [])
    with pytest.raises(ValueError, match="duplicates"):
        joint_search(tiny_llama, s, s, s, [(0, 1), (0, 1)])


def test_cross_task_table(tiny_llama):
    from cel_utils.joint import cross_task
    from cel_utils.tasks import load_task

    tasks = {"agreement": load_task("agreement", n=8), "ioi": load_task("ioi", n=8)}
    df = cross_task(tiny_llama, {"none": [], "a": [(0, 1)]}, tasks, n_boot=200)
    assert len(df) == 4 and set(df["task"]) == {"agreement", "ioi"}
    none = df[df["set"] == "none"]
    assert (none["delta_accuracy"] == 0).all() and (none["accuracy"] == none["baseline"]).all()


def test_subset_explorer_needs_every_subset():
    from cel_utils.widgets import subset_explorer_html

    d = {"model": "m", "task": "t", "pool": ["L0H1", "L2H3"], "n_search": 2, "n_heldout": 2,
         "subsets": {0: [0, 0, 0, 0], 1: [1, 1, 1, 1], 2: [0, 1, 0, 1]}}
    with pytest.raises(ValueError, match="all 4 subsets"):
        subset_explorer_html(d)
    d["subsets"][3] = [1, 0, 1, 0]
    html = subset_explorer_html(d)
    assert html.count("data-bit=") == 2 and html == subset_explorer_html(d)  # deterministic ids


def test_joint_choice_never_reads_the_heldout_split():
    """The chosen set is the confirmed set with the largest confirm gain, whatever the held-out figures say."""
    import pandas as pd

    from cel_utils.design import Design
    from cel_utils.joint import JointSearch
    from cel_utils.pipeline import Run

    best = pd.DataFrame({"heads": ["A", "A,B", "A,B,C"], "size": [1, 2, 3], "offered": True,
                         "confirmed": [True, True, False], "confirm_delta_accuracy": [0.10, 0.05, 0.30],
                         "heldout_delta_accuracy": [0.0, 0.2, 0.4]})
    pc = pd.DataFrame({"heldout_delta_accuracy": [-0.1, 0.0, 0.1]})
    run = Run(model="m", task="t", selector="pool search", design=Design(), sets=best, confirm_comparison=None,
              heldout_comparison=None, control=pc)
    js = JointSearch(run=run, pool=[], subsets=pd.DataFrame(), strategies=pd.DataFrame(),
                     random_control=pd.DataFrame(), seconds_per_evaluation=0.0, n_explore=1)
    assert js.chosen()["heads"] == "A" and js.chosen_gain() == 0.0
    assert js.pool_percentile() == 50.0                  # 0.0 ties the middle random pool
    run.sets = best.assign(confirmed=False)
    assert js.chosen() is None and js.chosen_gain() == 0.0
