"""ContextMatcher: may a conversation's stored answer be served after another conversation?

The guard has already judged the two final requests the same. What is left is the context: the
earlier turns. With one key shared by many end users, a difference in them is another person's
record, account, age, diagnosis or approval, whatever the final request looks like ("what is the
current balance?" after "my account number is 12345678"). So the matcher is safe by
construction: **a difference in the earlier turns is a miss unless it is shown not to matter**,
and what it can show is deliberately little:

1. **Chatter** (``chatter``): a sentence made only of greetings and thanks from a closed list
   ("hi there", "thanks!", "How can I help?") is set aside. A reaction beside a fact ("sorry,
   I'm allergic to penicillin") is a fact.
2. **Where sentences end**: every other sentence is compared word for word (``said``), the words
   as written, case, signs, symbols, digits and every small word kept ("I am" / "he is", "HIV+"
   / "HIV-", "-500" / "500", "XyZ7q" / "xyz7q", "≥" / "≤"). Only what separates words is not a
   word: spacing, and the marks that end or join a clause (``.,;:!``), so "the kettle trips the
   breaker, it started last week" and "The kettle trips the breaker. It started last week."
   agree; a question mark is kept ("allergic to nuts?" is no statement); and a sentence's first
   word is read in lower case where it is one of a closed list of function words ("The", "It"),
   never a name ("Bill" / "bill").

Earlier rounds read the turns by meaning: the guard's rules on each sentence, stems, synonyms,
spelling mended, sentences restated across the conversation, turns about something else and the
turns of a request that "stands alone" set aside. Tried as a hostile user of a shared key would,
each of those served one customer's answer to another (issue 65): pronouns and tenses are no
content words to the guard ("I am allergic" / "he is allergic", "I am a smoker" / "I was"), signs
are no words ("HIV+" / "HIV-"), a turn about something else may hold the fact. Rewordings of the
earlier turns are left to a model that reads both conversations together.

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

# The closed list of chatter: a sentence of these words alone (and no digit) says nothing the
# answer can turn on ("hi there", "thank you so much!", "Hello! How can I help you?")
CHATTER = frozenset(
    """hi hello hey hiya there thanks thank you thx ty cheers much so very good morning afternoon
    evening bye goodbye how can i help may""".split()
)
# Function words a sentence may start with in either case ("The kettle" / "the kettle"): a
# closed list, so a name ("Bill" / "bill") or a code keeps its case
OPENERS = frozenset(
    """the a an it its this that these those there my our your we you they he she his her their
    is are was were can could do does did what how when where why which who so but and also then
    please yes no ok okay sure well if in on at for to of with""".split()
)
# What ends or joins a clause, and is no word: stripped from a word's end
CLAUSE_MARKS = ".,;:!"
# The bounds on one comparison, counted before anything is read: past either, the two
# conversations are matched exactly only
MAX_CONTEXT_TURNS = 128
MAX_CONTEXT_CHARS = 16_000
_LETTER_RUN = re.compile(r"[A-Za-z]+")
_CHATTER_TEXT = re.compile(r"[A-Za-z\s,.!?'-]*[A-Za-z][A-Za-z\s,.!?'-]*")  # letters and marks alone


class ContextMatcher:
    """Judges two conversations whose final requests the guard found the same (module doc)."""

    name = "context"

    def explain(self, cached: Conversation, new: Conversation) -> Verdict:
        """Accept where the two contexts say the same words, turn by turn, chatter and where
        sentences end aside (module doc); else reject, naming the first turn that differs."""
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
        if [(role, words) for _, role, words in a] == [(role, words) for _, role, words in b]:
            return Verdict(False, "context-agrees")
        place = next((i for i, (x, y) in enumerate(zip(a, b)) if x[1:] != y[1:]), min(len(a), len(b)))
        side, (turn, role, words) = ("cached", a[place]) if place < len(a) else ("new", b[place])
        return Verdict(
            True,
            "context-differs",
            f"{side} turn {turn + 1} ({role}): {' '.join(words)[:80]!r} is not said so on the other side",
        )


def said(context: tuple[Turn, ...]) -> list[tuple[int, str, tuple[str, ...]]]:
    """One side's earlier turns as compared: each turn that says more than chatter, as (its
    index, its role, its words in order). The index is reported, not compared."""
    out = []
    for i, turn in enumerate(context):
        words = tuple(
            w for sentence in segments(turn.text) if not chatter(sentence) for w in _words(sentence)
        )
        if words:
            out.append((i, turn.role, words))
    return out


def chatter(text: str) -> bool:
    """Whether a sentence is chatter: greetings and thanks from the closed list alone, no
    digit ("Hi, how can I help?", "thank you so much!")."""
    return bool(_CHATTER_TEXT.fullmatch(text)) and all(
        w in CHATTER for w in _LETTER_RUN.findall(text.casefold())
    )


def _words(sentence: str) -> list[str]:
    """A sentence's words as compared (module doc): split at spacing, the clause marks at each
    word's end dropped, a question mark kept as a word of its own, the first word in lower
    case where it is a function word of ``OPENERS``."""
    out = []
    for k, chunk in enumerate(sentence.split()):
        bare = chunk.rstrip(CLAUSE_MARKS + "?")
        if k == 0 and bare.lower() in OPENERS:
            bare = bare.lower()
        if bare:
            out.append(bare)
        if "?" in chunk[len(bare) :]:
            out.append("?")
    return out
