"""What the learned decision (learned.py) reads of a candidate pair: integers only.

Why integers: a decision the cache ships must be the same on every machine and run. Every
value here is a count or a ratio of counts from the two prompts' words and shipped data, but
the embedder's similarity, which differs in its last bits between machines and precisions; it
enters rounded to ``SIMILARITY_STEPS`` steps.

The named rules stay rules: a *veto* (numbers, negation, opposites, entities, direction and
roles, operators and payloads, units, confusables, constraints; gpucache/guard/lexical.py)
refuses before anything is scored. What the score weighs instead of a yes/no is what the soft
shape rules saw (``SOFT_RULES``: substitution, added, reordered, crossed) and how the words
align. The pair is read both ways round and every value made symmetric, so the verdict does not
depend on which prompt was stored first. bench/learn_decision.py fits the weights on these values, from tuning
data only.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucache.guard import differences
from gpucache.guard.lexical import SHAPE_RULES as SOFT_RULES
from gpucache.guard.lexical import LexicalNearMissVerifier
from gpucache.guard.parsing import parse
from gpucache.guard.request import dictionary, request_text
from gpucache.guard.verifier import Verdict

# The similarity in thousandths, rounded half up: the only input that is not a count of words
SIMILARITY_STEPS = 1000
# Counts past this are read as this: a very long prompt is no more different than a long one
CAP = 16

NAMES = (
    "similarity",  # the request texts' cosine, in thousandths
    "substitution",
    "added",
    "reordered",
    "crossed",  # the soft rule fired, either way round
    "identical",  # the requests read the same (framing, shorthand and spelling aside)
    "shared",  # content words matched
    "unmatched",  # content words either side has that the other does not match
    "unmatched_fewer",  # ... on the side with fewer of them
    "unknown",  # unmatched words no dictionary knows (names, jargon, codes)
    "kinds",  # unmatched words of a named kind (categories.txt) the vetoes let pass
    "content_fewer",
    "content_more",  # content words of the shorter and the longer request
    "overlap",  # shared / (shared + unmatched), in hundredths
)


@dataclass(frozen=True)
class Reading:
    """A pair as the decision sees it: the veto that refused it, or its features."""

    veto: Verdict | None
    values: tuple[int, ...]  # in ``NAMES`` order; empty where vetoed
    soft: tuple[str, ...] = ()  # the soft rules that fired, for ``explain``


def rounded(similarity: float) -> int:
    """The similarity in ``SIMILARITY_STEPS``, half up; clamped to [-1, 1]."""
    s = min(1.0, max(-1.0, float(similarity)))
    return int((s * SIMILARITY_STEPS * 2 + 1) // 2)


class Reader:
    """Reads pairs: the vetoes from a verifier with the soft rules off, the soft rules from one
    with them on.

    Each way round the full verifier runs first: its rules run in order and the first that
    fires decides, so where it names a hard rule that rule is the veto, and where it accepts no
    veto fires. Only where a soft rule fired first is the verifier without them asked whether a
    hard rule further down would: two readings of the pair, not four, in the common case."""

    def __init__(self, skip: tuple[str, ...] = ()) -> None:
        self.vetoes = LexicalNearMissVerifier(skip=tuple(sorted(set(skip) | set(SOFT_RULES))))
        self.rules = LexicalNearMissVerifier(skip=skip)

    def read(self, a: str, b: str, similarity: float) -> Reading:
        soft = set()
        for x, y in ((a, b), (b, a)):
            verdict = self.rules.explain(x, y)
            if verdict.rejected and verdict.rule in SOFT_RULES:
                soft.add(verdict.rule)
                verdict = self.vetoes.explain(x, y)
            if verdict.rejected:
                return Reading(verdict, ())
        found = tuple(sorted(soft))
        return Reading(None, values(a, b, rounded(similarity), found), found)


def values(a: str, b: str, similarity: int, soft: tuple[str, ...]) -> tuple[int, ...]:
    """The features of a pair the vetoes let pass, in ``NAMES`` order."""
    text_a, text_b = differences.reconcile(request_text(a), request_text(b))
    pa, pb = parse(text_a), parse(text_b)
    diff = differences.align(pa, pb)
    only = diff.only_a + diff.only_b
    words = dictionary()
    kinds = sum(differences.kind_of(w, frozenset()) is not None for w in only)
    shared = min(diff.shared, CAP)
    unmatched = min(len(only), CAP)
    return (
        similarity,
        *(int(rule in soft) for rule in SOFT_RULES),
        int(pa.tokens == pb.tokens),
        shared,
        unmatched,
        min(len(diff.only_a), len(diff.only_b), CAP),
        min(sum(w not in words for w in only), CAP),
        min(kinds, CAP),
        min(len(pa.content), len(pb.content), CAP),
        min(max(len(pa.content), len(pb.content)), CAP),
        (100 * diff.shared) // max(1, diff.shared + len(only)),
    )
