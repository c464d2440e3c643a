"""Labelled pairs and intents for the false-hit benchmark (bench/false_hits.py): reading them,
the split into a tuning and a report half, the threshold sweep and the replay."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpucache.cache.semantic import SemanticCache
from gpucache.embedding.model import Embedder
from gpucache.guard.lexical import ADDED_RULES, RULES, LexicalNearMissVerifier
from gpucache.guard.verifier import HitVerifier, ReadsRequests, ThresholdOnly
from gpucache.pairing.training.halves import HALVES, half_of

THRESHOLDS = tuple(sorted({round(0.70 + 0.01 * i, 2) for i in range(29)} | {0.875}))


NEAR_MISS_JACCARD = 0.8


# The tuning and report halves: gpucache/pairing/training/halves.py (the pair model trains on
# the tuning half, so the split lives in the package).


def select_half(rows: list[dict[str, object]], half: str, path: str | Path) -> list[dict[str, object]]:
    """The rows of one half ("tune", "report"), or all of them ("all"). A row without an
    "id" is named by its file and line."""
    if half not in HALVES:
        raise ValueError(f"half must be one of {', '.join(HALVES)}, not {half!r}")
    if half == "all":
        return rows
    stem = Path(path).stem
    return [r for n, r in enumerate(rows, 1) if half_of(str(r.get("id") or f"{stem}:{n}")) == half]


def read_jsonl(path: str | Path) -> list[dict[str, object]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not a JSON line ({exc.msg})") from exc
    return rows


def word_jaccard(a: str, b: str) -> float:
    wa, wb = set(a.lower().split()), set(b.lower().split())
    return len(wa & wb) / len(wa | wb) if wa | wb else 1.0


@dataclass(frozen=True)
class Rates:
    false_hit: float
    hit: float
    near_miss_false_hit: float


@dataclass
class PairResult:
    name: str
    pairs: int
    label0: int
    label1: int
    near_misses: int
    similarity: list[float]
    labels: list[int]
    accepted: list[bool]  # verifier's answer per pair
    near_miss: list[bool]
    rejected_by_rule: dict[str, int] = field(default_factory=dict)
    rule: list[str] = field(default_factory=list)  # the rule that rejected each pair, "" if none
    verify_us_cold: float = 0.0  # median, neither prompt seen before
    verify_us_warm: float = 0.0  # median, the cached prompt seen before (as in a running cache)
    kinds: list[str] = field(default_factory=list)  # each pair's "kind" where the file has one
    # the lexical verifier with a rule (or the additions) switched off: variant -> accepted per pair
    ablation: dict[str, list[bool]] = field(default_factory=dict)
    # the similarity of the prompts as written: what a cache without the guard embeds (the
    # guarded cache embeds each prompt's request text, ``similarity``); empty: the same
    raw_similarity: list[float] = field(default_factory=list)

    def rates(self, threshold: float, guarded: bool, accepted: Sequence[bool] | None = None) -> Rates:
        """The rates at ``threshold``, threshold only or guarded by the verifier's answers
        (``accepted``, by default the verifier's own; an ablation variant's otherwise)."""
        answers = self.accepted if accepted is None else accepted
        sims = self.similarity if guarded or not self.raw_similarity else self.raw_similarity
        served = [s >= threshold and (ok or not guarded) for s, ok in zip(sims, answers)]
        fh = sum(v and lab == 0 for v, lab in zip(served, self.labels))
        hit = sum(v and lab == 1 for v, lab in zip(served, self.labels))
        nm = sum(v and m for v, m in zip(served, self.near_miss))
        return Rates(
            false_hit=fh / self.label0 if self.label0 else 0.0,
            hit=hit / self.label1 if self.label1 else 0.0,
            near_miss_false_hit=nm / self.near_misses if self.near_misses else 0.0,
        )

    def threshold_only_at_hit_rate(self, hit_rate: float) -> tuple[float, float]:
        """The threshold at which similarity alone serves as many label-1 pairs as
        ``hit_rate`` does, and the false-hit rate it has there."""
        positives = sorted(
            (s for s, lab in zip(self.raw_similarity or self.similarity, self.labels) if lab == 1),
            reverse=True,
        )
        k = round(hit_rate * len(positives))
        threshold = positives[k - 1] if k > 0 else 1.0 + 1e-6
        return threshold, self.rates(threshold, guarded=False).false_hit

    def rule_yield(self, threshold: float) -> dict[str, tuple[int, int]]:
        """Per rule, the (label-0, label-1) pairs at or above ``threshold`` it rejected: the
        false hits it prevented and the hits it cost where the threshold had served them."""
        out: dict[str, list[int]] = {}
        for s, lab, rule in zip(self.similarity, self.labels, self.rule):
            if rule and s >= threshold:
                out.setdefault(rule, [0, 0])[lab] += 1
        return {k: (v[0], v[1]) for k, v in out.items()}

    def dominance(self, threshold: float, accepted: Sequence[bool] | None = None) -> float:
        """Threshold-only false hits at the hit rate the guarded mode reaches at ``threshold``,
        over the guarded false hits: above 1, the verifier beats a higher threshold."""
        guarded = self.rates(threshold, True, accepted)
        _, fh_eq = self.threshold_only_at_hit_rate(guarded.hit)
        return fh_eq / guarded.false_hit if guarded.false_hit else float("inf")

    def threshold_yield(self, low: float, high: float) -> tuple[int, int]:
        """(label-0, label-1) pairs with ``low <= similarity < high``: what raising the
        threshold from ``low`` to ``high`` stops serving, the yardstick for a rule."""
        band = [lab for s, lab in zip(self.similarity, self.labels) if low <= s < high]
        return band.count(0), band.count(1)


def evaluate_pairs(
    path: str | Path, embedder: Embedder, verifier: HitVerifier, name: str | None = None, half: str = "all"
) -> PairResult:
    """The pairs of one file (of one half of it, ``half``), embedded and verified."""
    rows = select_half(read_jsonl(path), half, path)
    if not rows:
        raise ValueError(f"{path}: no pairs in the {half!r} half")
    for n, row in enumerate(rows, 1):
        if (
            not isinstance(row.get("a"), str)
            or not isinstance(row.get("b"), str)
            or row.get("label") not in (0, 1)
        ):
            raise ValueError(f"{path}:{n}: a pair needs str 'a', str 'b' and 'label' 0 or 1")
    a = [str(r["a"]) for r in rows]
    b = [str(r["b"]) for r in rows]
    vectors = embedder.encode(a + b)  # one batch per file: (2P, D)
    raw = (vectors[: len(a)] * vectors[len(a) :]).sum(dim=1).clamp(max=1.0).cpu().tolist()
    sims = raw
    if isinstance(verifier, ReadsRequests):  # what the cache embeds with this verifier
        read = embedder.encode([verifier.request(x) for x in a] + [verifier.request(y) for y in b])
        sims = (read[: len(a)] * read[len(a) :]).sum(dim=1).clamp(max=1.0).cpu().tolist()
    explain = getattr(verifier, "explain", None)
    accepted: list[bool] = []
    rules: dict[str, int] = {}
    rule_of: list[str] = []
    for x, y, s in zip(a, b, sims):
        # both ways round: the cache may hold either prompt
        ok = verifier.verify(x, y, s) and verifier.verify(y, x, s)
        accepted.append(ok)
        rule = ""
        if not ok:
            rule = "rejected"
            if explain is not None:
                first = explain(x, y)
                rule = first.rule if first.rejected else explain(y, x).rule
        rule_of.append(rule)
        if rule:
            rules[rule] = rules.get(rule, 0) + 1
    cold, warm = time_verifier(verifier, a, b, sims)
    ablation: dict[str, list[bool]] = {}
    if isinstance(verifier, LexicalNearMissVerifier) and not verifier.skip:
        for variant, without in ablation_variants().items():
            ablation[variant] = [
                without.verify(x, y, s) and without.verify(y, x, s) for x, y, s in zip(a, b, sims)
            ]
    labels = [int(r["label"]) for r in rows]  # type: ignore[call-overload]
    near = [lab == 0 and word_jaccard(x, y) >= NEAR_MISS_JACCARD for x, y, lab in zip(a, b, labels)]
    return PairResult(
        name=name or Path(path).stem,
        pairs=len(rows),
        label0=labels.count(0),
        label1=labels.count(1),
        near_misses=sum(near),
        similarity=sims,
        labels=labels,
        accepted=accepted,
        near_miss=near,
        rejected_by_rule=rules,
        rule=rule_of,
        verify_us_cold=cold,
        verify_us_warm=warm,
        ablation=ablation,
        kinds=[str(r.get("kind", "")) for r in rows],
        raw_similarity=raw,
    )


def ablation_variants() -> dict[str, Any]:
    """The verifier variants the report compares with the default: each rule switched off
    on its own, the table of interchangeable words left out, the founding rules alone
    (every addition off, the table too), and the learned decision in place of the soft rules
    (``--decision learned``, asked at each pair's similarity)."""
    from gpucache.guard.learned import LearnedDecision

    variants: dict[str, Any] = {f"without {rule}": LexicalNearMissVerifier(skip=(rule,)) for rule in RULES}
    variants["without the table"] = LexicalNearMissVerifier(table=False)
    variants["seed rules only"] = LexicalNearMissVerifier(skip=ADDED_RULES, table=False)
    variants["the learned decision (not the default)"] = LearnedDecision()
    return variants


def time_verifier(
    verifier: HitVerifier, a: Sequence[str], b: Sequence[str], sims: Sequence[float]
) -> tuple[float, float]:
    """Median microseconds of one ``verify``: with both prompts unseen (cold), and with the
    cached prompt seen before, as it is in a running cache where entries are checked again and
    again (warm). Memoised parses are cleared first, so neither figure is flattered."""
    from gpucache.guard.lexical import clear_caches

    clear_caches()
    cold = []
    for x, y, s in zip(a, b, sims):
        start = time.perf_counter_ns()
        verifier.verify(x, y, s)
        cold.append(time.perf_counter_ns() - start)
    clear_caches()
    warm = []
    for x, y, s in zip(a, b, sims):
        verifier.verify(x, x, 1.0)
        start = time.perf_counter_ns()
        verifier.verify(x, y, s)
        warm.append(time.perf_counter_ns() - start)
    if not cold:
        return 0.0, 0.0
    return statistics.median(cold) / 1000, statistics.median(warm) / 1000


class _TableEmbedder:
    """Serves precomputed vectors so a replay at many settings embeds each text once."""

    def __init__(self, texts: Sequence[str], vectors: torch.Tensor, name: str) -> None:
        self.name = name
        self._index = {t: i for i, t in enumerate(texts)}
        self._vectors = vectors

    @property
    def dim(self) -> int:
        return int(self._vectors.shape[1])

    @property
    def device(self) -> torch.device:
        return self._vectors.device

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        rows = torch.tensor([self._index[t] for t in texts], dtype=torch.int64)
        return self._vectors[rows.to(self._vectors.device)]


@dataclass(frozen=True)
class ReplayPoint:
    threshold: float
    top_k: int
    guarded: bool
    asked: int
    served: int
    wrong: int

    @property
    def hit_rate(self) -> float:
        return self.served / self.asked if self.asked else 0.0

    @property
    def wrong_share(self) -> float:
        return self.wrong / self.served if self.served else 0.0


def replay_intents(
    path: str | Path,
    embedder: Embedder,
    verifier: HitVerifier,
    settings: Sequence[tuple[float, int, bool]],
    half: str = "all",
) -> list[ReplayPoint]:
    """Fill with the first half of each intent's queries, ask with the second half, through a
    real ``SemanticCache`` at each (threshold, top_k, guarded) setting; over the rows of one
    half of the file (``half``) when it is split."""
    rows = select_half(read_jsonl(path), half, path)
    by_intent: dict[str, list[str]] = {}
    for n, row in enumerate(rows, 1):
        if not isinstance(row.get("text"), str) or not isinstance(row.get("label"), str):
            raise ValueError(f"{path}:{n}: an intent row needs str 'text' and str 'label'")
        by_intent.setdefault(str(row["label"]), []).append(str(row["text"]))
    fill: dict[str, str] = {}
    ask: list[tuple[str, str]] = []
    for intent, texts in by_intent.items():
        middle = len(texts) // 2
        for t in texts[:middle]:
            fill.setdefault(t, intent)
        ask += [(t, intent) for t in texts[middle:] if t not in fill]
    texts = list(dict.fromkeys(list(fill) + [t for t, _ in ask]))
    if isinstance(verifier, ReadsRequests):  # the guarded cache embeds the request texts
        texts = list(dict.fromkeys(texts + [verifier.request(t) for t in texts]))
    table = _TableEmbedder(texts, embedder.encode(texts), embedder.name)
    points = []
    for threshold, top_k, guarded in settings:
        cache = SemanticCache(
            table,
            threshold=threshold,
            top_k=top_k,
            device=table.device,
            verifier=verifier if guarded else ThresholdOnly(),
            capacity=len(fill) + 1,
        )
        cache.warm([(t, intent) for t, intent in fill.items()])
        hits = cache.get_all([t for t, _ in ask])
        served = [(h, intent) for h, (_, intent) in zip(hits, ask) if h is not None]
        points.append(
            ReplayPoint(
                threshold,
                top_k,
                guarded,
                len(ask),
                len(served),
                sum(h.response != intent for h, intent in served),
            )
        )
    return points
