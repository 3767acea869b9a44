import json
import re

import pytest

from cel_utils.errors import CELError
from cel_utils.tasks import BUILTIN_TASKS, load_jsonl, load_task


@pytest.mark.parametrize("name", list(BUILTIN_TASKS))
def test_deterministic_and_disjoint(name):
    a = load_task(name, "search", seed=3)
    b = load_task(name, "search", seed=3)
    c = load_task(name, "confirm", seed=3)
    h = load_task(name, "heldout", seed=3)
    assert a.items == b.items
    assert min(len(a.items), len(c.items), len(h.items)) >= 18
    for x, y in ((a, c), (a, h), (c, h)):
        assert not ({it["key"] for it in x.items} & {it["key"] for it in y.items})
        assert not ({it["prompt"] for it in x.items} & {it["prompt"] for it in y.items})
    other = load_task(name, "search", seed=4)
    assert other.items != a.items
    for it in a.items:
        if a.kind == "mc":
            assert 0 <= it["answer"] < len(it["choices"]) and len(set(it["choices"])) == len(it["choices"])
        else:
            assert it["target"]


@pytest.mark.parametrize("name", ["sequences", "agreement_rc", "sentiment", "ioi"])
def test_splits_are_stratified_in_every_prefix(name):
    """The review found 21 backward / 11 forward sequences items in the first 32 of the search split: every
    prefix of every split now keeps the class mix (within one item of proportional, per class)."""
    from collections import Counter

    from cel_utils.tasks import SPLITS

    everything = [it for s in SPLITS for it in load_task(name, s).items]
    share = {k: v / len(everything) for k, v in Counter(it["label"] for it in everything).items()}
    for s in SPLITS:
        items = load_task(name, s).items
        for n in sorted({min(k, len(items)) for k in (8, 16, 32, len(items))}):
            got = Counter(it["label"] for it in items[:n])
            for k, p in share.items():
                assert abs(got[k] - p * n) <= 1.5, (s, n, k, got[k], p * n)


def test_jsonl_split_field_and_default_split(tmp_path):
    lines = [json.dumps({"prompt": f"q{i}", "target": "a", "split": ["search", "confirm", "heldout"][i % 3]})
             for i in range(9)]
    p = _write(tmp_path, lines)
    assert [it["prompt"] for it in load_task(p, "confirm").items] == ["q1", "q4", "q7"]
    assert len(load_task(p, None).items) == 9  # no split asked: the whole file
    q = _write(tmp_path, [json.dumps({"prompt": f"q{i}", "choices": ["a", "b"], "answer": i % 2})
                          for i in range(12)])
    parts = [load_task(q, s, seed=1).items for s in ("search", "confirm", "heldout")]
    assert sorted(it["prompt"] for p_ in parts for it in p_) == sorted(f"q{i}" for i in range(12))
    assert all(sum(it["answer"] for it in p_) == 2 for p_ in parts)  # stratified by answer: 2 of each
    assert parts[0] == load_task(q, "search", seed=1).items  # deterministic


def test_addition_format():
    t = load_task("addition", n=5)
    for it in t.items:
        assert it["prompt"].endswith("= ")
        a, b = it["prompt"].strip().split("\n")[-1].rstrip("= ").split(" + ")
        assert int(a) + int(b) == int(it["target"])


def test_n_and_split_errors():
    with pytest.raises(CELError, match="larger than"):
        load_task("capitals", n=10_000)
    with pytest.raises(CELError, match="unknown task"):
        load_task("nope")
    with pytest.raises(CELError, match="split"):
        load_task("addition", split="train")


def _write(tmp_path, lines):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_jsonl_ok(tmp_path):
    p = _write(tmp_path, [json.dumps({"prompt": "a", "choices": [" b", " c"], "answer": 1}),
                          json.dumps({"prompt": "d", "choices": [" e", " f", " g"], "answer": 0})])
    t = load_task(p, n=1)
    assert t.kind == "mc" and len(t.items) == 1 and t.split is None
    t2 = load_jsonl(_write(tmp_path, [json.dumps({"prompt": "1 + 1 = ", "target": "2"})]))
    assert t2.kind == "em"


@pytest.mark.parametrize("line,msg", [
    ("{not json", "line 2.*invalid JSON|:2: invalid JSON"),
    (json.dumps({"choices": [" a", " b"], "answer": 0}), ":2: missing key 'prompt'"),
    (json.dumps({"prompt": "p", "choices": [" a", 3], "answer": 0}), ":2: 'choices' must all be strings"),
    (json.dumps({"prompt": "p", "choices": [" a"], "answer": 0}), ":2: needs at least 2 choices"),
    (json.dumps({"prompt": "p", "choices": [" a", " b"], "answer": 2}), ":2: answer index 2 out of range"),
    (json.dumps({"prompt": "p", "choices": [" a", " b"]}), ":2: missing key 'answer'"),
    (json.dumps({"prompt": "p"}), ":2: needs either"),
    (json.dumps({"prompt": "p", "target": "x"}), ":2: mixes"),
    (json.dumps([1, 2]), ":2: each line must be a JSON object"),
    (json.dumps({"prompt": " ", "choices": [" a", " b"], "answer": 0}), ":2: 'prompt' is empty"),
    (json.dumps({"prompt": "p", "choices": [" a", " a"], "answer": 0}), ":2: two choices are identical"),
    (json.dumps({"prompt": "p", "choices": [" a", ""], "answer": 0}), ":2: a choice is empty"),
    (json.dumps({"prompt": "p", "choices": [" a", " \t"], "answer": 0}), ":2: a choice is empty"),
    (json.dumps({"prompt": "p", "target": ""}), ":2: 'target' must be a non-empty string"),
    (json.dumps({"prompt": "p", "target": " \n"}), ":2: 'target' must be a non-empty string"),
    (json.dumps({"prompt": "p", "target": None}), ":2: 'target' must be a non-empty string"),
    (json.dumps({"prompt": "a", "choices": [" b", " c"], "answer": 1}), ":2: the same item as line 1"),
    (json.dumps({"prompt": "p" * 100_001, "choices": [" a", " b"], "answer": 0}), ":2: line of 100.* over the limit"),
])
def test_jsonl_errors(tmp_path, line, msg):
    good = json.dumps({"prompt": "a", "choices": [" b", " c"], "answer": 1})
    p = _write(tmp_path, [good, line])
    with pytest.raises(CELError, match=msg):
        load_jsonl(p)


