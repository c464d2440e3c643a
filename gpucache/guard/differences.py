"""What differs between two prompts, once their words are matched to each other.

``align`` matches the two prompts' content words (same word, stem, the interchangeable table,
a misspelling: a word in no dictionary one edit from the other side's word) and returns a
``Difference``: the words left unmatched on each side, in order, and how many were matched. The
named checks below read that difference, not the shape of the edit: an entity, a deliverable,
an audience, a tone, a time or a qualifier only one side has (or each side has another of), a
confusable word, a sign, a relation (roles.py: a role exchanged across the voice of a verb, a
word hanging from another head). Everything
here is a pure function of the two texts and shipped data: no floating point, no ``hash()``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import NoReturn

from gpucache.guard.memo import reader_memo
from gpucache.guard.parsing import FRAMING_READ, TABLE, Parsed
from gpucache.guard.request import typo_pair
from gpucache.guard.words import ORDINAL_WORDS, stem

CATEGORY_FILE = "categories.txt"
# The kinds of words that name what a request is for, in the order they are reported.
KINDS = ("entity", "deliverable", "audience", "tone", "time", "constraint")
# Words that open a span restricting a request ("without eggs", "for a vegan", "on Windows",
# "that sounds French", "under 100 words"): a span of content words only one prompt has, opened
# by one of these, is a qualifier the other does not ask for.
RESTRICTORS = frozenset("without except excluding only under below within fewer less".split())
# Words that open a qualifier only where it closes the request and is all one prompt adds
# ("how do I bake bread in a cast iron pot", "a story about a knight who fears the dark"):
# in the middle of a prompt they are how people put the same request.
TRAILING_RESTRICTORS = frozenset("for in on with using that which who whose where when while and".split())
_SIGNED = re.compile(r"(?<![\w)\].])(-|−|minus |negative )?(\d+(?:\.\d+)?)")
_PERCENT_OF = re.compile(r"\d(?:[\d.,]*)\s*(?:%|percent|per cent)\s+of\b")
_WHAT_PERCENT = re.compile(r"\bwhat\s+(?:%|percent|per cent|percentage)\b")
_CAPITAL = re.compile(r"(?<=[^\s.!?:;\"'(\[])\s+([A-Z][\w'+#.-]*)")


def _categories(text: str | None = None) -> dict[str, frozenset[str]]:
    """categories.txt (or ``text`` in its form): each kind's words, stemmed and read through
    the table as a prompt's words are."""
    if text is None:
        text = resources.files(__package__).joinpath(CATEGORY_FILE).read_text("utf-8")
    kinds: dict[str, set[str]] = {}
    kind = None
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("[") != line.endswith("]"):
            raise ValueError(f"{CATEGORY_FILE}: a section's name is bracketed at both ends: {line}")
        if line.startswith("["):
            kind = line[1:-1]
            if kind not in KINDS:
                raise ValueError(f"{CATEGORY_FILE}: unknown section [{kind}]")
            kinds[kind] = set()
        elif line and kind is not None:
            for word in line.split():
                key = (stem(word.casefold()),)
                kinds[kind].add(TABLE.get(key, key[0]))
    return {k: frozenset(v) for k, v in kinds.items()}


CATEGORIES = _categories()
KIND_OF: dict[str, str] = {}
for _kind in reversed(KINDS):  # a word in two lists is reported as the earlier kind
    for _w in CATEGORIES.get(_kind, ()):
        KIND_OF[_w] = _kind


@dataclass(frozen=True)
class Difference:
    """The content words of each prompt that the other does not match, in order (framing
    words set aside), and how many words were matched."""

    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    shared: int
    framed: int = 0  # shared words counting the framing words ("explain")

    @property
    def near_identical(self) -> bool:
        """At most two words differ on each side beside at least one shared (a framing word
        counts here: "explain what a mutex is" / "... a semaphore is"): the band where the
        founding rules judge the edit's shape (a substitution, a word added)."""
        return max(self.shared, self.framed) >= 1 and len(self.only_a) <= 2 and len(self.only_b) <= 2


def _counted(w: str) -> bool:
    """Whether a content word is compared here: framing is not, nor a number or an ordinal,
    which the numbers rule has compared by value ("chapter 1" / "the first chapter")."""
    return w not in FRAMING_READ and not w[:1].isdigit() and w not in ORDINAL_WORDS


