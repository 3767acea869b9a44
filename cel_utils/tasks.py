"""Tasks: built-in generated tasks with three disjoint, stratified splits, and JSONL tasks.

Every task's items are dealt into three splits with one role each: ``search`` (screen every head, rank),
``confirm`` (re-test only the few heads chosen on ``search``) and ``heldout`` (the final test of what was
chosen on the other two; nothing on it takes part in any choice). The deal is stratified by the item's class
(its ``label``; else the answer's position for multiple choice, the answer's length for exact match), and
each split is ordered so that its first ``n`` items keep the class mix.

Two kinds of item:
  * multiple choice ``{"prompt", "choices", "answer"}`` (metric: the answer has the highest log-prob)
  * exact match ``{"prompt", "target"}`` (metric: every target token is top-1 under teacher forcing)

Example:
    >>> from cel_utils.tasks import load_task
    >>> t = load_task("addition", split="search", n=2, seed=0)
    >>> t.kind, len(t.items), t.items[0]["prompt"].endswith("= ")
    ('em', 2, True)
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import CELError
from .generators import BASE_TASKS, METRICS, TaskSpec
from .variants import VARIANTS

SPLITS = ("search", "confirm", "heldout")


@dataclass
class Task:
    name: str
    kind: str  # "mc" or "em"
    items: list[dict]
    split: str | None = None
    seed: int | None = None
    description: str = ""
    metric: str = ""
    source: str = "builtin"
    labels: list[str] = field(default_factory=list)  # class labels, for per-class accuracy

    def items_hash(self) -> str:
        blob = json.dumps(self.items, sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.items)


def stratum(item: dict):
    """The class an item is stratified by: its ``label``, else the answer index (multiple choice), else the
    target's length in characters (exact match)."""
    if item.get("label") is not None:
        return str(item["label"])
    if "answer" in item:
        return f"answer {item['answer']}"
    return f"length {len(item.get('target', ''))}"


def split_items(items: list[dict], rng: random.Random) -> dict[str, list[dict]]:
    """Deal distinct items into the three splits, stratified by :func:`stratum`.

    Within each class the items are shuffled and dealt in turn (the class's first split rotates, so that
    remainders spread evenly); each split is then ordered by position within its class, scaled to the class's
    share, so that any prefix of a split keeps the class mix.

    Example:
        >>> items = [{"prompt": str(i), "target": "x", "label": "ab"[i % 2], "key": i} for i in range(12)]
        >>> parts = split_items(items, random.Random(0))
        >>> [len(parts[s]) for s in SPLITS], [it["label"] for it in parts["search"]]
        ([4, 4, 4], ['a', 'b', 'a', 'b'])
    """
    seen, uniq = set(), []
    for it in items:
        k = it.get("key", json.dumps([it.get("prompt"), it.get("choices"), it.get("target")]))
        if k not in seen:
            seen.add(k)
            uniq.append(it)
    classes: dict = {}
    for it in uniq:
        classes.setdefault(stratum(it), []).append(it)
    dealt: dict[str, list] = {s: [] for s in SPLITS}
    for c, key in enumerate(sorted(classes)):
        members = classes[key]
        rng.shuffle(members)
        for i, it in enumerate(members):
            dealt[SPLITS[(i + c) % len(SPLITS)]].append((key, it))
    out = {}
    for s, pairs in dealt.items():
        count: dict = {}
        ranked = []
        size = {k: sum(1 for kk, _ in pairs if kk == k) for k, _ in pairs}
        for key, it in pairs:
            j = count.get(key, 0)
            count[key] = j + 1
            ranked.append(((j + 0.5) / size[key], key, it))
        ranked.sort(key=lambda r: (r[0], r[1]))
        out[s] = [it for _, _, it in ranked]
    return out


BUILTIN_TASKS: dict[str, TaskSpec] = {**BASE_TASKS, **VARIANTS}


