"""Difficulty variants: each task family's knob, written before any head is screened.

A pair (model, task) can only show a gain when the model's accuracy leaves room for one; a task at the ceiling
or the floor gives "pipeline power 0.00" as a property of the task, not a finding. Each family below has a knob
that moves its difficulty without changing what is asked: digits and carries for arithmetic, the number of
demonstrations, how close the compared numbers are, the number of attractors or a clause's depth for agreement,
a distractor sentence or a third name for IOI. Every variant is a built-in task with its own stratified, leak-free
splits (no twin and no demonstration across splits: the checks of the base tasks apply). Which variants a chapter
uses is decided on the search split alone (:mod:`cel_utils.calibration`).

Example:
    >>> from cel_utils.tasks import load_task
    >>> t = load_task("addition_carry", n=3)
    >>> all(int(it["fields"]["a"]) % 10 + int(it["fields"]["b"]) % 10 >= 10 for it in t.items)
    True
    >>> VARIANTS["addition_carry"].family, VARIANTS["addition_carry"].knob
    ('addition', 'carries: every item carries from the units')
"""

from __future__ import annotations

import random
from typing import Callable

from .generators import (NAMES, NOUNS_SG_PL, OBJECTS, OBJECTS_SG_PL, PLACES, PREPS, RC_VERBS, TaskSpec, mc_item,
                         review, shuffle_choices, unordered)

ENUMERATE_LIMIT = 20_000   # operand grids up to this size are enumerated; larger ones are sampled


def operand_pairs(rng: random.Random, a: range, b: range, ok: Callable, count: int) -> list[tuple[int, int]]:
    """``count`` distinct operand pairs (a from ``a``, b from ``b``, ``ok(a, b)``) in a random order: the whole
    grid shuffled when it is small, else drawn until enough (fewer when the grid has fewer)."""
    if len(a) * len(b) <= ENUMERATE_LIMIT:
        pairs = [(x, y) for x in a for y in b if ok(x, y)]
        rng.shuffle(pairs)
        return pairs[:count]
    out, seen = [], set()
    for _ in range(50 * count):
        x, y = rng.choice(a), rng.choice(b)
        if ok(x, y) and (x, y) not in seen:
            seen.add((x, y))
            out.append((x, y))
            if len(out) == count:
                break
    return out


def arithmetic(op: str, k: int = 3, a: range = range(10, 100), b: range = range(10, 100),
               ok: Callable = lambda x, y: True, limit: int = 1000) -> Callable:
    """A generator of ``a op b = `` problems (``op`` "+" or "-"), ``k``-shot, exact match of the result. The
    demonstrations are drawn from the same problems; no item is a demonstration or another item's twin (for "+"
    the commuted ``b + a``: keys are unordered pairs)."""
    fn = (lambda x, y: x + y) if op == "+" else (lambda x, y: x - y)
    key = unordered if op == "+" else (lambda x, y: f"{x}-{y}")

    def gen(rng: random.Random):
        pairs = operand_pairs(rng, a, b, ok, 2 * (limit + k))
        seen, demos, rest = set(), [], []
        for x, y in pairs:
            if key(x, y) in seen:
                continue
            seen.add(key(x, y))
            (demos if len(demos) < k else rest).append((x, y))
            if len(rest) == limit:
                break
        prefix = "".join(f"{x} {op} {y} = {fn(x, y)}\n" for x, y in demos)
        return [{"prompt": prefix + f"{x} {op} {y} = ", "target": str(fn(x, y)), "key": key(x, y),
                 "fields": {"a": x, "b": y}} for x, y in rest]
    return gen


