"""The offline autograder (cel_utils.exercises, ``cel exercises``): it passes the instructor solutions taken from
the real chapters, fails known-wrong implementations (each rejected by the check named beside it), never runs the
rest of the notebook, and turns bad input into one line and status 2."""

import json
import re

import pytest

from cel_utils import book
from cel_utils.cli import main
from cel_utils.exercises import EXERCISES, UNCHECKED, find_functions, grade

BY_FUNCTION = {e.function: e for e in EXERCISES}


def code_cell(source: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}


def notebook(*sources: str) -> dict:
    return {"cells": [code_cell(s) for s in sources], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def write(tmp_path, nb, name="learner.ipynb"):
    path = tmp_path / name
    path.write_text(json.dumps(nb))
    return str(path)


def run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------------------------------------------
# the instructor solutions, from the real chapters
# ---------------------------------------------------------------------------------------------------------
CHAPTERS_WITH_CHECKS = sorted({e.chapter for e in EXERCISES})


def solutions_notebook(sentinel) -> dict:
    """What a learner who typed the book's solutions would hand in: every code cell of the chapters with checked
    exercises (loading the real models, screening, ...), the solutions appended, and one cell that would write
    ``sentinel`` if the notebook were run."""
    cells = [code_cell(f"open({str(sentinel)!r}, 'w').write('the notebook was run')")]
    for name in CHAPTERS_WITH_CHECKS:
        nb = json.loads((book.NOTEBOOKS / f"{name}.ipynb").read_text())
        cells += [c for c in nb["cells"] if c["cell_type"] == "code"]
        cells += [code_cell(code) for code in book.solution_code(nb)]
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_the_instructor_solutions_pass_without_running_the_notebook(tmp_path, capsys):
    sentinel = tmp_path / "ran.txt"
    code, out, err = run(["exercises", "check", write(tmp_path, solutions_notebook(sentinel))], capsys)
    assert out.splitlines() == [f"PASS {e.label} {e.function}" for e in EXERCISES], out + err
    assert code == 0
    assert not sentinel.exists(), "the grader ran a cell that is neither an import nor an exercise def"


def test_the_registry_matches_the_chapters():
    """Every registered exercise is in its chapter, whose solution defines the function and calls the public check
    on it; every ``check_*(my_*)`` call of any chapter's solutions is registered (a chapter adding a checked
    exercise must add an entry)."""
    calls = set()
    for nb_path in book.NOTEBOOKS.glob("[0-9]*.ipynb"):
        nb = json.loads(nb_path.read_text())
        code = "\n".join(book.solution_code(nb))
        calls |= {(nb_path.stem, check, fn) for check, fn in re.findall(r"\b(check_\w+)\((my_\w+)\)", code)}
        text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        for e in EXERCISES:
            if e.chapter == nb_path.stem:
                assert f":label: {e.label}" in text, e.label
                assert re.search(rf"^def {e.function}\(", code, flags=re.M), e.function
    assert calls == {(e.chapter, e.check.__name__, e.function) for e in EXERCISES}


def test_every_exercise_is_checked_or_says_why_not():
    """Issue 53: each exercise of the chapters is either registered with a check or listed as unchecked with its
    kind (an argument, a comparison the solution prints, a run at other settings), never both, never neither; an
    exercise that asks for a function (``my_*``) is checked."""
    labels = {}
    for nb_path in book.NOTEBOOKS.glob("[0-9]*.ipynb"):
        for c in json.loads(nb_path.read_text())["cells"]:
            for label, body in re.findall(r":::\{exercise\} (ex-[\w-]+)\n(.*?)\n:::", "".join(c["source"]), re.S):
                labels[label] = body
    checked = {e.label for e in EXERCISES}
    assert not checked & set(UNCHECKED)
    assert set(labels) == checked | set(UNCHECKED)
    assert {lab for lab, body in labels.items() if re.search(r"\bmy_\w+\(", body)} <= checked


# ---------------------------------------------------------------------------------------------------------
# known-wrong implementations, one or more per exercise, each with the check that rejects it
# ---------------------------------------------------------------------------------------------------------
WRONG = {
    # zeroes the head's slice of the output projection's OUTPUT: after the heads are mixed (public check)
    "ablate after o_proj": ("my_ablate", "public", '''
def my_ablate(lm, input_ids, heads):
    D = lm.head_dim
    def hook_for(layer):
        def hook(module, args, out):
            out = out.clone()
            for l, h in heads:
                if l == layer:
                    out[..., h * D:(h + 1) * D] = 0
            return out
        return hook
    handles = [lm.out_proj(l).register_forward_hook(hook_for(l)) for l in range(lm.n_layers)]
    try:
        return lm.model(input_ids=input_ids).logits
    finally:
        for x in handles:
            x.remove()
'''),
    # slices by key/value head (h // group) instead of by query head: wrong under GQA (public check, tiny llama)
    "ablate the GQA key/value slice": ("my_ablate", "public", '''
def my_ablate(lm, input_ids, heads):
    D, group = lm.head_dim, lm.n_heads // lm.n_kv_heads
    def hook_for(layer):
        def hook(module, args):
            x = args[0].clone()
            for l, h in heads:
                if l == layer:
                    kv = h // group
                    x[..., kv * D:(kv + 1) * D] = 0
            return (x,) + args[1:]
        return hook
    handles = [lm.out_proj(l).register_forward_pre_hook(hook_for(l)) for l in range(lm.n_layers)]
    try:
        return lm.model(input_ids=input_ids).logits
    finally:
        for x in handles:
            x.remove()
'''),
    # subtracts z_h @ W[:, slice].T from the projection's output: right for an nn.Linear (the three public models),
    # wrong for GPT-2's Conv1D, whose weight is stored [in, out] (held-back check, tiny gpt2)
    "ablate by subtracting, assuming nn.Linear": ("my_ablate", "held-back", '''
def my_ablate(lm, input_ids, heads):
    D = lm.head_dim
    def hook_for(layer):
        def hook(module, args, out):
            x, W = args[0], module.weight
            for l, h in heads:
                if l == layer:
                    out = out - x[..., h * D:(h + 1) * D] @ W[:, h * D:(h + 1) * D].T
            return out
        return hook
    handles = [lm.out_proj(l).register_forward_hook(hook_for(l)) for l in range(lm.n_layers)]
    try:
        return lm.model(input_ids=input_ids).logits
    finally:
        for x in handles:
            x.remove()
'''),
    # one-sided where two-sided is asked (public check: 5 fixes, 0 breaks)
    "McNemar one-sided": ("my_mcnemar", "public", '''
from scipy.stats import binomtest
def my_mcnemar(base, ablated):
    fixes, breaks = int((~base & ablated).sum()), int((base & ~ablated).sum())
    if fixes + breaks == 0:
        return 1.0
    return binomtest(fixes, fixes + breaks, 0.5, alternative="greater").pvalue
'''),
    # a hand-rolled exact test: 0.5 ** n underflows (and comb(n, i) * 0.0 overflows) past about 1000 flips; the
    # public counts stay below 30 flips (held-back check, 1200 flips)
    "McNemar by hand, float underflow": ("my_mcnemar", "held-back", '''
from math import comb
def my_mcnemar(base, ablated):
    fixes, breaks = int((~base & ablated).sum()), int((base & ~ablated).sum())
    n = fixes + breaks
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) * 0.5 ** n for i in range(min(fixes, breaks) + 1))
    return min(1.0, 2 * tail)
'''),
    # forgets to subtract the unablated model: reports the ablated accuracy and margin (public check)
    "screen without the baseline": ("my_screen", "public", '''
import pandas as pd
from cel_utils.scoring import encode_task, plain_evaluate
def my_screen(lm, task, heads):
    enc = encode_task(lm, task)
    rows = []
    for h in heads:
        r = plain_evaluate(lm, enc, [h])
        rows.append({"delta_accuracy": r.accuracy[0], "delta_margin": r.mean_margin[0]})
    return pd.DataFrame(rows)
'''),
    # keeps the unablated model's numbers from its first call ("computed once to save time"): right on the first
    # model and items it sees (the public check's), wrong on any other (held-back check)
    "screen with a remembered baseline": ("my_screen", "held-back", '''
import pandas as pd
from cel_utils.scoring import encode_task, plain_evaluate
def my_screen(lm, task, heads, _base={}):
    enc = encode_task(lm, task)
    if "run" not in _base:
        _base["run"] = plain_evaluate(lm, enc)
    base = _base["run"]
    rows = []
    for h in heads:
        r = plain_evaluate(lm, enc, [h])
        rows.append({"delta_accuracy": r.accuracy[0] - base.accuracy[0],
                     "delta_margin": r.mean_margin[0] - base.mean_margin[0]})
    return pd.DataFrame(rows)
'''),
    # r with the wrong sign (the gradient itself, not minus it) (public check)
    "rates with a wrong sign": ("my_rates", "public", '''
import numpy as np
def my_rates(setup, lr):
    c, rho = setup.counts, setup.rho
    r = -float((c * (rho[0] + rho[1])).sum() / c.sum())
    return {"r": r, "lambda_1": np.log1p(lr * r)}
'''),
    # forgets the token counts (m distractors count once): right whenever the distractors' correlations are zero,
    # as in every public set-up (held-back check, correlated distractors)
    "rates without the token counts": ("my_rates", "held-back", '''
import numpy as np
def my_rates(setup, lr):
    c, rho = setup.counts, setup.rho
    r = float((rho[0] + rho[1]).sum() / c.sum())
    return {"r": r, "lambda_1": np.log1p(lr * r)}
'''),
    # Bonferroni instead of BH (public check)
    "BH as Bonferroni": ("my_bh", "public", '''
import numpy as np
def my_bh(p):
    p = np.asarray(p, float)
    return np.minimum(p * len(p), 1.0)
'''),
    # right q-values, but returned in sorted order: the public p-values are sorted or tie where it matters
    # (held-back check, unsorted p-values)
    "BH in sorted order": ("my_bh", "held-back", '''
import numpy as np
def my_bh(p):
    p = np.sort(np.asarray(p, float))
    m = len(p)
    return np.minimum(np.minimum.accumulate((p * m / np.arange(1, m + 1))[::-1])[::-1], 1.0)
'''),
    # an interval that includes 0 read as "fails": absence of significance taken as absence (public check)
    "reading: no significance as no": ("my_reading", "public", '''
import numpy as np
from scipy.stats import ttest_1samp
def my_reading(d, above):
    d = np.asarray(d, float)
    low = float(d.mean()) if len(d) < 2 or np.ptp(d) == 0 else ttest_1samp(d, 0).confidence_interval(0.95).low
    return "holds" if low > above else "fails"
'''),
    # the threshold ignored (compared with 0): every public case has threshold 0 (held-back check)
    "reading against 0 always": ("my_reading", "held-back", '''
import numpy as np
from scipy.stats import ttest_1samp
def my_reading(d, above):
    d = np.asarray(d, float)
    if len(d) < 2:
        return "cannot tell"
    if np.ptp(d) == 0:
        low = high = float(d.mean())
    else:
        ci = ttest_1samp(d, 0).confidence_interval(0.95)
        low, high = ci.low, ci.high
    return "holds" if low > 0 else "fails" if high < 0 else "cannot tell"
'''),
    # a z interval with the population SD instead of the t interval (public check: three items separate them)
    "reading with a z interval": ("my_reading", "public", '''
import numpy as np
def my_reading(d, above):
    d = np.asarray(d, float)
    half = 1.96 * d.std() / np.sqrt(len(d))
    low, high = d.mean() - half, d.mean() + half
    return "holds" if low > above else "fails" if high < above else "cannot tell"
'''),
    # scores each head alone instead of the set with it added (public check: a pair that helps only together)
    "greedy on single-head scores": ("my_greedy", "public", '''
def my_greedy(pool, score, max_size):
    ranked = sorted(pool, key=lambda h: -score((h,)))
    path, cur = [()], ()
    for h in ranked[:max_size]:
        if score(tuple(sorted(cur + (h,)))) <= score(cur):
            break
        cur = tuple(sorted(cur + (h,)))
        path.append(cur)
    return path
'''),
    # ties go to the later head of the pool: no public case ties (held-back check)
    "greedy ties to the later head": ("my_greedy", "held-back", '''
def my_greedy(pool, score, max_size):
    cur, best = (), score(())
    path = [cur]
    while len(cur) < max_size:
        cands = [tuple(sorted(cur + (h,))) for h in pool if h not in cur]
        vals = [score(c) for c in cands]
        i = max(range(len(vals)), key=lambda j: (vals[j], j))
        if vals[i] <= best:
            break
        cur, best = cands[i], vals[i]
        path.append(cur)
    return path
'''),
    # each component normalized by its own RMS (public check)
    "direct: each component its own norm": ("my_direct", "public", '''
import numpy as np
def my_direct(outs, scale, gamma, w_diff):
    return np.array([(o / np.sqrt((o ** 2).mean() + 1e-6) * gamma) @ w_diff for o in outs])
'''),
    # each head at its own rate: the permutation null's mean, not the equal-rate null (public check)
    "null: each head its own rate": ("my_equal_rate_null", "public", '''
import numpy as np
def my_equal_rate_null(fixes, n_wrong):
    return 1 - np.prod(1 - np.asarray(fixes) / n_wrong)
'''),
    # fixes.mean(): right on arrays, fails on the list a chapter's record holds (held-back check)
    "null: an array method on a list": ("my_equal_rate_null", "held-back", '''
def my_equal_rate_null(fixes, n_wrong):
    return 1 - (1 - fixes.mean() / n_wrong) ** len(fixes)
'''),
    # "more than eps" read as "at least eps" (public check)
    "kind: at least eps": ("my_kind", "public", '''
import numpy as np
def my_kind(gain_a, change_b, eps):
    return np.where(gain_a >= eps, np.where(change_b <= -eps, "two-sided", "one-sided"), "none")
'''),
    # B's change by its size, not its sign: a gain on B read as a loss (held-back check)
    "kind: B's change unsigned": ("my_kind", "held-back", '''
import numpy as np
def my_kind(gain_a, change_b, eps):
    return np.where(gain_a > eps, np.where(np.abs(change_b) > eps, "two-sided", "one-sided"), "none")
'''),
    # intact minus ablated: the change with its sign flipped (public check)
    "delta: intact minus ablated": ("my_delta_accuracy", "public", '''
from cel_utils.scoring import plain_evaluate
def my_delta_accuracy(lm, enc, heads):
    return plain_evaluate(lm, enc).accuracy[0] - plain_evaluate(lm, enc, heads).accuracy[0]
'''),
    # the intact accuracy kept from the first call: right on the public check's model, wrong on others (held-back)
    "delta: a remembered baseline": ("my_delta_accuracy", "held-back", '''
from cel_utils.ablation import ablate_heads
from cel_utils.scoring import plain_evaluate
def my_delta_accuracy(lm, enc, heads, _base={}):
    if "acc" not in _base:
        _base["acc"] = plain_evaluate(lm, enc).accuracy[0]
    with ablate_heads(lm, heads):
        return plain_evaluate(lm, enc).accuracy[0] - _base["acc"]
'''),
    # the intact margins subtracted once, not once per head (public check)
    "interaction: base subtracted once": ("my_interaction", "public", '''
import numpy as np
def my_interaction(base, joint, singles):
    return float(np.mean(np.asarray(joint) - np.asarray(singles).sum(axis=0)))
'''),
    # written for two heads, on arrays: fails on three heads and on lists (held-back check)
    "interaction: two heads only": ("my_interaction", "held-back", '''
def my_interaction(base, joint, singles):
    return float(((joint - base) - (singles[0] - base) - (singles[1] - base)).mean())
'''),
    # minus A's C-correlation: the symmetric guess (public check)
    "threshold: minus A's correlation": ("my_threshold", "public", '''
def my_threshold(setup):
    return -setup.rho_a[2]
'''),
    # B's other correlations taken from the chapter's set-up, not from setup (held-back check)
    "threshold: B's other correlations fixed": ("my_threshold", "held-back", '''
from scipy.optimize import brentq
from cel_utils import theory
def my_threshold(setup):
    def c_weight(rb):
        return theory.optimum(theory.Setup(rho_a=setup.rho_a, rho_b=(0.0, 0.4, rb, 0.0), m=setup.m))[0][2]
    return brentq(c_weight, -1.0, 1.0)
'''),
    # the frozen scale recomputed from outs: right only when outs is the whole residual (held-back check)
    "direct: scale recomputed from outs": ("my_direct", "held-back", '''
import numpy as np
def my_direct(outs, scale, gamma, w_diff):
    s = 1.0 / np.sqrt((outs.sum(0) ** 2).mean() + 1e-6)
    return (outs * s * gamma) @ w_diff
'''),
}


@pytest.mark.parametrize("what", list(WRONG))
def test_a_known_wrong_implementation_fails(what):
    function, rejected_by, source = WRONG[what]
    ex = BY_FUNCTION[function]
    [result] = grade(notebook(source), [ex])
    assert result.outcome == "FAIL", result.line()
    assert result.stage == rejected_by, result.line()
    assert result.line().startswith(f"FAIL {ex.label} {function}: ")
    if rejected_by == "held-back":
        # the public check alone lets it through: only the held-back checks stand between it and a PASS
        fn = find_functions(notebook(source), [function]).namespace[function]
        ex.check(fn)
        assert result.line().split(": ", 1)[1].startswith("held-back check (")


def test_every_exercise_has_a_wrong_implementation_each_check_rejects():
    covered = {(f, stage) for f, stage, _ in WRONG.values()}
    assert covered == {(e.function, stage) for e in EXERCISES for stage in ("public", "held-back")}


# ---------------------------------------------------------------------------------------------------------
# missing functions, syntax errors, helpers, bad input
# ---------------------------------------------------------------------------------------------------------
MCNEMAR = WRONG["McNemar one-sided"][2].replace(', alternative="greater"', "")


def test_missing_and_syntax_error_lines_and_exit_status(tmp_path, capsys):
    broken = "def my_rates(setup, lr):\n    return {'r': (1 +}\n"
    nb = notebook("%matplotlib inline\nimport numpy as np", MCNEMAR, "raise RuntimeError('not run')", broken)
    code, out, err = run(["exercises", "check", write(tmp_path, nb)], capsys)
    lines = out.splitlines()
    assert lines[0] == "MISSING ex-ch1-hook my_ablate: the notebook has no top-level def my_ablate"
    assert lines[1] == "PASS ex-ch1-mcnemar my_mcnemar"
    derive = next(i for i, e in enumerate(EXERCISES) if e.label == "ex-ch3-derive")
    assert [line.split()[:2] for i, line in enumerate(lines[2:], 2) if i != derive] == \
        [["MISSING", e.label] for i, e in enumerate(EXERCISES[2:], 2) if i != derive]
    assert re.fullmatch(r"FAIL ex-ch3-derive my_rates: SyntaxError in cell 4, line 2: .+", lines[derive]), lines[derive]
    assert len(lines) == len(EXERCISES) and code == 1 and err == ""


def test_an_empty_submission_exits_non_zero(tmp_path, capsys):
    """A batch grader must tell an empty submission from a pass: every exercise MISSING exits 3, not 0."""
    code, out, _ = run(["exercises", "check", write(tmp_path, notebook("import numpy as np")), "--chapter", "all"],
                       capsys)
    assert code == 3 and all(line.startswith("MISSING ") for line in out.splitlines())


def test_present_ones_passing_exit_3_with_others_missing_and_a_later_def_wins(tmp_path, capsys):
    wrong = WRONG["McNemar one-sided"][2]
    code, out, _ = run(["exercises", "check", write(tmp_path, notebook(wrong, MCNEMAR))], capsys)
    assert code == 3 and "PASS ex-ch1-mcnemar my_mcnemar" in out.splitlines()   # the others are missing
    code, out, _ = run(["exercises", "check", write(tmp_path, notebook(MCNEMAR, wrong))], capsys)
    assert code == 1 and any(line.startswith("FAIL ex-ch1-mcnemar") for line in out.splitlines())


def test_a_correct_answer_using_top_level_helpers_passes(tmp_path, capsys):
    """A right answer that calls a helper def, which reads a literal constant and another helper, passes; the
    notebook's other statements still never run."""
    nb = notebook("from scipy.stats import binomtest\nSIDES = 'two-sided'\nBOOM = 1 / 0\n"
                  "def discordant(base, ablated):\n    return int((ablated & ~base).sum()), int((base & ~ablated).sum())",
                  "def p_of(f, b):\n    return 1.0 if f + b == 0 else binomtest(f, f + b, 0.5, alternative=SIDES).pvalue",
                  "def my_mcnemar(base, ablated):\n    return p_of(*discordant(base, ablated))")
    code, out, _ = run(["exercises", "check", write(tmp_path, nb), "--chapter", "01_screening"], capsys)
    assert "PASS ex-ch1-mcnemar my_mcnemar" in out.splitlines(), out


def test_a_global_computed_at_run_time_is_reported_not_crashed(tmp_path, capsys):
    nb = notebook("import numpy as np\nTABLE = np.zeros(3)\ndef flips(base, ablated):\n    return TABLE",
                  "def my_mcnemar(base, ablated):\n    f = flips(base, ablated)\n    return 1.0")
    code, out, _ = run(["exercises", "check", write(tmp_path, nb)], capsys)
    line = next(x for x in out.splitlines() if "my_mcnemar" in x)
    assert line.startswith("FAIL ex-ch1-mcnemar my_mcnemar: NameError: name 'TABLE' is not defined (cell 1, line 4)")
    assert "compute other values inside the function" in line and code == 1


def test_a_chapter_notebook_is_graded_on_its_own_exercises(tmp_path, capsys):
    """A student notebook of chapter 3 (by its labels, or by its file name) prints only chapter 3's exercises;
    --chapter picks another or all; an unknown chapter is one line and status 2."""
    md = {"cell_type": "markdown", "metadata": {}, "source": ":::{exercise}\n:label: ex-ch3-derive\n:::"}
    nb = notebook(MCNEMAR)
    nb["cells"].insert(0, md)
    code, out, _ = run(["exercises", "check", write(tmp_path, nb)], capsys)
    assert [line.split()[1] for line in out.splitlines()] == ["ex-ch3-derive", "ex-ch3-threshold"] and code == 3
    plain = write(tmp_path, notebook(MCNEMAR), name="01_screening.ipynb")
    code, out, _ = run(["exercises", "check", plain], capsys)
    assert [line.split()[1] for line in out.splitlines()] == ["ex-ch1-hook", "ex-ch1-mcnemar", "ex-ch1-manual"]
    code, out, _ = run(["exercises", "check", plain, "--chapter", "all"], capsys)
    assert len(out.splitlines()) == len(EXERCISES)
    code, out, err = run(["exercises", "check", plain, "--chapter", "09_nothing"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "no checked exercise in chapter" in err


def test_list_names_every_exercise(capsys):
    code, out, _ = run(["exercises", "list"], capsys)
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(EXERCISES) + len(UNCHECKED)
    assert [line.split()[0] for line in lines[len(EXERCISES):]] == list(UNCHECKED)
    for e, line in zip(EXERCISES, lines):
        assert line.split()[:2] == [e.label, e.chapter]
        assert f"{e.function}{e.signature}" in line and f"{e.check.__name__}({e.function})" in line


@pytest.mark.parametrize("content,msg", [
    (None, "no such file"),
    ("not json at all", "is not a notebook: not JSON"),
    (json.dumps({"worksheets": []}), "is not a notebook: no list of cells"),
    (json.dumps({"cells": ["a string, not a cell"]}), "is not a notebook: no list of cells"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, content, msg):
    path = tmp_path / "learner.ipynb"
    if content is not None:
        path.write_text(content)
    before = sorted(tmp_path.iterdir())
    code, out, err = run(["exercises", "check", str(path)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("cel: error: ") and msg in err
    assert sorted(tmp_path.iterdir()) == before


def test_a_folder_without_notebooks_is_bad_input(tmp_path, capsys):
    code, out, err = run(["exercises", "check", str(tmp_path)], capsys)
    assert (code, out) == (2, "") and err == f"cel: error: no notebook (.ipynb) under {tmp_path}\n"


def test_a_folder_of_submissions_gives_one_row_per_student_and_exercise(tmp_path, capsys):
    """Issue 53: a batch grader's summary. alice's chapter-1 notebook passes the McNemar exercise and misses the
    hook; bob's is empty; carol's is not a notebook (one FAIL row, stage file; grading goes on); a checkpoint copy
    is skipped. CSV and JSON hold the same rows; the exit status is 1 (a FAIL); --summary with one notebook, or
    with another suffix, is one line, status 2, nothing written."""
    import pandas as pd

    subs = tmp_path / "subs"
    for who, nb in (("alice", notebook(MCNEMAR)), ("bob", notebook("import numpy as np"))):
        (subs / who).mkdir(parents=True)
        (subs / who / "01_screening.ipynb").write_text(json.dumps(nb))
    (subs / "carol").mkdir()
    (subs / "carol" / "01_screening.ipynb").write_text("not json")
    (subs / "alice" / ".ipynb_checkpoints").mkdir()
    (subs / "alice" / ".ipynb_checkpoints" / "01_screening-checkpoint.ipynb").write_text("not json")
    code, out, err = run(["exercises", "check", str(subs), "--summary", str(tmp_path / "g.csv")], capsys)
    assert code == 1 and err == ""
    assert out.splitlines() == ["alice alice/01_screening.ipynb: 1 PASS, 0 FAIL, 2 MISSING",
                                "bob bob/01_screening.ipynb: 0 PASS, 0 FAIL, 3 MISSING",
                                "carol carol/01_screening.ipynb: 0 PASS, 1 FAIL, 0 MISSING"]
    t = pd.read_csv(tmp_path / "g.csv")
    assert list(zip(t.student, t.exercise.fillna(""), t.outcome)) == [
        ("alice", "ex-ch1-hook", "MISSING"), ("alice", "ex-ch1-mcnemar", "PASS"), ("alice", "ex-ch1-manual", "MISSING"),
        ("bob", "ex-ch1-hook", "MISSING"), ("bob", "ex-ch1-mcnemar", "MISSING"), ("bob", "ex-ch1-manual", "MISSING"),
        ("carol", "", "FAIL")]
    assert t.stage.iloc[-1] == "file" and "is not a notebook" in t.message.iloc[-1]
    code, _, _ = run(["exercises", "check", str(subs), "--summary", str(tmp_path / "g.json")], capsys)
    j = json.loads((tmp_path / "g.json").read_text())
    assert code == 1 and [r["outcome"] for r in j] == list(t.outcome)
    one = str(subs / "alice" / "01_screening.ipynb")
    for args, msg in (([one, "--summary", str(tmp_path / "x.csv")], "--summary goes with a folder"),
                      ([str(subs), "--summary", str(tmp_path / "x.txt")], "--summary takes a .csv or .json")):
        code, out, err = run(["exercises", "check", *args], capsys)
        assert code == 2 and msg in err and err.count("\n") == 1 and not (tmp_path / "x.csv").exists()
        assert not (tmp_path / "x.txt").exists()
