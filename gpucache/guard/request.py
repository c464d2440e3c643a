"""What a prompt asks, read the same way at store and at lookup: the request without the
greetings, thanks and pure framing around it, shorthand written out, misspellings mended.

Why: a sentence embedding averages over every word, so "hey, quick question, how can I reset my
password? thanks!" lands below the threshold that "How do I reset my password?" clears, and a
"not" or a number in a context sentence ("been stuck for 2 hours, can't figure it out") looks
to the guard like a negated or renumbered request. The cache embeds and stores ``request_text``
of each prompt for its semantic tier (the exact tier keeps the prompt as sent), and the guard
compares the request texts of the two prompts.

Only whole framing segments at the start and the end of a prompt are dropped (a segment ends at
a sentence mark or a comma followed by a space), never text in the middle, so a pasted payload
is left as it is; a prompt that is all framing is kept whole. Misspellings are mended only
where a lowercase word of six letters or more is in no dictionary and one edit away from a
word that is clearly the likeliest meant (pyspellchecker's English word list and counts, shipped
data; ``mended``): "pasword" -> "password", "reqest" -> "request";
"desert" and "dessert" are both words and stay apart. ``typo_pair`` tells the guard where two
words neither dictionary knows are one word typed two ways ("kubernets" / "kubernetes").
Everything is a pure function of the text and shipped data: no floating point, no ``hash()``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources

from gpucache.guard.memo import reader_memo
from gpucache.guard.parsing import TABLE
from gpucache.guard.words import CONFUSABLE, CONFUSABLES, stem

_SEGMENT_END = re.compile(r"[.!?;:]+(?=\s|$)|,(?=\s)|\s+-\s+|\s*—\s*|\n+")
_SPACES = re.compile(r"\s+")
_WORD = re.compile(r"(?<![\w'])[a-z]+(?![\w'])")
_MEND_MIN = 6  # shorter words are too often other words one edit away ("dicts"/"dicks")
# Longer words are left as written: no dictionary word is within one edit of them (the longest
# is 45 letters), and the candidates one edit from a word of n letters are 54n strings of n
# letters each (a 20,000-letter word would be gigabytes), so neither they nor their mending are
# ever computed or kept in the memo.
MEND_MAX_LETTERS = 64
MAX_MEND_CHARS = 20_000  # longer prompts are embedded as written: mending is per word


def _patterns(name: str, text: str | None = None) -> list[re.Pattern[str]]:
    """framing.txt's (or ``text``'s) section ``name``: one regular expression a line, matched
    whole."""
    if text is None:
        text = resources.files(__package__).joinpath("framing.txt").read_text("utf-8")
    lines: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1] == name
            continue
        line = line.strip()
        if inside and line and not line.startswith("#"):
            lines.append(line)
    return [re.compile(p) for p in lines]


def _shorthand(text: str | None = None) -> dict[str, str]:
    """shorthand.txt (or ``text`` in its form): "written as, meant as" a line; matched as whole
    words, case aside."""
    if text is None:
        text = resources.files(__package__).joinpath("shorthand.txt").read_text("utf-8")
    pairs: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        short, sep, long_ = (part.strip() for part in line.partition(","))
        if not sep or not short or not long_:
            raise ValueError(f"shorthand.txt line {n}: expected 'short, long': {line!r}")
        pairs[short.casefold()] = long_
    return pairs


SEGMENTS = _patterns("segment")  # a whole segment that is framing: dropped at either end
LEADS = _patterns("lead")  # framing that opens the first segment kept: cut off its front
TAILS = _patterns("tail")  # framing that closes the last segment kept: cut off its end
SHORTHAND = _shorthand()
_SHORT = re.compile(
    r"(?<![\w/])("
    + "|".join(re.escape(s) for s in sorted(SHORTHAND, key=len, reverse=True))
    + r")(?![\w/'’])",
    re.IGNORECASE,
)


# "2" and "4" typed for "to" and "for", read so only where no count can stand: after words that
# take "to" before a verb ("how 2 fix", "trying 2 shoot") and before a determiner or a pronoun
# ("4 the environment", "2 my boss"). "need 2 eggs", "add 4 cups" and "2 kg" stay numbers.
_TAKES_TO = ("how", "want", "wants", "wanted", "trying", "try", "tried", "going", "able", "way", "ways")
_DETERMINERS = (
    "the",
    "my",
    "your",
    "our",
    "their",
    "his",
    "her",
    "this",
    "that",
    "these",
    "those",
    "me",
    "us",
    "them",
    "him",
    "next",
)
# nouns a number follows as a label, not a count ("chapter 2 the ending")
_NUMBERED = frozenset(
    "chapter step part page section version level season episode grade type room act "
    "scene figure table question exercise problem phase stage round lesson unit day week "
    "year volume book route gate platform terminal line floor number no".split()
)
# ... and before a verb: a word in lowercase letters that is no plural ("want 2 tickets") and
# no measure ("going 2 km"); a verb's base form ends in "s" only as "ss" or "us" ("2 discuss")
_TO_AFTER = re.compile(
    r"\b((?i:" + "|".join(_TAKES_TO) + r")) 2(?= (?:[a-z]*(?:ss|us)|[a-z]*[a-rt-z])\b)"
    r"(?! (?:kg|km|mi|lb|oz|ft|in|cm|mm|ml|min|hr|hour|day|week|month|year|dozen|"
    r"hundred|thousand|million|more|less|extra|other|of|or|and|to)\b)"
)
_BEFORE_DETERMINER = re.compile(
    r"(?<![\w.,/-])([24])(?= (?:" + "|".join(_DETERMINERS) + r")\b)", re.IGNORECASE
)


def _numeral_word(m: re.Match[str], text: str) -> str:
    """ "for" or "to" for a "4" or "2" before a determiner, unless a label's noun or another
    number comes before it ("chapter 2 the ending", "1, 2 the ...")."""
    before = text[: m.start()].rstrip()
    last = before.rsplit(None, 1)[-1].casefold() if before else ""
    if last in _NUMBERED or last.isdigit() or last.endswith(","):  # "chapter,": a list too
        return m.group(1)
    return "for" if m.group(1) == "4" else "to"


def expand_shorthand(text: str) -> str:
    """Shorthand written out as the words it stands for ("u" -> "you", "w/o" -> "without",
    "how 2 fix" -> "how to fix")."""
    text = _TO_AFTER.sub(lambda m: m.group(1) + " to", text)
    text = _BEFORE_DETERMINER.sub(lambda m: _numeral_word(m, text), text)
    return _SHORT.sub(lambda m: SHORTHAND[m.group(1).casefold()], text)


def _framing(segment: str) -> bool:
    s = _SPACES.sub(" ", segment.strip().casefold()).strip(" ,.!?;:-—()")
    return not s or any(p.fullmatch(s) for p in SEGMENTS)


def strip_framing(text: str) -> str:
    """The text less the framing segments at its start and end and the framing phrases that
    open or close what is left; the text itself where nothing would be left."""
    cuts = [0]
    for m in _SEGMENT_END.finditer(text):
        cuts.append(m.end())
    if cuts[-1] != len(text):
        cuts.append(len(text))
    segments = [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]
    lo, hi = 0, len(segments)
    while lo < hi and _framing(text[segments[lo][0] : segments[lo][1]]):
        lo += 1
    while hi > lo and _framing(text[segments[hi - 1][0] : segments[hi - 1][1]]):
        hi -= 1
    if lo == hi:
        return text.strip()
    kept = text[segments[lo][0] : segments[hi - 1][1]].strip()
    if hi < len(segments):  # a closing segment cut: the mark that divided it from the request goes
        kept = kept.rstrip(" ,;:-—")
    for _ in range(3):  # "hey can you please tell me how ..." opens with several
        before = kept
        for pattern in LEADS:
            lead = pattern.match(kept.casefold())
            if lead and lead.end() < len(kept):
                kept = kept[lead.end() :].lstrip(" ,:;-")
        for pattern in TAILS:
            tail = pattern.search(kept.casefold())
            if tail and tail.start() > 0:
                kept = kept[: tail.start()].rstrip(" ,;-")
        if kept == before:
            break
    return kept or text.strip()


@lru_cache(maxsize=1)
def dictionary() -> Mapping[str, int]:
    """English words and how often each is seen (pyspellchecker's list, read from its own
    JSON file, never a pickle): about 0.2 s and 20 MB, loaded once, when the verifier is built,
    so that no lookup pays it (``LexicalNearMissVerifier.__init__``)."""
    from spellchecker import SpellChecker

    return dict(SpellChecker(language="en", distance=1).word_frequency.dictionary)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def one_edit(word: str) -> set[str]:
    """Every string one edit away: two neighbouring letters transposed, a letter too many, a
    letter missing, a letter wrong."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    out = {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
    out |= {a + b[1:] for a, b in splits if b}
    out |= {a + c + b for a, b in splits for c in _LETTERS}
    out |= {a + c + b[1:] for a, b in splits if b for c in _LETTERS}
    out.discard(word)
    return out


