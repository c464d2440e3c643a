"""ContextMatcher: may a conversation's stored answer be served after another conversation?

The guard has already judged the two final requests the same. What is left is the context:
the earlier turns. Comparing them whole would refuse nearly every conversation (a greeting, a
turn reworded, a question about something else asked first); ignoring them would serve the
answer to "how much is it?" about one product after a conversation about another. So the
matcher compares only what the final request *depends on*, and compares it strictly:

1. **Read each turn**: its content words (the guard's reading: framing dropped, stems, the
   interchangeable table, misspellings mended) and its *details*: numbers, names written with a
   capital, and words of a kind the guard names (an entity, an audience, a time...). A turn
   with no content word is chatter ("hi!", "thanks, that helps") and is set aside.
2. **Find the turns the request depends on, on each side**: where the final request points back
   ("it", "that", "the second one", "instead", "what about", a request of one content word),
   the latest exchange; then every turn that shares a content word with the request or with a
   turn already found, until none joins. A turn on another topic that nothing refers to is
   unrelated and does not count.
3. **Compare those turns strictly**: the details of the turns found must be the same on both
   sides (a different account, number, product, place, or a price the assistant quoted), and
   every user turn found must have a counterpart on the other side that the guard judges the
   same request (a change of mind, "actually, make it vegetarian", has none).

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
from gpucache.guard.differences import capitalised, named_kinds
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
TURN_RULES_SKIPPED = ("added",)
MAX_TURN_CHARS = 2000  # a turn is read for its first this many characters (bounds the cost)
# Longer conversations are served for their exact repeat only: the matcher's cost grows with
# the turns, and a dependency in a turn it did not read would be a wrong answer.
MAX_CONTEXT_TURNS = 128
_WORD = re.compile(r"[a-z']+")


@dataclass(frozen=True)
class _Read:
    """One turn as the matcher compares it."""

    index: int
    role: str
    text: str  # as read: at most MAX_TURN_CHARS
    content: frozenset[str]  # content words, less framing and generic words
    details: frozenset[str]  # numbers, names, named kinds


@lru_cache(maxsize=8192)
def _read_text(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(content words, details) of one turn's text; memoised, turns repeat across lookups."""
    asked = request_text(text)
    parsed = parse(asked)
    content = frozenset(parsed.content) - FRAMING_READ - GENERIC
    names = capitalised(text)
    details = {f"#{n}" for n in parsed.numbers}
    details.update(f"{kind}:{word}" for kind, word in named_kinds(parsed.content, names))
    return content, frozenset(details)


def _read(index: int, turn: Turn) -> _Read:
    text = turn.text[:MAX_TURN_CHARS]
    content, details = _read_text(text)
    return _Read(index, turn.role, text, content, details)


def points_back(request: str) -> bool:
    """Whether a final request refers to something said earlier ("how much is it?", "what
    about the second one?", "and for Tuesday?"), or says too little to stand alone."""
    words = _WORD.findall(request.casefold())
    if FOLLOW_UP.match(request) or any(w in BACK_REFERENCES for w in words):
        return True
    content, _ = _read_text(request[:MAX_TURN_CHARS])
    return len(content) <= 1


def depended_on(request: str, turns: list[_Read]) -> list[_Read]:
    """The turns of one side that ``request`` depends on (chatter already set aside): the latest
    exchange where it points back, then every turn sharing a content word with the request or a
    turn found, until none joins."""
    found: dict[int, _Read] = {}
    pool = set(_read_text(request[:MAX_TURN_CHARS])[0])
    if turns and points_back(request):
        last_user = max((t.index for t in turns if t.role == "user"), default=turns[0].index)
        for t in turns:
            if t.index >= last_user:
                found[t.index] = t
                pool |= t.content
    grew = True
    while grew:
        grew = False
        for t in turns:
            if t.index not in found and t.content & pool:
                found[t.index] = t
                pool |= t.content
                grew = True
    return [found[i] for i in sorted(found)]


def _differing(a: list[_Read], b: list[_Read]) -> list[str]:
    """The details one side's turns hold and the other's do not: numbers compared as numbers;
    a name or a named kind compared as a word, so a name one side writes in lowercase is
    still the same name."""
    details_a = frozenset().union(*(t.details for t in a))
    details_b = frozenset().union(*(t.details for t in b))
    words_a = frozenset().union(*(t.content for t in a))
    words_b = frozenset().union(*(t.content for t in b))
    out = []
    for mine, theirs, words in ((details_a, details_b, words_b), (details_b, details_a, words_a)):
        for detail in sorted(mine - theirs):
            if detail.startswith("#") or detail.split(":", 1)[1] not in words:
                out.append(detail)
    return sorted(set(out))


class ContextMatcher:
    """Judges two conversations whose final requests the guard found the same (module doc).

    ``guard`` judges a user turn against its counterpart (default: the lexical guard without
    the rules listed in ``TURN_RULES_SKIPPED``)."""

    name = "context"

    def __init__(self, guard: ExplainingVerifier | None = None) -> None:
        self.guard: ExplainingVerifier = guard if guard is not None else LexicalNearMissVerifier(
            skip=TURN_RULES_SKIPPED)

    def explain(self, cached: Conversation, new: Conversation) -> Verdict:
        """Accept where the contexts agree on everything the final requests depend on; else
        reject, naming the side, the turn (counted from 1) and the difference."""
        if cached.context == new.context:
            return Verdict(False, "context-same")
        longest = max(len(cached.context), len(new.context))
        if longest > MAX_CONTEXT_TURNS:
            return Verdict(True, "context-too-long", f"{longest} earlier turns: more than "
                           f"{MAX_CONTEXT_TURNS} are matched exactly only")
        sides = []
        for conversation in (cached, new):
            turns = [_read(i, t) for i, t in enumerate(conversation.context)]
            spoken = [t for t in turns if t.content or t.details]  # chatter set aside
            sides.append((spoken, depended_on(conversation.request, spoken)))
        (spoken_a, needed_a), (spoken_b, needed_b) = sides
        differing = _differing(needed_a, needed_b)
        if differing:
            return Verdict(True, "context-detail",
                           f"the turns the request depends on differ in {', '.join(differing)}",
                           tuple(differing))
        for side, needed, others in (("cached", needed_a, spoken_b), ("new", needed_b, spoken_a)):
            for turn in needed:
                if turn.role != "user":
                    continue
                verdict = self._counterpart(turn, [t for t in others if t.role == "user"])
                if verdict is not None:
                    return Verdict(True, verdict.rule, f"{side} turn {turn.index + 1}: {verdict.detail}",
                                   verdict.words)
        return Verdict(False, "context-agrees")

    def _counterpart(self, turn: _Read, others: list[_Read]) -> Verdict | None:
        """None where ``others`` holds a user turn the guard judges the same as ``turn``; else
        why not (no turn shares a content word, or the closest one differs)."""
        ranked = sorted(others, key=lambda o: (-len(turn.content & o.content), -o.index))
        if not ranked or not turn.content & ranked[0].content:
            return Verdict(True, "context-unmatched", f'"{turn.text[:80]}" has no counterpart')
        for other in ranked:
            if not turn.content & other.content:
                break
            verdict = self.guard.explain(other.text, turn.text)
            if not verdict.rejected:
                return None
        best = ranked[0]
        verdict = self.guard.explain(best.text, turn.text)
        return Verdict(True, f"context-{verdict.rule}",
                       f'"{turn.text[:80]}" / "{best.text[:80]}": {verdict}', verdict.words)
