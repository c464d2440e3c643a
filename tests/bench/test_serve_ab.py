"""bench/serve_ab.py runs another revision's proxy from that revision's own package: what it
extracts is the revision's tree, not this checkout's."""

from __future__ import annotations

import subprocess

import serve_ab


def test_the_other_revision_is_its_own_package_in_a_folder_of_its_own(tmp_path):
    commit = serve_ab.extracted("HEAD~1", tmp_path)
    expected = subprocess.run(
        ["git", "rev-parse", "HEAD~1"], cwd=serve_ab.ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    assert commit == expected
    shown = subprocess.run(
        ["git", "show", f"{commit}:gpucache/serve/proxy.py"],
        cwd=serve_ab.ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert (tmp_path / "gpucache" / "serve" / "proxy.py").read_text(encoding="utf-8") == shown
    assert not (tmp_path / "tests").exists()  # the package only
