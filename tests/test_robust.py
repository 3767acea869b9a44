"""Is it a capability? The battery (cel_utils.battery, cel_utils.robust) on tiny models with planted heads, and its
pieces against independent computations."""

import json
import random
import string

import pytest
import torch

from cel_utils import battery, formats, hooks, robust
from cel_utils.formats import Format
from cel_utils.labels import LABELS

PLANTED = (1, 2)
PREFIXES = ["", "x ", "> ", "q: ", "## ", "so ", "| ", "ok "]   # eight "formats": a different start each


def _prompts(n_per_split=6, seed=0):
    rng = random.Random(seed)
    out = []
    while len(out) < 3 * n_per_split:
        p = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 8))) + ":"
        if p not in out:
            out.append(p)
    return out


def _planted_model(prompts, constant: bool, transfer: bool):
    """A tiny Llama whose head PLANTED decides the items: with every head on, default-format items are answered
    wrong; without it, right. ``constant``: the head's output is a constant (value weights 0, a value bias), so
    another item's output is the same vector. ``transfer``: in the other formats the head hurts too (else it
    does nothing there: the answer is right with and without it, a ceiling). Other heads are near-silent. With
    ``transfer`` every format sits at the floor, which the label rule leaves out of transfer
    (:data:`cel_utils.labels.ROOM`): the tests that need those formats set the floor to 0 (``floorless``)."""
    import transformers

    from cel_utils.models import wrap_model
    from cel_utils.tiny import FAMILY_CONFIGS, char_tokenizer

    tok = char_tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=len(tok), attention_bias=True, **FAMILY_CONFIGS["llama"][1])
    torch.manual_seed(5)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    lm = wrap_model(model, tok, name="tiny-planted")
    L, H = PLANTED
    D = lm.head_dim
    attn = hooks.attention_module(lm, L)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
        for l in range(lm.n_layers):
            w = lm.out_proj(l).weight
            for h in range(lm.n_heads):
                w[:, h * D:(h + 1) * D] *= 8.0 if (l, h) == PLANTED else 0.001
        if constant:  # the value projection of PLANTED's key/value group gives a constant: its bias
            g = H // (lm.n_heads // lm.n_kv_heads)
            attn.v_proj.weight[g * D:(g + 1) * D] = 0
            attn.v_proj.bias[g * D:(g + 1) * D] = torch.randn(D) * 3
        states = {}
        block = lm.out_proj(L).weight[:, H * D:(H + 1) * D]
        saved = block.clone()
        for on in (True, False):
            if not on:
                block.zero_()
            states[on] = torch.stack([hooks.hidden_states(lm, torch.tensor([tok(pre + p)["input_ids"]]), None)[0, -1]
                                      for pre in PREFIXES for p in prompts])
            block.copy_(saved)
        n = len(prompts)
        default = torch.zeros(len(PREFIXES) * n, dtype=torch.bool)
        default[:n] = True
        y_with = torch.where(default | torch.tensor(transfer), -1.0, 1.0)
        x = torch.cat([states[False], states[True]])
        y = torch.cat([torch.ones(len(default)), y_with])
        d = _separate(x, y)
        ia, ib = (tok(c)["input_ids"][0] for c in "ab")
        emb = lm.model.get_output_embeddings()
        emb.weight[ia] = emb.weight[ib] + 5 * d / (x @ d).abs().min()
    return wrap_model(model, tok, name="tiny-planted")


def _separate(x, y, steps=3000):
    """A direction ``d`` with ``sign(x @ d) == y`` for every row (a linear separator found by gradient descent on
    a logistic loss, from the least-squares solution); fails when none is found."""
    d = torch.linalg.lstsq(x, y[:, None]).solution[:, 0].clone().requires_grad_(True)
    opt = torch.optim.Adam([d], lr=0.05)
    for _ in range(steps):
        with torch.enable_grad():
            margin = (x @ d) * y
            if (margin > 0.1).all():
                break
            opt.zero_grad()
            torch.nn.functional.softplus(1 - margin).mean().backward()
            opt.step()
    d = d.detach()
    assert ((x @ d) * y > 0).all(), "the planted states are not separated"
    return d


