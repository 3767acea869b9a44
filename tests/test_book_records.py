"""Every chapter runs headless at small parameters (CI_PARAMETERS, executed once per session by the ``staged``
fixture of conftest.py); its recorded values are checked against recomputations and against the prose it
printed. A failing chapter and a wrong parameter type are clear errors."""

import json

import numpy as np
import pandas as pd
import pytest

from cel_utils import book
from tests.book_helpers import CI_PARAMETERS, record
from tests.oracles import bh_q, holm_p, mcnemar_p

pytestmark = pytest.mark.notebook


def test_every_chapter_has_ci_parameters_and_ran(staged):
    root, status = staged
    assert {s["notebook"] for s in status} == set(book.expected_chapters()) == set(CI_PARAMETERS)
    assert [s["title"] for s in status] == [book.title(book.NOTEBOOKS / f"{s['notebook']}.ipynb") for s in status]


def test_mechanism_chapter_records(staged):
    """Chapter 2a explains heads chapter 1a's record names, with the status that record gives them."""
    from cel_utils.models import load_model

    rec, land = record(staged, "02a_mechanism"), record(staged, "01a_landscape")
    assert len(rec["heads"]) == len(rec["models"]) * CI_PARAMETERS["02a_mechanism"]["heads_per_model"]
    for h in rec["heads"]:
        pair = next(p for p in land["pairs"] if p["model"] == h["model"] and p["task"] == h["task"])
        model_held = [r["heads"] for p in land["pairs"] if p["model"] == h["model"] for r in _heldout(p)
                      if r["holds"] and "+" not in r["heads"]]
        if h["status"] == "confirmed":
            assert any(r["heads"] == h["head"] and r["holds"] for r in _heldout(pair))
        else:
            assert h["status"] == "exploratory" and not model_held
        assert h["head"] in pair["screened_heads"] and h["control"] in pair["screened_heads"]
        assert h["direct_share"] is None or 0 <= h["direct_share"] <= 1
        assert h["n_fixed"] + h["n_broken"] <= h["n_items"] <= CI_PARAMETERS["02a_mechanism"]["n_items"]
        assert h["sentence"].startswith(f"{h['head']} ({h['task']})")
    assert rec["attention_row_sums"] and all(abs(s - 1) < 1e-4 for s in rec["attention_row_sums"])
    n_fixed = {f"{h['model']}/{h['head']}/{h['task']}": h["n_fixed"] for h in rec["heads"]}
    assert set(rec["promoted"]) == set(rec["promoted_all"]) == set(n_fixed)
    for key, toks in rec["promoted_all"].items():
        tok = load_model(key.split("/")[0]).tokenizer
        # tokens over the items its removal fixes exist exactly when it fixes some
        assert bool(rec["promoted"][key]) == (n_fixed[key] > 0)
        for listed in (toks, rec["promoted"][key]):
            assert all(0 <= t["token_id"] < len(tok) and tok.decode([t["token_id"]]) == t["token"] for t in listed)
        assert len(toks) == CI_PARAMETERS["02a_mechanism"]["n_tokens"]


def test_every_exercise_solution_ran_at_ci_parameters(staged):
    """Each chapter ran with its solutions appended (a failing solution fails the chapter, and the fixture)."""
    root, _ = staged
    n_solutions = 0
    for name in book.expected_chapters():
        src = json.loads((book.NOTEBOOKS / f"{name}.ipynb").read_text())
        ran = [c for c in json.loads((root / "book" / "chapters" / f"{name}.ipynb").read_text())["cells"]
               if "solution-check" in c.get("metadata", {}).get("tags", [])]
        assert ["".join(c["source"]).strip() for c in ran] == book.solution_code(src)
        assert all(o.get("output_type") != "error" for c in ran for o in c["outputs"])
        n_solutions += len(ran)
    assert n_solutions >= 8


def test_a_failing_chapter_is_reported_and_stops_the_build(tmp_path, monkeypatch):
    import nbformat

    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Broken"),
                                         nbformat.v4.new_code_cell("raise RuntimeError('boom')")])
    nbformat.write(nb, nbs / "09_broken.ipynb")
    monkeypatch.setattr(book, "NOTEBOOKS", nbs)
    monkeypatch.setattr(book, "CHAPTERS", ["09_broken"])
    with pytest.raises(SystemExit):
        book.execute(tmp_path / "out")
    (row,) = json.loads((tmp_path / "out" / "execution_status.json").read_text())
    assert row["notebook"] == "09_broken" and row["ok"] is False and row["title"] == "Broken"
    assert "FAILED" in (tmp_path / "out" / "execution_status.md").read_text()


