"""The words the lexical verifier knows, and how it reads a prompt.

Word lists (stopwords, negations, polarity axes, antonyms, interchangeable classes, directional
words, number words), the normaliser and tokeniser, the light stemmer, and ``_parse``: a
prompt's content words, numbers, polar and directional words and their positions, memoised.
Everything is a pure function of the text: no floating point, no ``hash()``, no torch.
The rules that judge two parsed prompts are in lexical.py.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from importlib import resources
from typing import NamedTuple

# Words that carry no question of their own: articles, auxiliaries, pronouns, politeness, and
# the framing wh-words ("how do I" / "what is the way to" / "which is"). Negations, polarity and
# directional words, numbers, and the wh-words that change the question (who, when, where, why)
# are deliberately absent.
STOPWORDS = frozenset(
    """
    a an the is are was were be been being am do does did doing done can could would should
    will shall may might must i me my mine myself we us our ours you your yours it its this
    that these those there here he she him her his they them their of please kindly tell let
    know some any just really very so also and or but if then about as at have has had having
    s re ve ll d m t whats possible way ways someone somebody anyone something thing things
    get got getting go going need want like would able actually basically exactly
    what which how
    """.split()
)

NEGATIONS = frozenset(
    "not no non never nor none nothing nobody neither nowhere cannot without".split()
)

# Pairs of opposites that turn one question into another. "to"/"from" style words are common
# in rewordings too, so they only reject when the rest of the content is the same (polarity);
# the strong opposites reject wherever they split across the two prompts (antonym).
POLARITY_AXES: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("to", "into", "onto", "toward", "towards"), ("from",)), (("on",), ("off",)),
    (("with",), ("without",)), (("in", "inside", "into"), ("out", "outside")),
    (("up",), ("down",)), (("before",), ("after",)), (("above",), ("below",)),
    (("over",), ("under",)), (("more",), ("less", "fewer")), (("higher",), ("lower",)),
    (("high",), ("low",)), (("first",), ("last",)), (("left",), ("right",)),
    (("yes",), ("no",)), (("true",), ("false",)), (("front",), ("back",)),
    (("top",), ("bottom",)), (("early",), ("late",)), (("earlier",), ("later",)),
    (("old",), ("new",)), (("older",), ("newer",)), (("big", "large"), ("small", "little")),
    (("bigger", "larger"), ("smaller",)), (("long",), ("short",)), (("longer",), ("shorter",)),
    (("fast",), ("slow",)), (("faster",), ("slower",)), (("hot",), ("cold",)),
    (("plus",), ("minus",)), (("by",), ("about",)),  # poems by / about a poet: author or subject
]
ANTONYM_PAIRS = [
    ("enable", "disable"), ("add", "remove"), ("open", "close"), ("buy", "sell"),
    ("minimum", "maximum"), ("min", "max"), ("start", "stop"), ("import", "export"),
    ("upload", "download"), ("encrypt", "decrypt"), ("encode", "decode"),
    ("increase", "decrease"), ("lock", "unlock"), ("login", "logout"), ("include", "exclude"),
    ("accept", "reject"), ("debit", "credit"), ("deposit", "withdraw"), ("send", "receive"),
    ("push", "pull"), ("install", "uninstall"), ("subscribe", "unsubscribe"),
    ("block", "unblock"), ("connect", "disconnect"), ("show", "hide"), ("freeze", "unfreeze"),
    ("compress", "decompress"), ("mount", "unmount"), ("ascend", "descend"),
    ("ascending", "descending"), ("asc", "desc"), ("north", "south"), ("east", "west"),
    ("best", "worst"), ("better", "worse"), ("cheap", "expensive"), ("cheapest", "expensive"),
    ("win", "lose"), ("gain", "lose"), ("pass", "fail"), ("positive", "negative"),
    ("male", "female"), ("men", "women"), ("man", "woman"), ("boy", "girl"),
    ("advantage", "disadvantage"), ("pro", "con"), ("pros", "cons"), ("legal", "illegal"),
    ("possible", "impossible"), ("like", "dislike"), ("agree", "disagree"),
    ("follow", "unfollow"), ("archive", "unarchive"), ("pause", "resume"),
    ("activate", "deactivate"), ("allow", "deny"), ("allow", "block"), ("sunrise", "sunset"),
    ("morning", "evening"), ("am", "pm"), ("day", "night"), ("summer", "winter"),
    ("spring", "autumn"), ("spring", "fall"), ("import", "export"), ("input", "output"),
    ("client", "server"), ("read", "write"), ("sender", "recipient"), ("buyer", "seller"),
    ("parent", "child"), ("husband", "wife"), ("mother", "father"), ("son", "daughter"),
    ("brother", "sister"), ("past", "future"), ("birth", "death"), ("born", "die"),
    ("love", "hate"), ("rich", "poor"), ("strong", "weak"), ("easy", "hard"),
    ("easiest", "hardest"), ("safe", "dangerous"), ("safe", "unsafe"), ("win", "loss"),
    ("profit", "loss"), ("asset", "liability"), ("income", "expense"), ("borrow", "lend"),
    ("hire", "fire"), ("join", "leave"), ("arrive", "depart"), ("arrival", "departure"),
    ("inbound", "outbound"), ("incoming", "outgoing"), ("upper", "lower"),
    ("uppercase", "lowercase"), ("horizontal", "vertical"), ("vertically", "horizontally"),
    ("row", "column"), ("rows", "columns"), ("ceil", "floor"), ("sum", "difference"),
    ("multiply", "divide"), ("celsius", "fahrenheit"), ("km", "mile"), ("kg", "lb"),
]

# Words that ask the same question in any prompt: swapping one for another of its class is a
# rewording, not a substitution ("the best laptop" / "a good laptop", "movie" / "film"). Short
# on purpose: every other one-word swap still rejects (the seed's conservative default), and a
# class joins only when no question changes with the word. Measured in the false-hit report.
INTERCHANGEABLE_CLASSES = [
    "good best great top nice excellent finest greatest awesome ideal",
    "movie film", "website site", "photo picture pic image", "kid child", "cost price",
    "phone smartphone cellphone mobile", "help assist", "job career", "earn make",
    "learn study", "car vehicle", "email mail", "easiest simplest", "big large huge",
    "biggest largest",
    "small little tiny", "ocean sea",
]
# The table of interchangeable words and phrases (spelling variants, abbreviations and units,
# instruction verbs) is data, shipped beside this module: interchangeable.txt. Unlike the
# classes above, which only exempt a word from the substitution rule, the table rewrites every
# entry to its class's first entry when a prompt is parsed, so every rule reads "colour" and
# "color", "regex" and "regular expression", "x squared" and "x^2" as the same words.
TABLE_FILE = "interchangeable.txt"
MAX_PHRASE_WORDS = 4

# Comparison words that are symmetric: "A vs B" asks what "B vs A" asks. The crossed rule does
# not count shared words that trade sides across one of these.
SYMMETRIC = frozenset({"vs", "versus", "between"})

# Words that join two words symmetrically: "Python or Java" asks what "Java or Python" asks, so
# two words trading places across one of them are not a swapped question.
COORDINATORS = frozenset({"or", "and"})
ARTICLES = frozenset({"a", "an", "the"})

# Words the added rule does not count as an added request when only one prompt has them:
# greetings and politeness, hedges, and the framing of a request ("explain", "tell me",
# "give me some tips on", "what are the steps to"). They change how a request is put, not what
# it asks for; intensifiers and hedges ("so much", "ever", "the main causes"); reflexive
# pronouns; "one" read as a pronoun ("how can one ..."), which the numbers rule judges when it
# is a number. Tuned on the tuning half of the data (bench/guard_tuning.py).
FRAMING = frozenset(
    """
    hi hello hey thanks thank thx pls plz appreciate appreciated grateful cheers help assist
    advance wonder wondering curious question quick mind kindly
    possibly maybe perhaps exactly really still ok okay well anyway now
    explain tell show give provide list define understand figure mean meaning recommend
    convert calculate
    advice tip idea suggestion recommendation instruction step way method
    ever such much else even many main different various think opinion personally honestly
    currently nowadays yourself myself himself herself themselves ourselves yourselves oneself
    1 &
    """.split()
)

# A question and an instruction that ask for one thing ("Who was Napoleon?" / "Tell me about
# Napoleon"): the question's opening words, and the instructions that ask for an exposition.
# The added rule sets the two leading words aside only in that pairing. Stemmed, and read
# through the table (so "describe" is "explain" and "sum up" is "summarize").
QUESTION_OPENERS = frozenset("what who which".split())

# Words whose object says where something goes or comes from: moving a content word across
# one of them changes the question ("10 miles to km" / "10 km to miles").
DIRECTIONAL = frozenset(
    """to from into onto than vs versus per by over under before after above below toward
    towards via against between for in on at with without of as using""".split()
)

NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
NUMBER_WORDS.update(
    thirty="30", forty="40", fifty="50", sixty="60", seventy="70", eighty="80", ninety="90",
    hundred="100", thousand="1000", million="1000000", billion="1000000000",
    trillion="1000000000000", dozen="12", half="0.5", quarter="0.25", twice="x2",
    triple="x3", double="x2",
)
# Words that scale the number before them ("ten thousand"), and the suffixes that do ("10k")
SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_SUFFIXES = {"k": "thousand", "bn": "billion"}  # not "m": metres as often as millions
_SCALED = re.compile(r"(\d+(?:\.\d+)?)(k|bn)")
_PLAIN = re.compile(r"\d+(?:\.\d+)?")
ORDINAL_WORDS = {
    w: f"#{i}"
    for i, w in enumerate(
        "first second third fourth fifth sixth seventh eighth ninth tenth".split(), start=1
    )
}
# "one" is also a pronoun ("how does one learn"); it counts as a number only when the other
# prompt has a number too.
SOFT_NUMBERS = frozenset({"one"})

REORDER_MIN_SHARED = 5
# The added rule: the common prefix and suffix needed before two differing middles count as
# a changed instruction, the most words those middles may share and still count as replaced
# rather than reworded; and the most pairs of unshared words it
# compares for variants (bounded work on megabyte prompts).
ADDED_MIN_SHARED = 3
ADDED_MAX_SHARED_INSIDE = 1
MATCH_MAX_PAIRS = 10_000
# Beyond these sizes the pairwise rules switch to bounded work, so a megabyte prompt is
# still compared in full (numbers, negation, polarity, substitution) in linear-ish time.
LONG_ALIGNMENT = 2000  # tokens in the differing middle before difflib's autojunk heuristic
CROSSED_MAX_SHARED = 200  # shared words the pairwise crossed rule examines

# Wh-words that name what is asked for: "who wrote X" and "when was X published" share every
# other word and still ask different questions.
QUESTION_WORDS = frozenset({"who", "whom", "whose", "when", "where", "why"})

_TOKEN = re.compile(r"[^\W_]+(?:['.][^\W_]+)*|\^\d+|[$€£¥₹%#+@&]")
_POWER = re.compile(r"\s*(?:\^|\*\*)\s*(\d+)")  # "x^2", "x ** 2" -> "x ^2"
_SUPERSCRIPTS = str.maketrans({"²": " ^2", "³": " ^3"})
_DIGITS = re.compile(r"\d+(?:\.\d+)?")
_ORDINAL = re.compile(r"^(\d+)(?:st|nd|rd|th)$")
_GROUPED = re.compile(r"(?<=\d)[,_ ](?=\d{3}\b)")
_QUOTES = str.maketrans({"’": "'", "‘": "'", "`": "'", "´": "'"})

_POLAR: dict[str, list[tuple[int, int]]] = {}
for _axis, _poles in enumerate(POLARITY_AXES):
    for _pole, _words in enumerate(_poles):
        for _w in _words:
            _POLAR.setdefault(_w, []).append((_axis, _pole))
_ANTONYM: dict[str, set[str]] = {}
for _a, _b in ANTONYM_PAIRS:
    _ANTONYM.setdefault(_a, set()).add(_b)
    _ANTONYM.setdefault(_b, set()).add(_a)
_SPECIAL = NEGATIONS | DIRECTIONAL


def _stem(word: str) -> str:
    """Light suffix normalisation: plural and verb endings, enough to match "resets"/"reset"."""
    if len(word) <= 3 or not word.isalpha():
        return word
    for suffix, repl, min_len in (("ies", "y", 5), ("sses", "ss", 5), ("ing", "", 6),
                                  ("ed", "", 5), ("es", "", 5), ("s", "", 4)):
        if word.endswith(suffix) and len(word) >= min_len:
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                return word
            if suffix == "es" and not word.endswith(("ches", "shes", "xes", "zes", "sses")):
                continue
            stem = word[: len(word) - len(suffix)] + repl
            if suffix in ("ing", "ed") and len(stem) > 2 and stem[-1] == stem[-2] and stem[-1] not in "lsz":
                stem = stem[:-1]  # "resetting" -> "resett" -> "reset"
            return stem
    return word


_INTERCHANGEABLE: dict[str, int] = {
    _stem(word): n for n, words in enumerate(INTERCHANGEABLE_CLASSES) for word in words.split()
}


def parse_table(text: str) -> dict[tuple[str, ...], str]:
    """The interchangeable-words table: each entry, as its tuple of stemmed words, -> the token
    its class is read as (the first entry, its words joined by "_").

    One class per line, entries separated by commas, "#" starts a comment. A word or phrase in
    two classes is an error: its reading would depend on the order of the file.
    """
    table: dict[tuple[str, ...], str] = {}
    where: dict[tuple[str, ...], int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if not line:
            continue
        entries = [e.strip().casefold() for e in line.split(",")]
        if len(entries) < 2 or not all(entries):
            raise ValueError(f"table line {n}: a class needs two or more entries: {line!r}")
        canonical = "_".join(entries[0].split())
        for entry in entries:
            key = tuple(_stem(w) for w in entry.split())
            if not 1 <= len(key) <= MAX_PHRASE_WORDS:
                raise ValueError(f"table line {n}: {entry!r} has more than "
                                 f"{MAX_PHRASE_WORDS} words")
            if key in where and where[key] != n:
                raise ValueError(f"table line {n}: {entry!r} is already in the class on line "
                                 f"{where[key]}")
            where[key] = n
            table[key] = canonical
    return table


_TABLE = parse_table(resources.files(__package__).joinpath(TABLE_FILE).read_text("utf-8"))
_PHRASE_STARTS = frozenset(key[0] for key in _TABLE if len(key) > 1)
# The framing words as the rules see them: stemmed and read through the table ("show" is
# read as "demonstrate").
_FRAMING = frozenset(_TABLE.get((_stem(w),), _stem(w)) for w in FRAMING)
EXPOSITION = frozenset(
    _TABLE.get((_stem(w),), _stem(w)) for w in "explain tell summarize define".split()
)
_stem_memo = lru_cache(maxsize=65536)(_stem)


def _read_through_table(tokens: list[str]) -> list[str]:
    """Tokens with every table entry replaced by its class's token, longest phrase first."""
    out: list[str] = []
    i, n = 0, len(tokens)
    while i < n:
        tok = tokens[i]
        stem = _stem_memo(tok) if len(tok) <= 64 else tok
        width, canonical = 1, _TABLE.get((stem,), tok)
        if stem in _PHRASE_STARTS:
            for wide in range(min(MAX_PHRASE_WORDS, n - i), 1, -1):
                phrase = _TABLE.get(tuple(_stem_memo(t) for t in tokens[i : i + wide]))
                if phrase is not None:
                    width, canonical = wide, phrase
                    break
        out.append(canonical)
        i += width
    return out