@pytest.fixture()
def floorless(monkeypatch):
    """Formats at the floor count for transfer (the planted model answers every item wrong with the head)."""
    from cel_utils import labels

    monkeypatch.setattr(labels, "ROOM", 0.0)


@pytest.fixture()
def planted_task(tmp_path, monkeypatch):
    """A JSONL task in three splits whose answer is always "a", and eight formats (different starts)."""
    prompts = _prompts()
    items = [{"prompt": p, "choices": ["a", "b"] if i % 2 else ["b", "a"], "answer": 0 if i % 2 else 1,
              "split": ("search", "confirm", "heldout")[i % 3]} for i, p in enumerate(prompts)]
    path = tmp_path / "planted.jsonl"
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    fmts = [Format("default", "", lambda it: it)] + [
        Format(f"start {pre!r}", "", lambda it, pre=pre: {**it, "prompt": pre + it["prompt"]}) for pre in PREFIXES[1:]]
    monkeypatch.setitem(formats.FORMATS, "planted", fmts)
    return str(path), prompts


def _battery(lm, path):
    return battery.battery(lm, path, {"L1H2": [PLANTED]}, n=6, n_search=6, text_tokens=0, generate=False,
                           constant_steps=0, n_boot=200, oc_sims=10)[0]


def test_a_constant_offset_head_is_an_offset(planted_task, floorless):
    """Removing a head whose output is a constant helps in every format, and zeroing it helps, but giving each
    item another item's output (the same constant) changes nothing: an offset, not a capability."""
    path, prompts = planted_task
    b = _battery(_planted_model(prompts, constant=True, transfer=True), path)
    assert b.checks["transfer"]["sign_test"]["positive"] == 7 and b.checks["transfer"]["reading"] == "holds"
    assert b.ablations["zero"]["delta"] == 1.0 and b.ablations["resample"]["delta"] == 0.0
    assert b.checks["offset"]["reading"] == "holds" and b.label == "offset"
    r, line = battery.row(b, "chosen head"), battery.sentence(b, "chosen head")   # chapter 1c's row and sentence
    assert r["label"] == "offset" and r["offset"] == "holds" and r["gain"] == 1.0
    share = b.label_distribution["offset"]
    assert f"is labelled **offset** ({'firm' if share >= 0.8 else 'weak'}: the same label on {share:.0%}" in line
    b.label_distribution = dict(b.label_distribution, offset=0.5)
    assert "(weak: the same label on 50% of item resamples)" in battery.sentence(b, "chosen head")


def test_a_gain_in_one_format_beside_formats_at_the_ceiling_is_not_called_format_specific(planted_task):
    """A head whose removal fixes the default format's items while every other format sits at the ceiling (right
    with and without it): there is no room to show a gain elsewhere, so the rule cannot tell whether it transfers
    and does not call it format-specific (the rule before counted the seven ties against it). A gain shown smaller
    in the other formats than in the default is format-specific: tests/test_labels.py plants one."""
    path, prompts = planted_task
    b = _battery(_planted_model(prompts, constant=False, transfer=False), path)
    f = b.formats.set_index("format")
    assert f.loc["default", "delta"] == 1.0 and (f["delta"].drop("default") == 0).all()
    assert (f["baseline"].drop("default") == 1).all()
    assert b.checks["transfer"]["reading"] == "cannot tell" and b.checks["transfer"]["formats"] == []
    assert b.checks["format_specific"]["reading"] == "cannot tell" and b.label != "format-specific"


