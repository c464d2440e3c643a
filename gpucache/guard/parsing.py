"""How the lexical verifier reads a prompt: the table of interchangeable words
(interchangeable.txt), the normaliser and tokeniser, numbers, and ``parse``: a prompt's content
words, numbers, polar and directional words and their positions, memoised. Everything is a pure
function of the text: no floating point, no ``hash()``, no torch. The word lists are in
words.py; the rules that judge two parsed prompts in lexical.py and shapes.py.
"""

from __future__ import annotations

import re
import unicodedata
from importlib import resources
from typing import NamedTuple

from gpucache.guard.memo import reader_memo
from gpucache.guard.words import (
    DIRECTIONAL,
    FRAMING,
    MAX_PHRASE_WORDS,
    NEGATIONS,
    NUMBER_WORDS,
    ORDINAL_WORDS,
    POLAR,
    SCALES,
    SOFT_NUMBERS,
    SPECIAL,
    STOPWORDS,
    TABLE_FILE,
    stem,
)

_SUFFIXES = {"k": "thousand", "bn": "billion"}  # not "m": metres as often as millions
_SCALED = re.compile(r"(\d+(?:\.\d+)?)(k|bn)")
_PLAIN = re.compile(r"\d+(?:\.\d+)?")
_TOKEN = re.compile(r"[^\W_]+(?:['.][^\W_]+)*|\^\d+|[$€£¥₹%#+@&]")
_POWER = re.compile(r"\s*(?:\^|\*\*)\s*(\d+)")  # "x^2", "x ** 2" -> "x ^2"
_SUPERSCRIPTS = str.maketrans({"²": " ^2", "³": " ^3"})
_DIGITS = re.compile(r"\d+(?:\.\d+)?")
_ORDINAL = re.compile(r"^(\d+)(?:st|nd|rd|th)$")
_GROUPED = re.compile(r"(?<=\d)[,_ ](?=\d{3}\b)")
_ORDINAL_NAMES = {number[1:]: word for word, number in ORDINAL_WORDS.items()}  # "1" -> "first"
_QUOTES = str.maketrans({"’": "'", "‘": "'", "`": "'", "´": "'"})


