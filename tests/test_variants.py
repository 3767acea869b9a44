"""Difficulty variants (cel_utils.variants) and the calibration that picks tasks with room (cel_utils.calibration):
every knob does what its name says (read back from the prompt text), no variant leaks a demonstration or a twin
across splits, and the calibration reads the search split only."""

import re

import pandas as pd
import pytest

from cel_utils import calibration
from cel_utils.tasks import SPLITS, load_task
from cel_utils.variants import VARIANTS

ARITH = re.compile(r"(\d+) ([+-]) (\d+) = $")
DEMO = re.compile(r"(\d+) ([+-]) (\d+) = (\d+)\n")


def _everything(name):
    return [it for s in SPLITS for it in load_task(name, s).items]


@pytest.mark.parametrize("name", [n for n, s in VARIANTS.items() if s.family in ("addition", "subtraction")])
def test_arithmetic_variants_leak_nothing_and_turn_their_knob(name):
    """Operands, demonstrations and answers read from the prompt text: the answer is right, no item is another's
    twin (a + b and b + a are one) or a demonstration, the number of demonstrations and the knob hold."""
    spec = VARIANTS[name]
    items = _everything(name)
    ops = [ARITH.search(it["prompt"]).groups() for it in items]
    a, b = [int(x) for x, _, _ in ops], [int(y) for _, _, y in ops]
    plus = ops[0][1] == "+"
    assert all(int(it["target"]) == (x + y if plus else x - y) for it, x, y in zip(items, a, b))
    keys = [tuple(sorted((x, y))) if plus else (x, y) for x, y in zip(a, b)]
    assert len(keys) == len(set(keys)) >= 600
    demos = {tuple(sorted((int(x), int(y)))) if plus else (int(x), int(y))
             for x, _, y, _ in DEMO.findall(items[0]["prompt"])}
    want = {"addition_1shot": 1, "addition_6shot": 6}.get(name, 3)
    assert len(demos) == want and not demos & set(keys)
    carry = [x % 10 + y % 10 >= 10 for x, y in zip(a, b)]
    borrow = [x % 10 < y % 10 for x, y in zip(a, b)]
    knob = {"addition_carry": all(carry), "addition_nocarry": not any(carry) and max(x + y for x, y in zip(a, b)) < 100,
            "addition_2plus1": all(y < 10 <= x for x, y in zip(a, b)),
            "addition_3digit": all(100 <= v < 1000 for v in a + b),
            "subtraction_borrow": all(borrow), "subtraction_noborrow": not any(borrow)}
    assert knob.get(name, True), spec.knob


