import numpy as np
import pytest
import torch

from cel_utils.ablation import compute_head_means
from cel_utils.engine import common_prefix, evaluate, evaluate_head_sets
from cel_utils.scoring import encode_task, plain_evaluate
from cel_utils.screening import plain_screen, screen
from cel_utils.tasks import Task, load_task


def test_mc_score_by_hand(tiny_llama):
    """The lm-eval convention computed by hand for one item."""
    lm = tiny_llama
    item = {"prompt": "ab", "choices": ["cd", "e"], "answer": 1}
    task = Task("t", "mc", [item])
    res = plain_evaluate(lm, encode_task(lm, task))
    scores = []
    for ch in item["choices"]:
        ctx = lm.tokenizer(item["prompt"])["input_ids"]
        whole = lm.tokenizer(item["prompt"] + ch)["input_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(lm.model(input_ids=torch.tensor([whole])).logits[0].float(), -1)
        scores.append(sum(lp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole))))
    assert res.margin[0, 0] == pytest.approx(scores[1] - scores[0], abs=1e-4)
    assert bool(res.correct[0, 0]) == (scores[1] > scores[0])


def test_em_margin_sign_is_correctness(tiny_llama):
    lm = tiny_llama
    res = evaluate(lm, encode_task(lm, load_task("addition", n=12)))
    assert np.array_equal(res.correct[0], res.margin[0] > 0)


def test_exact_match_is_what_greedy_generation_writes(tiny_llama):
    """Oracle: transformers' own greedy `generate`. Scoring moves a prompt's trailing spaces into the answer,
    so an item is correct iff generation from the stripped prompt writes those spaces and the target, and the
    next character does not continue it (a letter or digit): "79" is wrong when the model writes "790". With a
    character tokenizer every character is one token."""
    lm = tiny_llama
    items, expected = [], []
    for prompt in ["ab:", "x = ", "7+1", "hello ", "q", "zz 9", "12:", "mn", "k=", "("]:
        stem = prompt.rstrip()
        sp = prompt[len(stem):]
        ids = torch.tensor([lm.tokenizer(stem)["input_ids"]])
        with torch.no_grad():
            out = lm.model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        written = "".join(lm.tokenizer.convert_ids_to_tokens(out[0, ids.shape[1]:].tolist()))
        targets = {written[len(sp):len(sp) + k] for k in (1, 2, 3)} | {"~", "^"}
        for t in sorted(targets):
            full = sp + t
            if not t.strip() or "<" in written[:len(full) + 1]:
                continue  # a blank target, or a special token among the characters that decide
            items.append({"prompt": prompt, "target": t})
            expected.append(written.startswith(full) and not written[len(full)].isalnum())
    enc = encode_task(lm, Task("t", "em", items))
    got = evaluate(lm, enc, result_cache=False).correct[0]
    assert got.tolist() == expected
    assert 3 <= sum(expected) <= len(expected) - 3  # both outcomes occur
    assert np.array_equal(plain_evaluate(lm, enc).correct[0], got)


def test_trailing_space_moves_to_the_continuation(tiny_llama):
    from cel_utils.scoring import STOP, split_prompt

    assert split_prompt("a = ", "7") == ("a =", " 7") and split_prompt("a =", " 7") == ("a =", " 7")
    enc = encode_task(tiny_llama, Task("t", "em", [{"prompt": "1 + 1 = ", "target": "2"}]))
    tok = tiny_llama.tokenizer
    assert enc.read_tok.tolist() == tok(" 2")["input_ids"] + [STOP]  # the space is scored, then the stop
    assert enc.read_pos.tolist() == [6, 7, 8]  # "1 + 1 =" is 7 characters: reads at 6, 7 and 8


@pytest.mark.parametrize("task_name", ["addition", "capitals", "sentiment"])
def test_engine_matches_plain_loop(tiny, task_name):
    """Exact engine == plain loop (full forward, full logits) for every family, zero and mean ablation."""
    task = load_task(task_name, n=5)
    enc = encode_task(tiny, task)
    heads = [(l, h) for l in range(tiny.n_layers) for h in (0, tiny.n_heads - 1)]
    for mode in ("zero", "mean"):
        means = compute_head_means(tiny, enc.inputs) if mode == "mean" else None
        a = screen(tiny, task, heads=heads, mode=mode, means=means, progress=False, max_tokens=700, enc=enc)
        b = plain_screen(tiny, task, heads=heads, mode=mode, means=means, progress=False, enc=enc)
        assert np.abs(a.baseline.margin - b.baseline.margin).max() < 1e-4
        assert np.abs(a.results.margin - b.results.margin).max() < 1e-4
        assert np.array_equal(a.results.correct, b.results.correct)
        assert np.abs(a.table.delta_margin).max() > 1e-3  # the heads do something


