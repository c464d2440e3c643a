"""TransformerEmbedder through the real packaged all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import pytest
import torch

import gpucache.embedding.embedder as embedder_module
from gpucache import Embedder, TransformerEmbedder
from gpucache.demo.replay import load_workload
from gpucache.devices import cpu_has_native_bf16
from gpucache.embedding.embedder import AGREEMENT_MIN
from gpucache.embedding.model import default_model_path

TEXTS = [
    "How do I reset my password?",
    "a",
    "Convert 10 miles to km, then tell me how long the drive takes at 60 mph on a highway.",
    "¿Cómo restablezco mi contraseña?",
    "🙂 emoji and 中文 mixed scripts",
]


def test_shape_unit_norm_dim_and_device(real_embedder):
    out = real_embedder.encode(TEXTS)
    assert out.shape == (len(TEXTS), 384) and real_embedder.dim == 384
    assert out.dtype == torch.float32 and out.device == real_embedder.device
    torch.testing.assert_close(out.norm(dim=1), torch.ones(len(TEXTS)), rtol=0, atol=1e-5)
    assert isinstance(real_embedder, Embedder)


def test_input_order_is_kept_whatever_the_batching(real_embedder):
    exact = TransformerEmbedder(device="cpu", dtype=torch.float32)
    small = TransformerEmbedder(device="cpu", dtype=torch.float32, batch_size=2)
    reference = exact.encode(TEXTS)
    reversed_out = small.encode(TEXTS[::-1])
    torch.testing.assert_close(reversed_out.flip(0), reference, rtol=0, atol=1e-5)
    # the default (bf16 matmuls on some CPUs) rounds differently per batch shape, within the
    # agreement it promises
    batched = TransformerEmbedder(device="cpu", batch_size=2).encode(TEXTS[::-1]).flip(0)
    cosine = (batched * real_embedder.encode(TEXTS)).sum(dim=1)
    assert float(cosine.min()) >= AGREEMENT_MIN


def test_the_token_budget_splits_a_batch_without_changing_the_embeddings():
    exact = TransformerEmbedder(device="cpu", dtype=torch.float32)
    reference = exact.encode(TEXTS)
    assert exact.forward_passes == 1  # five short texts: one pass within the default budget
    longest = max(len(exact._tokenizer(t)["input_ids"]) for t in TEXTS)
    tight = TransformerEmbedder(device="cpu", dtype=torch.float32, max_batch_tokens=2 * longest)
    shapes = []
    forward = tight._forward
    tight._forward = lambda tokens: shapes.append(tuple(tokens["input_ids"].shape)) or forward(tokens)
    out = tight.encode(TEXTS)
    # two rows of the longest text per pass at most: at least two passes for five texts, and
    # no pass over the budget
    assert tight.forward_passes == len(shapes) >= 2
    assert all(rows * width <= 2 * longest for rows, width in shapes)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-5)
    one_each = TransformerEmbedder(device="cpu", dtype=torch.float32, max_batch_tokens=1)
    torch.testing.assert_close(one_each.encode(TEXTS), reference, rtol=0, atol=1e-5)
    assert one_each.forward_passes == len(TEXTS)  # below one text's length: one text a pass


def test_batches_follow_token_length_within_the_row_and_token_caps():
    embedder = TransformerEmbedder.__new__(TransformerEmbedder)  # only the batching settings
    embedder.batch_size, embedder.max_batch_tokens = 3, 40
    lengths = [5, 12, 7, 12, 6, 9, 20, 8]
    batches = embedder._batches(lengths)
    assert sorted(j for b in batches for j in b) == list(range(len(lengths)))  # each text once
    flat = [lengths[j] for b in batches for j in b]
    assert flat == sorted(lengths, reverse=True)  # longest first, by tokens
    for batch in batches:
        assert len(batch) <= 3 and len(batch) * lengths[batch[0]] <= 40
    # greedy: a pass closes when the next text would take rows x longest over 40 or rows over 3
    # (20, 12): 2 x 20 = 40, a third would make 60; (12, 9, 8): 3 x 12 = 36, and 3 rows is
    # the most; (7, 6, 5)
    assert [[lengths[j] for j in b] for b in batches] == [[20, 12], [12, 9, 8], [7, 6, 5]]
    # a text longer than the budget still gets a pass of its own
    embedder.max_batch_tokens = 1
    assert embedder._batches([4, 9, 2]) == [[1], [0], [2]]


def test_sorting_by_tokens_pads_less_than_sorting_by_characters(real_embedder):
    """The demo prompts, batched as sentence-transformers would (characters) and as here."""
    from gpucache.demo.replay import load_workload

    prompts = [item.prompt for item in load_workload()][:304]
    lengths = [len(ids) for ids in real_embedder._tokenizer(prompts)["input_ids"]]
    by_chars = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    char_slots = sum(
        len(b) * max(lengths[i] for i in b)
        for b in (by_chars[s : s + 64] for s in range(0, len(by_chars), 64))
    )
    token_slots = sum(len(b) * lengths[b[0]] for b in real_embedder._batches(lengths))
    assert sum(lengths) <= token_slots < 0.9 * char_slots


def test_meaning_paraphrase_closer_than_unrelated(real_embedder):
    a, b, c = real_embedder.encode(
        [
            "How do I reset my password?",
            "I forgot my password, how can I reset it?",
            "What is the capital of France?",
        ]
    )
    assert float(a @ b) > 0.8 > 0.3 > float(a @ c)


def test_agrees_with_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(default_model_path()), device="cpu")
    theirs = model.encode(TEXTS + ["long " * 600], convert_to_tensor=True, normalize_embeddings=True)
    ours = TransformerEmbedder(device="cpu").encode(TEXTS + ["long " * 600])
    cosine = (ours * theirs.float()).sum(dim=1)
    assert float(cosine.min()) >= 0.9999


def test_a_local_model_folder_works_like_the_default(real_embedder):
    from_folder = TransformerEmbedder(str(default_model_path()), device="cpu")
    torch.testing.assert_close(from_folder.encode(TEXTS), real_embedder.encode(TEXTS))
    assert from_folder.name == str(default_model_path())


def test_long_text_is_truncated_not_rejected(real_embedder):
    out = real_embedder.encode(["word " * 100_000])
    assert out.shape == (1, 384) and torch.isfinite(out).all()


def test_empty_list_gives_an_empty_tensor(real_embedder):
    assert real_embedder.encode([]).shape == (0, 384)


def test_bad_input_raises_type_error(real_embedder):
    with pytest.raises(TypeError, match="sequence of str"):
        real_embedder.encode("a single string")
    with pytest.raises(TypeError, match="str items"):
        real_embedder.encode(["ok", None])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"max_length": 1},
        {"max_batch_tokens": 0},
        {"max_batch_tokens": 2.5},
        {"dtype": torch.int8},
        {"device": "tpu"},
    ],
)
def test_bad_settings_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        TransformerEmbedder(**kwargs)


def test_a_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(OSError):
        TransformerEmbedder(str(tmp_path / "no-such-model"), device="cpu")


def test_the_default_model_folder_can_be_redirected(monkeypatch, tmp_path):
    """GPUCACHE_MODEL_DIR points the default at a copy of the model (say an fp16 copy carried to
    a machine without the weights package); a wrong folder is a clear error."""
    monkeypatch.setenv("GPUCACHE_MODEL_DIR", str(default_model_path()))
    assert TransformerEmbedder(device="cpu").dim == 384
    monkeypatch.setenv("GPUCACHE_MODEL_DIR", str(tmp_path / "missing"))
    assert default_model_path() == tmp_path / "missing"
    with pytest.raises(OSError):
        TransformerEmbedder(device="cpu")


def test_an_fp32_embedder_runs_no_autocast(real_embedder):
    exact = TransformerEmbedder(device="cpu", dtype=torch.float32)
    assert exact.autocast_dtype is None and exact.agreement is None
    if not cpu_has_native_bf16():
        assert real_embedder.autocast_dtype is None  # the default on this CPU is fp32 too


@pytest.mark.skipif(
    not cpu_has_native_bf16(),
    reason="this CPU has no native bf16 (AVX-512 BF16 or AMX): the default runs in fp32 here, checked above",
)
def test_the_default_takes_bf16_only_where_it_agrees_with_fp32(real_embedder):
    """On a CPU with native bf16 the default runs its matmuls in bf16 (autocast) and keeps
    AGREEMENT_MIN cosine with fp32, on its probe texts and on other prompts."""
    assert real_embedder.autocast_dtype == torch.bfloat16
    assert real_embedder.dtype == torch.float32  # the embeddings and LayerNorm stay fp32
    linears = [m for m in real_embedder._model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert all(
        p.dtype == torch.float32
        for m in real_embedder._model.modules()
        if isinstance(m, torch.nn.LayerNorm)
        for p in m.parameters()
    )
    assert real_embedder.agreement is not None and real_embedder.agreement >= AGREEMENT_MIN
    prompts = [item.prompt for item in load_workload()][:200]
    exact = TransformerEmbedder(device="cpu", dtype=torch.float32)
    cosine = (real_embedder.encode(prompts) * exact.encode(prompts)).sum(dim=1)
    assert float(cosine.min()) >= AGREEMENT_MIN


def test_linear_weights_held_in_bf16_embed_exactly_as_autocast_over_fp32_weights(real_embedder):
    """Casting the Linear weights once is the cast autocast makes in every pass: same bits."""
    if real_embedder.autocast_dtype is None:
        pytest.skip("this CPU has no native bf16: the default stays fp32")
    held = TransformerEmbedder(device="cpu", lean=False)  # the model's own pass, bf16 weights
    recasting = TransformerEmbedder(device="cpu", dtype=torch.float32, lean=False)
    recasting.autocast_dtype = torch.bfloat16  # autocast over the fp32 weights, cast per pass
    assert recasting._use_attention(held.attention)  # the same attention as the default
    prompts = [item.prompt for item in load_workload()][:100]
    assert torch.equal(recasting.encode(prompts), held.encode(prompts))


def test_a_faster_dtype_that_drifts_is_not_adopted(monkeypatch):
    """Whatever the CPU: if the probe check fails, the embedder stays in plain fp32."""
    monkeypatch.setattr(embedder_module, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(embedder_module, "AGREEMENT_MIN", 1.5)  # no embedding can meet this
    drifting = TransformerEmbedder(device="cpu")
    assert drifting.autocast_dtype is None and drifting.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in drifting._model.parameters())
    assert drifting.agreement is not None and drifting.agreement < 1.5
    monkeypatch.setattr(embedder_module, "AGREEMENT_MIN", 0.9999)
    agreeing = TransformerEmbedder(device="cpu")
    assert agreeing.autocast_dtype == torch.bfloat16
    assert "autocast=torch.bfloat16" in repr(agreeing)


def test_an_explicit_dtype_is_never_second_guessed(monkeypatch):
    monkeypatch.setattr(embedder_module, "cpu_has_native_bf16", lambda: True)
    asked = TransformerEmbedder(device="cpu", dtype=torch.float32)
    assert asked.autocast_dtype is None and asked.agreement is None


def test_the_cuda_default_fp16_is_checked_against_fp32_too(monkeypatch):
    """The default fp16 of a CUDA embedder is adopted only where it agrees with fp32, as bf16 is
    on a CPU: the threshold was calibrated on fp32 embeddings. Checked here on the CPU, whose
    autocast runs fp16 too."""
    monkeypatch.setattr(embedder_module, "_default_dtype", lambda device: torch.float16)
    checked = TransformerEmbedder(device="cpu")
    assert checked.dtype == torch.float32 and checked.agreement is not None  # fp32 weights, probed
    assert checked.autocast_dtype == (torch.float16 if checked.agreement >= AGREEMENT_MIN else None)
    monkeypatch.setattr(embedder_module, "AGREEMENT_MIN", 1.5)  # no embedding can meet this
    refused = TransformerEmbedder(device="cpu")
    assert refused.autocast_dtype is None
    assert all(p.dtype == torch.float32 for p in refused._model.parameters())


def test_the_lean_pass_is_adopted_where_it_agrees_and_embeds_as_the_model_does(real_embedder):
    """The default embedder runs MiniLM through the lean pass (the same weights, fewer
    operations) and its embeddings are the model's own: against the model's pass at the same
    dtype, and against plain fp32, to AGREEMENT_MIN on prompts beyond the probe's."""
    assert real_embedder.uses_lean and real_embedder.lean_agreement >= AGREEMENT_MIN
    prompts = [item.prompt for item in load_workload()][:150] + ["ok", "x " * 300]
    own = TransformerEmbedder(device="cpu", lean=False)
    assert not own.uses_lean and own.lean_agreement is None
    got = real_embedder.encode(prompts)  # batched, padded
    assert float((got * own.encode(prompts)).sum(dim=1).min()) >= AGREEMENT_MIN
    exact = TransformerEmbedder(device="cpu", dtype=torch.float32, lean=False)
    assert float((got * exact.encode(prompts)).sum(dim=1).min()) >= AGREEMENT_MIN
    lean_fp32 = TransformerEmbedder(device="cpu", dtype=torch.float32)
    assert lean_fp32.uses_lean  # in fp32 the two passes differ only in rounding
    assert float((lean_fp32.encode(prompts) * exact.encode(prompts)).sum(dim=1).min()) > 0.99999


