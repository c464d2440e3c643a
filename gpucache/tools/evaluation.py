"""The false-hit benchmark: what a threshold serves, and what the verifier saves.

Two measurements, over public labelled data (see ``data/SOURCES.md`` in the project's shared
folder):

* **Pairs** (``a``, ``b``, ``label``; 1 = same meaning). ``a`` plays the cached prompt and ``b``
  the new one. A pair is *served* when its cosine similarity is at or above the threshold and,
  in the guarded mode, the verifier accepts it. False-hit rate = served label-0 pairs / label-0
  pairs; hit rate = served label-1 pairs / label-1 pairs. The near-miss subset (label 0 with
  word-set Jaccard >= 0.8) is reported on its own: it is what similarity cannot see.
* **Replay** over an intent file (``text``, ``label``): the first half of each intent's queries
  fill a real ``SemanticCache``; the other half are asked. A served answer from another intent
  is a wrong answer.

Each file is embedded in one batch, once; every threshold then reuses the vectors. Texts are
used as given (PAWS is tokenised, "do n't"; the verifier's tokenizer copes, nothing is
normalised beforehand).

One module a little over 400 lines: the pair sweep, the replay and the report that renders both
change together; it is a tool, never imported by the library.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpucache.cache.semantic import SemanticCache
from gpucache.embedding.embedder import Embedder
from gpucache.guard.lexical import ADDED_RULES, RULES, LexicalNearMissVerifier
from gpucache.guard.verifier import HitVerifier, ThresholdOnly

THRESHOLDS = tuple(sorted({round(0.70 + 0.01 * i, 2) for i in range(29)} | {0.875}))
NEAR_MISS_JACCARD = 0.8

# Every data file is split in two by a keyed hash of each row's id: rules, word lists and
# defaults are tuned on the "tune" half, and the report quotes the "report" half, so no figure
# it gives was fitted to the rows it is measured on. The key is fixed: the same row falls in
# the same half on every machine and in every run, and a new row in a file moves no other.
SPLIT_KEY = b"gpucache/false-hit-split/1"
HALVES = ("tune", "report", "all")


def half_of(row_id: str) -> str:
    """"tune" or "report": the half a row with this id belongs to."""
    digest = hashlib.blake2b(row_id.encode("utf-8"), key=SPLIT_KEY, digest_size=8).digest()
    return "tune" if digest[0] & 1 == 0 else "report"


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

    def rates(self, threshold: float, guarded: bool, accepted: Sequence[bool] | None = None) -> Rates:
        """The rates at ``threshold``, threshold only or guarded by the verifier's answers
        (``accepted``, by default the verifier's own; an ablation variant's otherwise)."""
        answers = self.accepted if accepted is None else accepted
        served = [s >= threshold and (ok or not guarded) for s, ok in zip(self.similarity, answers)]
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
        positives = sorted((s for s, lab in zip(self.similarity, self.labels) if lab == 1),
                           reverse=True)
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
    path: str | Path, embedder: Embedder, verifier: HitVerifier, name: str | None = None,
    half: str = "all",
) -> PairResult:
    """The pairs of one file (of one half of it, ``half``), embedded and verified."""
    rows = select_half(read_jsonl(path), half, path)
    if not rows:
        raise ValueError(f"{path}: no pairs in the {half!r} half")
    for n, row in enumerate(rows, 1):
        if not isinstance(row.get("a"), str) or not isinstance(row.get("b"), str) or row.get(
            "label"
        ) not in (0, 1):
            raise ValueError(f"{path}:{n}: a pair needs str 'a', str 'b' and 'label' 0 or 1")
    a = [str(r["a"]) for r in rows]
    b = [str(r["b"]) for r in rows]
    vectors = embedder.encode(a + b)  # one batch per file: (2P, D)
    sims = (vectors[: len(a)] * vectors[len(a) :]).sum(dim=1).clamp(max=1.0).cpu().tolist()
    explain = getattr(verifier, "explain", None)
    accepted: list[bool] = []
    rules: dict[str, int] = {}
    rule_of: list[str] = []
    for x, y, s in zip(a, b, sims):
        ok = verifier.verify(x, y, s)
        accepted.append(ok)
        rule = "" if ok else (explain(x, y).rule if explain is not None else "rejected")
        rule_of.append(rule)
        if rule:
            rules[rule] = rules.get(rule, 0) + 1
    cold, warm = time_verifier(verifier, a, b, sims)
    ablation: dict[str, list[bool]] = {}
    if isinstance(verifier, LexicalNearMissVerifier) and not verifier.skip:
        for variant, without in ablation_variants().items():
            ablation[variant] = [without.verify(x, y, s) for x, y, s in zip(a, b, sims)]
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
    )


def ablation_variants() -> dict[str, LexicalNearMissVerifier]:
    """The verifier variants the report compares with the default: each rule switched off
    on its own, the table of interchangeable words left out, and the seed's rules alone
    (every addition off, the table too)."""
    variants = {f"without {rule}": LexicalNearMissVerifier(skip=(rule,)) for rule in RULES}
    variants["without the table"] = LexicalNearMissVerifier(table=False)
    variants["seed rules only"] = LexicalNearMissVerifier(skip=ADDED_RULES, table=False)
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
    table = _TableEmbedder(texts, embedder.encode(texts), embedder.name)
    points = []
    for threshold, top_k, guarded in settings:
        cache = SemanticCache(
            table, threshold=threshold, top_k=top_k, device=table.device,
            verifier=verifier if guarded else ThresholdOnly(), capacity=len(fill) + 1,
        )
        cache.warm([(t, intent) for t, intent in fill.items()])
        hits = cache.get_all([t for t, _ in ask])
        served = [(h, intent) for h, (_, intent) in zip(hits, ask) if h is not None]
        points.append(
            ReplayPoint(threshold, top_k, guarded, len(ask), len(served),
                        sum(h.response != intent for h, intent in served))
        )
    return points


def render_report(
    results: Sequence[PairResult],
    replay: Sequence[ReplayPoint],
    *,
    threshold: float,
    top_k: int,
    command: str,
    about: str,
    plot: str | None,
    half: str = "all",
) -> str:
    """The markdown report: per-file tables, the default's figures, dominance, replay."""
    out = ["# Semantic false hits", "", about, "", f"Reproduce: `{command}`", ""]
    if half != "all":
        out += [
            f"Every file is measured on its **{half} half** only: each row falls in the tuning "
            "or the report half by a keyed hash of its id (`gpucache.tools.evaluation."
            "half_of`). The verifier's rules, word lists and table and the defaults were tuned "
            "on the tuning half (`bench/guard_tuning.py`), so the report half is out of sample."
            " Files marked *held apart* were never used for tuning at all and are measured "
            "whole.", "",
        ]
    out += [
        "A pair is served when its cosine similarity is at or above the threshold and, with the",
        "verifier, `LexicalNearMissVerifier` accepts it (`a` plays the cached prompt, `b` the new",
        "one). False hits = served label-0 pairs / label-0 pairs; hits = served label-1 pairs /",
        f"label-1 pairs; near-miss = label-0 pairs with word-set Jaccard >= {NEAR_MISS_JACCARD}.",
        "Texts are used as given (PAWS stays tokenised).", "",
        f"## At the defaults (threshold {threshold}, top_k {top_k})", "",
        "| set | pairs | threshold only: false hits / hits | with verifier: false hits / hits "
        "| near-miss false hits (only / verifier) | threshold-only at the same hit rate: "
        "threshold, false hits | ratio | verify median |",
        "|---|---:|---|---|---|---|---:|---:|",
    ]
    for r in results:
        plain, guarded = r.rates(threshold, False), r.rates(threshold, True)
        t_eq, fh_eq = r.threshold_only_at_hit_rate(guarded.hit)
        ratio = r.dominance(threshold)
        out.append(
            f"| {r.name} | {r.pairs} | {plain.false_hit:.1%} / {plain.hit:.1%} | "
            f"{guarded.false_hit:.1%} / {guarded.hit:.1%} | {plain.near_miss_false_hit:.1%} / "
            f"{guarded.near_miss_false_hit:.1%} (of {r.near_misses}) | {t_eq:.3f}, "
            f"{fh_eq:.1%} | {ratio:.2f}x | {r.verify_us_cold:.0f} / {r.verify_us_warm:.0f} us |"
        )
    out += ["", "ratio = threshold-only false hits / verifier false hits at the same hit rate "
            "(above 1: the verifier buys fewer false hits than a higher threshold would). "
            "verify: median microseconds per call, cold = neither prompt parsed before, warm = "
            "the cached prompt parsed before (as in a running cache).", ""]
    out += _kinds_section(results, threshold)
    out += _rule_yield_section(results, threshold)
    out += _ablation_section(results, threshold)
    for r in results:
        out += [f"## {r.name}: by threshold", "",
                "| threshold | only: false hits | only: hits | verifier: false hits | "
                "verifier: hits | near-miss: only | near-miss: verifier |",
                "|---:|---:|---:|---:|---:|---:|---:|"]
        for t in THRESHOLDS:
            p, g = r.rates(t, False), r.rates(t, True)
            out.append(f"| {t:g} | {p.false_hit:.1%} | {p.hit:.1%} | {g.false_hit:.1%} | "
                       f"{g.hit:.1%} | {p.near_miss_false_hit:.1%} | {g.near_miss_false_hit:.1%} |")
        rules = ", ".join(f"{k} {v}" for k, v in sorted(r.rejected_by_rule.items(),
                                                         key=lambda kv: -kv[1]))
        out += ["", f"Verifier rejections over all {r.pairs} pairs, by rule: {rules or 'none'}.", ""]
    if replay:
        out += ["## Intent replay", "",
                "Half of each intent's queries fill a real `SemanticCache`; the other half ask. "
                "Wrong = served an answer stored for another intent.", "",
                "| threshold | top_k | verifier | asked | served (hit rate) | wrong / served |",
                "|---:|---:|---|---:|---:|---:|"]
        for point in replay:
            out.append(f"| {point.threshold:g} | {point.top_k} | "
                       f"{'yes' if point.guarded else 'no'} | {point.asked} | {point.served} "
                       f"({point.hit_rate:.1%}) | {point.wrong} ({point.wrong_share:.1%}) |")
        out.append("")
    if plot:
        out += [f"![hit rate against false-hit rate]({plot})", ""]
    return "\n".join(out)


