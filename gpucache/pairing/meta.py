"""What the pair model's shipped weights carry beside them (``Meta``, read from their JSON) and
where they are: a values module, so that the guard and ``gpucache info`` read the design without
importing torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

WEIGHTS_FILE = "pair-model.safetensors"
META_FILE = "pair-model.json"
NEVER = 10**6  # a cut no score passes: the soft rules' refusal stands


@dataclass(frozen=True)
class Meta:
    """What the shipped weights need beside them: their version, the longest pair they read, the
    design chosen on tuning data (the similarity a candidate must reach, in thousandths; the cut
    a pair the soft rules refuse must pass, and the cut a pair they accept must pass: both in
    hundredths of a logit, ``NEVER`` for a refusal no score lifts), how far a score may move
    between machines (``margin``), and the digest of the packaged word embeddings the weights
    were trained against."""

    version: str
    max_tokens: int
    floor: int
    cut: int
    keep_cut: int
    margin: int
    base_digest: str

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Meta:
        names = ("version", "max_tokens", "floor", "cut", "keep_cut", "margin", "base_digest")
        values = {name: doc[name] for name in names}
        for name in ("max_tokens", "floor", "cut", "keep_cut", "margin"):
            if type(values[name]) is not int:
                raise ValueError(f"{META_FILE}: {name} must be an integer")
        if values["margin"] < 0 or values["max_tokens"] < 8:
            raise ValueError(f"{META_FILE}: margin must not be negative, max_tokens at least 8")
        return cls(**values)

    def describe(self) -> str:
        """The model and its design in one line (``gpucache info``)."""
        return (
            f"the pair model pair-model-{self.version} (floor {self.floor / 1000:.3f}; cuts "
            f"{self.cut / 100:+.2f} where the soft rules refuse, {self.keep_cut / 100:+.2f} where they "
            f"accept, margin {self.margin / 100:.2f} logits; float32 on the embedder's device)"
        )


def weights_folder() -> Path:
    return Path(str(resources.files("gpucache.pairing").joinpath("weights")))


def shipped_meta(folder: Path | None = None) -> Meta:
    """The shipped weights' JSON, read without loading the model (``gpucache info``)."""
    folder = weights_folder() if folder is None else folder
    return Meta.from_json(json.loads((folder / META_FILE).read_text("utf-8")))