def test_a_single_prompt_embeds_as_it_does_inside_a_padded_batch(real_embedder):
    """One prompt runs without a mask (it has no padding); in a batch beside a longer one it
    is padded and masked: the same embedding either way."""
    alone = real_embedder.encode(["How do I reset my router?"])
    padded = real_embedder.encode(
        [
            "How do I reset my router?",
            "Explain in detail how a home router assigns addresses to the devices on a network, step by step",
        ]
    )[:1]
    assert float((alone * padded).sum()) > 0.99999


def test_a_single_text_takes_the_short_path_and_embeds_as_a_list_of_one_does(real_embedder):
    """``encode([text])`` tokenizes on the Rust tokenizer and skips padding and batching; the
    token ids are the full tokenizer's, truncation included, and so is the embedding."""
    assert real_embedder._single is not None
    texts = ["How do I reset my router?", "ok", "word " * 2000, "naïve café ☕ \ud800 end"]
    for text in texts:
        want = real_embedder._tokenizer(
            [real_embedder._clean(text)], truncation=True, max_length=real_embedder.max_length
        )["input_ids"][0]
        assert real_embedder._single.encode(real_embedder._clean(text)).ids == want
    alone = torch.cat([real_embedder.encode([t]) for t in texts])
    assert alone.shape == (len(texts), real_embedder.dim) and alone.dtype == torch.float32
    single, real_embedder._single = real_embedder._single, None
    try:  # the general path, one text at a time: the same ids, the same arithmetic
        listed = torch.cat([real_embedder.encode([t]) for t in texts])
    finally:
        real_embedder._single = single
    assert float((alone * listed).sum(dim=1).min()) > 0.999999
    together = real_embedder.encode(texts + ["a longer neighbour so that every text is padded"])
    assert float((alone * together[: len(texts)]).sum(dim=1).min()) >= AGREEMENT_MIN


