"""Tenancy: the tenant comes from the credentials, never from a header alone; the namespace
header narrows within a tenant; the secret that keys the hash is stable where entries outlive
the process."""

from __future__ import annotations

import os
import stat

import pytest

from gpucache.serve.settings import ConfigError, ServeSettings, read_secret_file
from gpucache.serve.tenancy import ANONYMOUS, Refusal, Tenancy
from gpucache.share.settings import ReplicationSettings

SECRET = b"a-secret-of-sixteen-or-more"
TEAM_A = {"x-gpucache-namespace": "team-a"}


def tenant(headers, **settings):
    """The tenant where keyless requests are let in (``require_auth=False``), unless a test
    says otherwise: the rules of who is whom, apart from whether keyless clients are served."""
    return Tenancy(SECRET, **{"require_auth": False, **settings}).tenant(headers)


def test_the_credentials_name_the_tenant_and_the_header_only_narrows_within_it():
    alice = tenant({"authorization": "Bearer alice"})
    bob = tenant({"authorization": "Bearer bob"})
    assert alice.startswith("key:") and bob.startswith("key:") and alice != bob
    assert "alice" not in alice  # the key itself is never part of a scope
    # the namespace header alone, or beside another key, never reaches alice's team-a
    alice_a = tenant({"authorization": "Bearer alice", **TEAM_A})
    assert alice_a == f"{alice}/ns:team-a"
    assert tenant(TEAM_A) == f"{ANONYMOUS}/ns:team-a" != alice_a
    assert tenant({"authorization": "Bearer bob", **TEAM_A}) == f"{bob}/ns:team-a" != alice_a
    assert tenant({}) == ANONYMOUS


@pytest.mark.parametrize("header", ["api-key", "x-api-key", "authorization"])
def test_every_credential_header_names_its_own_tenants(header):
    one, two = tenant({header: "key-one"}), tenant({header: "key-two"})
    assert one.startswith("key:") and one != two and one != ANONYMOUS
    # the header's name is part of the hash: the same value under another header is another tenant
    other = next(h for h in ("api-key", "x-api-key", "authorization") if h != header)
    assert tenant({other: "key-one"}) != one


def test_several_credentials_are_hashed_together_and_unambiguously():
    both = tenant({"authorization": "a", "api-key": "b"})
    assert both != tenant({"authorization": "a"}) and both != tenant({"api-key": "b"})
    # length-prefixed: moving a character between values changes the tenant
    assert tenant({"authorization": "ab", "api-key": ""}) != tenant({"authorization": "a", "api-key": "b"})


def test_a_configured_header_list_is_the_only_one_read():
    custom = {"credential_headers": ("x-team-key",)}
    assert tenant({"x-team-key": "k"}, **custom).startswith("key:")
    assert tenant({"x-other-header": "k"}, **custom) == ANONYMOUS  # not a credential: ignored


@pytest.mark.parametrize(
    "header",
    [
        "x-goog-api-key",
        "x-litellm-api-key",
        "ocp-apim-subscription-key",
        "apikey",  # Kong's
        "x-portkey-api-key",
        "cf-aig-authorization",  # Cloudflare AI Gateway's
        "helicone-auth",
        "x-amz-security-token",
        "x-client-secret",
        "x-portkey-virtual-key",
        "x-openai-key",
        "x-jwt-assertion",
    ],
)
def test_a_credential_in_a_header_that_does_not_name_the_tenant_is_refused(header):
    """It would reach the upstream and its check without naming the tenant: a revoked key sent
    beside a valid one there would get the valid key's verdict, and its cache."""
    refused = tenant({"authorization": "Bearer sk-valid", header: "sk-revoked"})
    assert isinstance(refused, Refusal) and refused.status == 400 and refused.code == "unhashed_credential"
    assert header in refused.message
    # listed among the credential headers, it names the tenant with the others
    listed = tenant(
        {"authorization": "Bearer sk-valid", header: "sk-revoked"},
        credential_headers=("authorization", header),
    )
    assert listed.startswith("key:") and listed != tenant({"authorization": "Bearer sk-valid"})
    # and the standard headers left off a configured list are refused, not ignored
    assert isinstance(tenant({"authorization": "Bearer alice"}, credential_headers=("x-team-key",)), Refusal)


@pytest.mark.parametrize(
    "header",
    [
        "x-stainless-retry-count",  # what the OpenAI clients send
        "openai-organization",
        "openai-project",
        "idempotency-key",
        "x-idempotency-key",
        "x-request-id",
        "x-gpucache-gateway-token",  # the proxy's own: never forwarded
        "x-tokenizer",  # a word that only starts like one
        "x-author",
        "proxy-authorization",  # hop-by-hop: never forwarded
    ],
)
def test_a_header_whose_name_reads_as_no_credential_passes(header):
    assert tenant({"authorization": "Bearer sk-valid", header: "1"}) == tenant(
        {"authorization": "Bearer sk-valid"}
    )


def test_the_hash_depends_on_the_secret_and_on_nothing_per_process():
    headers = {"authorization": "Bearer alice"}
    assert Tenancy(SECRET).tenant(headers) == Tenancy(SECRET).tenant(headers)
    assert Tenancy(b"another-secret-of-16+").tenant(headers) != Tenancy(SECRET).tenant(headers)


def test_behind_a_trusted_gateway_the_header_alone_names_the_tenant():
    assert tenant(TEAM_A, trust_namespace_header=True) == "ns:team-a"
    assert tenant({"authorization": "Bearer x", **TEAM_A}, trust_namespace_header=True) == "ns:team-a"
    # without the header, the credentials still decide
    assert tenant({"authorization": "Bearer x"}, trust_namespace_header=True).startswith("key:")


