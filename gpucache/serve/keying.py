"""What a request's answer depends on: its exact scope, and the text compared by meaning.

The scope is everything that changes the answer, so two requests share one only when all of it
is equal: the tenant's namespace, the endpoint, and the whole request body except the text
compared by meaning and the fields that only shape the transport (``stream``,
``stream_options``, ``user``). So the model, every sampling setting (an omitted temperature is
the upstream's default, not 0, and an omitted field stays apart from any value), limits, stop,
seed, tools, the response format and the system prompt(s) are in it, and a field this proxy
has never heard of is in it too: an unknown field can cost a hit, never cause a wrong answer.

The text compared by meaning is the last user message (for ``/v1/completions``, the prompt),
and the earlier user and assistant turns are its *context*, carried with it as a
``Conversation`` (gpucache.conversation): the cache serves a follow-up ("how old is he?") after
the same earlier turns, word for word (``match_context`` off, the default), or, with it on,
after turns the context matcher finds agree on what it depends on. System and developer messages before the
first turn stay in the scope. A conversation holding anything else (tool calls and results, names, a system
message between turns, content that is not text) keeps every earlier message in the scope, as
an exact match: an unknown shape can cost a hit, never cause a wrong answer.

Requests whose answer a cache cannot stand for are bypassed: several choices (``n`` > 1),
log-probabilities, token ids or the prompt echoed (vLLM's ``return_token_ids``, ``echo``), a
last message that is not the user's, content that is not text, and texts too short to embed
meaningfully (an empty tool-result turn would embed to one fixed vector and hit another
conversation's entry), and a text that starts as the cache's key of a conversation
(``value.MARK``: the library refuses such a prompt, so that no text is read as a conversation).

Invisible characters in the texts compared by meaning (the final message and the context) are
in the scope too (``hidden_characters``): the model reads them and the embedder does not.

The tenant that opens every scope comes from the request's credentials (tenancy.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from gpucache.conversation.value import MARK, Conversation, Prompt, Turn

TRANSPORT_FIELDS = frozenset({"stream", "stream_options", "user"})
LOGPROBS_FIELDS = ("logprobs", "top_logprobs", "prompt_logprobs")
MIN_TEXT_CHARS = 2  # below this a text has no meaning to compare: "" or "?" embed to noise
MAX_JSON_DEPTH = 64
# OpenAI's own bound on a chat request's messages: a longer list is no request its API takes,
# and each message is walked, compared and hashed while the request is keyed
MAX_MESSAGES = 2048
# A message's content parts are walked one by one while keying; past this many (no client
# sends them: OpenAI's own bound on messages, applied to one message's parts) the request is
# forwarded uncached rather than walked. Not refused: the upstream may take it. Other arrays
# (tools, stop) are only hashed, in C, their size bounded by the body's.
MAX_CONTENT_PARTS = 2048
# The longest text (the final message and the earlier turns it carries) a request is looked up
# by: the content policy's ``max_prompt_chars``, past which nothing is stored, so nothing longer
# is ever found. Such a request is forwarded uncached ("too-large") without the cache's work on
# it (its conversation's key, a JSON of every turn; its digest; its embedding), which for a body
# near the size cap held the GIL, and so every other tenant's hits, for tens of milliseconds.
MAX_COMPARED_CHARS = 200_000
# A field of the request (``stop``, ``tools``, ``logit_bias``...) with more members than this (no
# OpenAI request has: it takes 4 stop sequences and 128 tools) is forwarded uncached ("many-members"),
# not hashed into a scope: the upstream may take it, and the JSON of 500,000 stop strings, made
# to key it, held the GIL as long as a conversation near the size cap did.
MAX_FIELD_MEMBERS = 2048
# A body that may hold more JSON values than this (counted at C speed before it is parsed:
# ``values_bound``) is forwarded uncached ("many-values"), never parsed or walked by the proxy:
# four clients sending 7.8 MiB bodies of 240,000 one-word messages held the GIL 139 ms a body in
# orjson and 300 ms more in the key's walk, and another tenant's exact hits went from 0.8 to
# 116 ms (p50). No OpenAI request comes near it (2,048 messages of a few fields each do not); a
# prompt given as token ids longer than it is answered, uncached.
MAX_JSON_VALUES = 65_536


class BadRequest(ValueError):
    """A request body the OpenAI API would refuse: wrong types, missing fields. ``param``
    names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class RequestKey:
    kind: str  # "chat" or "completions"
    scope: str  # namespace / digest of everything but the text
    text: str | None  # the text compared by meaning; None when bypassed
    bypass: str | None  # why the cache stays out of it, or None
    stream: bool
    include_usage: bool
    context: tuple[Turn, ...] = ()  # the earlier turns (the cache compares them: match_context)
    # where there is context: the scope an earlier version filed this request under (every
    # earlier turn in it), whose entries are still served for their exact repeat
    legacy_scope: str | None = None

    @property
    def prompt(self) -> Prompt:
        """What the cache is asked: the text, or the conversation it ends."""
        if self.text is None:
            raise RuntimeError("gpucache bug: a bypassed request has no text to look up")
        return Conversation(self.text, self.context) if self.context else self.text


