"""``gpucache serve``'s settings: one tree (``ServeSettings`` holding ``CacheSettings``,
``EmbedderSettings`` and ``ReplicationSettings``), every setting a flag, a ``GPUCACHE_*``
variable and a settings-file key generated from its field, layered defaults < file <
environment < flags, and a snapshot restored with the server's settings, not the file's."""

from __future__ import annotations

import dataclasses

import pytest

from gpucache.cache.settings import CacheSettings
from gpucache.cli import build_parser, main, serve_config
from gpucache.embedding.settings import EmbedderSettings
from gpucache.serve.settings import SERVE_CACHE_DEFAULTS, ConfigError, ServeSettings
from gpucache.serve.sources import options, resolve
from gpucache.share.settings import ReplicationSettings

UPSTREAM = "http://127.0.0.1:1/v1"


def config_of(*flags):
    return serve_config(build_parser().parse_args(["serve", "--upstream", UPSTREAM, *flags]))


def flags(*given):
    return build_parser().parse_args(["serve", *given])


def test_every_setting_is_a_flag_and_no_setting_has_two_names(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = capsys.readouterr().out
    for section in (CacheSettings, EmbedderSettings, ReplicationSettings):
        for f in dataclasses.fields(section):
            assert f"--{f.name.replace('_', '-')}" in help_text, f.name
    for f in dataclasses.fields(ServeSettings):
        if f.metadata.get("flag"):
            assert f"--{f.name.replace('_', '-').rstrip('s')}" in help_text, f.name
    assert "--namespace-secret" not in help_text  # a secret on argv is visible to every local user
    for gone in ("--lookup-window-ms", "--lookup-timeout ", "--max-ttl"):
        assert gone not in help_text
    assert "(default 0.002)" in help_text  # the server's own defaults are the ones stated
    names = [o.name for o in options()]
    assert len(names) == len(set(names))


def test_flags_reach_every_section_and_the_rest_keep_the_servers_defaults():
    config = config_of(
        "--threshold",
        "0.9",
        "--top-k",
        "2",
        "--ttl",
        "3600",
        "--quantization",
        "fp32",
        "--capacity",
        "5000",
        "--max-device-bytes",
        "1000000",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--port",
        "9000",
        "--max-concurrency",
        "8",
        "--require-auth",
        "--credential-header",
        "x-key",
        "--credential-header",
        "x-org",
    )
    assert (config.cache.threshold, config.cache.top_k, config.cache.ttl) == (0.9, 2, 3600.0)
    assert (config.cache.quantization, config.cache.capacity, config.cache.max_device_bytes) == (
        "fp32",
        5000,
        10**6,
    )
    assert config.embedder == EmbedderSettings(model=None, device="cpu", dtype="fp32")
    assert (config.port, config.max_concurrency, config.require_auth) == (9000, 8, True)
    assert config.credential_headers == ("x-key", "x-org")
    # a server's own defaults: batched lookups, bounded
    assert config.cache.lookup_window_seconds == SERVE_CACHE_DEFAULTS.lookup_window_seconds == 0.002
    assert config_of("--lookup-timeout-seconds", "none").cache.lookup_timeout_seconds is None


@pytest.mark.parametrize(
    "given",
    [
        ["--threshold", "1.5"],
        ["--ttl", "1e16"],
        ["--top-k", "0"],
        ["--quantization", "int4"],
        ["--port", "70000"],
        ["--port", "eighty"],
        ["--max-concurrency", "0"],
        ["--dtype", "int8"],
        ["--redis", "http://not-redis"],
    ],
)
def test_a_setting_out_of_range_is_refused_with_its_reason(given):
    with pytest.raises((ValueError, TypeError, ConfigError)):
        config_of(*given)


def test_the_layers_stack_defaults_file_environment_flags(tmp_path):
    path = tmp_path / "gpucache.toml"
    path.write_text(
        f'upstream = "{UPSTREAM}"\nport = 9001\nmax_concurrency = 32\n'
        '[cache]\nthreshold = 0.9\ntop_k = 3\n[embedder]\ndevice = "cpu"\n'
    )
    env = {"GPUCACHE_PORT": "9002", "GPUCACHE_TOP_K": "4", "GPUCACHE_REQUIRE_AUTH": "true"}
    resolved = resolve(flags("--top-k", "5"), env, str(path))
    config = resolved.settings()
    assert config.upstream == UPSTREAM and config.max_concurrency == 32  # the file's
    assert config.port == 9002 and config.require_auth  # the environment over the file
    assert config.cache.top_k == 5  # the flag over both
    assert config.cache.threshold == 0.9 and config.embedder.device == "cpu"
    assert config.cache.capacity == SERVE_CACHE_DEFAULTS.capacity  # nobody set it
    assert resolved.sources["cache.top_k"] == "flag --top-k"
    assert resolved.sources["port"] == "env GPUCACHE_PORT"
    assert resolved.sources["cache.threshold"] == f"file {path}"
    assert resolved.sources["cache.capacity"] == "default"
    # the file may also be named by the environment
    assert resolve(None, {"GPUCACHE_CONFIG": str(path)}).settings().port == 9001


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("thresold = 0.9\n", "unknown setting 'thresold'"),
        ("[cache]\nthreshhold = 0.9\n", "unknown setting 'cache.threshhold'"),
        ('namespace_secret = "in the file"\n', "secret_file or the environment"),
        ("port = \n", "not valid TOML"),
    ],
)
def test_a_settings_file_with_an_unknown_or_broken_key_is_refused_by_name(tmp_path, text, complaint):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=complaint):
        resolve(None, {}, str(path))