def test_a_request_without_credentials_is_refused_unless_the_deployment_opts_in():
    refused = Tenancy(SECRET).tenant(TEAM_A)  # the default
    assert isinstance(refused, Refusal) and refused.status == 401
    assert Tenancy(SECRET).tenant({"x-api-key": "k"}).startswith("key:")
    assert ServeSettings(upstream="http://u/v1").resolved().tenancy.require_auth  # and the server's default
    assert tenant(TEAM_A, require_auth=False) == f"{ANONYMOUS}/ns:team-a"


@pytest.mark.parametrize("name", ["", "a/b", "../x", "x" * 129, "a b", "tab\t", "é"])
def test_a_malformed_namespace_is_a_400(name):
    refused = tenant({"x-gpucache-namespace": name, "authorization": "k"})
    assert isinstance(refused, Refusal) and refused.status == 400


def test_a_short_secret_is_refused():
    with pytest.raises(ValueError, match="16 bytes"):
        Tenancy(b"short")


# ------------------------------------------------------------------------- the secret


def test_a_snapshot_or_redis_without_a_stable_secret_refuses_to_start(monkeypatch):
    monkeypatch.delenv("GPUCACHE_NAMESPACE_SECRET", raising=False)
    for extra in (
        {"snapshot": "c.gpucache"},
        {"replication": ReplicationSettings(redis="redis://127.0.0.1:1")},
    ):
        with pytest.raises(ConfigError, match="stable secret"):
            ServeSettings(upstream="http://127.0.0.1:1/v1", **extra).resolved()
    # alone, a random secret per process is fine: nothing outlives the process
    assert len(ServeSettings(upstream="http://127.0.0.1:1/v1").resolved().namespace_secret) == 32


def test_the_secret_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("GPUCACHE_NAMESPACE_SECRET", "from-the-environment-1")
    config = ServeSettings(upstream="http://127.0.0.1:1/v1", snapshot="c.gpucache")
    assert config.namespace_secret is None  # constructing reads nothing
    assert config.resolved().namespace_secret == b"from-the-environment-1"
    monkeypatch.setenv("GPUCACHE_NAMESPACE_SECRET", "short")
    with pytest.raises(ConfigError, match="16 bytes"):
        ServeSettings(upstream="http://127.0.0.1:1/v1").resolved()


def test_a_secret_file_is_created_0600_beside_the_snapshot_and_read_back(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUCACHE_NAMESPACE_SECRET", raising=False)
    snapshot = str(tmp_path / "c.gpucache")
    settings = ServeSettings(upstream="http://127.0.0.1:1/v1", snapshot=snapshot, create_secret=True)
    path = tmp_path / "c.gpucache.secret"
    assert not path.exists()  # constructing writes nothing
    first = settings.resolved()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert first.resolved() == first  # resolved once: the same secret, no second read
    again = ServeSettings(
        upstream="http://127.0.0.1:1/v1", snapshot=snapshot, secret_file=str(path)
    ).resolved()
    assert first.namespace_secret == again.namespace_secret and len(first.namespace_secret) >= 32


def test_a_secret_file_others_can_read_or_a_missing_one_is_refused(tmp_path):
    path = tmp_path / "secret"
    path.write_text("x" * 40)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        read_secret_file(str(path))
    with pytest.raises(ConfigError, match="cannot be read"):
        read_secret_file(str(tmp_path / "missing"))


def headers_of(*pairs):
    from starlette.datastructures import Headers

    return Headers(raw=[(k.encode(), v.encode()) for k, v in pairs])


@pytest.mark.parametrize("name", ["authorization", "api-key", "x-api-key", "x-gpucache-namespace"])
def test_a_header_the_tenant_comes_from_sent_twice_is_refused(name):
    refused = tenant(headers_of((name, "one"), (name, "two"), ("authorization", "Bearer k")))
    assert isinstance(refused, Refusal) and refused.status == 400 and refused.code == "duplicate_header"
    assert isinstance(tenant(headers_of((name, "one"))), str)


def test_a_credential_in_the_query_string_names_the_tenant_and_sent_twice_is_refused():
    alice = Tenancy(SECRET).tenant({}, "key=alice")
    bob = Tenancy(SECRET).tenant({}, "key=bob")
    assert alice.startswith("key:") and bob.startswith("key:") and alice.split("/")[0] != bob.split("/")[0]
    assert "alice" not in alice
    refused = Tenancy(SECRET).tenant({}, "key=alice&key=bob")
    assert isinstance(refused, Refusal) and refused.code == "duplicate_parameter"
    # a parameter that is no credential narrows the scope and names no tenant
    assert Tenancy(SECRET, require_auth=False).tenant({}, "api-version=1").startswith(f"{ANONYMOUS}/q:")
    assert Tenancy(SECRET).tenant({}, "api-version=1").status == 401


def test_the_raw_query_string_narrows_every_scope_and_never_shows_in_it():
    key = {"authorization": "Bearer alice"}
    plain = tenant(key)
    one, two = Tenancy(SECRET).tenant(key, "api-version=1"), Tenancy(SECRET).tenant(key, "api-version=2")
    assert one.startswith(plain + "/q:") and two.startswith(plain + "/q:") and one != two
    assert "api-version" not in one
    trusted = Tenancy(SECRET, trust_namespace_header=True).tenant(TEAM_A, "a=1")
    assert trusted.startswith("ns:team-a/q:")
