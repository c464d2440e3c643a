"""The training (gpucache/pairing/training/): it reads only data allowed for training, the same
pairs for one seed, and writes weights and a JSON the pair model loads, its design left to the
rules until bench/pair_tuning.py chooses one."""

from __future__ import annotations

import json
from pathlib import Path

from gpucache.pairing.meta import NEVER, shipped_meta
from gpucache.pairing.training import pairs as training
from gpucache.pairing.training.fit import train


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def small_repository(root: Path) -> Path:
    """A repository with a few rows of each source, ``../shared/data`` beside it."""
    repo, shared = root / "repo", root / "shared" / "data"
    intents = [
        {"text": t, "label": label}
        for label, texts in {
            "card_lost": ["I lost my card yesterday", "my card is lost, what now", "lost card help"],
            "card_limit": [
                "what is the limit on a lost card",
                "what is my card limit",
                "how do I raise my card limit",
                "card limit too low",
            ],
        }.items()
        for t in texts
    ]
    write_rows(shared / "train" / "banking77_train.jsonl", intents)
    write_rows(shared / "train" / "clinc150_train.jsonl", intents)
    write_rows(
        shared / "train" / "paws_wiki_dev.jsonl",
        [{"a": "The river flows from A to B .", "b": "The river flows from B to A .", "label": 0}],
    )
    write_rows(
        shared / "qqp.jsonl",
        [
            {"a": f"question {i}?", "b": f"the question {i}?", "label": i % 2, "id": f"q:{i}"}
            for i in range(40)
        ],
    )
    write_rows(
        repo / "data" / "pair_model_tuning.jsonl",
        [{"a": "fix my bike chain", "b": "repair my bike chain", "label": 1}],
    )
    return repo


def test_the_pairs_come_from_the_allowed_sources_the_same_for_one_seed(tmp_path):
    repo = small_repository(tmp_path)
    first = training.training_pairs(repo, seed=3, per_file=6)
    assert first == training.training_pairs(repo, seed=3, per_file=6)
    sources = {p.source for p in first}
    assert sources == {"paws-dev", "intent-same", "intent-other", "edit", "written", "qqp-tune"}
    assert sum(p.source == "written" for p in first) == training.WRITTEN_REPEATS
    qqp = {p.a for p in first if p.source == "qqp-tune"}
    assert 0 < len(qqp) < 40  # the tuning half alone
    assert all(p.weight == 0.4 for p in first if p.source == "intent-same")


def test_a_run_writes_weights_the_pair_model_loads(tmp_path):
    from gpucache.pairing.model import PairModel

    repo = small_repository(tmp_path)
    out = tmp_path / "weights"
    meta = train(repo, out, seed=1, epochs=0.05, batch=8, lr=1e-5, minutes=5)
    assert meta["steps"] >= 1 and meta["pairs_seen"] >= 1
    written = shipped_meta(out)
    assert (written.cut, written.keep_cut) == (NEVER, -NEVER)  # the rules decide until a design is chosen
    model = PairModel("cpu", out)
    (score,) = model.scores([("fix my bike chain", "repair my bike chain")])
    assert isinstance(score, int)
