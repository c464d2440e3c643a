"""What a conversation's earlier turns say.

The context matcher (context.py) compares two conversations' earlier turns sentence by sentence;
this module reads them: each sentence's content words and its details (numbers, as written and
with every quantity in one unit, and names), and which details one side states that the other
does not. Pure functions of the text and shipped word lists, memoised by text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from gpucache.conversation.value import Turn
from gpucache.guard.differences import capitalised, segments
from gpucache.guard.parsing import FRAMING_READ, parse
from gpucache.guard.quantities import canonical
from gpucache.guard.request import request_text

# Content words too common to tell two statements apart
GENERIC = frozenset(
    """help question need want know thing way get make time day work good fine sure yes yeah
    okay ok thank thanks please great right also much many lot bit look find try all off one""".split()
)

MAX_TURN_CHARS = 2000  # a longer turn is not read but compared exactly (context._split)

WORD = re.compile(r"[a-z']+")
# Months and days as people shorten them ("Jan 1" / "January 1st", "tues" / "Tuesday"): one name
CALENDAR = {
    short: name
    for name, shorts in (
        ("january", "jan"),
        ("february", "feb"),
        ("march", "mar"),
        ("april", "apr"),
        ("june", "jun"),
        ("july", "jul"),
        ("august", "aug"),
        ("september", "sep sept"),
        ("october", "oct"),
        ("november", "nov"),
        ("december", "dec"),
        ("monday", "mon"),
        ("tuesday", "tue tues"),
        ("wednesday", "weds"),
        ("thursday", "thu thur thurs"),
        ("friday", "fri"),
    )  # not "sat", "sun" or "wed": words of their own
    for short in shorts.split()
}


@dataclass(frozen=True)
class Sentence:
    """One turn as the matcher compares it."""

    index: int  # the turn's place in the conversation
    part: int  # the sentence's place in the turn
    role: str
    text: str  # one sentence of the turn
    content: frozenset[str]  # content words, less framing and generic words
    details: frozenset[str]  # numbers, names, named kinds
    amounts: frozenset[str]  # its numbers, each quantity in one unit (``read_text``)
    converted: frozenset[str]  # the amounts its own digits make ("30 minutes": 1800, not "a day")


@lru_cache(maxsize=8192)
def read_text(text: str) -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    """(content words, details, amounts, converted) of one turn's text; memoised, turns repeat
    across lookups.

    The details are its numbers and the names written with a capital: what a context states that
    an answer turns on. (The guard's other named kinds, an audience or a tone, describe a request,
    and the turns are compared as requests where they are asked: ``ContextMatcher._counterpart``.)
    An ordinal ("first", "the 2nd") is no detail: it places something said, which the order check
    compares. The amounts are its numbers with every quantity in one unit and every time on one
    clock ("half an hour" / "30 minutes", "noon" / "12pm"): what it states, for the other side to
    find a number in (``differing``). The converted amounts are those its own digits make ("30
    minutes a day": 1800, not the 86400 of "a day" alone): a sentence whose numbers the other side
    states only in another unit still states them where all of these are stated; numbers written
    in words are compared as written."""
    asked = request_text(text)
    parsed = parse(asked)
    read = tuple(CALENDAR.get(w, w) for w in parsed.content)
    content = frozenset(read) - FRAMING_READ - GENERIC
    names = capitalised(text) | {CALENDAR[w] for w in capitalised(text) if w in CALENDAR}
    details = {f"#{n}" for n in parsed.numbers if not n.startswith("#")}
    details.update(f"name:{word}" for word in read if word in names)
    amounts = _amounts(asked)
    return content, frozenset(details), amounts, amounts - _amounts(_DIGITS.sub(" ", asked))


_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")


def _amounts(text: str) -> frozenset[str]:
    return frozenset(f"#{n}" for n in parse(canonical(text)).numbers if not n.startswith("#"))


def sentences(index: int, turn: Turn) -> list[Sentence]:
    """One turn as the sentences it states, each read on its own: a statement changed in one
    sentence ("the modem is rented from you" / "I bought my own modem") is a sentence the other
    side does not state, however many of the turn's other words it shares."""
    return [
        Sentence(index, part, turn.role, text, *read_text(text))
        for part, text in enumerate(segments(turn.text))
    ]


def differing(needed: list[Sentence], others: list[Sentence]) -> list[str]:
    """The details the sentences of one side state that the other side's conversation does not
    state anywhere: a number compared as a number (a sentence's numbers are stated
    where they are, or where its amounts in one unit are: "30 minutes" / "half an hour"), a
    name as a word (so a name one side writes in lowercase is still the same name)."""
    stated = frozenset().union(*(t.details | t.amounts for t in others))
    words = frozenset().union(*(t.content for t in others))
    missing = set()
    for t in needed:
        numbers = {d for d in t.details if d.startswith("#")}
        if not numbers <= stated and not (t.converted and t.converted <= stated):
            missing.update(numbers - stated)
        for detail in t.details - numbers - stated:
            if detail.split(":", 1)[1] not in words:
                missing.add(detail)
    return sorted(missing)
