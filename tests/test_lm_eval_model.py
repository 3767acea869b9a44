"""lm-eval's model type ``cel`` (cel_utils/lm_eval_model.py): with no heads it is lm-eval's own HF model, with
heads it scores what the book's engine and ``cel eval`` score, and ``cel lm-eval`` runs lm-eval's command line."""

import json

import numpy as np
import pytest

from cel_utils.errors import CELError

pytestmark = pytest.mark.real

lm_eval = pytest.importorskip("lm_eval")

from tests.test_peer_lm_eval import ITEMS, write_local_task  # noqa: E402  (a local multiple-choice task)

HEADS = "L14H8+L13H0"


@pytest.fixture()
def local_task(tmp_path, monkeypatch):
    return write_local_task(tmp_path, monkeypatch)


def _scores(model, tdir, model_args=""):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import cel_utils.lm_eval_model  # noqa: F401  (registers "cel")

    res = simple_evaluate(model=model, model_args=model_args, tasks=["cel_peer"], log_samples=True,
                          task_manager=TaskManager(include_path=str(tdir)), bootstrap_iters=0)
    samples = sorted(res["samples"]["cel_peer"], key=lambda s: s["doc_id"])
    return [[float(r[0]) for r in s["filtered_resps"]] for s in samples], res["results"]["cel_peer"]["acc,none"]


def test_no_heads_is_lm_evals_own_hf_model(smol, local_task):
    from lm_eval.models.huggingface import HFLM

    _, tdir = local_task
    theirs, acc_theirs = _scores(HFLM(pretrained=smol.model, tokenizer=smol.tokenizer, batch_size=4, device="cpu"),
                                 tdir)
    ours, acc_ours = _scores("cel", tdir, "model=smollm2-135m,batch_size=4")
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)          # the hooks change nothing when no head is removed
    assert acc_ours == acc_theirs


def test_heads_removed_match_the_engine_and_cel_eval(smol, local_task, tmp_path):
    from cel_utils import cli
    from cel_utils.ablation import parse_set
    from cel_utils.engine import evaluate_head_sets
    from cel_utils.scoring import encode_task
    from cel_utils.tasks import load_task

    data, tdir = local_task
    ablated, acc = _scores("cel", tdir, f"model=smollm2-135m,heads={HEADS},mode=zero,batch_size=4")
    enc = encode_task(smol, load_task(str(data)))
    ref = evaluate_head_sets(smol, enc, [[], parse_set(HEADS)], progress=False, result_cache=False)
    for i, it in enumerate(ITEMS):
        k = len(it["choices"])
        np.testing.assert_allclose(ablated[i], ref.choice_scores[1, i, :k], atol=1e-4, rtol=0)
    # the heads were removed: the scores moved away from the intact model's
    assert max(abs(a - b) for i, it in enumerate(ITEMS)
               for a, b in zip(ablated[i], ref.choice_scores[0, i, :len(it["choices"])])) > 1e-3
    out = tmp_path / "eval.json"
    assert cli.main(["eval", "--model", "smollm2-135m", "--task", str(data), "--ablate", HEADS.replace("+", ","),
                     "--no-cache", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["ablated"]["accuracy"] == pytest.approx(acc)
    # scale with alpha 0 is the same removal
    scaled, _ = _scores("cel", tdir, f"model=smollm2-135m,heads={HEADS},mode=scale,alpha=0,batch_size=4")
    for a, b in zip(scaled, ablated):
        np.testing.assert_array_equal(a, b)


def test_cel_lm_eval_runs_lm_evals_command_line(smol, local_task, tmp_path):
    from cel_utils import cli

    _, tdir = local_task
    out = tmp_path / "results"
    assert cli.main(["lm-eval", "run", "--model", "cel", "--model_args", f"model=smollm2-135m,heads={HEADS}",
                     "--tasks", "cel_peer", "--include_path", str(tdir), "--output_path", str(out),
                     "--batch_size", "4"]) == 0
    (result,) = out.rglob("results_*.json")
    acc = json.loads(result.read_text())["results"]["cel_peer"]["acc,none"]
    _, acc_direct = _scores("cel", tdir, f"model=smollm2-135m,heads={HEADS},batch_size=4")
    assert acc == acc_direct


def test_exported_folder_under_lm_evals_own_hf_type_equals_cel(smol, local_task, tmp_path):
    """``cel export`` writes the removal into the weights: lm-eval's own ``hf`` model type on the folder (no code of
    ours in its forward pass) gives the log-likelihoods of the model type ``cel`` on the source (1e-4) and the same
    accuracy, exactly."""
    from cel_utils.ablation import Ablation, parse_set
    from cel_utils.export import export_model

    _, tdir = local_task
    folder = export_model(smol, parse_set(HEADS), Ablation.of("zero"), tmp_path / "edited")
    theirs, acc_theirs = _scores("hf", tdir, f"pretrained={folder},dtype=float32,device=cpu,batch_size=4")
    ours, acc_ours = _scores("cel", tdir, f"model=smollm2-135m,heads={HEADS},batch_size=4")
    intact, _ = _scores("cel", tdir, "model=smollm2-135m,batch_size=4")
    for a, b, c in zip(theirs, ours, intact):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    assert max(abs(x - y) for a, c in zip(ours, intact) for x, y in zip(a, c)) > 1e-3   # the heads matter here
    assert acc_theirs == acc_ours


@pytest.mark.parametrize("args, message", [
    ({"mode": "resample"}, "resample pairs"),
    ({"mode": "scale"}, "alpha goes with mode=scale"),
    ({"mode": "mean"}, "means_task goes with mode=mean"),
    ({"heads": "L1X2"}, "malformed head"),
])
def test_bad_model_args_fail_in_one_line(args, message):
    from cel_utils.lm_eval_model import parse_model_args

    with pytest.raises(CELError, match=message):
        parse_model_args(**args)


def _lm_eval_reads_plugins() -> bool:
    """Whether the installed lm-eval loads model plugins from the entry-point group ``lm_eval.models`` (merged on
    its main branch, PR #4013; lm-eval 0.4.13 does not)."""
    import inspect

    import lm_eval.api.registry as registry

    src = inspect.getsource(registry)
    return "entry_points" in src and "lm_eval.models" in src


@pytest.mark.subprocess
def test_plugin_loading_finds_cel_without_importing_it():
    """Where lm-eval reads plugins: in a fresh process that never imports cel_utils, lm-eval's own registry
    resolves the model type ``cel`` to CELLM (so plain ``lm_eval --model cel`` works)."""
    import subprocess
    import sys

    if not _lm_eval_reads_plugins():
        pytest.skip(f"lm-eval {lm_eval.__version__} has no plugin loading (entry-point group lm_eval.models)")
    code = ("import sys; from lm_eval.api.registry import get_model; c = get_model('cel'); "
            "print(c.__module__ + ':' + c.__qualname__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "cel_utils.lm_eval_model:CELLM"