class Counts(Counter[str]):
    """Counts kept in a memo, so shared by every caller: read-only (``-`` and ``&`` give new ones)."""

    def __init__(self, words: Iterable[str]) -> None:
        dict.update(self, Counter(words))

    def _read_only(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("memoised counts are read-only")

    __setitem__ = __delitem__ = update = subtract = clear = pop = popitem = setdefault = _read_only
    __iadd__ = __isub__ = __iand__ = __ior__ = _read_only


@reader_memo(8192)
def _counts(content: tuple[str, ...]) -> tuple[Counts, Counts]:
    """A prompt's content words as counts: all of them, and those set aside from framing."""
    return Counts(content), Counts(w for w in content if w not in FRAMING_READ)


def align(a: Parsed, b: Parsed) -> Difference:
    every_a, ca = _counts(a.content)
    every_b, cb = _counts(b.content)
    left_a = Counter({w: n for w, n in (ca - cb).items() if _counted(w)})
    left_b = Counter({w: n for w, n in (cb - ca).items() if _counted(w)})
    return Difference(
        tuple(_in_order(a.content, left_a)),
        tuple(_in_order(b.content, left_b)),
        sum((ca & cb).values()),
        sum((every_a & every_b).values()),
    )


def _in_order(content: tuple[str, ...], left: Counter[str]) -> list[str]:
    if not left:
        return []
    out, todo = [], Counter(left)
    for w in reversed(content):  # the last occurrences are the unmatched ones
        if todo[w] > 0:
            out.append(w)
            todo[w] -= 1
    return out[::-1]


_WORDS = re.compile(r"[^\W\d_]+")


@reader_memo(4096)
def _word_set(text: str) -> frozenset[str]:
    return frozenset(_WORDS.findall(text.casefold()))


def reconcile(a: str, b: str) -> tuple[str, str]:
    """The two texts with each misspelt word written as the other side's word it stands for
    ("kubernets" / "kubernetes": neither in the dictionary, so request.py did not mend them).
    Bounded: only words one side has and the other lacks are compared."""
    wa, wb = _word_set(a), _word_set(b)
    only_a, only_b = sorted(wa - wb), sorted(wb - wa)
    if not only_a or not only_b or len(only_a) * len(only_b) > 400:
        return a, b
    mapping = {}
    for x in only_b:
        for y in only_a:
            if typo_pair(x, y):
                mapping[x] = y
                break
    if not mapping:
        return a, b
    # whole words only, so no word of the mapping can match inside a longer one, whatever order
    # they are tried in; as typed, in any case
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, mapping)) + r")\b", re.IGNORECASE)
    return a, pattern.sub(lambda m: mapping[m.group(1).casefold()], b)


@reader_memo(4096)
def signed_numbers(text: str) -> tuple[str, ...]:
    """The numbers written with a sign ("-1", "minus 3"), as "-N", sorted."""
    return tuple(sorted(f"-{m.group(2)}" for m in _SIGNED.finditer(text.casefold()) if m.group(1)))


def percent_relation(a: str, b: str) -> bool:
    """ "20 percent of 50" against "what percentage of 50 is 20": the same numbers, the
    percentage asked in one and given in the other."""
    a, b = a.casefold(), b.casefold()
    return bool(
        (_PERCENT_OF.search(a) and _WHAT_PERCENT.search(b) and not _WHAT_PERCENT.search(a))
        or (_PERCENT_OF.search(b) and _WHAT_PERCENT.search(a) and not _WHAT_PERCENT.search(b))
    )


def coordination_changed(a: Parsed, b: Parsed) -> bool:
    """The same two words joined by "and" in one prompt and by "or" in the other ("rows where
    x and y" / "x or y", "on PS5 and PC" / "on PS5 or PC")."""

    def joins(p: Parsed, word: str) -> set[tuple[str, str]]:
        t = p.tokens
        return {(t[i - 1], t[i + 1]) for i in range(1, len(t) - 1) if t[i] == word}

    return bool(joins(a, "and") & joins(b, "or") or joins(a, "or") & joins(b, "and"))


@reader_memo(4096)
def capitalised(text: str) -> frozenset[str]:
    """Words written with a capital inside a sentence ("flights to Lyon"): names, as the
    tokens the rules compare (stemmed, read through the table)."""
    out = set()
    for m in _CAPITAL.finditer(text):
        written = m.group(1).strip(".")
        word = written.casefold()
        if written.isupper() and len(written) <= 5:
            continue  # an acronym (HTTP, CSV): a term, which keyword queries often drop
        if word and word != "i":
            key = (stem(word),)
            out.add(TABLE.get(key, key[0]))
    return frozenset(out)