def test_findings_page_states_every_verdict(staged):
    """The findings page repeats each verdict sentence of chapters 1a and 2, read from their records."""
    prose = _markdown_outputs(staged, "04_findings")
    for name in ("01a_landscape", "02_joint_search"):
        for v in record(staged, name)["verdict"]:
            assert f"**{v['model']} / {v['task']}**: {v['verdict']}." in prose
    t = record(staged, "03_theory")
    assert f"escape slope {t['early_check'][0]['predicted']:.1f} predicted" in prose


def _confirm(rec):
    """A pipeline record's re-tested (offered) sets, in the order offered."""
    return [s for s in rec["sets"] if s["offered"]]


def _heldout(rec):
    """A pipeline record's sets tested on held-out items."""
    return [s for s in rec["sets"] if s["heldout_p_holm"] is not None]


def _check_confirm(rows, fdr):
    """q-values and the confirmed flag recomputed from fixes and breaks (scipy's exact binomial test and BH)."""
    assert rows, "nothing was re-tested"
    q = bh_q([mcnemar_p(c["confirm_fixes"], c["confirm_breaks"]) for c in rows])
    for c, qi in zip(rows, q):
        assert c["confirm_q_value"] == pytest.approx(qi, rel=1e-9, abs=1e-12)
        assert c["confirmed"] == bool(qi < fdr and c["confirm_fixes"] > c["confirm_breaks"])


def _check_holm(rows):
    """Holm-adjusted p-values recomputed by hand from the exact tests; holds = adjusted p < 0.05 and a gain."""
    adj = holm_p([mcnemar_p(h["heldout_fixes"], h["heldout_breaks"]) for h in rows])
    for h, a in zip(rows, adj):
        assert h["heldout_p_holm"] == pytest.approx(a, rel=1e-9, abs=1e-12)
        assert h["holds"] == bool(a < 0.05 and h["heldout_fixes"] > h["heldout_breaks"])


def test_chapter1_records(staged):
    r = record(staged, "01_screening")
    assert r["n_heads_screened"] == 270 and r["n_search"] == 8 and r["n_confirm"] == 10 and r["n_heldout"] == 8
    assert r["parameters"]["top_k"] == 3 and r["selector"] == "top-k screen" and r["design"]["top_k"] == 3
    conf = _confirm(r)
    assert len(conf) == 3
    _check_confirm(conf, r["parameters"]["fdr"])
    assert r["confirmed"] == [c["heads"] for c in conf if c["confirmed"]]
    assert r["min_detectable_gain"] is None or r["min_detectable_gain"] > 0.3  # 10 items: only huge gains (None: none)
    assert r["pipeline_power"] is None or 0 <= r["pipeline_power"] <= 1
    held = _heldout(r) if r["confirmed"] else r["exploratory_heldout"]
    shown = r["confirmed"] or [c["heads"] for c in conf]
    assert [h["heads"] for h in held][:len(shown)] == shown
    assert len(held) == len(shown) + (len(shown) > 1)  # each head, and all of them together
    if r["confirmed"]:
        for h in held:
            assert h["heldout_ci_low"] - 1e-9 <= h["heldout_delta_accuracy"] <= h["heldout_ci_high"] + 1e-9
        _check_holm(held)
        assert r["heldout_survivors"] == [h["heads"] for h in held if h["holds"]]
    finding = next(l for l in _markdown_outputs(staged, "01_screening").splitlines() if "What this chapter finds" in l)
    assert (f"{r['n_candidates']} of {r['n_heads_screened']} heads pass the candidate rule on {r['n_search']} search "
            f"items; {len(r['confirmed'])} of the top {len(conf)} are confirmed on {r['n_confirm']}") in finding
    assert r["n_candidates"] == len(r["candidates"]) <= r["n_heads_screened"]
    # margins are ranked: the first top head has the largest change in margin
    m = [c["search_delta_margin"] for c in conf]
    assert m == sorted(m, reverse=True)


def _markdown_outputs(staged, name) -> str:
    """Every markdown output the executed chapter displayed (the prose its code wrote)."""
    root, _ = staged
    nb = json.loads((root / "book" / "chapters" / f"{name}.ipynb").read_text())
    return "\n".join("".join(o["data"]["text/markdown"]) for c in nb["cells"] if c["cell_type"] == "code"
                     for o in c.get("outputs", []) if "text/markdown" in o.get("data", {}))


