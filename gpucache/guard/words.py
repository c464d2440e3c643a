"""The words the lexical verifier knows: stopwords, negations, polarity axes, antonyms,
interchangeable classes, directional words, number words, the rules' limits, and the light
stemmer. Pure data and pure functions: no floating point, no ``hash()``, no torch. How a prompt
is read with them is in parsing.py; the rules in lexical.py and shapes.py.
"""

from __future__ import annotations

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

NEGATIONS = frozenset("not no non never nor none nothing nobody neither nowhere cannot without".split())

# Pairs of opposites that turn one question into another. "to"/"from" style words are common
# in rewordings too, so they only reject when the rest of the content is the same (polarity);
# the strong opposites reject wherever they split across the two prompts (antonym).
POLARITY_AXES: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("to", "into", "onto", "toward", "towards"), ("from",)),
    (("on",), ("off",)),
    (("with",), ("without",)),
    (("in", "inside", "into"), ("out", "outside")),
    (("up",), ("down",)),
    (("before",), ("after",)),
    (("above",), ("below",)),
    (("over",), ("under",)),
    (("more",), ("less", "fewer")),
    (("higher",), ("lower",)),
    (("high",), ("low",)),
    (("first",), ("last",)),
    (("left",), ("right",)),
    (("yes",), ("no",)),
    (("true",), ("false",)),
    (("front",), ("back",)),
    (("top",), ("bottom",)),
    (("early",), ("late",)),
    (("earlier",), ("later",)),
    (("old",), ("new",)),
    (("older",), ("newer",)),
    (("big", "large"), ("small", "little")),
    (("bigger", "larger"), ("smaller",)),
    (("long",), ("short",)),
    (("longer",), ("shorter",)),
    (("fast",), ("slow",)),
    (("faster",), ("slower",)),
    (("hot",), ("cold",)),
    (("plus",), ("minus",)),
    (("by",), ("about",)),  # poems by / about a poet: author or subject
]
ANTONYM_PAIRS = [
    ("enable", "disable"),
    ("add", "remove"),
    ("open", "close"),
    ("buy", "sell"),
    ("minimum", "maximum"),
    ("min", "max"),
    ("start", "stop"),
    ("import", "export"),
    ("upload", "download"),
    ("encrypt", "decrypt"),
    ("encode", "decode"),
    ("increase", "decrease"),
    ("lock", "unlock"),
    ("login", "logout"),
    ("include", "exclude"),
    ("accept", "reject"),
    ("debit", "credit"),
    ("deposit", "withdraw"),
    ("send", "receive"),
    ("push", "pull"),
    ("install", "uninstall"),
    ("subscribe", "unsubscribe"),
    ("block", "unblock"),
    ("connect", "disconnect"),
    ("show", "hide"),
    ("freeze", "unfreeze"),
    ("compress", "decompress"),
    ("mount", "unmount"),
    ("ascend", "descend"),
    ("ascending", "descending"),
    ("asc", "desc"),
    ("north", "south"),
    ("east", "west"),
    ("best", "worst"),
    ("better", "worse"),
    ("cheap", "expensive"),
    ("cheapest", "expensive"),
    ("win", "lose"),
    ("gain", "lose"),
    ("pass", "fail"),
    ("positive", "negative"),
    ("male", "female"),
    ("men", "women"),
    ("man", "woman"),
    ("boy", "girl"),
    ("advantage", "disadvantage"),
    ("pro", "con"),
    ("pros", "cons"),
    ("legal", "illegal"),
    ("possible", "impossible"),
    ("like", "dislike"),
    ("agree", "disagree"),
    ("follow", "unfollow"),
    ("archive", "unarchive"),
    ("pause", "resume"),
    ("activate", "deactivate"),
    ("allow", "deny"),
    ("allow", "block"),
    ("sunrise", "sunset"),
    ("morning", "evening"),
    ("am", "pm"),
    ("day", "night"),
    ("summer", "winter"),
    ("spring", "autumn"),
    ("spring", "fall"),
    ("import", "export"),
    ("input", "output"),
    ("client", "server"),
    ("read", "write"),
    ("sender", "recipient"),
    ("buyer", "seller"),
    ("parent", "child"),
    ("husband", "wife"),
    ("mother", "father"),
    ("son", "daughter"),
    ("brother", "sister"),
    ("past", "future"),
    ("birth", "death"),
    ("born", "die"),
    ("love", "hate"),
    ("rich", "poor"),
    ("strong", "weak"),
    ("easy", "hard"),
    ("easiest", "hardest"),
    ("safe", "dangerous"),
    ("safe", "unsafe"),
    ("win", "loss"),
    ("profit", "loss"),
    ("asset", "liability"),
    ("income", "expense"),
    ("borrow", "lend"),
    ("hire", "fire"),
    ("join", "leave"),
    ("arrive", "depart"),
    ("arrival", "departure"),
    ("inbound", "outbound"),
    ("incoming", "outgoing"),
    ("upper", "lower"),
    ("uppercase", "lowercase"),
    ("horizontal", "vertical"),
    ("vertically", "horizontally"),
    ("row", "column"),
    ("rows", "columns"),
    ("ceil", "floor"),
    ("sum", "difference"),
    ("multiply", "divide"),
    ("celsius", "fahrenheit"),
    ("km", "mile"),
    ("kg", "lb"),
]

