"""ContextMatcher: may a conversation's stored answer be served after another conversation?

The guard has already judged the two final requests the same. What is left is the context:
the earlier turns. Comparing them whole would refuse nearly every conversation (a greeting, a
turn reworded, a question about something else asked first); ignoring them would serve the
answer to "how much is it?" about one product after a conversation about another. So:

1. **Read each turn sentence by sentence**: each sentence's content words (the guard's reading:
   framing dropped, stems, the interchangeable table, misspellings mended) and its *details*
   (numbers, names written with a capital). A sentence with neither is chatter, set aside.
2. **A request that stands alone** (it points back to nothing: no "it", "that", "the second
   one", "my ...", "the answer", no follow-up opening) needs only the same standing
   instructions on both sides ("from now on answer in French").
3. **Find what the request depends on, on each side** (``needed_turns``): the latest exchange
   and every sentence sharing a word with the request or with one found, and every other
   exchange except an island (sharing no word with the request or the rest) and an exchange
   the user marks as an aside ("random q", "unrelated", "btw").
4. **Compare strictly**: the numbers and names stated in what the request depends on must be
   stated on the other side; every sentence needs a close counterpart (a third of its words
   shared) that the guard and the edit check judge the same (a sentence edited in a word,
   "a tension headache" / "a migraine", states something else), in the same order where the
   order can decide what "it" or "the second one" means; a sentence one side has and the other
   does not refuses when the request depends on it, unless it is a reaction said in passing.

When unsure it refuses: a turn with no counterpart is a difference. Everything is a pure
function of the two conversations and shipped word lists (no floating point, no ``hash()``),
so every process and machine gives the same verdict, and ``explain`` names the turn and the
difference that refused a candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from gpucache.conversation.value import Conversation, Turn
from gpucache.guard.differences import align, capitalised, segments
from gpucache.guard.lexical import LexicalNearMissVerifier
from gpucache.guard.parsing import FRAMING_READ, parse
from gpucache.guard.request import request_text
from gpucache.guard.verifier import ExplainingVerifier, Verdict

# Words by which a final request points back to an earlier turn: pronouns and demonstratives,
# ordinals and comparatives that pick among options offered, and the words of a follow-up
# ("instead", "also", "what about"). A request holding one depends on the latest exchange.
BACK_REFERENCES = frozenset(
    """it its it's itself that this these those they them their theirs he him his she her there
    one ones same such instead also too again other another else first second third fourth last
    former latter previous earlier above mentioned option options either both cheaper cheapest
    bigger smaller better worse more less longer shorter then""".split()
)
# A turn that keeps this many content words of the other, and at least EDIT_RATIO times as many
# as it changes, is an edit of it (context.ContextMatcher._same)
EDIT_SHARED_MIN, EDIT_RATIO = 3, 1
# Words of a reaction said in passing, and words and phrases of a change of mind (``aside``)
REACTIONS = frozenset(
    """lol haha hahaha ha hehe lmao omg wow ugh yay yikes oops oh ah ahh hmm cool
    awesome nice great thanks thank thx appreciate sorry excited exciting nervous glad happy phew
    gosh sweet lovely fun love hi hello hey morning afternoon evening welcome anytime rush
    worries""".split()
)
CHANGES = frozenset("actually instead rather meant change changed switch cancel scratch wait".split())
CHANGE_PHRASES = re.compile(
    r"\b(?:never ?mind|on second thought|make (?:it|that)|not anymore)\b", re.IGNORECASE
)
# A user's instruction for every later answer: its manner, language, length, audience or role
INSTRUCTION = re.compile(
    r"\b(?:from now on|going forward|for (?:the rest|all) of|(?:always|only|never) (?:answer|reply|respond|"
    r"use|give|write|say)|(?:answer|reply|respond|write|talk|speak|explain)\w* (?:in|as|like|with|to|"
    r"using|only|briefly|simply)|like i'?m \w+|keep (?:it|your|answers|replies|responses)|"
    r"pretend|act as|you are (?:a|an|my)|in (?:bullet|one|two|three|a) \w+|no more than|"
    r"under \d+ words|in (?:french|spanish|german|italian|portuguese|chinese|japanese|korean|hindi|"
    r"arabic|russian|dutch|english))\b",
    re.IGNORECASE,
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
# x-ray?"), except in a how-to that asks the general way ("how do I reverse a string?")
FIRST_PERSON = frozenset("i i'm i've i'd me my mine myself we we're our ours us".split())
HOW_TO = re.compile(r"^\s*how\s+(?:do|can|should|would|could)\s+i\b", re.IGNORECASE)
# Openings of a follow-up that names only what changes ("what about Tuesday?", "and for two?")
FOLLOW_UP = re.compile(r"^\s*(?:and|but|so|or|what about|how about|ok(?:ay)?|then)\b", re.IGNORECASE)
# Content words too common to tie two turns to one topic
GENERIC = frozenset(
    """help question need want know thing way get make time day work good fine sure yes yeah
    okay ok thank thanks please great right also much many lot bit look find try""".split()
)
# The guard's rules not run on a turn against its counterpart: a word one side adds to a
# statement of the same facts ("which plans include roaming" / "which plans have roaming") is
# how people restate context; the details that matter are compared by the detail check.
TURN_RULES_SKIPPED: tuple[str, ...] = ("added",)
MAX_TURN_CHARS = 2000  # a turn is read for its first this many characters (bounds the cost)
# Longer conversations are served for their exact repeat only: the matcher's cost grows with
# the turns, and a dependency in a turn it did not read would be a wrong answer.
MAX_CONTEXT_TURNS = 128
_WORD = re.compile(r"[a-z']+")


@dataclass(frozen=True)
class _Read:
    """One turn as the matcher compares it."""

    index: int  # the turn's place in the conversation
    part: int  # the sentence's place in the turn
    role: str
    text: str  # one sentence of the turn, as read (within its first MAX_TURN_CHARS)
    content: frozenset[str]  # content words, less framing and generic words
    details: frozenset[str]  # numbers, names, named kinds


@lru_cache(maxsize=8192)
def _read_text(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(content words, details) of one turn's text; memoised, turns repeat across lookups.
    The details are its numbers and the names written with a capital: what a context states
    that an answer turns on. (The guard's other named kinds, an audience or a tone, describe a
    request, and the turns are compared as requests where they are asked: ``_counterpart``.)"""
    asked = request_text(text)
    parsed = parse(asked)
    content = frozenset(parsed.content) - FRAMING_READ - GENERIC
    names = capitalised(text)
    details = {f"#{n.lstrip('#')}" for n in parsed.numbers}  # "the 1st" states the number 1
    details.update(f"name:{word}" for word in parsed.content if word in names)
    return content, frozenset(details)