def test_landscape_records(staged):
    """The calibration read the search split only, kept exactly the tasks inside the band, and the verdicts ran on
    its picks; its accuracy is the screen's own unablated accuracy on the same items (a second code path)."""
    from cel_utils.calibration import pick

    r = record(staged, "01a_landscape")
    cal, (lo, hi) = pd.DataFrame(r["calibration"]), r["band"]
    ci = CI_PARAMETERS["01a_landscape"]
    assert set(cal.split) == {"search"} and (cal.n == r["parameters"]["n_calibrate"]).all()
    assert sorted(cal.task) == sorted(t for ts in ci["candidates"].values() for t in ts)
    assert (cal.kept == cal.search_baseline.between(lo, hi)).all()
    assert r["tasks"] == {m: ts for m, ts in pick(cal, ci["pairs_per_model"]).items() if ts}
    assert {(p["model"], p["task"]) for p in r["pairs"]} == {(m, t) for m, ts in r["tasks"].items() for t in ts}
    assert ci["n_calibrate"] == ci["n_search"]   # so the calibration's accuracy is the screen's, by another path
    for v in r["verdict"]:
        row = cal[(cal.model == v["model"]) & (cal.task == v["task"])].iloc[0]
        assert row.search_baseline == pytest.approx(v["search_baseline"])
    verdicts = {(v["model"], v["task"]): v for v in r["verdict"]}
    prose = _markdown_outputs(staged, "01a_landscape")
    for p in r["pairs"]:
        assert p["n_heads_screened"] == len(p["screened_heads"]) == (18 if p["model"] == "smollm2-135m" else 8)
        assert set(p["candidates"]) <= set(p["screened_heads"])
        conf, held = _confirm(p), _heldout(p)
        assert len(conf) == 2 and {c["heads"] for c in conf} <= set(p["screened_heads"])
        m = [c["search_delta_margin"] for c in conf]
        assert m == sorted(m, reverse=True)                      # re-tested: the top heads by search margin
        _check_confirm(conf, r["parameters"]["fdr"])
        assert p["confirmed"] == [c["heads"] for c in conf if c["confirmed"]]
        tested = [h["heads"] for h in held]
        assert tested == (p["confirmed"] + (["+".join(p["confirmed"])] if len(p["confirmed"]) > 1 else []))
        if held:
            _check_holm(held)
        v = verdicts[p["model"], p["task"]]
        line = next(l for l in prose.splitlines() if f"**{p['model']} / {p['task']}**" in l)
        assert f"accuracy {v['baseline']:.3f} on {p['n_confirm']} confirm items" in line
        if p["confirmed"]:
            gain = {c["heads"]: c["confirm_delta_accuracy"] for c in conf if c["confirmed"]}
            assert v["chosen"] == p["chosen"] == max(p["confirmed"], key=lambda h: gain[h])   # the largest confirm gain
            chosen = next(h for h in held if h["heads"] == v["chosen"])
            assert v["heldout_delta"] == pytest.approx(chosen["heldout_delta_accuracy"]) and v["holds"] == chosen["holds"]
            assert f"{chosen['heldout_delta_accuracy']:+.3f}" in line
        else:
            assert v["chosen"] is None and "not detected: a single head with gain 0.10" in line
            # "not detected" is the power of the whole pipeline, never the confirm test's MDE alone
            assert ("localized with probability" in line or "cannot be localized" in line) and "ruled out" not in line
        # the power of the whole pipeline: the verdict's figure is the table's row at gain 0.10, worst break rate
        rows = [w for w in r["power"] if (w["model"], w["task"]) == (p["model"], p["task"])]
        at = [w for w in rows if abs(w["gain"] - 0.10) < 1e-9]
        worst = max(at, key=lambda w: w["break_rate"])
        assert (v["pipeline_power"] is None and worst["power"] is None) or \
            v["pipeline_power"] == pytest.approx(worst["power"])
        assert p["mde_worst"] is None or p["mde"] is None or p["mde_worst"] >= p["mde"] - 1e-12
        for w in rows:
            assert w["power"] is None or 0 <= w["power"] <= (w["p_rank"] if w["p_rank"] is not None else 1) + 1e-12
        designs = [d for d in r["designs"] if (d["model"], d["task"]) == (p["model"], p["task"])]
        # a K leaves a head outside the top 2K to plant the gain into, or has no row (a partial screen)
        n_heads = next(v["n_heads"] for v in r["verdict"] if (v["model"], v["task"]) == (p["model"], p["task"]))
        assert {(d["n_search"], d["top_k"]) for d in designs} == \
            {(n, k) for n in (16, 32, 64, 128) for k in (5, 10) if 2 * k < n_heads}
        assert all(d["extrapolated"] == (d["n_search"] > p["n_search"]) for d in designs)
    # the cost rows are each chosen set on the held-out items of every task of its model (fdr 1.01 in the CI
    # parameters confirms heads, so the cost and class tables have rows)
    assert r["cost"] and r["classes"]
    for c in r["cost"]:
        assert c["ci_low"] - 1e-9 <= c["delta_accuracy"] <= c["ci_high"] + 1e-9
    kinds = {(c["task"], c["heads"]): c["kind"] for c in r["classes"]}
    assert not any(t == "addition" for t, _ in kinds)               # exact match: no classes
    assert set(kinds.values()) <= {"no class loses items", "a class loses items", "harmful", "unclear", "none"}
    sizes = {t["task"]: t for t in r["task_sizes"]}
    # the sizes table covers the calibrated candidates; the best-case MDE depends on the items used alone, so
    # tasks using as many confirm items have the same one (capitals, whose split is smaller, was in it before)
    assert set(sizes) == {t for ts in CI_PARAMETERS["01a_landscape"]["candidates"].values() for t in ts}
    full = [t for t in sizes.values() if t["confirm_items"] >= t["used"]]
    assert len(full) >= 2 and len({(t["used"], t["best_case_mde"]) for t in full}) == 1


