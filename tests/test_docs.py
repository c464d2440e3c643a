"""The documentation: a front page a newcomer can read, a site that builds strictly (no broken
link, no page left out of the nav), a settings page generated from the settings tree, and no
command in the docs that does not exist."""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpucache.cli import build_parser
from gpucache.serve.sources import settings_reference

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))


def test_the_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "serving" / "index.html").exists()


def test_the_settings_page_is_the_settings_tree():
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert page == settings_reference(), "regenerate: python3 -m gpucache.serve.sources > docs/settings.md"


def _code(text: str) -> str:
    """The text of a page's code: its fenced blocks and inline code spans."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    return "\n".join(blocks + re.findall(r"`([^`\n]+)`", text))


def _shown() -> str:
    return "\n".join(_code(p.read_text(encoding="utf-8")) for p in [ROOT / "README.md", *PAGES])


def test_every_gpucache_command_shown_exists():
    subcommands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    # a command: a code line or span that starts with it (or follows "&&")
    shown = set(re.findall(r"(?:^\s*|&& )(?:python3? -m )?gpucache ([a-z][a-z-]*)", _shown(), flags=re.M))
    assert shown and shown <= subcommands, shown - subcommands


def test_every_script_shown_exists_and_answers_help():
    scripts = sorted(set(re.findall(r"\b((?:bench|scripts|examples)/[\w-]+\.(?:py|sh))\b", _shown())))
    missing = [s for s in scripts if not (ROOT / s).exists()]
    assert scripts and missing == []
    benches = [s for s in scripts if s.startswith("bench/") and s.endswith(".py")]
    # two at a time: each is mostly the interpreter importing torch
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = pool.map(
            lambda script: subprocess.run(
                [sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
            ),
            benches,
        )
        for script, ran in zip(benches, runs):
            assert ran.returncode == 0 and "usage" in ran.stdout.lower(), (script, ran.stderr[-500:])
