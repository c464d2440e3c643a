"""The scan cell (gpucache/benchmark/scan.py): the recall reference is the true top-k however
the rows are blocked; a cell's engines are the mode's own and FAISS's flat yardstick."""

from __future__ import annotations

import pytest
import torch

from gpucache.benchmark import scan


def test_the_blocked_brute_force_is_the_true_top_k(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    data = torch.nn.functional.normalize(torch.randn(1000, 16, generator=gen), dim=1)
    queries = torch.nn.functional.normalize(torch.randn(7, 16, generator=gen), dim=1)
    truth = (queries.double() @ data.double().T).topk(5, dim=1).indices.tolist()
    for rows in (1000, 64, 3, 1):  # one block, blocks that do not divide N, a row at a time
        monkeypatch.setattr(scan, "BLOCK_ROWS", rows)
        assert scan.brute_force_top_k(data, queries, 5) == truth


def test_a_cell_holds_its_modes_store_and_faiss_beside_it():
    pytest.importorskip("faiss")
    data = torch.nn.functional.normalize(torch.randn(300, 384), dim=1)
    cpu = torch.device("cpu")
    for mode, faiss_modes in (("fp32", ["fp32"]), ("fp16", ["fp16", "fp32"]), ("bf16", ["fp32"])):
        ours = scan._our_engines(cpu, data, mode)
        theirs = scan._faiss_engines(data, mode)
        assert [(e.label, e.mode) for e in ours] == [("gpucache", mode)]
        assert [e.mode for e in theirs] == faiss_modes
        # the flat index is reported as its own row only in the fp32 cell
        assert [e.reported for e in theirs] == [m == mode for m in faiss_modes]
        assert ours[0].store is not None and len(ours[0].store) == 300


def test_a_modes_engines_are_gone_before_the_next_modes_are_built(monkeypatch):
    """No cell holds another mode's copy of the set: each mode's stores are collected before
    the next mode's are built (a run that kept them held 16 GiB at a million rows)."""
    import weakref

    from gpucache.benchmark.sizing import TimePlan

    built: list[weakref.ref] = []
    alive_at_build: list[int] = []
    real = scan._our_engines

    def spy(device, data, mode):
        alive_at_build.append(sum(ref() is not None for ref in built))
        engines = real(device, data, mode)
        built.extend(weakref.ref(e.store) for e in engines)
        return engines

    monkeypatch.setattr(scan, "_our_engines", spy)
    plan = TimePlan(deadline=float("inf"), cell_seconds=float("inf"), repeat=1)
    results = scan.bench_scan(torch.device("cpu"), [500], [1, 8], ["fp32", "fp16", "int8"], 4, 1, plan)
    assert alive_at_build == [0, 0, 0]
    assert {(r.mode, r.q) for r in results if r.engine == "gpucache"} == {
        (m, q) for m in ("fp32", "fp16", "int8") for q in (1, 8)
    }
