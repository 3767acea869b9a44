"""Screens in shards: which heads a shard screens, reading shard outputs back, and merging them into the screen
one process would have given (``cel screen --shard K/N`` and ``cel merge``).

Sharding is by layer (shard K of N screens the layers ``K-1`` modulo N), so each layer's heads stay in the same
batched forwards as an unsharded run and a merged screen is identical to the unsharded one.

Example:
    >>> shard_heads([(0, 0), (1, 0), (2, 0), (3, 1)], 2, 2)
    [(1, 0), (3, 1)]
"""

from __future__ import annotations

import json
import re

from .ablation import head_name, parse_heads
from .defaults import FDR
from .errors import CELError
from .screening import is_candidate
from .stats import benjamini_hochberg


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` as ``(K, N)``, with ``1 <= K <= N``.

    Example:
        >>> parse_shard("2/7")
        (2, 7)
    """
    m = re.fullmatch(r"(\d+)/(\d+)", text or "")
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise CELError(f"shard must be K/N with 1 <= K <= N, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def shard_heads(heads, k: int, n: int):
    """Shard K of N: the heads whose *layer* is K-1 modulo N.

    Sharding by layer keeps each layer's heads in the same batched forwards as an unsharded run, so a
    merged screen is identical to the unsharded one (and layers interleave, so shards cost about the same).
    """
    return [h for h in heads if h[0] % n == k - 1]


_SHARD_SAME = ("model", "task", "split", "n_items", "seed", "mode", "method", "provenance", "baseline", "fdr",
               "device", "dtype", "screen_heads")
_SHARD_REQUIRED = ("model", "task", "n_items", "seed", "method")
_ROW_NUMBERS = {"exact": ("p_value", "delta_accuracy", "margin_ci_low"),
                "gradient": ("estimated_delta_margin",), "compressed": ("estimated_delta_margin",)}


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def read_shard(f: str) -> dict:
    """One `cel screen --shard` output, with its fields checked (a CELError naming the file otherwise)."""
    try:
        with open(f, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise CELError(f"shard file {f} does not exist") from None
    except OSError as e:
        raise CELError(f"cannot read shard file {f}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CELError(f"shard file {f} is not UTF-8 text (byte {e.start})") from None
    try:
        p = json.loads(text)
    except json.JSONDecodeError as e:
        raise CELError(f"shard file {f} is not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(p, dict) or "shard" not in p or "heads" not in p:
        raise CELError(f"{f} is not a shard of a screen (no 'shard' field)")
    try:
        p["_shard"] = parse_shard(p["shard"] if isinstance(p["shard"], str) else "")
    except CELError:
        raise CELError(f"{f}: 'shard' must be K/N with 1 <= K <= N, got {p['shard']!r}") from None
    for k in _SHARD_REQUIRED:
        if p.get(k) is None:
            raise CELError(f"{f} is not a shard of a screen (no '{k}' field)")
    if p["method"] not in _ROW_NUMBERS:
        raise CELError(f"{f}: unknown screen method {p['method']!r}")
    if "fdr" in p and not (_is_number(p["fdr"]) and 0 < p["fdr"] < 1):
        raise CELError(f"{f}: 'fdr' must be a number between 0 and 1, got {p['fdr']!r}")
    heads = p["heads"]
    if not isinstance(heads, list):
        raise CELError(f"{f}: 'heads' must be a list of head rows, got {type(heads).__name__}")
    if not heads:
        raise CELError(f"{f} is an empty shard (no heads)")
    k, n = p["_shard"]
    for i, h in enumerate(heads):
        if not (isinstance(h, dict) and _is_int(h.get("layer")) and _is_int(h.get("head"))
                and h["layer"] >= 0 and h["head"] >= 0):
            raise CELError(f"{f}: head row {i} needs integer 'layer' and 'head'")
        for key in _ROW_NUMBERS[p["method"]]:
            if not _is_number(h.get(key)):
                raise CELError(f"{f}: head row {i} (L{h['layer']}H{h['head']}) has no number '{key}'")
        if "p_value" in _ROW_NUMBERS[p["method"]] and not 0 <= h["p_value"] <= 1:
            raise CELError(f"{f}: head row {i} (L{h['layer']}H{h['head']}) has p_value {h['p_value']!r}, "
                           f"outside 0..1")
        if h["layer"] % n != k - 1:
            raise CELError(f"{f}: head L{h['layer']}H{h['head']} is not in shard {k}/{n} (layers {k - 1} modulo {n})")
    return p


def merge(files: list[str]) -> dict:
    """Combine shard outputs of one screen into the screen an unsharded run gives (BH q-values and the candidate
    rule recomputed over all heads); a :class:`CELError` naming the file on mixed configurations, a missing or
    repeated shard, or a head listed twice."""
    parts = [read_shard(f) for f in files]
    for f, p in zip(files, parts):
        for k in _SHARD_SAME:
            if p.get(k) != parts[0].get(k):
                raise CELError(f"{f} does not belong to the same screen as {files[0]}: '{k}' differs "
                               f"({p.get(k)!r} against {parts[0].get(k)!r})")
    n = {p["_shard"][1] for p in parts}
    got = sorted(p["_shard"][0] for p in parts)
    if len(n) != 1 or got != list(range(1, n.pop() + 1)):
        raise CELError(f"need every shard exactly once, got shards {[p['shard'] for p in parts]}")
    seen: dict[tuple[int, int], str] = {}
    for f, p in zip(files, parts):
        for h in p["heads"]:
            key = (h["layer"], h["head"])
            if key in seen:
                raise CELError(f"head L{key[0]}H{key[1]} is listed twice ({seen[key]} and {f})")
            seen[key] = f
    _check_coverage(files, parts, seen)
    heads = sorted((h for p in parts for h in p["heads"]), key=lambda h: (h["layer"], h["head"]))
    out = {k: v for k, v in parts[0].items() if k not in ("shard", "_shard", "heads", "timing", "screen_heads")}
    if parts[0]["method"] == "exact":
        # BH depends on every head: a shard's q-values and candidate flags are recomputed over the whole screen
        fdr = out.get("fdr", FDR)
        q = benjamini_hochberg([h["p_value"] for h in heads])
        for h, qq in zip(heads, q):
            h["q_value"] = float(qq)
            h["candidate"] = bool(is_candidate(h["delta_accuracy"], qq, h["margin_ci_low"], fdr))
    out["heads"] = heads
    out["timing"] = {"seconds": round(sum(_shard_seconds(p) for p in parts), 3), "shards": len(parts)}
    return out


def screen_heads_record(spec: str | None, n_layers: int, n_heads: int) -> dict:
    """What a shard records about the whole screen it is part of: the ``--heads`` spec and the model's geometry, so
    that :func:`merge` can name a head that no shard holds.

    Example:
        >>> screen_heads_record(None, 2, 3)
        {'spec': 'all', 'n_layers': 2, 'n_heads': 3}
    """
    return {"spec": spec or "all", "n_layers": int(n_layers), "n_heads": int(n_heads)}


def _check_coverage(files, parts, seen) -> None:
    """Every head of the screen (``screen_heads`` of the shards, when they record it) is in its shard's file."""
    rec = parts[0].get("screen_heads")
    if not isinstance(rec, dict):
        return
    try:
        want = parse_heads(rec.get("spec", ""), rec.get("n_layers"), rec.get("n_heads"))
    except (CELError, TypeError, ValueError):
        raise CELError(f"{files[0]}: 'screen_heads' is not a head spec with the model's layers and heads") from None
    n = parts[0]["_shard"][1]
    for h in want:
        if h not in seen:
            k = h[0] % n + 1
            f = next((f for f, p in zip(files, parts) if p["_shard"][0] == k), files[0])
            raise CELError(f"head {head_name(h)} of the screen is missing: shard {k}/{n} ({f}) does not list it")
    extra = [h for h in seen if h not in set(want)]
    if extra:
        raise CELError(f"head {head_name(extra[0])} ({seen[extra[0]]}) is not among the screen's heads "
                       f"({rec.get('spec')!r})")


def _shard_seconds(p: dict) -> float:
    t = p.get("timing")
    s = t.get("seconds", 0) if isinstance(t, dict) else 0
    return float(s) if _is_number(s) else 0.0


def ranked_from_screen_file(path: str, want: dict) -> list[dict]:
    """The heads of a ``cel screen --out`` file, best first by margin, after checking that the screen was made on
    the items a search will use (``want``: its model, task, split, seed and number of items).

    Example:
        >>> import json, tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "s.json")
        >>> _ = open(f, "w").write(json.dumps({"model": "m", "heads": [{"layer": 0, "head": 1, "delta_margin": 0.1},
        ...                                                            {"layer": 1, "head": 0, "delta_margin": 0.3}]}))
        >>> [(h["layer"], h["head"]) for h in ranked_from_screen_file(f, {"model": "m"})]
        [(1, 0), (0, 1)]
    """
    try:
        with open(path, encoding="utf-8") as f:
            scr = json.load(f)
    except (OSError, ValueError) as e:
        raise CELError(f"cannot read screen {path}: {e}") from None
    heads = scr.get("heads") if isinstance(scr, dict) else None
    if not isinstance(heads, list) or not heads or not all(
            isinstance(h, dict) and isinstance(h.get("layer"), int) and isinstance(h.get("head"), int)
            and isinstance(h.get("delta_margin", h.get("estimated_delta_margin")), (int, float)) for h in heads):
        raise CELError(f"{path} is not a screen: it needs a list 'heads' of layer, head and delta_margin")
    for k, v in want.items():
        if scr.get(k) != v:
            raise CELError(f"{path} was screened with {k} = {scr.get(k)!r}, but this search uses {v!r}: "
                           f"screen the search split with the same --model, --task, --seed and --n")
    return sorted(heads, key=lambda h: -h.get("delta_margin", h.get("estimated_delta_margin", 0)))
