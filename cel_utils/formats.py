"""Meaning-preserving prompt formats: the same items asked another way (chapter 1c, ``cel robust``).

A verdict speaks for one prompt format. :data:`FORMATS` holds, per built-in task, eight formats written here and
fixed before any run: the task's own (``default``, first), other few-shot demonstrations, more or none, another
separator or spacing, an instruction line. Each re-renders an item from its ``fields`` (the operands, the
subject and attractor, ...), so every format asks the same questions with the same answers; only the wording
around them changes. Heads are chosen on the default format only; the others test whether a gain transfers.

Example:
    >>> from cel_utils.tasks import load_task
    >>> t = load_task("addition", "heldout", n=1)
    >>> [f.name for f in FORMATS["addition"]][:3]
    ['default', 'other demos (1)', 'other demos (2)']
    >>> in_format(t, "no spaces").items[0]["prompt"].splitlines()[-1]
    '87+76='
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable

from .errors import CELError
from .generators import NOUNS_SG_PL, OBJECTS_SG_PL, PREDICATES, review, toy_text
from .tasks import Task
from .variants import VARIANTS


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    render: Callable[[dict], dict]   # an item (with ``fields``) -> the same item asked this way


@lru_cache(maxsize=None)
def _item_pairs(task_name: str) -> frozenset:
    """The operand pairs (unordered) of every item of a built-in arithmetic task (seed 0, all splits): a format's
    demonstrations avoid them, so no format shows an item's own answer."""
    from .tasks import SPLITS, load_task

    return frozenset(frozenset((it["fields"]["a"], it["fields"]["b"])) for s in SPLITS
                     for it in load_task(task_name, s).items)


def _demo_pairs(seed: str, k: int, ok=lambda a, b: True, avoid: frozenset = frozenset()) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out = []
    while len(out) < k:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if ok(a, b) and (a, b) not in out and frozenset((a, b)) not in avoid:
            out.append((a, b))
    return out


def _arith(op: str, k: int = 3, seed: str = "demos-1", line="{a} {op} {b} = {c}\n", ask="{a} {op} {b} = ",
           head: str = "", sep: str | None = None, task: str = ""):
    """A format for two-operand arithmetic (``op`` is "+" or "-"): ``k`` demonstrations drawn with ``seed``,
    none of them one of ``task``'s items (default: the family's base task)."""
    fn = (lambda a, b: a + b) if op == "+" else (lambda a, b: a - b)
    ok = (lambda a, b: True) if op == "+" else (lambda a, b: a - b >= 10)

    @lru_cache(maxsize=1)
    def prefix():
        demos = _demo_pairs(f"{op}:{seed}", k, ok, _item_pairs(task or ("addition" if op == "+" else "subtraction")))
        lines = [line.format(a=a, b=b, c=fn(a, b), op=op) for a, b in demos]
        return head + ("".join(lines) if sep is None else sep.join(x.rstrip("\n") for x in lines) + (sep if lines else ""))

    def render(item):
        f = item["fields"]
        return {**item, "prompt": prefix() + ask.format(a=f["a"], b=f["b"], op=op)}
    return render


def _arith_formats(op: str, word: str, task: str = "") -> list[Format]:
    t = {"task": task}
    return [
        Format("default", "the task's own prompt", lambda it: it),
        Format("other demos (1)", "three other demonstrations", _arith(op, seed="demos-1", **t)),
        Format("other demos (2)", "three more demonstrations", _arith(op, seed="demos-2", **t)),
        Format("five demos", "five demonstrations", _arith(op, k=5, seed="demos-5", **t)),
        Format("no demos", "zero-shot", _arith(op, k=0, **t)),
        Format("no spaces", "no spaces around the signs", _arith(op, seed="demos-1", line="{a}{op}{b}={c}\n",
                                                                ask="{a}{op}{b}=", **t)),
        Format("instruction", f"an instruction line first ('{word.capitalize()} the two numbers.')",
               _arith(op, seed="demos-1", head=f"{word.capitalize()} the two numbers.\n", **t)),
        Format("semicolons", "demonstrations on one line, separated by '; '", _arith(op, seed="demos-1", sep="; ", **t)),
    ]


def _agreement_demos(seed: str, k: int, template: str) -> str:
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        (s, p), (s2, p2) = rng.sample(NOUNS_SG_PL, 2)
        plural = rng.random() < 0.5
        verb = rng.choice(["saw", "met", "liked"])
        subj, attr = (p, s2) if plural else (s, p2)
        extra = ({"prep2": "by", "attractor2": rng.choice(OBJECTS_SG_PL)[0 if plural else 1]}
                 if "{attractor2}" in template else {})   # a variant's second attractor (the base tasks draw none)
        out.append(template.format(subject=subj, attractor=attr, verb=verb, prep="near", **extra)
                   + (" are " if plural else " is ") + rng.choice(PREDICATES) + ".\n")
    return "".join(out)


