"""``GuardSettings``: which of the guard's soft rules run. A deployment that measured its own
traffic (``gpucache calibrate``) may switch soft rules off; the hard ones (numbers, negation,
polarity, direction, symbols, payload and the named kinds) always run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The rules a calibration may switch off: each trades wrong answers for hits on some traffic.
# The rest guard the cache's promise on every traffic and stay on.
SOFT_RULES = ("added", "substitution", "reordered", "crossed", "constraint")


@dataclass(frozen=True)
class GuardSettings:
    skip_rules: tuple[str, ...] = field(
        default=(),
        metadata={
            "doc": f"soft rules of the guard not to run ({', '.join(SOFT_RULES)}), as gpucache calibrate "
            "chooses them; none by default"
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.skip_rules, str) or not all(isinstance(r, str) for r in self.skip_rules):
            raise ValueError(f"skip_rules must be a list of rule names, got {self.skip_rules!r}")
        hard = sorted(set(self.skip_rules) - set(SOFT_RULES))
        if hard:
            raise ValueError(f"only soft rules may be skipped ({', '.join(SOFT_RULES)}), not {hard}")
        object.__setattr__(self, "skip_rules", tuple(r for r in SOFT_RULES if r in self.skip_rules))

    def build(self) -> Any:
        """The ``LexicalNearMissVerifier`` these settings name."""
        from gpucache.guard.lexical import LexicalNearMissVerifier

        return LexicalNearMissVerifier(skip=self.skip_rules)
