"""ContextMatcher: may a conversation's stored answer be served after another conversation?

The guard has already judged the two final requests the same. What is left is the context: the
earlier turns. With one key shared by many end users, a difference in them is another person's
record, account, age or approval, whatever the final request looks like ("what is the current
balance?" after "my account number is 12345678"). So the matcher is safe by construction: **a
difference in the earlier turns is a miss unless it is shown not to matter.** What it can show:

1. **Chatter** (``chatter``): a sentence made only of greetings and thanks from a closed list
   ("hi there", "thanks!", "How can I help?") is set aside. Nothing else is: a reaction word
   beside a fact ("sorry, I'm allergic to penicillin") is a fact.
2. **A sentence said in other words**: every other sentence on each side needs a counterpart on
   the other that the guard judges the same and that is no edit of it (not one content word
   added, dropped or substituted: "a tension headache" / "a migraine", "a peanut allergy" / "an
   allergy"), or the other side must tell all it says (``_Told.restates``: every content word,
   every number, name and kind, no negation or change of mind the other side lacks), and the
   sentences come in the same order.
3. **Details** (numbers, amounts, dates, names) stated in any turn, the user's or the
   assistant's, must be stated on the other side (``differing``).

What it does not read by meaning is compared exactly, so a bound costs a hit, never a wrong
answer (``_unread``): a turn longer than ``MAX_TURN_CHARS``; a sentence with a word in no English
dictionary (another language, a misspelling, a code: the guard's word lists do not read it, and
it is never spell-mended); a user sentence about the answers themselves (an instruction such as
"include a link to evil.example in each reply", "from now on answer in French"); a sentence of
no content word ("Yes." / "No."). Those must appear on the other side, in the same order, as
written (case and spacing aside).

Its work is bounded before anything is read: the turns' count and characters
(``MAX_CONTEXT_TURNS``, ``MAX_CONTEXT_CHARS``), then its sentences (``MAX_CONTEXT_SENTENCES``) and
the guard's judgments (``MAX_JUDGED``); past any bound the two are matched exactly only (a miss,
as they differ). Everything is a pure function of the two conversations and shipped word lists
(no floating point, no ``hash()``), so every process and machine gives the same verdict, and
``explain`` names the turn and the difference that refused a candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpucache.conversation.reading import MAX_TURN_CHARS, WORD, Sentence, differing, read_text, sentences
from gpucache.conversation.value import Conversation, Turn
from gpucache.guard.differences import align, segments
from gpucache.guard.lexical import LexicalNearMissVerifier
from gpucache.guard.parsing import parse
from gpucache.guard.request import dictionary, request_text
from gpucache.guard.verifier import ExplainingVerifier, Verdict
from gpucache.guard.words import NEGATIONS

# A turn that keeps this many content words of the other and changes any is an edit of it
# (context.ContextMatcher._same): a statement changed in one word states something else
EDIT_SHARED_MIN = 1
# The closed list of chatter: a sentence of these words alone (and no digit) says nothing the
# answer can turn on ("hi there", "thank you so much!", "Hello! How can I help you?")
CHATTER = frozenset(
    """hi hello hey hiya there thanks thank you thx ty cheers much so very good morning afternoon
    evening bye goodbye how can i help may""".split()
)
CHANGES = frozenset("actually instead rather meant change changed switch cancel scratch wait".split())
CHANGE_PHRASES = re.compile(
    r"\b(?:never ?mind|on second thought|make (?:it|that)|not anymore)\b", re.IGNORECASE
)
# A user's sentence about the answers themselves: their manner, language, length, audience, role,
# format or what each must hold. Compared exactly: an instruction shapes every later answer
INSTRUCTION = re.compile(
    r"\b(?:from now on|going forward|for (?:the rest|all) of|always|never|each|every|all|"
    r"answers?|repl(?:y|ies)|respon(?:d|ses?)|outputs?|format\w*|links?|urls?|https?|www|"
    r"pretend|act as|role\w*|you are|you're|like i'?m|keep (?:it|your)|bullet\w*|words?|"
    r"sentences?|paragraphs?|language|english|french|spanish|german|italian|portuguese|"
    r"chinese|japanese|korean|hindi|arabic|russian|dutch)\b|\w\.[a-z]{2,}\b",
    re.IGNORECASE,
)
# What a sentence may be refused for and still be a rewording, where the other side tells all
# it says (``_Told.restates``): no sentence there shares enough of its words to be its
# counterpart (said in other words, split or merged), or the closest differs in how a request
# is put or in a number the other side states elsewhere (one sentence here, two there). A word
# substituted in a sentence otherwise the same, a negation, an opposite, a direction, a thing
# named or a payload never is.
RESTATABLE = frozenset(
    f"context-{rule}"
    for rule in "unmatched time tone deliverable audience constraint roles "
    "crossed voice question-word numbers".split()
)
# The bounds on one comparison, each counted before the work it bounds, so the verdict is the
# same on every machine and a client cannot make a lookup expensive: past one, the two
# conversations are matched exactly only. A side's earlier turns, and their characters (what
# reading costs: about 2.2 CPU-seconds per 200 KB before this bound); a side's sentences; the
# guard's judgments of one comparison, each sentence judged against its MAX_JUDGED_EACH closest.
MAX_CONTEXT_TURNS = 128
MAX_CONTEXT_CHARS = 16_000
MAX_CONTEXT_SENTENCES = 256
MAX_JUDGED, MAX_JUDGED_EACH = 256, 3
# Letters of words a dictionary may hold, and the pieces a contraction splits into ("i'm")
_LETTER_RUN = re.compile(r"[^\W\d_]+")
_CLITICS = frozenset("s t m re ve ll d".split())
_JOINING = frozenset({"and"})  # what joins two sentences into one ("... breaker, and it started ...")


class ContextMatcher:
    """Judges two conversations whose final requests the guard found the same (module doc).

    ``guard`` judges a sentence against its counterpart (default: the lexical guard, every rule
    on)."""

    name = "context"

    def __init__(self, guard: ExplainingVerifier | None = None) -> None:
        self.guard: ExplainingVerifier = guard if guard is not None else LexicalNearMissVerifier()

    def explain(self, cached: Conversation, new: Conversation) -> Verdict:
        """Accept where every difference between the two contexts is shown not to matter
        (module doc); else reject, naming the side, the turn (counted from 1) and the difference."""
        if cached.context == new.context:
            return Verdict(False, "context-same")
        for conversation in (cached, new):
            turns, chars = len(conversation.context), sum(len(t.text) for t in conversation.context)
            if turns > MAX_CONTEXT_TURNS or chars > MAX_CONTEXT_CHARS:
                return Verdict(
                    True,
                    "context-too-long",
                    f"{turns} earlier turns of {chars} characters: more than {MAX_CONTEXT_TURNS} "
                    f"turns or {MAX_CONTEXT_CHARS} characters are matched exactly only",
                )
        most = max(
            sum(len(segments(t.text)) for t in conversation.context if len(t.text) <= MAX_TURN_CHARS)
            for conversation in (cached, new)
        )  # counted before any is read: reading is most of the cost
        if most > MAX_CONTEXT_SENTENCES:
            return Verdict(
                True,
                "context-too-long",
                f"{most} sentences: more than {MAX_CONTEXT_SENTENCES} are matched exactly only",
            )
        (spoken_a, exact_a), (spoken_b, exact_b) = _split(cached.context), _split(new.context)
        if [key for key, _ in exact_a] != [key for key, _ in exact_b]:
            where = next(
                (i for i, (x, y) in enumerate(zip(exact_a, exact_b)) if x[0] != y[0]),
                min(len(exact_a), len(exact_b)),
            )
            side, place = (
                ("cached", exact_a[where][1]) if where < len(exact_a) else ("new", exact_b[where][1])
            )
            return Verdict(
                True,
                "context-unread",
                f"{side} turn {place + 1}: what is compared exactly (too long, not read, an "
                "instruction or no content word) differs",
            )
        if _gist(spoken_a) == _gist(spoken_b):  # the same words in the same order, split otherwise
            return Verdict(False, "context-agrees")
        unstated = differing(spoken_a, spoken_b) + differing(spoken_b, spoken_a)
        if unstated:
            return Verdict(
                True, "context-detail", f"the earlier turns differ in {', '.join(unstated)}", tuple(unstated)
            )
        budget = [MAX_JUDGED]  # the guard's judgments this comparison may still ask for
        for side, spoken, others, asked in (
            ("cached", spoken_a, spoken_b, new.request),
            ("new", spoken_b, spoken_a, cached.request),
        ):
            found: list[tuple[int, int]] = []
            told = _Told.of(others, asked)
            for turn in spoken:
                after = found[-1] if found else (-1, -1)
                match = self._counterpart(turn, [t for t in others if t.role == turn.role], after, budget)
                if isinstance(match, tuple):
                    found.append(match)
                elif match.rule in RESTATABLE and told.restates(turn, match.rule):
                    continue  # reworded: all it states is stated on the other side
                else:
                    return Verdict(
                        True, match.rule, f"{side} turn {turn.index + 1}: {match.detail}", match.words
                    )
            if found != sorted(found):  # "it", "the second one": the order decides what they mean
                return Verdict(True, "context-order", f"the {side} side's sentences come in another order")
        return Verdict(False, "context-agrees")

    def _counterpart(
        self, turn: Sentence, others: list[Sentence], after: tuple[int, int], budget: list[int]
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
            verdict = self._same(other, turn)
            if verdict is None:
                return other.index, other.part
            first = first or verdict
        assert first is not None
        return Verdict(
            True, first.rule, f'"{turn.text[:80]}" / "{close[0].text[:80]}": {first.detail}', first.words
        )

    def _same(self, a: Sentence, b: Sentence) -> Verdict | None:
        """None where two sentences say the same; else the difference. The guard judges them as
        two requests; and where one is an edit of the other, any content word added, dropped or
        substituted is a difference: a statement of context changed in one word ("a tension
        headache" / "a migraine", "a peanut allergy" / "an allergy") states something else,
        where a question changed in one word may not ask anything else. The same words in
        another order are a difference too ("my husband has a cold and my daughter pink eye" /
        "my daughter has a cold and my husband pink eye")."""
        verdict = self.guard.explain(a.text, b.text)
        if verdict.rejected:
            return Verdict(True, f"context-{verdict.rule}", str(verdict), verdict.words)
        edit = align(parse(request_text(a.text)), parse(request_text(b.text)))
        kept = max(edit.shared, edit.framed)
        if (edit.only_a or edit.only_b) and kept >= EDIT_SHARED_MIN:
            words = edit.only_a + edit.only_b
            return Verdict(
                True, "context-edited", f"one sentence is the other edited: {' / '.join(words)}", words
            )
        if a.content == b.content and _order(a, a.content) != _order(b, b.content):
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
        not tell: every content word of it said here; its numbers stated here, as written or in
        one unit; no negation or change of mind where this side says none. (Every turn's numbers
        and names were compared before: ``differing``.)"""
        if rule == "context-numbers" and not (
            turn.details <= self.details or (turn.converted and turn.converted <= self.details)
        ):
            return False  # a number this side does not state (else one sentence here split in two)
        said = set(WORD.findall(turn.text.casefold()))
        if (_negates(turn.text) and not self.negated) or (
            (said & CHANGES or CHANGE_PHRASES.search(turn.text)) and not self.changed
        ):
            return False
        words = {w for w in turn.content if not any(c.isdigit() for c in w)}  # numbers: details
        return words <= self.words


def _negates(text: str) -> bool:
    """Whether ``text`` says a negation: a negative word, or one contracted ("don't", "isn't")."""
    return any(w in NEGATIONS or w.endswith("n't") for w in WORD.findall(text.casefold()))


def chatter(text: str) -> bool:
    """Whether a sentence is chatter: greetings and thanks from the closed list alone, no
    digit ("Hi, how can I help?", "thank you so much!")."""
    words = _LETTER_RUN.findall(text.casefold())
    return bool(words) and not any(c.isdigit() for c in text) and all(w in CHATTER for w in words)


def readable(text: str) -> bool:
    """Whether the guard's word lists read a sentence: every word of it in the English
    dictionary (a contraction's pieces too). Another language, a misspelling or a code is not
    read, and so never spell-mended: it is compared exactly."""
    words = dictionary()
    return all(w in words or w in _CLITICS for w in _LETTER_RUN.findall(text.casefold()))


def _unread(role: str, text: str) -> bool:
    """Whether a sentence is compared exactly rather than read (module doc)."""
    return (
        not readable(text)
        or (role == "user" and bool(INSTRUCTION.search(text)))
        or not read_text(text)[0]  # no content word: "Yes." / "No.", "Done."
    )


def _split(context: tuple[Turn, ...]) -> tuple[list[Sentence], list[tuple[tuple[str, int, str], int]]]:
    """One side's earlier turns as (the sentences read by meaning, the parts compared exactly:
    each a key of its role, its turn's place among the turns that say more than chatter and its
    text, case and spacing aside, with its turn's index). Chatter is set aside; a turn past
    MAX_TURN_CHARS is compared whole."""
    spoken: list[Sentence] = []
    exact: list[tuple[tuple[str, int, str], int]] = []
    place = 0  # turns so far that say more than chatter
    for i, turn in enumerate(context):
        if len(turn.text) > MAX_TURN_CHARS:
            exact.append(((turn.role, place, " ".join(turn.text.casefold().split())), i))
            place += 1
            continue
        units = [unit for unit in sentences(i, turn) if not chatter(unit.text)]
        for unit in units:
            if _unread(turn.role, unit.text):
                exact.append(((turn.role, place, " ".join(unit.text.casefold().split())), i))
            else:
                spoken.append(unit)
        place += bool(units)
    return spoken, exact


def _gist(spoken: list[Sentence]) -> tuple[tuple[str, int, tuple[str, ...]], ...]:
    """What one side's read sentences say, turn by turn, as the guard reads them: each turn's role,
    place among the turns read, and every word of it in order (stemmed, negations folded) but
    an "and" joining two sentences. Two sides of one gist differ only in case, punctuation,
    framing, chatter and where their sentences end ("the kettle trips the breaker, and it started
    last week" / "The kettle trips the breaker. It started last week.")."""
    turns: dict[int, tuple[str, list[str]]] = {}
    for unit in spoken:
        words = (w for w in parse(request_text(unit.text)).tokens if w not in _JOINING)
        turns.setdefault(unit.index, (unit.role, []))[1].extend(words)
    return tuple((role, place, tuple(words)) for place, (role, words) in enumerate(turns.values()))


def _close(a: Sentence, b: Sentence) -> bool:
    """Whether ``b`` shares enough of ``a``'s words to be its counterpart: a third of the
    shorter turn's content words (the guard judges pairs a similarity threshold has let
    through, and two turns sharing one word are no such pair)."""
    shared = len(a.content & b.content)
    return shared >= 1 and 3 * shared >= min(len(a.content), len(b.content))


def _order(turn: Sentence, words: frozenset[str]) -> tuple[str, ...]:
    """The order ``words`` come in in ``turn`` (each at its first place)."""
    return tuple(dict.fromkeys(w for w in parse(request_text(turn.text)).content if w in words))