# Words that ask the same question in any prompt: swapping one for another of its class is a
# rewording, not a substitution ("the best laptop" / "a good laptop", "movie" / "film"). Short
# on purpose: every other one-word swap still rejects (the founding rules' conservative default), and a
# class joins only when no question changes with the word. Measured in the false-hit report.
INTERCHANGEABLE_CLASSES = [
    "good best great top nice excellent finest greatest awesome ideal",
    "movie film",
    "website site",
    "photo picture pic image",
    "kid child",
    "cost price",
    "phone smartphone cellphone mobile",
    "help assist",
    "job career",
    "earn make",
    "learn study",
    "car vehicle",
    "email mail",
    "easiest simplest",
    "big large huge",
    "biggest largest",
    "small little tiny",
    "ocean sea",
]
# The table of interchangeable words and phrases (spelling variants, abbreviations and units,
# instruction verbs) is data, shipped beside this module: interchangeable.txt. Unlike the
# classes above, which only exempt a word from the substitution rule, the table rewrites every
# entry to its class's first entry when a prompt is parsed, so every rule reads "colour" and
# "color", "regex" and "regular expression", "x squared" and "x^2" as the same words.
TABLE_FILE = "interchangeable.txt"


def _confusable_pairs(text: str | None = None) -> tuple[tuple[str, ...], ...]:
    """confusables.txt (or ``text`` in its form): groups of words a letter apart that mean
    different things."""
    from importlib import resources

    if text is None:
        text = resources.files(__package__).joinpath("confusables.txt").read_text("utf-8")
    groups = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            groups.append(tuple(w.strip().casefold() for w in line.split(",")))
    return tuple(groups)


CONFUSABLE_GROUPS = _confusable_pairs()
CONFUSABLE: dict[str, set[str]] = {}
for _group in CONFUSABLE_GROUPS:
    for _w in _group:
        CONFUSABLE.setdefault(_w, set()).update(x for x in _group if x != _w)
