"""``Conversation``: a chat's final user message and the earlier turns, as one value the cache
keys, matches and stores.

Why a value and not a list of messages: the cache compares two parts differently. The final
request is what the semantic tier embeds and the guard judges, as for a single prompt; the
earlier turns are *context*, compared by meaning by context.py (reworded turns and chatter do
not block a hit; a differing detail the request depends on does). System prompts, tools and
sampling settings are not here: they change the answer wholesale and belong in the scope.

Inside the cache a conversation travels as its ``key``: one string that starts with a marker
no text prompt may start with (``MARK``), then the turns and the request as compact JSON. So
the exact tier, single flight, snapshots and replicas, which all key on a prompt string, stay
exact on the whole conversation without a second path, and a conversation with no earlier turn
is keyed as its request alone (it is the same entry as that plain prompt).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

MARK = "\x00gpucache-conversation-1\x00"  # the key of a conversation with context starts so
ROLES = ("user", "assistant")


@dataclass(frozen=True)
class Turn:
    """One earlier message: who said it (``user`` or ``assistant``) and its text."""

    role: str
    text: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a turn's role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.text, str):
            raise TypeError(f"a turn's text must be a str, got {type(self.text).__name__}")


@dataclass(frozen=True)
class Conversation:
    """A final user request after earlier turns (oldest first).

    ``Conversation("how long will it take?", context=(Turn("user", "I ordered a blender"),
    Turn("assistant", "It ships tomorrow.")))``. Pass it wherever the cache takes a prompt."""

    request: str
    context: tuple[Turn, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.request, str):
            raise TypeError(f"a conversation's request must be a str, got {type(self.request).__name__}")
        if isinstance(self.context, (str, bytes)) or not isinstance(self.context, Iterable):
            raise TypeError("a conversation's context must be a sequence of Turn")
        context = tuple(self.context)
        for i, turn in enumerate(context):
            if not isinstance(turn, Turn):
                raise TypeError(f"context[{i}] must be a Turn, got {type(turn).__name__}")
        object.__setattr__(self, "context", context)

    @classmethod
    def from_messages(cls, messages: Iterable[Mapping[str, Any]]) -> Conversation:
        """From OpenAI-style chat messages (``{"role", "content"}``), the last of them the
        user's, every earlier one a user or assistant text message. System messages belong in
        the scope, not here: ``ValueError`` names one, as it does any other role."""
        listed = list(messages)
        if not listed:
            raise ValueError("a conversation needs at least one message")
        turns = []
        for i, message in enumerate(listed):
            role, content = message.get("role"), message.get("content")
            if role not in ROLES:
                raise ValueError(
                    f"messages[{i}] has role {role!r}: a conversation holds user and "
                    f"assistant messages (system prompts go in the scope)"
                )
            if not isinstance(content, str):
                raise TypeError(f"messages[{i}]'s content must be a str")
            turns.append(Turn(role, content))
        if turns[-1].role != "user":
            raise ValueError("a conversation's last message must be the user's")
        return cls(turns[-1].text, tuple(turns[:-1]))

    @cached_property
    def key(self) -> str:
        """The string the cache keys this conversation by: the request alone where there is no
        context, else ``MARK`` and the turns and request as compact JSON. Made once per value
        (a request's conversation is keyed at every step of its lookup and store)."""
        if not self.context:
            return self.request
        payload = [[t.role, t.text] for t in self.context] + [self.request]
        return MARK + json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


Prompt = str | Conversation  # what the cache takes wherever it takes a prompt


def decode(key: str) -> Conversation:
    """The conversation a cache key stands for (a plain prompt: a conversation without
    context). Keys are written by ``Conversation.key`` only: the cache refuses a plain prompt
    that starts with ``MARK``."""
    if not key.startswith(MARK):
        return Conversation(key)
    *turns, request = json.loads(key[len(MARK) :])
    return Conversation(request, tuple(Turn(role, text) for role, text in turns))


def request_of(key: str) -> str:
    """The final request of a key (what the semantic tier embeds), without building turns."""
    if not key.startswith(MARK):
        return key
    return str(json.loads(key[len(MARK) :])[-1])


def given(key: str) -> str | Conversation:
    """A key as the caller gave it: the plain prompt, or the ``Conversation``."""
    return key if not key.startswith(MARK) else decode(key)