def kind_of(word: str, names: frozenset[str]) -> str | None:
    """The kind of what a request is for that ``word`` names ("formally" as "formal"), if any."""
    if word in names:
        return "entity"
    kind = KIND_OF.get(word)
    if kind is None and word.endswith("ly") and len(word) > 5:
        kind = KIND_OF.get(word[:-2])
    return kind


def named_kinds(words: tuple[str, ...], names: frozenset[str]) -> list[tuple[str, str]]:
    """(kind, word) for each word that names what a request is for."""
    found = []
    for w in words:
        kind = kind_of(w, names)
        if kind is not None:
            found.append((kind, w))
    return found


def restricted_span(p: Parsed, only: tuple[str, ...], *, alone: bool) -> tuple[str, ...]:
    """The words of ``only`` that a restricting word opens ("without eggs", "under 100
    words") in ``p``: the qualifier one prompt adds; where ``alone`` (the other prompt adds
    nothing), also a qualifier that closes the prompt ("in a cast iron pot", "that runs
    Linux"). Empty where the added words stand elsewhere."""
    if not only:
        return ()
    if alone:
        tail = _trailing_span(p, only)
        if tail:
            return tail
    left = Counter(only)
    found: list[str] = []
    opened = False
    for tok in p.tokens:
        if tok in RESTRICTORS:
            opened = True
            continue
        if tok in left and left[tok] > 0:
            if opened:
                found.append(tok)
            left[tok] -= 1
            continue
        if tok in p.content:  # a shared content word closes the span
            opened = False
    return tuple(found)


def _trailing_span(p: Parsed, only: tuple[str, ...]) -> tuple[str, ...]:
    """Every word of ``only``, where they all stand after the last shared content word,
    opened by a restricting word."""
    toks = p.tokens
    left = Counter(only)
    last_shared = -1
    counts = Counter(p.content)
    seen: Counter[str] = Counter()
    for i, t in enumerate(toks):
        if t in counts:
            seen[t] += 1
            if seen[t] > left.get(t, 0):  # more of it than is added: a shared word
                last_shared = i
    after = toks[last_shared + 1 :]
    opener = next((i for i, t in enumerate(after) if t in TRAILING_RESTRICTORS | RESTRICTORS), None)
    first_added = next((i for i, t in enumerate(after) if t in left), None)
    if opener is None or first_added is None or opener > first_added:
        return ()
    found = tuple(t for t in after if t in left)
    return found if Counter(found) == left else ()


_SEGMENTS = re.compile(r"(?<=[.!?;:])\s+|\n+")


@reader_memo(4096)
def segments(text: str) -> tuple[str, ...]:
    """The sentences of a text (split after a sentence mark and a space, or at a new line)."""
    return tuple(s for s in (p.strip() for p in _SEGMENTS.split(text)) if s)


def extra_segments(a: str, b: str, norm) -> tuple[str, tuple[str, ...]] | None:  # type: ignore[no-untyped-def]
    """Where one text is the other with whole sentences more at its start ("lead": context
    told before the request) or at its end ("tail": more asked after it): the side and the
    extra sentences. ``norm`` reads a text as the rules compare it."""
    sa, sb = segments(a), segments(b)
    if len(sa) == len(sb):
        return None
    short, long_ = (sa, sb) if len(sa) < len(sb) else (sb, sa)
    if not short:
        return None
    target = norm(" ".join(short))
    k = len(long_) - len(short)
    if norm(" ".join(long_[k:])) == target:
        return "lead", long_[:k]
    if norm(" ".join(long_[: len(short)])) == target:
        return "tail", long_[len(short) :]
    return None


def differing_segments(a: str, b: str, norm) -> tuple[str, str] | None:  # type: ignore[no-untyped-def]
    """Where the two texts share whole sentences at their start or end and differ in the
    sentences between (a shared question with another closing instruction): the sentences
    that differ, on each side. None where no sentence is shared or one side has none left."""
    sa, sb = segments(a), segments(b)
    lo = 0
    while lo < min(len(sa), len(sb)) and norm(sa[lo]) == norm(sb[lo]):
        lo += 1
    hi = 0
    while hi < min(len(sa), len(sb)) - lo and norm(sa[-1 - hi]) == norm(sb[-1 - hi]):
        hi += 1
    if not lo and not hi:
        return None
    rest_a, rest_b = sa[lo : len(sa) - hi], sb[lo : len(sb) - hi]
    if not rest_a or not rest_b:
        return None
    return " ".join(rest_a), " ".join(rest_b)


# This module's memos, which ``lexical.clear_caches`` empties.
MEMOS = (segments, signed_numbers, capitalised, _counts, _word_set)
