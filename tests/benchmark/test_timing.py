"""How the benchmark times calls (gpucache/benchmark/timing.py): in blocks, forward then
reverse, each block settled first; fast calls run until the block has taken long enough."""

from __future__ import annotations


def test_engines_are_timed_in_blocks_forward_then_reverse(monkeypatch):
    import torch

    from gpucache.benchmark import timing as bench

    monkeypatch.setattr(bench, "BLOCK_SECONDS", 0.0)  # exactly the runs asked for
    log: list[str] = []
    now = [0.0]
    # seconds each call of each engine takes on a scripted clock, settling runs (100) included
    durations = {"a": [100, 1, 5, 100, 3], "b": [100, 2, 2, 100, 8], "c": [100, 4, 6, 100, 5]}

    def engine(name):
        def run():
            now[0] += durations[name][log.count(name)]
            log.append(name)

        return run

    timings = bench.timed_together(
        [engine(n) for n in "abc"], torch.device("cpu"), repeat=3, clock=lambda: now[0]
    )
    # each block: one settling run, then its timed runs; 2 timed runs forward, 1 in reverse
    assert "".join(log) == "aaabbbccc" + "ccbbaa"
    # the settling runs are left out: median and spread of the three timed runs
    assert timings == [(3, 4), (2, 6), (5, 2)]


def test_fast_engines_run_until_the_block_has_taken_long_enough(monkeypatch):
    import torch

    from gpucache.benchmark import timing as bench

    monkeypatch.setattr(bench, "BLOCK_RUNS", 7)
    monkeypatch.setattr(bench, "BLOCK_SECONDS", 10.0)  # never reached: capped by BLOCK_RUNS
    log: list[int] = []
    bench.timed_together([lambda: log.append(1)], torch.device("cpu"), repeat=2)
    assert len(log) == (1 + 7) * 2  # a settling run and 7 timed runs per block, two blocks