def _read(index: int, turn: Turn) -> list[_Read]:
    """One turn as the sentences it states, each read on its own: a statement changed in one
    sentence ("the modem is rented from you" / "I bought my own modem") is a sentence the other
    side does not state, however many of the turn's other words it shares."""
    return [
        _Read(index, part, turn.role, text, *_read_text(text))
        for part, text in enumerate(segments(turn.text[:MAX_TURN_CHARS]))
    ]


def points_back(request: str) -> bool:
    """Whether a final request refers to something said earlier ("how much is it?", "what
    about the second one?", "and for Tuesday?", "is the answer 7/8?"), asks about the user's
    own situation ("do I need an x-ray?"), or says too little to stand alone."""
    words = _WORD.findall(request.casefold())
    if FOLLOW_UP.match(request) or any(w in BACK_REFERENCES or w in DISCOURSE_NOUNS for w in words):
        return True
    if not HOW_TO.match(request) and any(w in FIRST_PERSON for w in words):
        return True
    content, _ = _read_text(request[:MAX_TURN_CHARS])
    return len(content) <= 1


def depended_on(request: str, turns: list[_Read]) -> list[_Read]:
    """The turns of one side that ``request`` depends on (chatter already set aside): the latest
    exchange where it points back, then every turn sharing a content word with the request or a
    turn found, until none joins."""
    found: set[int] = set()  # positions in ``turns``
    pool = set(_read_text(request[:MAX_TURN_CHARS])[0])
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


def needed_turns(request: str, turns: list[_Read]) -> list[_Read]:
    """The turns of one side the request may depend on (chatter already set aside).

    A request that points back depends on the latest exchange and on every turn that shares a
    content word with it or with the request, transitively (``depended_on``). Beyond those,
    every exchange (a user turn and the answer after it) counts unless it is an island: one
    that shares no content word or detail with the request nor with any other exchange is about
    something else ("do you take Visa?" in a conversation about a delivery), and nothing refers
    to it. A request that points nowhere and names nothing of its context stands alone."""
    grouped: dict[int, list[_Read]] = {}
    for t in turns:  # a user turn and the answer after it
        grouped.setdefault(t.index - (t.role == "assistant"), []).append(t)
    exchanges = [grouped[k] for k in sorted(grouped)]
    words = [frozenset().union(*(t.content | t.details for t in e)) for e in exchanges]
    asked = _read_text(request[:MAX_TURN_CHARS])
    asked_words = asked[0] | asked[1]
    if not points_back(request) and not any(w & asked_words for w in words):
        return []
    kept = {(t.index, t.text): t for t in depended_on(request, turns)}
    apart = _asides(exchanges)
    last = len(exchanges) - 1
    if last in apart and points_back(request):
        # the latest exchange may be what the request is about ("random q, do gift cards
        # expire?" ... "and do they have fees?"): it stays an aside only where the request's
        # own words are about another exchange and none of them about it
        elsewhere = any(words[j] & asked[0] for j in range(last))
        if not elsewhere or words[last] & asked[0]:
            apart.discard(last)
    for i, exchange in enumerate(exchanges):
        if i in apart:
            for t in exchange:
                kept.pop((t.index, t.text), None)
            continue
        others = asked_words.union(*(w for j, w in enumerate(words) if j != i))
        if words[i] & others:
            kept.update(((t.index, t.text), t) for t in exchange)
    return [t for t in turns if (t.index, t.text) in kept]