def test_packed_linear_layers_multiply_as_f_linear_does():
    """On the CPU the lean pass multiplies by weights packed once (oneDNN's layout); for any
    row count, and with the GELU fused, the products are F.linear's to the dtype's rounding.
    Where packing is unavailable or fails its probe, the layer multiplies with F.linear."""
    from gpucache.embedding.lean import PackedLinear, packing_available

    gen = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(96, 64, generator=gen) / 8, torch.randn(96, generator=gen)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        packed = PackedLinear(weight, bias, dtype, pack=True)
        plain = PackedLinear(weight, bias, dtype, pack=False)
        assert plain.packed is None
        # the layer packs exactly where the machine-wide answer says this dtype packs (oneDNN
        # packs bf16 only on some CPUs: an AVX2 machine packs fp32 and not bf16)
        assert (packed.packed is not None) is packing_available(torch.device("cpu"), dtype)
        for shape in ((1, 64), (7, 64), (3, 33, 64), (300, 64)):
            x = torch.randn(*shape, generator=gen).to(dtype)
            for gelu in (False, True):
                got, want = packed(x, gelu=gelu), plain(x, gelu=gelu)
                assert got.shape == want.shape and got.dtype == want.dtype
                torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_the_embedder_says_which_path_it_took(real_embedder):
    """The path in words matches what was adopted: the lean pass, the matmuls' dtype, and on
    the CPU packed weights exactly where this dtype packs on this machine."""
    from gpucache.embedding.lean import packing_available

    path = real_embedder.path
    assert real_embedder.uses_lean and path.startswith("lean pass")
    dtype = real_embedder.autocast_dtype or real_embedder.dtype
    assert str(dtype).removeprefix("torch.") in path
    packs = packing_available(torch.device("cpu"), dtype)
    assert real_embedder._lean.packed is packs
    assert ("oneDNN-packed weights" in path) is packs and ("unpacked weights" in path) is not packs


