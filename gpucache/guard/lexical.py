"""LexicalNearMissVerifier: reject a candidate that is a minimal edit of the cached prompt.

Why a lexical guard: a sentence embedding averages meaning over the words, so a prompt and a
small edit of it that changes the question ("convert 10 miles to km" / "convert 10 km to
miles", "reset my password" / "reset my username") score 0.9 and above, often higher than a
true rewording. What gives a near-miss away is its shape: almost the same words, with a few
swapped, negated, renumbered or reordered. A rewording looks different: other words, other
lengths, insertions and deletions. So the verifier looks for the shape of a near-miss and lets
everything else through to the similarity threshold.

Both prompts are normalised (NFKC, lowercase, curly quotes straightened, digit groupings such
as "1,000" joined), tokenised, stripped of stopwords and reduced by a light suffix stemmer. Then
the rules below run in order; the first that fires rejects (seed 000_267dccf0cb1adcd2, plus
the named additions measured in bench/reports/semantic-false-hits.md):

    symbols       both prompts hold operators or symbols, and they differ
                  ("x >= 5" / "x <= 5", "a && b" / "a || b")                 -> reject  [addition]
    payload       both prompts quote or show code, and the payloads differ  -> reject  [addition]
                  (the same payload: the rules below judge the instructions
                  alone, "Summarize: '...'" / "Give me a summary of this: '...'"; payload.py)
    identical     the normalised prompts are equal                        -> accept
    numbers       the numbers differ ("5" vs "50", "two" vs "four")       -> reject
    negation      a negation appears on one side only                     -> reject
    polarity      same content words, a polarity word swapped ("to"/"from") -> reject
    antonym       a strong opposite on each side ("enable"/"disable")     -> reject  [addition]
    question-word each side asks a different wh-thing ("who" vs "when")     -> reject  [addition]
    direction     same content words reordered around a directional word  -> reject
    swapped       same content words, two of them traded places            -> reject  [addition]
                  (two words joined by "or"/"and" trade places freely: "Python or Java")
    crossed       shared words swap sides of a directional word elsewhere  -> reject  [addition]
    reordered     most content words shared (>= 5, Jaccard >= 0.6), some moved -> reject  [addition]
    substitution  content words align with only substitutions of <= 2 words each, no
                  insertions or deletions, and at least one word in common -> reject
                  (two forms of one word, "movie"/"movies", and words of one interchangeable
                  class, "good"/"best", are not substitutions)                     [addition]
    added         one prompt asks for more: content words only it has (a qualifier, a
                  clause, an instruction), beside words both share; or each side has its
                  own words in one run beside a long shared part (a different closing
                  instruction). Framing and politeness do not count.        -> reject  [addition]

Before any rule, both prompts are read through a table of interchangeable words and phrases
(interchangeable.txt: spelling variants, abbreviations and units, instruction verbs), so
"colour"/"color", "regex"/"regular expression" and "x squared"/"x^2" are the same words to
every rule.

It is conservative by design: a one-word synonym swap ("cancel" vs "end") is also rejected and
costs a miss, never a wrong answer. Any rule can be switched off (``skip``); the report's
ablation table gives, per benchmark file, the false hits and hits that costs. Everything here is
a pure function of the two strings: no floating point, no ``hash()``, no torch, so every process
and machine gives the same verdict.
"""

from __future__ import annotations

import bisect
import difflib
import os
from collections import Counter
from collections.abc import Iterable, Sequence

from gpucache.guard.payload import operators, split
from gpucache.guard.verifier import Verdict
from gpucache.guard.words import (
    _ANTONYM,
    _FRAMING,
    _INTERCHANGEABLE,
    ADDED_MAX_SHARED_INSIDE,
    ADDED_MIN_SHARED,
    ARTICLES,
    COORDINATORS,
    CROSSED_MAX_SHARED,
    DIRECTIONAL,
    EXPOSITION,
    LONG_ALIGNMENT,
    MATCH_MAX_PAIRS,
    POLARITY_AXES,
    QUESTION_OPENERS,
    QUESTION_WORDS,
    REORDER_MIN_SHARED,
    SYMMETRIC,
    _exchanged,
    _numbers_of,
    _parse,
    _parse_memo,
    _Parsed,
    _token_memo,
)

