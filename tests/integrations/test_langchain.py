"""The LangChain cache adapter, with langchain-core's own fake models and the real embedder."""

from __future__ import annotations

import asyncio
import base64

import pytest

pytest.importorskip("langchain_core")

# The adapter revives records with langchain_core.load.loads, which LangChain marks beta and warns
# about once a process, at whichever test looks a record up first.
pytestmark = pytest.mark.filterwarnings("ignore:The function `loads` is in beta")

from langchain_core.language_models.fake import FakeListLLM  # noqa: E402
from langchain_core.language_models.fake_chat_models import FakeListChatModel  # noqa: E402
from langchain_core.load import dumps  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration  # noqa: E402

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


def test_a_follow_up_is_served_after_the_same_conversation_reworded(real_embedder):
    adapter = GpuSemanticCache(SemanticCache(real_embedder, device="cpu", match_context=True))
    model = FakeListChatModel(responses=["1815", "1867", "asked"], cache=adapter)
    ada = [
        HumanMessage(content="Who was Ada Lovelace?"),
        AIMessage(content="A mathematician."),
        HumanMessage(content="When was she born?"),
    ]
    assert model.invoke(ada).content == "1815"
    reworded = [
        HumanMessage(content="hey!"),
        AIMessage(content="Hello, how can I help?"),
        HumanMessage(content="Who was Ada Lovelace?"),
        AIMessage(content="A mathematician."),
        HumanMessage(content="When was she born?"),
    ]
    assert model.invoke(reworded).content == "1815"
    curie = [
        HumanMessage(content="Who was Marie Curie?"),
        AIMessage(content="A physicist."),
        HumanMessage(content="When was she born?"),
    ]
    assert model.invoke(curie).content == "1867"
    tool = [
        HumanMessage(content="Who was Ada Lovelace?"),
        AIMessage(content="", tool_calls=[{"name": "bio", "args": {}, "id": "c1"}]),
        HumanMessage(content="When was she born?"),
    ]
    assert model.invoke(tool).content == "asked"  # a history with a tool call is exact


def test_the_model_settings_and_the_earlier_turns_are_the_scope(adapter):
    model = FakeListChatModel(responses=["a", "b", "c", "d"], cache=adapter)
    other = FakeListChatModel(responses=["x", "y"], cache=adapter)
    assert model.invoke("What is the capital of Peru?").content == "a"
    assert other.invoke("What is the capital of Peru?").content == "x"  # another llm_string
    history = [
        SystemMessage(content="Answer in French."),
        HumanMessage(content="What is the capital of Peru?"),
    ]
    assert model.invoke(history).content == "b"
    follow_ups = [
        [
            HumanMessage(content="Who was Ada Lovelace?"),
            AIMessage(content="A mathematician."),
            HumanMessage(content="How old was she?"),
        ],
        [
            HumanMessage(content="Who was Marie Curie?"),
            AIMessage(content="A physicist."),
            HumanMessage(content="How old was she?"),
        ],
    ]
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


def test_a_chat_answer_comes_back_as_stored_and_its_run_id_is_no_phone_number(adapter):
    model = FakeListChatModel(responses=["first", "second"], cache=adapter)
    answer = model.invoke("What is a monad?")
    again = model.invoke("What is a monad?")
    assert (again.content, again.id) == ("first", answer.id) and answer.id is not None
    # these digits, 7303-7531-8412, read as a phone number: in plain JSON the record of this
    # answer would be refused as personal data
    message = AIMessage(
        content="A monad is a monoid.",
        id="lc_run--01a2354b-7303-7531-8412-34c44d9933a7-0",
        response_metadata={"model_name": "fake"},
    )
    stored = [ChatGeneration(message=message, generation_info={"finish_reason": "stop"})]
    prompt = dumps([HumanMessage(content="What is a functor?")])
    assert not adapter.cache.cache_policy.decide("What is a functor?", dumps(stored), "any").allowed
    adapter.update(prompt, "llm", stored)
    assert adapter.lookup(prompt, "llm") == stored
    assert adapter.cache.stats().refusals == {}


def test_each_generation_passes_the_cache_policy_as_the_text_it_is(adapter):
    # a refusal opens the answer, where the policy's pattern looks; inside a record it would no
    # longer open the entry, and would pass
    model = FakeListChatModel(
        responses=["I'm sorry, I can't help with that.", "A monad is a monoid."], cache=adapter
    )
    assert model.invoke("What is a monad?").content == "I'm sorry, I can't help with that."
    assert model.invoke("What is a monad?").content == "A monad is a monoid."
    assert adapter.cache.stats().refusals == {"error-response": 1}


def _stored(adapter: GpuSemanticCache, prompt: str) -> tuple[str, str]:
    """(scope, stored entry) of the one call the adapter has stored, for ``prompt``."""
    (scope,) = adapter._scopes
    return scope, adapter.cache.get(prompt, scope=scope).response


def test_plain_text_stored_by_an_earlier_version_is_one_generation(adapter):
    # before records, an entry was the answer's text alone
    llm = FakeListLLM(responses=["one", "two"], cache=adapter)
    llm.invoke("Name three primary colours")
    scope, _ = _stored(adapter, "Name three primary colours")
    adapter.cache.put("Name three primary colours", '{"an": "old answer"}', scope=scope)
    assert llm.invoke("Name three primary colours") == '{"an": "old answer"}'
    adapter.clear()
    model = FakeListChatModel(responses=["first", "second"], cache=adapter)
    model.invoke("What is a monad?")
    scope, _ = _stored(adapter, "What is a monad?")
    adapter.cache.put("What is a monad?", "An old answer.", scope=scope)
    assert model.invoke("What is a monad?").content == "An old answer."
    assert asyncio.run(model.ainvoke("What is a monad?")).content == "An old answer."


def test_a_record_that_does_not_load_is_a_miss_and_the_next_answer_replaces_it(adapter, caplog):
    prompt = "Name three primary colours"
    llm = FakeListLLM(responses=[f"answer {i}" for i in range(17)], cache=adapter)
    llm.invoke(prompt)
    scope, record = _stored(adapter, prompt)
    opening, payload = record[: record.index(":") + 1], record[record.index(":") + 1 :]

    def encoded(text: str) -> str:
        return opening + base64.b64encode(text.encode()).decode()

    human = ChatGeneration(message=HumanMessage(content="A question, not an answer."))
    broken = {
        "truncated": record[: len(record) // 2],
        "truncated JSON": encoded(base64.b64decode(payload).decode()[:-3]),
        "another format version": record.replace("v1:", "v2:", 1),
        "not base64": opening + "not base64!",
        "an empty list": encoded("[]"),
        "not generations": encoded("[1, 2]"),
        "not LangChain's": encoded('{"generations": []}'),
        "a class outside the allowlist": encoded(dumps([human])),
    }
    served = 0
    for why, entry in broken.items():
        assert entry != record and entry.startswith(opening[:-2]), why  # read as a record, not as text
        adapter.cache.put(prompt, entry, scope=scope)
        assert adapter.cache.get(prompt, scope=scope).response == entry, why
        served += 1
        assert llm.invoke(prompt) == f"answer {served}", why  # a miss: the model answers
        assert llm.invoke(prompt) == f"answer {served}", why  # and its answer replaced the entry
        adapter.cache.put(prompt, entry, scope=scope)
        served += 1
        assert asyncio.run(llm.ainvoke(prompt)) == f"answer {served}", why
    assert caplog.text.count("does not load") == 2 * len(broken)