def parse_table(text: str) -> dict[tuple[str, ...], str]:
    """The interchangeable-words table: each entry, as its tuple of stemmed words, -> the token
    its class is read as (the first entry, its words joined by "_").

    One class per line, entries separated by commas, "#" starts a comment. A word or phrase in
    two classes is an error: its reading would depend on the order of the file.
    """
    table: dict[tuple[str, ...], str] = {}
    where: dict[tuple[str, ...], int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.partition("#")[0].strip()
        if not line:
            continue
        entries = [e.strip().casefold() for e in line.split(",")]
        if len(entries) < 2 or not all(entries):
            raise ValueError(f"table line {n}: a class needs two or more entries: {line!r}")
        canonical = "_".join(entries[0].split())
        for entry in entries:
            key = tuple(stem(w) for w in entry.split())
            if not 1 <= len(key) <= MAX_PHRASE_WORDS:
                raise ValueError(f"table line {n}: {entry!r} has more than {MAX_PHRASE_WORDS} words")
            if key in where and where[key] != n:
                raise ValueError(f"table line {n}: {entry!r} is already in the class on line {where[key]}")
            where[key] = n
            table[key] = canonical
    return table


TABLE = parse_table(resources.files(__package__).joinpath(TABLE_FILE).read_text("utf-8"))
PHRASE_STARTS = frozenset(key[0] for key in TABLE if len(key) > 1)
# The framing words as the rules see them: stemmed and read through the table ("show" is
# read as "demonstrate").
FRAMING_READ = frozenset(TABLE.get((stem(w),), stem(w)) for w in FRAMING)
EXPOSITION = frozenset(TABLE.get((stem(w),), stem(w)) for w in "explain tell summarize define".split())
stem_memo = reader_memo(65536)(stem)
MEMO_MAX_TOKEN = 64  # longer tokens are read in full each time, never kept in a memo


def _stem(tok: str) -> str:
    return stem_memo(tok) if len(tok) <= MEMO_MAX_TOKEN else stem(tok)


def _read_through_table(tokens: list[str]) -> list[str]:
    """Tokens with every table entry replaced by its class's token, longest phrase first."""
    out: list[str] = []
    i, n = 0, len(tokens)
    while i < n:
        tok = tokens[i]
        stemmed = _stem(tok)
        width, canonical = 1, TABLE.get((stemmed,), tok)
        if stemmed in PHRASE_STARTS:
            for wide in range(min(MAX_PHRASE_WORDS, n - i), 1, -1):
                phrase = TABLE.get(tuple(map(_stem, tokens[i : i + wide])))
                if phrase is not None:
                    width, canonical = wide, phrase
                    break
        out.append(canonical)
        i += width
    return out


class Parsed(NamedTuple):
    """A prompt reduced to what the rules compare."""

    tokens: tuple[str, ...]  # every token, stemmed, negations folded to "not" (equal: identical)
    surface: frozenset[str]  # every token as the table reads it, and as written stemmed (antonyms)
    content: tuple[str, ...]  # tokens that are not stopwords, negations or directional words
    core: tuple[str, ...]  # content less the polarity words, sorted
    bag: tuple[str, ...]  # content, sorted (a multiset compared in one tuple comparison)
    directions: tuple[str, ...]  # the directional words that have an object, sorted
    skeleton: tuple[str, ...]  # content and directional words, in order
    numbers: tuple[str, ...]  # sorted normalised numbers (hard)
    soft_numbers: tuple[str, ...]  # numbers from words that are also pronouns ("one")
    negated: bool  # a negation anywhere
    polarity: tuple[tuple[int, int], ...]  # sorted (pair, pole)
    attachments: tuple[tuple[str, str], ...]  # sorted (directional word, its object)


def _canonical(tok: str) -> str:
    """The form a token is compared in: numbers by value, other words stemmed."""
    if tok in NUMBER_WORDS:
        return NUMBER_WORDS[tok]
    if _DIGITS.fullmatch(tok):
        return _number(tok)
    scaled = _SCALED.fullmatch(tok)
    if scaled:  # "10k" is the number 10000 wherever it is compared
        return _scaled(scaled.group(1), SCALES[_SUFFIXES[scaled.group(2)]])
    ordinal = _ORDINAL.match(tok)
    if ordinal:  # "1st" is the word "first" to every rule, as both are #1 to the numbers rule
        return _ORDINAL_NAMES.get(_number(ordinal.group(1)), tok)
    if tok in SPECIAL or tok in STOPWORDS:
        return tok
    return stem(tok)


def _number(text: str) -> str:
    """A number as written (digits, at most one point: ``_DIGITS``) in its canonical form:
    "007" and "7.0" are "7", "10.50" is "10.5". Exact string work, so the result is the same
    in every thread and on every interpreter, whatever its length: no ``decimal`` context
    (whose precision is the calling thread's, 28 digits unless changed) and no ``int()``
    (refused past the interpreter's digit limit). Digits of any script read as their value."""
    if not text.isascii():
        text = "".join(ch if ch == "." else str(unicodedata.decimal(ch)) for ch in text)
    whole, _, fraction = text.partition(".")
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


def _scaled(text: str, scale: int) -> str:
    """The number ``text`` times ``scale``, a power of ten (``SCALES``), exactly: its point
    moved right."""
    shift = len(str(scale)) - 1
    whole, _, fraction = _number(text).partition(".")
    fraction = fraction.ljust(shift, "0")
    return _number(f"{whole}{fraction[:shift]}.{fraction[shift:]}")


# What a token is to the rules; "without" is directional ("coffee with/without sugar") and
# not counted as a negation.
_CONTENT, _DIRECTIONAL, _NEGATION, _STOPWORD = "content", "directional", "negation", "stopword"
_TokenInfo = tuple[str, tuple[str, ...], bool, str, tuple[tuple[int, int], ...]]


def _token_uncached(tok: str) -> _TokenInfo:
    """(canonical form, numbers it carries, whether they are soft, its kind, its polarity
    poles) of one token. Memoised for ordinary words (``token_memo``), since prompts reuse a
    small vocabulary and this is the inner loop of parsing."""
    canonical = _canonical(tok)
    if canonical in DIRECTIONAL:
        kind = _DIRECTIONAL
    elif canonical in NEGATIONS:
        kind = _NEGATION
    elif canonical in STOPWORDS:
        kind = _STOPWORD
    else:
        kind = _CONTENT
    polar = tuple(POLAR.get(canonical, ()))
    if tok.startswith("^"):  # a power: "^2" is "squared", never the number 2
        return canonical, (tok,), False, kind, polar
    if canonical in ORDINAL_WORDS:  # "first", and "1st" read as it; "11th" is the number 11
        return canonical, (ORDINAL_WORDS[canonical],), False, kind, polar
    if tok in SOFT_NUMBERS:
        return canonical, (NUMBER_WORDS[tok],), True, kind, polar
    if tok in NUMBER_WORDS:
        return canonical, (NUMBER_WORDS[tok],), False, kind, polar
    if not tok.isalpha():
        if _SCALED.fullmatch(tok):  # "10k", "2bn": read (``_canonical``) as the number it scales to
            return canonical, (canonical,), False, kind, polar
        return canonical, tuple(_number(d) for d in _DIGITS.findall(tok)), False, kind, polar
    return canonical, (), False, kind, polar


MEMO_MAX_CHARS = 4096  # longer prompts are parsed in full each time, never kept in the memo


def parse(prompt: str, table: bool = True) -> Parsed:
    """The parsed prompt, read through the table of interchangeable words unless ``table`` is
    False; memoised for prompts of ordinary length only, so a few megabyte-long prompts cannot
    pin gigabytes in the memo."""
    if len(prompt) > MEMO_MAX_CHARS:
        return _parse_uncached(prompt, table)
    return parse_memo(prompt, table)


def _parse_uncached(prompt: str, table: bool) -> Parsed:
    if prompt.isascii():
        norm = prompt.casefold()
    else:
        norm = unicodedata.normalize("NFKC", prompt.translate(_SUPERSCRIPTS))
    norm = _POWER.sub(r" ^\1", _GROUPED.sub("", norm.translate(_QUOTES).casefold()))
    raw = _TOKEN.findall(norm)
    if "'" in norm:
        raw = _split_contractions(raw)
    return _build(_read_through_table(raw) if table else raw, raw)


parse_memo = reader_memo(4096)(_parse_uncached)
token_memo = reader_memo(65536)(_token_uncached)
MEMOS = (parse_memo, token_memo, stem_memo)  # which ``lexical.clear_caches`` empties


# What follows an apostrophe and only marks a verb or an owner ("it's", "we're", "I'd", "Anna's"):
# read away, as the written-out forms' "is", "are", "would" are stopwords.
_VERB_OR_OWNER = frozenset({"s", "re", "ve", "ll", "d", "m"})


def _split_contractions(raw: list[str]) -> list[str]:
    """The tokens with a contraction read as its written-out words: "can't" is "can not"; a
    tail that marks a verb or an owner goes, and any other part stays a word of its own."""
    tokens: list[str] = []
    for tok in raw:
        if tok.endswith("n't"):
            base = {"ca": "can", "wo": "will", "sha": "shall"}.get(tok[:-3], tok[:-3])
            if base:
                tokens.append(base)
            tokens.append("not")
            continue
        head, *tails = tok.split("'")  # "rock'n'roll" is three words; "they'd've", one
        tokens.append(head)
        tokens.extend(tail for tail in tails if tail not in _VERB_OR_OWNER)
    return tokens


# Number words below a hundred, by value: the words a number written in words is built from
_BELOW_HUNDRED = {w: int(v) for w, v in NUMBER_WORDS.items() if v.isdigit() and int(v) < 100}


def _in_words(run: tuple[int, int] | None, tok: str) -> tuple[int, int] | None:
    """A number written in words, read one word at a time: ``run`` is (the thousands and more
    so far, the part below them) and the result the same with ``tok`` read in, or None where
    ``tok`` does not go on with it (``run`` None: where ``tok`` does not start one). "twenty
    five" is 25, "two hundred fifty" 250, "two thousand five" 2005, "twenty five hundred" 2500;
    "twenty twenty", "ten five" and "five twenty" stay two numbers, as they are said."""
    below, scale = _BELOW_HUNDRED.get(tok), SCALES.get(tok)
    if run is None:
        if below is not None:
            return 0, below
        return (0, scale) if scale == 100 else (scale, 0) if scale else None
    total, current = run
    if below is not None:
        if below and (total or current) and current % 100 == 0:  # "two hundred fifty", "two thousand five"
            return total, current + below
        if 0 < below < 10 and current % 100 >= 20 and current % 10 == 0:  # "twenty five"
            return total, current + below
        return None
    if scale == 100 and 0 < current < 100:
        return total, current * 100
    if scale and scale > 100 and current:
        return total + current * scale, 0
    return None


def _build(tokens: list[str], written: list[str]) -> Parsed:
    """One pass over the tokens (read through the table; ``written`` are the tokens before
    that, kept for the antonym lists): this runs once per new prompt on every candidate check."""
    numbers: list[str] = []
    soft: list[str] = []
    stemmed: list[str] = []
    content: list[str] = []
    skeleton: list[str] = []
    attachments: list[tuple[str, str]] = []
    polarity: list[tuple[int, int]] = []
    pending: list[str] = []  # directional words waiting for their object
    negated = False
    after_number = False  # the token before was a number and nothing else ("10" of "10 thousand")
    run: tuple[int, int] | None = None  # a number being written in words ("two hundred and five")
    held_and = False  # an "and" inside that number, kept back until the next word says so
    run_is_soft = False  # that number is so far "one", read as a soft number (also a pronoun)

    def rewrite(value: str) -> None:
        """The number just read, and the content word it is, made ``value``."""
        old = content[-1]
        numbers[-1] = stemmed[-1] = content[-1] = skeleton[-1] = value
        attachments[:] = [(d, value if o == old else o) for d, o in attachments]

    for tok in tokens:
        canonical, hard, is_soft, kind, polar = (
            token_memo(tok) if len(tok) <= MEMO_MAX_TOKEN else _token_uncached(tok)
        )
        if tok == "and" and run is not None and run[1] % 100 == 0 and not held_and:
            held_and = True  # "one hundred and five": one number if a number word follows
            continue
        longer = _in_words(run, tok) if run is not None else None
        if longer is not None and (not held_and or tok in _BELOW_HUNDRED):
            run, held_and = longer, False
            if run_is_soft:  # "one hundred": "one" is no pronoun after all
                soft.pop()
                numbers.append(content[-1])
                run_is_soft = False
            rewrite(str(sum(run)))  # (after_number is read only once the run has ended)
            continue
        if held_and:
            stemmed.append("and")
            held_and = False
        if after_number and run is None and tok in SCALES:
            # "ten thousand" is 10000, as "10,000" and "10k" are, and "two hundred thousand" is
            # 200000; "a thousand" stays 1000. The number before is rewritten in place: one
            # number, one word, to every rule; it is still a number a scale can follow
            numbers[-1] = stemmed[-1] = content[-1] = skeleton[-1] = _scaled(numbers[-1], SCALES[tok])
            continue
        stemmed.append(canonical)
        if hard:
            (soft if is_soft else numbers).extend(hard)
        after_number = (
            hard == (canonical,)
            and not is_soft
            and kind == _CONTENT
            and _PLAIN.fullmatch(canonical) is not None
        )
        run = _in_words(None, tok)  # a number word: content, read as its own number (a test holds it)
        run_is_soft = run is not None and is_soft
        if polar:
            polarity += polar
        if kind == _CONTENT:
            content.append(canonical)
            skeleton.append(canonical)
            if pending:
                attachments += [(d, canonical) for d in pending]
                pending = []
        elif kind == _DIRECTIONAL:
            pending.append(canonical)
            skeleton.append(canonical)
        elif kind == _NEGATION:
            negated = True
    if held_and:
        stemmed.append("and")
    bag = sorted(content)
    return Parsed(
        tokens=tuple(stemmed),
        # a word the table reads as another is still its own antonym ("decrease" is read as
        # "reduce"; "increase" / "decrease" are opposites); a word as written stemmed finds its
        # pair in any form ("starts" / "stop")
        surface=frozenset(tokens).union(map(_stem, written)),
        content=tuple(content),
        core=tuple(t for t in bag if t not in POLAR),
        bag=tuple(bag),
        directions=tuple(sorted(d for d, _ in attachments)),
        skeleton=tuple(skeleton),
        numbers=tuple(sorted(numbers)),
        soft_numbers=tuple(sorted(soft)),
        negated=negated,
        polarity=tuple(sorted(polarity)),
        attachments=tuple(sorted(attachments)),
    )


def numbers_of(p: Parsed, other: Parsed) -> tuple[str, ...]:
    """The numbers of ``p`` the numbers rule compares with ``other``'s. A soft number ("one",
    also a pronoun) counts only where the hard numbers differ, so that "one" can stand for a
    "1" the other side writes, while "buy a new one" beside the same "8 GB" and "2015" stays a
    pronoun."""
    if p.numbers != other.numbers and (other.numbers or other.soft_numbers):
        return _cardinal(tuple(sorted(p.numbers + p.soft_numbers)), other)
    return _cardinal(p.numbers, other)


def _cardinal(numbers: tuple[str, ...], other: Parsed) -> tuple[str, ...]:
    """An ordinal compared as its number where the other prompt writes that number plainly
    ("chapter 1" / "the first chapter", "world war 2" / "the second world war")."""
    plain = set(other.numbers) | set(other.soft_numbers)
    return tuple(sorted(n[1:] if n.startswith("#") and n[1:] in plain else n for n in numbers))


def exchanged(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, str] | None:
    """The two words, if b is a with exactly two single words exchanged ("dog bites man").

    A phrase moved as a unit ("from London" to the end) is not an exchange: a rewording does
    that. Two words trading places while the frame around them stays is a different question.
    """
    if len(a) != len(b):
        return None
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(diff) == 2:
        i, j = diff
        if a[i] == b[j] and a[j] == b[i]:
            return a[i], a[j]
    return None
