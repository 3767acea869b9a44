"""A peer as the scoring oracle: lm-evaluation-harness scores the same JSONL items with the same SmolLM2 weights and
tokenizer, and its per-choice log-likelihoods and accuracy must match ours.

The items include a prompt that ends in a space (both move it into the continuation) and multi-token choices.
Ties: lm-eval's argmax takes the first of tied choices, while `cel` counts a tie as wrong (a model that cannot
tell the answer from another choice has not answered); the items here have no ties (checked below), and the tie
rule itself is tested by ``test_scoring.py::test_tied_choices_count_as_wrong`` on a model built to tie.
"""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.real

lm_eval = pytest.importorskip("lm_eval")

ITEMS = [
    {"prompt": "The capital of France is", "choices": [" Paris", " Berlin", " Rome"], "answer": 0},
    {"prompt": "2 + 2 = ", "choices": ["4", "5", "22"], "answer": 0},                      # prompt ends in a space
    {"prompt": "The opposite of hot is", "choices": [" cold", " warm and humid", " lukewarm"], "answer": 0},
    {"prompt": "Monday, Tuesday,", "choices": [" Wednesday", " Friday", " Sunday morning"], "answer": 0},
    {"prompt": "The keys to the cabinet", "choices": [" is", " are"], "answer": 1},
    {"prompt": "Water freezes at zero degrees ", "choices": ["Celsius", "Fahrenheit"], "answer": 0},
]

YAML = """task: cel_peer
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""


def write_local_task(tmp_path, monkeypatch):
    """The items as a JSONL file and lm-eval's YAML task ``cel_peer`` reading it, offline; (data, task folder)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(it) + "\n" for it in ITEMS))
    tdir = tmp_path / "tasks"
    tdir.mkdir()
    (tdir / "cel_peer.yaml").write_text(YAML.format(path=data))
    return data, tdir


def test_loglikelihoods_match_lm_eval(smol, tmp_path, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from cel_utils.engine import evaluate_head_sets
    from cel_utils.scoring import encode_task
    from cel_utils.tasks import load_task

    data, tdir = write_local_task(tmp_path, monkeypatch)

    peer = HFLM(pretrained=smol.model, tokenizer=smol.tokenizer, batch_size=4, device="cpu")
    res = simple_evaluate(model=peer, tasks=["cel_peer"], task_manager=TaskManager(include_path=str(tdir)),
                          log_samples=True, bootstrap_iters=0)
    samples = sorted(res["samples"]["cel_peer"], key=lambda s: s["doc_id"])
    theirs = [[float(r[0]) for r in s["filtered_resps"]] for s in samples]

    ours = evaluate_head_sets(smol, encode_task(smol, load_task(str(data))), [[]], progress=False, result_cache=False)
    for i, it in enumerate(ITEMS):
        k = len(it["choices"])
        np.testing.assert_allclose(ours.choice_scores[0, i, :k], theirs[i], atol=1e-4, rtol=0)
    assert all(len(set(t)) == len(t) for t in theirs)  # no ties, where the two conventions would differ
    # lm-eval's own accuracy metric against cel's accuracy (its argmax rule, not its log-likelihoods, decides)
    assert res["results"]["cel_peer"]["acc,none"] == pytest.approx(float(ours.accuracy[0]))
