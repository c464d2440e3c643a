"""``ServeSettings``: how ``gpucache serve`` runs. Every field has a default and a reason.

Constructing settings only checks them: no file is read and no environment variable looked at,
so a value is what it was given, and two constructions of the same values are equal. What the
settings name outside themselves is read by ``resolved()``, once, when the server is built
(``create_app``): the tenancy secret (``namespace_secret`` where given, else the
``GPUCACHE_NAMESPACE_SECRET`` environment variable, else ``secret_file``, created 0600 where
``create_secret`` asks, else a random one for this process), the admin token from
``admin_token_file``, and a first read of ``keys_file``. A random secret files every
authenticated tenant's entries under a hash the next process cannot compute, so with a
snapshot or Redis (entries that outlive the process or are shared with other replicas)
``resolved()`` refuses to start without a stable one, and says how to give it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gpucache.cache.settings import CacheSettings
from gpucache.embedding.settings import EmbedderSettings
from gpucache.fields import setting
from gpucache.guard.settings import GuardSettings
from gpucache.serve.keyfile import KeyFile, KeyFileError
from gpucache.serve.slots import COMPANY_SECONDS
from gpucache.serve.tenancy import CREDENTIAL_HEADERS, CREDENTIAL_PARAMS, NAMESPACE_HEADER, Tenancy
from gpucache.share.settings import ReplicationSettings

SECRET_ENV = "GPUCACHE_NAMESPACE_SECRET"
# Who vouches for a credential before the cache serves it (serve/auth.py and keyfile.py say how)
AUTH_MODES = ("upstream", "keys", "gateway", "none")
ADMIN_TOKEN_ENV = "GPUCACHE_ADMIN_TOKEN"
GATEWAY_TOKEN_HEADER = "x-gpucache-gateway-token"  # never forwarded: upstream.py drops x-gpucache-*
# The paths under /v1 forwarded unchanged, as "METHOD path" with "*" for one path segment:
# the OpenAI endpoints a chat client calls besides completions. Nothing else reaches the
# model server through the proxy (vLLM's and Ollama's own endpoints included).
PASSTHROUGH = ("GET models", "GET models/*", "POST embeddings", "POST moderations")


# A server's cache: concurrent lookups share batches (any value above 0 turns it on: the number
# no longer delays a lookup, batching.py), a slow one fails open after 1 s, and each tenant (a
# key) keeps its share of the cache where another floods it (entries.py).
SERVE_CACHE_DEFAULTS = CacheSettings(lookup_window_seconds=0.002, lookup_timeout_seconds=1.0, fair_share=True)


class ConfigError(ValueError):
    """A setting the proxy cannot start with; the message says what to change."""


def check_type(name: str, value: Any, kind: str) -> None:
    """``value`` is of the annotated ``kind`` ("int", "float | None", "tuple[str, ...]"): a
    settings file or a caller passing the wrong type gets the setting's name, not a crash
    later. An int is a float; a bool is not an int."""
    options = [k.strip() for k in kind.split("|")]
    if value is None:
        if "None" not in options:
            raise ConfigError(f"{name} must be set")
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    fits = {
        "bool": isinstance(value, bool),
        "int": number and isinstance(value, int),
        "float": number,
        "str": isinstance(value, str),
        "bytes": isinstance(value, bytes),
        "tuple": isinstance(value, tuple) and all(isinstance(v, str) for v in value),
    }
    if any(fits.get(option.split("[")[0], False) for option in options):
        return
    raise ConfigError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")


def _read_token(name: str, value: str | None, path: str | None) -> str | None:
    if path is None:
        return value
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    except OSError as exc:
        raise ConfigError(f"the {name} token file cannot be read: {exc}") from exc


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
class ServeSettings:
    """Every setting of ``gpucache serve``, in one frozen tree: the HTTP and tenancy settings
    here, and a section each for the cache (``CacheSettings``), the embedder
    (``EmbedderSettings``), the replication (``ReplicationSettings``) and the guard
    (``GuardSettings``: which soft rules run, as ``gpucache calibrate`` writes them). The command line,
    the ``--config`` file and the ``GPUCACHE_*`` environment are generated from it
    (``gpucache.serve.sources``), so no setting exists under two names. A setting without a flag
    (``flag=False``) is one a command line would show every local user (the tenancy secret); of a
    ``secret`` one, ``gpucache info`` shows only whether it is set."""

    upstream: str = field(
        metadata={"doc": "the model server's OpenAI base URL, ending in /v1 (http://127.0.0.1:8000/v1)"}
    )
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8100, "port to listen on")
    upstream_timeout: float = setting(
        600.0, "seconds to wait for the upstream's answer (a long generation is slow, not dead)"
    )
    max_concurrency: int = setting(
        512,
        "most requests past the exact tier at once (waiting on a lookup or the upstream); past "
        "it a request is answered 503 with Retry-After, and exact repeats are still served; also the "
        "most credential checks in flight (a request with a new key past it: 503)",
    )
    max_tenant_concurrency: int | None = setting(
        8,
        "most of one credential's requests in the cache at once (on a lookup, before they go "
        "upstream: its share of the embedder) while another credential is active (has had a "
        f"request pass its check in the last {COMPANY_SECONDS:g} s); past it a request waits "
        "for its own credential's turn up to retry_after, from its headers, then is answered "
        "503; others' are not. A credential alone, and requests gone upstream, are not held "
        "to it. None: no share, one key's burst fills the embedder's batches whoever waits",
    )
    tenant_rate: float | None = setting(
        None,
        "requests a second one credential may send (a token bucket, checked from the headers "
        "before the body is read); past it a request is answered 429 with Retry-After. Every "
        "keyless request shares one bucket. None: no limit",
    )
    tenant_burst: int = setting(20, "requests one credential may send at once within tenant_rate")
    retry_after: int = setting(1, "seconds a shed request is told to wait (Retry-After)")
    header_timeout: float = setting(
        10.0,
        "seconds a connection has to send a request's headers, from its opening or the "
        "request's first byte; a slower one is closed (a client trickling headers holds a "
        "connection for nothing)",
    )
    grace: float = setting(30.0, "seconds in-flight requests get to finish at shutdown")
    log_level: str = setting("info", "uvicorn's log level")
    max_body_bytes: int = setting(8 * 2**20, "a larger request body is refused with 413")
    max_buffered_bytes: int = setting(
        128 * 2**20,
        "bytes of request bodies held at once across all requests; a body that "
        "would pass it is answered 503 with Retry-After and its connection closed (each body is "
        "buffered whole, so without it many bodies under max_body_bytes hold any amount of memory)",
    )
    body_timeout: float = setting(
        30.0,
        "seconds a request's body has to arrive once its headers are in; a slower one is "
        "answered 408 and its connection closed (a client trickling a body holds a connection "
        "and its buffered bytes for nothing)",
    )
    namespace_header: str = setting(
        NAMESPACE_HEADER, "the header that narrows a request's tenant to one of its namespaces"
    )
    credential_headers: tuple[str, ...] = setting(
        CREDENTIAL_HEADERS, "the headers whose values (all present, keyed-hashed) name the tenant"
    )
    credential_params: tuple[str, ...] = setting(
        CREDENTIAL_PARAMS,
        "query parameters that carry a credential: they name the tenant as the credential headers do",
    )
    trust_namespace_header: bool = setting(
        False,
        "let the namespace header alone name the tenant: only behind a gateway that "
        "authenticates clients, sets the header and strips any copy a client sent",
    )
    auth: str = setting(
        "upstream",
        "how a credential is checked before the cache answers it: upstream (asked once "
        "with GET /v1/models, the verdict kept auth_ttl seconds; a refused key gets the upstream's "
        "401/403 and nothing from the cache), keys (the keys listed in keys_file, nothing asked of "
        "the upstream), gateway (a trusted front authenticated every client and strips credentials "
        "it did not check), none (no check: only where the upstream checks nothing either)",
    )
    keys_file: str | None = setting(
        None,
        "with auth=keys: the allowed keys, one a line, as the key or sha256:<hex>; read again "
        "when it changes",
    )
    auth_ttl: float = setting(
        60.0, "seconds a credential's verdict is kept before the upstream is asked again"
    )
    auth_timeout: float = setting(
        5.0,
        "seconds a credential check (GET /v1/models) may take before it counts as unanswered: "
        "the longest a new key's first request waits; a key seen before waits a quarter of a "
        "second at most on its re-check, then is served on its last verdict (within auth_grace) "
        "while the check goes on",
    )
    auth_grace: float = setting(
        300.0,
        "seconds past its auth_ttl that a key's last verdict is extended while the upstream "
        "cannot answer the check (unreachable, too slow, an error status); past it, or for a key "
        "never checked, the request gets the upstream's failure",
    )
    require_auth: bool = setting(
        True,
        "answer a request without credentials with 401; --no-require-auth files keyless "
        "requests under one shared tenant, 'anonymous' (checked like any credential under auth=upstream)",
    )
    namespace_secret: bytes | None = setting(
        None,
        f"the tenancy hash key (from {SECRET_ENV}, never a flag); none: secret_file or random",
        flag=False,
        secret=True,
        repr=False,
    )
    secret_file: str | None = setting(
        None,
        f"a file holding the tenancy secret (0600; or {SECRET_ENV}); needed with a snapshot or "
        "Redis, the same on every replica",
    )
    create_secret: bool = setting(
        False, "create secret_file (beside the snapshot by default) with a new random secret if missing"
    )
    admin_token: str | None = setting(
        None,
        f"the bearer token of the /admin endpoints; prefer {ADMIN_TOKEN_ENV} or admin_token_file "
        "(argv is visible to every local user); none: the endpoints are off",
        secret=True,
        repr=False,
    )
    admin_token_file: str | None = setting(None, "a file holding the admin token")
    gateway_token: str | None = setting(
        None,
        f"the token a trusted front sends in {GATEWAY_TOKEN_HEADER} (compared in constant time), "
        "needed with auth=gateway or trust_namespace_header: without it, anyone who reaches the port "
        "could name any tenant; prefer GPUCACHE_GATEWAY_TOKEN or gateway_token_file",
        secret=True,
        repr=False,
    )
    gateway_token_file: str | None = setting(None, "a file holding the gateway token")
    snapshot: str | None = setting(
        None, "a snapshot file loaded at start (when present) and saved at shutdown and on demand"
    )
    ignore_client_cache_control: bool = setting(
        False, "read no request's Cache-Control: for deployments that let no client steer the cache"
    )
    overhead_header: bool = setting(
        False,
        "send x-gpucache-overhead-ms (the proxy's own time) with every answer: off by default, "
        "since to a client sharing the proxy it is a clock on work other tenants' requests changed",
    )
    passthrough: tuple[str, ...] = setting(
        PASSTHROUGH, "the uncached paths under /v1 forwarded to the upstream ('METHOD path', '*' a segment)"
    )
    cache: CacheSettings = field(default_factory=lambda: SERVE_CACHE_DEFAULTS, metadata={"section": True})
    """The cache's settings, the one place each lives (``CacheSettings``): a server's defaults
    batch concurrent lookups (those that gather behind a running batch) and bound them (1 s,
    then the request goes upstream and the cache fails open). Its ``ttl`` is how long a stored
    answer lives; clients cannot set it: a request's ``max-age`` says what age it accepts, not
    how long others may be served the answer."""
    embedder: EmbedderSettings = field(default_factory=EmbedderSettings, metadata={"section": True})
    replication: ReplicationSettings = field(default_factory=ReplicationSettings, metadata={"section": True})
    guard: GuardSettings = field(default_factory=GuardSettings, metadata={"section": True})

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if not f.metadata.get("section"):
                check_type(f.name, getattr(self, f.name), str(f.type))
        if not self.upstream.startswith(("http://", "https://")):
            raise ConfigError(f"upstream must be an http(s) URL, got {self.upstream!r}")
        if not self.upstream_timeout > 0:
            raise ConfigError(f"upstream_timeout must be > 0, got {self.upstream_timeout!r}")
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"port must be in 1..65535, got {self.port!r}")
        if self.auth not in AUTH_MODES:
            raise ConfigError(f"auth must be one of {', '.join(AUTH_MODES)}, got {self.auth!r}")
        if (self.auth == "keys") != (self.keys_file is not None):
            raise ConfigError("auth=keys needs keys_file, and keys_file is read only with auth=keys")
        if not self.auth_ttl >= 0:
            raise ConfigError(f"auth_ttl must be >= 0, got {self.auth_ttl!r}")
        if not self.auth_timeout > 0 or not self.auth_grace >= 0:
            raise ConfigError(
                f"auth_timeout must be > 0 and auth_grace >= 0, got {self.auth_timeout!r} "
                f"and {self.auth_grace!r}"
            )
        if self.max_tenant_concurrency is not None and self.max_tenant_concurrency < 1:
            raise ConfigError("max_tenant_concurrency must be >= 1 or none")
        if self.tenant_rate is not None and not self.tenant_rate > 0:
            raise ConfigError(f"tenant_rate must be > 0 or none, got {self.tenant_rate!r}")
        if self.tenant_burst < 1:
            raise ConfigError(f"tenant_burst must be >= 1, got {self.tenant_burst!r}")
        if self.max_concurrency < 1 or self.retry_after < 0:
            raise ConfigError("max_concurrency must be >= 1 and retry_after >= 0")
        if not self.body_timeout > 0:
            raise ConfigError(f"body_timeout must be > 0, got {self.body_timeout!r}")
        if not self.header_timeout > 0:
            raise ConfigError(f"header_timeout must be > 0, got {self.header_timeout!r}")
        if not self.grace >= 0:
            raise ConfigError(f"grace must be >= 0, got {self.grace!r}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes!r}")
        if self.max_buffered_bytes < self.max_body_bytes:  # else the largest body is never read
            raise ConfigError(
                f"max_buffered_bytes must be >= max_body_bytes ({self.max_body_bytes}), "
                f"got {self.max_buffered_bytes!r}"
            )
        for rule in self.passthrough:
            method, _, path = rule.partition(" ")
            if method not in ("GET", "POST", "PUT", "DELETE", "PATCH") or not path or ".." in path:
                raise ConfigError(f"a passthrough rule is 'METHOD path', got {rule!r}")
        if self.namespace_secret is not None and len(self.namespace_secret) < 16:
            raise ConfigError("namespace_secret must be at least 16 bytes")  # not a 500 per request
        for name, value, file in (
            ("admin", self.admin_token, self.admin_token_file),
            ("gateway", self.gateway_token, self.gateway_token_file),
        ):
            if file is not None and value is not None:
                raise ConfigError(f"give the {name} token or its file, not both")
            if value is not None and len(value) < 16:
                raise ConfigError(f"the {name} token must be at least 16 characters")

    def resolved(self) -> ServeSettings:
        """These settings with what they name outside themselves read in (the module's
        docstring): the tenancy secret, the admin token from its file; the key file read once,
        so a server with one it cannot read refuses to start. Settings already resolved come
        back as they are. ``ConfigError`` says what is missing or unreadable."""
        if self.keys_file is not None:
            try:
                KeyFile(self.keys_file)
            except KeyFileError as exc:
                raise ConfigError(str(exc)) from exc
        token, gateway = (
            _read_token("admin", self.admin_token, self.admin_token_file),
            _read_token("gateway", self.gateway_token, self.gateway_token_file),
        )
        if gateway is None and (self.auth == "gateway" or self.trust_namespace_header):
            raise ConfigError(
                "auth=gateway and trust_namespace_header trust what the front says: give "
                f"it a gateway_token to send in {GATEWAY_TOKEN_HEADER} (or "
                "GPUCACHE_GATEWAY_TOKEN), or anyone who reaches the port could name any tenant"
            )
        return dataclasses.replace(
            self,
            namespace_secret=self._secret(),
            admin_token=token,
            admin_token_file=None,
            gateway_token=gateway,
            gateway_token_file=None,
        )

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
        if self.snapshot or self.replication.redis:
            raise ConfigError(
                "with --snapshot or --redis the tenants' entries outlive this process, so their "
                f"namespaces need a stable secret: set {SECRET_ENV}, or pass --secret-file PATH "
                "(add --create-secret to create it), the same on every replica"
            )
        return secrets.token_bytes(32)

    def _known_secret(self) -> bytes:
        if self.namespace_secret is None:
            raise RuntimeError(
                "gpucache bug: keys derived from settings that were never resolved (ServeSettings.resolved())"
            )
        return self.namespace_secret

    @cached_property
    def snapshot_key(self) -> bytes:
        """The key snapshots are signed with and checked against: derived from the tenancy
        secret (so a file planted by anyone without it is refused), never the secret itself."""
        return hmac.new(self._known_secret(), b"gpucache snapshot", hashlib.sha256).digest()

    @cached_property
    def replication_key(self) -> bytes:
        """The key replicas sign their shared records with: derived from the tenancy secret,
        which every replica shares, never the secret itself."""
        return hmac.new(self._known_secret(), b"gpucache replication", hashlib.sha256).digest()

    @cached_property
    def tenancy(self) -> Tenancy:
        return Tenancy(
            self._known_secret(),
            self.credential_headers,
            self.namespace_header,
            self.trust_namespace_header,
            self.require_auth,
            self.credential_params,
        )