class _Parsed(NamedTuple):
    """A prompt reduced to what the rules compare."""

    norm: str
    tokens: tuple[str, ...]  # every token, stemmed, negations folded to "not"
    surface: frozenset[str]  # every token as written and stemmed, for the antonym lists
    content: tuple[str, ...]  # tokens that are not stopwords, negations or directional words
    core: tuple[str, ...]  # content less the polarity words, sorted
    bag: tuple[str, ...]  # content, sorted (a multiset compared in one tuple comparison)
    directions: tuple[str, ...]  # the directional words that have an object, sorted
    skeleton: tuple[str, ...]  # content and directional words, in order
    numbers: tuple[str, ...]  # sorted normalised numbers (hard)
    soft_numbers: tuple[str, ...]  # numbers from words that are also pronouns ("one")
    negations: int
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
        return _number(str(Decimal(scaled.group(1)) * SCALES[_SUFFIXES[scaled.group(2)]]))
    if tok in _SPECIAL or tok in STOPWORDS:
        return tok
    return _stem(tok)


def _number(text: str) -> str:
    try:
        value = Decimal(text).normalize()
    except InvalidOperation:  # pragma: no cover - the regex only passes digits
        return text
    return format(value, "f")


# What a token is to the rules; "without" is directional ("coffee with/without sugar") and
# not counted as a negation.
_CONTENT, _DIRECTIONAL, _NEGATION, _STOPWORD = "content", "directional", "negation", "stopword"
_TokenInfo = tuple[str, tuple[str, ...], bool, str, tuple[tuple[int, int], ...]]


