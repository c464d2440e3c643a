"""``ServeConfig``: how ``gpucache serve`` runs. Every field has a default and a reason."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field


def _namespace_secret() -> bytes:
    """From GPUCACHE_NAMESPACE_SECRET where set, so the tenants' namespaces (keyed hashes of
    their Authorization headers) stay the same across restarts and a snapshot keeps serving
    them; otherwise random for this process."""
    configured = os.environ.get("GPUCACHE_NAMESPACE_SECRET")
    return configured.encode() if configured else secrets.token_bytes(32)


@dataclass(frozen=True)
class ServeConfig:
    upstream: str
    """The upstream's OpenAI base URL, ending in /v1 (http://127.0.0.1:8000/v1)."""
    upstream_timeout: float = 600.0
    """Seconds to wait for the upstream's answer (a long generation is slow, not dead)."""
    namespace_header: str = "x-gpucache-namespace"
    """The header naming a request's tenant; without it, a keyed hash of Authorization."""
    namespace_secret: bytes = field(default_factory=_namespace_secret, repr=False)
    admin_token: str | None = None
    """The bearer token of the /admin endpoints; None turns them off."""
    snapshot: str | None = None
    """A snapshot file loaded at start (when present) and saved at shutdown and on demand."""
    max_body_bytes: int = 8 * 2**20
    """A larger request body is refused with 413."""
    lookup_timeout: float = 1.0
    """A lookup taking longer is a miss: the request goes upstream and the cache fails open."""
    lookup_window: float = 0.002
    """Requests arriving within this many seconds share one embedder batch and one scan."""
    lookup_batch: int = 64
    """The most lookups one such batch holds."""
    cache_tool_calls: bool = False
    """Store answers that call tools (off: a tool call depends on state the cache cannot see)."""
    redis: str | None = None
    """A Redis or Valkey URL: replicas share their entries through it (gpucache.share)."""

    def __post_init__(self) -> None:
        if not self.upstream.startswith(("http://", "https://")):
            raise ValueError(f"upstream must be an http(s) URL, got {self.upstream!r}")
        for name in ("upstream_timeout", "lookup_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.lookup_window <= 1:
            raise ValueError(f"lookup_window must be in [0, 1] seconds, got {self.lookup_window!r}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes!r}")
