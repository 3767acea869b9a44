"""Search strategies on synthetic scoring functions with a known best set."""

import itertools

import numpy as np
import pytest

from cel_utils.search import beam, exhaustive, greedy


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


def test_cel_search_json(tmp_path, capsys):
    import json

    from cel_utils.cli import main
    from tiny import save_tiny

    d = save_tiny(tmp_path / "m", "llama")
    scr = tmp_path / "screen.json"
    assert main(["screen", "--model", d, "--task", "agreement", "--n", "12", "--quiet", "--out", str(scr)]) == 0
    out = tmp_path / "search.json"
    assert main(["search", "--model", d, "--task", "agreement", "--n", "12", "--screen", str(scr), "--pool", "4",
                 "--max-size", "2", "--strategy", "exhaustive", "--random-sets", "5", "--out", str(out)]) == 0
    j = json.loads(out.read_text())
    assert j["strategy"] == "exhaustive" and j["n_evaluations"] == 1 + 4 + 6
    assert [b["size"] for b in j["best"]] == [1, 2]
    for b in j["best"]:
        assert set(b["heads"]) <= set(j["pool"])
        h = b["heldout"]
        assert h["ci_low"] - 1e-9 <= h["delta_accuracy"] <= h["ci_high"] + 1e-9
        assert 0 <= h["random_percentile"] <= 100
        s = b["search"]
        assert s["interaction"] == pytest.approx(s["delta_accuracy"] - s["sum_of_singles_delta_accuracy"])
    assert [len(c["heldout_delta_accuracy"]) for c in j["random_control"]] == [5, 5]
    # a screen of other items is refused before any work: seed 1's search split overlaps seed 0's held-out split
    for argv, msg in [(["--seed", "1"], "seed = 0"), (["--n", "10"], "n_items = 12")]:
        bad = tmp_path / "bad.json"
        assert main(["search", "--model", d, "--task", "agreement", "--n", "12", "--screen", str(scr),
                     "--out", str(bad), *argv]) == 2 and not bad.exists()
        assert msg in capsys.readouterr().err
    notscreen = tmp_path / "not.json"
    notscreen.write_text('{"heads": [{"layer": "x"}]}')
    assert main(["search", "--model", d, "--task", "agreement", "--n", "12", "--screen", str(notscreen)]) == 2


def test_joint_search_on_tiny_model(tiny_llama):
    """Every subset is evaluated; the table agrees with direct evaluation; strategies and controls are consistent."""
    from cel_utils.ablation import parse_heads
    from cel_utils.scoring import encode_task
    from cel_utils.engine import evaluate_head_sets
    from cel_utils.joint import joint_search
    from cel_utils.tasks import load_task

    lm = tiny_llama
    s, h = load_task("agreement", "search", n=16), load_task("agreement", "heldout", n=16)
    pool = parse_heads("L0H0,L0H3,L1H1,L1H2", lm.n_layers, lm.n_heads)
    js = joint_search(lm, s, h, pool, max_size=3, random_sets=7, progress=False, n_boot=300)
    t = js.subsets
    assert len(t) == 16 and t["size"].tolist() == sorted(t["size"]) and t["mask"].iloc[0] == 0
    assert t["search_delta_accuracy"].iloc[0] == 0 and t["heldout_delta_accuracy"].iloc[0] == 0
    singles = t[t["size"] == 1]
    assert np.allclose(singles["interaction"], 0)
    # a row of the table equals a direct evaluation of that set
    row = t[t["mask"] == 0b1011].iloc[0]
    direct = evaluate_head_sets(lm, encode_task(lm, h), [[pool[0], pool[1], pool[3]]], progress=False, use_cache=False)
    assert row["heads"] == "L0H0,L0H3,L1H2"
    assert row["heldout_accuracy"] == pytest.approx(direct.accuracy[0])
    assert row["heldout_margin"] == pytest.approx(direct.mean_margin[0], abs=1e-4)
    # exhaustive best per size is the table's best per size (search accuracy, margin tie-break)
    key = t["search_accuracy"] + 1e-3 * t["search_margin"]
    for k in (1, 2, 3):
        i = key[t["size"] == k].idxmax()
        ex = js.strategies[(js.strategies.strategy == "exhaustive") & (js.strategies["size"] == k)]
        assert ex["heads"].iloc[0] == t["heads"].loc[i]
    ev = js.strategies.groupby("strategy")["n_evaluations"].first()
    assert ev["exhaustive"] == 1 + 4 + 6 + 4 and ev["greedy"] <= ev["exhaustive"]
    b = js.best
    assert b["size"].tolist() == [0, 1, 2, 3]
    assert ((b.ci_low <= b.heldout_delta_accuracy + 1e-9) & (b.heldout_delta_accuracy <= b.ci_high + 1e-9)).all()
    assert js.random_control.groupby("size").size().tolist() == [7, 7, 7]
    assert b["random_percentile"].iloc[1:].between(0, 100).all()
    data = js.explorer_data()
    assert data["pool"] == ["L0H0", "L0H3", "L1H1", "L1H2"] and len(data["subsets"]) == 16


def test_joint_search_rejects_bad_pools(tiny_llama):
    from cel_utils.joint import joint_search
    from cel_utils.tasks import load_task

    s = load_task("agreement", n=4)
    with pytest.raises(ValueError, match="1 to 10"):
        joint_search(tiny_llama, s, s, [])
    with pytest.raises(ValueError, match="duplicates"):
        joint_search(tiny_llama, s, s, [(0, 1), (0, 1)])


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
