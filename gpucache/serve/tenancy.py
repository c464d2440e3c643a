"""Who a request belongs to: its tenant, from its credentials, never from a header alone.

A tenant's entries are answered to that tenant only, and a hit never reaches the upstream that
would have checked the key: so the tenant must come from what the upstream authenticates, the
credentials, and never from a header any client can set. The tenant is a keyed hash of the
request's credential headers (``authorization``, Azure's ``api-key``, ``x-api-key`` by
default: every one present, by name and value), so no key is stored and two keys never share
entries. The namespace header only narrows *within* that tenant (``key:<hash>/ns:<name>``): a
team can keep its experiments apart, never reach another key's entries.

One deployment differs: a gateway in front of the proxy that authenticates clients itself,
sets the namespace header and strips any copy a client sent. There
(``trust_namespace_header``) the header alone names the tenant. A request without credentials
is refused (401) unless the deployment opts in (``require_auth=False``): then it is filed under
the shared ``anonymous``, and every keyless client is one tenant.

A request must not be ambiguous: more than one value of a credential header or of the namespace
header is refused (400; a credential is a singleton field, RFC 9110 §5.3: a proxy that hashed
the first and an upstream that checked the last would file answers under a key the upstream
never saw). Credentials sent as query parameters (``credential_params``: "key", "api-key",
"api_key", "access_token" by default) count as credentials, and the raw query string as a
whole is part of the scope (``?api-version=`` values, any parameter the upstream reads, never
share an answer); it is forwarded as received.

The hash key (the secret) must be the same after a restart and on every replica, or entries
kept in a snapshot or shared through Redis are filed under tenants nobody can reach again
(``ServeSettings`` refuses to start without one where that matters).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")
CREDENTIAL_PARAMS = ("key", "api-key", "api_key", "access_token")
# Headers other servers and gateways read a key from (Google's, LiteLLM's, Azure API Management's,
# Kong's, Portkey's, Cloudflare AI Gateway's, Helicone's...): any whose name reads as a credential.
# One that is not among the credential headers would reach the upstream, and its check, without
# naming the tenant: a revoked key sent beside a valid one there would be served the cache, filed
# under the other. Such a request is refused unless the deployment lists the header as a
# credential header (then it names the tenant like the others). Named by pattern, since gateways
# keep inventing them; the proxy's own headers (x-gpucache-*) are not forwarded, and pass.
CREDENTIAL_NAME = re.compile(
    r"(?:^|[-_])(?:auth|authorization|apikey|api[-_]key|access[-_]key|subscription[-_]key|token"
    r"|secret|password|passwd|credentials?|jwt|assertion)(?:$|[-_])"
    # a name that ends in "key" (x-openai-key, x-portkey-virtual-key) but one that says what
    # else the key is for (NOT_CREDENTIALS)
    r"|[-_]key$"
)
# Names that end in "key" and carry no credential: an Idempotency-Key is a client's request id
NOT_CREDENTIALS = frozenset({"idempotency-key", "x-idempotency-key"})


@functools.lru_cache(maxsize=1024)  # asked of every header of every request, exact hits' included
def credential_like(name: str) -> bool:
    """Whether a (lower-case) header name reads as one that carries a credential that would
    reach the upstream: not the proxy's own (x-gpucache-*), nor Proxy-Authorization, a
    hop-by-hop header the proxy never forwards (upstream.py)."""
    return (
        CREDENTIAL_NAME.search(name) is not None
        and not name.startswith("x-gpucache-")
        and name != "proxy-authorization"
        and name not in NOT_CREDENTIALS
    )


NAMESPACE_HEADER = "x-gpucache-namespace"
ANONYMOUS = "anonymous"
# a namespace names a folder of entries, not free text: letters, digits and a few separators,
# so it cannot carry the "/" that joins the parts of a scope, or control characters into logs
NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9._:@+-]{1,128}")


@dataclass(frozen=True)
class Refusal:
    """A request the tenancy rules refuse: the HTTP status and what to tell the client."""

    status: int
    message: str
    code: str


@dataclass(frozen=True)
class Identity:
    """Whose a request is: ``scope``, the prefix its entries are filed under; ``holder``, whose
    credentials it carries ("key:<hash>" of every credential sent, or "anonymous"): what is
    checked (auth.py) and what ``/admin/revoke`` purges, every scope under it; ``values``, the
    credentials as sent (checked against an operator's key file, never stored)."""

    scope: str
    holder: str
    values: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class Tenancy:
    """How a request's tenant is found (see the module's docstring)."""

    secret: bytes
    credential_headers: tuple[str, ...] = CREDENTIAL_HEADERS
    namespace_header: str = NAMESPACE_HEADER
    trust_namespace_header: bool = False
    require_auth: bool = True
    credential_params: tuple[str, ...] = CREDENTIAL_PARAMS

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise ValueError("the tenancy secret must be at least 16 bytes")
        if not self.credential_headers:
            raise ValueError("at least one credential header is needed")
        object.__setattr__(self, "credential_headers", tuple(h.lower() for h in self.credential_headers))
        object.__setattr__(self, "namespace_header", self.namespace_header.lower())

    def tenant(self, headers: Mapping[str, str], query: str = "") -> str | Refusal:
        """The scope prefix a request's entries are filed under (``identify``), or why it is
        refused."""
        found = self.identify(headers, query)
        return found if isinstance(found, Refusal) else found.scope

    def identify(self, headers: Mapping[str, str], query: str = "") -> Identity | Refusal:
        """Whose a request is, from its headers and raw query string alone (so it is known
        before the body is read), or why it is refused: a malformed or repeated namespace, a
        repeated credential, a credential in a header that does not name the tenant (400); no
        credentials where they are required (401)."""
        for name in (self.namespace_header, *self.credential_headers):
            if len(_values(headers, name)) > 1:
                return Refusal(400, f"more than one {name} header: send it once", "duplicate_header")
        params = parse_qsl(query, keep_blank_values=True) if query else []
        for name in self.credential_params:
            if sum(k == name for k, _ in params) > 1:
                return Refusal(
                    400, f"more than one {name!r} query parameter: send it once", "duplicate_parameter"
                )
        for name, _ in params:
            if name not in self.credential_params and credential_like(name.lower()):
                return Refusal(
                    400,
                    f"the {name!r} query parameter carries a credential this proxy does not name "
                    "tenants by; send the key in one of "
                    + ", ".join(self.credential_headers)
                    + f", or list {name!r} among the credential parameters",
                    "unhashed_credential",
                )
        for name in map(str.lower, headers.keys()):
            if name not in self.credential_headers and credential_like(name):
                return Refusal(
                    400,
                    f"the {name} header carries a credential this proxy does not name "
                    "tenants by; send the key in one of "
                    + ", ".join(self.credential_headers)
                    + f", or list {name} among the credential headers",
                    "unhashed_credential",
                )
        named = headers.get(self.namespace_header)
        if named is not None and not NAMESPACE_PATTERN.fullmatch(named):
            return Refusal(
                400,
                f"the {self.namespace_header} header must be 1 to 128 letters, digits or . _ : @ + -",
                "invalid_namespace",
            )
        credentials = [(name, headers[name]) for name in self.credential_headers if headers.get(name)]
        credentials += [(f"?{k}", v) for k, v in params if k in self.credential_params and v]
        holder = "key:" + self.digest(credentials) if credentials else ANONYMOUS
        values = tuple(v for _, v in credentials)
        if self.trust_namespace_header and named:
            return Identity(self._with_query(f"ns:{named}", query), holder, values)
        if not credentials and self.require_auth:
            return Refusal(
                401,
                "credentials are required: send one of " + ", ".join(self.credential_headers),
                "missing_credentials",
            )
        scope = f"{holder}/ns:{named}" if named else holder
        return Identity(self._with_query(scope, query), holder, values)

    def checked(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The headers a credential check sends the upstream (auth.py): the credential headers
        the holder is hashed from, and no other. A check sent every header it forwards once: a
        revoked key beside a valid one in a cookie was allowed, and the verdict filed under the
        revoked key's holder served its entries. (The query string goes whole: ``identify``
        refuses a credential-like parameter the holder is not hashed from, and an upstream may
        need the rest, Azure's ``api-version``.)"""
        return {name: headers[name] for name in self.credential_headers if headers.get(name)}

    def _with_query(self, scope: str, query: str) -> str:
        """The scope narrowed by the raw query string (keyed-hashed: it may hold a key)."""
        return f"{scope}/q:{self.digest([('?', query)])}" if query else scope

    def digest(self, credentials: list[tuple[str, str]]) -> str:
        """A keyed hash of (header, value) pairs: the same on every replica sharing the secret,
        useless to anyone without it. Length-prefixed, so no two lists encode alike."""
        mac = hmac.new(self.secret, digestmod=hashlib.blake2b)
        for name, value in credentials:
            for part in (name.encode(), value.encode("utf-8", "surrogatepass")):
                mac.update(len(part).to_bytes(8, "big"))
                mac.update(part)
        return mac.hexdigest()[:32]


def _values(headers: Mapping[str, str] | Any, name: str) -> list[str]:
    """Every value of header ``name`` (Starlette's ``getlist``; one at most for a mapping)."""
    if hasattr(headers, "getlist"):
        return list(headers.getlist(name))
    value = headers.get(name)
    return [] if value is None else [value]
