"""ContextMatcher: may a conversation's stored answer be served after another conversation?

The guard has already judged the two final requests the same. What is left is the context: the
earlier turns. With one key shared by many end users, a difference in them is another person's
record, account, age, diagnosis or approval, whatever the final request looks like ("what is the
current balance?" after "my account number is 12345678"). So the matcher is safe by
construction: **a difference in the earlier turns is a miss unless it is shown not to matter**,
and what it shows is one thing (``said``): **an opening greeting**. A conversation's first user
turn that only greets ("hi", "hello there!") with the assistant's reply that only greets and
offers help ("Hi! How can I help you?"), or greeting sentences that open the first user turn
("Hi! I need to book a cleaning..."), are set aside. Everything else is compared as written:
every character, its case, each sign, mark and space, the spaces around a turn too (a line of
code's indentation, a password's trailing spaces). Known limit, one a final request must aim at
to reach: a question about the greeting itself ("what was the first thing I said?"), or a system
prompt that keys on how the user greets, is served the answer made after another greeting.

Earlier rounds showed more not to matter, and a hostile client shown none of the code found
each of those serving one customer's answer to another (issue 65): read by meaning,
a pronoun or a tense is no content word ("I am allergic" / "he is allergic", "I am a smoker" /
"I was"), a sign is no word ("HIV+" / "HIV-", "-500" / "500"); with punctuation set aside,
"Let's eat, grandma" is "Let's eat grandma", "Compute 5!" is "Compute 5", "1, 000" is "1 000";
with spacing collapsed or trimmed, a line of code moves out of its loop or loses its indentation;
with thanks and goodbyes set aside,
"Thanks!" no longer accepts the offer before it, "Good morning" is "Good evening", "Goodbye! I
can't take it anymore" is a plain sigh. Rewordings of the earlier turns are left to a model that
reads both conversations together.

The work is linear in the characters, and bounded before anything is read: past
``MAX_CONTEXT_TURNS`` earlier turns or ``MAX_CONTEXT_CHARS`` characters a side, two
conversations are matched exactly only (a miss, as they differ). Everything is a pure function
of the two conversations and a shipped word list (no floating point, no ``hash()``), so every
process and machine gives the same verdict, and ``explain`` names the first turn that differs.
"""

from __future__ import annotations

import re

from gpucache.conversation.value import Conversation, Turn
from gpucache.guard.differences import segments
from gpucache.guard.verifier import Verdict

# The words of an opening greeting, the user's ("hi there!"), and of the assistant's reply to
# it, which may offer help ("Hello! How can I help you today?"). Closed lists: a goodbye, a
# time of day ("good morning" / "good evening") or a thanks can carry meaning, and is none.
GREETING = frozenset("hi hello hey hiya there".split())
WELCOME = GREETING | frozenset("how can may i help you today".split())
# The bounds on one comparison, counted before anything is read: past either, the two
# conversations are matched exactly only
MAX_CONTEXT_TURNS = 128
MAX_CONTEXT_CHARS = 16_000
_WORDS_ONLY = re.compile(r"[A-Za-z]+(?:[ ,]+[A-Za-z]+)*[ ,]*[.!?]*")  # words, commas, an end
_WORD = re.compile(r"[A-Za-z]+")


class ContextMatcher:
    """Judges two conversations whose final requests the guard found the same (module doc)."""

    name = "context"

    def explain(self, cached: Conversation, new: Conversation) -> Verdict:
        """Accept where the two contexts are the same but for an opening greeting (module
        doc); else reject, naming the first turn that differs."""
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
        a, b = said(cached.context), said(new.context)
        if [turn for _, turn in a] == [turn for _, turn in b]:
            return Verdict(False, "context-agrees")
        place = next((i for i, (x, y) in enumerate(zip(a, b)) if x[1] != y[1]), min(len(a), len(b)))
        side, (turn, (role, text)) = ("cached", a[place]) if place < len(a) else ("new", b[place])
        return Verdict(
            True,
            "context-differs",
            f"{side} turn {turn + 1} ({role}): {text[:80]!r} is not said so on the other side",
        )


def said(context: tuple[Turn, ...]) -> list[tuple[int, tuple[str, str]]]:
    """One side's earlier turns as compared: (each turn's index, (its role, its text)), an
    opening greeting set aside (module doc). The index is reported, not compared."""
    turns = [(i, (t.role, t.text)) for i, t in enumerate(context)]
    if (
        len(turns) >= 2
        and turns[0][1][0] == "user"
        and only(turns[0][1][1], GREETING)
        and turns[1][1][0] == "assistant"
        and only(turns[1][1][1], WELCOME)
    ):
        turns = turns[2:]
    if turns and turns[0][1][0] == "user":
        sentences = list(segments(turns[0][1][1]))
        while sentences and only(sentences[0], GREETING):
            sentences.pop(0)
        opened = turns[0][1][1]
        if sentences and len(sentences) < len(segments(opened)):
            rest = opened[opened.index(sentences[0]) :]
            turns[0] = (turns[0][0], ("user", rest))
    return turns


def only(text: str, words: frozenset[str]) -> bool:
    """Whether ``text`` is words of ``words`` alone (any case), sentence by sentence, with
    commas between them and ".", "!" or "?" at each one's end: "Hi there!", "Hello! How can I
    help you?"."""
    found = segments(text)
    return bool(found) and all(
        _WORDS_ONLY.fullmatch(s) and all(w in words for w in _WORD.findall(s.casefold())) for s in found
    )
