"""The pair model (gpucache/pairing/model.py): the shipped weights load offline into the packaged
embedder's shape, the score is symmetric, rounded and the same alone or in a batch within the
shipped margin, a pair longer than the model reads is not scored, and weights that are not the
shipped ones are refused or move verdicts."""

from __future__ import annotations

import json
import shutil

import pytest

from gpucache.pairing.meta import META_FILE, WEIGHTS_FILE, Meta, weights_folder
from gpucache.pairing.model import PairModel, ordered, rounded


def test_the_pair_is_read_in_one_order_whichever_prompt_was_stored():
    assert ordered("b prompt", "a prompt") == ordered("a prompt", "b prompt") == ("a prompt", "b prompt")


@pytest.mark.parametrize(
    "logit, steps", [(0.0, 0), (1.234, 123), (1.235, 124), (-0.004, 0), (-0.006, -1), (-2.5, -250)]
)
def test_a_logit_is_rounded_to_hundredths_half_up(logit, steps):
    assert rounded(logit) == steps


def test_the_meta_file_is_checked():
    good = {
        "version": "1",
        "max_tokens": 256,
        "floor": 875,
        "cut": 10,
        "keep_cut": -10,
        "margin": 3,
        "base_digest": "x",
    }
    assert Meta.from_json(good).cut == 10
    for bad in ({"cut": 1.5}, {"margin": -1}, {"max_tokens": 2}):
        with pytest.raises(ValueError):
            Meta.from_json({**good, **bad})
    with pytest.raises(KeyError):
        Meta.from_json({k: v for k, v in good.items() if k != "cut"})


@pytest.fixture(scope="module")
def model() -> PairModel:
    return PairModel("cpu")


def test_the_shipped_weights_load_offline_and_name_their_version(model):
    assert model.name == f"pair-model-{model.meta.version}"
    assert (weights_folder() / "CARD.md").is_file()
    assert (weights_folder() / WEIGHTS_FILE).stat().st_size < 50 * 2**20


PAIRS = [
    ("what grit sandpaper before staining oak", "which sandpaper grit should I use on oak before I stain it"),
    ("tips for a first solo overnight hike", "tips for a first solo overnight hike in the snow"),
    ("how do I tell if my tyres need replacing", "how can I tell whether my tires are worn out"),
    ("is it worth paying off a mortgage early", "is it worth paying off a car loan early"),
]


def test_the_score_is_the_same_either_way_round_and_alone_or_batched_within_the_margin(model):
    batch = model.scores(PAIRS)
    assert batch == model.scores([(b, a) for a, b in PAIRS])
    for pair, score in zip(PAIRS, batch):
        (alone,) = model.scores([pair])
        assert abs(alone - score) <= model.meta.margin
    assert len(set(batch)) == len(batch)  # real scores, not one constant


def test_a_pair_longer_than_the_model_reads_is_not_scored(model):
    long = "describe the ridge line " + "and the valley below it " * 80
    assert model.scores([(long, long + " at dusk"), PAIRS[0]])[0] is None
    assert model.scores([(long, long + " at dusk"), PAIRS[0]])[1] is not None


def test_other_word_embeddings_than_the_trained_against_are_refused(tmp_path):
    folder = tmp_path / "weights"
    shutil.copytree(weights_folder(), folder)
    meta = json.loads((folder / META_FILE).read_text())
    meta["base_digest"] = "0" * 64
    (folder / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="word embeddings are not the ones"):
        PairModel("cpu", folder)


def test_a_score_moves_no_more_than_the_margin_between_float32_and_bfloat16(model):
    """The drift the margin covers, on pairs no tuning read: the canonical float32 pass against
    bfloat16 autocast on this CPU (the precision another machine's matmuls may take)."""
    import torch

    exact = model.scores(PAIRS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model.scores(PAIRS)
    assert max(abs(x - y) for x, y in zip(exact, low)) <= model.meta.margin


def test_weights_moved_past_the_margin_move_verdicts_and_within_it_do_not(model):
    """The classifier's bias shifts every score by itself: past the margin, a pair judged near
    the cut changes verdict; within it, none of the scores leaves its rounding."""
    import torch

    from gpucache.guard.pair import PairDecision

    decision = PairDecision(model)
    pair = PAIRS[0]
    before = model.scores([pair])[0]
    bias = model.model.classifier.bias
    original = bias.detach().clone()
    try:
        cut = decision.cut_for(decision.soft(*pair))
        with torch.no_grad():  # move the pair to just past the cut and margin
            bias += (cut + model.meta.margin + 1 - before) / 100
        decision._scores.clear()
        assert not decision.judge(*pair, 0.95).rejected
        with torch.no_grad():  # and by twice the margin down: now within reach of the cut
            bias -= 2 * model.meta.margin / 100
        decision._scores.clear()
        assert decision.judge(*pair, 0.95).rejected
    finally:
        with torch.no_grad():
            bias.copy_(original)
    assert model.scores([pair])[0] == before