def close_comparison(k: int = 3) -> Callable:
    """Which of two three-digit numbers with the same first digit is larger (3-shot)."""
    def gen(rng: random.Random):
        pairs = operand_pairs(rng, range(100, 1000), range(100, 1000), lambda x, y: x != y and x // 100 == y // 100,
                              4000)
        seen, demos, pool = set(), [], []
        for x, y in pairs:
            if unordered(x, y) in seen:
                continue
            seen.add(unordered(x, y))
            if len(demos) < k:
                demos.append((x, y))
                continue
            pool.append((x, y))
            if len(pool) == 1000:
                break
        prefix = "".join(f"Which is larger, {x} or {y}? {max(x, y)}\n" for x, y in demos)
        return [mc_item(prefix + f"Which is larger, {x} or {y}?", [f" {x}", f" {y}"], int(y > x), key=unordered(x, y),
                        label="second" if y > x else "first", fields={"a": x, "b": y}) for x, y in pool]
    return gen


AGREE_2ATTR = "The {subject} {prep} the {attractor} {prep2} the {attractor2}"
AGREE_RC_PP = "The {subject} that the {attractor} {prep} the {attractor2} {verb}"


def agreement(template: str, limit: int = 1000) -> Callable:
    """Subject-verb agreement in ``template`` (fields subject, attractor, attractor2, prep, prep2, verb): every
    attractor has the number opposite to the subject's; choices " is" / " are"."""
    def gen(rng: random.Random):
        pool, seen = [], set()
        for _ in range(20 * limit):
            (s, p), (s2, p2) = rng.sample(NOUNS_SG_PL, 2)
            o_s, o_p = rng.choice(OBJECTS_SG_PL)
            plural = rng.random() < 0.5
            f = {"subject": p if plural else s, "attractor": s2 if plural else p2, "attractor2": o_s if plural else o_p,
                 "prep": rng.choice(PREPS), "prep2": rng.choice(PREPS), "verb": rng.choice(RC_VERBS)}
            prompt = template.format(**f)
            if prompt in seen:
                continue
            seen.add(prompt)
            pool.append(mc_item(prompt, [" is", " are"], int(plural), key=prompt,
                                label="plural" if plural else "singular", fields=f))
            if len(pool) == limit:
                break
        return pool
    return gen


WHEN = ["late", "early", "cold", "warm", "sunny", "raining"]
STATE = ["busy", "quiet", "crowded", "empty", "noisy", "open"]


def ioi_variant(names: int = 2, distractor: bool = False, limit: int = 3000) -> Callable:
    """Indirect object identification with a distractor clause between the two sentences (``distractor``) or
    three names, two of whom give (``names=3``: the answer is the one who does not; three choices)."""
    def gen(rng: random.Random):
        pool = []
        for _ in range(limit):
            people = rng.sample(NAMES, names)
            io, givers = people[0], people[1:]
            order = people[:]
            rng.shuffle(order)
            place, obj = rng.choice(PLACES), rng.choice(OBJECTS)
            first = " and ".join(order) if names == 2 else f"{order[0]}, {order[1]} and {order[2]}"
            middle = f" it was {rng.choice(WHEN)} and the {place} was {rng.choice(STATE)}." if distractor else ""
            giver = " and ".join(givers)
            prompt = (f"When {first} went to the {place},{middle} {'Then ' if distractor else ''}{giver} gave a {obj} to"
                      if distractor else f"When {first} went to the {place}, {giver} gave a {obj} to")
            choices, ans = shuffle_choices(rng, " " + io, [" " + g for g in givers])
            pool.append(mc_item(prompt, choices, ans, key=prompt, label=f"answer named {order.index(io) + 1}"))
        return pool
    return gen


def sentiment(demo_labels: tuple[bool, ...]) -> Callable:
    """Movie-review sentiment with the given demonstrations (True: positive); no item repeats a demonstration."""
    def gen(rng: random.Random):
        demos = [(review(rng, pos), pos) for pos in demo_labels]
        prefix = "".join(f"Review: {t}\nSentiment: {'positive' if pos else 'negative'}\n\n" for t, pos in demos)
        shown, pool = {t for t, _ in demos}, []
        for _ in range(3000):
            pos = rng.random() < 0.5
            text = review(rng, pos)
            if text not in shown:
                pool.append(mc_item(prefix + f"Review: {text}\nSentiment:", [" positive", " negative"],
                                    0 if pos else 1, key=text, label="positive" if pos else "negative"))
        return pool
    return gen


