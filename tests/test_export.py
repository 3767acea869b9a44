"""``cel export``: a head set's removal written into the weights. The oracle is plain transformers on the written
folder (no hook of ours) against the book's hooked ablation of the source, on every family of the model room."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cel_utils import cli
from cel_utils.ablation import Ablation, ablate_heads, compute_head_means
from cel_utils.errors import CELError
from cel_utils.export import edited_model, export_model, heldout_rows
from cel_utils.tiny import FAMILY_CONFIGS, tiny_model

HEADS = [(0, 1), (1, 3)]
PROMPTS = ["3 + 4 = 7", "the cat sat", "ab ab ab", "q: why? a:"]
MEAN_FAMILIES = ["llama", "gemma3", "gpt2", "gpt_neox"]


def _ids(lm):
    enc = lm.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def _plain(folder):
    """The folder as anyone loads it: transformers alone, no code of ours."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32).eval()


def _hooked_logits(lm, heads, ablation):
    ids, att = _ids(lm)
    with torch.no_grad(), ablate_heads(lm, heads, ablation):
        return lm.model(input_ids=ids, attention_mask=att).logits


def _folder_logits(lm, folder):
    ids, att = _ids(lm)
    with torch.no_grad():
        return _plain(folder)(input_ids=ids, attention_mask=att).logits


