"""Choosing an operating point from a deployment's own labelled pairs (``gpucache calibrate``).

Given pairs of prompts labelled same request (1) or different request (0), each with its
cosine similarity and the guard's verdict under every choice of soft rules, the operating point
is the threshold and the set of soft rules switched off that serve the most label-1 pairs
while the false-hit rate stays within a budget *on its 95% upper confidence bound*
(Clopper-Pearson, exact): with 200 different-request pairs and none served, the bound is 1.5%,
so a budget of 1% cannot be promised from that few, and the choice says so instead of
promising it.

Ties go to the higher threshold and then to fewer rules switched off: the more conservative
point. Thresholds are searched on a grid of thousandths, as integers, so the choice does not
depend on floating-point rounding of the grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from gpucache.guard.settings import SOFT_RULES

THRESHOLDS_MILLI = range(800, 1000, 5)  # 0.800 ... 0.995


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


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
    """One labelled pair: its label, its similarity in thousandths (rounded down), and for each
    set of skipped soft rules (``skip_sets()``) whether the guard accepts it."""

    label: int
    similarity_milli: int
    accepted: dict[tuple[str, ...], bool]


def skip_sets(rules: Sequence[str] = SOFT_RULES) -> list[tuple[str, ...]]:
    """Every set of soft rules that may be switched off, the empty one first."""
    return [combo for size in range(len(rules) + 1) for combo in combinations(rules, size)]


@dataclass(frozen=True)
class Choice:
    threshold_milli: int
    skip_rules: tuple[str, ...]
    hits: int  # label-1 pairs served
    positives: int
    false_hits: int  # label-0 pairs served
    negatives: int
    confidence: float

    @property
    def threshold(self) -> float:
        return self.threshold_milli / 1000

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
    """The operating point that serves the most label-1 pairs with the false-hit rate's upper
    bound within ``budget``; None where no point keeps it (too few label-0 pairs, or a
    budget below what the pairs allow)."""
    if not 0 < budget < 1:
        raise ValueError(f"budget must be in (0, 1), got {budget!r}")
    positives = sum(p.label == 1 for p in pairs)
    negatives = len(pairs) - positives
    best: Choice | None = None
    bounds: dict[int, float] = {}
    for skip in skip_sets():
        for t in THRESHOLDS_MILLI:
            served = [p for p in pairs if p.similarity_milli >= t and p.accepted[skip]]
            hits = sum(p.label == 1 for p in served)
            false_hits = len(served) - hits
            if false_hits not in bounds:
                bounds[false_hits] = upper_bound(false_hits, negatives, confidence)
            if bounds[false_hits] > budget:
                continue
            candidate = Choice(t, skip, hits, positives, false_hits, negatives, confidence)
            rank = (hits, t, -len(skip))
            if best is None or rank > (best.hits, best.threshold_milli, -len(best.skip_rules)):
                best = candidate
    return best


def to_toml(choice: Choice, command: str) -> str:
    """The settings file of a choice: read by ``SemanticCache.from_config`` and by
    ``gpucache serve --config``."""
    rules = ", ".join(f'"{r}"' for r in choice.skip_rules)
    return (
        f"# written by: {command}\n"
        f"# label-1 pairs served {choice.hits} of {choice.positives}; label-0 pairs served "
        f"{choice.false_hits} of {choice.negatives} (95% upper bound "
        f"{choice.false_hit_bound:.2%})\n"
        "[cache]\n"
        f"threshold = {choice.threshold_milli / 1000:.3f}\n"
        "[guard]\n"
        f"skip_rules = [{rules}]\n"
    )
