"""On-disk result cache: re-running a chapter recomputes only what changed.

An entry holds the per-item results of evaluating a list of head sets on an encoded task. Its key is a
hash of everything the numbers depend on: the model's content hash, its dtype, the device (CPU or GPU), the
tokenized items (inputs, reads, answers), the head sets, the ablation mode, the method, and the package version.
Entries are numpy ``.npz`` files (loaded with ``allow_pickle=False``) plus a JSON sidecar holding the key and the sha256 of
the ``.npz``; a change to the package's source changes every key; an entry whose checksum does not match is treated as missing and recomputed.

Location: ``$CEL_CACHE_DIR`` if set, else ``~/.cache/cel_utils``. ``CEL_NO_CACHE=1`` (or ``cel ... --no-cache``)
turns it off.

Example:
    >>> import os
    >>> from unittest import mock
    >>> from cel_utils.cache import cache_dir
    >>> with mock.patch.dict(os.environ, {"CEL_CACHE_DIR": "/tmp/somewhere"}):
    ...     str(cache_dir())
    '/tmp/somewhere'
    >>> with mock.patch.dict(os.environ, {"CEL_CACHE_DIR": ""}):
    ...     cache_dir().parts[-2:]
    ('.cache', 'cel_utils')
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from . import __version__


def cache_dir() -> Path:
    return Path(os.environ.get("CEL_CACHE_DIR") or Path.home() / ".cache" / "cel_utils")


def enabled() -> bool:
    return os.environ.get("CEL_NO_CACHE", "") not in ("1", "true", "yes")


def encoded_hash(enc) -> str:
    h = hashlib.sha256()
    h.update(enc.kind.encode())
    h.update(json.dumps(enc.inputs).encode())
    for a in (enc.read_seq, enc.read_pos, enc.read_tok, enc.read_item, enc.read_choice, enc.answers, enc.n_choices):
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    if enc.continues is not None:
        h.update(enc.continues.numpy().tobytes())
    return h.hexdigest()


_CODE: list[str] = []
NUMERIC_SOURCES = ("hooks.py", "models.py", "ablation.py", "scoring.py", "engine.py", "cache.py", "robust.py")


def code_hash() -> str:
    """Hash of the source the cached numbers depend on (models, ablation, scoring, the engine, this module):
    any change there invalidates the cache, not only a version bump. Editing the screens' statistics, the
    approximate screens, search, plots or the CLI does not."""
    if not _CODE:
        h = hashlib.sha256()
        here = Path(__file__).parent
        for f in sorted(here / n for n in NUMERIC_SOURCES):
            h.update(f.name.encode())
            h.update(f.read_bytes())
        _CODE.append(h.hexdigest()[:16])
    return _CODE[0]


def device_type(device) -> str:
    """The kind of device numbers were computed on, as a cache key holds it: ``"cpu"``, ``"cuda"``, ...

    Example:
        >>> device_type("cuda:1"), device_type("cpu")
        ('cuda', 'cpu')
    """
    return str(device).split(":")[0]


def key_of(lm, fields: dict, device=None) -> str:
    """The key of an entry: a hash of the model's weights and dtype, the device the numbers are computed on
    (``device``, default the model's own: a GPU's numbers never stand in for the CPU's), the numeric source code,
    the version, and what the computation reads (``fields``, JSON-serialisable)."""
    p = next(lm.model.parameters())
    dev = device_type(device if device is not None else p.device)
    blob = json.dumps({"model": lm.weights_hash, "code": code_hash(), "dtype": str(p.dtype), "device": dev,
                       "version": __version__, **fields}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def make_key(lm, enc, head_sets, mode: str, method: str = "exact", extra: dict | None = None,
             device=None) -> str:
    """:func:`key_of` an engine result: the tokenized items, the head sets, the ablation mode and the method."""
    return key_of(lm, {"items": encoded_hash(enc), "head_sets": [sorted(map(list, hs)) for hs in head_sets],
                       "mode": mode, "method": method, "extra": extra or {}}, device)


def _paths(key: str) -> tuple[Path, Path]:
    d = cache_dir() / key[:2]
    return d / f"{key}.npz", d / f"{key}.json"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


STATS = {"hits": 0, "misses": 0}  # loads answered from the cache in this process, and loads that were not


def load(key: str) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None if missing or corrupt (a corrupt entry is removed)."""
    out = _load(key)
    STATS["hits" if out is not None else "misses"] += 1
    return out


def _load(key: str) -> dict[str, np.ndarray] | None:
    npz, side = _paths(key)
    if not (npz.exists() and side.exists()):
        return None
    try:
        meta = json.loads(side.read_text())
        if meta.get("key") != key or meta.get("sha256") != _sha(npz):
            raise ValueError("checksum mismatch")
        with np.load(npz, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception:
        for p in (npz, side):
            try:
                p.unlink()
            except OSError:
                pass
        return None


def store(key: str, arrays: dict[str, np.ndarray]) -> None:
    """Write an entry atomically (temp files, then rename); failures to write are ignored."""
    npz, side = _paths(key)
    try:
        npz.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=npz.parent, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        sha = _sha(Path(tmp))
        os.replace(tmp, npz)
        fd, tmp2 = tempfile.mkstemp(dir=npz.parent, suffix=".json.tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "sha256": sha, "version": __version__}, f)
        os.replace(tmp2, side)
    except OSError:
        pass
