"""A LangChain cache backed by a ``SemanticCache``: ``set_llm_cache(GpuSemanticCache(cache))``.

LangChain asks a cache with two strings: the prompt and ``llm_string``, the model and its
parameters serialised. ``llm_string`` is the exact scope, so two models, or one model at two
temperatures, never share an answer. For a chat model the prompt is the serialised message list;
as in ``gpucache serve``, it becomes a ``Conversation``: the last human message is the request,
the earlier human and AI text messages its context (compared by meaning: a follow-up is served
after a conversation that agrees on what it depends on), and the system messages before them
join the scope. A history holding anything else (tool calls and results, named messages, a
system message between turns) joins the scope whole, as an exact match. An LLM's prompt is
compared whole.

What is stored is the generations themselves, serialised as LangChain's own caches serialise
them (``langchain_core.load``), so a hit is what was stored: every generation of a call with
several, with its ``generation_info`` and, for a chat model, its message; LangChain's standard
cache suites hold the adapter to that (tests/integrations/test_langchain_standard.py).

Each generation's text goes through the cache policy as it is; the record then goes through it
again, as every write does, and is base64 so that this second pass sees nothing to refuse. In
plain JSON the first pass would miss what the policy anchors at the start of an answer ("I'm
sorry, I can't"), and the second would refuse some chat answers as personal data, for digits
in their run id (``lc_run--<uuid>``) that read as a phone number. Records are
revived with an allowlist of the output and AI message classes alone: an entry may come from
another replica or a snapshot, and ``loads`` builds whatever classes an entry names.

An entry that is not a record is plain text, as versions before records stored (one answer, the
text alone): it comes back as one ``ChatGeneration`` for a chat model and one ``Generation`` for
an LLM. A record that does not load (truncated, another format version) is a miss, and the call
that follows replaces it. Needs ``langchain-core`` (not a requirement of gpucache itself).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from gpucache.extras import missing

try:
    from langchain_core.caches import BaseCache
    from langchain_core.load import Serializable, dumps, loads
    from langchain_core.messages import AIMessage, AIMessageChunk
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, Generation, GenerationChunk
except ImportError as exc:  # the langchain extra
    raise missing("langchain", __name__, exc) from exc

from gpucache.cache.semantic import SemanticCache
from gpucache.cache.validation import check_scope
from gpucache.conversation.value import Conversation, Prompt, Turn

log = logging.getLogger(__name__)

# A record: this opening, the format's version, ":", then dumps(generations) in base64. Plain
# text stored before records existed does not open so.
_RECORD_OPENING = "gpucache.langchain/v"
_RECORD_VERSION = "1"
_REVIVABLE: list[type[Serializable]] = [
    Generation,
    GenerationChunk,
    ChatGeneration,
    ChatGenerationChunk,
    AIMessage,
    AIMessageChunk,
]


class GpuSemanticCache(BaseCache):
    """``BaseCache`` over ``cache``; ``scope_prefix`` keeps these entries apart from the
    cache's other users."""

    def __init__(self, cache: SemanticCache, scope_prefix: str = "langchain") -> None:
        if not isinstance(cache, SemanticCache):
            raise TypeError(f"cache must be a SemanticCache, got {type(cache).__name__}")
        self.cache = cache
        self.scope_prefix = check_scope(scope_prefix)
        self._scopes: set[str] = set()

    def lookup(self, prompt: str, llm_string: str) -> Sequence[Generation] | None:
        text, scope, chat = self._key(prompt, llm_string)
        hit = self.cache.get(text, scope=scope)
        return None if hit is None else _revive(hit.response, chat)

    def update(self, prompt: str, llm_string: str, return_val: Sequence[Generation]) -> None:
        text, scope, _ = self._key(prompt, llm_string)
        # every generation could be served, so each must be one the policy would store (an
        # empty text, a tool call's, is refused as an empty answer always was)
        if not (return_val and all(self.cache.may_store(text, g.text, scope=scope) for g in return_val)):
            return
        self.cache.put(text, _record(return_val), scope=scope)
        self._scopes.add(scope)

    def clear(self, **kwargs: Any) -> None:
        """Remove every entry this adapter stored (the cache's other users keep theirs)."""
        for scope in list(self._scopes):
            self.cache.clear(scope)
        self._scopes.clear()

    async def alookup(self, prompt: str, llm_string: str) -> Sequence[Generation] | None:
        text, scope, chat = self._key(prompt, llm_string)
        hit = await self.cache.aget(text, scope=scope)
        return None if hit is None else _revive(hit.response, chat)

    async def aupdate(self, prompt: str, llm_string: str, return_val: Sequence[Generation]) -> None:
        await asyncio.to_thread(self.update, prompt, llm_string, return_val)

    async def aclear(self, **kwargs: Any) -> None:
        await asyncio.to_thread(self.clear, **kwargs)

    def _key(self, prompt: str, llm_string: str) -> tuple[Prompt, str, bool]:
        """(what the cache is asked, exact scope, whether the prompt is a chat)."""
        history, asked = _conversation(prompt)
        chat = asked is not None
        if asked is None:
            history, asked = "", prompt
        digest = hashlib.blake2b(f"{llm_string}\0{history}".encode(), digest_size=16).hexdigest()
        return asked, f"{self.scope_prefix}/{digest}", chat