def test_jsonl_encoding(tmp_path):
    good = json.dumps({"prompt": "café", "choices": [" b", " c"], "answer": 1}).encode()
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + good + b"\n")        # what spreadsheet programs write: accepted
    assert load_jsonl(str(bom)).items[0]["prompt"] == "café"
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(good + b"\n" + '{"prompt": "caf\u00e9", "target": "x"}'.encode("latin-1").replace(b"\\u00e9", b"\xe9") + b"\n")
    with pytest.raises(CELError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9\)"):
        load_jsonl(str(latin))


def test_jsonl_empty(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n")
    with pytest.raises(CELError, match="no items"):
        load_jsonl(str(p))


def test_no_addition_item_is_another_items_or_a_demos_commuted_twin():
    """a + b and b + a are one item: across the three splits no unordered pair appears twice, and none is a pair
    of the few-shot demonstrations (read back from the prompt text, not from the generator's keys)."""
    import re

    from cel_utils.tasks import SPLITS, load_task

    items = [it for s in SPLITS for it in load_task("addition", s).items]
    pairs = [tuple(sorted(map(int, re.findall(r"(\d+) \+ (\d+) = $", it["prompt"])[0]))) for it in items]
    assert len(pairs) == len(set(pairs)) == len(items) >= 900
    demos = {tuple(sorted(map(int, m))) for m in re.findall(r"(\d+) \+ (\d+) = \d+\n", items[0]["prompt"])}
    assert len(demos) == 3 and not demos & set(pairs)


def test_no_sentiment_item_repeats_a_demonstration():
    """The four demonstration reviews are not also items (read from the prompt text)."""
    from cel_utils.tasks import SPLITS, load_task

    items = [it for s in SPLITS for it in load_task("sentiment", s).items]
    demos = set(re.findall(r"Review: (.*)\nSentiment: (?:positive|negative)\n\n", items[0]["prompt"]))
    reviews = [it["prompt"].rsplit("Review: ", 1)[1].removesuffix("\nSentiment:") for it in items]
    assert len(demos) == 4 and not demos & set(reviews)


def test_word_lists_load_from_package_data_and_items_are_unchanged():
    """The word lists live in package data (cel_utils/data/tasks.json, declared in pyproject.toml), not in
    tasks.py, and the items built from them are the ones of before the move: the hashes below were computed
    with the lists still typed into tasks.py (heldout split, seed 0) and are literals, not recomputed here."""
    from importlib import resources
    from pathlib import Path

    from cel_utils import generators as tasks   # the word lists moved on with the generators
    from cel_utils.formats import in_format

    data = json.loads((resources.files("cel_utils") / "data" / "tasks.json").read_text(encoding="utf-8"))
    lists = tasks.word_lists()
    assert lists["capitals"][0] == ("France", "Paris") and len(lists["capitals"]) == 85
    assert tasks.CAPITALS is lists["capitals"] and tasks.NOUNS_SG_PL is lists["nouns_sg_pl"]
    assert [list(p) for p in tasks.ANTONYMS] == data["pairs"]["antonyms"] and tasks.INTENS == data["words"]["intens"]
    assert list(tasks.SEQUENCES) == ["days", "months", "numbers", "ordinals"]
    assert "Ljubljana" not in Path(tasks.__file__).read_text()  # the lists are data, not code
    root = Path(__file__).resolve().parents[1]
    assert 'cel_utils = ["data/*.json"]' in (root / "pyproject.toml").read_text()  # installed with the package

    before = {"capitals": "1e8ef9985b3bdaad", "antonyms": "3005b5091e4843a8", "sentiment": "e641247eba0918cb",
              "ioi": "9a0bd568f03fb304", "sequences": "85ea506090719bd6", "agreement": "c9381b8eb7e7fb65",
              "agreement_rc": "beefd3ae3e4acb58", "capitals_em": "3e8cb3200fabeac5", "antonyms_em": "8a8033167153976e"}
    assert {name: load_task(name, "heldout", seed=0).items_hash() for name in before} == before
    first = load_task("capitals", "heldout", seed=0).items[0]
    assert first["prompt"].endswith("The capital of Nepal is Kathmandu.\nThe capital of Brazil is")
    assert (first["choices"], first["answer"]) == ([" Harare", " Brasilia", " Reykjavik", " Bogota"], 1)
    # formats.py's agreement demonstrations draw from NOUNS_SG_PL and PREDICATES
    assert in_format(load_task("agreement", "heldout", seed=0), "demos (1)").items_hash() == "1d618b7e25043d86"
