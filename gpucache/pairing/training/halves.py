"""The split of every labelled file into a tuning half and a report half.

Every data file is split in two by a keyed hash of each row's id: rules, word lists, defaults and
the pair model's training are fitted on the "tune" half, and reports quote the "report" half, so
no figure they give was fitted to the rows it is measured on. The key is fixed: the same row
falls in the same half on every machine and in every run, and a new row in a file moves no
other. It lives in the package because the pair model's training (pairs.py) reads it; the
benchmarks import it from here.
"""

from __future__ import annotations

import hashlib

SPLIT_KEY = b"gpucache/false-hit-split/1"
HALVES = ("tune", "report", "all")


def half_of(row_id: str) -> str:
    """ "tune" or "report": the half a row with this id belongs to."""
    digest = hashlib.blake2b(row_id.encode("utf-8"), key=SPLIT_KEY, digest_size=8).digest()
    return "tune" if digest[0] & 1 == 0 else "report"
