"""Pairs made from one prompt by an edit: rewordings a user types (typos, greetings and thanks,
case and punctuation) and near-misses a one-word change makes (a number, a negation, a prefix or
an opposite, an added qualifier, a direction).

Why: the public pairs the model learns from (pairs.py) hold few of the small edits that flip a
request's meaning, and the cache meets them every day. Every edit is a pure function of the
prompt and a seeded ``random.Random``, so a training run makes the same pairs on every machine.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

# A word and the word that asks the opposite. Read both ways.
OPPOSITES = {
    "increase": "decrease",
    "add": "remove",
    "deposit": "withdraw",
    "buy": "sell",
    "open": "close",
    "before": "after",
    "more": "less",
    "maximum": "minimum",
    "best": "worst",
    "enable": "disable",
    "upload": "download",
    "import": "export",
    "start": "stop",
    "cheap": "expensive",
    "hot": "cold",
    "send": "receive",
    "credit": "debit",
    "early": "late",
    "first": "last",
    "higher": "lower",
    "accept": "decline",
    "win": "lose",
    "arrive": "depart",
    "raise": "lower",
    "gain": "lose",
    "allowed": "banned",
    "pros": "cons",
    "fast": "slow",
    "long": "short",
    "heavy": "light",
    "old": "new",
    "join": "leave",
    "lend": "borrow",
    "include": "exclude",
    "inside": "outside",
    "above": "below",
    "positive": "negative",
    "upgrade": "downgrade",
    "approve": "reject",
    "overpaid": "underpaid",
    "strong": "weak",
}
# A word and its negating prefix form.
PREFIXED = {
    "able": "unable",
    "possible": "impossible",
    "legal": "illegal",
    "install": "uninstall",
    "lock": "unlock",
    "block": "unblock",
    "activate": "deactivate",
    "available": "unavailable",
    "correct": "incorrect",
    "employed": "self-employed",
    "valid": "invalid",
    "known": "unknown",
    "paid": "unpaid",
    "verified": "unverified",
    "freeze": "unfreeze",
    "subscribe": "unsubscribe",
    "authorized": "unauthorized",
    "safe": "unsafe",
    "regular": "irregular",
    "complete": "incomplete",
    "expected": "unexpected",
    "official": "unofficial",
    "typical": "atypical",
    "link": "unlink",
    "secured": "unsecured",
    "taxable": "non-taxable",
    "resident": "non-resident",
    "refundable": "non-refundable",
    "fiction": "non-fiction",
    "alcoholic": "non-alcoholic",
}
# An auxiliary and its negated form: "why isn't my transfer pending" reads in a question and a statement alike
AUXILIARIES = {
    "is": "isn't",
    "are": "aren't",
    "can": "can't",
    "should": "shouldn't",
    "does": "doesn't",
    "do": "don't",
    "will": "won't",
    "was": "wasn't",
    "did": "didn't",
    "could": "couldn't",
    "would": "wouldn't",
}
QUALIFIERS = (
    " for a child",
    " for beginners",
    " in spanish",
    " on android",
    " on an iphone",
    " in python",
    " without a card",
    " for a business account",
    " abroad",
    " this weekend",
    " in under 5 minutes",
    " as a table",
    " in one sentence",
    " step by step in detail",
    " for my boss",
    " in german",
    " for a small company",
    " on windows",
    " on a mac",
    " without internet",
    " for free",
    " for someone over 65",
    " for students",
    " in a formal tone",
    " as a joke",
    " in the uk",
    " in canada",
    " next year",
    " last month",
    " for two people",
    " with bad credit",
)
OPENINGS = (
    "hey, ",
    "hi there! ",
    "quick question: ",
    "hello, ",
    "please ",
    "hi, i was wondering ",
    "sorry to bother you, ",
    "ok so ",
    "hey there, quick one: ",
    "good morning! ",
)
CLOSINGS = (" thanks", " thx!", " please", " thank you!", " cheers", " ty", "??", " thanks in advance", "")
WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def _swap_word(prompt: str, table: dict[str, str]) -> str | None:
    """The prompt with the first word found in ``table`` (either way round) replaced."""
    both = {**table, **{v: k for k, v in table.items()}}
    for match in WORD.finditer(prompt):
        word = match.group(0)
        other = both.get(word.lower())
        if other is not None:
            return prompt[: match.start()] + other + prompt[match.end() :]
    return None


def opposite(prompt: str, rng: random.Random) -> str | None:
    return _swap_word(prompt, OPPOSITES)


def prefixed(prompt: str, rng: random.Random) -> str | None:
    return _swap_word(prompt, PREFIXED)


def negated(prompt: str, rng: random.Random) -> str | None:
    """The first auxiliary negated ("is" / "isn't"), or a negation the prompt has taken away."""
    if re.search(r"\bnot\b", prompt):
        return re.sub(r"\s*\bnot\b", "", prompt, count=1)
    if re.search(r"n't\b", prompt):
        return re.sub(r"n't\b", "", prompt, count=1).replace("ca ", "can ").replace("wo ", "will ")
    for match in WORD.finditer(prompt):
        negative = AUXILIARIES.get(match.group(0).lower())
        if negative is not None:
            return prompt[: match.start()] + negative + prompt[match.end() :]
    return None


def renumbered(prompt: str, rng: random.Random) -> str | None:
    """One number in the prompt changed to another."""
    found = list(re.finditer(r"\d+", prompt))
    if not found:
        return None
    match = found[rng.randrange(len(found))]
    value = int(match.group(0)[:6])
    other = value + rng.choice((1, 2, 5, 10)) if rng.random() < 0.5 or value < 3 else max(0, value // 2)
    return prompt[: match.start()] + str(other) + prompt[match.end() :]


def qualified(prompt: str, rng: random.Random) -> str | None:
    """A qualifier that changes what the answer must be, added at the end."""
    body = prompt.rstrip(" ?.!")
    end = prompt[len(body) :]
    return body + rng.choice(QUALIFIERS) + end


def redirected(prompt: str, rng: random.Random) -> str | None:
    """ "from X to Y" read as "from Y to X"."""
    match = re.search(r"\bfrom (\w+(?: \w+)?) to (\w+(?: \w+)?)", prompt)
    if not match:
        return None
    return prompt[: match.start()] + f"from {match.group(2)} to {match.group(1)}" + prompt[match.end() :]


def misspelled(prompt: str, rng: random.Random) -> str | None:
    """One or two words of five letters or more with a letter dropped, doubled or swapped."""
    words = [m for m in WORD.finditer(prompt) if len(m.group(0)) >= 5]
    if not words:
        return None
    out = prompt
    for match in sorted(rng.sample(words, min(len(words), rng.choice((1, 2)))), key=lambda m: -m.start()):
        w = match.group(0)
        i = rng.randrange(1, len(w) - 1)
        edit = rng.randrange(3)
        typo = (
            w[:i] + w[i + 1 :]
            if edit == 0
            else w[:i] + w[i] + w[i:]
            if edit == 1
            else w[: i - 1] + w[i] + w[i - 1] + w[i + 1 :]
        )
        out = out[: match.start()] + typo + out[match.end() :]
    return out


def wrapped(prompt: str, rng: random.Random) -> str | None:
    """The prompt with a greeting before it and thanks after it, as people type them."""
    body = prompt[0].lower() + prompt[1:] if prompt else prompt
    return rng.choice(OPENINGS) + body + rng.choice(CLOSINGS)


def retyped(prompt: str, rng: random.Random) -> str | None:
    """Case and punctuation as another user types them."""
    if rng.random() < 0.5:
        return re.sub(r"[?.!,]", "", prompt).lower()
    body = prompt.strip().rstrip("?.!")
    return body[:1].upper() + body[1:] + "?"


# Each edit and the label of the pair it makes: 1 the same request, 0 another one
EDITS: tuple[tuple[Callable[[str, random.Random], str | None], int], ...] = (
    (misspelled, 1),
    (wrapped, 1),
    (retyped, 1),
    (opposite, 0),
    (prefixed, 0),
    (negated, 0),
    (renumbered, 0),
    (qualified, 0),
    (redirected, 0),
)


def edited(prompt: str, rng: random.Random) -> list[tuple[str, str, int]]:
    """One rewording and one near-miss of ``prompt`` (where an edit applies), each a pair
    ``(prompt, edited, label)``; the edits are tried in a seeded order."""
    out = []
    for label in (1, 0):
        kinds = [edit for edit, lab in EDITS if lab == label]
        rng.shuffle(kinds)
        for edit in kinds:
            made = edit(prompt, rng)
            if made and made.strip() and made != prompt:
                out.append((prompt, made, label))
                break
    return out
