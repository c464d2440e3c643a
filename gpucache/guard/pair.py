"""PairDecision: the named rules as vetoes, then the pair model (gpucache/pairing/) decides.

Why: the guard's soft shape rules (``substitution``, ``added``, ``reordered``, ``crossed``)
guessed from an edit's shape whether it changed the request, and refused about a third of real
rewordings on every set the project was measured on from outside, while the traps that passed
them ("…if I'm employed?" / "…if I'm self-employed?") set how high the threshold had to sit. A
cross-encoder reads the two prompts together instead. The named rules (numbers, negation,
opposites, confusables, entities, direction and roles, operators and payloads, units,
constraints) stay rules and refuse first, either way round; past them the model's score decides,
with the soft rules' verdict as its prior: a pair they refuse is served only where the score
passes one cut, a pair they accept is refused where it falls below another (both chosen on
tuning data the model never learned from, cross-validated across files: bench/pair_tuning.py).

Deterministic: the score is rounded (pairing/model.py) and a pair scoring within the shipped
margin of the cut is a miss, so a verdict outside that margin is the same on every machine. A
pair longer than the model reads is judged by the full rules, as before.

The cache may score a lookup batch's candidates in one pass first (``prepare``): the scores are
kept, per reader (guard/memo.py), for the ``judge`` calls that follow.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from gpucache.guard.features import rounded as rounded_similarity
from gpucache.guard.lexical import SHAPE_RULES, LexicalNearMissVerifier
from gpucache.guard.memo import current_reader
from gpucache.guard.request import request_text
from gpucache.guard.verifier import Verdict
from gpucache.pairing.meta import NEVER

SCORES_KEPT = 4096  # scores kept between ``prepare`` and ``judge``, every reader's together


def _key(reader: str, a: str, b: str) -> tuple[str, str, str]:
    """A kept score's key: the reader and the pair in one order (the score is symmetric)."""
    return (reader, a, b) if a <= b else (reader, b, a)


class PairDecision:
    """A ``HitVerifier``: the vetoes, then the pair model's score against its cut."""

    name = "pair"

    def __init__(self, model: Any = None, *, device: str = "cpu") -> None:
        self._model = model
        self._device = device
        self._scores: OrderedDict[tuple[str, str, str], int | None] = OrderedDict()
        self._scores_lock = threading.Lock()  # guards _scores alone; no model call under it
        self.vetoes = LexicalNearMissVerifier(skip=SHAPE_RULES)
        self.rules = LexicalNearMissVerifier()

    def __repr__(self) -> str:
        return f"PairDecision(device={self._device!r})"

    @cached_property
    def model(self) -> Any:
        if self._model is None:
            from gpucache.pairing.model import PairModel

            self._model = PairModel(self._device)
        return self._model

    def request(self, prompt: str) -> str:
        """What the cache embeds of a prompt: the request without its framing, as the rules read it."""
        return request_text(prompt)

    def veto(self, a: str, b: str) -> Verdict:
        """The named rule that refuses the pair (either way round), or an acceptance: "identical"
        where the requests read the same, else "pass" (the model decides)."""
        accepted = None
        for x, y in ((a, b), (b, a)):
            verdict = self.vetoes.explain(x, y)
            if verdict.rejected:
                return verdict
            accepted = accepted or verdict
        return accepted if accepted is not None and accepted.rule == "identical" else Verdict(False, "pass")

    def prepare(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Score in one pass every pair the vetoes let through and the model has not scored."""
        reader = current_reader()
        todo = []
        for a, b in dict.fromkeys(pairs):
            key = _key(reader, a, b)
            with self._scores_lock:
                known = key in self._scores
            if not known and self.asks_model(a, b):
                todo.append((key, a, b))
        if todo:
            self._keep(zip((k for k, _, _ in todo), self.model.scores([(a, b) for _, a, b in todo])))

    def _keep(self, scored: Any) -> None:
        with self._scores_lock:
            for key, score in scored:
                self._scores[key] = score
                self._scores.move_to_end(key)
            while len(self._scores) > SCORES_KEPT:
                self._scores.popitem(last=False)

    def score(self, a: str, b: str) -> int | None:
        key = _key(current_reader(), a, b)
        with self._scores_lock:
            if key in self._scores:
                return self._scores[key]
        (found,) = self.model.scores([(a, b)])
        self._keep([(key, found)])
        return found

    def verify(self, cached_prompt: str, new_prompt: str, similarity: float) -> bool:
        return not self.judge(cached_prompt, new_prompt, similarity).rejected

    def judge(self, cached_prompt: str, new_prompt: str, similarity: float) -> Verdict:
        """Below the floor a miss; the veto that refuses the pair; else the model's verdict,
        against the cut for what the soft rules refuse or the cut for what they accept, served
        only past it by more than the margin. A pair too long for the model: the full rules."""
        meta = self.model.meta
        if rounded_similarity(similarity) < meta.floor:
            return Verdict(
                True, "floor", f"similarity below the pair decision's floor {meta.floor / 1000:.3f}"
            )
        verdict = self.veto(cached_prompt, new_prompt)
        if verdict.rule != "pass":
            return verdict
        rules = self.soft(cached_prompt, new_prompt)
        cut = self.cut_for(rules)
        if abs(cut) >= NEVER:  # the design leaves this side to the rules: the model is not asked
            return rules
        score = self.score(cached_prompt, new_prompt)
        if score is None:
            return rules if rules.rejected else Verdict(False, "rules", "too long for the pair model")
        served = score > cut + meta.margin
        side = ">" if served else "<="
        rule = f"the rules {'refuse' if rules.rejected else 'accept'} ({rules.rule})"
        detail = (
            f"{rule}; score {score / 100:.2f} {side} cut {cut / 100:.2f} + margin {meta.margin / 100:.2f}"
        )
        return Verdict(not served, "pair", detail)

    def cut_for(self, rules: Verdict) -> int:
        """The cut for a pair the full rules refuse (``cut``) or accept (``keep_cut``)."""
        meta = self.model.meta
        return int(meta.cut if rules.rejected else meta.keep_cut)

    def asks_model(self, a: str, b: str) -> bool:
        """Whether ``judge`` would ask the model about this pair (at a similarity past the floor)."""
        return self.veto(a, b).rule == "pass" and abs(self.cut_for(self.soft(a, b))) < NEVER

    def soft(self, a: str, b: str) -> Verdict:
        """The full rules' verdict, either way round (past the vetoes, a soft rule's or an acceptance)."""
        verdict = self.rules.explain(a, b)
        return verdict if verdict.rejected else self.rules.explain(b, a)

    def explain(self, cached_prompt: str, new_prompt: str, similarity: float | None = None) -> Verdict:
        return self.judge(cached_prompt, new_prompt, 1.0 if similarity is None else similarity)


__all__ = ["PairDecision"]
