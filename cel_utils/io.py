"""Writing results: JSON-safe values and atomic files (a reader never sees a half-written file).

Example:
    >>> import numpy as np
    >>> from cel_utils.io import json_safe
    >>> json_safe({"a": np.float64(0.5), "b": float("nan"), "c": np.bool_(True)})
    {'a': 0.5, 'b': None, 'c': True}
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np


def json_safe(obj):
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    return obj


def dumps(obj) -> str:
    return json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n"


def write_json_atomic(path: str | Path, obj) -> None:
    """Write JSON to a temp file in the same folder, then rename: never a truncated file."""
    write_text_atomic(path, dumps(obj))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write text to a temp file in the same folder, then rename: never a truncated file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