def test_joint_search_records(staged):
    r = record(staged, "02_joint_search")
    assert [p["task"] for p in r["pairs"]] == ["addition", "agreement_rc"]
    prose = _markdown_outputs(staged, "02_joint_search")
    for p, v in zip(r["pairs"], r["verdict"]):
        assert len(p["pool"]) == 3 and p["n_subsets"] == 8 and len(p["explorer"]["subsets"]) == 8
        assert [b["size"] for b in p["sets"]] == [1, 2] and p["selector"] == "pool search"
        for b in p["sets"]:
            assert b["heldout_ci_low"] - 1e-9 <= b["heldout_delta_accuracy"] <= b["heldout_ci_high"] + 1e-9
            assert set(b["heads"].split("+")) <= set(p["pool"])
        _check_holm(p["sets"])   # Holm over the best set of each size, recomputed from fixes and breaks
        assert p["n_evaluations"]["exhaustive"] == 1 + 3 + 3 and p["n_evaluations"]["greedy"] <= 7
        ok = [b for b in p["sets"] if b["confirmed"]]
        assert p["chosen"] == (max(ok, key=lambda b: b["confirm_delta_accuracy"])["heads"] if ok else None)
        assert len(p["control"]) == 2 and 0 <= p["control_percentile"] <= 100
        line = next(l for l in prose.splitlines() if f"**{p['model']} / {p['task']}**" in l)
        if p["chosen"]:
            b = next(b for b in p["sets"] if b["heads"] == p["chosen"])
            assert f"{b['heldout_delta_accuracy']:+.3f}" in line and v["holds"] == b["holds"]
        else:
            assert "not detected" in line
    chosen = {p["chosen"] for p in r["pairs"] if p["chosen"]}
    assert chosen  # fdr 1.01 in CI_PARAMETERS confirms every best set, so the cost path runs
    assert {c["set"] for c in r["cross_task"]} == chosen
    assert {c["task"] for c in r["cross_task"]} == {"addition", "agreement_rc", "sentiment"}
    # beyond the pool: every compared selector (boosting included), every k, for every task; areas inside their CIs;
    # the prose from the numbers
    from cel_utils.selectors import compared

    SELECTORS = [s.label for s in compared()]
    sel = r["selectors"]
    for task in ("addition", "agreement_rc"):
        rows = [t for t in sel["table"] if t["task"] == task]
        assert {(t["selector"], t["k"]) for t in rows} == {(s, k) for s in SELECTORS for k in (1, 2)}
        summary = [s for s in sel["summary"] if s["task"] == task]
        assert [s["selector"] for s in summary] == list(SELECTORS)
        for s in summary:
            curve = [t["heldout_delta_accuracy"] for t in rows if t["selector"] == s["selector"]]
            assert s["area"] == pytest.approx(sum(curve) / len(curve))
            assert s["area_ci_low"] - 1e-9 <= s["area"] <= s["area_ci_high"] + 1e-9 and s["forward_equivalents"] >= 0
        gates = next(p for p in sel["pairs"] if p["task"] == task)
        gs = gates["gates"]["gates"]["settings"]
        n_runs = len(gs["inits"]) * len(gs["penalties"])
        assert n_runs == 2 and len(gates["gates"]["gates"]["loss_curve"]) == 2 * n_runs  # 2 steps per run in CI
        assert len(gates["gates"]["sets"]) == 2
        # the section ran on the model cast to selector_dtype, and the record says which
        assert gs["dtype"] is None and r["parameters"]["selector_dtype"] == "auto"   # the default (see 1b)
        # every selector went through the pipeline; its choice sits among the random selector's (the control)
        for s in summary:
            assert s["chosen"] is None or 0 <= s["control_percentile"] <= 100
        g = next(s for s in summary if s["selector"] == "learned gates")
        line = next(l for l in prose.splitlines() if l.startswith(f"**smollm2-135m / {task}**: the learned gates"))
        assert f"{g['area']:+.3f} [{g['area_ci_low']:+.3f}, {g['area_ci_high']:+.3f}]" in line
        b = next(s for s in summary if s["selector"] == "boost (direct effect)")   # boosting, not removing
        assert f"has an area of {b['area']:+.3f} [{b['area_ci_low']:+.3f}, {b['area_ci_high']:+.3f}]" in line


