"""``gpucache serve``'s settings: one tree (``ServeConfig`` holding ``CacheSettings``), every
cache setting a flag generated from the dataclass, the server's own defaults where they differ,
and a snapshot restored with the server's settings, not the file's."""

from __future__ import annotations

import dataclasses

import pytest

from gpucache.cache.settings import CacheSettings
from gpucache.cli import build_parser, serve_config
from gpucache.serve.config import SERVE_CACHE_DEFAULTS, ConfigError


def config_of(*flags):
    return serve_config(build_parser().parse_args(["serve", "--upstream", "http://127.0.0.1:1/v1", *flags]))


def test_every_cache_setting_is_a_flag_and_no_setting_has_two_names(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = capsys.readouterr().out
    for f in dataclasses.fields(CacheSettings):
        assert f"--{f.name.replace('_', '-')}" in help_text, f.name
    for gone in ("--lookup-window-ms", "--lookup-timeout ", "--max-ttl"):
        assert gone not in help_text
    assert "(default 0.002)" in help_text  # the server's own defaults are the ones stated


def test_flags_reach_the_cache_settings_and_the_rest_keep_the_servers_defaults():
    config = config_of("--threshold", "0.9", "--top-k", "2", "--ttl", "3600", "--quantization", "fp32",
                       "--capacity", "5000", "--max-device-bytes", "1000000", "--device", "cpu")
    assert (config.cache.threshold, config.cache.top_k, config.cache.ttl) == (0.9, 2, 3600.0)
    assert (config.cache.quantization, config.cache.capacity, config.cache.max_device_bytes) == ("fp32", 5000, 10**6)
    assert config.device == "cpu" and config.model is None
    # a server's own defaults: batched lookups, bounded
    assert config.cache.lookup_window_seconds == SERVE_CACHE_DEFAULTS.lookup_window_seconds == 0.002
    assert config_of("--lookup-timeout-seconds", "none").cache.lookup_timeout_seconds is None


@pytest.mark.parametrize("flags", [["--threshold", "1.5"], ["--ttl", "1e16"], ["--top-k", "0"],
                                   ["--quantization", "int4"]])
def test_a_setting_out_of_range_is_refused_with_its_reason(flags):
    with pytest.raises((ValueError, TypeError, ConfigError)):
        config_of(*flags)


def test_a_snapshot_is_restored_with_the_servers_settings(tmp_path, real_embedder):
    """The file saved capacity 100,000 and threshold 0.875; the server says otherwise, and
    the server wins: every setting reaches the restored cache."""
    pytest.importorskip("fastapi")
    from serving import Served, make_upstream

    from gpucache import SemanticCache
    from gpucache.serve.app import create_app
    from gpucache.serve.config import ServeConfig

    path = tmp_path / "c.gpucache"
    settings = dataclasses.replace(SERVE_CACHE_DEFAULTS, capacity=777, threshold=0.91, quantization="fp32")
    with Served(make_upstream()) as upstream:
        config = ServeConfig(upstream=f"{upstream.url}/v1", snapshot=str(path), cache=settings, device="cpu",
                             namespace_secret=b"a-secret-for-the-config-test")
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
