"""The built-in tasks' generators and word lists: each generator takes an rng and returns the pool of items
(every item with a ``key``: two items with one key are one question, dealt to one split). :data:`BASE_TASKS`
names them; :mod:`cel_utils.variants` adds each family's difficulty knobs, and :mod:`cel_utils.tasks` deals the
pools into splits.

Example:
    >>> import random
    >>> items = gen_addition(random.Random(0))
    >>> len(items), items[0]["prompt"].count(chr(10))
    (1000, 3)
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Callable

from .defaults import TOY_DISTRACTORS, TOY_RHO


# --------------------------------------------------------------------------------------------
# Word lists (package data, cel_utils/data/tasks.json) and generators: each generator returns the pool of items
# given an rng; items carry "key" for splits
# --------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def word_lists() -> dict:
    """The built-in tasks' word lists, read once from package data ``cel_utils/data/tasks.json`` (pairs as tuples).

    Example:
        >>> word_lists()["capitals"][0], word_lists()["sequences"]["days"][:2]
        (('France', 'Paris'), ['Monday', 'Tuesday'])
    """
    data = json.loads((resources.files("cel_utils") / "data" / "tasks.json").read_text(encoding="utf-8"))
    return {**data["words"], **{k: [tuple(p) for p in v] for k, v in data["pairs"].items()}}


_W = word_lists()
CAPITALS, ANTONYMS, NOUNS_SG_PL, OBJECTS_SG_PL = _W["capitals"], _W["antonyms"], _W["nouns_sg_pl"], _W["objects_sg_pl"]
PREPS, RC_VERBS, PREDICATES, NAMES, PLACES = _W["preps"], _W["rc_verbs"], _W["predicates"], _W["names"], _W["places"]
OBJECTS, SEQUENCES, POS_ADJ, NEG_ADJ = _W["objects"], _W["sequences"], _W["pos_adj"], _W["neg_adj"]
SUBJECTS, INTENS = _W["subjects"], _W["intens"]

def mc_item(prompt: str, choices: list[str], answer: int, key: str, **meta) -> dict:
    """A multiple-choice item."""
    return {"prompt": prompt, "choices": choices, "answer": answer, "key": key, **meta}


def shuffle_choices(rng, correct: str, wrong: list[str]) -> tuple[list[str], int]:
    """The choices in a random order and the index of the correct one."""
    choices = [correct] + wrong
    rng.shuffle(choices)
    return choices, choices.index(correct)


def gen_capitals(rng: random.Random):
    pairs = CAPITALS[:]
    rng.shuffle(pairs)
    demos, rest = pairs[:3], pairs[3:]
    prefix = "".join(f"The capital of {c} is {k}.\n" for c, k in demos)
    pool = []
    for country, cap in rest:
        wrong = rng.sample([k for c, k in rest if k != cap], 3)
        choices, ans = shuffle_choices(rng, " " + cap, [" " + w for w in wrong])
        pool.append(mc_item(prefix + f"The capital of {country} is", choices, ans, key=country))
    return pool


def unordered(a: int, b: int) -> str:
    """The key of an addition item: its operands as an unordered pair (``a + b`` and ``b + a`` are one item).

    Example:
        >>> unordered(47, 38), unordered(38, 47)
        ('38+47', '38+47')
    """
    return f"{min(a, b)}+{max(a, b)}"


def gen_addition(rng: random.Random):
    """Two-digit sums, 3-shot. No two items, and no item and demonstration, are the same unordered pair (the
    commuted twin ``b + a`` of an item would otherwise land in another split)."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    rng.shuffle(pairs)
    demos = pairs[:3]
    seen, rest = {unordered(a, b) for a, b in demos}, []
    for a, b in pairs[3:]:
        if unordered(a, b) not in seen:
            seen.add(unordered(a, b))
            rest.append((a, b))
        if len(rest) == 1000:
            break
    prefix = "".join(f"{a} + {b} = {a + b}\n" for a, b in demos)
    return [{"prompt": prefix + f"{a} + {b} = ", "target": str(a + b), "key": unordered(a, b),
             "fields": {"a": a, "b": b}} for a, b in rest]


def gen_subtraction(rng: random.Random):
    """Two-digit differences, 3-shot, in addition's format (``a - b = ``, a two-digit answer): the same answer
    format as addition and another computation (addition's control task in chapter 1c)."""
    pairs = [(a, b) for a in range(20, 100) for b in range(10, 90) if a - b >= 10]
    rng.shuffle(pairs)
    demos, rest = pairs[:3], pairs[3:1003]
    prefix = "".join(f"{a} - {b} = {a - b}\n" for a, b in demos)
    return [{"prompt": prefix + f"{a} - {b} = ", "target": str(a - b), "key": f"{a}-{b}", "fields": {"a": a, "b": b}}
            for a, b in rest]