def test_screening_at_scale_records(staged):
    r = record(staged, "01b_screening_at_scale")
    (sp,) = r["speed"]
    assert sp["accuracy identical"] and sp["max margin diff"] < 1e-4
    # speed itself is a benchmark's business (benchmarks/bench_screen.py prints the ratio), not a test's
    assert sp["heads timed"] == 3 and sp["plain sequences"] >= sp["engine inputs"]
    methods = {a["method"] for a in r["agreement"]}
    assert methods == {"exact", "gradient", "compressed"}
    for a in r["agreement"]:
        assert 0 <= a["recall_top10_improvers"] <= 1
        if a.get("constant_estimate"):  # on 6 items the Lasso may shrink every head to 0: no rank correlation
            assert a["spearman"] is None
        else:
            assert -1 <= a["spearman"] <= 1


def test_chapter3_records(staged):
    r = record(staged, "03_theory")
    assert r["L_star"] == pytest.approx(0.758, abs=1e-3)
    assert r["W_star_C"] == pytest.approx(-0.212, abs=1e-3)
    assert r["gap"] < 1e-6
    assert r["c_share"] > 0.9 and r["n_c_carriers"] == 1
    a = r["c_head_ablation"]
    assert a["delta_loss_a"] < -0.1 < 0.1 < a["delta_loss_b"]
    assert a["delta_acc_a"] > 0 > a["delta_acc_b"]
    assert r["other_heads_best_delta_loss_a"] > -r["effect_threshold"]
    ctrl = {c["control"]: c for c in r["controls"]}
    assert ctrl["(b) weak conflict"]["best_dloss_a_min"] > -1e-3
    assert ctrl["(a) one value scalar per head"]["c_share"] < ctrl["the model (factored values, small init)"]["c_share"]
    cells = {(s["heads"], s["sigma"]) for s in r["sweep"]}
    assert cells == {(h, s) for h in (2, 4) for s in (1e-4, 1.0)}
    assert all("best_dloss_a" in s for s in r["sweep"])
    # the early phase: the checks' numbers are those of the recorded runs, and the prose prints them
    runs = r["early_runs"]
    assert len(runs) == 2 * 8 and {x["sigma"] for x in runs} == {1e-4, 1e-2}
    esc, pla, win, car = r["early_check"]
    assert win["measured"] == pytest.approx(np.mean([x["predicted_winner"] == x["winner"] for x in runs]))
    assert car["measured"] == pytest.approx(np.mean([x["predicted_carrier"] == x["carrier"] for x in runs]))
    x = np.log(1 / np.array([q["sigma"] for q in runs]))
    assert esc["measured"] == pytest.approx(np.polyfit(x, [q["T1"] for q in runs], 1)[0])   # a second fit
    assert esc["predicted"] == pytest.approx(r["rates"]["slope_escape"])
    prose = _markdown_outputs(staged, "03_theory")
    assert f"predicted slope {esc['predicted']:.1f}, fitted {esc['measured']:.1f}" in prose
    assert f"right in {round(car['measured'] * car['runs'])} of {car['runs']} runs" in prose
    # the bridge reads chapter 1a's screens: one row per model and ordered task pair
    land = record(staged, "01a_landscape")
    assert len(r["bridge"]) == sum(len(t) * (len(t) - 1) for t in land["tasks"].values())
    for b in r["bridge"]:
        pair = next(p for p in land["pairs"] if p["model"] == b["model"] and p["task"] == b["task_a"])
        d = dict(zip(pair["screened_heads"], pair["delta_margin"]))
        assert b["help_a"] == sum(v > 0 for v in d.values())
        assert b["confirmed"] == sum(d[h] > 0 for h in pair["confirmed"])


def test_wrong_parameter_type_is_a_clear_error(tmp_path):
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(book.NOTEBOOKS / "03_theory.ipynb"), str(tmp_path / "out.ipynb"),
                            parameters={"steps": "many"}, kernel_name="python3", cwd=str(tmp_path),
                            progress_bar=False)
    assert "parameter 'steps' must be int, got str 'many'" in str(e.value)
    assert not (tmp_path / "03_theory.record.json").exists()


def test_joint_search_chapter_in_mean_mode(tiny_folder, tmp_path):
    """Chapter 2 with mode="mean" runs end to end (on a user's own model folder: a tiny Llama)."""
    import papermill as pm

    d = tiny_folder("llama")
    params = {"models": [d], "tasks": {d: ["agreement", "sentiment"]}, "cost_tasks": {d: ["agreement", "sentiment"]},
              "n_search": 6, "n_confirm": 6, "n_heldout": 6, "n_explore": 6, "n_cost": 6, "screen_heads": "all",
              "pool_size": 3, "max_size": 2, "random_sets": 3, "random_pools": 1, "fdr": 1.01, "mode": "mean",
              "live_grid": False}
    pm.execute_notebook(str(book.NOTEBOOKS / "02_joint_search.ipynb"), str(tmp_path / "out.ipynb"),
                        parameters=params, kernel_name="python3", cwd=str(tmp_path), progress_bar=False)
    r = json.loads((tmp_path / "02_joint_search.record.json").read_text())
    assert [p["task"] for p in r["pairs"]] == ["agreement", "sentiment"]
    for p in r["pairs"]:
        assert p["n_subsets"] == 8 and [b["size"] for b in p["sets"]] == [1, 2]


