"""The shapes of a near-miss that the lexical verifier still looks for (lexical.py runs them as
its rules): poles swapped, words traded or crossed around a role word, words reordered one by
one in a long near-identical sentence, one-word substitutions in a near-identical edit. Each is
a pure function of two parsed prompts (parsing.py): no floating point, no ``hash()``, no torch.
"""

from __future__ import annotations

import bisect
import difflib
import os
from collections import Counter
from collections.abc import Sequence

from gpucache.guard.parsing import Parsed
from gpucache.guard.words import (
    ANTONYM,
    ARTICLES,
    COORDINATORS,
    CROSSED_MAX_CONTENT,
    CROSSED_MAX_SHARED,
    INTERCHANGEABLE,
    LONG_ALIGNMENT,
    MOVED_MIN_SHARED,
    POLARITY_AXES,
    ROLE_WORDS,
)


def poles_swapped(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    """True when some polarity pair has more of one pole on one side and more of the other
    pole on the other side ("to" became "from"), not merely a word present on one side."""
    ca, cb = Counter(a), Counter(b)
    for pair in {i for i, _ in a} | {i for i, _ in b}:
        d0 = ca[(pair, 0)] - cb[(pair, 0)]
        d1 = ca[(pair, 1)] - cb[(pair, 1)]
        if d0 * d1 < 0:
            return True
    return False


def polar_words(a: Parsed, b: Parsed) -> tuple[str, ...]:
    pa = Counter(a.polarity)
    pb = Counter(b.polarity)
    only_a = [POLARITY_AXES[i][pole][0] for i, pole in (pa - pb).elements()]
    only_b = [POLARITY_AXES[i][pole][0] for i, pole in (pb - pa).elements()]
    return (" ".join(only_a) or "-", " ".join(only_b) or "-")


def split_antonym(set_a: frozenset[str], set_b: frozenset[str]) -> tuple[str, str] | None:
    for word in sorted(set_a):
        for opposite in ANTONYM.get(word, ()):
            if opposite in set_b and opposite not in set_a and word not in set_b:
                return word, opposite
    return None


def word_root(word: str) -> str:
    """The word less up to two final vowels of its ending ("movie"/"movy" -> "mov"), since the
    light stemmer leaves "movies" and "movie", "dating" and "date" in different forms."""
    for _ in range(2):
        if len(word) > 3 and word[-1] in "eiy":
            word = word[:-1]
    return word


def variants(x: str, y: str) -> bool:
    """Two forms of one word, or two words of one interchangeable class: not a substitution.

    Forms of one word: one is a prefix of the other sharing at least 4 letters ("help" /
    "helpful"), the same root ("movie" / "movies"), or a common prefix of 6 letters or more
    covering at least 80% of the shorter word ("defragmentation" / "defragmenter"; but not
    "internship" / "internet").
    """
    if x in INTERCHANGEABLE and INTERCHANGEABLE.get(y) == INTERCHANGEABLE[x]:
        return True
    short, long_ = sorted((x, y), key=len)
    if not short.isalpha():
        return False
    if len(short) >= 4 and long_.startswith(short):
        return True
    root = word_root(short)
    if len(root) >= 3 and root == word_root(long_):
        return True
    common = len(os.path.commonprefix((short, long_)))
    return common >= 6 and 5 * common >= 4 * len(short)


def joined(a: Sequence[str], b: Sequence[str]) -> bool:
    """One word written apart on one side and joined on the other ("multi year"/"multiyear",
    "web site"/"website"): two words against one whose letters they spell in order. The
    stemmer only touches a word's ending, so the first word's stem is its written form."""
    if sorted((len(a), len(b))) != [1, 2]:
        return False
    one, two = (a, b) if len(a) == 1 else (b, a)
    return len(one[0]) >= 5 and "".join(two) == one[0]


def coordinated(tokens: tuple[str, ...], x: str, y: str) -> bool:
    """Whether ``x`` and ``y`` are joined by "or" or "and" ("Python or Java", "the salt and the
    sugar"): two words joined that way trade places without changing the question, unlike a
    subject and an object ("dog bites man"). Numbers are never coordinated: "divide 10 and 5"
    and "divide 5 and 10" differ."""
    if not (x.isalpha() and y.isalpha()):
        return False
    places = [i for i, t in enumerate(tokens) if t in (x, y)]
    for i, j in zip(places, places[1:]):
        between = tokens[i + 1 : j]
        if (
            {tokens[i], tokens[j]} == {x, y}
            and any(t in COORDINATORS for t in between)
            and all(t in COORDINATORS or t in ARTICLES for t in between)
        ):
            return True
    return False


def crossed(pa: Parsed, pb: Parsed) -> tuple[str, str] | None:
    """Two shared content words on opposite sides of a directional word in each prompt, in
    opposite order, where the rest of the prompts differ ("how much is 100 EUR in USD" /
    "convert 100 USD to EUR"): the founding direction rule for prompts that are not otherwise
    identical. A phrase moved whole keeps its directional word ("from London to Paris" /
    "to Paris from London") and does not count."""
    shared = set(pa.content) & set(pb.content)
    if not 2 <= len(shared) <= CROSSED_MAX_SHARED:
        return None
    if max(len(pa.content), len(pb.content)) > CROSSED_MAX_CONTENT:
        return None  # long prompts move clauses whole in rewordings: roles are told elsewhere
    first_a = first_positions(pa.skeleton, shared)
    first_b = first_positions(pb.skeleton, shared)
    heads_a, heads_b = heads(pa.attachments), heads(pb.attachments)
    # numbers keep their own rule: "the last 5 commits in git" / "in git, the five most recent"
    words = sorted((w for w in shared if not w[:1].isdigit()), key=first_a.__getitem__)
    for i, x in enumerate(words):
        for y in words[i + 1 :]:
            if first_b[x] < first_b[y]:
                continue
            if heads_a.get(x) == heads_b.get(x) and heads_a.get(y) == heads_b.get(y):
                continue
            between_a = pa.skeleton[first_a[x] + 1 : first_a[y]]
            between_b = pb.skeleton[first_b[y] + 1 : first_b[x]]
            if any(t in ROLE_WORDS for t in between_a) and any(t in ROLE_WORDS for t in between_b):
                return x, y
    return None


def first_positions(sequence: tuple[str, ...], words: set[str]) -> dict[str, int]:
    first: dict[str, int] = {}
    for i, w in enumerate(sequence):
        if w in words:
            first.setdefault(w, i)
    return first


def reordered(pa: Parsed, pb: Parsed) -> tuple[str, ...]:
    """Shared content words that changed order, when the prompts share most of their content
    words (Jaccard >= 0.6, at least ``MOVED_MIN_SHARED``): the shape of a word-scrambled
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
    if len(shared) < MOVED_MIN_SHARED or 5 * len(shared) < 3 * len(set(a) | set(b)):
        return ()
    first_a: dict[str, int] = {}
    first_b: dict[str, int] = {}
    for i, w in enumerate(a):
        first_a.setdefault(w, i)
    for i, w in enumerate(b):
        first_b.setdefault(w, i)
    order = sorted(shared, key=first_a.__getitem__)
    positions = [first_b[w] for w in order]
    kept = one_increasing_subsequence(positions)
    if len(kept) == len(positions) or clauses_moved(positions):
        return ()
    heads_a = heads(pa.attachments)
    heads_b = heads(pb.attachments)
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


def clauses_moved(positions: list[int]) -> bool:
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


def heads(attachments: tuple[tuple[str, str], ...]) -> dict[str, tuple[str, ...]]:
    """Each object word -> the directional words that govern it."""
    heads: dict[str, list[str]] = {}
    for d, o in attachments:
        heads.setdefault(o, []).append(d)
    return {o: tuple(sorted(ds)) for o, ds in heads.items()}


def one_increasing_subsequence(xs: list[int]) -> set[int]:
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


def substitutions(a: tuple[str, ...], b: tuple[str, ...]) -> list[tuple[str, str]]:
    """The substitutions aligning a to b, if that is all it takes (the founding substitution
    rule), else []."""
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
            # "help"/"helpful": one word in two forms; "multi year"/"multiyear": one word,
            # written apart or joined. Neither is a substitution (nor a word in common: a
            # substitution needs one, and a part of its own has an equal part beside it)
            if i2 - i1 == j2 - j1 and all(map(variants, a_part, b_part)) or joined(a_part, b_part):
                continue
            subs.append((" ".join(a_part), " ".join(b_part)))
        else:
            return []
    return subs if common else []