def gen_comparison(rng: random.Random):
    """Which of two two-digit numbers is larger, 3-shot, the two numbers as the choices; the class is where the
    larger one stands (first or second), so a shift toward one position shows as a label shift."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100) if a != b]
    rng.shuffle(pairs)
    demos, rest = pairs[:3], pairs[3:]
    prefix = "".join(f"Which is larger, {a} or {b}? {max(a, b)}\n" for a, b in demos)
    seen, pool = {unordered(a, b) for a, b in demos}, []
    for a, b in rest:
        if unordered(a, b) in seen:
            continue
        seen.add(unordered(a, b))
        pool.append(mc_item(prefix + f"Which is larger, {a} or {b}?", [f" {a}", f" {b}"], int(b > a), key=unordered(a, b),
                        label="second" if b > a else "first", fields={"a": a, "b": b}))
        if len(pool) == 1000:
            break
    return pool


def gen_agreement(rng: random.Random):
    pool = []
    for (s, p) in NOUNS_SG_PL:
        for (os_, op) in OBJECTS_SG_PL:
            for prep in PREPS:
                for subj_pl in (False, True):
                    subj = p if subj_pl else s
                    attr = os_ if subj_pl else op  # attractor with the opposite number
                    prompt = f"The {subj} {prep} the {attr}"
                    pool.append(mc_item(prompt, [" is", " are"], int(subj_pl), key=prompt,
                                    label="plural" if subj_pl else "singular",
                                    fields={"subject": subj, "prep": prep, "attractor": attr}))
    rng.shuffle(pool)
    return pool[:1000]


def gen_agreement_rc(rng: random.Random):
    pool = []
    for (s, p) in NOUNS_SG_PL:
        for (s2, p2) in NOUNS_SG_PL:
            if s == s2:
                continue
            for verb in RC_VERBS:
                for subj_pl in (False, True):
                    subj = p if subj_pl else s
                    attr = s2 if subj_pl else p2
                    prompt = f"The {subj} that the {attr} {verb}"
                    pool.append(mc_item(prompt, [" is", " are"], int(subj_pl), key=prompt,
                                    label="plural" if subj_pl else "singular",
                                    fields={"subject": subj, "attractor": attr, "verb": verb}))
    rng.shuffle(pool)
    return pool[:1000]


def gen_ioi(rng: random.Random):
    pool = []
    for _ in range(3000):
        a, b = rng.sample(NAMES, 2)
        place, obj = rng.choice(PLACES), rng.choice(OBJECTS)
        order = rng.choice(["ABBA", "BABA"])
        first = f"{a} and {b}" if order == "ABBA" else f"{b} and {a}"
        prompt = f"When {first} went to the {place}, {b} gave a {obj} to"
        choices, ans = shuffle_choices(rng, " " + a, [" " + b])
        pool.append(mc_item(prompt, choices, ans, key=prompt, label=order,
                        fields={"first": first, "place": place, "giver": b, "obj": obj}))
    return pool


def gen_sequences(rng: random.Random):
    pool = []
    for kind, words in SEQUENCES.items():
        n = len(words)
        for start in range(n):
            for direction in ("forwards", "backwards"):
                step = 1 if direction == "forwards" else -1
                shown = [words[(start + step * i) % n] for i in range(3)]
                if kind in ("numbers", "ordinals"):
                    idx = [start + step * i for i in range(4)]
                    if min(idx) < 0 or max(idx) >= n:
                        continue
                nxt = words[(start + step * 3) % n]
                wrong = rng.sample([w for w in words if w != nxt and w not in shown], 3)
                choices, ans = shuffle_choices(rng, " " + nxt, [" " + w for w in wrong])
                prompt = ", ".join(shown) + ","
                pool.append(mc_item(prompt, choices, ans, key=prompt, label=direction, sequence=kind))
    return pool


def gen_antonyms(rng: random.Random):
    pairs = ANTONYMS[:]
    rng.shuffle(pairs)
    demos, rest = pairs[:4], pairs[4:]
    prefix = "".join(f"{a} -> {b}\n" for a, b in demos)
    pool = []
    for a, b in rest:
        wrong = rng.sample([y for x, y in rest if y not in (b, a)], 3)
        choices, ans = shuffle_choices(rng, " " + b, [" " + w for w in wrong])
        pool.append(mc_item(prefix + f"{a} ->", choices, ans, key=a))
    return pool


def as_exact_match(generator):
    """The same items as a multiple-choice generator, scored by exact match of the correct choice instead
    (harder: the model must produce the answer, not only prefer it among four)."""

    def gen(rng: random.Random):
        return [{"prompt": it["prompt"], "target": it["choices"][it["answer"]], "key": it["key"]}
                for it in generator(rng)]

    return gen


def review(rng, positive: bool) -> str:
    """A one-sentence movie review of the given sentiment."""
    adj = rng.choice(POS_ADJ if positive else NEG_ADJ)
    adj2 = rng.choice(POS_ADJ if positive else NEG_ADJ)
    return f"{rng.choice(SUBJECTS)} was {rng.choice(INTENS)}{adj}, and the rest was {adj2}."


def gen_sentiment(rng: random.Random):
    """Movie-review sentiment, 4-shot; no item repeats a demonstration's review."""
    demo_labels = [True, False, True, False]
    demos = [(review(rng, pos), pos) for pos in demo_labels]
    prefix = "".join(f"Review: {text}\nSentiment: {'positive' if pos else 'negative'}\n\n" for text, pos in demos)
    shown = {text for text, _ in demos}
    pool = []
    for _ in range(3000):
        pos = rng.random() < 0.5
        text = review(rng, pos)
        if text in shown:
            continue
        pool.append(mc_item(prefix + f"Review: {text}\nSentiment:", [" positive", " negative"], 0 if pos else 1,
                        key=text, label="positive" if pos else "negative"))
    return pool


