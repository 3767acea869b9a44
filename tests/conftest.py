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

from cel_utils.tiny import FAMILY_CONFIGS, tiny_model  # noqa: E402

FAMILIES = list(FAMILY_CONFIGS)


@pytest.fixture(scope="session", params=FAMILIES)
def tiny(request):
    return tiny_model(request.param)


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("llama")


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
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