def values_bound(raw: bytes) -> int:
    """At least the number of JSON values in ``raw``, counted at C speed (``bytes.count``):
    every value is the root, the first member of a container, or follows a comma, and every
    container opens with a bracket. Commas and brackets inside strings are counted too, so it
    never counts fewer than there are."""
    return 1 + raw.count(b",") + raw.count(b"[") + raw.count(b"{")


def uncounted_key(kind: str) -> RequestKey:
    """The key of a body with more values than ``MAX_JSON_VALUES``: forwarded unparsed,
    uncached, its answer relayed as it comes (JSON or a stream: ``stream`` relays either)."""
    return RequestKey(kind, "", None, "many-values", stream=True, include_usage=False)


def parse_json(raw: bytes) -> Any:
    """A request body as JSON; ``BadRequest`` where it is not JSON or nests deeper than
    ``MAX_JSON_DEPTH`` (no OpenAI request does; a deep one would exhaust the recursion of
    every later step that walks it).

    orjson reads it where it can (several times faster: a body near the size cap held the GIL
    for tens of milliseconds in ``json``): it reads strict JSON of valid UTF-8 only, and reads
    it as ``json`` does but for an integer past 64 bits, which it reads as a float (two such
    seeds would share a scope). So ``json`` reads what orjson refuses (a lone surrogate escaped,
    NaN) or refuses it with its message, and reads again a body in which orjson found a number
    that large."""
    body = _orjson_loads(raw)
    if body is not _REFUSED and _walk(body, strings=False):
        return body
    try:
        body = json.loads(raw)
    except RecursionError as exc:
        raise BadRequest(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    _walk(body, strings=True)
    return body


def _walk(body: Any, strings: bool) -> bool:
    """``BadRequest`` for a body nested past ``MAX_JSON_DEPTH``, and with ``strings``, for one
    holding a string that is not text; False where a float is 2^63 or more in magnitude (what
    orjson makes of a larger integer), else True."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            for k, v in value.items():
                if strings:
                    _text(k)
                stack.append((v, depth + 1))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, str):
            if strings:
                _text(value)
        elif isinstance(value, float) and not strings and not -(2.0**63) < value < 2.0**63:
            return False
    return True


_REFUSED = object()


def _orjson_loads(raw: bytes) -> Any:
    """``raw`` read by orjson, or ``_REFUSED`` where it cannot read it (or is not installed:
    imported here, not with the module, which the package's value tier loads without extras)."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - the serve extra installs it
        return _REFUSED
    try:
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, RecursionError):
        return _REFUSED


def _text(value: str) -> None:
    """``BadRequest`` for a string that is not text: JSON lets ``\\ud800`` stand alone, but a
    lone surrogate encodes to nothing, so whatever later writes it out (the upstream request,
    a log line, a stored record) would fail with a server error instead of this client's 400."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(
            "the request body holds a lone surrogate (a \\ud800-\\udfff escape without "
            "its pair): it is not text"
        ) from None


def request_key(kind: str, body: Any, tenant: str) -> RequestKey:
    """The scope and text of a ``chat`` or ``completions`` request body; ``BadRequest`` for
    a body of the wrong shape."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    include_usage = bool(options.get("include_usage", False))
    rest = {k: v for k, v in body.items() if k not in TRANSPORT_FIELDS}
    context: tuple[Turn, ...] = ()
    if kind == "chat":
        text, bypass = _chat_text(rest)
        earlier = rest.get("messages")
        if bypass is None:
            context = _context(rest)
    else:
        text, bypass = _prompt_text(rest)
    n = body.get("n", 1)
    reasons = {  # the first that applies is why the request is bypassed
        "n": not isinstance(n, int) or n != 1,
        # any value but an absent one or false asks for logprobs: ``/v1/completions`` takes a count,
        # and ``logprobs: 0`` still asks for the chosen token's, which a stored text cannot give
        "logprobs": any(body.get(k) is not None and body.get(k) is not False for k in LOGPROBS_FIELDS),
        # vLLM's extensions that put more than the text in the answer: the token ids, and the
        # prompt echoed before the answer (another user's wording, on a semantic hit)
        "token-ids": body.get("return_token_ids") not in (None, False),
        "echo": body.get("echo") not in (None, False),
        "short-text": text is not None and len(text.strip()) < MIN_TEXT_CHARS,
        # the cache's own key of a conversation: the client's text stays its own
        "reserved-text": text is not None and text.startswith(MARK),
    }
    bypass = bypass or next((reason for reason, applies in reasons.items() if applies), None)
    if text is not None and len(text) + sum(len(turn.text) for turn in context) > MAX_COMPARED_CHARS:
        # its scope is never asked (nor hashed: a history kept in the scope would be)
        return RequestKey(kind, f"{tenant}/too-large", None, "too-large", stream, include_usage)
    if any(isinstance(v, (list, dict)) and len(v) > MAX_FIELD_MEMBERS for v in rest.values()):
        return RequestKey(kind, f"{tenant}/many-members", None, "many-members", stream, include_usage)
    hidden = "".join(hidden_characters(t) for t in (*(turn.text for turn in context), text or ""))
    scope = f"{tenant}/{_digest(kind, rest, hidden)}"
    if bypass is not None:
        return RequestKey(kind, scope, None, bypass, stream, include_usage)
    legacy = None
    if context:  # as it was keyed before conversations were matched by meaning (an exact repeat's
        # text is the same, hidden characters and all: format characters alone keyed it then)
        legacy = f"{tenant}/{_digest(kind, {**rest, 'messages': earlier}, format_characters(text or ''))}"
    return RequestKey(kind, scope, text, None, stream, include_usage, context, legacy)


def _digest(kind: str, rest: dict[str, Any], hidden: str) -> str:
    keyed: dict[str, Any] = {"endpoint": kind, "body": rest}
    if hidden:  # the model reads them; the embedder and the guard do not: a request of its own
        keyed["hidden"] = hidden
    canonical = json.dumps(keyed, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def hidden_characters(text: str) -> str:
    """The characters of ``text`` a reader does not see and the embedder does not read, in
    order: format characters (Unicode category Cf: tag characters U+E0000-E007F, zero-width
    spaces and joiners, direction marks...), control characters but tab and line breaks (Cc),
    the rest of Unicode's default-ignorable code points (variation selectors, whose 256 forms
    spell any byte after a visible character, the combining grapheme joiner, Hangul fillers,
    the tag block's unassigned rest) and the blank braille pattern U+2800.

    Why they key the scope: the model reads them (tag characters and variation selectors spell
    ASCII text a reader never sees, a way to hide instructions in a prompt), but the tokenizer
    of the embedder and the guard drop them, so a prompt carrying hidden instructions and the
    clean question embed alike, at similarity 1.0. In the scope they make a request of its own:
    answered from the cache only for a request with the same hidden characters, and its answer
    never served for the clean question, nor the clean question's for it. Linear in C either
    way (a few milliseconds for 8 MB of ASCII), since a body up to the size cap is read here."""
    if text.isascii():
        return text.encode("ascii").translate(None, _SEEN_ASCII).decode("ascii")
    return "".join(_HIDDEN.findall(text))


def format_characters(text: str) -> str:
    """The format characters (Cf) of ``text``, in order: what keyed a scope before
    ``hidden_characters`` (``RequestKey.legacy_scope``)."""
    if text.isascii():
        return ""
    return "".join(ch for ch in text if unicodedata.category(ch) == "Cf")


def _hidden_class() -> re.Pattern[str]:
    """One character class of every hidden character (``hidden_characters``), built from this
    Python's Unicode tables once, at import (a tenth of a second)."""
    points = [c for c in range(0x110000) if unicodedata.category(chr(c)) in ("Cf", "Cc")]
    points = [c for c in points if chr(c) not in "\t\n\r"]
    for low, high in _IGNORABLE:
        points.extend(range(low, high + 1))
    ranges: list[list[int]] = []
    for c in sorted(set(points)):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]")


# Unicode's default-ignorable code points that are not format characters (DerivedCoreProperties:
# Default_Ignorable_Code_Point, less category Cf), and the blank braille pattern
_IGNORABLE = (
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x115F, 0x1160),  # Hangul choseong and jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180F),  # Mongolian free variation selectors
    (0x2065, 0x2065),
    (0x2800, 0x2800),  # braille pattern blank: drawn as nothing, read by the model
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0F),  # variation selectors
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE0FFF),  # tags and variation selectors supplement
)
_SEEN_ASCII = bytes(range(0x20, 0x7F)) + b"\t\n\r"  # what of ASCII a reader sees
_HIDDEN = _hidden_class()