def toy_text(types: list[int], signs: list[int]) -> str:
    """Chapter 3's sequence as characters: type 0-3 as A-D, upper case for sign +1, then the query ``?``.

    Example:
        >>> toy_text([2, 0, 3], [1, -1, -1])
        'Cad?'
    """
    return "".join("ABCD"[t] if s > 0 else "abcd"[t] for t, s in zip(types, signs)) + "?"


def gen_toy(task: str) -> Callable:
    """Chapter 3's data for one task as text (chapter 3a's trained transformer): the signal tokens A, B and C and
    the distractors D shuffled, each token's sign agreeing with the answer with probability (1 + rho) / 2 (its
    type's correlation :data:`cel_utils.defaults.TOY_RHO`), the answer ``+`` or ``-``."""
    rho = TOY_RHO[task]

    def gen(rng: random.Random):
        pool = []
        for _ in range(3000):
            y = 1 if rng.random() < 0.5 else -1
            types = [0, 1, 2] + [3] * TOY_DISTRACTORS
            rng.shuffle(types)
            signs = [y if rng.random() < (1 + rho[t]) / 2 else -y for t in types]
            prompt = toy_text(types, signs)
            pool.append(mc_item(prompt, ["+", "-"], 0 if y > 0 else 1, key=prompt, label="plus" if y > 0 else "minus",
                                fields={"types": types, "signs": signs}))
        return pool

    return gen


@dataclass(frozen=True)
class TaskSpec:
    """A built-in task: its generator, and (for a difficulty variant) the family it belongs to and the knob it
    turns (``family`` is the task's own name for a family's base task)."""

    name: str
    kind: str
    generator: Callable
    description: str
    labels: tuple = ()
    family: str = ""
    knob: str = ""
    template: str = ""   # the sentence template of an agreement variant (its prompt formats re-render it)


BASE_TASKS: dict[str, TaskSpec] = {t.name: t for t in [
    TaskSpec("capitals", "mc", gen_capitals, "country -> capital, 3-shot, 4 choices"),
    TaskSpec("addition", "em", gen_addition, "two-digit addition, 3-shot, exact match of the sum"),
    TaskSpec("subtraction", "em", gen_subtraction, "two-digit subtraction, 3-shot, exact match of the difference"),
    TaskSpec("comparison", "mc", gen_comparison, "which of two two-digit numbers is larger, 3-shot",
             ("first", "second")),
    TaskSpec("agreement", "mc", gen_agreement, "subject-verb agreement across a prepositional attractor",
             ("singular", "plural")),
    TaskSpec("agreement_rc", "mc", gen_agreement_rc, "subject-verb agreement across a relative clause",
             ("singular", "plural")),
    TaskSpec("ioi", "mc", gen_ioi, "indirect object identification (ABBA and BABA templates)", ("ABBA", "BABA")),
    TaskSpec("sequences", "mc", gen_sequences, "continue days/months/numbers/ordinals, forwards or backwards",
             ("forwards", "backwards")),
    TaskSpec("antonyms", "mc", gen_antonyms, "word -> antonym, 4-shot, 4 choices"),
    TaskSpec("sentiment", "mc", gen_sentiment, "movie-review sentiment, 4-shot", ("positive", "negative")),
    TaskSpec("capitals_em", "em", as_exact_match(gen_capitals), "country -> capital, 3-shot, exact match"),
    TaskSpec("antonyms_em", "em", as_exact_match(gen_antonyms), "word -> antonym, 4-shot, exact match"),
    TaskSpec("toy_a", "mc", gen_toy("toy_a"), "chapter 3's task A as tokens (signal A, conflicting feature C)",
             ("plus", "minus")),
    TaskSpec("toy_b", "mc", gen_toy("toy_b"), "chapter 3's task B as tokens (signal B, conflicting feature C)",
             ("plus", "minus")),
]}
METRICS = {"mc": "accuracy: the answer choice has the highest summed log-prob",
           "em": "exact match: every target token is top-1 under teacher forcing, and the answer stops there"}
