"""CUDA graphs of the lean pass: inputs padded up to a bucket embed as they do unpadded, shapes
outside the buckets and failed captures fall back to the eager pass, and two threads never
share a bucket's buffers. The bucketing runs on the CPU through the real model with an eager
stand-in for the capture; the CUDA capture itself runs under ``-m gpu``."""

from __future__ import annotations

import threading

import pytest
import torch

from gpucache import TransformerEmbedder
from gpucache.embedding.embedder import AGREEMENT_MIN, PROBE_TEXTS
from gpucache.embedding.graphs import BATCH_BUCKETS, LENGTH_BUCKETS, GraphedEncoder, bucket_for, eager_capture


@pytest.mark.parametrize(
    "batch, length, bucket",
    [
        (1, 1, (1, 16)),
        (1, 16, (1, 16)),
        (1, 17, (1, 32)),
        (2, 12, (2, 16)),
        (3, 40, (4, 64)),
        (8, 128, (8, 128)),
        (9, 5, None),
        (1, 129, None),
        (0, 5, None),
        (1, 0, None),
    ],
)
def test_an_input_takes_the_smallest_bucket_that_holds_it(batch, length, bucket):
    assert bucket_for(batch, length) == bucket


def test_the_buckets_cover_a_lookup_and_a_small_coalesced_batch():
    assert BATCH_BUCKETS[0] == 1 and list(BATCH_BUCKETS) == sorted(BATCH_BUCKETS)
    assert list(LENGTH_BUCKETS) == sorted(LENGTH_BUCKETS)


def recording_forward(calls: list[tuple[int, int]]):
    """A forward that records the shapes it ran and returns ids and mask as features."""

    def forward(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(ids.shape))
        return torch.stack([ids.float(), mask.float()], dim=-1)

    return forward


