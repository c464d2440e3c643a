"""A LangChain cache backed by a ``SemanticCache``: ``set_llm_cache(GpuSemanticCache(cache))``.

LangChain asks a cache with two strings: the prompt and ``llm_string``, the model and its
parameters serialised. ``llm_string`` is the exact scope, so two models, or one model at two
temperatures, never share an answer. For a chat model the prompt is the serialised message list;
as in ``gpucache serve``, the last human message is the text compared by meaning and every
earlier message joins the scope, so a follow-up matches only after the same conversation. An
LLM's prompt is compared whole.

An answer is stored as its text, and comes back as a ``ChatGeneration`` for a chat model and a
``Generation`` for an LLM; a call that produced several generations is not stored. Needs
``langchain-core`` (not a requirement of gpucache itself).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from langchain_core.caches import BaseCache
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, Generation

from gpucache.cache.semantic import SemanticCache
from gpucache.cache.validation import check_scope


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
        return None if hit is None else [_generation(hit.response, chat)]

    def update(self, prompt: str, llm_string: str, return_val: Sequence[Generation]) -> None:
        if len(return_val) != 1 or not return_val[0].text:
            return  # several generations (n > 1), or none to speak of: not one answer to keep
        text, scope, _ = self._key(prompt, llm_string)
        self.cache.put(text, return_val[0].text, scope=scope)
        self._scopes.add(scope)

    def clear(self, **kwargs: Any) -> None:
        """Remove every entry this adapter stored (the cache's other users keep theirs)."""
        for scope in list(self._scopes):
            self.cache.clear(scope)
        self._scopes.clear()

    async def alookup(self, prompt: str, llm_string: str) -> Sequence[Generation] | None:
        text, scope, chat = self._key(prompt, llm_string)
        hit = await self.cache.aget(text, scope=scope)
        return None if hit is None else [_generation(hit.response, chat)]

    async def aupdate(self, prompt: str, llm_string: str, return_val: Sequence[Generation]) -> None:
        await asyncio.to_thread(self.update, prompt, llm_string, return_val)

    async def aclear(self, **kwargs: Any) -> None:
        await asyncio.to_thread(self.clear, **kwargs)

    def _key(self, prompt: str, llm_string: str) -> tuple[str, str, bool]:
        """(text compared by meaning, exact scope, whether the prompt is a chat)."""
        history, text = _last_human(prompt)
        chat = text is not None
        if text is None:
            history, text = "", prompt
        digest = hashlib.blake2b(f"{llm_string}\0{history}".encode(), digest_size=16).hexdigest()
        return text, f"{self.scope_prefix}/{digest}", chat


def _last_human(prompt: str) -> tuple[str, str | None]:
    """A chat prompt (LangChain's serialised message list) split into everything before the
    last human message, and that message's text; ("", None) for any other prompt."""
    try:
        messages = json.loads(prompt)
    except ValueError:
        return "", None
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return "", None
    last = messages[-1].get("kwargs") or {}
    if last.get("type") != "human" or not isinstance(last.get("content"), str):
        return "", None
    return json.dumps(messages[:-1], sort_keys=True), last["content"]


def _generation(text: str, chat: bool) -> Generation:
    return ChatGeneration(message=AIMessage(content=text)) if chat else Generation(text=text)