def _token_uncached(tok: str) -> _TokenInfo:
    """(canonical form, numbers it carries, whether they are soft, its kind, its polarity
    poles) of one token. Memoised for ordinary words (``_token_memo``), since prompts reuse a
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
    polar = tuple(_POLAR.get(canonical, ()))
    if tok.startswith("^"):  # a power: "^2" is "squared", never the number 2
        return canonical, (tok,), False, kind, polar
    ordinal = _ORDINAL.match(tok)
    if ordinal:
        return canonical, (f"#{int(ordinal.group(1))}",), False, kind, polar
    if tok in ORDINAL_WORDS:
        return canonical, (ORDINAL_WORDS[tok],), False, kind, polar
    if tok in SOFT_NUMBERS:
        return canonical, (NUMBER_WORDS[tok],), True, kind, polar
    if tok in NUMBER_WORDS:
        return canonical, (NUMBER_WORDS[tok],), False, kind, polar
    if not tok.isalpha():
        scaled = _SCALED.fullmatch(tok)
        if scaled:  # "10k", "2.5m": the suffix scales the number
            value = Decimal(scaled.group(1)) * SCALES[_SUFFIXES[scaled.group(2)]]
            return canonical, (_number(str(value)),), False, kind, polar
        return canonical, tuple(_number(d) for d in _DIGITS.findall(tok)), False, kind, polar
    return canonical, (), False, kind, polar


MEMO_MAX_CHARS = 4096  # longer prompts are parsed in full each time, never kept in the memo


def _parse(prompt: str, table: bool = True) -> _Parsed:
    """The parsed prompt, read through the table of interchangeable words unless ``table`` is
    False; memoised for prompts of ordinary length only, so a few megabyte-long prompts cannot
    pin gigabytes in the memo."""
    if len(prompt) > MEMO_MAX_CHARS:
        return _parse_uncached(prompt, table)
    return _parse_memo(prompt, table)


def _parse_uncached(prompt: str, table: bool = True) -> _Parsed:
    if prompt.isascii():
        norm = prompt.casefold()
    else:
        norm = unicodedata.normalize("NFKC", prompt.translate(_SUPERSCRIPTS))
    norm = norm.translate(_QUOTES).casefold()
    if "," in norm or "_" in norm or " " in norm:
        norm = _GROUPED.sub("", norm)
    if "^" in norm or "**" in norm:
        norm = _POWER.sub(r" ^\1", norm)
    raw = _TOKEN.findall(norm)
    if "'" in norm:
        raw = _split_contractions(raw)
    return _build(_read_through_table(raw) if table else raw, raw)


_parse_memo = lru_cache(maxsize=4096)(_parse_uncached)
_token_memo = lru_cache(maxsize=65536)(_token_uncached)


def _split_contractions(raw: list[str]) -> list[str]:
    tokens: list[str] = []
    for tok in raw:
        if tok.endswith("n't") or tok == "n't":
            base = {"ca": "can", "wo": "will", "sha": "shall"}.get(tok[:-3], tok[:-3])
            if base:
                tokens.append(base)
            tokens.append("not")
            continue
        if "'" in tok:
            head, _, tail = tok.partition("'")
            tokens.append(head)
            if tail not in ("s", "re", "ve", "ll", "d", "m", "t"):
                tokens.append(tail)
            continue
        tokens.append(tok)
    return tokens


def _build(tokens: list[str], written: list[str]) -> _Parsed:
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
    negations = 0
    after_number = False  # the token before was a plain number ("ten" of "ten thousand")
    for tok in tokens:
        canonical, hard, is_soft, kind, polar = (
            _token_memo(tok) if len(tok) <= 64 else _token_uncached(tok)
        )
        if tok in SCALES and after_number and numbers:
            # "ten thousand" is 10000, as "10,000" and "10k" are; "a thousand" stays 1000. The
            # number before is rewritten in place: one number, one word, to every rule
            old, numbers[-1] = numbers[-1], _number(str(Decimal(numbers[-1]) * SCALES[tok]))
            for words in (stemmed, content, skeleton):
                if words and words[-1] == old:
                    words[-1] = numbers[-1]
            after_number = False
            continue
        stemmed.append(canonical)
        if hard:
            (soft if is_soft else numbers).extend(hard)
        after_number = bool(hard) and not is_soft and len(hard) == 1 and _PLAIN.fullmatch(hard[0]) is not None
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
            negations += 1
    bag = sorted(content)
    return _Parsed(
        norm=" ".join(stemmed),
        tokens=tuple(stemmed),
        surface=frozenset(tokens).union(stemmed, written, map(_stem_memo, written)),
        content=tuple(content),
        core=tuple(t for t in bag if t not in _POLAR),
        bag=tuple(bag),
        directions=tuple(sorted(d for d, _ in attachments)),
        skeleton=tuple(skeleton),
        numbers=tuple(sorted(numbers)),
        soft_numbers=tuple(sorted(soft)),
        negations=negations,
        polarity=tuple(sorted(polarity)),
        attachments=tuple(sorted(attachments)),
    )


def _numbers_of(p: _Parsed, other: _Parsed) -> tuple[str, ...]:
    """The numbers of ``p`` the numbers rule compares with ``other``'s. A soft number ("one",
    also a pronoun) counts only where the hard numbers differ, so that "one" can stand for a
    "1" the other side writes, while "buy a new one" beside the same "8 GB" and "2015" stays a
    pronoun."""
    if p.numbers != other.numbers and (other.numbers or other.soft_numbers):
        return tuple(sorted(p.numbers + p.soft_numbers))
    return p.numbers


def _exchanged(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, str] | None:
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