CONFUSABLES = frozenset(CONFUSABLE)
MAX_PHRASE_WORDS = 4

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
    best good top meant most use given similar
    1 &
    """.split()
)

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
    thirty="30",
    forty="40",
    fifty="50",
    sixty="60",
    seventy="70",
    eighty="80",
    ninety="90",
    hundred="100",
    thousand="1000",
    million="1000000",
    billion="1000000000",
    trillion="1000000000000",
    dozen="12",
    half="0.5",
    quarter="0.25",
    twice="x2",
    triple="x3",
    double="x2",
)
# Words that scale the number before them ("ten thousand"), and the suffixes that do ("10k")
SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "trillion": 10**12}
ORDINAL_WORDS = {
    w: f"#{i}"
    for i, w in enumerate("first second third fourth fifth sixth seventh eighth ninth tenth".split(), start=1)
}
# "one" is also a pronoun ("how does one learn"); it counts as a number only when the other
# prompt has a number too.
SOFT_NUMBERS = frozenset({"one"})

# The fewest shared content words at which shapes.reordered looks for words moved one by one;
# the reordered rule itself judges only long edits (lexical.REORDER_MIN_SHARED, 8 and more)
MOVED_MIN_SHARED = 5
# Beyond these sizes the pairwise rules switch to bounded work, so a megabyte prompt is
# still compared in full (numbers, negation, polarity, substitution) in linear-ish time.
LONG_ALIGNMENT = 2000  # tokens in the differing middle before difflib's autojunk heuristic
CROSSED_MAX_SHARED = 200  # shared words the pairwise crossed rule examines
CROSSED_MAX_CONTENT = 8  # content words past which the crossed rule abstains
# The directional words that give their object a role: a source, a goal, a standard of
# comparison, an agent ("100 EUR in USD" / "100 USD to EUR"). Crossing one of these changes who
# or what is which; crossing "for", "of" or "with" is how rewordings move phrases.
ROLE_WORDS = frozenset("to from into onto than per in toward towards".split())

# Wh-words that name what is asked for: "who wrote X" and "when was X published" share every
# other word and still ask different questions.
QUESTION_WORDS = frozenset({"who", "whom", "whose", "when", "where", "why"})


POLAR: dict[str, list[tuple[int, int]]] = {}
for _axis, _poles in enumerate(POLARITY_AXES):
    for _pole, _words in enumerate(_poles):
        for _w in _words:
            POLAR.setdefault(_w, []).append((_axis, _pole))
ANTONYM: dict[str, set[str]] = {}
for _a, _b in ANTONYM_PAIRS:
    ANTONYM.setdefault(_a, set()).add(_b)
    ANTONYM.setdefault(_b, set()).add(_a)
SPECIAL = NEGATIONS | DIRECTIONAL


def stem(word: str) -> str:
    """Light suffix normalisation: plural and verb endings, enough to match "resets"/"reset".

    Each ending comes off a word of at least the length beside it, so a word of three letters
    or fewer is kept whole. "es" comes off only after the sounds that take it ("boxes",
    "wishes", "classes"); "s" never off "glass", "status" or "analysis". A verb's doubled last
    consonant goes with "ing" or "ed" ("resetting", "stopped"), but not from a root of three
    letters, whose double is its own ("added", "erred"), nor l, s or z, which English doubles
    in roots ("calling", "passed", "buzzed"). A four-letter past of a three-letter root in "e"
    loses its "d" ("sued", "used", "tied", "owed"), not "feed", "bled" or "shed"."""
    if not word.isalpha():
        return word
    if len(word) == 4 and word.endswith("ed") and (word[0] in "aeiou" or word[1] in "aiouy"):
        return word[:3]  # "sued", "used", "tied", "owed": a root of three letters ending in "e"
    for suffix, repl, min_len in (
        ("ies", "y", 5),
        ("ing", "", 6),
        ("ed", "", 5),
        ("es", "", 5),
        ("s", "", 4),
    ):
        if word.endswith(suffix) and len(word) >= min_len:
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                return word
            if suffix == "es" and not word.endswith(("ches", "shes", "xes", "zes", "sses")):
                continue
            stem = word[: len(word) - len(suffix)] + repl
            if suffix in ("ing", "ed") and len(stem) > 3 and stem[-1] == stem[-2] and stem[-1] not in "lsz":
                stem = stem[:-1]  # "resetting" -> "resett" -> "reset"
            return stem
    return word


def adverb(*words: str) -> bool:
    """Whether one of the words is an adverb in -ly ("automatically"): it modifies the verb
    wherever it stands and has no role to trade."""
    return any(len(w) > 4 and w.endswith("ly") for w in words)


INTERCHANGEABLE: dict[str, int] = {
    stem(word): n for n, words in enumerate(INTERCHANGEABLE_CLASSES) for word in words.split()
}