def load_task(name: str, split: str | None = None, n: int | None = None, seed: int = 0,
              clip: bool = False) -> Task:
    """A split of a built-in task (``search`` when ``split`` is None), or of a JSONL file.

    A JSONL file gives all its items in file order when ``split`` is None; with a split, the items whose
    ``split`` field names it (when every line has one), else a deterministic stratified split of the file's
    items (:func:`split_items`, seeded by ``seed`` and the file's contents). ``n`` larger than the split is an
    error, unless ``clip=True`` (then all items are used).

    Example:
        >>> len(load_task("antonyms", n=1000, clip=True))
        21
    """
    if split is not None and split not in SPLITS:
        raise CELError(f"unknown split {split!r}; use {', '.join(SPLITS)}")
    if name.endswith(".jsonl") or Path(name).suffix == ".jsonl" or Path(name).exists():
        task = load_jsonl(name)
        if split is not None:
            task = _jsonl_split(task, split, seed)
        return _take(task, n if not clip or n is None else min(n, len(task.items)))
    if name not in BUILTIN_TASKS:
        raise CELError(f"unknown task {name!r}; built-in tasks: {', '.join(BUILTIN_TASKS)} "
                       f"(or a path to a .jsonl file)")
    split = split or "search"
    spec = BUILTIN_TASKS[name]
    items = [dict(it) for it in dealt(name, seed)[split]]
    task = Task(name=name, kind=spec.kind, items=items, split=split, seed=seed, description=spec.description,
                metric=METRICS[spec.kind], labels=list(spec.labels))
    return _take(task, n if not clip or n is None else min(n, len(task.items)))


@functools.lru_cache(maxsize=64)
def dealt(name: str, seed: int) -> dict[str, tuple]:
    """A built-in task's pool, generated and dealt into its splits once per process (``{split: items}``; callers
    copy the items they hand out)."""
    rng = random.Random(f"{name}:{seed}")
    return {k: tuple(v) for k, v in split_items(BUILTIN_TASKS[name].generator(rng), rng).items()}


def _jsonl_split(task: Task, split: str, seed: int) -> Task:
    marked = [it.get("split") for it in task.items]
    if all(m is not None for m in marked):
        task.items = [it for it in task.items if it["split"] == split]
    elif any(m is not None for m in marked):
        line = next(i for i, m in enumerate(marked, 1) if m is None)
        raise CELError(f"{task.source}: item {line} has no 'split' field while others have one")
    else:
        task.items = split_items(task.items, random.Random(f"{task.items_hash()}:{seed}"))[split]
    if not task.items:
        raise CELError(f"{task.source}: no items in split {split!r}")
    task.split, task.seed = split, seed
    return task


def _take(task: Task, n: int | None) -> Task:
    if n is not None:
        if n < 1:
            raise CELError(f"the number of items must be at least 1, got {n}")
        if n > len(task.items):
            where = f"split {task.split!r} of " if task.split else ""
            raise CELError(f"{n} items requested: larger than the {len(task.items)} items in {where}task {task.name!r}")
        task.items = task.items[:n]
    return task


MAX_LINE_CHARS = 100_000  # a longer JSONL line is refused (a prompt this long is almost surely a mistake)


