"""The LangChain cache adapter, with langchain-core's own fake models and the real embedder."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core")

from langchain_core.language_models.fake import FakeListLLM  # noqa: E402
from langchain_core.language_models.fake_chat_models import FakeListChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402

from gpucache import SemanticCache  # noqa: E402
from gpucache.integrations.langchain import GpuSemanticCache  # noqa: E402


@pytest.fixture
def adapter(real_embedder) -> GpuSemanticCache:
    return GpuSemanticCache(SemanticCache(real_embedder, device="cpu"))


def test_a_chat_model_is_answered_from_the_cache_for_a_rewording(adapter):
    # the fake model answers with its responses in turn: a second call that reaches it says "second"
    model = FakeListChatModel(responses=["first", "second", "third"], cache=adapter)
    assert model.invoke("How do I reset my password?").content == "first"
    assert model.invoke("How do I reset my password?").content == "first"
    assert model.invoke("how can I reset my password").content == "first"
    assert model.invoke("How do I reset my username?").content == "second"  # a different question


def test_the_model_settings_and_the_earlier_turns_are_the_scope(adapter):
    model = FakeListChatModel(responses=["a", "b", "c", "d"], cache=adapter)
    other = FakeListChatModel(responses=["x", "y"], cache=adapter)
    assert model.invoke("What is the capital of Peru?").content == "a"
    assert other.invoke("What is the capital of Peru?").content == "x"  # another llm_string
    history = [SystemMessage(content="Answer in French."), HumanMessage(content="What is the capital of Peru?")]
    assert model.invoke(history).content == "b"
    follow_ups = [[HumanMessage(content="Who was Ada Lovelace?"), AIMessage(content="A mathematician."),
                   HumanMessage(content="How old was she?")],
                  [HumanMessage(content="Who was Marie Curie?"), AIMessage(content="A physicist."),
                   HumanMessage(content="How old was she?")]]
    assert model.invoke(follow_ups[0]).content == "c"
    assert model.invoke(follow_ups[1]).content == "d"
    assert model.invoke(follow_ups[0]).content == "c"


def test_an_llm_prompt_is_compared_whole_and_async_works_too(adapter):
    llm = FakeListLLM(responses=["one", "two"], cache=adapter)
    assert llm.invoke("Name three primary colours") == "one"
    assert asyncio.run(llm.ainvoke("Name three primary colours")) == "one"
    assert asyncio.run(llm.ainvoke("Can you name three primary colours?")) == "one"


def test_clear_removes_what_the_adapter_stored_and_only_that(adapter):
    adapter.cache.put("kept by another user", "theirs")
    model = FakeListChatModel(responses=["first", "second"], cache=adapter)
    model.invoke("What is a monad?")
    adapter.clear()
    assert model.invoke("What is a monad?").content == "second"
    assert adapter.cache.get("kept by another user").response == "theirs"
    with pytest.raises(TypeError, match="SemanticCache"):
        GpuSemanticCache("not a cache")  # type: ignore[arg-type]
