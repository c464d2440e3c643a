"""Which uncached requests reach the model server: an allow-list under /v1, nothing else.

Why an allow-list: the model server behind the proxy has endpoints no client of a cache should
reach (vLLM's unauthenticated ones outside /v1, Ollama's /api/delete). A path is judged on the
bytes the client sent (``raw_path``), before any decoding could turn ``%2e%2e`` or ``..%2F``
into a step out of /v1: a ``.`` or ``..`` segment, an empty one, or an encoded ``/`` or ``\\``
is refused with 400, and a well-formed path that no rule names with 404. What is forwarded is
rebuilt from the checked segments, each quoted again, so nothing in it can become a query or
another segment on the way out. The rule that matched is the path's metric label: a client
choosing paths cannot create metric series.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

from gpucache.serve.tenancy import Refusal

PREFIX = b"/v1/"
ENCODED_SEPARATOR = re.compile(rb"%(2f|5c)", re.IGNORECASE)
SEGMENT = re.compile(r"[A-Za-z0-9._~:@+=,-]+")  # what an OpenAI path segment (a model id) holds


@dataclass(frozen=True)
class Route:
    """A request the allow-list lets through: the path to send below the upstream's /v1, and
    the rule that allowed it (the metric label)."""

    path: str
    label: str


def route(method: str, raw_path: bytes, rules: Sequence[str]) -> Route | Refusal:
    """Where ``method raw_path`` may go, or why it may not."""
    if not raw_path.startswith(PREFIX):
        return Refusal(404, "only paths under /v1/ are served", "unknown_path")
    rest = raw_path[len(PREFIX) :]
    if ENCODED_SEPARATOR.search(rest) or b"\\" in rest:
        return Refusal(400, "an encoded '/' or a '\\' in the path is refused", "invalid_path")
    try:
        segments = unquote(rest.decode("ascii"), errors="strict").split("/")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return Refusal(400, "the path is not ASCII once decoded", "invalid_path")
    if any(s in ("", ".", "..") or not SEGMENT.fullmatch(s) for s in segments):
        return Refusal(400, "the path has an empty, '.', '..' or malformed segment", "invalid_path")
    for rule in rules:
        rule_method, _, pattern = rule.partition(" ")
        parts = pattern.split("/")
        if (
            rule_method == method
            and len(parts) == len(segments)
            and all(p == "*" or p == s for p, s in zip(parts, segments))
        ):
            return Route("/".join(quote(s, safe="") for s in segments), pattern)
    return Refusal(404, f"{method} /v1/{'/'.join(segments)} is not forwarded by this proxy", "unknown_path")
