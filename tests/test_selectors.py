"""The selector registry (cel_utils.selectors): what each way of choosing heads offers, a new selector added as one
class reaching `cel search --strategy`, chapter 2's comparison and the control, the gates' sets through the
pipeline never reading the confirm or held-out items, and the ``cel search --strategy gates`` contract."""

import json
from dataclasses import replace

import numpy as np
import pytest

from cel_utils.ablation import all_heads, head_name
from cel_utils.cli import main
from cel_utils.gates import GateSettings
from cel_utils.selectors import REGISTRY, gate_pipeline
from cel_utils.tasks import Task
from cel_utils.tiny import HARMFUL_HEAD


def _poisoned(split: Task) -> Task:
    """Every answer flipped and every prompt scrambled: a gate learned from these items would differ."""
    items = [{**it, "prompt": it["prompt"][::-1] + "zz:", "answer": 1 - it["answer"]} for it in split.items]
    return replace(split, items=items)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_gates_never_read_the_confirm_or_heldout_items(pair, mode):
    """The same gates, sets and search figures with the confirm and held-out splits poisoned; the confirm and
    held-out baselines change (those splits are read, to grade). Mean ablation: head means from the search split."""
    lm, splits = pair
    s = GateSettings(steps=6, max_k=2, random_sets=1, mode=mode, progress=False, n_boot=100)
    clean, lg_clean = gate_pipeline(lm, splits, s)
    bad, lg_bad = gate_pipeline(lm, {**splits, "confirm": _poisoned(splits["confirm"]),
                                     "heldout": _poisoned(splits["heldout"])}, s)
    assert np.array_equal(lg_clean.log_alpha, lg_bad.log_alpha) and lg_clean.sets == lg_bad.sets
    assert clean.sets["search_delta_accuracy"].tolist() == bad.sets["search_delta_accuracy"].tolist()
    for col in ("confirm_baseline", "heldout_baseline"):   # the poisoned splits were read, to grade
        assert clean.sets[col].iloc[0] != bad.sets[col].iloc[0]


# ---- cel search --strategy gates -------------------------------------------------------------------------------
def test_cel_search_gates_contract(harmful_folder, tmp_path, capsys):
    """The JSON has the pool strategies' fields (same shape) plus the gate values and the loss curve; the planted
    harmful head is the set of size 1."""
    model, task = harmful_folder
    outs = {}
    for strategy, extra in (("exhaustive", ["--pool", "3"]), ("gates", ["--gate-steps", "8"])):
        out = tmp_path / f"{strategy}.json"
        assert main(["search", "--model", model, "--task", task, "--n", "12", "--max-size", "2", "--strategy",
                     strategy, "--random-sets", "3", "--out", str(out), *extra]) == 0
        outs[strategy] = json.loads(out.read_text())
    g, ex = outs["gates"], outs["exhaustive"]
    assert set(g) == set(ex) | {"gates"}
    assert set(g["best"][0]) == set(ex["best"][0]) and set(g["best"][0]["heldout"]) == set(ex["best"][0]["heldout"])
    assert g["strategy"] == "gates" and g["n_evaluations"] == 16 and len(g["pool"]) == 12   # 8 steps x 2 starts
    assert [b["size"] for b in g["best"]] == [1, 2] and g["best"][0]["heads"] == [head_name(HARMFUL_HEAD)]
    assert g["best"][0]["search"]["delta_accuracy"] == pytest.approx(1.0)
    assert len(g["gates"]["values"]) == 24 and len(g["gates"]["loss_curve"]) == 16
    assert [s["heads"] for s in g["gates"]["sets"]] == [b["heads"] for b in g["best"]]
    assert g["gates"]["settings"]["steps"] == 8
    assert [len(c["heldout_delta_accuracy"]) for c in g["random_control"]] == [3, 3]


