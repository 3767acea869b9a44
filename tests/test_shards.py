"""Shard invariance: a screen cut into 1, 2, 3 or 7 shards (`cel screen --shard K/N`) and merged in any order is the
one-process screen; `cel merge` refuses, with one line, shards of mixed configurations or with a head missing, and
every malformed shard file; it recomputes the q-values over all heads."""

import json
import random

import pytest

from cel_utils.cli import main
from tests.screen_json import assert_same_screen, candidates

ARGS = ["--split", "search", "--quiet"]


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """(model folder, task file): the tiny Llama with a planted harmful head (``tiny.HARMFUL_HEAD``), 8 layers deep
    (32 heads, so that each of 7 shards holds a layer), and its items: the screen has a candidate, and q-values that
    depend on how many heads are screened together."""
    from cel_utils.tiny import save_harmful

    return save_harmful(tmp_path_factory.mktemp("tiny_deep_harm"), n_layers=8)


@pytest.fixture(scope="module")
def reference(deep, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "one.json"
    assert main(["screen", "--model", deep[0], "--task", deep[1], *ARGS, "--no-cache", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def _shards(deep, n, folder, extra=()):
    files = []
    for k in range(1, n + 1):
        f = folder / f"shard{k}of{n}.json"
        assert main(["screen", "--model", deep[0], "--task", deep[1], *ARGS, *extra, "--shard", f"{k}/{n}",
                     "--out", str(f)]) == 0
        files.append(str(f))
    return files


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_merged_in_any_order_are_the_one_process_screen(deep, reference, n, tmp_path):
    files = _shards(deep, n, tmp_path)
    for order in range(2):                                   # as written, then shuffled
        files = random.Random(n * 10 + order).sample(files, len(files)) if order else files
        out = tmp_path / f"merged{order}.json"
        assert main(["merge", *files, "--out", str(out)]) == 0
        merged = json.loads(out.read_text())
        assert_same_screen(merged, reference)
        assert merged["timing"]["shards"] == n and "screen_heads" not in merged and "shard" not in merged
    assert len(reference["heads"]) == 32


def test_the_reference_has_a_candidate_and_q_values_that_depend_on_the_shards(reference):
    """The comparison covers the candidate rule and BH only if the screen has a candidate whose q-value a shard
    alone would state differently (BH over 32 heads, not a shard's)."""
    from cel_utils.tiny import HARMFUL_HEAD

    assert candidates(reference) == [HARMFUL_HEAD]
    h = next(h for h in reference["heads"] if (h["layer"], h["head"]) == HARMFUL_HEAD)
    assert 0 < h["p_value"] < h["q_value"] < 1


def test_a_shard_with_a_missing_head_is_refused(deep, tmp_path, capsys):
    """A shard screened on fewer heads than the screen it belongs to (its rows edited, or --heads changed between
    runs) is refused with one line naming the missing head and its file; no output is written."""
    files = _shards(deep, 2, tmp_path)
    d = json.loads(open(files[1]).read())
    dropped = d["heads"].pop(3)
    open(files[1], "w").write(json.dumps(d))
    out = tmp_path / "m.json"
    capsys.readouterr()
    assert main(["merge", *files, "--out", str(out)]) == 2 and not out.exists()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"head L{dropped['layer']}H{dropped['head']} of the screen is missing: shard 2/2" in err and files[1] in err


def test_shards_of_another_head_spec_are_refused(deep, tmp_path, capsys):
    """Shard 1 of a screen of all heads and shard 2 of a screen of layer 1 only: mixed configurations."""
    f1, f2 = tmp_path / "s1.json", tmp_path / "s2.json"
    assert main(["screen", "--model", deep[0], "--task", deep[1], *ARGS, "--shard", "1/2", "--out", str(f1)]) == 0
    assert main(["screen", "--model", deep[0], "--task", deep[1], *ARGS, "--heads", "L1", "--shard", "2/2",
                 "--out", str(f2)]) == 0
    out = tmp_path / "m.json"
    capsys.readouterr()
    assert main(["merge", str(f1), str(f2), "--out", str(out)]) == 2 and not out.exists()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'screen_heads' differs" in err


def test_a_shard_holding_no_head_is_refused_before_any_work(deep, tmp_path, capsys):
    """Shard 9 of 9 on an 8-layer model screens nothing: one line, no output."""
    out = tmp_path / "s.json"
    assert main(["screen", "--model", deep[0], "--task", deep[1], *ARGS, "--shard", "9/9", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert not out.exists() and len(err.splitlines()) == 1 and "shard 9/9 holds no heads" in err


def test_the_screen_comparison_sees_a_difference(reference):
    """The comparison itself: a margin moved by more than the tolerance, or a candidate flag flipped, is caught."""
    import copy

    moved = copy.deepcopy(reference)
    moved["heads"][5]["delta_margin"] += 2e-6
    with pytest.raises(AssertionError, match="delta_margin"):
        assert_same_screen(moved, reference)
    flipped = copy.deepcopy(reference)
    flipped["heads"][0]["candidate"] = not flipped["heads"][0]["candidate"]
    with pytest.raises(AssertionError):
        assert_same_screen(flipped, reference)
    assert candidates(reference) == candidates(copy.deepcopy(reference))


# ---- `cel merge` on the tiny Gemma 3 (capitals task) and on hand-written shards


@pytest.fixture(scope="module")
def model_dir(tiny_folder):
    return tiny_folder("gemma3")


def _strip_timing(path):
    d = json.loads(path.read_text())
    d.pop("timing", None)
    return d


def test_shards_merge_to_unsharded(model_dir, tmp_path):
    full = tmp_path / "full.json"
    assert main(["screen", "--model", model_dir, "--task", "capitals", "--n", "4", "--quiet", "--out", str(full)]) == 0
    shards = []
    for k in (1, 2):
        p = tmp_path / f"shard{k}.json"
        assert main(["screen", "--model", model_dir, "--task", "capitals", "--n", "4", "--quiet", "--shard", f"{k}/2",
                     "--out", str(p)]) == 0
        shards.append(str(p))
    s1 = json.loads(open(shards[0]).read())
    assert {h["layer"] for h in s1["heads"]} == {0, 2}
    merged = tmp_path / "merged.json"
    assert main(["merge", *shards, "--out", str(merged)]) == 0
    assert _strip_timing(merged) == _strip_timing(full)


def test_merge_rejects_incomplete_or_mixed(model_dir, tmp_path, capsys):
    p1 = tmp_path / "s1.json"
    assert main(["screen", "--model", model_dir, "--task", "capitals", "--n", "3", "--quiet", "--shard", "1/2",
                 "--out", str(p1)]) == 0
    out = tmp_path / "m.json"
    assert main(["merge", str(p1), "--out", str(out)]) == 2 and not out.exists()
    assert "every shard" in capsys.readouterr().err
    p2 = tmp_path / "s2.json"
    assert main(["screen", "--model", model_dir, "--task", "capitals", "--n", "2", "--quiet", "--shard", "2/2",
                 "--out", str(p2)]) == 0
    assert main(["merge", str(p1), str(p2), "--out", str(out)]) == 2 and not out.exists()
    assert "differs" in capsys.readouterr().err


def test_bad_shard_spec(capsys):
    with pytest.raises(SystemExit) as e:
        main(["screen", "--model", "x", "--task", "addition", "--shard", "3/2"])
    assert e.value.code == 2


def _shard(path, k, heads, **extra):
    base = {"model": "m", "task": "t", "split": "search", "n_items": 40, "seed": 0, "mode": "zero", "method": "exact",
            "provenance": {"x": 1}, "baseline": {"accuracy": 0.5}, "fdr": 0.1, "shard": f"{k}/2", **extra}
    rows = [{"layer": l, "head": h, "p_value": p, "q_value": p, "candidate": True, "delta_accuracy": 0.1,
             "margin_ci_low": 0.01} for l, h, p in heads]
    path.write_text(json.dumps({**base, "heads": rows}))
    return str(path)


def test_merge_recomputes_bh_over_all_heads(tmp_path):
    """A shard's q-values count only its own heads; the merged screen's must count all of them (hand BH)."""
    p = {(0, 0): 0.001, (0, 1): 0.02, (1, 0): 0.03, (1, 1): 0.5}
    a = _shard(tmp_path / "a.json", 1, [(0, 0, p[0, 0]), (0, 1, p[0, 1])])
    b = _shard(tmp_path / "b.json", 2, [(1, 0, p[1, 0]), (1, 1, p[1, 1])])
    out = tmp_path / "m.json"
    assert main(["merge", a, b, "--out", str(out)]) == 0
    got = {(h["layer"], h["head"]): h for h in json.loads(out.read_text())["heads"]}
    # by hand: sorted p = .001, .02, .03, .5 (m = 4): p * m / rank = .004, .04, .04, .5; running min from the top
    want = {(0, 0): 0.004, (0, 1): 0.04, (1, 0): 0.04, (1, 1): 0.5}
    for k, q in want.items():
        assert got[k]["q_value"] == pytest.approx(q)
        assert got[k]["candidate"] == (q < 0.1)


def test_merge_rejects_bad_shards(tmp_path, capsys):
    """Every malformed or mismatched shard: exit 2, one line naming the problem, no output file."""
    a = _shard(tmp_path / "a.json", 1, [(0, 0, 0.5)])
    b = _shard(tmp_path / "b.json", 2, [(1, 0, 0.5)])
    empty = _shard(tmp_path / "e.json", 2, [])
    other = _shard(tmp_path / "o.json", 2, [(1, 0, 0.5)], task="other")
    other_model = _shard(tmp_path / "om.json", 2, [(1, 0, 0.5)], model="another-model")
    other_seed = _shard(tmp_path / "os.json", 2, [(1, 0, 0.5)], seed=1)
    bad_k = _shard(tmp_path / "k.json", 2, [(1, 0, 0.5)], shard="x")
    bad_k2 = _shard(tmp_path / "k2.json", 2, [(1, 0, 0.5)], shard=2)
    # a head of shard 1 (layer 0) listed again by shard 2, and one head twice in a shard
    again = _shard(tmp_path / "again.json", 2, [(1, 0, 0.5), (0, 0, 0.5)])
    twice = _shard(tmp_path / "twice.json", 2, [(1, 0, 0.5), (1, 0, 0.5)])
    d = json.loads((tmp_path / "b.json").read_text())
    (tmp_path / "dict.json").write_text(json.dumps({**d, "heads": {"L1H0": d["heads"][0]}}))
    (tmp_path / "nop.json").write_text(json.dumps({**d, "heads": [{k: v for k, v in d["heads"][0].items()
                                                                   if k != "p_value"}]}))
    (tmp_path / "nolayer.json").write_text(json.dumps({**d, "heads": [{**d["heads"][0], "layer": "1"}]}))
    (tmp_path / "badp.json").write_text(json.dumps({**d, "heads": [{**d["heads"][0], "p_value": 2.0}]}))
    (tmp_path / "nomodel.json").write_text(json.dumps({k: v for k, v in d.items() if k != "model"}))
    (tmp_path / "latin1.json").write_bytes(json.dumps({**d, "task": "caf\u00e9"}, ensure_ascii=False)
                                           .encode("latin-1"))
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "folder.json").mkdir()
    out = tmp_path / "m.json"
    for files, msg in [([a, str(tmp_path / "missing.json")], "does not exist"),
                       ([a, str(tmp_path / "bad.json")], "not valid JSON"),
                       ([a, str(tmp_path / "list.json")], "not a shard"),
                       ([a, str(tmp_path / "folder.json")], "cannot read shard file"),
                       ([a, str(tmp_path / "latin1.json")], "latin1.json is not UTF-8"),
                       ([a, bad_k], "k.json: 'shard' must be K/N"), ([a, bad_k2], "k2.json: 'shard' must be K/N"),
                       ([a, str(tmp_path / "dict.json")], "dict.json: 'heads' must be a list"),
                       ([a, str(tmp_path / "nop.json")], "nop.json: head row 0 (L1H0) has no number 'p_value'"),
                       ([a, str(tmp_path / "nolayer.json")], "integer 'layer' and 'head'"),
                       ([a, str(tmp_path / "badp.json")], "outside 0..1"),
                       ([a, str(tmp_path / "nomodel.json")], "no 'model' field"),
                       ([a, again], "head L0H0 is not in shard 2/2"), ([a, twice], "L1H0 is listed twice"),
                       ([a, empty], "empty shard"), ([a, a], "every shard exactly once"),
                       ([a, other], "'task' differs"), ([a, other_model], "'model' differs"),
                       ([a, other_seed], "'seed' differs")]:
        assert main(["merge", *files, "--out", str(out)]) == 2 and not out.exists(), msg
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, (msg, err)
    assert main(["merge", a, b, "--out", str(out)]) == 0
    assert [(h["layer"], h["head"]) for h in json.loads(out.read_text())["heads"]] == [(0, 0), (1, 0)]


def test_merge_refuses_real_shards_of_another_seed(model_dir, tmp_path, capsys):
    """Real shards: shard 2 screened with another --seed (other items) is refused, nothing is written."""
    p1, p2 = tmp_path / "s1.json", tmp_path / "s2.json"
    for k, p, seed in ((1, p1, "0"), (2, p2, "1")):
        assert main(["screen", "--model", model_dir, "--task", "capitals", "--n", "3", "--quiet", "--seed", seed,
                     "--shard", f"{k}/2", "--out", str(p)]) == 0
    out = tmp_path / "m.json"
    capsys.readouterr()
    assert main(["merge", str(p1), str(p2), "--out", str(out)]) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "'seed' differs" in err and len(err.strip().splitlines()) == 1
