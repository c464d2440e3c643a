"""CacheSettings: one frozen object that the constructor, snapshots, ``gpucache info`` and the
README all read, so a setting is added in one place."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from gpucache import CacheSettings, SemanticCache, StoreEverything, ThresholdOnly

# A value other than the default for every setting. A new setting fails
# test_every_setting_has_a_non_default_value_here until it is added here too.
NON_DEFAULT = {
    "threshold": 0.9,
    "top_k": 3,
    "capacity": 500,
    "max_text_bytes": 2**20,
    "tenant_capacity": 50,
    "fair_share": True,
    "ttl": 60.0,
    "replay_chunk_chars": 7,
    "quantization": "int8",
    "max_device_bytes": 404 * 1000,
    "scan_budget_bytes": 2**20,
    "lookup_window_seconds": 0.002,
    "lookup_batch": 8,
    "lookup_timeout_seconds": 0.5,
    "scan_kernel": "torch",
    "match_context": True,
}
# the machine's and the server's speed choices: a snapshot leaves them out
NOT_SAVED = {
    "scan_kernel",
    "lookup_window_seconds",
    "lookup_batch",
    "lookup_timeout_seconds",
    "match_context",
}


def test_every_setting_has_a_non_default_value_here():
    assert set(NON_DEFAULT) == set(CacheSettings.names())
    defaults = CacheSettings()
    for name, value in NON_DEFAULT.items():
        assert getattr(defaults, name) != value, name


def test_a_snapshot_round_trips_every_saved_setting(fake_embedder, tmp_path):
    settings = CacheSettings(**NON_DEFAULT)
    cache = SemanticCache(
        fake_embedder,
        device="cpu",
        verifier=ThresholdOnly(),
        cache_policy=StoreEverything(),
        settings=settings,
    )
    assert cache.settings == settings
    cache.put("a stored prompt", "its answer")
    cache.save(tmp_path / "c.gpucache")
    loaded = SemanticCache.load(tmp_path / "c.gpucache", embedder=fake_embedder, device="cpu")
    saved = {f.name for f in dataclasses.fields(CacheSettings) if f.metadata["saved"]}
    assert saved == set(NON_DEFAULT) - NOT_SAVED
    for name in saved:
        assert getattr(loaded.settings, name) == getattr(settings, name), name
    for name in NOT_SAVED:
        assert getattr(loaded.settings, name) == getattr(CacheSettings(), name), name
    assert loaded.get("a stored prompt").response == "its answer"


def test_options_by_name_replace_those_of_a_settings_object(fake_embedder):
    cache = SemanticCache(fake_embedder, device="cpu", settings=CacheSettings(top_k=3), ttl=5)
    assert (cache.settings.top_k, cache.settings.ttl, cache.ttl) == (3, 5.0, 5.0)


def test_an_unknown_setting_names_the_known_ones(fake_embedder):
    with pytest.raises(TypeError, match=r"'thresold'.*settings are: threshold, top_k"):
        SemanticCache(fake_embedder, device="cpu", thresold=0.9)
    with pytest.raises(TypeError, match="CacheSettings"):
        SemanticCache(fake_embedder, device="cpu", settings={"top_k": 2})


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("threshold", 0.0, ValueError),
        ("threshold", "0.9", TypeError),
        ("top_k", 0, ValueError),
        ("capacity", 2.5, TypeError),
        ("ttl", -1, ValueError),
        ("replay_chunk_chars", 0, ValueError),
        ("quantization", "fp8", ValueError),
        ("max_device_bytes", 0, ValueError),
        ("scan_budget_bytes", True, TypeError),
        ("scan_kernel", "fastest", ValueError),
        ("lookup_window_seconds", -0.1, ValueError),
        ("lookup_batch", 0, ValueError),
        ("lookup_timeout_seconds", 0, ValueError),
    ],
)
def test_bad_values_are_refused_by_name(name, value, error):
    with pytest.raises(error, match=name):
        CacheSettings(**{name: value})


def test_a_snapshot_with_a_setting_this_version_does_not_know_is_refused():
    with pytest.raises(ValueError, match="unknown saved setting"):
        CacheSettings.from_json({"threshold": 0.9, "shiny_new_setting": 1})
    assert CacheSettings.from_json({"top_k": 2}) == CacheSettings(top_k=2)  # an older snapshot


def test_the_library_settings_table_is_the_settings():
    page = (Path(__file__).resolve().parents[2] / "docs" / "library-settings.md").read_text(encoding="utf-8")
    for row in CacheSettings.markdown_rows():
        assert row in page, row


def test_info_shows_every_setting():
    out = subprocess.run(
        [sys.executable, "-m", "gpucache", "info"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    line = next(row for row in out.splitlines() if row.startswith("settings"))
    for name, value in CacheSettings().items():
        assert f"{name}={value!r}" in line


def test_settings_files_are_read_without_an_extra_on_every_python_the_package_supports():
    """Python 3.10 has no ``tomllib``: there ``read_toml`` takes ``tomli``, which is a core
    dependency for that Python (not only the serve extra's), so ``SemanticCache.from_config``
    works as the README's first command installs the package."""
    from gpucache.cache.settings import read_toml

    project = read_toml(Path(__file__).resolve().parents[2] / "pyproject.toml")["project"]
    assert project["requires-python"] == ">=3.10"
    assert "tomli>=2.0; python_version < '3.11'" in project["dependencies"]
    assert not any(d.startswith("tomli") for d in project["optional-dependencies"]["serve"])
