"""The admin endpoints of ``gpucache serve``, behind the admin token:

    POST /admin/invalidate   one request's entry          {kind, request, credentials, namespace}
    POST /admin/clear        one request's scope, or all  {... as above} | {"all": true}
    POST /admin/revoke       every scope of a credential  {credentials, query} or {key}
    POST /admin/snapshot     save the snapshot now
    GET  /admin/stats        the cache's counters (and replication's)

One dependency checks the token for all of them (``require_admin``: 404 where the endpoints are
off, 401 without the token, before a body is read), and one reads a body (``admin_doc``); what
each call names is read into a typed value (``Target``, ``Holder``) or refused with a 400 that
says which field is wrong. A refusal is raised as ``AdminRefusal`` and answered by the app's one
handler for it, so no route builds a refusal of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
from dataclasses import dataclass
from typing import Annotated, Any

from gpucache.conversation.value import Prompt
from gpucache.extras import missing

try:
    from fastapi import APIRouter, Depends, Request
    from starlette.responses import JSONResponse, Response
except ImportError as exc:  # the serve extra
    raise missing("serve", __name__, exc) from exc

from gpucache.cache.snapshot import SnapshotError
from gpucache.serve.answers import error
from gpucache.serve.keying import BadRequest, parse_json, request_key
from gpucache.serve.settings import ServeSettings
from gpucache.serve.tenancy import ANONYMOUS, Refusal

log = logging.getLogger("gpucache.serve")


class AdminRefusal(Exception):
    """An admin call refused; ``response`` is the answer (app.py registers the handler)."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def refused(message: str, code: str | None = None, param: str | None = None) -> AdminRefusal:
    """A 400 for a call whose body names what it cannot (``param``: the field)."""
    return AdminRefusal(error(400, message, "invalid_request_error", code, param, retry=False))


def admitted(config: ServeSettings, request: Request) -> Response | None:
    """None for a request with the admin token (``Bearer``, in any case: RFC 9110 §11.1); else
    its refusal (404 where the endpoints are off, 401). Compared in constant time."""
    token = config.admin_token
    scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
    given = given.strip() if scheme.lower() == "bearer" else ""
    if token is None:
        return error(404, "the admin endpoints are off: start with --admin-token", "invalid_request_error")
    if not hmac.compare_digest(given.encode(), token.encode()):
        return error(401, "a valid admin token is required", "invalid_request_error", "unauthorized")
    return None


def require_admin(request: Request) -> None:
    answer = admitted(request.app.state.config, request)
    if answer is not None:
        raise AdminRefusal(answer)


async def admin_doc(request: Request) -> dict[str, Any]:
    """The call's JSON object (an empty body is ``{}``), read once the token is checked (the
    router's dependency, solved before a route's own)."""
    try:
        doc = parse_json(await request.body() or b"{}")
    except BadRequest as exc:
        raise refused(str(exc)) from None
    if not isinstance(doc, dict):
        raise refused("the body must be a JSON object")
    return doc


def _credentials(doc: dict[str, Any]) -> dict[str, str]:
    credentials = doc.get("credentials") or {}
    if not isinstance(credentials, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in credentials.items()
    ):
        raise refused("'credentials' must map header names to strings", param="credentials")
    return {k.lower(): v for k, v in credentials.items()}


@dataclass(frozen=True)
class Target:
    """The completion request an admin call names, as the proxy files it: its scope and the
    prompt the cache files it under (None for a request the cache would bypass)."""

    scope: str
    prompt: Prompt | None

    @classmethod
    def of(cls, doc: dict[str, Any], config: ServeSettings) -> Target:
        """From ``kind`` ("chat" or "completions"), ``request`` (the body), and the tenant as
        the proxy finds it for a request with ``credentials`` (header name to value, as the
        tenant sends them) and ``namespace`` (the namespace header's value)."""
        kind, named = doc.get("kind", "chat"), doc.get("namespace")
        if kind not in ("chat", "completions"):
            raise refused("'kind' must be 'chat' or 'completions'", param="kind")
        headers = _credentials(doc)
        if named is not None and not isinstance(named, str):
            raise refused("'namespace' must be a string", param="namespace")
        if named:
            headers[config.tenancy.namespace_header] = named
        tenant = config.tenancy.tenant(headers)
        if isinstance(tenant, Refusal):
            raise refused(tenant.message, tenant.code)
        try:
            key = request_key(kind, doc.get("request"), tenant)
        except BadRequest as exc:
            raise refused(str(exc), param=exc.param) from None
        return cls(key.scope, None if key.text is None else key.prompt)


# "Authorization" carries a key after its scheme; clients write the scheme either way
_AUTHORIZATION_FORMS = ("Bearer {}", "bearer {}", "{}")