def test_sets_sharing_one_battery_get_what_each_gets_alone(planted_task, floorless, monkeypatch):
    """One battery over two sets shares the unablated runs; a set's formats, ablation types, checks, control
    task, label and its distribution equal those of a battery run on that set alone (cache off: every number
    recomputed). Both sets are brief: the battery stops at the formats for the near-silent head, whose formats
    decide its label (no effect), and only for that one."""
    monkeypatch.setenv("CEL_NO_CACHE", "1")
    path, prompts = planted_task
    lm = _planted_model(prompts, constant=True, transfer=True)
    sets = {"L0H1": [(0, 1)], "L1H2": [PLANTED]}  # the planted head second
    kw = dict(n=6, n_search=6, text_tokens=0, generate=False, constant_steps=0, n_boot=200, oc_sims=10)
    brief, full = battery.battery(lm, path, sets, brief_sets=("L1H2", "L0H1"), **kw)
    alone = battery.battery(lm, path, {"L1H2": sets["L1H2"]}, **kw)[0]
    rec_full, rec_alone = full.record(), alone.record()
    rec_full.pop("operating_characteristics"), rec_alone.pop("operating_characteristics")  # the pair's, from the first set
    assert rec_full == rec_alone and alone.label == "offset"
    assert brief.label == "no effect" and brief.checks["effect"]["ci_high"] < 0.05
    assert brief.ablations == {} and brief.control_task == {}


def test_text_nll_runs_where_asked_and_where_the_cost_decides_the_label(planted_task, floorless, monkeypatch):
    """The text NLL (the costliest check) runs for the sets named in ``nll_sets`` and for a set that passes every
    earlier check (its label is capability, costly or inconclusive by the cost alone), not for a set an earlier
    check labels. Resampling is made to help here (the zero-ablated results), so the planted head passes every
    check; the other tasks are not measured, so a cheap text cost alone cannot make it a capability."""
    path, prompts = planted_task
    monkeypatch.setattr(robust, "english_text", lambda: ("Colourless green ideas sleep furiously. " * 8, "t"))
    from cel_utils import engine

    def resample_as_zero(lm, enc, heads=(), mode="zero", **kw):
        return engine.evaluate(lm, enc, heads, mode="zero" if getattr(mode, "mode", mode) == "resample" else mode, **kw)

    monkeypatch.setattr(robust, "evaluate", resample_as_zero)
    lm = _planted_model(prompts, constant=True, transfer=True)
    sets = {"L1H2": [PLANTED], "L0H1": [(0, 1)]}
    kw = dict(n=6, n_search=6, text_tokens=64, generate=False, constant_steps=0, n_boot=200, oc_sims=0)
    lazy = {b.heads: b for b in battery.battery(lm, path, sets, nll_sets=(), **kw)}
    assert lazy["L0H1"].label == "no effect" and lazy["L0H1"].collateral["text_tokens"] == 0
    assert lazy["L1H2"].collateral["text_tokens"] > 0 and lazy["L1H2"].checks["survives"]["reading"] == "holds"
    assert lazy["L1H2"].label == "inconclusive" and lazy["L1H2"].checks["cost"]["reading"] == "cannot tell"
    asked = {b.heads: b for b in battery.battery(lm, path, sets, nll_sets=("L0H1",), **kw)}
    assert asked["L0H1"].collateral["text_tokens"] > 0 and asked["L0H1"].label == "no effect"


