"""``GuardSettings``: how the guard decides. ``decision = "rules"`` (the default) runs every rule
in order (lexical.py), and a deployment that measured its own traffic (``gpucache calibrate``)
may switch soft rules off; ``decision = "learned"`` keeps the named rules as vetoes and lets a
score fitted on tuning data replace the soft ones (learned.py); ``decision = "pair"`` keeps them
and lets the pair model, a cross-encoder that reads both prompts together, decide past them
(pair.py, gpucache/pairing/). The hard rules (numbers, negation, polarity, direction, symbols,
payload and the named kinds) run in all three."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The rules a calibration may switch off: each trades wrong answers for hits on some traffic.
# The rest guard the cache's promise on every traffic and stay on.
SOFT_RULES = ("added", "substitution", "reordered", "crossed", "constraint")
DECISIONS = ("rules", "learned", "pair")


@dataclass(frozen=True)
class GuardSettings:
    skip_rules: tuple[str, ...] = field(
        default=(),
        metadata={
            "doc": f"soft rules of the guard not to run ({', '.join(SOFT_RULES)}), as gpucache calibrate "
            "chooses them; none by default"
        },
    )
    decision: str = field(
        default="rules",
        metadata={
            "doc": "how the guard decides past its named rules: rules (the soft shape rules, in order) or "
            "learned (a score fitted on tuning data) or pair (the pair model reads both prompts; "
            "docs/guard.md); rules by default"
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.skip_rules, str) or not all(isinstance(r, str) for r in self.skip_rules):
            raise ValueError(f"skip_rules must be a list of rule names, got {self.skip_rules!r}")
        hard = sorted(set(self.skip_rules) - set(SOFT_RULES))
        if hard:
            raise ValueError(f"only soft rules may be skipped ({', '.join(SOFT_RULES)}), not {hard}")
        object.__setattr__(self, "skip_rules", tuple(r for r in SOFT_RULES if r in self.skip_rules))
        if self.decision not in DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, got {self.decision!r}")
        if self.decision != "rules" and self.skip_rules:
            raise ValueError(
                f"skip_rules names soft rules of the rules decision; the {self.decision} decision has none"
            )

    def build(self, device: Any = "cpu") -> Any:
        """The verifier these settings name: a ``LexicalNearMissVerifier``, a ``LearnedDecision`` or
        a ``PairDecision`` whose model runs on ``device`` (the embedder's)."""
        if self.decision == "pair":
            from gpucache.guard.pair import PairDecision

            return PairDecision(device=str(device))
        if self.decision == "learned":
            from gpucache.guard.learned import LearnedDecision

            return LearnedDecision()
        from gpucache.guard.lexical import LexicalNearMissVerifier

        return LexicalNearMissVerifier(skip=self.skip_rules)