_RUN = re.compile(r"(.)\1+")
# A doubled letter typed once or a letter typed twice ("adress", "untill") is the commonest slip
# (Damerau 1964; Kukich 1992): such a word counts this many times its frequency.
DOUBLING_WEIGHT = 4
# The likeliest word is taken only where it is at least this many times as likely as the next:
# two words about as likely ("acount": "count" or "account"?) leave the word as written, and the
# guard's ``typo_pair`` still finds it one slip from the other side's word.
CLEAR_LEAD = 2


def likelihood(word: str, candidate: str, frequency: int) -> int:
    """How likely ``candidate`` is what was meant by ``word``, one edit away: how often it is
    seen, times ``DOUBLING_WEIGHT`` where the slip is a doubled letter. Integers only, so the
    choice is the same on every machine."""
    doubling = len(candidate) != len(word) and _RUN.sub(r"\1", candidate) == _RUN.sub(r"\1", word)
    return frequency * (DOUBLING_WEIGHT if doubling else 1)


@lru_cache(maxsize=1)
def _rarest() -> int:
    """The least count in the word list: more than half its words have it, and a word seen no
    more often than that ("compossible", "reest") is too rare to be what a slip was meant as; the
    word is left as written, and the guard still pairs it with the other side's (``typo_pair``)."""
    return min(dictionary().values())