def _chat_text(rest: dict[str, Any]) -> tuple[str | None, str | None]:
    """The last user message's text, taken out of ``rest`` (its role stays in the scope)."""
    messages = rest.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required and must be a non-empty array", "messages")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(
            f"'messages' holds {len(messages)} messages; at most {MAX_MESSAGES} are accepted", "messages"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
    last = messages[-1]
    if last["role"] != "user":
        return None, "last-message-not-user"
    content = last.get("content")
    if isinstance(content, list) and len(content) > MAX_CONTENT_PARTS:
        return None, "many-content-parts"
    text = _text_of(content)
    if text is None:
        return None, "non-text-content"
    rest["messages"] = [*messages[:-1], {k: v for k, v in last.items() if k != "content"}]
    return text, None


def _context(rest: dict[str, Any]) -> tuple[Turn, ...]:
    """The earlier turns taken out of ``rest["messages"]`` as context, where every message after
    the leading system (or developer) ones is a plain user or assistant text message; else
    none, and every message stays in the scope."""
    messages = rest["messages"]
    lead = 0
    while lead < len(messages) - 1 and messages[lead]["role"] in ("system", "developer"):
        lead += 1
    turns = []
    for message in messages[lead:-1]:
        text = _text_of(message.get("content"))
        plain = message["role"] in ("user", "assistant") and set(message) == {"role", "content"}
        if not plain or text is None:
            return ()
        turns.append(Turn(message["role"], text))
    rest["messages"] = [*messages[:lead], messages[-1]]
    return tuple(turns)


def _prompt_text(rest: dict[str, Any]) -> tuple[str | None, str | None]:
    prompt = rest.pop("prompt", None)
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return prompt[0], None
        return None, "several-prompts"
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' is required and must be a string", "prompt")
    return prompt, None


def _text_of(content: Any) -> str | None:
    """A message's text: a string, or the text parts of a content array joined by newlines;
    None where any part is not text (an image, audio), or there are more than
    ``MAX_CONTENT_PARTS``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or len(content) > MAX_CONTENT_PARTS:
        return None
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            return None
        parts.append(part["text"])
    return "\n".join(parts)
