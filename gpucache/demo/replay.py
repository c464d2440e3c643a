"""The main job: replay realistic traffic through a cache in front of a (stand-in) model.

The workload (``data/demo_workload.jsonl``, written by ``scripts/make_demo_workload.py``) mixes
exact repeats, rewordings, near-misses (a different question in almost the same words) and
unrelated prompts. It goes through ``get_or_put_all`` in batches, in front of ``StandInModel``,
which is *not* a language model: it writes a placeholder answer and sleeps a fixed time per
generated word, so that the time a hit saves is real wall-clock time.

Every answer names the prompt it was generated for, so the demo can tell a correct hit (the
same question) from a false hit (a different question's answer) and report both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TextIO

from gpucache.cache.semantic import SemanticCache


@dataclass(frozen=True)
class WorkloadItem:
    prompt: str
    kind: str  # original | repeat | paraphrase | near-miss | unrelated
    group: int

    @property
    def question(self) -> str:
        """Which question this prompt asks: rewordings share their topic's id."""
        if self.kind in ("original", "repeat", "paraphrase"):
            return f"topic-{self.group}"
        return self.prompt


def load_workload() -> list[WorkloadItem]:
    text = resources.files("gpucache").joinpath("data/demo_workload.jsonl").read_text("utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [WorkloadItem(r["prompt"], r["kind"], int(r["group"])) for r in rows]


class StandInModel:
    """A stand-in for an LLM: a placeholder answer, costing ``seconds_per_word`` per word."""

    name = "the stand-in model"

    def __init__(self, seconds_per_word: float = 0.002, words: int = 60) -> None:
        self.seconds_per_word = seconds_per_word
        self.words = words
        self.calls = 0
        self.generated = 0
        self.source: dict[str, str] = {}  # answer -> the prompt it was generated for
        self.seconds = 0.0

    @property
    def seconds_per_answer(self) -> float:
        return self.seconds_per_word * self.words

    def __call__(self, prompts: Sequence[str]) -> list[str]:
        self.calls += 1
        answers = []
        for prompt in prompts:
            self.generated += 1
            answer = f"[stand-in answer #{self.generated} to: {prompt}] " + "lorem " * (self.words - 7)
            self.source[answer] = prompt
            answers.append(answer)
        start = time.perf_counter()
        time.sleep(self.seconds_per_answer * len(prompts))
        self.seconds += time.perf_counter() - start
        return answers


@dataclass
class DemoReport:
    prompts: int = 0
    exact_hits: int = 0
    semantic_hits: int = 0
    misses: int = 0
    false_hits: int = 0
    seconds: float = 0.0
    model_seconds: float = 0.0
    saved_seconds: float = 0.0
    device: str = ""
    model: str = ""
    generated: int = 0
    cache_seconds: float = 0.0  # the cache's own embedding and scanning
    verifier: str = ""
    threshold: float = 0.0
    examples: list[tuple[str, str, float]] = field(default_factory=list)  # new, cached, sim
    false_examples: list[tuple[str, str, float]] = field(default_factory=list)
    rejections: dict[str, int] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return (self.exact_hits + self.semantic_hits) / self.prompts if self.prompts else 0.0

    def render(self, out: TextIO) -> None:
        w = out.write
        w("\ngpucache demo: summary\n")
        w(f"  device                {self.device}\n")
        w(f"  model                 {self.model}\n")
        w(f"  verifier, threshold   {self.verifier}, {self.threshold}\n")
        w(f"  prompts replayed      {self.prompts}\n")
        w(
            f"  hit rate              {self.hit_rate:.1%}  "
            f"({self.exact_hits} exact, {self.semantic_hits} semantic, {self.misses} misses)\n"
        )
        w(f"  wrong answers served  {self.false_hits}  (a different question's answer)\n")
        if self.rejections:
            rej = ", ".join(f"{k}: {v}" for k, v in sorted(self.rejections.items()))
            w(f"  verifier rejections   {rej}\n")
        w(
            f"  time                  {self.seconds:.1f} s in all: {self.model_seconds:.1f} s generating "
            f"{self.generated} answers, {self.cache_seconds:.1f} s embedding and scanning\n"
        )
        w(
            f"  time saved            {self.saved_seconds:.1f} s of generation "
            f"({self.exact_hits + self.semantic_hits} answers not generated, at the measured "
            f"{self.model_seconds / max(1, self.generated):.2f} s an answer)\n"
        )
        if self.examples:
            w("  served for a reworded prompt (similarity):\n")
            for new, cached, sim in self.examples:
                w(f"    {sim:.3f}  {new!r}\n           <- {cached!r}\n")
        if self.false_examples:
            w("  WRONG answers served (similarity):\n")
            for new, cached, sim in self.false_examples:
                w(f"    {sim:.3f}  {new!r}\n           <- {cached!r}\n")


def run_demo(
    cache: SemanticCache,
    *,
    model: Any = None,
    batch_size: int = 16,
    limit: int | None = None,
    progress: Callable[[int], None] | None = None,
    examples: int = 5,
) -> DemoReport:
    """Replay the packaged workload through ``cache.get_or_put_all`` in front of ``model`` (a
    loader with ``name``, ``seconds``, ``generated`` and ``source``, answer to prompt: the
    stand-in by default, or ``LocalModel``); returns what happened."""
    model = model or StandInModel()
    items = load_workload()[:limit]
    by_prompt = {item.prompt: item for item in items}
    report = DemoReport(
        device=str(cache.device), verifier=cache.verifier.name, threshold=cache.threshold, model=model.name
    )
    before = cache.stats()
    start = time.perf_counter()
    for offset in range(0, len(items), batch_size):
        batch = items[offset : offset + batch_size]
        answers = cache.get_or_put_all([i.prompt for i in batch], model)
        for item, answer in zip(batch, answers):
            source = model.source[answer]
            if source == item.prompt:
                continue
            cached = by_prompt[source]
            similarity = _similarity(cache, item.prompt, source)
            if cached.question != item.question:
                report.false_hits += 1
                report.false_examples.append((item.prompt, source, similarity))
            elif len(report.examples) < examples:
                report.examples.append((item.prompt, source, similarity))
        if progress is not None:
            progress(len(batch))
    report.seconds = time.perf_counter() - start
    after = cache.stats()
    report.prompts = len(items)
    report.exact_hits = after.exact_hits - before.exact_hits
    report.semantic_hits = after.semantic_hits - before.semantic_hits
    report.misses = after.misses - before.misses
    report.model_seconds = model.seconds
    report.generated = model.generated
    report.cache_seconds = (
        after.embed_seconds - before.embed_seconds + after.scan_seconds - before.scan_seconds
    )
    # what a hit saved: the model's measured time per generated answer in this run
    per_answer = model.seconds / max(1, model.generated)
    report.saved_seconds = (report.exact_hits + report.semantic_hits) * per_answer
    report.rejections = {
        k: v - before.rejections.get(k, 0)
        for k, v in after.rejections.items()
        if v - before.rejections.get(k, 0)
    }
    report.false_examples = report.false_examples[:examples]
    return report


def _similarity(cache: SemanticCache, a: str, b: str) -> float:
    vectors = cache.embedder.encode([a, b])  # (2, D)
    return float(vectors[0] @ vectors[1])