@reader_memo(65536)
def mended(word: str) -> str:
    """The word, or where it is in no dictionary the likeliest dictionary word one edit away
    (``likelihood``) and seen more often than the rarest (``_rarest``), where it is clearly the
    likeliest (``CLEAR_LEAD``): "reqest" is "request", not the rarer "reest" that a letter
    dropped would also give."""
    if (
        not _MEND_MIN <= len(word) <= MEND_MAX_LETTERS
        or not word.isalpha()
        or word in dictionary()
        or word in CONFUSABLES
        or (stem(word),) in TABLE
    ):  # a spelling the interchangeable table knows
        return word
    freq = dictionary()
    rare = _rarest()
    ranked = sorted(
        (-likelihood(word, w, freq[w]), w)
        for w in one_edit(word)
        if freq.get(w, rare) > rare and w not in CONFUSABLES
    )
    if not ranked or (len(ranked) > 1 and -ranked[1][0] * CLEAR_LEAD > -ranked[0][0]):
        return word
    return ranked[0][1]


_TYPO_MIN = 5


@reader_memo(65536)
def typo_pair(x: str, y: str) -> bool:
    """Whether ``x`` and ``y`` are one word typed two ways: one edit apart (a letter added,
    dropped, changed, or two transposed), five letters or more, at least one of them in no
    dictionary, and not a known confusable pair."""
    if min(len(x), len(y)) < _TYPO_MIN or not (x.isalpha() and y.isalpha()):
        return False
    if y in CONFUSABLE.get(x, ()):
        return False
    words = dictionary()
    if x in words and y in words:
        return False
    return one_edit_apart(x, y)


def one_edit_apart(x: str, y: str) -> bool:
    if abs(len(x) - len(y)) > 1:
        return False
    if len(x) == len(y):
        diff = [i for i in range(len(x)) if x[i] != y[i]]
        return len(diff) == 1 or (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and x[diff[0]] == y[diff[1]]
            and x[diff[1]] == y[diff[0]]
        )
    short, long_ = (x, y) if len(x) < len(y) else (y, x)
    i = 0
    while i < len(short) and short[i] == long_[i]:
        i += 1
    return short[i:] == long_[i + 1 :]


def mend_spelling(text: str) -> str:
    """Lowercase words in no dictionary replaced by the word one edit away ("recieve")."""
    if len(text) > MAX_MEND_CHARS:
        return text
    return _WORD.sub(lambda m: m[0] if len(m[0]) > MEND_MAX_LETTERS else mended(m[0]), text)


MEMO_MAX_CHARS = 4096  # longer prompts are read in full each time, never kept in the memo


def request_text(prompt: str) -> str:
    """What the prompt asks: shorthand written out, framing at its ends dropped, misspellings
    mended. The semantic tier embeds this; the guard compares it. Memoised for prompts of
    ordinary length."""
    if len(prompt) > MEMO_MAX_CHARS:
        return _request_text(prompt)
    return request_memo(prompt)


# Country codes written in capitals, which a lowercase reading would take for words ("from the
# US to Canada": "us" is a pronoun)
_CAPITAL_CODES = re.compile(r"\b(?:U\.S\.A?\.?|US|USA|U\.K\.|UK)(?![\w.])(?!\s+dollars?\b)")


def _request_text(prompt: str) -> str:
    if len(prompt) > MAX_MEND_CHARS:
        return prompt
    prompt = _CAPITAL_CODES.sub(lambda m: "UK" if "K" in m.group(0) else "USA", prompt)
    return mend_spelling(strip_framing(expand_shorthand(prompt)))


request_memo = reader_memo(4096)(_request_text)


# This module's memos, which ``lexical.clear_caches`` empties (the dictionary, loaded once per
# process, is not one of them).
MEMOS = (request_memo, mended, typo_pair)