def _kinds_section(results: Sequence[PairResult], threshold: float) -> list[str]:
    """For files whose pairs name their kind (the LLM-prompt sets): how many of each kind
    are served, by similarity alone and with the verifier, and the rule that refused most."""
    out: list[str] = []
    for r in results:
        kinds = sorted(set(r.kinds) - {""})
        if not kinds:
            continue
        out += [f"## {r.name}: by kind of pair (threshold {threshold})", "",
                "| kind | label | pairs | served by threshold only | served with verifier "
                "| rejected by |", "|---|---:|---:|---:|---:|---|"]
        for kind in kinds:
            rows = [i for i, k in enumerate(r.kinds) if k == kind]
            above = [i for i in rows if r.similarity[i] >= threshold]
            served = [i for i in above if r.accepted[i]]
            rules: dict[str, int] = {}
            for i in above:
                if not r.accepted[i]:
                    rules[r.rule[i]] = rules.get(r.rule[i], 0) + 1
            shown = ", ".join(f"{k} {v}" for k, v in sorted(rules.items(), key=lambda kv: -kv[1]))
            label = r.labels[rows[0]]
            out.append(f"| {kind} | {label} | {len(rows)} | {len(above)} | {len(served)} | "
                       f"{shown or '-'} |")
        out.append("")
    return out


