"""ContextMatcher: may a conversation's stored answer be served after another conversation?

The guard has already judged the two final requests the same. What is left is the context:
the earlier turns. Comparing them whole would refuse nearly every conversation (a greeting, a
turn reworded, a question about something else asked first); ignoring them would serve the
answer to "how much is it?" about one product after a conversation about another. So:

1. **Read each turn sentence by sentence** (reading.py): each sentence's content words (the
   guard's reading: framing dropped, stems, the interchangeable table, misspellings mended) and
   its *details* (numbers, as written and with every quantity in one unit; names written with a
   capital). A sentence with neither is chatter, set aside.
2. **A request that stands alone** (it points back to nothing: no "it", "that", "the second
   one", "my ...", "the approach I chose", "the answer", no follow-up opening; and it shares no
   word with the turns before it) needs only the same standing instructions on both sides
   ("from now on answer in French"). A request that names what the turns talked about ("where
   is the noise coming from?" after a turn about the noise) depends on them.
3. **Find what the request depends on, on each side** (``needed_turns``): the latest exchange
   and every sentence sharing a word with the request or with one found, and every other
   exchange except an island (sharing no word with the request or the rest), an exchange the
   user marks as an aside ("random q", "unrelated", "btw") and the exchanges tied only to one.
4. **Compare strictly**: the numbers and names stated in what the request depends on must be
   stated on the other side; every sentence needs a close counterpart (a third of its words
   shared) that the guard and the edit check judge the same (a sentence edited in a word,
   "a tension headache" / "a migraine", states something else), in the same order where the
   order can decide what "it" or "the second one" means; a sentence one side has and the other
   does not refuses when the request depends on it, unless it is a reaction said in passing or
   the other side tells what it says in other words (``_Told.restates``: half its words said
   there, every word naming a kind of thing said there, no negation or change of mind the
   other side lacks).

When unsure it refuses: a turn with no counterpart is a difference. Everything is a pure
function of the two conversations and shipped word lists (no floating point, no ``hash()``),
so every process and machine gives the same verdict, and ``explain`` names the turn and the
difference that refused a candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpucache.conversation.reading import (
    MAX_TURN_CHARS,
    WORD,
    Sentence,
    differing,
    needed_turns,
    points_back,
    read_text,
    sentences,
)
from gpucache.conversation.value import Conversation
from gpucache.guard.differences import align, kind_of, segments
from gpucache.guard.lexical import LexicalNearMissVerifier
from gpucache.guard.parsing import parse
from gpucache.guard.request import request_text
from gpucache.guard.verifier import ExplainingVerifier, Verdict
from gpucache.guard.words import NEGATIONS

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
# The guard's rules not run on a turn against its counterpart: a word one side adds to a
# statement of the same facts ("which plans include roaming" / "which plans have roaming") is
# how people restate context; the details that matter are compared by the detail check.
TURN_RULES_SKIPPED: tuple[str, ...] = ("added",)
# What a sentence may be refused for and still be a rewording, where the other side tells what
# it says (``_Told.restates``): no sentence there shares enough of its words to be its
# counterpart (said in other words, split or merged), or the closest differs in how a request
# is put or in a number the other side states elsewhere (one sentence here, two there). A word
# substituted in a sentence otherwise the same ("the front lever is spongy" / "the rear lever
# is spongy"), a negation, an opposite, a direction, a thing named or a payload never is.
RESTATABLE = frozenset(
    f"context-{rule}"
    for rule in "unmatched time tone deliverable audience constraint roles "
    "crossed voice question-word numbers".split()
)
RESTATED_SHARE = (1, 2)  # (numerator, denominator): the share of its words the other side says
# Longer conversations are served for their exact repeat only: the matcher's cost grows with
# the turns, and a dependency in a turn it did not read would be a wrong answer.
MAX_CONTEXT_TURNS = 128
# The matcher's work is bounded by counts, so its verdict is the same on every machine: a side of
# more sentences than this (chatter included), or a comparison that would ask the guard about more
# pairs of sentences than MAX_JUDGED, is matched exactly only; each sentence is judged against
# its MAX_JUDGED_EACH closest. A client can send 128 turns of 2,000 characters each, every
# sentence near one of the other side's: unbounded, judging such a pair took 1.6 s of CPU.
MAX_CONTEXT_SENTENCES = 512
MAX_JUDGED, MAX_JUDGED_EACH = 256, 3


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
        most = max(
            sum(len(segments(t.text[:MAX_TURN_CHARS])) for t in conversation.context)
            for conversation in (cached, new)
        )  # counted before any is read: reading is most of the cost
        if most > MAX_CONTEXT_SENTENCES:
            return Verdict(
                True,
                "context-too-long",
                f"{most} sentences: more than {MAX_CONTEXT_SENTENCES} are matched exactly only",
            )
        sides = []
        for conversation in (cached, new):
            turns = [unit for i, t in enumerate(conversation.context) for unit in sentences(i, t)]
            spoken = [t for t in turns if t.content or t.details]  # chatter set aside
            sides.append((spoken, needed_turns(conversation.request, spoken)))
        (spoken_a, needed_a), (spoken_b, needed_b) = sides
        # a request that shares a word with the turns before it is about them, pronoun or none
        strict = points_back(cached.request) or points_back(new.request) or bool(needed_a or needed_b)
        if not strict:  # the request stands alone: only an instruction for every answer counts
            return self._instructions(spoken_a, spoken_b)
        unstated = differing(needed_a, spoken_b) + differing(needed_b, spoken_a)
        if unstated:
            return Verdict(
                True,
                "context-detail",
                f"the turns the request depends on differ in {', '.join(unstated)}",
                tuple(unstated),
            )
        budget = [MAX_JUDGED]  # the guard's judgments this comparison may still ask for
        for side, spoken, needed, others, asked in (
            ("cached", spoken_a, needed_a, spoken_b, new.request),
            ("new", spoken_b, needed_b, spoken_a, cached.request),
        ):
            found: list[tuple[int, int]] = []
            told = _Told.of(others, asked)
            for turn in spoken:
                after = found[-1] if found else (-1, -1)
                match = self._counterpart(
                    turn, [t for t in others if t.role == turn.role], strict, after, budget
                )
                if isinstance(match, tuple):
                    found.append(match)
                elif match.rule == "context-unmatched" and (turn not in needed or aside(turn)):
                    continue  # said in passing, or about what the request does not depend on
                elif match.rule in RESTATABLE and told.restates(turn, match.rule):
                    continue  # reworded: what it states is stated on the other side
                else:
                    # a statement changed, or one the request may depend on stated on one side only
                    return Verdict(
                        True, match.rule, f"{side} turn {turn.index + 1}: {match.detail}", match.words
                    )
            if found != sorted(found):  # "it", "the second one": the order decides what they mean
                return Verdict(True, "context-order", f"the {side} side's sentences come in another order")
        return Verdict(False, "context-agrees")

    def _instructions(self, a: list[Sentence], b: list[Sentence]) -> Verdict:
        """For a request that stands alone: accept unless a user sentence that instructs every
        later answer ("from now on answer in French", "explain like I'm five") is said on one
        side only, or differently."""
        budget = [MAX_JUDGED]
        for side, mine, others in (("cached", a, b), ("new", b, a)):
            theirs = [t for t in others if t.role == "user"]
            for turn in mine:
                if turn.role == "user" and INSTRUCTION.search(turn.text):
                    match = self._counterpart(turn, theirs, True, (-1, -1), budget)
                    if isinstance(match, Verdict):
                        return Verdict(
                            True,
                            "context-instruction",
                            f"{side} turn {turn.index + 1}: {match.detail}",
                            match.words,
                        )
        return Verdict(False, "context-apart")

    def _counterpart(
        self, turn: Sentence, others: list[Sentence], strict: bool, after: tuple[int, int], budget: list[int]
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
        for other in close[:MAX_JUDGED_EACH]:
            if budget[0] <= 0:
                return Verdict(True, "context-too-long", f"more than {MAX_JUDGED} sentences to judge")
            budget[0] -= 1
            verdict = self._same(other, turn, strict)
            if verdict is None:
                return other.index, other.part
            first = first or verdict
        assert first is not None
        return Verdict(
            True, first.rule, f'"{turn.text[:80]}" / "{close[0].text[:80]}": {first.detail}', first.words
        )

    def _same(self, a: Sentence, b: Sentence, strict: bool) -> Verdict | None:
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


@dataclass(frozen=True)
class _Told:
    """What one side's conversation tells, as a whole: where a sentence of the other side has no
    counterpart sentence, because the other side said it in other words, split it or merged it
    with another ("I don't really understand derivatives" / "derivatives confuse me"), what it
    states must still be told there (``restates``)."""

    words: frozenset[str]  # content words of every sentence and of the request
    details: frozenset[str]  # numbers (as written and in one unit) and names said anywhere
    negated: bool  # a negation is said somewhere
    changed: bool  # a change of mind is said somewhere

    @classmethod
    def of(cls, spoken: list[Sentence], request: str) -> _Told:
        words = frozenset().union(read_text(request[:MAX_TURN_CHARS])[0], *(t.content for t in spoken))
        text = " ".join(t.text for t in spoken)
        return cls(
            words,
            frozenset().union(*(t.details | t.amounts for t in spoken)),
            _negates(text),
            bool(set(WORD.findall(text.casefold())) & CHANGES) or bool(CHANGE_PHRASES.search(text)),
        )

    def restates(self, turn: Sentence, rule: str) -> bool:
        """Whether ``turn``, refused by ``rule`` (one of RESTATABLE), says nothing this side does
        not tell: every word of it naming a kind of thing (categories.txt) is said here, and of
        its other content words RESTATED_SHARE where no sentence here is close to it (said in
        other words), every one where one is but differs in how it is put or in a number (what
        it says beside must be said elsewhere); its numbers stated here, as written or in one
        unit; no negation or change of mind where this side says none. (The numbers and names
        of what the request depends on were compared before: ``differing``.)"""
        if rule == "context-numbers" and not (
            turn.details <= self.details or (turn.converted and turn.converted <= self.details)
        ):
            return False  # a number this side does not state (else one sentence here split in two)
        said = set(WORD.findall(turn.text.casefold()))
        if (_negates(turn.text) and not self.negated) or (
            (said & CHANGES or CHANGE_PHRASES.search(turn.text)) and not self.changed
        ):
            return False
        if any(kind_of(w, frozenset()) is not None and w not in self.words for w in turn.content):
            return False
        words = {w for w in turn.content if not any(c.isdigit() for c in w)}  # numbers: details
        shared = len(words & self.words)
        if rule != "context-unmatched":
            return shared == len(words)
        return RESTATED_SHARE[1] * shared >= RESTATED_SHARE[0] * len(words)


def _negates(text: str) -> bool:
    """Whether ``text`` says a negation: a negative word, or one contracted ("don't", "isn't")."""
    return any(w in NEGATIONS or w.endswith("n't") for w in WORD.findall(text.casefold()))


def aside(turn: Sentence) -> bool:
    """Whether a sentence only one side has is said in passing: a reaction ("haha sorry, my
    hands are full", "thank you, that's kind of you") that states no number or name and changes
    nothing ("actually", "instead", "I meant")."""
    words = set(WORD.findall(turn.text.casefold()))
    return (
        not turn.details
        and bool(words & REACTIONS)
        and not words & CHANGES
        and not CHANGE_PHRASES.search(turn.text)
    )


def _close(a: Sentence, b: Sentence) -> bool:
    """Whether ``b`` shares enough of ``a``'s words to be its counterpart: a third of the
    shorter turn's content words (the guard judges pairs a similarity threshold has let
    through, and two turns sharing one word are no such pair)."""
    shared = len(a.content & b.content)
    return shared >= 1 and 3 * shared >= min(len(a.content), len(b.content))


def _order(turn: Sentence, words: frozenset[str]) -> tuple[str, ...]:
    """The order ``words`` come in in ``turn`` (each at its first place)."""
    return tuple(dict.fromkeys(w for w in parse(request_text(turn.text)).content if w in words))