def _case(family, mode):
    lm = tiny_model(family, bias_noise=True)
    if mode == "zero":
        return lm, Ablation.of("zero")
    if mode == "scale":
        return lm, Ablation.of("scale", alpha=2.5)
    ids, _ = _ids(lm)
    return lm, Ablation.of("mean", means=compute_head_means(lm, [list(map(int, r)) for r in ids]))


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
@pytest.mark.parametrize("mode", ["zero", "scale", "mean"])
def test_plain_transformers_on_the_folder_equals_the_hooked_ablation(family, mode, tmp_path):
    if mode == "mean" and family not in MEAN_FAMILIES:
        pytest.skip("refused for this family (test_mean_refused_where_no_bias_can_hold_it)")
    lm, ablation = _case(family, mode)
    folder = export_model(lm, HEADS, ablation, tmp_path / "out")
    want = _hooked_logits(lm, HEADS, ablation)
    got = _folder_logits(lm, folder)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    intact = _hooked_logits(lm, [], Ablation.of("zero"))
    assert (want - intact).abs().max() > 1e-2           # the heads matter: the comparison can tell
    if mode == "mean":
        assert json.loads((folder / "config.json").read_text()).get("attention_bias", True) is True


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_mean_refused_where_no_bias_can_hold_it(family, tmp_path):
    lm, ablation = _case(family, "mean")
    with pytest.raises(CELError, match="cannot export mean ablation"):
        export_model(lm, HEADS, ablation, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_scale_one_is_bit_identical_to_the_source(family, tmp_path):
    lm = tiny_model(family)
    folder = export_model(lm, HEADS, Ablation.of("scale", alpha=1.0), tmp_path / "out")
    src, got = lm.model.state_dict(), _plain(folder).state_dict()
    assert src.keys() == got.keys()
    assert all(torch.equal(src[k], got[k]) for k in src)


def test_the_folder_is_for_other_tools_and_other_users(tmp_path):
    """config.json names the architecture (tools such as llama.cpp's converter read it) and no local path; the
    folder's permissions follow the umask (mkdtemp's are private); mean export records its means task."""
    import os
    import stat

    lm, ablation = _case("llama", "mean")
    old = os.umask(0o022)
    try:
        folder = export_model(lm, HEADS, ablation, tmp_path / "out", means_task="addition")
    finally:
        os.umask(old)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and not cfg.get("_name_or_path")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert json.loads((folder / "export.json").read_text())["means_task"] == "addition"
    assert "task addition's search-split prompts" in (folder / "README.md").read_text()


def test_only_the_heads_columns_change(tmp_path):
    """Zero export: the source's projection columns of exactly the named heads are zero, every other weight is the
    source's own (the copy leaves the loaded model untouched)."""
    lm = tiny_model("llama")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    edited = edited_model(lm, HEADS, Ablation.of("zero")).state_dict()
    assert all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
    d = lm.head_dim
    for k, v in edited.items():
        if k.endswith("o_proj.weight"):
            layer = int(k.split(".")[2])
            dead = [h for l, h in HEADS if l == layer]
            for h in range(lm.n_heads):
                cols = v[:, h * d:(h + 1) * d]
                assert (cols == 0).all() if h in dead else torch.equal(cols, before[k][:, h * d:(h + 1) * d])
        else:
            assert torch.equal(v, before[k]), k


def _run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cel_eval_of_the_folder_equals_the_ablated_source(tiny_folder, tmp_path, capsys):
    src = tiny_folder("llama")
    task = tmp_path / "t.jsonl"
    task.write_text("".join(json.dumps({"prompt": f"{i} + {i} =", "choices": [f" {2 * i}", f" {2 * i + 1}"],
                                        "answer": 0}) + "\n" for i in range(8)))
    out = tmp_path / "edited"
    code, _, err = _run(["export", "--model", src, "--heads", "L0H1+L1H3", "--out", str(out)], capsys)
    assert code == 0, err
    code, a, err = _run(["eval", "--model", src, "--task", str(task), "--ablate", "L0H1,L1H3", "--no-cache"], capsys)
    assert code == 0, err
    code, b, err = _run(["eval", "--model", str(out), "--task", str(task), "--no-cache"], capsys)
    assert code == 0, err
    ablated, exported = json.loads(a)["ablated"], json.loads(b)["baseline"]
    assert exported["accuracy"] == ablated["accuracy"]
    assert exported["mean_margin"] == pytest.approx(ablated["mean_margin"], abs=1e-4)
    assert json.loads(a)["baseline"]["mean_margin"] != pytest.approx(ablated["mean_margin"], abs=1e-3)
    card = (out / "README.md").read_text()
    assert "L0H1+L1H3" in card and "cel export --model" in card


@pytest.mark.parametrize("argv,msg", [
    (["--heads", "L0-H1"], "malformed head"),
    (["--heads", "L9H0"], "out of range"),
    (["--heads", "L0H1", "--mode", "resample"], "cannot export resample"),
    (["--heads", "L0H1", "--alpha", "2"], "--alpha goes with --mode scale only"),
    (["--heads", "L0H1", "--mode", "scale"], "--mode scale needs --alpha"),
    (["--heads", "L0H1", "--mode", "mean"], "--mode mean needs --means-task"),
    (["--heads", "L0H1", "--mode", "median"], "cel export takes --mode zero, scale or mean"),
])
def test_bad_input_exit_2_one_line_nothing_written(argv, msg, tiny_folder, tmp_path, capsys):
    out = tmp_path / "edited"
    code, _, err = _run(["export", "--model", tiny_folder("llama"), "--out", str(out), *argv], capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_family_that_cannot_hold_means_is_refused_before_any_work(tiny_folder, tmp_path, capsys):
    out = tmp_path / "edited"
    code, _, err = _run(["export", "--model", tiny_folder("qwen2"), "--heads", "L0H1", "--mode", "mean",
                         "--means-task", "addition", "--out", str(out)], capsys)
    assert code == 2 and "cannot export mean ablation for the qwen2 family" in err
    assert list(tmp_path.iterdir()) == []


def test_non_empty_folder_needs_force(tiny_folder, tmp_path, capsys):
    out = tmp_path / "edited"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    argv = ["export", "--model", tiny_folder("llama"), "--heads", "L0H1", "--out", str(out)]
    code, _, err = _run(argv, capsys)
    assert code == 2 and "not empty" in err and (out / "mine.txt").read_text() == "keep"
    code, _, err = _run([*argv, "--force"], capsys)
    assert code == 0 and not (out / "mine.txt").exists() and (out / "model.safetensors").exists()


def test_an_interrupt_leaves_no_half_written_folder(tmp_path, monkeypatch):
    from cel_utils import export

    def interrupted(model, tok, folder):
        (Path(folder) / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "write_folder", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_model(tiny_model("llama"), HEADS, Ablation.of("zero"), tmp_path / "edited")
    assert list(tmp_path.iterdir()) == []


def test_the_card_carries_the_records_heldout_figures(tmp_path):
    record = {"model": "tiny", "task": "ioi", "n_heldout": 200,
              "sets": [{"heads": "L0H1+L1H3", "heldout_baseline": 0.5, "heldout_accuracy": 0.6,
                        "heldout_delta_accuracy": 0.1, "heldout_ci_low": 0.05, "heldout_ci_high": 0.15, "holds": True},
                       {"heads": "L0H1", "heldout_delta_accuracy": 0.3}]}
    assert [r["heldout_delta_accuracy"] for r in heldout_rows(record, "L0H1+L1H3")] == [0.1]
    folder = export_model(tiny_model("llama"), HEADS, Ablation.of("zero"), tmp_path / "o", record=record)
    card = (folder / "README.md").read_text()
    assert "| ioi | 200 | 0.500 | 0.600 | +0.100 | [+0.050, +0.150] | True |" in card and "+0.300" not in card


@pytest.mark.real
@pytest.mark.parametrize("name,heads,mode,task", [
    ("smollm2-135m", [(0, 7), (11, 6)], "zero", "sentiment_1shot"),
    ("smollm2-135m", [(14, 8)], "mean", "ioi"),
    ("gemma3-270m", [(5, 3), (6, 3)], "zero", "comparison"),
    ("gemma3-270m", [(10, 1)], "scale", "sentiment_1shot"),
])
def test_built_in_models_export_to_what_the_engine_scores(name, heads, mode, task, tmp_path):
    """Both built-in models: plain transformers on the written folder scores every item as the engine scores the
    source with the same ablation (margins 1e-4, the same correct items)."""
    from cel_utils.engine import evaluate
    from cel_utils.export import task_means
    from cel_utils.models import load_model, wrap_model
    from cel_utils.scoring import encode_task
    from cel_utils.tasks import load_task

    lm = load_model(name)
    ablation = {"zero": Ablation.of("zero"), "scale": Ablation.of("scale", alpha=1.7),
                "mean": Ablation.of("mean", means=task_means(lm, task) if mode == "mean" else None)}[mode]
    folder = export_model(lm, heads, ablation, tmp_path / "out")
    items = load_task(task, split="confirm", n=40)
    want = evaluate(lm, encode_task(lm, items), heads, mode=ablation, result_cache=False)
    plain = wrap_model(_plain(folder), lm.tokenizer, name="exported")
    got = evaluate(plain, encode_task(plain, items), [], result_cache=False)
    np.testing.assert_allclose(got.margin, want.margin, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(got.correct, want.correct)
    intact = evaluate(lm, encode_task(lm, items), [], result_cache=False)
    assert np.abs(intact.margin - want.margin).max() > 1e-3       # the heads matter on these items
    card = (folder / "README.md").read_text()
    assert "GGUF" in card and "not the full-precision original" in card and lm.weights_hash in card
    assert (folder / "NOTICE").exists() == (name == "gemma3-270m")      # the Gemma Terms of Use's notice