def _sentence(template: str, head: str = "", choices=None, lower: bool = False):
    def render(item):
        text = template.format(**item["fields"])
        if lower:
            text = text[0].lower() + text[1:]
        return {**item, "prompt": head + text, **({"choices": list(choices)} if choices else {})}
    return render


def _agreement_formats(template: str) -> list[Format]:
    return [
        Format("default", "the task's own prompt", lambda it: it),
        Format("instruction", "'Complete the sentence.' first", _sentence(template, "Complete the sentence.\n")),
        Format("lower case", "the sentence starts in lower case", _sentence(template, lower=True)),
        Format("label", "'Sentence: ' before it", _sentence(template, "Sentence: ")),
        Format("past tense", "the choices ' was' / ' were'", _sentence(template, choices=(" was", " were"))),
        Format("demos (1)", "three complete sentences first",
               _sentence(template, _agreement_demos("agree-1", 3, template))),
        Format("demos (2)", "three other complete sentences first",
               _sentence(template, _agreement_demos("agree-2", 3, template))),
        Format("new line", "a blank line before the sentence", _sentence(template, "\n")),
    ]


def _ioi(template: str, head: str = ""):
    def render(item):
        f = item["fields"]
        return {**item, "prompt": head + template.format(**f)}
    return render


def _comparison(k: int, seed: str, line: str = "Which is larger, {a} or {b}? {c}\n",
                ask: str = "Which is larger, {a} or {b}?", head: str = ""):
    demos = _demo_pairs(f"cmp:{seed}", k, lambda a, b: a != b)
    prefix = head + "".join(line.format(a=a, b=b, c=max(a, b)) for a, b in demos)

    def render(item):
        f = item["fields"]
        return {**item, "prompt": prefix + ask.format(a=f["a"], b=f["b"])}
    return render


@lru_cache(maxsize=None)
def _reviews(task_name: str) -> frozenset:
    """Every review of a built-in sentiment task's items (seed 0, all splits; an item's ``key`` is its review): a
    format's demonstrations avoid them, so no format shows an item's own review."""
    from .tasks import SPLITS, load_task

    return frozenset(it["key"] for s in SPLITS for it in load_task(task_name, s).items)


def _sentiment(task: str, k: int, seed: str, review_label: str = "Review", answer_label: str = "Sentiment",
               head: str = ""):
    """A format for movie-review sentiment: ``k`` demonstrations (positive first, then alternating) drawn with
    ``seed``, none of them one of ``task``'s reviews; the item's review (its ``key``) asked the same way."""
    @lru_cache(maxsize=1)
    def prefix():
        rng, demos = random.Random(f"senti:{seed}"), []
        while len(demos) < k:
            text = review(rng, len(demos) % 2 == 0)
            if text not in _reviews(task) and text not in demos:
                demos.append(text)
        return head + "".join(f"{review_label}: {t}\n{answer_label}: {'positive' if i % 2 == 0 else 'negative'}\n\n"
                              for i, t in enumerate(demos))

    def render(item):
        return {**item, "prompt": prefix() + f"{review_label}: {item['key']}\n{answer_label}:"}
    return render


# how many demonstrations each sentiment task's own prompt shows (a test counts them in the items)
SENTIMENT_DEMOS = {"sentiment": 4, "sentiment_0shot": 0, "sentiment_1shot": 1}


def _sentiment_formats(task: str, k: int) -> list[Format]:
    """Eight formats of a sentiment task whose own prompt shows ``k`` demonstrations."""
    return [
        Format("default", "the task's own prompt", lambda it: it),
        Format("other demos (1)", f"{k or 1} other demonstration(s)", _sentiment(task, k or 1, "demos-1")),
        Format("other demos (2)", f"{k or 1} more demonstration(s)", _sentiment(task, k or 1, "demos-2")),
        Format("more demos", f"{k + 2} demonstrations", _sentiment(task, k + 2, "demos-more")),
        Format("no demos" if k else "two demos", "zero-shot" if k else "two demonstrations",
               _sentiment(task, 0 if k else 2, "demos-1")),
        Format("instruction", "'Is this movie review positive or negative?' first",
               _sentiment(task, k, "demos-1", head="Is this movie review positive or negative?\n")),
        Format("movie review", "'Movie review:' instead of 'Review:'",
               _sentiment(task, k, "demos-1", review_label="Movie review")),
        Format("opinion", "'Opinion:' instead of 'Sentiment:'", _sentiment(task, k, "demos-1", answer_label="Opinion")),
    ]


