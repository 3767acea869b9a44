import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# a fresh result cache for every test session (inherited by the papermill kernels and subprocesses), removed
# at the end; the de-quantized built-in models are kept across sessions (converting both takes about a minute)
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

os.environ["CEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="cel_cache_")
atexit.register(shutil.rmtree, os.environ["CEL_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("CEL_MODELS_DIR", str(Path.home() / ".cache" / "cel_utils" / "models"))
# every figure shown breaks none of cel_utils.figcheck's rules (plots.figure raises instead of warning)
os.environ["CEL_STRICT_FIGURES"] = "1"
# one fixed thread count for the whole session (inherited by the kernels): cel_utils.threads would otherwise choose
# it by what else the CPU is doing, and a sum split over a different number of threads can differ in its last bit,
# so two runs that a test compares bit for bit could differ (CI failed once on that: an lm-eval run with mode=scale,
# alpha=0 against one with mode=zero, 4e-6 apart). threads.adapt itself is tested on planted /proc readings.
os.environ.setdefault("CEL_THREADS", str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                         else os.cpu_count() or 1))

from cel_utils.tiny import FAMILY_CONFIGS, tiny_model  # noqa: E402

FAMILIES = list(FAMILY_CONFIGS)


@pytest.fixture(scope="session", params=FAMILIES)
def tiny(request):
    return tiny_model(request.param)


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("llama")


def _snapshot(folder) -> dict:
    """Every file under ``folder`` with its bytes' digest: what a test that only reads must leave as it was."""
    import hashlib

    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(Path(folder).rglob("*")) if f.is_file()}


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """``tiny_folder(family)``: the path (a string) of that family's tiny model saved as a local folder, as a
    user's own model would be; saved once per session and shared, so read it only (a test that changes a model
    folder copies it first). At the end of the session every saved folder must be as it was saved."""
    from cel_utils.tiny import save_tiny

    saved = {}

    def get(family: str = "llama") -> str:
        if family not in saved:
            folder = save_tiny(tmp_path_factory.mktemp(f"tiny_{family}"), family)
            saved[family] = (folder, _snapshot(folder))
        return saved[family][0]

    yield get
    changed = [folder for folder, snap in saved.values() if _snapshot(folder) != snap]
    assert not changed, f"a test changed a shared tiny model folder: {changed}"


@pytest.fixture(scope="session")
def harmful_folder(tmp_path_factory):
    """(model folder, task file): a tiny Llama with one planted harmful head (``tiny.HARMFUL_HEAD``) and its JSONL
    items (split fields), saved once per session; read only, checked unchanged at the end of the session."""
    from cel_utils.tiny import save_harmful

    folder, task = save_harmful(tmp_path_factory.mktemp("tiny_harm"))
    snap = _snapshot(folder)
    yield folder, task
    assert _snapshot(folder) == snap, f"a test changed the shared harmful-head model folder {folder}"


@pytest.fixture(scope="session")
def smol():
    from cel_utils.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(autouse=True)
def one_thread_for_tiny_models(request):
    """Tests without the real models use one torch thread: on a 2-core machine two threads per tiny forward pass
    spend more time synchronising than computing (and far more when other work shares the cores)."""
    import torch

    if request.node.get_closest_marker("real") or request.node.get_closest_marker("notebook"):
        yield
        return
    before, fixed = torch.get_num_threads(), os.environ.get("CEL_THREADS")
    torch.set_num_threads(1)
    os.environ["CEL_THREADS"] = "1"      # cel_utils.threads would otherwise re-choose between forwards
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if fixed is None:
            os.environ.pop("CEL_THREADS", None)
        else:
            os.environ["CEL_THREADS"] = fixed


# ---- the book: every chapter executed once per session, shared by test_book_records, test_book_pages and
# test_book_browser (all marked notebook)


@pytest.fixture(scope="session")
def staged(tmp_path_factory):
    """(staged book root, execution status): every chapter executed once, at the tests' CI_PARAMETERS and with
    its exercise solutions appended."""
    from cel_utils import book
    from tests.book_helpers import CI_PARAMETERS

    root = book.stage(tmp_path_factory.mktemp("book"))
    out = root / "book" / "chapters"
    try:
        status = book.execute(out, parameters=CI_PARAMETERS, solutions=True)
    except SystemExit as e:  # a plain failure (pytest caches it for every test that uses the book), naming the chapter
        import json

        failed = [s["notebook"] for s in json.loads((out / "execution_status.json").read_text()) if not s["ok"]] \
            if (out / "execution_status.json").exists() else []
        pytest.fail(f"the book did not execute ({e}); failed chapters: {failed}; executed notebooks in {out}")
    return root, status


@pytest.fixture(scope="session")
def built(staged):
    """The HTML book built from the executed chapters of ``staged``."""
    from cel_utils import book

    root, _ = staged
    return book.build(root)


def planted_splits(items, name="planted"):
    """The three splits of planted items (cel_utils.tiny.harm_items), as multiple-choice tasks."""
    from cel_utils.tasks import SPLITS, Task

    return {s: Task(name, "mc", [dict(it) for it in items if it["split"] == s], split=s) for s in SPLITS}


@pytest.fixture(scope="module")
def pair():
    """A tiny Llama whose two heads PAIR_HEADS each do nothing alone and together turn every item wrong."""
    from cel_utils.tiny import harm_items, pair_heads_model

    items = harm_items()
    return pair_heads_model(items), planted_splits(items)


@pytest.fixture(scope="module")
def harmful():
    """A tiny Llama with one head (HARMFUL_HEAD) whose removal turns every item right."""
    from cel_utils.tiny import harm_items, harmful_head_model

    items = harm_items()
    return harmful_head_model(items), planted_splits(items)