# The rules in the order they run. The seed's four (numbers; negation and polarity; direction;
# substitution) and the additions the false-hit report measured; any of them can be switched off
# (``LexicalNearMissVerifier(skip=...)``), which the report uses to show what each one buys.
SEED_RULES = ("numbers", "negation", "polarity", "direction", "substitution")
ADDED_RULES = ("symbols", "payload", "antonym", "question-word", "swapped", "crossed", "reordered",
               "added")
RULES = ("symbols", "payload", "numbers", "negation", "polarity", "antonym", "question-word",
         "direction", "swapped", "crossed", "reordered", "substitution", "added")


def clear_caches() -> None:
    """Forget parsed prompts and tokens (for benchmarks that time a cold verifier)."""
    _parse_memo.cache_clear()
    _token_memo.cache_clear()


class LexicalNearMissVerifier:
    """The default ``HitVerifier``: rejects near-miss edits, lets rewordings through.

    ``verify`` ignores the similarity: the threshold has already admitted the candidate, and
    the verifier's job is to catch what similarity cannot see.

    ``skip`` names rules (from ``RULES``) not to run. Every rule is on by default; switching one
    off trades wrong answers for hits, and the false-hit report's ablation table says how many
    of each on every benchmark file, so a deployment can decide with numbers (a cache of long
    news-like prompts loses many hits to "reordered", for instance).

    ``table=False`` reads prompts as written, without the table of interchangeable words:
    the report's ablation uses it to show what the table buys.
    """

    name = "lexical-near-miss"

    def __init__(self, skip: Iterable[str] = (), *, table: bool = True) -> None:
        if isinstance(skip, str):
            raise TypeError("skip takes a collection of rule names, not one string")
        skipped = frozenset(skip)
        unknown = sorted(skipped.difference(RULES))
        if unknown:
            raise ValueError(f"unknown rules {unknown}; the rules are {', '.join(RULES)}")
        self.skip = skipped
        self.table = bool(table)
        left_out = [r for r in RULES if r in skipped] + ([] if self.table else ["table"])
        if left_out:
            self.name = f"lexical-near-miss-without-{'-'.join(left_out)}"

    def __repr__(self) -> str:
        skipped = ", ".join(repr(r) for r in RULES if r in self.skip)
        table = "" if self.table else ", table=False"
        return (f"LexicalNearMissVerifier(skip=({skipped}{',' if len(self.skip) == 1 else ''})"
                f"{table})")

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        return not self.explain(cached_prompt, new_prompt).rejected

    def explain(self, cached_prompt: str, new_prompt: str) -> Verdict:
        """Which rule decides this pair, and the words involved."""
        skip = self.skip
        ops_a, ops_b = operators(cached_prompt), operators(new_prompt)
        if ops_a and ops_b and ops_a != ops_b and "symbols" not in skip:
            return Verdict(True, "symbols", f"symbols differ: {' '.join(ops_a)} vs {' '.join(ops_b)}",
                           ops_a + ops_b)
        split_a, split_b = split(cached_prompt), split(new_prompt)
        cached_prompt, new_prompt = split_a.plain, split_b.plain
        if split_a.payloads and split_b.payloads and "payload" not in skip:
            if split_a.payloads != split_b.payloads:
                return Verdict(True, "payload", "the quoted or code payloads differ")
            # one payload, two instructions: the rules below judge the instructions
            cached_prompt, new_prompt = split_a.instruction, split_b.instruction
        a, b = _parse(cached_prompt, self.table), _parse(new_prompt, self.table)
        if a.norm == b.norm:
            return Verdict(False, "identical")
        nums_a, nums_b = _numbers_of(a, b), _numbers_of(b, a)
        if nums_a != nums_b and "numbers" not in skip:
            diff_a = sorted((Counter(nums_a) - Counter(nums_b)).elements())
            diff_b = sorted((Counter(nums_b) - Counter(nums_a)).elements())
            return Verdict(
                True, "numbers", f"numbers differ: {' '.join(diff_a) or '-'} vs "
                f"{' '.join(diff_b) or '-'}", tuple(diff_a + diff_b)
            )
        if (a.negations > 0) != (b.negations > 0) and "negation" not in skip:
            return Verdict(True, "negation", "a negation on one side only", ("not",))
        if (
            a.core == b.core and a.polarity != b.polarity and "polarity" not in skip
            and _poles_swapped(a.polarity, b.polarity)
        ):
            words = _polar_words(a, b)
            return Verdict(True, "polarity", f"polarity swapped: {' vs '.join(words)}", words)
        opposite = _split_antonym(a.surface, b.surface) if "antonym" not in skip else None
        if opposite:
            return Verdict(True, "antonym", f"opposites: {opposite[0]} vs {opposite[1]}", opposite)
        asks_a = QUESTION_WORDS.intersection(a.tokens)
        asks_b = QUESTION_WORDS.intersection(b.tokens)
        if asks_a and asks_b and not asks_a & asks_b and "question-word" not in skip:
            words = (" ".join(sorted(asks_a)), " ".join(sorted(asks_b)))
            return Verdict(True, "question-word", f"asks {words[0]} vs {words[1]}", words)
        same_content = a.bag == b.bag
        if (
            same_content and a.directions == b.directions and a.attachments != b.attachments
            and "direction" not in skip
        ):
            moved = tuple(sorted({o for _, o in set(a.attachments) ^ set(b.attachments)}))
            return Verdict(
                True, "direction", f"reordered around a directional word: {' '.join(moved)}", moved
            )
        if same_content and a.content != b.content and "swapped" not in skip:
            # content words trading places, or a content word trading places with a word the
            # parser sets aside ("Is Rust faster than Go?": "go" is a stopword, and a name)
            in_tokens = _exchanged(a.tokens, b.tokens)
            swap = _exchanged(a.skeleton, b.skeleton) or in_tokens
            if swap and not _coordinated(a.tokens, *swap):
                return Verdict(True, "swapped", f"words traded places: {swap[0]} / {swap[1]}", swap)
            if in_tokens:
                # word for word the same prompt but for "A or B" / "B or A": the later rules
                # would read the exchange as words moved
                return Verdict(False, "rewording")
        crossed = _crossed(a, b) if "crossed" not in skip else None
        if crossed:
            return Verdict(
                True, "crossed", f"{crossed[0]} and {crossed[1]} swap sides of a directional word",
                crossed,
            )
        moved = _reordered(a, b) if "reordered" not in skip else ()
        if moved:
            shown = " ".join(moved)
            return Verdict(True, "reordered", f"shared words moved: {shown}", moved)
        subs = _substitutions(a.content, b.content) if "substitution" not in skip else []
        if subs:
            words = tuple(w for pair in subs for w in pair)
            shown = ", ".join(f"{x} -> {y}" for x, y in subs)
            return Verdict(True, "substitution", f"words substituted: {shown}", words)
        added = _added(a, b) if "added" not in skip else None
        if added:
            only_a, only_b = added
            shown = "; ".join(
                f'only in the {side} prompt: "{_phrase(p, only)}"'
                for side, p, only in (("cached", a, only_a), ("new", b, only_b)) if only
            )
            return Verdict(True, "added", shown, only_a + only_b)
        return Verdict(False, "rewording")


