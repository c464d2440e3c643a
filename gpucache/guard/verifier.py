"""The seam between "similar enough" and "safe to serve".

Embedding similarity says two prompts are about the same thing; it cannot say they ask the same
question ("convert 10 miles to km" and "convert 10 km to miles" score 0.99 with MiniLM). A
``HitVerifier`` gets the last word on every candidate above the threshold. Verifiers are pure
CPU functions of their inputs and import no torch, so they give the same answer everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class HitVerifier(Protocol):
    """Decides whether a candidate above the threshold may be served."""

    name: str

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        """True to serve the cached answer, False to treat the lookup as a miss."""
        ...


@runtime_checkable
class ExplainingVerifier(HitVerifier, Protocol):
    """A verifier that can say why: ``explain`` names the rule that decided a pair.

    The cache asks ``explain`` alone, once per candidate, and counts each rejection under its
    rule (``CacheStats.rejections``); ``verify`` must agree with it
    (``verify(a, b, s) == (not explain(a, b).rejected)``). A verifier without ``explain`` is
    asked ``verify``, and its rejections are counted under its name.
    """

    def explain(self, cached_prompt: str, new_prompt: str) -> Verdict:
        """The rule that decides this pair, and the words involved."""
        ...


@runtime_checkable
class WeighsSimilarity(HitVerifier, Protocol):
    """A verifier whose decision weighs the similarity too (learned.py): the cache asks
    ``judge`` with the candidate's similarity, once per candidate, and counts a rejection under
    its rule as it does ``explain``'s."""

    def judge(self, cached_prompt: str, new_prompt: str, similarity: float) -> Verdict:
        """The rule or score that decides this pair at this similarity."""
        ...


@runtime_checkable
class PreparesBatches(Protocol):
    """A verifier that scores pairs faster in a batch (the pair decision's model): the cache hands
    it every pair of a lookup batch it may be asked to judge, per scope, before it asks
    ``judge`` of each in turn. ``prepare`` changes no verdict, only how soon it comes."""

    def prepare(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Score these pairs (cached prompt, new prompt) now, for the ``judge`` calls that follow."""
        ...


@runtime_checkable
class ReadsRequests(Protocol):
    """A verifier that says what of a prompt is its request: the cache embeds ``request(p)``
    for its semantic tier, at store and at lookup alike, so that what the verifier sets aside
    (greetings, thanks, framing) does not pull a prompt below the threshold either."""

    def request(self, prompt: str) -> str:
        """The text of ``prompt`` that asks something."""
        ...


@dataclass(frozen=True)
class Verdict:
    """Why a verifier accepted or rejected a pair: the rule that fired and the words involved."""

    rejected: bool
    rule: str
    detail: str = ""
    words: tuple[str, ...] = ()

    def __str__(self) -> str:
        head = "reject" if self.rejected else "accept"
        return f"{head} ({self.rule}): {self.detail}" if self.detail else f"{head} ({self.rule})"


class ThresholdOnly:
    """Serves every candidate the threshold admits: similarity alone decides.

    Useful as a baseline in benchmarks and for caches whose prompts are machine-generated
    templates; never the right choice in front of people's free text.
    """

    name = "threshold-only"

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        return True

    def explain(self, cached_prompt: str, new_prompt: str) -> Verdict:
        return Verdict(False, self.name)
