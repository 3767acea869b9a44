"""Same command, same seed: identical JSON (apart from the timing field); shards merge into the unsharded screen."""

import json

import pytest

from cel_utils.cli import main


@pytest.fixture(scope="module")
def model_dir(tiny_folder):
    return tiny_folder("gemma3")


def _strip_timing(path):
    d = json.loads(path.read_text())
    d.pop("timing", None)
    return d


@pytest.mark.subprocess
def test_same_command_same_bytes(model_dir, tmp_path):
    """Two separate processes, no cache: the same command writes the same bytes (apart from the timing field)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CEL_CACHE_DIR"}
    outs = [tmp_path / f"run{i}.json" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "cel_utils.cli", "screen", "--model", model_dir, "--task",
                               "addition", "--n", "5", "--quiet", "--no-cache", "--out", str(out)], env=env,
                              cwd=str(tmp_path)) for out in outs]   # two processes at once: nothing shared
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    a, b = (_strip_timing(o) for o in outs)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    raw = [o.read_text().split('"timing"')[0] for o in outs]
    assert raw[0] == raw[1]                                           # byte for byte up to the timing field
    prov = a["provenance"]
    assert prov["cel_utils"] and prov["weights_hash"] and prov["task_items_hash"]
    assert a["method"] == "exact" and a["mode"] == "zero" and a["seed"] == 0


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
