"""The labelled pairs the pair model learns from, every one from data allowed for training.

- PAWS-Wiki's dev split (``train/paws_wiki_dev.jsonl``): word-swap near-misses beside paraphrases,
  its tokenised text written back as prose;
- intent queries (``train/banking77_train.jsonl``, ``train/clinc150_train.jsonl``): two queries of
  one intent as a rewording (a noisy label: "freeze my card" and "is my card frozen?" share an
  intent, not an answer, so they weigh half), and each query beside the query of another intent
  that shares the most words with it, as a near-miss;
- edits of the intent queries (edits.py): a rewording and a near-miss made from each;
- the tuning pairs written for the pair model (``data/pair_model_tuning.jsonl``) and the tuning
  half of QQP, the only Quora pairs the project may learn from.

Never an exam, and never a tuning file the model's cut is chosen on (``HELD_OUT``): those judge
the model from outside its training data.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpucache.pairing.training.edits import edited

SHARED = Path("../shared/data")
WRITTEN = Path("data/pair_model_tuning.jsonl")
QQP = SHARED / "qqp.jsonl"
WRITTEN_REPEATS = 4
# The tuning files the cut and floor are chosen on, by cross-validation across them: never learned from
HELD_OUT = (
    "data/llm_prompts_chat_tuning.jsonl",
    "data/llm_prompts_tuning.jsonl",
    "data/llm_prompts_natural_tuning.jsonl",
    "data/llm_prompts_learned_tuning.jsonl",
    "data/llm_prompts.jsonl",
    "../shared/data/paws_wiki.jsonl",
)
STOP = frozenset(
    "a an the i me my you your is are am was be to of in on for and or it this that what how do does "
    "can could would should will with at by from my we our us i'm im please".split()
)


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    label: int
    weight: float
    source: str


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def prose(text: str) -> str:
    """PAWS's tokenised text as written: no space before punctuation or a clitic."""
    text = re.sub(r" ([,.;:!?%)\]])", r"\1", text)
    text = re.sub(r"([(\[]) ", r"\1", text)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)
    return text.replace("`` ", '"').replace(" ''", '"')


def paws(shared: Path) -> Iterator[Pair]:
    for row in read_jsonl(shared / "train" / "paws_wiki_dev.jsonl"):
        yield Pair(prose(row["a"]), prose(row["b"]), int(row["label"]), 1.0, "paws-dev")


def content(text: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in STOP)


def intents(shared: Path, rng: random.Random, per_file: int) -> Iterator[Pair]:
    """Same-intent pairs (weight 0.5) and nearest other-intent pairs, ``per_file`` queries a file."""
    for name in ("banking77_train.jsonl", "clinc150_train.jsonl"):
        rows = read_jsonl(shared / "train" / name)
        by_intent: dict[str, list[str]] = defaultdict(list)
        words = [content(r["text"]) for r in rows]
        index: dict[str, list[int]] = defaultdict(list)
        for i, (row, ws) in enumerate(zip(rows, words)):
            by_intent[row["label"]].append(row["text"])
            for w in ws:
                index[w].append(i)
        for i in rng.sample(range(len(rows)), min(per_file, len(rows))):
            text, label, ws = rows[i]["text"], rows[i]["label"], words[i]
            same = [t for t in by_intent[label] if t != text and content(t) & ws]
            if same:
                yield Pair(text, rng.choice(same), 1, 0.4, "intent-same")
            shared_count: dict[int, int] = defaultdict(int)
            for w in sorted(ws):
                for j in index[w][:3000]:
                    if rows[j]["label"] != label:
                        shared_count[j] += 1
            if shared_count:
                best = max(shared_count, key=lambda j: (shared_count[j] / len(ws | words[j]), -j))
                if shared_count[best] >= 2:
                    yield Pair(text, rows[best]["text"], 0, 1.0, "intent-other")
            for a, b, lab in edited(text, rng):
                yield Pair(a, b, lab, 1.0, "edit")


def written(root: Path) -> Iterator[Pair]:
    """The pairs written for the pair model, each ``WRITTEN_REPEATS`` times: the only training
    pairs written as people prompt a chat model, a fiftieth of the rest."""
    path = root / WRITTEN
    if path.exists():
        for row in read_jsonl(path):
            for _ in range(WRITTEN_REPEATS):
                yield Pair(row["a"], row["b"], int(row["label"]), 1.0, "written")


def qqp_tuning_half(shared: Path) -> Iterator[Pair]:
    """The tuning half of qqp.jsonl, split as every tuning tool of the project splits it."""
    from gpucache.pairing.training.halves import half_of

    for row in read_jsonl(shared / "qqp.jsonl"):
        if half_of(str(row["id"])) == "tune":
            yield Pair(row["a"], row["b"], int(row["label"]), 1.0, "qqp-tune")


def training_pairs(root: Path, seed: int, per_file: int = 2500) -> list[Pair]:
    """Every training pair, in a seeded order."""
    rng = random.Random(seed)
    shared = root / SHARED
    pairs = [*paws(shared), *intents(shared, rng, per_file), *written(root), *qqp_tuning_half(shared)]
    rng.shuffle(pairs)
    return pairs
