"""LearnedDecision: the named rules as vetoes, then a score learned from tuning data.

Why: the guard's last four rules (``substitution``, ``added``, ``reordered``, ``crossed``) judge
the *shape* of an edit, and two rounds of hand-written exceptions to them plateaued. Here they
are features, weighed with the requests' similarity and how the words align (features.py) by a
logistic regression that bench/learn_decision.py fits on the project's tuning data alone and
writes to ``decision.json``; adding tuning pairs and refitting moves the decision without a new
rule. The named rules (numbers, negation, opposites, entities, roles, payloads, units,
confusables, constraints) stay rules and refuse before anything is scored.

Why integers: the verdict must be the same on every machine and run. Every feature is a count
but the similarity, which enters in thousandths; the weights are shipped as integers (millionths
of a logit per unit), so the score is an exact integer sum in a fixed order. What can differ
between machines is the similarity's last bits (bf16 against fp32 matmuls, another device): the
file states how many thousandths it may move (``drift``), and a pair whose score lies more than
``margin`` (that drift times the similarity's weight) from the cut gets the same verdict
everywhere; tests/guard/test_learned.py checks it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from typing import Any

from gpucache.guard.features import NAMES, Reader
from gpucache.guard.request import request_text
from gpucache.guard.verifier import Verdict

WEIGHTS_FILE = "decision.json"
SCALE = 1_000_000  # the weights' unit: a millionth of a logit


@dataclass(frozen=True)
class Weights:
    """A fitted decision: per feature (``NAMES`` order) its weight and the training data's mean
    (contributions are read against it), the score at that mean, the cut a pair must pass, and
    the similarity's possible drift between machines, in thousandths."""

    weights: tuple[int, ...]
    centre: tuple[int, ...]
    base: int
    cut: int
    drift: int

    def __post_init__(self) -> None:
        for name in ("weights", "centre"):
            values = getattr(self, name)
            if len(values) != len(NAMES) or not all(type(v) is int for v in values):
                raise ValueError(f"{WEIGHTS_FILE}: {name} must be {len(NAMES)} integers, one per feature")
        if not all(type(v) is int for v in (self.base, self.cut, self.drift)) or self.drift < 0:
            raise ValueError(f"{WEIGHTS_FILE}: base, cut and drift must be integers, drift not negative")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Weights:
        if list(doc.get("names", ())) != list(NAMES):
            raise ValueError(f"{WEIGHTS_FILE}: its features are not this version's ({', '.join(NAMES)})")
        return cls(tuple(doc["weights"]), tuple(doc["centre"]), doc["base"], doc["cut"], doc["drift"])

    @classmethod
    def shipped(cls) -> Weights:
        text = resources.files(__package__).joinpath(WEIGHTS_FILE).read_text("utf-8")
        return cls.from_json(json.loads(text))

    @property
    def margin(self) -> int:
        """How far the score can move when the similarity moves by ``drift`` thousandths."""
        return abs(self.weights[NAMES.index("similarity")]) * self.drift

    def contributions(self, values: tuple[int, ...]) -> tuple[int, ...]:
        """Each feature's share of the score, against the training data's mean pair."""
        return tuple(w * (v - c) for w, v, c in zip(self.weights, values, self.centre))

    def score(self, values: tuple[int, ...]) -> int:
        """The score in millionths of a logit: exact, in a fixed order."""
        total = self.base
        for part in self.contributions(values):
            total += part
        return total


@dataclass(frozen=True)
class Scored:
    """A pair the vetoes let pass: its score, the cut, and the features that moved it most."""

    score: int
    cut: int
    largest: tuple[tuple[str, int], ...]  # (feature, contribution), largest magnitude first

    @property
    def served(self) -> bool:
        return self.score > self.cut

    def detail(self) -> str:
        parts = ", ".join(f"{name} {part / SCALE:+.2f}" for name, part in self.largest)
        side = ">" if self.served else "<="
        return f"score {self.score / SCALE:.2f} {side} cut {self.cut / SCALE:.2f} ({parts})"


class LearnedDecision:
    """A ``HitVerifier`` that weighs the similarity: the named rules refuse first (either way
    round), then the learned score decides. ``judge`` is what the cache asks, the similarity an
    input; ``explain`` without one names the veto or leaves the decision to the score."""

    name = "learned"

    def __init__(self, weights: Weights | None = None) -> None:
        self.weights = Weights.shipped() if weights is None else weights

    def __repr__(self) -> str:
        return "LearnedDecision()"

    @cached_property
    def reader(self) -> Reader:
        return Reader()

    def request(self, prompt: str) -> str:
        """What the cache embeds of a prompt: the request without its framing, as the rules read it."""
        return request_text(prompt)

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        return not self.judge(cached_prompt, new_prompt, similarity).rejected

    def judge(self, cached_prompt: str, new_prompt: str, similarity: float) -> Verdict:
        """The veto that refuses the pair, or the score's verdict with its largest contributions."""
        reading = self.reader.read(cached_prompt, new_prompt, similarity)
        if reading.veto is not None:
            return reading.veto
        scored = self.scored(reading.values)
        words = tuple(name for name, _ in scored.largest)
        return Verdict(not scored.served, "score", scored.detail(), words)

    def scored(self, values: tuple[int, ...]) -> Scored:
        parts = self.weights.contributions(values)
        ranked = sorted(zip(NAMES, parts), key=lambda item: (-abs(item[1]), NAMES.index(item[0])))
        return Scored(self.weights.score(values), self.weights.cut, tuple(p for p in ranked[:3] if p[1]))

    def explain(self, cached_prompt: str, new_prompt: str, similarity: float | None = None) -> Verdict:
        """``judge`` where the similarity is known; without it, the veto that refuses the pair,
        or an acceptance that leaves the decision to the score (``rule`` "score")."""
        if similarity is not None:
            return self.judge(cached_prompt, new_prompt, similarity)
        reading = self.reader.read(cached_prompt, new_prompt, 1.0)
        if reading.veto is not None:
            return reading.veto
        return Verdict(False, "score", "no named difference: the score decides at the pair's similarity")


__all__ = ["SCALE", "WEIGHTS_FILE", "LearnedDecision", "Scored", "Weights"]