def test_cel_verdict_reproduces_chapter_1a(staged, tmp_path):
    """`cel verdict` at chapter 1a's (CI) parameters (its ranking screen's dtype included) gives the chapter's
    row for SmolLM2 / addition: the same confirmed heads (in the same order), chosen head, held-out figures, MDEs and pipeline power (the same simulations: same seed)."""
    from cel_utils.cli import main

    p = CI_PARAMETERS["01a_landscape"]
    out = tmp_path / "v.json"
    assert main(["verdict", "--model", "smollm2-135m", "--task", "addition", "--heads", p["screen_heads"],
                 "--n-search", str(p["n_search"]), "--n-confirm", str(p["n_confirm"]), "--n-heldout",
                 str(p["n_heldout"]), "--top-k", str(p["top_k"]), "--fdr", str(p["fdr"]), "--power-sims",
                 str(p["power_sims"]), "--rank-dtype", record(staged, "01a_landscape")["parameters"]["rank_dtype"],
                 "--out", str(out)]) == 0
    got = json.loads(out.read_text())["row"]
    want = next(v for v in record(staged, "01a_landscape")["verdict"]
                if (v["model"], v["task"]) == ("smollm2-135m", "addition"))
    for k in ("baseline", "confirmed", "chosen", "heldout_delta", "heldout_ci_low", "heldout_ci_high",
              "heldout_p_holm", "holds", "mde",
              "mde_worst", "pipeline_power", "pipeline_power_best", "verdict"):
        assert got[k] == (pytest.approx(want[k], nan_ok=True) if isinstance(want[k], float) else want[k]), k


def test_capability_records(staged):
    """Chapter 1c: every battery has the eight formats (the default first), every check an estimate, interval and
    reading, a label from the list with its bootstrap distribution, the pair's operating characteristics, and ran
    on items after the ones chapter 1a used; each tested set is a localized verdict's chosen head, an equal of it,
    a chosen set, a confirmed head, the null control or a random head (or, nothing localized, an exploratory
    head); a brief battery stops only where the formats decide the label."""
    from cel_utils.battery import decided_by_formats
    from cel_utils.labels import LABELS

    GATES_ROLE = "learned gates' set (chapter 2)"
    r, land = record(staged, "01c_capability"), record(staged, "01a_landscape")
    assert r["batteries"] and len(r["labels"]) == len(r["batteries"])
    for it in r["items"]:
        assert it["sources"] == [["heldout", land["parameters"]["n_heldout"]], ["confirm", land["parameters"]["n_confirm"]]]
        assert 1 <= it["n"] <= CI_PARAMETERS["01c_capability"]["n_items"]
    localized = {(v["model"], v["task"]): v for v in land["verdict"] if v["holds"]}
    assert r["exploratory"] == (not localized)
    # every model of chapter 1a goes through the battery: its chosen head, or (nothing localized) an exploratory one
    models = {p["model"] for p in land["pairs"]}
    assert r["exploratory_models"] == sorted(models - {m for m, _ in localized})
    assert {b["model"] for b in r["batteries"]} == models
    for b in r["batteries"]:
        assert [f["name"] for f in b["formats"]][0] == "default" and len(b["formats"]) == 8
        assert b["label"] in LABELS and abs(sum(b["label_distribution"].values()) - 1) < 1e-9
        for name, c in b["checks"].items():
            assert c["reading"] in ("holds", "fails", "cannot tell"), name
            if c.get("estimate") is not None and c.get("ci_low") is not None:
                assert c["ci_low"] - 1e-9 <= c["estimate"] <= c["ci_high"] + 1e-9, name
        truths = {o["truth"] for o in b["operating_characteristics"]}
        assert {"capability", "near-threshold capability", "format-specific", "offset", "null"} <= truths <= {
            "capability", "near-threshold capability", "format-specific", "offset", "null", "label shift",
            "capability (semi-synthetic)"}
        has_null = any(x["role"] == "null control" and (x["model"], x["task"]) == (b["model"], b["task"])
                       for x in r["batteries"])
        assert ("capability (semi-synthetic)" in truths) == has_null   # fixes planted into the pair's null control
        stopped = not b["ablations"]
        assert not stopped or (b["role"] not in ("chosen head", "exploratory") and decided_by_formats(b["checks"]))
        if not stopped:
            assert set(b["ablations"]) >= {"zero", "mean", "resample"}
        if b["role"] == "chosen head":
            assert localized[b["model"], b["task"]]["chosen"] == b["heads"]
        if b["role"] == "equal of the chosen head":
            assert b["heads"] in localized[b["model"], b["task"]]["equals"].split(", ")
        assert ("constant" in b["ablations"]) == (b["role"] in ("chosen head", "exploratory"))
        chosen = b["role"] in ("chosen head", "exploratory")
        assert (b["collateral"]["text_tokens"] > 0) >= chosen, b["heads"]
    roles = {b["role"] for b in r["batteries"]}
    if localized:
        assert "null control" in roles and "random head" in roles
    base = [l for l in r["labels"] if l["role"] in ("null control", "random head")]
    assert [l["heads"] for l in r["base_rate"]] == [l["heads"] for l in base]
    joint = record(staged, "02_joint_search")
    for q in joint["selectors"]["pairs"]:
        c, v = q["gates"]["chosen"], (q["model"], q["task"])
        if v in localized and c:
            of_pair = [b for b in r["batteries"] if (b["model"], b["task"]) == v]
            got = [b["heads"] for b in of_pair if b["role"] == GATES_ROLE]
            assert got == [c] or (not got and c in {b["heads"] for b in of_pair}), (v, c, got)