def test_packing_is_reported_per_dtype_as_the_ops_answer_it(monkeypatch):
    """An AVX2 CPU packs fp32 and refuses bf16 (oneDNN raises): the answer is per dtype and
    comes from the ops themselves, so a refusal reads as 'not available', never as a layer
    that silently differs from the report."""
    from gpucache.embedding import lean

    real_reorder = torch.ops.mkldnn._reorder_linear_weight

    def refuse_bf16(weight, rows):
        if weight.dtype == torch.bfloat16:
            raise RuntimeError("bf16 path needs the cpu support avx512bw, avx512vl and avx512dq")
        return real_reorder(weight, rows)

    class Ops:
        _reorder_linear_weight = staticmethod(refuse_bf16)
        _linear_pointwise = torch.ops.mkldnn._linear_pointwise

    monkeypatch.setattr(lean.torch.ops, "mkldnn", Ops)
    lean._packing_works.cache_clear()
    try:
        assert lean.packing_available(torch.device("cpu"), torch.float32) is True
        assert lean.packing_available(torch.device("cpu"), torch.bfloat16) is False
        weight, bias = torch.randn(8, 16), torch.randn(8)
        assert lean.PackedLinear(weight, bias, torch.bfloat16, pack=True).packed is None
        assert lean.PackedLinear(weight, bias, torch.float32, pack=True).packed is not None
    finally:
        lean._packing_works.cache_clear()


