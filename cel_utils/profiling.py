"""Where a chapter's time goes: the model-running entry points log each call when ``CEL_PROFILE`` names a file.

Each call of a function wrapped in :func:`timed` appends one JSON line: the chapter (``CEL_CHAPTER``, set by
``cel_utils.book`` for each chapter it executes), the function, the outermost ``cel_utils`` function that led to it
(the chapter's *stage*: ``pipeline.confirm``, ``battery.run``, ...), its seconds, whether the result cache answered,
and the fields the function adds (:func:`note`: sets, items, a key per head set). Calls inside another timed call
are marked ``nested`` so that a stage's time is counted once. ``benchmarks/profile_book.py`` reads the file.
Without ``CEL_PROFILE`` the wrapper costs one environment lookup per call.

Example:
    >>> import json, os, tempfile
    >>> from unittest import mock
    >>> @timed
    ... def work(n):
    ...     note(items=n)
    ...     return n * 2
    >>> path = os.path.join(tempfile.mkdtemp(), "p.jsonl")
    >>> with mock.patch.dict(os.environ, {"CEL_PROFILE": path, "CEL_CHAPTER": "01"}):
    ...     work(3)
    6
    >>> row = json.loads(open(path).read()); row["chapter"], row["function"], row["items"], row["nested"]
    ('01', 'profiling.work', 3, False)
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time

_stack: list[dict] = []


def enabled() -> bool:
    return bool(os.environ.get("CEL_PROFILE"))


def note(**fields) -> None:
    """Add fields to the innermost timed call's line (nothing when profiling is off)."""
    if _stack:
        _stack[-1].update(fields)


def stage() -> str:
    """The outermost ``cel_utils`` function on the call stack (module.function), or ``""``."""
    f, outer = sys._getframe(1), ""
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if mod.startswith("cel_utils.") and mod != __name__:
            outer = f"{mod.split('.', 1)[1]}.{f.f_code.co_name}"
        f = f.f_back
    return outer


def timed(fn):
    """Log each call of ``fn`` to ``$CEL_PROFILE`` (see the module's docstring)."""
    name = f"{fn.__module__.split('.')[-1]}.{fn.__name__}"

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        path = os.environ.get("CEL_PROFILE")
        if not path:
            return fn(*args, **kwargs)
        row = {"chapter": os.environ.get("CEL_CHAPTER", ""), "function": name, "stage": stage(),
               "nested": bool(_stack)}
        _stack.append(row)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            row["seconds"] = round(time.perf_counter() - t0, 4)
            _stack.pop()
            with open(path, "a") as fh:
                fh.write(json.dumps(row) + "\n")
    return wrapper
