"""``ServeConfig``: how ``gpucache serve`` runs. Every field has a default and a reason.

The tenancy secret is resolved here, once: ``namespace_secret`` where given, else the
``GPUCACHE_NAMESPACE_SECRET`` environment variable, else ``secret_file`` (created, 0600, where
``create_secret`` asks), else a random one for this process. A random secret files every
authenticated tenant's entries under a hash the next process cannot compute, so with a
snapshot or Redis (entries that outlive the process or are shared with other replicas) the
config refuses to start without a stable one, and says how to give it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from functools import cached_property

from gpucache.cache.settings import CacheSettings
from gpucache.serve.tenancy import CREDENTIAL_HEADERS, NAMESPACE_HEADER, Tenancy

SECRET_ENV = "GPUCACHE_NAMESPACE_SECRET"
ADMIN_TOKEN_ENV = "GPUCACHE_ADMIN_TOKEN"
# The paths under /v1 forwarded unchanged, as "METHOD path" with "*" for one path segment:
# the OpenAI endpoints a chat client calls besides completions. Nothing else reaches the
# model server through the proxy (vLLM's and Ollama's own endpoints included).
PASSTHROUGH = ("GET models", "GET models/*", "POST embeddings", "POST moderations")


# A server's cache: concurrent lookups share batches, and a slow one fails open after 1 s.
SERVE_CACHE_DEFAULTS = CacheSettings(lookup_window_seconds=0.002, lookup_timeout_seconds=1.0)


class ConfigError(ValueError):
    """A setting the proxy cannot start with; the message says what to change."""


def read_secret_file(path: str, create: bool = False) -> bytes:
    """The secret in ``path`` (its text, stripped). ``create``: write a new random one first
    where none exists, readable by its owner only. A file others can read is refused: it
    would let them compute any tenant's namespace."""
    if create:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_hex(32) + "\n")
    try:
        mode = os.stat(path).st_mode
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"the secret file {path} cannot be read: {exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"the secret file {path} is readable by others: chmod 600 {path}")
    if len(secret) < 16:
        raise ConfigError(f"the secret in {path} is shorter than 16 bytes")
    return secret


@dataclass(frozen=True)
class ServeConfig:
    upstream: str
    """The upstream's OpenAI base URL, ending in /v1 (http://127.0.0.1:8000/v1)."""
    upstream_timeout: float = 600.0
    """Seconds to wait for the upstream's answer (a long generation is slow, not dead)."""
    namespace_header: str = NAMESPACE_HEADER
    """The header that narrows a request's tenant to one of its namespaces."""
    credential_headers: tuple[str, ...] = CREDENTIAL_HEADERS
    """The headers whose values (all present, keyed-hashed) name the tenant."""
    trust_namespace_header: bool = False
    """Let the namespace header alone name the tenant: only behind a gateway that
    authenticates clients, sets the header and strips any copy a client sent."""
    require_auth: bool = False
    """Answer a request without credentials with 401 instead of the shared 'anonymous'."""
    namespace_secret: bytes | None = field(default=None, repr=False)
    """The tenancy hash key; None: from the environment, ``secret_file`` or random (above)."""
    secret_file: str | None = None
    """A file holding the tenancy secret (0600); see ``create_secret``."""
    create_secret: bool = False
    """Create ``secret_file`` with a new random secret where it does not exist."""
    admin_token: str | None = field(default=None, repr=False)
    """The bearer token of the /admin endpoints; None turns them off."""
    snapshot: str | None = None
    """A snapshot file loaded at start (when present) and saved at shutdown and on demand."""
    max_body_bytes: int = 8 * 2**20
    """A larger request body is refused with 413."""
    cache: CacheSettings = field(default_factory=lambda: SERVE_CACHE_DEFAULTS)
    """The cache's settings, the one place each lives (``CacheSettings``): a server's defaults
    batch concurrent lookups (a 2 ms window) and bound them (1 s, then the request goes
    upstream and the cache fails open). Its ``ttl`` is how long a stored answer lives; clients
    cannot set it: a request's ``max-age`` says what age it accepts, not how long others may be
    served the answer."""
    device: str = "auto"
    """Where the embedder and the index run: "auto", "cpu" or "cuda[:N]"."""
    model: str | None = None
    """The embedding model (a local folder or a cached hub name); None: the packaged one."""
    ignore_client_cache_control: bool = False
    """Read no request's Cache-Control: for deployments that let no client steer the cache."""
    passthrough: tuple[str, ...] = PASSTHROUGH
    """The uncached paths under /v1 forwarded to the upstream ("METHOD path", "*" a segment)."""
    redis: str | None = None
    """A Redis or Valkey URL: replicas share their entries through it (gpucache.share)."""

    def __post_init__(self) -> None:
        if not self.upstream.startswith(("http://", "https://")):
            raise ConfigError(f"upstream must be an http(s) URL, got {self.upstream!r}")
        if not self.upstream_timeout > 0:
            raise ConfigError(f"upstream_timeout must be > 0, got {self.upstream_timeout!r}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes!r}")
        for rule in self.passthrough:
            method, _, path = rule.partition(" ")
            if method not in ("GET", "POST", "PUT", "DELETE", "PATCH") or not path or ".." in path:
                raise ConfigError(f"a passthrough rule is 'METHOD path', got {rule!r}")
        object.__setattr__(self, "namespace_secret", self._secret())
        if self.admin_token is not None and len(self.admin_token) < 16:
            raise ConfigError("the admin token must be at least 16 characters")

    def _secret(self) -> bytes:
        if self.namespace_secret is not None:
            return self.namespace_secret
        configured = os.environ.get(SECRET_ENV)
        if configured:
            if len(configured.encode()) < 16:
                raise ConfigError(f"{SECRET_ENV} must be at least 16 bytes")
            return configured.encode()
        path = self.secret_file
        if path is None and self.create_secret and self.snapshot:
            path = f"{self.snapshot}.secret"  # beside the snapshot it keeps usable
        if path is not None:
            return read_secret_file(path, create=self.create_secret)
        if self.snapshot or self.redis:
            raise ConfigError(
                "with --snapshot or --redis the tenants' entries outlive this process, so their "
                f"namespaces need a stable secret: set {SECRET_ENV}, or pass --secret-file PATH "
                "(add --create-secret to create it), the same on every replica"
            )
        return secrets.token_bytes(32)

    @cached_property
    def snapshot_key(self) -> bytes:
        """The key snapshots are signed with and checked against: derived from the tenancy
        secret (so a file planted by anyone without it is refused), never the secret itself."""
        assert self.namespace_secret is not None
        return hmac.new(self.namespace_secret, b"gpucache snapshot", hashlib.sha256).digest()

    @cached_property
    def replication_key(self) -> bytes:
        """The key replicas sign their shared records with: derived from the tenancy secret,
        which every replica shares, never the secret itself."""
        assert self.namespace_secret is not None
        return hmac.new(self.namespace_secret, b"gpucache replication", hashlib.sha256).digest()

    @cached_property
    def tenancy(self) -> Tenancy:
        assert self.namespace_secret is not None
        return Tenancy(self.namespace_secret, self.credential_headers, self.namespace_header,
                       self.trust_namespace_header, self.require_auth)