def load_jsonl(path: str) -> Task:
    """Read a task file: one JSON object per line, multiple choice or exact match (not mixed).

    The file must be UTF-8 (a leading byte-order mark is accepted, as spreadsheet programs write one); every
    problem is a :class:`~cel_utils.errors.CELError` naming the file and line: invalid JSON, a line over
    ``MAX_LINE_CHARS`` characters, a malformed item (see :func:`validate_item`), an item repeated from an earlier
    line (same prompt and choices or target).
    """
    p = Path(path)
    if not p.exists():
        raise CELError(f"task file {path} does not exist")
    items, kind, seen = [], None, {}
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = p.read_bytes()[:e.start].count(b"\n") + 1
        raise CELError(f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x}); save the file as UTF-8") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            raise CELError(f"{path}:{lineno}: line of {len(line)} characters, over the limit of {MAX_LINE_CHARS}")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CELError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
        item_kind = validate_item(obj, f"{path}:{lineno}")
        key = json.dumps([obj["prompt"], obj.get("choices"), obj.get("target")])
        if key in seen:
            raise CELError(f"{path}:{lineno}: the same item as line {seen[key]} (duplicates would count twice)")
        seen[key] = lineno
        obj["_line"] = lineno  # for messages that name the line (e.g. a token-boundary error)
        if kind is not None and item_kind != kind:
            raise CELError(f"{path}:{lineno}: mixes exact-match and multiple-choice items")
        kind = item_kind
        items.append(obj)
    if not items:
        raise CELError(f"task file {path} has no items")
    return Task(name=p.stem, kind=kind, items=items, split=None, seed=None, description=f"items from {p.name}",
                metric=METRICS[kind], source=str(p))


def validate_item(obj, where: str) -> str:
    if not isinstance(obj, dict):
        raise CELError(f"{where}: each line must be a JSON object")
    if not isinstance(obj.get("prompt"), str):
        raise CELError(f"{where}: missing key 'prompt' (a string)")
    if not obj["prompt"].strip():
        raise CELError(f"{where}: 'prompt' is empty")
    if "split" in obj and obj["split"] not in SPLITS:
        raise CELError(f"{where}: 'split' must be one of {', '.join(SPLITS)}, got {obj['split']!r}")
    if "choices" in obj or "answer" in obj:
        ch = obj.get("choices")
        if not isinstance(ch, list):
            raise CELError(f"{where}: missing key 'choices' (a list of strings)")
        if not all(isinstance(c, str) for c in ch):
            raise CELError(f"{where}: 'choices' must all be strings")
        if len(ch) < 2:
            raise CELError(f"{where}: needs at least 2 choices, got {len(ch)}")
        if any(not c.strip() for c in ch):
            raise CELError(f"{where}: a choice is empty (it would add no tokens)")
        if len(set(ch)) < len(ch):
            raise CELError(f"{where}: two choices are identical (the item could never be answered correctly)")
        ans = obj.get("answer")
        if not isinstance(ans, int) or isinstance(ans, bool):
            raise CELError(f"{where}: missing key 'answer' (an integer index into choices)")
        if not 0 <= ans < len(ch):
            raise CELError(f"{where}: answer index {ans} out of range for {len(ch)} choices")
        return "mc"
    if "target" in obj:
        if not isinstance(obj["target"], str) or not obj["target"].strip():
            raise CELError(f"{where}: 'target' must be a non-empty string")
        return "em"
    raise CELError(f"{where}: needs either 'choices' and 'answer' (multiple choice) or 'target' (exact match)")


def list_tasks() -> list[dict]:
    return [{"name": t.name, "kind": t.kind, "metric": METRICS[t.kind], "description": t.description,
             "family": t.family or t.name, "knob": t.knob} for t in BUILTIN_TASKS.values()]


def split_tail(name: str, split: str, start: int, n: int, seed: int = 0) -> Task:
    """Items ``start .. start + n - 1`` of a built-in task's ``split`` (fewer when it ends first): the items an
    earlier chapter left unused (chapter 2a explains heads after chapter 1a's held-out items; chapter 2b doses sets
    after chapter 2's confirm and held-out items).

        >>> t = split_tail("addition", "confirm", 200, 5)
        >>> len(t.items), t.items[0] == load_task("addition", "confirm").items[200]
        (5, True)
    """
    full = load_task(name, split, seed=seed)
    if start >= len(full.items):
        raise CELError(f"task {name!r}: its {split} split has {len(full.items)} items, none after the first "
                       f"{start} (the ones already used)")
    return replace(full, items=full.items[start:start + n])