@pytest.mark.parametrize("argv, msg", [
    (["--strategy", "gates", "--pool", "4"], "leave out --screen and --pool"),
    (["--strategy", "gates", "--screen", "s.json"], "leave out --screen and --pool"),
    (["--strategy", "random", "--pool", "4"], "leave out --screen and --pool"),
    (["--strategy", "greedy", "--gate-steps", "5"], "--gate-steps only apply to --strategy gates"),
    (["--gate-penalty", "0.1"], "--gate-penalty only apply to --strategy gates"),
    (["--strategy", "gates", "--gate-steps", "0"], "must be at least 1"),
    (["--strategy", "gates", "--gate-penalty", "abc"], "--gate-penalty takes numbers separated by commas"),
    (["--strategy", "gates", "--gate-penalty", "0.1,-1"], "penalties must be a non-empty list of numbers >= 0"),
])
def test_cel_search_gates_rejects_bad_options_before_loading(argv, msg, tmp_path, capsys, monkeypatch):
    from cel_utils import models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(models, "load_model", refuse)
    out = tmp_path / "x.json"
    code = main(["search", "--model", "smollm2-135m", "--task", "agreement", "--n", "4", *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out.exists(), err


def test_cel_search_gates_too_many_heads(harmful_folder, tmp_path, capsys):
    model, task = harmful_folder
    out = tmp_path / "x.json"
    code = main(["search", "--model", model, "--task", task, "--n", "4", "--strategy", "gates", "--max-size", "13",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "max_k = 13 but the model has only 12 heads" in err and not out.exists(), err


def test_a_selector_is_one_class(harmful, harmful_folder, tmp_path):
    """A toy selector (always the last heads of the model) written as one class and registered reaches `cel search
    --strategy`, chapter 2's comparison (a curve, an area) and the control (its offer through the same pipeline,
    its chosen set's place among the random selector's) with no other edit."""
    from cel_utils.selectors import Offer, Selector, register

    @register
    class LastHeads(Selector):
        key, label = "toy", "last heads"

        def offer(self, ctx, max_k):
            heads = all_heads(ctx.lm)
            return Offer([sorted(heads[-k:]) for k in range(1, max_k + 1)],
                         {"forward_equivalents": 0.0, "seconds": 0.0, "n_evaluations": 0}, heads)

    try:
        _toy_everywhere(harmful, harmful_folder, tmp_path)
    finally:
        REGISTRY.pop("toy")
    assert "toy" not in REGISTRY


def _toy_everywhere(harmful, harmful_folder, tmp_path):
    from cel_utils.comparison import compare_selectors
    from cel_utils.design import Design
    from cel_utils.selectors import Options

    model, task = harmful_folder
    out = tmp_path / "toy.json"
    assert main(["search", "--model", model, "--task", task, "--n", "8", "--max-size", "2", "--strategy", "toy",
                 "--random-sets", "2", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["strategy"] == "toy" and [b["heads"] for b in rec["best"]] == [["L2H3"], ["L2H2", "L2H3"]]
    lm, splits = harmful
    res = compare_selectors(lm, splits, Design(max_k=2, n_boot=100), Options(pool_size=3, random_sets=2,
                                                                             leave_out=("compressed", "gates")))
    s = res.summary.set_index("selector")
    assert "last heads" in s.index and res.table[res.table.selector == "last heads"]["heads"].tolist() == \
        ["L2H3", "L2H2+L2H3"]
    assert res.runs["last heads"].offered()["heads"].tolist() == ["L2H3", "L2H2+L2H3"]
    assert res.runs["last heads"].control.equals(res.runs["top-k screen"].control) and len(res.runs["top-k screen"].control) == 2
    top = s.loc["top-k screen"]
    assert top.chosen == head_name(HARMFUL_HEAD) and top.control_percentile == 100 and top.chosen_heldout_delta > 0


def test_every_selector_offers_nested_sizes_from_the_search_split_only(harmful):
    """Each registered selector offers one set per size 1..max_k, sorted, from the model's heads, chosen with the
    search split alone (the context holds nothing else)."""
    from cel_utils.design import Design
    from cel_utils.selectors import Context, Options

    lm, splits = harmful
    ctx = Context.make(lm, splits["search"], Design(n_boot=50), Options(pool_size=4, compressed_evals=12,
                                                                        gates=GateSettings(steps=3)))
    assert not {"confirm", "heldout"} & set(vars(ctx))
    everything = set(all_heads(lm))
    for key, sel in REGISTRY.items():
        off = sel.offer(ctx, 3)
        assert [len(x) for x in off.sets] == [1, 2, 3], key
        assert all(list(x) == sorted(x) and set(x) <= everything for x in off.sets), key
        assert set(off.cost) == {"forward_equivalents", "seconds", "n_evaluations"}, key
    assert REGISTRY["topk"].offer(ctx, 1).sets == [[HARMFUL_HEAD]]


def test_an_unknown_strategy_is_refused_with_the_registry_listed(capsys):
    with pytest.raises(SystemExit) as e:
        main(["search", "--model", "m", "--task", "agreement", "--strategy", "nonesuch"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid choice: 'nonesuch'" in err and all(k in err for k in REGISTRY)


def test_top_sets_flag_ties_and_never_read_index_order():
    """Per-head estimates with no signal (all equal) give random heads, flagged 'none', not the first heads in
    index order; a tie across the top k is flagged 'ties'; distinct estimates give the plain ranking."""
    from cel_utils.selectors import top_sets

    heads = [(l, h) for l in range(6) for h in range(5)]
    firsts = []
    for seed in range(5):
        sets, info = top_sets(np.zeros(30), heads, 3, seed)
        assert info["signal"] == "none" and info["distinct_estimates"] == 1
        firsts.append(sets[2])
    assert [(0, 0), (0, 1), (0, 2)] not in firsts and len({tuple(x) for x in firsts}) > 1
    est = np.r_[0.5, 0.4, 0.3, np.zeros(27)]
    sets, info = top_sets(est, heads, 3)
    assert sets == [[(0, 0)], [(0, 0), (0, 1)], [(0, 0), (0, 1), (0, 2)]] and info["signal"] == "ok"
    assert top_sets(est, heads, 4)[1]["signal"] == "ties"