def _asides(exchanges: list[list[_Read]]) -> set[int]:
    """The exchanges a user opened as an aside ("random q, do gift cards expire?", "unrelated,
    but...", "btw"). Only those: an exchange after one may as well be back on the topic."""
    return {
        i
        for i, exchange in enumerate(exchanges)
        if ASIDE.search(" ".join(t.text for t in exchange if t.role == "user"))
    }


def _differing(needed: list[_Read], others: list[_Read]) -> list[str]:
    """The details the turns a request depends on state that the other side's conversation
    does not state anywhere: a number compared as a number, a name as a word (so a name one
    side writes in lowercase is still the same name)."""
    stated = frozenset().union(*(t.details for t in others))
    words = frozenset().union(*(t.content for t in others))
    missing = set()
    for detail in frozenset().union(*(t.details for t in needed)) - stated:
        if detail.startswith("#") or detail.split(":", 1)[1] not in words:
            missing.add(detail)
    return sorted(missing)


class ContextMatcher:
    """Judges two conversations whose final requests the guard found the same (module doc).

    ``guard`` judges a user turn against its counterpart (default: the lexical guard without
    the rules listed in ``TURN_RULES_SKIPPED``)."""

    name = "context"

    def __init__(self, guard: ExplainingVerifier | None = None) -> None:
        self.guard: ExplainingVerifier = (
            guard if guard is not None else LexicalNearMissVerifier(skip=TURN_RULES_SKIPPED)
        )

    def explain(self, cached: Conversation, new: Conversation) -> Verdict:
        """Accept where the contexts agree on everything the final requests depend on; else
        reject, naming the side, the turn (counted from 1) and the difference."""
        if cached.context == new.context:
            return Verdict(False, "context-same")
        longest = max(len(cached.context), len(new.context))
        if longest > MAX_CONTEXT_TURNS:
            return Verdict(
                True,
                "context-too-long",
                f"{longest} earlier turns: more than {MAX_CONTEXT_TURNS} are matched exactly only",
            )
        sides = []
        for conversation in (cached, new):
            turns = [unit for i, t in enumerate(conversation.context) for unit in _read(i, t)]
            spoken = [t for t in turns if t.content or t.details]  # chatter set aside
            sides.append((spoken, needed_turns(conversation.request, spoken)))
        (spoken_a, needed_a), (spoken_b, needed_b) = sides
        strict = points_back(cached.request) or points_back(new.request)
        if not strict:  # the request stands alone: only an instruction for every answer counts
            return self._instructions(spoken_a, spoken_b)
        differing = _differing(needed_a, spoken_b) + _differing(needed_b, spoken_a)
        if differing:
            return Verdict(
                True,
                "context-detail",
                f"the turns the request depends on differ in {', '.join(differing)}",
                tuple(differing),
            )
        for side, spoken, needed, others in (
            ("cached", spoken_a, needed_a, spoken_b),
            ("new", spoken_b, needed_b, spoken_a),
        ):
            found: list[tuple[int, int]] = []
            for turn in spoken:
                after = found[-1] if found else (-1, -1)
                match = self._counterpart(turn, [t for t in others if t.role == turn.role], strict, after)
                if isinstance(match, tuple):
                    found.append(match)
                elif match.rule != "context-unmatched" or (turn in needed and not aside(turn)):
                    # a statement changed, or one the request may depend on stated on one side only
                    return Verdict(
                        True, match.rule, f"{side} turn {turn.index + 1}: {match.detail}", match.words
                    )
            if found != sorted(found):  # "it", "the second one": the order decides what they mean
                return Verdict(True, "context-order", f"the {side} side's sentences come in another order")
        return Verdict(False, "context-agrees")

    def _instructions(self, a: list[_Read], b: list[_Read]) -> Verdict:
        """For a request that stands alone: accept unless a user sentence that instructs every
        later answer ("from now on answer in French", "explain like I'm five") is said on one
        side only, or differently."""
        for side, mine, others in (("cached", a, b), ("new", b, a)):
            theirs = [t for t in others if t.role == "user"]
            for turn in mine:
                if turn.role == "user" and INSTRUCTION.search(turn.text):
                    match = self._counterpart(turn, theirs, True)
                    if isinstance(match, Verdict):
                        return Verdict(
                            True,
                            "context-instruction",
                            f"{side} turn {turn.index + 1}: {match.detail}",
                            match.words,
                        )
        return Verdict(False, "context-apart")

    def _counterpart(
        self, turn: _Read, others: list[_Read], strict: bool, after: tuple[int, int] = (-1, -1)
    ) -> tuple[int, int] | Verdict:
        """The position of the sentence of ``others`` that says the same as ``turn`` (``_same``),
        the first at or after ``after`` among those sharing the most words (a sentence said
        twice, "Thanks!", is matched in order); else why there is none: no sentence shares
        enough of its words to be its counterpart, or the closest one differs."""
        same = [o for o in others if o.text == turn.text]  # the common case, without the guard
        if same:
            o = min(same, key=lambda o: ((o.index, o.part) < after, o.index, o.part))
            return o.index, o.part
        ranked = sorted(
            others, key=lambda o: (-len(turn.content & o.content), (o.index, o.part) < after, o.index, o.part)
        )
        close = [o for o in ranked if _close(turn, o)]
        if not close:
            return Verdict(True, "context-unmatched", f'"{turn.text[:80]}" has no counterpart')
        first: Verdict | None = None
        for other in close:
            verdict = self._same(other, turn, strict)
            if verdict is None:
                return other.index, other.part
            first = first or verdict
        assert first is not None
        return Verdict(
            True, first.rule, f'"{turn.text[:80]}" / "{close[0].text[:80]}": {first.detail}', first.words
        )

    def _same(self, a: _Read, b: _Read, strict: bool) -> Verdict | None:
        """None where two turns say the same; else the difference. The guard judges them as two
        requests; and where one is an edit of the other (most of its words shared), any word
        substituted or added is a difference: a statement of context changed in one word ("a
        tension headache" / "a migraine", "rename it" / "rename it, no wait, delete it") states
        something else, where a question changed in one word may not ask anything else.
        ``strict``: the words must also come in the same order (the request points at the
        first or second of something)."""
        verdict = self.guard.explain(a.text, b.text)
        if verdict.rejected:
            return Verdict(True, f"context-{verdict.rule}", str(verdict), verdict.words)
        edit = align(parse(request_text(a.text)), parse(request_text(b.text)))
        changed = len(edit.only_a) + len(edit.only_b)
        # a word substituted, or more than one added (one verb more restates: "which plans
        # include roaming" / "which plans have roaming")
        altered = (edit.only_a and edit.only_b) or changed > 1
        kept = max(edit.shared, edit.framed)
        if altered and kept >= EDIT_SHARED_MIN and kept >= EDIT_RATIO * changed:
            words = edit.only_a + edit.only_b
            return Verdict(
                True, "context-edited", f"one turn is the other edited: {' / '.join(words)}", words
            )
        # the same words in another order: "my husband has a cold and my daughter pink eye" /
        # "my daughter has pink eye and my husband a cold" (a rewording moves words and changes
        # some: the guard has judged it)
        if strict and a.content == b.content and _order(a, a.content) != _order(b, b.content):
            return Verdict(True, "context-order", "the same words in another order")
        return None


def aside(turn: _Read) -> bool:
    """Whether a sentence only one side has is said in passing: a reaction ("haha sorry, my
    hands are full", "thank you, that's kind of you") that states no number or name and changes
    nothing ("actually", "instead", "I meant")."""
    words = set(_WORD.findall(turn.text.casefold()))
    return (
        not turn.details
        and bool(words & REACTIONS)
        and not words & CHANGES
        and not CHANGE_PHRASES.search(turn.text)
    )


def _close(a: _Read, b: _Read) -> bool:
    """Whether ``b`` shares enough of ``a``'s words to be its counterpart: a third of the
    shorter turn's content words (the guard judges pairs a similarity threshold has let
    through, and two turns sharing one word are no such pair)."""
    shared = len(a.content & b.content)
    return shared >= 1 and 3 * shared >= min(len(a.content), len(b.content))


def _order(turn: _Read, words: frozenset[str]) -> tuple[str, ...]:
    """The order ``words`` come in in ``turn`` (each at its first place)."""
    return tuple(dict.fromkeys(w for w in parse(request_text(turn.text)).content if w in words))
