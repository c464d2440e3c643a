"""TransformerEmbedder through the real packaged all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import pytest
import torch

import gpucache.embedder as embedder_module
from gpucache import Embedder, TransformerEmbedder
from gpucache.demo import load_workload
from gpucache.devices import cpu_has_native_bf16
from gpucache.embedder import AGREEMENT_MIN, default_model_path

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
    out = tight.encode(TEXTS)
    # two rows of the longest text per pass at most: at least three passes for five texts
    assert tight.forward_passes >= 3
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-5)
    one_each = TransformerEmbedder(device="cpu", dtype=torch.float32, max_batch_tokens=1)
    torch.testing.assert_close(one_each.encode(TEXTS), reference, rtol=0, atol=1e-5)
    assert one_each.forward_passes == len(TEXTS)  # below one text's length: one text a pass


def test_a_split_group_keeps_only_the_padding_it_needs_on_either_side(real_embedder, monkeypatch):
    right = {"input_ids": torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])}
    assert real_embedder._trim(right)["input_ids"].tolist() == [[5, 6], [7, 0]]
    monkeypatch.setattr(real_embedder._tokenizer, "padding_side", "left")
    left = {"input_ids": torch.tensor([[0, 0, 5, 6], [0, 0, 0, 7]]),
            "attention_mask": torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]])}
    assert real_embedder._trim(left)["input_ids"].tolist() == [[5, 6], [0, 7]]


def test_meaning_paraphrase_closer_than_unrelated(real_embedder):
    a, b, c = real_embedder.encode(
        ["How do I reset my password?", "I forgot my password, how can I reset it?",
         "What is the capital of France?"]
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
    [{"batch_size": 0}, {"max_length": 1}, {"max_batch_tokens": 0}, {"max_batch_tokens": 2.5},
     {"dtype": torch.int8}, {"device": "tpu"}],
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


def test_the_default_takes_bf16_only_where_it_agrees_with_fp32(real_embedder):
    """On a CPU with native bf16 the default runs its matmuls in bf16 (autocast) and keeps
    AGREEMENT_MIN cosine with fp32, on its probe texts and on other prompts; elsewhere it is fp32."""
    exact = TransformerEmbedder(device="cpu", dtype=torch.float32)
    assert exact.autocast_dtype is None and exact.agreement is None
    if not cpu_has_native_bf16():
        assert real_embedder.autocast_dtype is None
        return
    assert real_embedder.autocast_dtype == torch.bfloat16
    assert real_embedder.dtype == torch.float32  # the weights stay fp32
    assert real_embedder.agreement is not None and real_embedder.agreement >= AGREEMENT_MIN
    prompts = [item.prompt for item in load_workload()][:200]
    cosine = (real_embedder.encode(prompts) * exact.encode(prompts)).sum(dim=1)
    assert float(cosine.min()) >= AGREEMENT_MIN


def test_a_faster_dtype_that_drifts_is_not_adopted(monkeypatch):
    """Whatever the CPU: if the probe check fails, the embedder stays in plain fp32."""
    monkeypatch.setattr(embedder_module, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(embedder_module, "AGREEMENT_MIN", 1.5)  # no embedding can meet this
    drifting = TransformerEmbedder(device="cpu")
    assert drifting.autocast_dtype is None and drifting.dtype == torch.float32
    assert drifting.agreement is not None and drifting.agreement < 1.5
    monkeypatch.setattr(embedder_module, "AGREEMENT_MIN", 0.9999)
    agreeing = TransformerEmbedder(device="cpu")
    assert agreeing.autocast_dtype == torch.bfloat16
    assert "autocast=torch.bfloat16" in repr(agreeing)


def test_an_explicit_dtype_is_never_second_guessed(monkeypatch):
    monkeypatch.setattr(embedder_module, "cpu_has_native_bf16", lambda: True)
    asked = TransformerEmbedder(device="cpu", dtype=torch.float32)
    assert asked.autocast_dtype is None and asked.agreement is None