# A message's fields that say nothing about what was said: a run's id and what the provider
# reported. Any other field that is set (tool calls, a name, extra arguments) makes the history
# exact.
_METADATA = frozenset({"type", "content", "id", "response_metadata", "usage_metadata"})
_ROLES = {"human": "user", "ai": "assistant"}


def _conversation(prompt: str) -> tuple[str, Conversation | str | None]:
    """A chat prompt (LangChain's serialised message list) as (what joins the scope, the
    conversation); ("", None) for any other prompt. The leading system messages join the scope;
    where every later message before the last human one is a plain human or AI text message,
    they are the conversation's context, else they join the scope too and the last message is
    asked alone."""
    try:
        messages = json.loads(prompt)
    except ValueError:
        return "", None
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return "", None
    kwargs = [m.get("kwargs") if isinstance(m.get("kwargs"), dict) else {} for m in messages]
    last = kwargs[-1]
    if last.get("type") != "human" or not isinstance(last.get("content"), str):
        return "", None
    lead = 0
    while lead < len(messages) - 1 and kwargs[lead].get("type") == "system":
        lead += 1
    turns = []
    for k in kwargs[lead:-1]:
        plain = (
            k.get("type") in _ROLES
            and isinstance(k.get("content"), str)
            and not any(value for name, value in k.items() if name not in _METADATA)
        )
        if not plain:
            return json.dumps(messages[:-1], sort_keys=True), last["content"]
        turns.append(Turn(_ROLES[k["type"]], k["content"]))
    history = json.dumps(messages[:lead], sort_keys=True)
    return history, Conversation(last["content"], tuple(turns)) if turns else last["content"]


def _record(generations: Sequence[Generation]) -> str:
    payload = base64.b64encode(dumps(list(generations)).encode()).decode("ascii")
    return f"{_RECORD_OPENING}{_RECORD_VERSION}:{payload}"


def _revive(stored: str, chat: bool) -> list[Generation] | None:
    """The generations in a stored entry; None (a miss) for a record that does not load."""
    if not stored.startswith(_RECORD_OPENING):
        return [ChatGeneration(message=AIMessage(content=stored)) if chat else Generation(text=stored)]
    version, _, payload = stored[len(_RECORD_OPENING) :].partition(":")
    try:
        if version != _RECORD_VERSION:
            raise ValueError(f"format version {version!r}, not {_RECORD_VERSION}")
        generations = loads(base64.b64decode(payload, validate=True).decode(), allowed_objects=_REVIVABLE)
        if (
            not isinstance(generations, list)
            or not generations
            or not all(isinstance(g, Generation) for g in generations)
        ):
            raise ValueError("not a list of generations")
    except Exception as error:  # a stored entry is data: whatever it makes the loader raise, a miss
        log.warning("a stored LangChain record does not load, served as a miss: %r", error)
        return None
    return generations
