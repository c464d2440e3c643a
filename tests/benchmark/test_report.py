"""The benchmark's report (gpucache/benchmark/report.py): each figure printed as measured, each
ratio against what was timed beside it, the run's own facts, the JSON read back, the plot."""

from __future__ import annotations


def test_the_report_compares_each_mode_with_faiss_and_the_gpu_with_the_cpu():
    from gpucache.benchmark.report import BenchReport, render
    from gpucache.benchmark.scan import ScanResult

    versions = _versions()

    def report(device, ours_qps, faiss_qps):
        scans = [
            ScanResult(device, "gpucache", "int8", 1000, 1, 1 / ours_qps, 0.0, ours_qps, 1.0),
            ScanResult("cpu", "faiss", "fp32", 1000, 1, 1 / faiss_qps, 0.0, faiss_qps, 1.0),
            ScanResult("cpu", "faiss", "int8", 1000, 1, 0.5 / faiss_qps, 0.0, 2 * faiss_qps, 1.0),
        ]
        return BenchReport(
            device,
            versions,
            10.0,
            {"fp32": 0.1},
            scans=scans,
            embed={"prompts": 4, "gpucache_prompts_per_s": ours_qps, "dtype": "x"},
            end_to_end={"prompts": 4, "seconds": 1.0, "prompts_per_s": ours_qps, "hit_rate": 0.5},
        )

    text = render([report("cpu", 50.0, 100.0), report("cuda:0", 400.0, 100.0)], "cmd")
    assert "| gpucache | int8 | 1000 | 1 |" in text and "| 0.50x |" in text and "| 4.00x |" in text
    assert "| 0.50x | 0.25x |" in text and "| 4.00x | 2.00x |" in text  # against FAISS's int8
    assert "Below FAISS IndexFlatIP: gpucache int8 N=1000 Q=1 (0.500x)." in text
    assert "Below FAISS IndexFlatIP: none." in text  # the GPU section
    assert "| scan queries/s, int8, N = 1000, Q = 1, cuda:0 / cpu | 8.0x |" in text
    assert "| embed prompts/s, cuda:0 / cpu | 8.0x |" in text


def test_int8_compute_is_a_fraction_of_the_int8_matmul_rate():
    """The roofline of an int8 batch is the machine's int8 matmul where the store multiplies
    in int8 (a CPU with torch._int_mm), and fp32 where it widens the rows."""
    import torch

    from gpucache.benchmark.machine import machine_limits, matmul_rate
    from gpucache.benchmark.report import BenchReport, render
    from gpucache.benchmark.scan import ScanResult
    from gpucache.index.probes import CpuPaths

    assert matmul_rate(torch.device("cpu"), torch.int8, 1, 64) > 0
    _, rates = machine_limits(torch.device("cpu"), 1, quick=True)
    assert ("int8" in rates) == CpuPaths.detect().int8_matmul and {"fp32", "bf16", "fp16"} <= set(rates)
    versions = _versions()
    # 2 * 64 * 1000 * 384 ops in 1 ms: 49.2 GOP/s, half of a 98.3 GOP/s int8 rate
    scan = ScanResult("cpu", "gpucache", "int8", 1000, 64, 1e-3, 0.0, 64e3, 1.0)
    limits = {"fp32": 0.01, "int8": 2 * 64 * 1000 * 384 / 1e-3 / 1e12 * 2}
    text = render(
        [
            BenchReport(
                "cpu",
                versions,
                10.0,
                limits,
                scans=[scan],
                embed={"prompts": 4, "gpucache_prompts_per_s": 1.0, "dtype": "x"},
                end_to_end={"prompts": 4, "seconds": 1.0, "prompts_per_s": 4.0, "hit_rate": 0.5},
            )
        ],
        "cmd",
    )
    assert "| gpucache | int8 | 1000 | 64 | 1.00 (0.00) | 64000 | 1.0 | - | 50% |" in text
    assert "fp32 10.0 GFLOP/s, int8 98.3 GOP/s." in text


def test_a_single_query_is_a_fraction_of_the_read_rate_measured_beside_it():
    """On a shared machine the read bandwidth moves minute to minute: Q = 1 is compared with a
    plain read timed in the same blocks, not with the machine figure from the run's start."""
    from gpucache.benchmark.report import BenchReport, render
    from gpucache.benchmark.scan import ScanResult

    versions = _versions()
    scan = ScanResult("cpu", "gpucache", "fp32", 1000, 1, 1e-3, 0.0, 1e3, 3.0, None, 4.0)
    text = render(
        [
            BenchReport(
                "cpu",
                versions,
                50.0,
                {"fp32": 0.1},
                scans=[scan],
                embed={"prompts": 4, "gpucache_prompts_per_s": 1.0, "dtype": "x"},
                end_to_end={"prompts": 4, "seconds": 1.0, "prompts_per_s": 4.0, "hit_rate": 0.5},
            )
        ],
        "cmd",
    )
    assert "| gpucache | fp32 | 1000 | 1 | 1.00 (0.00) | 1000 | 3.0 | 4.0 | 75% |" in text


def _versions():
    return {
        "gpucache": "0.1.0",
        "commit": "abc1234",
        "python": "3",
        "torch": "2",
        "cuda": "12",
        "transformers": "5",
        "faiss": "1",
        "machine": "x86_64",
        "processor": "Some CPU",
        "cpu_threads": "2",
        "gpu": "Some GPU",
    }


