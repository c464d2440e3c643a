"""Choosing an operating point from a deployment's own labelled pairs (``gpucache calibrate``).

Given pairs of prompts labelled same request (1) or different request (0), each with its
cosine similarity and the guard's verdict under every choice of soft rules, the operating point
is the threshold and the set of soft rules switched off (or the learned or the pair decision in
their place) that serve the most label-1 pairs
while the false-hit rate stays within a budget *on its 95% upper confidence bound*
(Clopper-Pearson, exact): with 200 different-request pairs and none served, the bound is 1.5%,
so a budget of 1% cannot be promised from that few, and the choice says so instead of
promising it.

The bound must account for the choice. The point is picked among every threshold and every set
of soft rules or the learned or the pair decision (34 x 40 candidates); bounding the picked point on the
same pairs that picked it would favour whichever candidate was luckiest on them, and in a
simulation the chosen point was truly over budget in 7-12% of draws, not 5%. So the pairs are
split in two halves by a hash of their text (``fold_of``: SHA-256, the same split on every
machine and in any order): the point is chosen on one half, and its figures and its bound are
those of the other half, where it was not chosen. A point that the held-out half cannot confirm
within the budget is no choice.

Ties go to the higher threshold and then to fewer rules switched off: the more conservative
point. Thresholds are searched on a grid of thousandths, as integers, so the choice does not
depend on floating-point rounding of the grid.

The same pairs should choose the same point on every machine. The similarities are what could
differ: ``gpucache calibrate`` embeds in fp32 whatever the machine would serve in (a CPU with
native bf16 moves similarities by up to a few thousandths, enough to move a pair across a
threshold), and computes each similarity in float64 from those vectors; machines then differ in
about the seventh place, from their matrix kernels' order of sums. ``similarity_milli`` rounds
to a stated precision, ``PLACES`` decimals, before it compares: a pair that one machine puts a
hair below a threshold and another a hair above counts the same on both. What remains is a pair
within that difference of a rounding midpoint. A cache that serves in half precision computes
its similarities a little differently again (its embeddings keep 0.9999 cosine with fp32's):
the printed "near the threshold" count says how many pairs lie close enough to the chosen
threshold for that to matter.
"""

from __future__ import annotations

import hashlib
import json
import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from gpucache.guard.settings import SOFT_RULES

THRESHOLDS_MILLI = range(800, 1000, 5)  # 0.800 ... 0.995
# The learned decision (learned.py) and the pair decision (pair.py), two more candidates beside
# the sets of skipped soft rules: each weighs the soft rules' verdict with a score, and ranks with
# a set of one rule off in a tie (the learned decision first)
LEARNED: tuple[str, ...] = ("learned",)
PAIR: tuple[str, ...] = ("pair",)
DECISIONS = {LEARNED: "learned", PAIR: "pair"}
PLACES = 4  # similarities agreeing to this many decimal places are one similarity


def similarity_milli(similarity: float) -> int:
    """A similarity in thousandths as calibration compares it with a threshold: rounded to
    ``PLACES`` decimals, then down to thousandths (a pair is served at a threshold it reaches,
    as in the cache), in integers. 0.87499997 and 0.87500003, one pair on two machines, are both
    875. At most 1000: a prompt's similarity with itself may come out a hair above one."""
    units = round(similarity * 10**PLACES)  # correctly rounded IEEE steps: alike on every machine
    return min(1000, units // 10 ** (PLACES - 3))


def near(similarities: Sequence[float], threshold_milli: int) -> int:
    """How many similarities lie within half a thousandth of the threshold: the pairs whose side
    of it a cache serving in half precision could decide otherwise."""
    edge = threshold_milli / 1000
    return sum(abs(s - edge) < 0.0005 for s in similarities)


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return (
        math.lgamma(n + 1)
        - math.lgamma(k + 1)
        - math.lgamma(n - k + 1)
        + k * math.log(p)
        + (n - k) * math.log1p(-p)
    )


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))


def _bisect(f, target: float) -> float:  # type: ignore[no-untyped-def]
    """The p in [0, 1] where the decreasing f(p) crosses ``target``."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper-Pearson upper bound of a rate seen as ``k`` of ``n``."""
    if n <= 0 or k >= n:
        return 1.0
    return _bisect(lambda p: binomial_cdf(k, n, p), 1.0 - confidence)


def interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided Clopper-Pearson interval of a rate seen as ``k`` of ``n``."""
    if n <= 0:
        return 0.0, 1.0
    alpha = (1.0 - confidence) / 2
    # P(X >= k) = alpha at the lower end, that is P(X <= k - 1) = 1 - alpha (decreasing in p)
    low = 0.0 if k == 0 else _bisect(lambda p: binomial_cdf(k - 1, n, p), 1.0 - alpha)
    high = 1.0 if k == n else _bisect(lambda p: binomial_cdf(k, n, p), alpha)
    return low, high


@dataclass(frozen=True)
class Scored:
    """One labelled pair: its label, its similarity in thousandths (``similarity_milli``), and
    for each set of skipped soft rules (``skip_sets()``) whether the guard accepts it."""

    label: int
    similarity_milli: int
    accepted: dict[tuple[str, ...], bool]  # by skip set, and by ``LEARNED`` and ``PAIR``
    fold: int = 0  # 0: the pairs the point is chosen on; 1: those it is confirmed on (fold_of)


def fold_of(a: str, b: str) -> int:
    """The half a pair falls in, from its text alone: a file splits the same way on every
    machine, in every run and in any order of its lines (SHA-256, never ``hash()``)."""
    digest = hashlib.sha256(b"%d:" % len(a) + (a + b).encode("utf-8", "surrogatepass")).digest()
    return digest[0] & 1


def skip_sets(rules: Sequence[str] = SOFT_RULES) -> list[tuple[str, ...]]:
    """Every set of soft rules that may be switched off, the empty one first."""
    return [combo for size in range(len(rules) + 1) for combo in combinations(rules, size)]


def candidates(pairs: Sequence[Scored]) -> list[tuple[str, ...]]:
    """The decisions the pairs were judged under: every skip set, and the learned and the pair
    decision where the pairs carry their verdicts."""
    return skip_sets() + [d for d in DECISIONS if pairs and all(d in p.accepted for p in pairs)]


@dataclass(frozen=True)
class Choice:
    """An operating point and its figures on the held-out half (the pairs it was not chosen on)."""

    threshold_milli: int
    skip_rules: tuple[str, ...]
    hits: int  # label-1 pairs served
    positives: int
    false_hits: int  # label-0 pairs served
    negatives: int
    confidence: float
    chosen_on: int = 0  # pairs in the half the point was chosen on

    @property
    def threshold(self) -> float:
        return self.threshold_milli / 1000

    @property
    def decision(self) -> str:
        return DECISIONS.get(self.skip_rules, "rules")

    @property
    def hit_rate(self) -> float:
        return self.hits / self.positives if self.positives else 0.0

    @property
    def false_hit_rate(self) -> float:
        return self.false_hits / self.negatives if self.negatives else 0.0

    @property
    def false_hit_bound(self) -> float:
        return upper_bound(self.false_hits, self.negatives, self.confidence)


def choose(pairs: Sequence[Scored], budget: float, confidence: float = 0.95) -> Choice | None:
    """The operating point that serves the most label-1 pairs of fold 0 with their false-hit
    bound within ``budget``, with its figures on fold 1; None where fold 0 allows no point or
    fold 1 does not confirm the chosen one within the budget (too few label-0 pairs, or a
    budget below what the pairs allow)."""
    if not 0 < budget < 1:
        raise ValueError(f"budget must be in (0, 1), got {budget!r}")
    choosing = [p for p in pairs if p.fold == 0]
    held_out = [p for p in pairs if p.fold != 0]
    picked = best_point(choosing, budget, confidence)
    if picked is None or not held_out:
        return None
    t, skip = picked
    served = [p for p in held_out if p.similarity_milli >= t and p.accepted[skip]]
    hits = sum(p.label == 1 for p in served)
    positives = sum(p.label == 1 for p in held_out)
    choice = Choice(
        t,
        skip,
        hits,
        positives,
        len(served) - hits,
        len(held_out) - positives,
        confidence,
        chosen_on=len(choosing),
    )
    return choice if choice.false_hit_bound <= budget else None


def most_false_hits(negatives: int, budget: float, confidence: float = 0.95) -> int:
    """The most label-0 pairs of ``negatives`` that may be served with the bound within
    ``budget`` (-1: not even none). The bound grows with the count, so a bisection on it."""
    if upper_bound(0, negatives, confidence) > budget:
        return -1
    lo, hi = 0, negatives  # bound(lo) <= budget < bound(hi): bound(negatives) is 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if upper_bound(mid, negatives, confidence) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def best_point(
    pairs: Sequence[Scored], budget: float, confidence: float = 0.95
) -> tuple[int, tuple[str, ...]] | None:
    """The (threshold, skipped rules) serving the most label-1 ``pairs`` with the false-hit
    rate's upper bound on these same pairs within ``budget`` (a selection: its own bound is
    optimistic, which is why ``choose`` confirms it on other pairs)."""
    negatives = sum(p.label != 1 for p in pairs)
    allowed = most_false_hits(negatives, budget, confidence)
    if allowed < 0:
        return None
    best: tuple[tuple[int, int, int], tuple[int, tuple[str, ...]]] | None = None
    for skip in candidates(pairs):
        # the similarities of the pairs these rules accept, sorted: those served at threshold t
        # are the ones at or above it (integers, no rounding)
        right = sorted(p.similarity_milli for p in pairs if p.accepted[skip] and p.label == 1)
        wrong = sorted(p.similarity_milli for p in pairs if p.accepted[skip] and p.label != 1)
        for t in THRESHOLDS_MILLI:
            hits = len(right) - bisect_left(right, t)
            false_hits = len(wrong) - bisect_left(wrong, t)
            if false_hits > allowed:
                continue
            rank = (hits, t, -len(skip))
            if best is None or rank > best[0]:
                best = (rank, (t, skip))
    return None if best is None else best[1]


def to_toml(choice: Choice, command: str, model: str | None = None) -> str:
    """The settings file of a choice: read by ``SemanticCache.from_config`` and by
    ``gpucache serve --config``. ``model``, where one was named, is recorded: a threshold holds
    only for the model whose similarities chose it."""
    rules = "" if choice.decision != "rules" else ", ".join(f'"{r}"' for r in choice.skip_rules)
    return (
        f"# written by: {command}\n"
        f"# chosen on {choice.chosen_on} pairs; on the {choice.positives + choice.negatives} held out: "
        f"label-1 pairs served {choice.hits} of {choice.positives}, label-0 pairs served "
        f"{choice.false_hits} of {choice.negatives} ({choice.confidence:.0%} upper bound "
        f"{choice.false_hit_bound:.2%})\n"
        + (f"[embedder]\nmodel = {json.dumps(model)}\n" if model else "")
        + "[cache]\n"
        f"threshold = {choice.threshold_milli / 1000:.3f}\n"
        "[guard]\n"
        f"skip_rules = [{rules}]\n"
        f'decision = "{choice.decision}"\n'
    )