def test_comparison_agreement_and_ioi_variants_turn_their_knobs():
    close = _everything("comparison_close")
    nums = [tuple(map(int, re.findall(r"Which is larger, (\d+) or (\d+)\?$", it["prompt"])[0])) for it in close]
    assert all(x // 100 == y // 100 and x != y for x, y in nums)
    assert all(it["choices"][it["answer"]] == f" {max(x, y)}" for it, (x, y) in zip(close, nums))
    demos = {tuple(sorted(map(int, d))) for d in re.findall(r"Which is larger, (\d+) or (\d+)\? \d+\n", close[0]["prompt"])}
    assert len(demos) == 3 and not demos & {tuple(sorted(p)) for p in nums}
    for name in ("agreement_2attr", "agreement_rc_pp"):
        for it in load_task(name, "search").items:
            f = it["fields"]
            plural = it["answer"] == 1
            assert (f["subject"].endswith("s") == plural) and f["attractor"].endswith("s") != plural
            assert f["attractor2"].endswith("s") != plural and it["prompt"] == VARIANTS[name].template.format(**f)
    for it in load_task("ioi_3names", "search").items:
        givers = re.search(r", (\w+) and (\w+) gave", it["prompt"]).groups()
        named = re.search(r"When (\w+), (\w+) and (\w+) went", it["prompt"]).groups()
        answer = it["choices"][it["answer"]].strip()
        assert answer in named and answer not in givers and len(it["choices"]) == 3
    for it in load_task("ioi_distractor", "search").items:
        assert re.search(r", it was \w+ and the \w+ was \w+\. Then \w+ gave", it["prompt"])


@pytest.mark.parametrize("name", ["sentiment_0shot", "sentiment_1shot"])
def test_sentiment_variants_repeat_no_demonstration(name):
    items = _everything(name)
    demos = set(re.findall(r"Review: (.*)\nSentiment: (?:positive|negative)\n\n", items[0]["prompt"]))
    reviews = [it["prompt"].rsplit("Review: ", 1)[1].removesuffix("\nSentiment:") for it in items]
    assert len(demos) == {"sentiment_0shot": 0, "sentiment_1shot": 1}[name] and not demos & set(reviews)


def test_the_calibration_reads_only_search_items(monkeypatch):
    """Planting a change in every confirm and held-out item (the answers flipped, the prompts rewritten) changes
    nothing the calibration reports; planting one in the search items does."""
    from cel_utils import tasks
    from cel_utils.tiny import tiny_model

    lm = tiny_model("llama")
    names = ["ioi", "agreement_2attr", "addition_carry"]
    before = calibration.calibrate(lm, names, n=8, progress=False)
    deal = tasks.split_items

    def planted(split):
        def split_items(items, rng):
            out = deal(items, rng)
            for it in out[split]:
                if "answer" in it:
                    it["answer"] = 1 - it["answer"] if len(it["choices"]) == 2 else 0
                    it["prompt"] = "Planted. " + it["prompt"]
                else:
                    it["target"], it["prompt"] = "0", "Planted. " + it["prompt"]
            return out
        return split_items

    try:   # tasks.dealt keeps each pool once per process: planted pools must not outlive this test
        for split in ("confirm", "heldout"):
            monkeypatch.setattr(tasks, "split_items", planted(split))
            tasks.dealt.cache_clear()
            pd.testing.assert_frame_equal(calibration.calibrate(lm, names, n=8, progress=False), before)
        monkeypatch.setattr(tasks, "split_items", planted("search"))
        tasks.dealt.cache_clear()
        after = calibration.calibrate(lm, names, n=8, progress=False)
        assert not after["search_baseline"].equals(before["search_baseline"])
    finally:
        tasks.dealt.cache_clear()


def test_the_calibration_says_which_dtype_it_ran_in():
    """Issue 51: chapter 1a calibrates in float32 on every CPU (the tasks a build studies must not depend on
    native bfloat16); each row names the dtype it ran in, and the staged chapter's record is checked for float32."""
    from cel_utils.models import cast
    from cel_utils.tiny import tiny_model

    lm = tiny_model("llama")
    assert set(calibration.calibrate(lm, ["ioi"], n=4, progress=False)["dtype"]) == {"float32"}
    assert set(calibration.calibrate(cast(lm, "bfloat16"), ["ioi"], n=4, progress=False)["dtype"]) == {"bfloat16"}


def test_calibration_keeps_the_band_and_picks_across_families():
    tab = pd.DataFrame({"model": ["m"] * 5 + ["g"], "task": ["addition", "addition_carry", "ioi", "ioi_3names",
                                                            "agreement", "ioi"],
                        "family": ["addition", "addition", "ioi", "ioi", "agreement", "ioi"],
                        "search_baseline": [0.3, 0.5, 0.9, 0.6, 0.74, 0.5]})
    tab["kept"] = tab.search_baseline.between(0.25, 0.75)
    assert calibration.pick(tab, per_model=3) == {"m": ["addition_carry", "ioi_3names", "agreement"], "g": ["ioi"]}
    assert calibration.pick(tab, per_model=4)["m"][-1] == "addition"   # then the next nearest of any family
    with pytest.raises(Exception, match="band"):
        calibration.calibrate(None, ["ioi"], band=(0.8, 0.2))


def test_cel_calibrate_writes_the_table_and_refuses_bad_input(tiny_folder, tmp_path, capsys):
    """`cel calibrate` on a tiny model: the same numbers as the library call (its own oracle: the unablated accuracy
    recomputed with the plain loop), nothing written on bad input."""
    import json

    from cel_utils.cli import main
    from cel_utils.models import load_model
    from cel_utils.scoring import encode_task, plain_evaluate

    folder = tiny_folder("llama")
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--model", folder, "--tasks", "ioi,agreement_2attr", "--n", "6",
                 "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    lm = load_model(folder)
    for row in rec["tasks"]:
        task = load_task(row["task"], "search", n=6)
        assert row["search_baseline"] == pytest.approx(float(plain_evaluate(lm, encode_task(lm, task)).accuracy[0]))
        assert row["split"] == "search" and row["kept"] == (0.25 <= row["search_baseline"] <= 0.75)
    assert set(rec["picked"]) <= {r["task"] for r in rec["tasks"] if r["kept"]}
    bad = tmp_path / "bad.json"
    for argv in (["--band", "0.9,0.1"], ["--band", "x"], ["--tasks", "nope"], ["--n", "0"]):
        assert main(["calibrate", "--model", folder, "--out", str(bad), *argv]) == 2
        assert not bad.exists()
    assert capsys.readouterr().err.count("cel: error:") == 4


@pytest.mark.parametrize("name", ["sentiment", "sentiment_0shot", "sentiment_1shot"])
def test_sentiment_formats_ask_the_items_own_review_and_show_none_of_the_tasks_reviews(name):
    """Every sentiment format asks the item's own review with the same choices and answer; its demonstrations
    (read back from the prompt text) alternate positive, negative and repeat no review of the task's items in any
    split; SENTIMENT_DEMOS counts the task's own demonstrations."""
    from cel_utils.formats import FORMATS, SENTIMENT_DEMOS, in_format

    reviews = {it["key"] for it in _everything(name)}
    task = load_task(name, "heldout", n=20)
    demo = re.compile(r"(?:Movie review|Review): (.*)\n(?:Sentiment|Opinion): (positive|negative)\n\n")
    assert len(demo.findall(task.items[0]["prompt"])) == SENTIMENT_DEMOS[name]
    assert [f.name for f in FORMATS[name]][0] == "default" and len({f.name for f in FORMATS[name]}) == 8
    for f in FORMATS[name]:
        for before, after in zip(task.items, in_format(task, f.name).items):
            assert (after["choices"], after["answer"]) == (before["choices"], before["answer"])
            shown = demo.findall(after["prompt"])
            assert re.search(r"review: (.*)\n(?:Sentiment|Opinion):$", after["prompt"], re.I).group(1) == before["key"]
            assert [lab for _, lab in shown] == ["positive", "negative"] * (len(shown) // 2) + ["positive"] * (len(shown) % 2)
            assert not {r for r, _ in shown} & reviews
