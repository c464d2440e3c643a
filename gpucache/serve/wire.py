"""The OpenAI wire formats the proxy reads and writes: completion objects, server-sent-event
chunks (``data: {...}`` lines, then ``data: [DONE]``), and error bodies.

A cached answer is stored as its text alone, so one stored from a stream can be served as
JSON and one stored from JSON as a stream. A hit reports zero tokens of usage: nothing was
generated for it.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from gpucache.extras import missing

try:
    from starlette.responses import Response
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc


orjson: Any
try:
    import orjson
except ImportError:  # pragma: no cover - the serve extra installs it
    orjson = None

ZERO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
# An answer's id: this process's random prefix and a count. Unique without asking the OS for
# randomness per answer (uuid4 did, at 2% of the proxy's time on exact hits).
_ID_PREFIX = secrets.token_hex(6)
_ID_COUNT = itertools.count()


def new_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-gpucache-{_ID_PREFIX}{next(_ID_COUNT):x}"


def dumps(doc: Any) -> bytes:
    """``doc`` as JSON bytes: through orjson (the encoding is most of a hit's own work), or
    through ``json`` where orjson refuses, as for a lone surrogate, which JSON text may carry
    escaped and so a stored answer may hold; ``json`` escapes it back."""
    if orjson is not None:
        try:
            return orjson.dumps(doc)
        except TypeError:
            pass
    return json.dumps(doc, separators=(",", ":")).encode()


class JSON(Response):
    """A JSON response encoded by ``dumps``."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def completion(kind: str, model: str, text: str) -> dict[str, Any]:
    """A whole completion object answering with ``text``."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text, "refusal": None}
    else:
        choice["text"] = text
    return {
        "id": new_id(kind),
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": dict(ZERO_USAGE),
    }


@dataclass
class StreamMeta:
    """What a streamed answer's chunks share: taken from the upstream's first chunk on a miss,
    made up on a hit."""

    kind: str
    model: str
    id: str = ""
    created: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    unreplayable: bool = False  # a delta carried more than text (``UNREPLAYABLE``)

    def __post_init__(self) -> None:
        self.id = self.id or new_id(self.kind)
        self.created = self.created or int(time.time())


def chunk(
    meta: StreamMeta,
    *,
    content: str | None = None,
    role: bool = False,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> bytes:
    """One ``data: {...}`` event of a streamed completion."""
    event: dict[str, Any] = {
        "id": meta.id,
        "object": "chat.completion.chunk" if meta.kind == "chat" else "text_completion",
        "created": meta.created,
        "model": meta.model,
    }
    if usage is not None:
        event["choices"], event["usage"] = [], usage
        return sse(event)
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if meta.kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if content is not None:
            delta["content"] = content
        choice["delta"] = delta
    else:
        choice["text"] = content or ""
    event["choices"] = [choice]
    return sse(event)


def sse(event: dict[str, Any]) -> bytes:
    return b"data: " + dumps(event) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def opening(meta: StreamMeta) -> list[bytes]:
    """What a replayed answer's stream sends before its text: a chat's role chunk."""
    return [chunk(meta, role=True, content="")] if meta.kind == "chat" else []


def ending(meta: StreamMeta, include_usage: bool) -> list[bytes]:
    """What a replayed answer's stream sends after its text: the finish chunk, a usage chunk
    where the client asked for one (nothing was generated for it), then ``[DONE]``."""
    usage = [chunk(meta, usage=dict(ZERO_USAGE))] if include_usage else []
    return [chunk(meta, finish="stop"), *usage, DONE]


# Fields of an answer besides its text. A cached answer is its text alone, so an answer that
# carries any of these (non-empty) cannot be replayed faithfully from the cache and is never
# stored: a hit would drop its tool calls, its refusal or its reasoning.
UNREPLAYABLE = ("tool_calls", "function_call", "refusal", "reasoning_content", "reasoning", "audio")


def _carries_more_than_text(part: Any) -> bool:
    return isinstance(part, dict) and any(part.get(name) for name in UNREPLAYABLE)


def answer_of(kind: str, body: Any) -> tuple[str | None, str | None, bool]:
    """(text, finish_reason, replayable) of an upstream's completion object: ``replayable``
    is False where the answer carries more than its text (``UNREPLAYABLE``)."""
    try:
        choice = body["choices"][0]
        if kind == "chat":
            message = choice.get("message") or {}
            return message.get("content"), choice.get("finish_reason"), not _carries_more_than_text(message)
        return choice.get("text"), choice.get("finish_reason"), True
    except (KeyError, IndexError, TypeError, AttributeError):
        return None, None, False


def delta_of(kind: str, event: dict[str, Any], meta: StreamMeta) -> str | None:
    """The content delta of one upstream chunk; records its finish reason, usage and whether
    it carried more than text on ``meta``."""
    if event.get("usage"):
        meta.usage = event["usage"]
    choices = event.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if choice.get("finish_reason"):
        meta.finish_reason = choice["finish_reason"]
    if kind == "chat":
        delta = choice.get("delta") or {}
        if _carries_more_than_text(delta):
            meta.unreplayable = True
        content = delta.get("content") if isinstance(delta, dict) else None
    else:
        content = choice.get("text")
    return content if isinstance(content, str) and content else None


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