def test_a_lean_pass_without_packing_embeds_as_the_packed_one(real_embedder):
    from gpucache.embedding.lean import LeanEncoder

    lean = real_embedder._lean
    unpacked = LeanEncoder(real_embedder._model, lean.matmul_dtype, pack=False)
    assert not unpacked.packed
    tokens = real_embedder._tokenizer(["How do I reset my router?", "ok"], padding=True, return_tensors="pt")
    with torch.inference_mode():
        a = lean(tokens["input_ids"], tokens["attention_mask"])
        b = unpacked(tokens["input_ids"], tokens["attention_mask"])
    mask = tokens["attention_mask"].bool()
    cos = torch.nn.functional.cosine_similarity(a[mask], b[mask], dim=-1)
    assert float(cos.min()) > 0.999


def test_a_lean_pass_that_drifts_is_not_adopted(monkeypatch):
    from gpucache.embedding.lean import LeanEncoder

    def broken(self, input_ids, attention_mask):
        gen = torch.Generator().manual_seed(0)
        return torch.randn(*input_ids.shape, 384, generator=gen)

    monkeypatch.setattr(LeanEncoder, "__call__", broken)
    drifting = TransformerEmbedder(device="cpu", dtype=torch.float32)
    assert not drifting.uses_lean and drifting.lean_agreement < AGREEMENT_MIN
    exact = TransformerEmbedder(device="cpu", dtype=torch.float32, lean=False)
    assert torch.equal(drifting.encode(["ok then"]), exact.encode(["ok then"]))


@pytest.mark.parametrize(
    ("config", "supported"),
    [
        ({"model_type": "bert", "hidden_act": "gelu"}, True),
        ({"model_type": "bert", "hidden_act": "relu"}, False),
        ({"model_type": "bert", "hidden_act": "gelu", "position_embedding_type": "relative_key"}, False),
        ({"model_type": "roberta", "hidden_act": "gelu"}, False),
        ({"model_type": "bert", "hidden_act": "gelu", "is_decoder": True}, False),
    ],
)
def test_the_lean_pass_takes_only_the_models_it_was_written_for(config, supported):
    from types import SimpleNamespace

    from gpucache.embedding.lean import LeanEncoder

    model = SimpleNamespace(config=SimpleNamespace(**config), embeddings=None, encoder=None)
    assert LeanEncoder.supports(model) is supported
    if not supported:
        with pytest.raises(ValueError, match="BERT models"):
            LeanEncoder(model)


def test_loading_the_model_prints_nothing_and_leaves_progress_bars_as_they_were(capfd):
    """A library stays quiet unless asked: no "Loading weights" bar from inside a load, and the
    caller's own choice about transformers' progress bars is kept."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    TransformerEmbedder(device="cpu")
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert hf_logging.is_progress_bar_enabled()