@dataclass(frozen=True)
class Holder:
    """Whose credential an admin call names: every scope filed under it, in every namespace
    and query string (``tenancy.Identity.holder``). Named by ``credentials`` as the client sends
    them (one holder), or by a bare ``key``: then every form a client can send it in, each
    credential header (``Authorization`` with or without its scheme) and each credential query
    parameter alone, is a holder of its own, and all of them go."""

    holders: tuple[str, ...]

    @classmethod
    def of(cls, doc: dict[str, Any], config: ServeSettings) -> Holder:
        if "key" in doc:
            if "credentials" in doc or "query" in doc:  # which of them was meant is not ours to guess
                raise refused("name the credential once: 'key', or 'credentials' (and 'query')", param="key")
            return cls.of_key(doc["key"], config)
        query = doc.get("query", "")
        if not isinstance(doc.get("credentials"), dict) or not isinstance(query, str):
            raise refused(
                "'credentials' must map header names to strings, 'query' be a string", param="credentials"
            )
        headers = {k: v for k, v in _credentials(doc).items() if k != config.namespace_header}
        identity = dataclasses.replace(config.tenancy, trust_namespace_header=False).identify(headers, query)
        if isinstance(identity, Refusal) or identity.holder == ANONYMOUS:
            raise refused(
                "name the credentials to revoke: no credential was found in them", param="credentials"
            )
        return cls((identity.holder,))

    @classmethod
    def of_key(cls, key: object, config: ServeSettings) -> Holder:
        if not isinstance(key, str) or not key.strip():
            raise refused("'key' must be the credential's value, a non-empty string", param="key")
        tenancy = config.tenancy
        forms = [
            (name, form.format(key))
            for name in tenancy.credential_headers
            for form in (_AUTHORIZATION_FORMS if name == "authorization" else ("{}",))
        ]
        forms += [(f"?{name}", key) for name in tenancy.credential_params]
        return cls(tuple(dict.fromkeys("key:" + tenancy.digest([form]) for form in forms)))


# every route under /admin checks the token before anything else (its body is not read before):
# once, here, so a route added later is closed without its author remembering
router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])
AdminDoc = Annotated[dict[str, Any], Depends(admin_doc)]


@router.post("/invalidate")
async def invalidate(request: Request, doc: AdminDoc) -> Response:
    target = Target.of(doc, request.app.state.config)
    removed = target.prompt is not None and await asyncio.to_thread(
        request.app.state.proxy.cache.invalidate, target.prompt, scope=target.scope
    )
    return JSONResponse({"removed": bool(removed)})


@router.post("/clear")
async def clear(request: Request, doc: AdminDoc) -> Response:
    cache = request.app.state.proxy.cache
    if doc.get("all") is True:
        await asyncio.to_thread(cache.clear)
        return JSONResponse({"cleared": "all"})
    target = Target.of(doc, request.app.state.config)
    await asyncio.to_thread(cache.clear, target.scope)
    return JSONResponse({"cleared": target.scope})


@router.post("/revoke")
async def revoke(request: Request, doc: AdminDoc) -> Response:
    """Everything one credential's requests were filed under, dropped at once, with the
    credential's verdict: a leaked key that is revoked upstream keeps nothing to probe, and
    its next request is checked again. Body: ``credentials`` (header name to value, as the
    client sends them) and optionally ``query`` (its query string, where the key rides
    there); or ``key``, the bare value, for every header and parameter form of it (``Holder``).
    Every scope under the credential goes: each namespace, each query string."""
    holders = Holder.of(doc, request.app.state.config).holders
    proxy = request.app.state.proxy
    removed = 0
    for holder in holders:
        removed += await asyncio.to_thread(proxy.cache.clear_under, holder)
        proxy.intake.forget(holder)
    log.info("gpucache: revoked a credential (%s): %d entries removed", ", ".join(holders), removed)
    named = holders[0] if "key" not in doc else list(holders)
    return JSONResponse({"revoked": named, "removed": removed})


@router.post("/snapshot")
async def snapshot(request: Request) -> Response:
    config: ServeSettings = request.app.state.config
    if not config.snapshot:
        return error(409, "no snapshot path: start with --snapshot PATH", "invalid_request_error")
    try:
        await asyncio.to_thread(request.app.state.proxy.cache.save, config.snapshot, key=config.snapshot_key)
    except (OSError, SnapshotError) as exc:
        return error(500, f"the snapshot could not be saved: {exc}", "api_error")
    return JSONResponse({"saved": config.snapshot})


@router.get("/stats")
async def stats(request: Request) -> Response:
    cache = request.app.state.proxy.cache
    s = await asyncio.to_thread(cache.stats)
    doc: dict[str, Any] = dataclasses.asdict(s)
    doc["hit_rate"] = s.hit_rate
    share = getattr(cache.shared, "stats", None)
    if share is not None:  # replication's counters: replays and forgeries refused among them
        doc["replication"] = dataclasses.asdict(share)
    return JSONResponse(doc)