def test_a_bucket_is_captured_once_and_pads_and_slices_its_inputs():
    calls: list[tuple[int, int]] = []
    graphs = GraphedEncoder(recording_forward(calls), torch.device("cpu"), eager_capture)
    ids = torch.tensor([[101, 7, 8, 102], [101, 9, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    out = graphs(ids, mask)
    assert graphs.captured == ((2, 16),)
    assert out is not None and out.shape == (2, 4, 2)
    assert torch.equal(out[..., 0].long(), ids) and torch.equal(out[..., 1].long(), mask)
    again = graphs(ids[:1, :3], mask[:1, :3])  # the (1, 16) bucket: captured now
    assert again is not None and again.shape == (1, 3, 2)
    assert torch.equal(again[..., 0].long(), ids[:1, :3])
    graphs(ids, mask)  # a replay, not a new capture
    assert graphs.captured == ((1, 16), (2, 16))
    assert set(calls) == {(2, 16), (1, 16)}  # every pass ran at a bucket's shape


def test_a_replay_that_does_not_reproduce_the_eager_pass_turns_the_graphs_off():
    """A capture whose replay does nothing (or replays stale buffers) would answer every input
    of its bucket with the capture's own output: it is caught when the bucket is made."""

    def idle_capture(step, pool):
        output = step()
        return (lambda: None), output  # replays nothing: the output stays the capture's

    calls: list[tuple[int, int]] = []
    graphs = GraphedEncoder(recording_forward(calls), torch.device("cpu"), idle_capture)
    ids = torch.tensor([[101, 7, 8, 102], [101, 9, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    assert graphs(ids, mask) is None and "did not reproduce" in graphs.failure
    assert graphs(ids, mask) is None  # and the eager pass answers from then on


def test_a_replay_reproduces_the_eager_pass_on_inputs_unlike_its_capture():
    graphs = GraphedEncoder(recording_forward([]), torch.device("cpu"), eager_capture)
    for seed in range(3):
        ids = torch.randint(1000, 2000, (2, 10), generator=torch.Generator().manual_seed(seed))
        mask = torch.ones_like(ids)
        out = graphs(ids, mask)
        assert out is not None and torch.equal(out[..., 0].long(), ids)
    assert graphs.captured == ((2, 16),) and graphs.failure is None


def test_an_input_no_bucket_holds_is_left_to_the_eager_pass():
    calls: list[tuple[int, int]] = []
    graphs = GraphedEncoder(recording_forward(calls), torch.device("cpu"), eager_capture)
    too_long = torch.ones((1, LENGTH_BUCKETS[-1] + 1), dtype=torch.long)
    too_many = torch.ones((BATCH_BUCKETS[-1] + 1, 4), dtype=torch.long)
    assert graphs(too_long, too_long) is None and graphs(too_many, too_many) is None
    assert not calls and not graphs.captured


def test_a_failed_capture_turns_the_graphs_off_and_says_why():
    def failing(step, pool):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs = GraphedEncoder(recording_forward([]), torch.device("cpu"), failing)
    ids = torch.ones((1, 4), dtype=torch.long)
    assert graphs(ids, ids) is None
    assert graphs.failure == "RuntimeError: operation not permitted when stream is capturing"
    assert graphs(ids, ids) is None and not graphs.captured  # off for good


@pytest.fixture(scope="module")
def graphed() -> TransformerEmbedder:
    """A CPU embedder whose lean pass runs through the bucketing with the eager stand-in, so
    every padding and slicing step of the CUDA path runs here on the real model."""
    embedder = TransformerEmbedder(device="cpu")
    reference = embedder.encode(PROBE_TEXTS)
    embedder._adopt_graphs(reference, capture=eager_capture)
    return embedder


def test_the_probe_adopts_graphs_that_agree(graphed):
    assert graphed.graphs is not None and graphed.graph_agreement >= AGREEMENT_MIN
    assert (1, 16) in graphed.graphs.captured and graphed.graphs.failure is None


def test_padded_to_a_bucket_a_prompt_embeds_as_it_does_eagerly(graphed):
    texts = [
        "ok",
        "How do I reset my router?",
        "Explain in detail how a home router assigns addresses to the devices on its "
        "network, and what changes when a device asks again after a restart",
        "word " * 400,
    ]  # past the last bucket: eager
    graphs, graphed.graphs = graphed.graphs, None
    try:
        eager_one = torch.cat([graphed.encode([t]) for t in texts])
        eager_all = graphed.encode(texts)
    finally:
        graphed.graphs = graphs
    before = graphs.captured
    one = torch.cat([graphed.encode([t]) for t in texts])
    together = graphed.encode(texts[:3])  # a padded batch of 3 in the (4, 32) bucket
    assert float((one * eager_one).sum(dim=1).min()) >= AGREEMENT_MIN
    assert float((together * eager_all[:3]).sum(dim=1).min()) >= AGREEMENT_MIN
    assert set(graphs.captured) > set(before) or (4, 32) in before


def test_two_threads_never_share_a_buckets_buffers(graphed):
    """Each thread's prompts come back as its own: the lock keeps a replay's static inputs and
    output to one caller at a time."""
    prompts = [[f"thread {n} asks question {i} about routers" for i in range(12)] for n in range(2)]
    alone = [torch.cat([graphed.encode([p]) for p in mine]) for mine in prompts]
    start = threading.Barrier(2)
    got: dict[int, torch.Tensor] = {}

    def run(n: int) -> None:
        start.wait()
        got[n] = torch.cat([graphed.encode([p]) for p in prompts[n]])

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in range(2):
        assert float((got[n] * alone[n]).sum(dim=1).min()) > 0.99999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_are_adopted_and_embed_as_the_models_own_pass():
    embedder = TransformerEmbedder(device="cuda")
    assert embedder.uses_lean and embedder.graphs is not None, embedder.graph_agreement
    assert embedder.graphs.failure is None and embedder.graph_agreement >= AGREEMENT_MIN
    exact = TransformerEmbedder(device="cuda", dtype=torch.float32, lean=False)
    texts = ["ok", "How do I reset my router?", "Summarize this email in two bullet points"]
    one = torch.cat([embedder.encode([t]) for t in texts])
    assert float((one * exact.encode(texts)).sum(dim=1).min()) >= AGREEMENT_MIN
    assert (1, 16) in embedder.graphs.captured