def test_remove_scale_boost_chapter_records(staged):
    """Chapter 2b doses, boosts and bounds chapter 2's chosen sets on items chapter 2 did not use: each curve's
    intact point is exactly no change, its chosen dose is the choose items' best, removal's held-out test counts
    the items where the two doses disagree, boosting runs at a dose above 1, and the ceiling's null has its range around
    its mean (every figure from the record)."""
    rec, joint = record(staged, "02b_remove_scale_boost"), record(staged, "02_joint_search")
    p = CI_PARAMETERS["02b_remove_scale_boost"]
    assert rec["models"], "chapter 2b dosed nothing"
    assert rec["items"]["grade"][0] >= joint["parameters"]["n_heldout"]
    assert rec["items"]["choose"][0] >= joint["parameters"]["n_confirm"]
    for c in rec["curves"]:
        t = pd.DataFrame(c["curve"])
        assert sorted(t.alpha.unique()) == sorted(set(p["alphas"]) | {0.0, 1.0})
        assert (t[t.alpha == 1.0].delta_accuracy == 0).all() and (t[t.alpha == 1.0].delta_margin == 0).all()
        conf = t[(t.split == "confirm") & (t.alpha != 1.0)]
        best = conf.delta_accuracy.max()
        if best > 0:
            assert conf[conf.alpha == c["chosen_alpha"]].delta_accuracy.iloc[0] == best
        else:
            assert c["chosen_alpha"] == 1.0
        r = c["removal_vs_best"]
        held = t[t.split == "heldout"].set_index("alpha").delta_accuracy
        n = rec["items"]["grade"][1] - rec["items"]["grade"][0]
        assert r["delta"] == pytest.approx(held[c["chosen_alpha"]] - held[0.0], abs=1e-9)
        assert (r["better"] - r["worse"]) / n == pytest.approx(r["delta"], abs=1e-9)
        assert r["p_value"] == pytest.approx(mcnemar_p(r["better"], r["worse"]), abs=1e-12)
    coll = pd.DataFrame(rec["collateral"])
    for (m, heads), g in coll.groupby(["model", "heads"]):
        assert sorted(g.alpha) == sorted(set(p["alphas"]) | {0.0, 1.0})
        assert (g[g.alpha == 1.0][["nll_delta", "nll_low", "nll_high"]] == 0).all().all()
        assert (g.nll_low <= g.nll_delta + 1e-12).all() and (g.nll_delta <= g.nll_high + 1e-12).all()
    for b in rec["boost"]:
        assert b["alpha"] > 1 and b["boost"]["design"]["mode"].startswith("scale")
        assert b["remove"]["design"]["mode"] == "zero"
        assert b["both_mode"].startswith("scale 0 (") and f"x{b['alpha']:g}" in b["both_mode"]
        removed = b["remove"]["sets"][0]["heads"].split("+")
        assert all(set(removed) <= set(s["heads"].split("+")) for s in b["both"]["sets"])
    kinds = pd.DataFrame(rec["boost_table"]).groupby("model").intervention.apply(set)
    assert all(len(k) == 3 and "remove" in k for k in kinds)
    rc = pd.DataFrame(rec["recall"])
    for m, g in rc.groupby("model"):
        assert list(g.selector) == ["gradient"] + ["compressed", "gates"] * len(p["recall_budgets"])
        assert (g.heads.str.count(r"\+") + 1 == p["recall_k"]).all()
        assert ((g.recall * p["recall_k"]).round(9) % 1 == 0).all() and (g.ci_low <= g.ci_high).all()
        assert (g.exact_forward_equivalents > g.forward_equivalents.iloc[0]).all()
    for c in rec["ceiling"]:
        assert 0 < c["wrong_items"] <= p["ceiling_wrong"]
        assert 0 <= c["static"] <= 1 and 0 <= c["oracle"] <= 1   # a set can fix items no single head fixes
        assert c["null_low"] <= c["null_mean"] <= c["null_high"] and c["gap"] == pytest.approx(
            c["oracle"] - c["null_mean"])