def _carry(x, y):
    return x % 10 + y % 10 >= 10


VARIANTS: dict[str, TaskSpec] = {t.name: t for t in [
    TaskSpec("addition_nocarry", "em", arithmetic("+", ok=lambda x, y: not _carry(x, y) and x + y < 100),
             "two-digit addition with no carry and a two-digit sum, 3-shot", family="addition",
             knob="carries: no item carries"),
    TaskSpec("addition_carry", "em", arithmetic("+", ok=_carry), "two-digit addition, every item carrying, 3-shot",
             family="addition", knob="carries: every item carries from the units"),
    TaskSpec("addition_2plus1", "em", arithmetic("+", b=range(1, 10)), "a two-digit plus a one-digit number, 3-shot",
             family="addition", knob="digits: the second operand has one digit"),
    TaskSpec("addition_3digit", "em", arithmetic("+", a=range(100, 1000), b=range(100, 1000)),
             "three-digit addition, 3-shot", family="addition", knob="digits: three-digit operands"),
    TaskSpec("addition_1shot", "em", arithmetic("+", k=1), "two-digit addition, 1-shot", family="addition",
             knob="demonstrations: one"),
    TaskSpec("addition_6shot", "em", arithmetic("+", k=6), "two-digit addition, 6-shot", family="addition",
             knob="demonstrations: six"),
    TaskSpec("subtraction_noborrow", "em", arithmetic("-", a=range(20, 100), b=range(10, 90),
                                                      ok=lambda x, y: x - y >= 10 and x % 10 >= y % 10),
             "two-digit subtraction with no borrow, 3-shot", family="subtraction", knob="borrows: none"),
    TaskSpec("subtraction_borrow", "em", arithmetic("-", a=range(20, 100), b=range(10, 90),
                                                    ok=lambda x, y: x - y >= 10 and x % 10 < y % 10),
             "two-digit subtraction, every item borrowing, 3-shot", family="subtraction", knob="borrows: every item"),
    TaskSpec("comparison_close", "mc", close_comparison(), "which of two three-digit numbers is larger, same first digit",
             ("first", "second"), family="comparison", knob="digits: three, the first one shared"),
    TaskSpec("agreement_2attr", "mc", agreement(AGREE_2ATTR), "agreement across two prepositional attractors",
             ("singular", "plural"), family="agreement", knob="attractors: two", template=AGREE_2ATTR),
    TaskSpec("agreement_rc_pp", "mc", agreement(AGREE_RC_PP),
             "agreement across a relative clause holding a prepositional attractor", ("singular", "plural"),
             family="agreement_rc", knob="depth: a prepositional phrase inside the clause", template=AGREE_RC_PP),
    TaskSpec("ioi_distractor", "mc", ioi_variant(distractor=True), "IOI with a distractor clause before the giving",
             family="ioi", knob="distractor: a clause between the two sentences"),
    TaskSpec("ioi_3names", "mc", ioi_variant(names=3), "IOI with three names, two of whom give",
             ("answer named 1", "answer named 2", "answer named 3"), family="ioi", knob="names: three"),
    TaskSpec("sentiment_0shot", "mc", sentiment(()), "movie-review sentiment, zero-shot", ("positive", "negative"),
             family="sentiment", knob="demonstrations: none"),
    TaskSpec("sentiment_1shot", "mc", sentiment((True,)), "movie-review sentiment, one positive demonstration",
             ("positive", "negative"), family="sentiment", knob="demonstrations: one"),
]}


def family_of(name: str) -> str:
    """The family of a built-in task (a base task is its own family).

    Example:
        >>> family_of("agreement_rc_pp"), family_of("addition")
        ('agreement_rc', 'addition')
    """
    spec = VARIANTS.get(name)
    return spec.family if spec else name
