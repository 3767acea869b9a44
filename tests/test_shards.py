"""Shard invariance: a screen cut into 1, 2, 3 or 7 shards (`cel screen --shard K/N`) and merged in any order is the
one-process screen; `cel merge` refuses, with one line, shards of mixed configurations or with a head missing."""

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