def _poles_swapped(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    """True when some polarity pair has more of one pole on one side and more of the other
    pole on the other side ("to" became "from"), not merely a word present on one side."""
    ca, cb = Counter(a), Counter(b)
    for pair in {i for i, _ in a} | {i for i, _ in b}:
        d0 = ca[(pair, 0)] - cb[(pair, 0)]
        d1 = ca[(pair, 1)] - cb[(pair, 1)]
        if d0 * d1 < 0:
            return True
    return False


def _polar_words(a: _Parsed, b: _Parsed) -> tuple[str, ...]:
    pa = Counter(a.polarity)
    pb = Counter(b.polarity)
    only_a = [POLARITY_AXES[i][pole][0] for i, pole in (pa - pb).elements()]
    only_b = [POLARITY_AXES[i][pole][0] for i, pole in (pb - pa).elements()]
    return (" ".join(only_a) or "-", " ".join(only_b) or "-")


def _split_antonym(set_a: frozenset[str], set_b: frozenset[str]) -> tuple[str, str] | None:
    for word in sorted(set_a):
        for opposite in _ANTONYM.get(word, ()):
            if opposite in set_b and opposite not in set_a and word not in set_b:
                return word, opposite
    return None


def _root(word: str) -> str:
    """The word less up to two final vowels of its ending ("movie"/"movy" -> "mov"), since the
    light stemmer leaves "movies" and "movie", "dating" and "date" in different forms."""
    for _ in range(2):
        if len(word) > 3 and word[-1] in "eiy":
            word = word[:-1]
    return word


def _variants(x: str, y: str) -> bool:
    """Two forms of one word, or two words of one interchangeable class: not a substitution.

    Forms of one word: one is a prefix of the other sharing at least 4 letters ("help" /
    "helpful"), the same root ("movie" / "movies"), or a common prefix of 6 letters or more
    covering at least 80% of the shorter word ("defragmentation" / "defragmenter"; but not
    "internship" / "internet").
    """
    if x in _INTERCHANGEABLE and _INTERCHANGEABLE.get(y) == _INTERCHANGEABLE[x]:
        return True
    short, long_ = sorted((x, y), key=len)
    if not short.isalpha():
        return False
    if len(short) >= 4 and long_.startswith(short):
        return True
    root = _root(short)
    if len(root) >= 3 and root == _root(long_):
        return True
    common = len(os.path.commonprefix((short, long_)))
    return common >= 6 and 5 * common >= 4 * len(short)


def _joined(a: Sequence[str], b: Sequence[str]) -> bool:
    """One word written apart on one side and joined on the other ("multi year"/"multiyear",
    "web site"/"website"): two words against one whose letters they spell in order. The
    stemmer only touches a word's ending, so the first word's stem is its written form."""
    if sorted((len(a), len(b))) != [1, 2]:
        return False
    one, two = (a, b) if len(a) == 1 else (b, a)
    return len(one[0]) >= 5 and "".join(two) == one[0]


def _coordinated(tokens: tuple[str, ...], x: str, y: str) -> bool:
    """Whether ``x`` and ``y`` are joined by "or" or "and" ("Python or Java", "the salt and the
    sugar"): two words joined that way trade places without changing the question, unlike a
    subject and an object ("dog bites man"). Numbers are never coordinated: "divide 10 and 5"
    and "divide 5 and 10" differ."""
    if not (x.isalpha() and y.isalpha()):
        return False
    places = [i for i, t in enumerate(tokens) if t in (x, y)]
    for i, j in zip(places, places[1:]):
        between = tokens[i + 1 : j]
        if {tokens[i], tokens[j]} == {x, y} and any(t in COORDINATORS for t in between) and all(
            t in COORDINATORS or t in ARTICLES for t in between
        ):
            return True
    return False


def _crossed(pa: _Parsed, pb: _Parsed) -> tuple[str, str] | None:
    """Two shared content words on opposite sides of a directional word in each prompt, in
    opposite order, where the rest of the prompts differ ("how much is 100 EUR in USD" /
    "convert 100 USD to EUR"): the seed's direction rule for prompts that are not otherwise
    identical. A phrase moved whole keeps its directional word ("from London to Paris" /
    "to Paris from London") and does not count."""
    shared = set(pa.content) & set(pb.content)
    if not 2 <= len(shared) <= CROSSED_MAX_SHARED:
        return None
    first_a = _first_positions(pa.skeleton, shared)
    first_b = _first_positions(pb.skeleton, shared)
    heads_a, heads_b = _heads(pa.attachments), _heads(pb.attachments)
    words = sorted(shared, key=first_a.__getitem__)
    for i, x in enumerate(words):
        for y in words[i + 1 :]:
            if first_b[x] < first_b[y]:
                continue
            if heads_a.get(x) == heads_b.get(x) and heads_a.get(y) == heads_b.get(y):
                continue
            between_a = pa.skeleton[first_a[x] + 1 : first_a[y]]
            between_b = pb.skeleton[first_b[y] + 1 : first_b[x]]
            if any(t in DIRECTIONAL and t not in SYMMETRIC for t in between_a) and any(
                t in DIRECTIONAL and t not in SYMMETRIC for t in between_b
            ):
                return x, y
    return None


def _first_positions(sequence: tuple[str, ...], words: set[str]) -> dict[str, int]:
    first: dict[str, int] = {}
    for i, w in enumerate(sequence):
        if w in words:
            first.setdefault(w, i)
    return first


def _reordered(pa: _Parsed, pb: _Parsed) -> tuple[str, ...]:
    """Shared content words that changed order, when the prompts share most of their content
    words (Jaccard >= 0.6, at least ``REORDER_MIN_SHARED``): the shape of a word-scrambled
    near-miss ("X was conducted by A and produced by B" / "produced by A and conducted by B").

    The words kept in order are a longest increasing subsequence of their positions; the rest
    moved. Short prompts are left to the direction and swapped rules, since "a list in Python"
    / "a Python list" is a rewording, and so is a phrase moved with its preposition ("in 1965
    he moved" / "he moved in 1965"): a word that is the object of the same directional words on
    both sides does not count as moved, nor, in a prompt of fewer than 8 shared words,
    does the word right after it on both sides ("at room temperature" fronted whole).
    Measured on paws_wiki and qqp in the false-hit report.
    """
    a, b = pa.content, pb.content
    shared = set(a) & set(b)
    if len(shared) < REORDER_MIN_SHARED or 5 * len(shared) < 3 * len(set(a) | set(b)):
        return ()
    first_a: dict[str, int] = {}
    first_b: dict[str, int] = {}
    for i, w in enumerate(a):
        first_a.setdefault(w, i)
    for i, w in enumerate(b):
        first_b.setdefault(w, i)
    order = sorted(shared, key=first_a.__getitem__)
    positions = [first_b[w] for w in order]
    tails: list[int] = []  # patience sorting: tails[k] = smallest tail of an increasing run of k+1
    for x in positions:
        k = bisect.bisect_left(tails, x)
        tails[k : k + 1] = [x]
    if len(tails) == len(positions):
        return ()
    if _clauses_moved(positions):
        return ()
    kept = _one_increasing_subsequence(positions)
    heads_a = _heads(pa.attachments)
    heads_b = _heads(pb.attachments)
    governed = {w for w in shared if heads_a.get(w) and heads_a.get(w) == heads_b.get(w)}
    moved: list[str] = []
    for w, p in zip(order, positions):
        if p in kept or w in governed:
            continue
        i, j = first_a[w], first_b[w]
        if i and j and a[i - 1] == b[j - 1] and a[i - 1] in governed and len(shared) < 8:
            continue  # "at room temperature" fronted: "temperature" follows "room" both times
        moved.append(w)
    return tuple(moved)


CLAUSE_MIN_WORDS = 3  # a clause moved whole carries at least this many shared words
CLAUSE_MAX_BLOCKS = 3


def _clauses_moved(positions: list[int]) -> bool:
    """Whether the shared words (``positions``: where each, in the cached prompt's order, first
    stands in the new one) moved as at most ``CLAUSE_MAX_BLOCKS`` whole runs of at least
    ``CLAUSE_MIN_WORDS`` words each: clauses put in another order ("For someone who works
    nights, what schedule makes sense?" / "What schedule makes sense if I work nights?"), a
    rewording's freedom. A near-miss scrambles single words ("conducted by A, produced by B"
    / "produced by A, conducted by B"), which splits the order into short runs."""
    by_new = sorted(range(len(positions)), key=positions.__getitem__)  # old index, in new order
    runs = [1]
    for previous, current in zip(by_new, by_new[1:]):
        if current == previous + 1:
            runs[-1] += 1
        else:
            runs.append(1)
    return 1 < len(runs) <= CLAUSE_MAX_BLOCKS and min(runs) >= CLAUSE_MIN_WORDS


def _heads(attachments: tuple[tuple[str, str], ...]) -> dict[str, tuple[str, ...]]:
    """Each object word -> the directional words that govern it."""
    heads: dict[str, list[str]] = {}
    for d, o in attachments:
        heads.setdefault(o, []).append(d)
    return {o: tuple(sorted(ds)) for o, ds in heads.items()}


def _one_increasing_subsequence(xs: list[int]) -> set[int]:
    """The values of one longest strictly increasing subsequence of distinct ints ``xs``."""
    tails: list[int] = []
    tail_at: list[int] = []  # index into xs of each tail
    parent = [-1] * len(xs)
    for i, x in enumerate(xs):
        k = bisect.bisect_left(tails, x)
        parent[i] = tail_at[k - 1] if k else -1
        tails[k : k + 1] = [x]
        tail_at[k : k + 1] = [i]
    kept, i = set(), tail_at[-1] if tail_at else -1
    while i >= 0:
        kept.add(xs[i])
        i = parent[i]
    return kept


def _substitutions(a: tuple[str, ...], b: tuple[str, ...]) -> list[tuple[str, str]]:
    """The substitutions aligning a to b, if that is all it takes (seed rule 4), else []."""
    if not a or not b:
        return []
    # Common prefix and suffix first (linear), so two long prompts that differ in a few words
    # leave difflib a short middle; difflib itself is quadratic in the worst case.
    lo = 0
    while lo < min(len(a), len(b)) and a[lo] == b[lo]:
        lo += 1
    hi = 0
    while hi < min(len(a), len(b)) - lo and a[-1 - hi] == b[-1 - hi]:
        hi += 1
    mid_a, mid_b = a[lo : len(a) - hi], b[lo : len(b) - hi]
    if set(mid_a).isdisjoint(mid_b):
        # Nothing to align inside: difflib would answer one replace (or an insertion), so skip
        # building its matcher, the larger part of this rule's cost on ordinary prompts.
        opcodes: Sequence[tuple[str, int, int, int, int]] = [
            ("replace" if mid_a and mid_b else "insert", 0, len(mid_a), 0, len(mid_b))
        ]
    else:
        opcodes = difflib.SequenceMatcher(
            a=mid_a, b=mid_b, autojunk=max(len(mid_a), len(mid_b)) > LONG_ALIGNMENT
        ).get_opcodes()
    subs: list[tuple[str, str]] = []
    common = lo + hi
    for op, i1, i2, j1, j2 in opcodes:
        a_part, b_part = mid_a[i1:i2], mid_b[j1:j2]
        if op == "equal":
            common += i2 - i1
        elif op == "replace" and i2 - i1 <= 2 and j2 - j1 <= 2:
            if i2 - i1 == j2 - j1 and all(map(_variants, a_part, b_part)):
                common += i2 - i1  # "help"/"helpful": one word in two forms, not a substitution
                continue
            if _joined(a_part, b_part):
                common += 1  # "multi year"/"multiyear": one word, written apart or joined
                continue
            subs.append((" ".join(a_part), " ".join(b_part)))
        else:
            return []
    return subs if common else []


def _added(pa: _Parsed, pb: _Parsed) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The content words only the cached and only the new prompt has, when that is the shape
    of one prompt asking for more than the other, else None.

    Framing and politeness (``words.FRAMING``) are set aside, and a word the other side has in
    another form ("summary"/"summarize") or of one interchangeable class counts as shared.
    Two shapes reject: words on one side only, beside at least one shared word ("explain
    photosynthesis" / "... simply"); and words on both sides in one place, between a common
    prefix and suffix of at least ``ADDED_MIN_SHARED`` words, where the two differing middles
    share at most ``ADDED_MAX_SHARED_INSIDE`` words (a long question with a different closing
    instruction). Middles that share more were reworded in place; words differing in several
    places are a rewording; short one-for-one swaps are the substitution rule's to judge.
    """
    lead_a, lead_b = _question_and_instruction(pa, pb)
    a = [w for i, w in enumerate(pa.content) if _counts(w, i, lead_a)]
    b = [w for i, w in enumerate(pb.content) if _counts(w, i, lead_b)]
    only_a, only_b, shared = _unshared(a, b)
    # a word said again adds nothing ("Who was Ada Lovelace and what did Ada Lovelace / she
    # invent?"): only words the other prompt lacks altogether are new content
    only_a = [w for w in only_a if w not in pb.content]
    only_b = [w for w in only_b if w not in pa.content]
    if not shared or not (only_a or only_b) or _joined(only_a, only_b):
        return None
    if only_a and only_b:
        prefix, suffix = _common_ends(a, b)
        if prefix + suffix < ADDED_MIN_SHARED:
            return None
        middle_a, middle_b = a[prefix : len(a) - suffix], b[prefix : len(b) - suffix]
        if _unshared(middle_a, middle_b)[2] > ADDED_MAX_SHARED_INSIDE:
            return None  # reworded in place, not replaced
    return tuple(only_a), tuple(only_b)


def _counts(word: str, position: int, lead: str) -> bool:
    """Whether a content word counts to the added rule: not framing, not a relative "who" ("a
    dog who loves snow" / "a dog that loves snow"), and not the leading word set aside by
    ``_question_and_instruction``."""
    if word in _FRAMING:
        return False
    if position:
        return word != "who"
    return word != lead


def _question_and_instruction(pa: _Parsed, pb: _Parsed) -> tuple[str, str]:
    """The leading words to set aside when one prompt asks as a question what the other asks as
    an instruction ("Who was Napoleon?" / "Tell me about Napoleon", "What is the plot of
    Macbeth?" / "Summarize the plot of Macbeth"): a question's opening "who", and an
    instruction's opening exposition verb, both only in that pairing. Anywhere else those words
    stay content ("Translate this and summarize it" asks for more than "Translate this")."""
    lead_a = lead_b = ""
    if _asks(pa) and _instructs(pb):
        lead_a, lead_b = "who", pb.tokens[0]
    elif _asks(pb) and _instructs(pa):
        lead_a, lead_b = pa.tokens[0], "who"
    return lead_a, lead_b


def _asks(p: _Parsed) -> bool:
    return bool(p.tokens) and p.tokens[0] in QUESTION_OPENERS


def _instructs(p: _Parsed) -> bool:
    return bool(p.tokens) and p.tokens[0] in EXPOSITION


def _unshared(a: list[str], b: list[str]) -> tuple[list[str], list[str], int]:
    """(words of a not in b, words of b not in a, how many are shared), as multisets in
    order, where two forms of one word or words of one interchangeable class match."""
    left_b = Counter(b)
    only_a: list[str] = []
    shared = 0
    for w in a:
        if left_b[w] > 0:
            left_b[w] -= 1
            shared += 1
        else:
            only_a.append(w)
    only_b: list[str] = []
    for w in reversed(b):  # b's unmatched words, in b's order
        if left_b[w] > 0:
            left_b[w] -= 1
            only_b.append(w)
    only_b.reverse()
    if only_a and only_b and len(only_a) * len(only_b) <= MATCH_MAX_PAIRS:
        for w in list(only_a):
            for x in only_b:
                if _variants(w, x):
                    only_a.remove(w)
                    only_b.remove(x)
                    shared += 1
                    break
    return only_a, only_b, shared


def _common_ends(a: list[str], b: list[str]) -> tuple[int, int]:
    """How many words a and b share as a common prefix, and then as a common suffix of what
    is left (a word matches its other forms and its interchangeable class)."""
    ends = []
    for pairs in (zip(a, b), zip(reversed(a), reversed(b))):
        n = 0
        for x, y in pairs:
            if x != y and not _variants(x, y):
                break
            n += 1
        ends.append(n)
    prefix = ends[0]
    return prefix, min(ends[1], len(a) - prefix, len(b) - prefix)


def _phrase(p: _Parsed, only: tuple[str, ...]) -> str:
    """The words of ``only`` as they stand in the prompt, with the directional words that
    lead into them ("without standard library"), runs joined by "...". """
    left = Counter(only)
    runs: list[list[str]] = [[]]
    pending: list[str] = []
    for w in p.skeleton:
        if w in DIRECTIONAL:
            pending.append(w)
        elif left[w] > 0:
            left[w] -= 1
            runs[-1] += pending[-1:] + [w]
            pending = []
        else:
            pending = []
            if w not in _FRAMING and runs[-1]:
                runs.append([])
    return " ... ".join(" ".join(run) for run in runs if run)