FORMATS: dict[str, list[Format]] = {
    "addition": _arith_formats("+", "add"),
    "subtraction": _arith_formats("-", "subtract"),
    "agreement_rc": _agreement_formats("The {subject} that the {attractor} {verb}"),
    "agreement": _agreement_formats("The {subject} {prep} the {attractor}"),
    "ioi": [
        Format("default", "the task's own prompt", lambda it: it),
        Format("after", "'After' instead of 'When'", _ioi("After {first} went to the {place}, {giver} gave a {obj} to")),
        Format("then", "two clauses joined by 'then'",
               _ioi("{first} went to the {place}, then {giver} gave a {obj} to")),
        Format("the object", "'the' instead of 'a'", _ioi("When {first} went to the {place}, {giver} gave the {obj} to")),
        Format("handed", "'handed' instead of 'gave'",
               _ioi("When {first} went to the {place}, {giver} handed a {obj} to")),
        Format("instruction", "'Complete the sentence.' first",
               _ioi("When {first} went to the {place}, {giver} gave a {obj} to", "Complete the sentence.\n")),
        Format("label", "'Story: ' before it", _ioi("When {first} went to the {place}, {giver} gave a {obj} to",
                                                    "Story: ")),
        Format("new line", "a blank line before the sentence",
               _ioi("When {first} went to the {place}, {giver} gave a {obj} to", "\n")),
    ],
    "sentiment": _sentiment_formats("sentiment", SENTIMENT_DEMOS["sentiment"]),
    "comparison": [
        Format("default", "the task's own prompt", lambda it: it),
        Format("other demos (1)", "three other demonstrations", _comparison(3, "demos-1")),
        Format("other demos (2)", "three more demonstrations", _comparison(3, "demos-2")),
        Format("five demos", "five demonstrations", _comparison(5, "demos-5")),
        Format("no demos", "zero-shot", _comparison(0, "none")),
        Format("bigger", "'Which number is bigger: a or b?'",
               _comparison(3, "demos-1", "Which number is bigger: {a} or {b}? {c}\n", "Which number is bigger: {a} or {b}?")),
        Format("instruction", "an instruction line first",
               _comparison(3, "demos-1", head="Answer with the larger number.\n")),
        Format("answer label", "'Answer:' before each answer",
               _comparison(3, "demos-1", "Which is larger, {a} or {b}? Answer: {c}\n",
                           "Which is larger, {a} or {b}? Answer:")),
    ],
}


def _toy(order: Callable[[dict, list[int]], list[int]]):
    """A format of chapter 3's token tasks: the same tokens (types and signs) in another order."""
    def render(it: dict) -> dict:
        f = it["fields"]
        idx = order(it, list(range(len(f["types"]))))
        types, signs = [f["types"][i] for i in idx], [f["signs"][i] for i in idx]
        return dict(it, prompt=toy_text(types, signs), fields={"types": types, "signs": signs})
    return render


def _reshuffled(seed: str):
    return lambda it, idx: random.Random(f"{seed}:{it['key']}").sample(idx, len(idx))


TOY_FORMATS = [
    Format("default", "the sequence as generated", lambda it: it),
    Format("reshuffled (1)", "the same tokens in another random order", _toy(_reshuffled("order-1"))),
    Format("reshuffled (2)", "the same tokens in a third random order", _toy(_reshuffled("order-2"))),
    Format("reversed", "the same tokens in reverse order", _toy(lambda it, idx: idx[::-1])),
    Format("signals first", "A, B and C first, then the distractors",
           _toy(lambda it, idx: sorted(idx, key=lambda i: it["fields"]["types"][i] == 3))),
    Format("signals last", "the distractors first, then A, B and C",
           _toy(lambda it, idx: sorted(idx, key=lambda i: it["fields"]["types"][i] != 3))),
]
FORMATS.update({"toy_a": TOY_FORMATS, "toy_b": TOY_FORMATS})


def _variant_formats(spec) -> list[Format] | None:
    """A difficulty variant's formats: its family's, re-rendering the variant's own items (arithmetic demonstrations
    avoid the variant's items; agreement re-renders the variant's template); None for a variant without fields."""
    if spec.family in ("addition", "subtraction"):
        return _arith_formats("+" if spec.family == "addition" else "-",
                              "add" if spec.family == "addition" else "subtract", spec.name)
    if spec.family == "comparison":
        return FORMATS["comparison"]
    if spec.family == "sentiment":
        return _sentiment_formats(spec.name, SENTIMENT_DEMOS[spec.name])
    return _agreement_formats(spec.template) if spec.template else None


FORMATS.update({name: f for name, spec in VARIANTS.items() if (f := _variant_formats(spec))})


def formats_of(task_name: str) -> list[Format]:
    """The formats of a built-in task (a :class:`CELError` for a task without them)."""
    if task_name not in FORMATS:
        raise CELError(f"task {task_name!r} has no prompt formats; formats exist for {', '.join(FORMATS)}")
    return FORMATS[task_name]


def in_format(task: Task, name: str) -> Task:
    """``task`` with every item asked in format ``name`` (same items, same answers, same order)."""
    fmt = next((f for f in formats_of(task.name) if f.name == name), None)
    if fmt is None:
        raise CELError(f"task {task.name!r} has no format {name!r}")
    return replace(task, items=[fmt.render(it) for it in task.items])