def test_settings_file_values_of_the_wrong_type_name_the_setting(tmp_path):
    path = tmp_path / "typed.toml"
    path.write_text(f'upstream = "{UPSTREAM}"\nport = "eighty"\n')
    with pytest.raises(ConfigError, match="port must be int"):
        resolve(None, {}, str(path)).settings()
    path.write_text(f'upstream = "{UPSTREAM}"\n[cache]\ntop_k = true\n')
    with pytest.raises(ConfigError, match="top_k"):
        resolve(None, {}, str(path)).settings()


def test_a_misspelt_environment_variable_is_refused_and_others_are_left_alone():
    with pytest.raises(ConfigError, match="GPUCACHE_THRESHHOLD"):
        resolve(None, {"GPUCACHE_THRESHHOLD": "0.9", "GPUCACHE_UPSTREAM": UPSTREAM})
    config = resolve(
        None, {"GPUCACHE_UPSTREAM": UPSTREAM, "GPUCACHE_MODEL_DIR": "/x", "HOME": "/h"}
    ).settings()
    assert config.embedder.model is None


def test_no_upstream_anywhere_says_where_to_give_one():
    with pytest.raises(ConfigError, match="GPUCACHE_UPSTREAM"):
        resolve(flags(), {}).settings()


def test_info_prints_the_resolved_settings_and_hides_secrets(tmp_path, capsys, monkeypatch):
    path = tmp_path / "gpucache.toml"
    path.write_text(f'upstream = "{UPSTREAM}"\n[cache]\nthreshold = 0.91\n')
    monkeypatch.setenv("GPUCACHE_NAMESPACE_SECRET", "a-secret-nobody-may-print")
    monkeypatch.setenv("GPUCACHE_PORT", "9003")
    assert main(["info", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"cache.threshold = 0.91  (file {path})" in out
    assert "port = 9003  (env GPUCACHE_PORT)" in out
    assert "namespace_secret = (set)  (env GPUCACHE_NAMESPACE_SECRET)" in out
    assert "a-secret-nobody-may-print" not in out


def test_a_settings_trees_repr_shows_no_secret():
    secrets = {
        "namespace_secret": b"namespace-secret-0123456789",
        "admin_token": "admin-token-0123456789",
        "gateway_token": "gateway-token-0123456789",
    }
    shown = repr(ServeSettings(upstream=UPSTREAM, **secrets))  # a settings tree printed or logged
    assert "port=8100" in shown
    for name, value in secrets.items():
        assert f"{name}=" not in shown
        assert (value.decode() if isinstance(value, bytes) else value) not in shown


def test_a_redis_urls_password_is_shown_by_no_setting(capsys, monkeypatch):
    url = "redis://:hunter2-secret@127.0.0.1:6379/0"
    monkeypatch.setenv("GPUCACHE_REDIS", url)
    monkeypatch.setenv("GPUCACHE_UPSTREAM", UPSTREAM)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "replication.redis = 'redis://:***@127.0.0.1:6379/0'  (env GPUCACHE_REDIS)" in out
    assert "hunter2-secret" not in repr(
        ServeSettings(upstream=UPSTREAM, replication=ReplicationSettings(url))
    )
    with pytest.raises(ValueError, match=r"'http://:\*\*\*@h'") as refused:
        ReplicationSettings("http://:hunter2-secret@h")
    assert "hunter2-secret" not in out + str(refused.value)


def test_a_cache_factory_beside_a_redis_url_is_refused():
    pytest.importorskip("fastapi")
    from gpucache.serve.app import create_app

    config = ServeSettings(
        upstream=UPSTREAM,
        namespace_secret=b"a-secret-for-the-config-test",
        replication=ReplicationSettings(redis="redis://127.0.0.1:1/0"),
    )
    with pytest.raises(ConfigError, match="cache_factory"):
        create_app(config, cache_factory=lambda: None)


def test_a_snapshot_is_restored_with_the_servers_settings(tmp_path, real_embedder):
    """The file saved capacity 100,000 and threshold 0.875; the server says otherwise, and
    the server wins: every setting reaches the restored cache."""
    pytest.importorskip("fastapi")
    from serving import Served, make_upstream

    from gpucache import SemanticCache
    from gpucache.serve.app import create_app
    from gpucache.serve.settings import ServeSettings

    path = tmp_path / "c.gpucache"
    settings = dataclasses.replace(SERVE_CACHE_DEFAULTS, capacity=777, threshold=0.91, quantization="fp32")
    with Served(make_upstream()) as upstream:
        config = ServeSettings(
            upstream=f"{upstream.url}/v1",
            snapshot=str(path),
            cache=settings,
            embedder=EmbedderSettings(device="cpu"),
            namespace_secret=b"a-secret-for-the-config-test",
        )
        saved = SemanticCache(real_embedder, device="cpu")
        saved.put("A question kept in the snapshot", "kept", scope="somewhere")
        saved.save(path, key=config.snapshot_key)
        with Served(create_app(config)) as served:
            import httpx

            assert httpx.get(f"{served.url}/health", timeout=60).status_code == 200
            cache = served.app.state.proxy.cache
            assert cache.settings == settings and cache.quantization == "fp32"
            assert cache.get("A question kept in the snapshot", scope="somewhere").response == "kept"
        assert not (tmp_path / "c.gpucache.corrupt").exists()


def test_a_snapshot_is_restored_into_the_factorys_cache_and_nothing_is_left_open(tmp_path, real_embedder):
    """A factory's cache carries what the config cannot (here: its own class and cache
    policy); a snapshot beside it is restored into that cache, which is the one served and the
    one closed at shutdown, so no second cache is left running unserved."""
    pytest.importorskip("fastapi")
    import httpx
    from serving import Served, make_upstream

    from gpucache import SemanticCache
    from gpucache.serve.app import create_app
    from gpucache.serve.settings import ServeSettings

    class Kept(SemanticCache):
        closed = 0

        def close(self) -> None:
            Kept.closed += 1
            super().close()

    path = tmp_path / "c.gpucache"
    made: list[Kept] = []
    with Served(make_upstream()) as upstream:
        config = ServeSettings(
            upstream=f"{upstream.url}/v1",
            snapshot=str(path),
            namespace_secret=b"a-secret-for-the-config-test",
        )
        saved = SemanticCache(real_embedder, device="cpu")
        saved.put("A question kept in the snapshot", "kept", scope="somewhere")
        saved.save(path, key=config.snapshot_key)

        def factory() -> Kept:
            made.append(Kept(real_embedder, device="cpu", capacity=555))
            return made[-1]

        with Served(create_app(config, cache_factory=factory)) as served:
            assert httpx.get(f"{served.url}/health", timeout=60).status_code == 200
            cache = served.app.state.proxy.cache
            assert cache is made[0] and cache.settings.capacity == 555
            assert cache.get("A question kept in the snapshot", scope="somewhere").response == "kept"
        assert len(made) == 1 and Kept.closed == 1
    assert not (tmp_path / "c.gpucache.corrupt").exists()


def test_constructing_settings_reads_nothing_and_resolving_reads_what_they_name(tmp_path, monkeypatch):
    """Settings are values: no file or environment is read until ``resolved()`` (which the
    server calls once at start), and resolved settings resolve to themselves."""
    monkeypatch.setenv("GPUCACHE_NAMESPACE_SECRET", "a-secret-from-the-environment")
    token, keys = tmp_path / "admin-token", tmp_path / "keys"
    token.write_text("an-admin-token-from-its-file\n")
    config = ServeSettings(
        upstream="http://127.0.0.1:9/v1", admin_token_file=str(token), auth="keys", keys_file=str(keys)
    )  # the key file does not exist yet: nothing read
    assert config.admin_token is None and config.namespace_secret is None
    assert config == ServeSettings(
        upstream="http://127.0.0.1:9/v1", admin_token_file=str(token), auth="keys", keys_file=str(keys)
    )
    with pytest.raises(ConfigError, match="cannot be read"):
        config.resolved()  # the server would refuse to start
    keys.write_text("sk-one\n")
    resolved = config.resolved()
    assert resolved.admin_token == "an-admin-token-from-its-file" and resolved.admin_token_file is None
    assert resolved.namespace_secret == b"a-secret-from-the-environment"
    token.unlink()
    monkeypatch.delenv("GPUCACHE_NAMESPACE_SECRET")
    assert resolved.resolved() == resolved  # nothing read again
    with pytest.raises(ConfigError, match="admin token file cannot be read"):
        config.resolved()


def test_every_tunable_of_the_share_is_a_setting_that_reaches_it():
    pytest.importorskip("redis")
    config = config_of(
        "--redis",
        "redis://127.0.0.1:1/0",
        "--redis-stream-maxlen",
        "500",
        "--redis-deadline",
        "0.25",
        "--redis-pending-max",
        "64",
        "--claim-wait",
        "5",
        "--claim-ttl",
        "9",
    )
    share = config.replication.build(b"a-secret-for-the-config-test")  # connects to nothing yet
    try:
        assert (share.link.maxlen, share.link.deadline, share.writer.pending.maxlen) == (500, 0.25, 64)
        assert (share.claim_wait, share.claim_ttl) == (5.0, 9.0)
    finally:
        share.close(flush_timeout=0)
    for bad in (["--redis-pending-max", "0"], ["--claim-wait", "0"], ["--redis-deadline", "-1"]):
        with pytest.raises(ValueError, match="must be"):
            config_of("--redis", "redis://127.0.0.1:1/0", *bad)


def test_every_tunable_of_the_embedder_is_a_setting_that_reaches_it():
    config = config_of(
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--batch-size",
        "8",
        "--max-length",
        "128",
        "--max-batch-tokens",
        "512",
        "--no-lean",
        "--no-cuda-graphs",
    )
    embedder = config.embedder.build()  # the packaged model, on this CPU
    assert (embedder.batch_size, embedder.max_length, embedder.max_batch_tokens) == (8, 128, 512)
    assert not embedder.uses_lean
    for bad in (["--batch-size", "0"], ["--max-length", "1"], ["--max-batch-tokens", "0"]):
        with pytest.raises(ValueError, match="must be an int"):
            config_of(*bad)
