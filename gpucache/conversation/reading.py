"""What a conversation's earlier turns say, and which of them a final request depends on.

The context matcher (context.py) compares two conversations' earlier turns sentence by sentence;
this module reads them: each sentence's content words and its details (numbers, as written and
with every quantity in one unit, and names), whether a final request points back to what was
said, and which exchanges it may depend on, an aside the user marks and the exchanges tied only
to it set apart. Pure functions of the text and shipped word lists, memoised by text.
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

# Words by which a final request points back to an earlier turn: pronouns and demonstratives,
# ordinals and comparatives that pick among options offered, and the words of a follow-up
# ("instead", "also", "what about"). A request holding one depends on the latest exchange.
BACK_REFERENCES = frozenset(
    """it its it's itself that this these those they them their theirs he him his she her there
    one ones same such instead also too again other another else first second third fourth last
    former latter previous earlier above mentioned option options either both cheaper cheapest
    bigger smaller better worse more less longer shorter then""".split()
)

# What opens an aside: a question the user marks as off the conversation's topic
ASIDE = re.compile(
    r"\b(?:unrelated|random q(?:uestion)?|off[- ]topic|btw|by the way|side question|"
    r"different question|changing the subject|on another note|totally different)\b",
    re.IGNORECASE,
)
# Nouns that stand for something said before ("is the answer 7/8?", "will the error come back?")
DISCOURSE_NOUNS = frozenset("answer result results solution problem issue error".split())
# The user's own situation, described earlier ("what would my monthly payment be?", "do I need an
# x-ray?"), except the "I" of a how-to that asks the general way ("how do I reverse a string?";
# "how do I set up my phone?" is about the user's own)
FIRST_PERSON = frozenset("i i'm i've i'd me my mine myself we we're our ours us".split())
HOW_TO = re.compile(r"^\s*how\s+(?:do|can|should|would|could)\s+i\b", re.IGNORECASE)
# Openings of a follow-up that names only what changes ("what about Tuesday?", "and for two?")
FOLLOW_UP = re.compile(r"^\s*(?:and|but|so|or|what about|how about|ok(?:ay)?|then)\b", re.IGNORECASE)
# Content words too common to tie two turns to one topic
GENERIC = frozenset(
    """help question need want know thing way get make time day work good fine sure yes yeah
    okay ok thank thanks please great right also much many lot bit look find try all off one""".split()
)

MAX_TURN_CHARS = 2000  # a turn is read for its first this many characters (bounds the cost)

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
    text: str  # one sentence of the turn, as read (within its first MAX_TURN_CHARS)
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
        for part, text in enumerate(segments(turn.text[:MAX_TURN_CHARS]))
    ]


def points_back(request: str) -> bool:
    """Whether a final request refers to something said earlier ("how much is it?", "what
    about the second one?", "and for Tuesday?", "is the answer 7/8?"), asks about the user's
    own situation ("do I need an x-ray?"), or says too little to stand alone."""
    words = WORD.findall(request.casefold())
    if FOLLOW_UP.match(request) or any(w in BACK_REFERENCES or w in DISCOURSE_NOUNS for w in words):
        return True
    general = HOW_TO.match(request)  # "how do I reverse a string?": that "I" is anyone's
    if any(w in FIRST_PERSON for w in WORD.findall(request[general.end() if general else 0 :].casefold())):
        return True  # "how should I split my study time?", "the approach I chose": the user's own
    content = read_text(request[:MAX_TURN_CHARS])[0]
    return len(content) <= 1


def depended_on(request: str, turns: list[Sentence]) -> list[Sentence]:
    """The turns of one side that ``request`` depends on (chatter already set aside): the latest
    exchange where it points back, then every turn sharing a content word with the request or a
    turn found, until none joins."""
    found: set[int] = set()  # positions in ``turns``
    pool = set(read_text(request[:MAX_TURN_CHARS])[0])
    if turns and points_back(request):
        last_user = max((t.index for t in turns if t.role == "user"), default=turns[0].index)
        for k, t in enumerate(turns):
            if t.index >= last_user:
                found.add(k)
                pool |= t.content
    grew = True
    while grew:
        grew = False
        for k, t in enumerate(turns):
            if k not in found and t.content & pool:
                found.add(k)
                pool |= t.content
                grew = True
    return [t for k, t in enumerate(turns) if k in found]


def needed_turns(request: str, turns: list[Sentence]) -> list[Sentence]:
    """The turns of one side the request may depend on (chatter already set aside).

    A request that points back depends on the latest exchange and on every turn that shares a
    content word with it or with the request, transitively (``depended_on``). Beyond those,
    every exchange (a user turn and the answer after it) counts unless it is an island: one
    that shares no content word or detail with the request nor with any other exchange is about
    something else ("do you take Visa?" in a conversation about a delivery), and nothing refers
    to it. A request that points nowhere and names nothing of its context stands alone."""
    grouped: dict[int, list[Sentence]] = {}
    for t in turns:  # a user turn and the answer after it
        grouped.setdefault(t.index - (t.role == "assistant"), []).append(t)
    exchanges = [grouped[k] for k in sorted(grouped)]
    words = [frozenset().union(*(t.content | t.details for t in e)) for e in exchanges]
    asked = read_text(request[:MAX_TURN_CHARS])
    asked_words = asked[0] | asked[1]
    if not points_back(request) and not any(w & asked_words for w in words):
        return []
    kept = {(t.index, t.text): t for t in depended_on(request, turns)}
    apart = asides(exchanges)
    last = len(exchanges) - 1
    if last in apart and points_back(request):
        # the latest exchange may be what the request is about ("random q, do gift cards
        # expire?" ... "and do they have fees?"): it stays an aside only where the request's
        # own words are about another exchange and none of them about it
        elsewhere = any(words[j] & asked[0] for j in range(last))
        if not elsewhere or words[last] & asked[0]:
            apart.discard(last)
    latest = last if points_back(request) else -1  # what "it" may mean: never set aside
    for i, exchange in enumerate(exchanges):
        # an exchange is tied to the rest by a word it shares with the request or with another
        # exchange that is no aside: one tied only to an aside continues the aside ("random q,
        # how tall is Everest?" ... "and the deepest point in the ocean?")
        others = asked_words.union(*(w for j, w in enumerate(words) if j != i and j not in apart))
        if i in apart or (i != latest and not words[i] & others):
            for t in exchange:
                kept.pop((t.index, t.text), None)
        else:
            kept.update(((t.index, t.text), t) for t in exchange)
    return [t for t in turns if (t.index, t.text) in kept]


def asides(exchanges: list[list[Sentence]]) -> set[int]:
    """The exchanges a user opened as an aside ("random q, do gift cards expire?", "unrelated,
    but...", "btw"). Only those: an exchange after one may as well be back on the topic."""
    return {
        i
        for i, exchange in enumerate(exchanges)
        if ASIDE.search(" ".join(t.text for t in exchange if t.role == "user"))
    }


def differing(needed: list[Sentence], others: list[Sentence]) -> list[str]:
    """The details the turns a request depends on state that the other side's conversation
    does not state anywhere: a number compared as a number (a sentence's numbers are stated
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