def test_conflict_or_noise_chapter_records(staged):
    """Chapter 3a: every (setting, kind of head, scale) cell has n_seeds runs whose kinds add up, each share's CI
    is the exact binomial one (the beta-quantile form), each account's reading follows the chapter's rule from those
    CIs, and the real-model signature's p-values lie in (0, 1] with the observed share beside its null."""
    from scipy.stats import beta

    rec = record(staged, "03a_conflict_or_noise")
    p = CI_PARAMETERS["03a_conflict_or_noise"]
    t, runs = pd.DataFrame(rec["table"]), pd.DataFrame(rec["runs"])
    assert len(t) == 2 * 3 * len(p["sigmas"]) and (t.runs == p["n_seeds"]).all()
    assert np.allclose(t.two_sided + t.one_sided + t.none, 1)
    for r in t.itertuples():
        cell = runs[(runs.setting == r.setting) & (runs.variant == r.variant) & (runs.sigma == r.sigma)]
        k, n = int((cell.kind == "two-sided").sum()), len(cell)
        assert r.two_sided == k / n
        assert r.two_sided_low == pytest.approx(0.0 if k == 0 else beta.ppf(0.025, k, n - k + 1), abs=1e-9)
        assert r.two_sided_high == pytest.approx(1.0 if k == n else beta.ppf(0.975, k + 1, n - k), abs=1e-9)

    def read(lo, hi, high=True):
        return ("met" if high else "not met") if lo > 0.5 else ("not met" if high else "met") if hi < 0.5 \
            else "cannot tell"

    for q in rec["predictions"]:
        g = t[(t.setting == q["setting"]) & (t.sigma == q["sigma"])].set_index("variant")
        parts = [read(g.loc[v, "two_sided_low"], g.loc[v, "two_sided_high"]) for v in ("softmax", "softmax1", "gated")]
        assert q["conflict_parts"] == ", ".join(parts)
    for s in rec["signature"]:
        assert 0 < s["p_more_opposite"] <= 1 and 0 < s["p_more_same"] <= 1 and s["null_low"] <= s["null_high"]
    net = rec["network"]
    runs, v = pd.DataFrame(net["runs"]), pd.DataFrame(net["verdicts"])
    assert len(runs) == len(v) == 2 * 2 * p["net_seeds"]             # two attentions, the default two scales
    assert sorted({f["step"] for f in net["formation"]}) == list(range(0, p["net_steps"] + 1, p["net_every"]))
    for c in net["cells"]:
        cell = runs[(runs.attention == c["attention"]) & (runs.scale == c["scale"])]
        k = int((cell.kind == "two-sided").sum())
        assert c["runs"] == len(cell) and c["two_sided"] == k / len(cell)
        assert c["two_sided_low"] == pytest.approx(0.0 if k == 0 else beta.ppf(0.025, k, len(cell) - k + 1), abs=1e-9)
    for c in net["localized"]:
        cell = v[(v.attention == c["attention"]) & (v.scale == c["scale"])]
        held = cell[cell["holds"].fillna(False).astype(bool)] if "holds" in cell else cell.iloc[:0]
        assert c["localized"] == len(held)
        assert c["two_sided"] == int(((held.partner_change < 0) & (held.partner_p < 0.05)).sum())
    loc = pd.DataFrame(net["localized"])
    for q in net["predictions"]:
        g = loc[loc.scale == q["scale"]].set_index("attention")
        assert q["conflict_parts"] == ", ".join(read(g.loc[a, "two_sided_low"], g.loc[a, "two_sided_high"])
                                                for a in ("softmax", "softmax1"))
    for b in net["batteries"]:
        match = v[(v.attention == b["attention"]) & (v.run == b["run"])]
        assert b["heads"] == match.chosen.iloc[0] and b["task"] == "toy_a" and b["label"]


def test_the_landscape_calibrates_in_float32(staged):
    """Issue 51: chapter 1a's calibration (which tasks a build studies) runs in float32 on every CPU; on one with
    native bfloat16, where the screens rank in bfloat16, a calibration in the ranking dtype shows here."""
    rec = record(staged, "01a_landscape")
    assert rec["calibration"] and {r["dtype"] for r in rec["calibration"]} == {"float32"}