def _rule_yield_section(results: Sequence[PairResult], threshold: float) -> list[str]:
    """What each rule stops at the default threshold, against what a higher threshold stops
    for the same hits: the evidence for keeping a rule, file by file."""
    out = [f"## What each rule stops at threshold {threshold}", "",
           "Pairs at or above the threshold that a rule rejected, as label-0 (false hits "
           "prevented) / label-1 (hits lost). The last column is what raising the threshold "
           "to the same hit rate stops instead: a rule whose label-0 share is higher than that "
           "band's earns its place on that file; one whose share is lower acts worse than a "
           "higher threshold there.", ""]
    names = sorted({k for r in results for k in r.rule_yield(threshold)})
    out += ["| set | " + " | ".join(names) + " | threshold raised to the same hit rate |",
            "|---|" + "---:|" * (len(names) + 1)]
    for r in results:
        got = r.rule_yield(threshold)
        t_eq, _ = r.threshold_only_at_hit_rate(r.rates(threshold, True).hit)
        band = r.threshold_yield(threshold, t_eq)
        cells = [f"{got[n][0]} / {got[n][1]}" if n in got else "-" for n in names]
        out.append(f"| {r.name} | " + " | ".join(cells) + f" | {band[0]} / {band[1]} "
                   f"({threshold:g} to {t_eq:.3f}) |")
    return out + [""]


def _ablation_section(results: Sequence[PairResult], threshold: float) -> list[str]:
    """The default against the verifier with one rule off (or only the seed's rules), file by
    file: the evidence a deployment needs to switch a rule off, and the limits of the rules."""
    with_ablation = [r for r in results if r.ablation]
    if not with_ablation:
        return []
    out = [f"## Each rule switched off (threshold {threshold})", "",
           "Guarded false hits / hits, and the ratio to threshold-only at the same hit rate, "
           "with one rule switched off (`LexicalNearMissVerifier(skip=(rule,))`), without the "
           "table of interchangeable words (`table=False`), or with every addition off (the "
           "seed's rules alone, without the table). A rule whose removal raises a file's ratio "
           "acts worse than a higher threshold on that file.", "",
           "| verifier | " + " | ".join(r.name for r in with_ablation) + " |",
           "|---|" + "---|" * len(with_ablation)]
    variants: list[tuple[str, dict[str, list[bool]]]] = [("all rules (the default)", {})]
    variants += [(v, {r.name: r.ablation[v] for r in with_ablation}) for v in
                 with_ablation[0].ablation]
    for label, accepted in variants:
        cells = []
        for r in with_ablation:
            answers = accepted.get(r.name)
            g = r.rates(threshold, True, answers)
            cells.append(f"{g.false_hit:.1%} / {g.hit:.1%}, {r.dominance(threshold, answers):.2f}x")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out + [""]


def plot_curves(results: Sequence[PairResult], path: str | Path) -> bool:
    """Hit rate against false-hit rate over the thresholds, both modes; False without
    matplotlib (the ``bench`` extra)."""
    from gpucache.tools.plotting import headless_pyplot

    plt = headless_pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results):
        for guarded, style in ((False, "o--"), (True, "s-")):
            pts = [r.rates(t, guarded) for t in THRESHOLDS]
            ax.plot([p.false_hit for p in pts], [p.hit for p in pts], style,
                    label="threshold + verifier" if guarded else "threshold only", markersize=3)
        ax.set_title(r.name)
        ax.set_xlabel("false-hit rate")
        ax.set_ylabel("hit rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