def test_greedy_generation_matches_a_plain_loop(tiny_llama):
    """Batched greedy generation (left padding, KV cache, a head removed) gives the same texts as a plain loop
    that recomputes the whole sequence for every new token, one prompt at a time."""
    from cel_utils.ablation import ablate_heads

    lm = tiny_llama
    prompts = ["12 + 7 =", "The keys", "a", "When Mary and John went"]
    got = robust.greedy(lm, prompts, max_new=5, heads=[(1, 2)], batch_size=3)
    want = []
    with torch.no_grad(), ablate_heads(lm, [(1, 2)]):
        for p in prompts:
            ids = lm.tokenizer(p)["input_ids"]
            for _ in range(5):
                ids.append(int(lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
            want.append(lm.tokenizer.decode(ids[len(lm.tokenizer(p)["input_ids"]):], skip_special_tokens=True,
                                            clean_up_tokenization_spaces=False))
    assert got == want
    assert robust.greedy(lm, prompts, max_new=5) != got  # the head matters


def test_text_nll_matches_the_models_own_loss(tiny_llama, monkeypatch):
    """NLL per token against transformers' own language-model loss, chunk by chunk (an independent
    implementation), unablated and with a head removed."""
    from cel_utils.ablation import ablate_heads

    lm = tiny_llama
    text = "The quick brown fox jumps over the lazy dog. " * 20
    monkeypatch.setattr(robust, "english_text", lambda: (text, "test text"))
    got = robust.text_nll(lm, {"L1H2": [(1, 2)]}, n_tokens=300, chunk=64, batch_size=3, n_boot=100)  # a padded batch
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"][:301]
    chunks = [ids[i:i + 64] for i in range(0, 300, 63)]  # overlapping by one: tokens 1..300 each predicted once

    def loss(heads, mode="zero"):
        total, count = 0.0, 0
        with torch.no_grad(), ablate_heads(lm, heads, mode):
            for c in chunks:
                x = torch.tensor([c])
                total += float(lm.model(input_ids=x, labels=x).loss) * (len(c) - 1)
                count += len(c) - 1
        return total / count
    assert got["text_tokens"] == sum(len(c) - 1 for c in chunks) == 300  # the tokens asked for, no fewer
    assert got["baseline_nll"] == pytest.approx(loss([]), rel=1e-5)
    assert got["sets"]["L1H2"]["text_nll_delta"] == pytest.approx(loss([(1, 2)]) - loss([]), rel=1e-4, abs=1e-6)
    # the same head boosted (its output doubled): chapter 2b's cost of a boost
    from cel_utils.ablation import Ablation
    boost = Ablation.of("scale", alpha=2.0)
    got2 = robust.text_nll(lm, {"L1H2": [(1, 2)]}, n_tokens=300, chunk=64, batch_size=3, n_boot=100, mode=boost)
    want = loss([(1, 2)], boost) - loss([])
    assert got2["sets"]["L1H2"]["text_nll_delta"] == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert abs(want - (loss([(1, 2)]) - loss([]))) > 1e-4   # boosting is not removing here


def test_text_nll_cache_returns_what_a_fresh_run_computes(tiny_llama, monkeypatch, tmp_path):
    """A second call reads the unablated and ablated passes from the result cache (hits counted), with the same
    numbers as a run with the cache off; another head is another entry."""
    from cel_utils import cache

    lm = tiny_llama
    monkeypatch.setattr(robust, "english_text", lambda: ("Colourless green ideas sleep furiously. " * 15, "t"))
    monkeypatch.setenv("CEL_CACHE_DIR", str(tmp_path))
    first = robust.text_nll(lm, {"a": [(1, 2)]}, n_tokens=200, chunk=64, n_boot=50)
    hits = cache.STATS["hits"]
    again = robust.text_nll(lm, {"a": [(1, 2)], "b": [(0, 1)]}, n_tokens=200, chunk=64, n_boot=50)
    assert cache.STATS["hits"] == hits + 2  # the unablated pass and "a"; "b" is new
    monkeypatch.setenv("CEL_NO_CACHE", "1")
    fresh = robust.text_nll(lm, {"a": [(1, 2)], "b": [(0, 1)]}, n_tokens=200, chunk=64, n_boot=50)
    assert again["baseline_nll"] == first["baseline_nll"] == pytest.approx(fresh["baseline_nll"], rel=1e-6)
    for name in ("a", "b"):
        assert again["sets"][name]["text_nll_delta"] == pytest.approx(fresh["sets"][name]["text_nll_delta"],
                                                                      rel=1e-5, abs=1e-7)
    assert fresh["sets"]["a"]["text_nll_delta"] != pytest.approx(fresh["sets"]["b"]["text_nll_delta"], abs=1e-7)


def test_fixes_by_kind_and_answer_of():
    assert robust.answer_of(" 79\n") == "79" and robust.answer_of("\n") == ""
    kinds = robust.fixes_by_kind([" 7", " 790", " 35", " 79"], [" 79", " 79", " 79", " 80"], ["79", "79", "79", "80"])
    assert kinds == {"content": 2, "termination": 2}


def test_cel_robust_meets_its_contract(tiny_folder, tmp_path, capsys):
    """`cel robust` writes the contract's fields (formats with the default first, every check with its estimate,
    CI and reading, four ablation types, generation with replayable prompts and fixes by kind for addition,
    collateral, a label from the list with its bootstrap distribution, the operating characteristics) and refuses
    bad input with one line, exit 2, nothing written. A head of this random model, whose addition it gets wrong
    with and without the head, is never called format-specific."""
    from cel_utils.cli import main

    folder = tiny_folder("llama")
    out = tmp_path / "r.json"
    argv = ["robust", "--model", folder, "--task", "addition", "--heads", "L1H2", "--n", "6", "--text-tokens", "120",
            "--constant-steps", "1", "--other-tasks", "agreement", "--no-cache"]
    assert main(argv + ["--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert [f["name"] for f in d["formats"]][0] == "default" and len(d["formats"]) == 8
    assert all(set(f) >= {"name", "n", "baseline", "delta", "ci_low", "ci_high"} for f in d["formats"])
    assert d["n"] == 6 and d["items"] == [["heldout", 0]]
    for name, c in d["checks"].items():
        assert c["reading"] in ("holds", "fails", "cannot tell") and "estimate" in c, name
    assert set(d["checks"]) >= {"effect", "transfer", "format_specific"}
    assert set(d["checks"]["transfer"].get("sign_test", {"positive": 0})) >= {"positive"}
    assert abs(sum(d["label_distribution"].values()) - 1) < 1e-9
    assert {r["truth"] for r in d["operating_characteristics"]} == {"capability", "near-threshold capability",
                                                                   "format-specific", "offset", "null"}
    assert d["label"] != "format-specific"
    g = d["generation"]   # one set asked about: every measurement runs, whatever the formats decide
    assert set(d["ablations"]) == {"zero", "mean", "resample", "constant"}
    assert all(set(a) >= {"delta", "ci_low", "ci_high"} for a in d["ablations"].values())
    assert set(g) >= {"baseline_accuracy", "ablated_accuracy", "delta", "ci_low", "ci_high",
                      "agreement_with_teacher_forced", "items", "prefix"} and len(g["items"]) == 6
    assert set(g["items"][0]) == {"prompt", "target", "baseline_text", "ablated_text"}
    assert (g["prefix"] + g["items"][0]["prompt"]).count("\n") >= 3   # the demonstrations, whole
    assert set(d["fixes_by_kind"]) == {"content", "termination"}
    c = d["collateral"]
    assert [t["task"] for t in c["other_tasks"]] == ["agreement"]
    assert c["text_tokens"] >= 100 and isinstance(c["text_nll_delta"], float)   # asked about alone: measured
    assert d["label"] in LABELS
    for bad, msg in [(["--heads", "all"], "head set"), (["--split", "search"], "chose nothing"),
                     (["--text-tokens", "-1"], "at least 0"), (["--task", "capitals"], "no prompt formats")]:
        capsys.readouterr()
        bad_out = tmp_path / "bad.json"
        args = [a for a in argv]
        for k in range(0, len(bad), 2):
            if bad[k] in args:
                args[args.index(bad[k]) + 1] = bad[k + 1]
            else:
                args += bad[k:k + 2]
        assert main(args + ["--out", str(bad_out)]) == 2 and not bad_out.exists()
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and msg in err, err


def test_the_best_constant_is_fit_in_fit_dtype_and_reported_in_float32(monkeypatch):
    """The best constant is a choice on the search split: fit on the bfloat16 copy when asked, its held-out effect
    evaluated on the float32 model (the same margins as a float32 evaluation of the fitted constant)."""
    import numpy as np

    from cel_utils import robust
    from cel_utils.ablation import Ablation
    from cel_utils.engine import evaluate
    from cel_utils.scoring import encode_task
    from cel_utils.tasks import load_task
    from cel_utils.tiny import tiny_model

    seen, real = [], robust.best_constant

    def spy(lm, *a, **k):
        c = real(lm, *a, **k)
        seen.append((next(lm.model.parameters()).dtype, c))
        return c

    monkeypatch.setattr(robust, "best_constant", spy)
    lm = tiny_model("llama")
    task, search = load_task("ioi", "heldout", n=8), load_task("ioi", "search", n=8)
    out = robust.ablation_types(lm, task, search, [(0, 1)], n_boot=50, constant_steps=1, fit_dtype="bfloat16")
    assert [d for d, _ in seen] == [torch.bfloat16]
    want = evaluate(lm, encode_task(lm, task), [(0, 1)], mode=Ablation("constant", seen[0][1].float()))
    assert np.array_equal(out["constant"]["margins"], want.margin[0])


def test_the_text_window_grows_for_every_set_when_one_cost_interval_is_too_wide(monkeypatch):
    """Issue 50: Gemma's chosen heads' NLL interval on 6000 tokens was too wide to say 'no cost'. Where any set's
    95% CI is at least nll_width wide, every set is measured again on text_max_tokens (one window for the pair);
    where all are narrow, the first window stands. The stop reads widths only (planted text_nll)."""
    from cel_utils import battery as bat

    calls = []

    def fake(lm, sets, n_tokens, **kw):
        calls.append((n_tokens, sorted(sets)))
        half = {"a": 0.01, "b": 0.04 * 6000 / n_tokens}      # b's interval narrows with more text
        return {"source": "x", "text_tokens": n_tokens, "baseline_nll": 3.0,
                "sets": {n: {"text_nll_delta": 0.3, "ci_low": 0.3 - half[n], "ci_high": 0.3 + half[n]} for n in sets}}

    monkeypatch.setattr(bat, "text_nll", fake)
    s = bat.RobustSettings(text_tokens=6000, text_max_tokens=20000, nll_width=0.05)
    out = bat.text_window(None, {"a": [(0, 0)], "b": [(1, 1)]}, s)
    assert calls == [(6000, ["a", "b"]), (20000, ["a", "b"])] and out["widened_for"] == ["b"]
    assert out["text_tokens"] == 20000
    calls.clear()
    out = bat.text_window(None, {"a": [(0, 0)]}, s)              # narrow: one window
    assert calls == [(6000, ["a"])] and "widened_for" not in out
    calls.clear()
    bat.text_window(None, {"b": [(1, 1)]}, bat.RobustSettings(text_tokens=6000))   # no larger window asked
    assert calls == [(6000, ["b"])]


def test_the_battery_picks_its_sets_from_the_records(tmp_path, monkeypatch):
    """Chapter 1c's set picker (battery.pick_sets, once the notebook's own code) on planted records: model m has two
    localized pairs with formats (agreement first: chapter 2 searched it, so its chosen set joins), one pair per
    model goes through (the other is listed); the chosen head, its equal, chapter 2's set, the learned gates' set,
    the other confirmed head, the null control (the same layer's least-moving head that is not confirmed) and the
    random heads (none confirmed); model g, with nothing localized, gets its strongest search head, exploratory."""
    import json

    from cel_utils import battery as bat
    from cel_utils.records import Records

    monkeypatch.setattr(bat, "load_model", lambda name: name)
    monkeypatch.setattr(bat, "screen_work", lambda lm, task: {"addition": 1, "agreement": 2}.get(task.name, 3))
    heads = ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]

    def pair(model, task, confirmed, margins):
        return {"model": model, "task": task, "screened_heads": heads, "delta_margin": margins,
                "delta_accuracy": [0.0] * 6, "confirmed": confirmed,
                "sets": [{"heads": h, "offered": True, "confirm_delta_accuracy": g} for h, g in
                         zip(confirmed, (0.2, 0.1, 0.05))]}

    pairs = [pair("m", "agreement", ["L1H1", "L1H2", "L0H0"], [0.3, 0.02, -0.01, 0.05, 0.4, 0.01]),
             pair("m", "addition", ["L0H1"], [0.0, 0.5, 0.1, 0.2, 0.0, 0.1]),
             pair("g", "agreement", [], [0.1, 0.9, 0.0, 0.2, 0.3, -0.1])]
    verdict = [{"model": "m", "task": "agreement", "holds": True, "chosen": "L1H1", "equals": "L1H1, L1H2"},
               {"model": "m", "task": "addition", "holds": True, "chosen": "L0H1", "equals": "L0H1"},
               {"model": "g", "task": "agreement", "holds": False, "chosen": None, "equals": ""}]
    (tmp_path / "01a_landscape.record.json").write_text(json.dumps({"verdict": verdict, "pairs": pairs}))
    (tmp_path / "02_joint_search.record.json").write_text(json.dumps(
        {"tasks": {"m": ["agreement"]}, "pairs": [{"model": "m", "task": "agreement", "chosen": "L1H1+L1H2"}]}))
    t, left, exploratory = bat.pick_sets(Records(tmp_path), battery_pairs=1, other_confirmed=2, random_heads=2)
    m = t[t.model == "m"]
    assert set(m.task) == {"agreement"} and left == ["m / addition (L0H1)"] and not exploratory
    roles = dict(zip(m.role, m.heads))
    assert roles["chosen head"] == "L1H1" and roles["equal of the chosen head"] == "L1H2"
    assert roles["chosen set (chapter 2)"] == "L1H1+L1H2" and roles["confirmed head"] == "L0H0"
    assert roles["null control"] == "L1H0"   # L1H2 moves less, but it is confirmed: L1H0 is the least of the rest
    randoms = m[m.role == "random head"].heads.tolist()
    assert 1 <= len(randoms) <= 2 and not set(randoms) & {"L1H1", "L1H2", "L0H0"}   # a draw already picked drops
    assert len(set(m.heads)) == len(m)
    g = t[t.model == "g"]
    assert g.role.tolist() == ["exploratory", "null control"] and g.heads.tolist() == ["L0H1", "L0H2"]


def test_text_nll_starts_each_chunk_as_the_tokenizer_starts_a_text(tiny_llama, monkeypatch):
    """Gemma's tokenizer puts <bos> before every text and its task prompts have it; the text chunks lacked it, and
    Gemma's NLL and its heads' costs were measured out of distribution (5.76 nats/token instead of 3.52). A
    tokenizer planted to add a start token: every chunk starts with it, it is never scored, the same tokens are
    counted, and the NLL equals transformers' own loss on [start] + chunk with the first text token unlabelled."""
    from dataclasses import replace

    text = "The quick brown fox jumps over the lazy dog. " * 20
    monkeypatch.setattr(robust, "english_text", lambda: (text, "test text"))
    inner = tiny_llama.tokenizer
    START = 7

    class WithStart:
        def __call__(self, t, add_special_tokens=True, **kw):
            out = dict(inner(t, add_special_tokens=False, **kw))
            out["input_ids"] = ([START] if add_special_tokens else []) + list(out["input_ids"])
            return out

        def __getattr__(self, name):
            return getattr(inner, name)

    lm = replace(tiny_llama, tokenizer=WithStart())
    assert robust.start_tokens(lm.tokenizer) == [START] and robust.start_tokens(inner) == []
    got = robust.text_nll(lm, {"L1H2": [(1, 2)]}, n_tokens=300, chunk=64, batch_size=3, n_boot=100)
    ids = inner(text, add_special_tokens=False)["input_ids"][:301]
    chunks = [ids[i:i + 64] for i in range(0, 300, 63)]

    def loss(heads):
        from cel_utils.ablation import ablate_heads

        total, count = 0.0, 0
        with torch.no_grad(), ablate_heads(lm, heads, "zero"):
            for c in chunks:
                x = torch.tensor([[START] + c])
                labels = x.clone()
                labels[0, :2] = -100                 # the start token, and the first text token after it
                total += float(lm.model(input_ids=x, labels=labels).loss) * (len(c) - 1)
                count += len(c) - 1
        return total / count
    assert got["text_tokens"] == 300
    assert got["baseline_nll"] == pytest.approx(loss([]), rel=1e-5)
    assert got["sets"]["L1H2"]["text_nll_delta"] == pytest.approx(loss([(1, 2)]) - loss([]), rel=1e-4, abs=1e-6)