def _report(device, qps, run=None):
    from gpucache.benchmark.report import BenchReport
    from gpucache.benchmark.scan import ScanResult

    scans = [
        ScanResult(device, "gpucache", mode, n, q, q / qps / n, 0.0, qps * 10_000 / n, 1.0, 1.0, None, 2.0)
        for mode in ("fp32", "int8")
        for n in (10_000, 100_000)
        for q in (1, 64)
    ]
    return BenchReport(
        device,
        _versions(),
        10.0,
        {"fp32": 0.1},
        scans=scans,
        embed={"prompts": 4, "gpucache_prompts_per_s": qps, "dtype": "x"},
        end_to_end={"prompts": 4, "seconds": 1.0, "prompts_per_s": qps, "hit_rate": 0.5},
        run=run or {},
    )


RUN = {
    "seconds": 612.4,
    "sizes": [10_000, 100_000, 1_000_000],
    "query_batches": [1, 64, 1024],
    "available_bytes": 22 * 2**30,
    "total_bytes": 24 * 2**30,
    "memory_fraction": 0.5,
    "peak_bytes": 9 * 2**30,
    "peak_what": "the process's peak resident memory",
    "missing": ["the scan's yardstick (FAISS): pip install 'gpucache[bench]'"],
    "skipped": [{"what": "scan, N = 10,000,000", "why": "its largest cell needs 59.7 GiB"}],
}


def test_the_report_says_what_the_run_chose_left_out_took_and_held():
    from gpucache.benchmark.report import render

    text = render([_report("cpu", 100.0, RUN)], "gpucache bench")
    assert "### This run" in text
    assert "Wall time 612 s on this device. Stored-row sizes run: 10,000, 100,000, 1,000,000" in text
    assert "22.0 GiB available when the scans began, of 24.0 GiB" in text
    assert "peak held 9.00 GiB (38% of the device's memory; the process's peak resident memory)" in text
    assert "Not measured, not installed: the scan's yardstick (FAISS): pip install 'gpucache[bench]'." in text
    assert "- scan, N = 10,000,000: its largest cell needs 59.7 GiB" in text
    assert "gpucache 0.1.0, commit abc1234; Some CPU, Python 3" in text
    assert "Some GPU" not in text  # the GPU is named in the GPU's section only
    assert "Some GPU; Some CPU" in render([_report("cuda", 100.0, RUN)], "gpucache bench")


def test_every_cell_both_devices_ran_is_compared_gpu_against_cpu():
    from gpucache.benchmark.report import render

    text = render([_report("cpu", 100.0), _report("cuda", 800.0)], "gpucache bench")
    rows = [line for line in text.splitlines() if line.startswith("| scan queries/s, ")]
    assert len(rows) == 8  # 2 modes x 2 sizes x 2 batches
    assert all(row.endswith("| 8.0x |") for row in rows)
    # each gpucache row's "vs FAISS flat" is against the flat index timed in its own cell
    assert "| gpucache | fp32 | 10000 | 1 | 0.00 (0.00) | 100 | 1.0 | - | 10% | 1.0000 | 50.00x | - |" in text


def test_the_json_reads_back_into_the_same_report(tmp_path):
    from gpucache.benchmark.report import load_reports, render, write

    reports = [_report("cpu", 100.0, RUN), _report("cuda", 800.0, RUN)]
    written = write(reports, tmp_path / "b.md", "gpucache bench")
    assert [p.name for p in written] == ["b.md", "b.json", "b.png"]
    again = load_reports(tmp_path / "b.json")
    assert again == reports
    assert render(again, "gpucache bench") == (tmp_path / "b.md").read_text()


def test_the_plot_draws_each_devices_line_per_cell(tmp_path, monkeypatch):
    import matplotlib.axes

    from gpucache.benchmark.report import plot

    drawn = []
    real = matplotlib.axes.Axes.plot

    def spy(self, xs, ys, *args, label=None, **kwargs):
        drawn.append((self.get_title(), label, list(xs), list(ys)))
        return real(self, xs, ys, *args, label=label, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    png = tmp_path / "p.png"
    assert plot([_report("cpu", 100.0), _report("cuda", 800.0)], png)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    labels = {label for _, label, _, _ in drawn}
    assert labels == {f"{d} gpucache {m}" for d in ("cpu", "cuda") for m in ("fp32", "int8")}
    # one point per size, each the cell's queries/s; a panel per query batch; the titles are
    # set after the lines are drawn, so the panels are told apart by their values
    cuda_fp32 = [(xs, ys) for _, label, xs, ys in drawn if label == "cuda gpucache fp32"]
    assert len(cuda_fp32) == 2 and all(xs == [10_000, 100_000] for xs, _ in cuda_fp32)
    assert all(ys == [800.0, 80.0] for _, ys in cuda_fp32)


def test_without_matplotlib_the_report_is_written_without_its_plot(tmp_path, monkeypatch):
    import sys

    from gpucache.benchmark.report import write

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    written = write([_report("cpu", 100.0, RUN)], tmp_path / "b.md", "gpucache bench")
    assert [p.name for p in written] == ["b.md", "b.json"] and not (tmp_path / "b.png").exists()