def test_prefix_sharing_is_used_and_exact(tiny_llama):
    lm = tiny_llama
    task = load_task("sentiment", n=6)
    enc = encode_task(lm, task)
    assert len(common_prefix(enc)) > 50
    sets = [[], [(0, 1)], [(1, 2), (2, 0)]]
    # the cache is off: its key does not include share_prefix, so b would otherwise be a's cached result
    a = evaluate_head_sets(lm, enc, sets, share_prefix=True, progress=False, result_cache=False)
    b = evaluate_head_sets(lm, enc, sets, share_prefix=False, progress=False, result_cache=False)
    assert np.abs(a.margin - b.margin).max() < 1e-4


def test_batched_equals_one_at_a_time(tiny_llama):
    lm = tiny_llama
    task = load_task("agreement", n=8)
    enc = encode_task(lm, task)
    batched = evaluate(lm, enc, max_tokens=10_000, result_cache=False)  # cache off: max_tokens is not in its key
    single = evaluate(lm, enc, max_tokens=1, result_cache=False)  # one sequence per forward
    assert np.abs(batched.margin - single.margin).max() < 1e-4


def test_one_token_choices_share_one_pass(tiny_llama):
    """One-token choices (one character for this tokenizer) need a single pass over the prompt."""
    items = [{"prompt": f"item {i}:", "choices": ["a", "b", "c"], "answer": i % 3} for i in range(10)]
    enc = encode_task(tiny_llama, Task("t", "mc", items))
    assert len(enc.inputs) == 10 and enc.n_reads == 30
    # a choice that is a prefix of another's input reuses it: "x" rides on "xy"'s pass
    enc2 = encode_task(tiny_llama, Task("t", "mc", [{"prompt": "p:", "choices": ["x", "xyz"], "answer": 0}]))
    assert len(enc2.inputs) == 1 and enc2.n_reads == 4


def test_tied_choices_count_as_wrong():
    """A tie is wrong (correct False, margin 0), whichever of the tied choices is the answer; lm-eval's argmax
    would instead count the first of tied choices right. Exact ties are built into the model: the unembedding
    rows of "a" and "b" are made equal, so the two tokens get identical logits at every position."""
    from cel_utils.tiny import tiny_model

    lm = tiny_model("llama", seed=11)  # a fresh copy: its weights are edited below
    a, b = (lm.tokenizer(c)["input_ids"][0] for c in "ab")
    with torch.no_grad():
        w = lm.model.get_output_embeddings().weight
        w[b] = w[a]
    items = [{"prompt": "q:", "choices": ["a", "b"], "answer": 0},        # tie, answer first
             {"prompt": "q:", "choices": ["a", "b", "c"], "answer": 1},   # tie at the top, answer second
             {"prompt": "zz x", "choices": ["xa", "xb"], "answer": 1},   # multi-token choices, tie on the last
             {"prompt": "q:", "choices": ["a", "c"], "answer": 0}]        # no tie: "a" beats "c" on this model
    enc = encode_task(lm, Task("t", "mc", items))
    res = evaluate_head_sets(lm, enc, [[], [(0, 1)], [(1, 2), (2, 0)]], progress=False, result_cache=False)
    assert (res.choice_scores[:, :3, 0] == res.choice_scores[:, :3, 1]).all()  # the ties are exact
    assert not res.correct[:, :3].any() and (res.margin[:, :3] == 0).all()
    assert res.correct[:, 3].all() and (res.margin[:, 3] > 0).all()       # the same path scores a win as right
    assert res.accuracy.tolist() == [0.25, 0.25, 0.25]
    ref = plain_evaluate(lm, enc)
    assert ref.correct[0].tolist() == [False, False, False, True] and (ref.margin[0, :3] == 0).all()
