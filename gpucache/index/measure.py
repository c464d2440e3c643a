"""What a quantized CPU store's two scan paths cost here, measured on random rows as a store
measures its own once it holds ``PATH_CHOICE_MIN_ROWS`` (paths.py): what ``gpucache info``
prints and the benchmarks report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from gpucache.index.kernel_choice import STORE_PATHS, ScanKernelChooser, bucket
from gpucache.index.paths import unmeasured_path
from gpucache.index.store import ExactScanStore


def measure_scan_paths(
    rows: int = 65_536, dim: int = 384, queries: Sequence[int] = (1, 64), mode: str = "int8"
) -> dict[int, tuple[str, dict[str, float]]]:
    """Measure here, on random unit rows, what a quantized CPU store of ``rows`` chooses for
    each query count: {Q: (path, {path: seconds})}. What ``gpucache info`` and the bench
    report; a cache measures its own store the same way as it grows."""
    gen = torch.Generator().manual_seed(0)
    store = ExactScanStore(dim, device="cpu", quantization=mode, initial_rows=rows)
    if store.path_chooser is None:
        return {}
    store.path_chooser = ScanKernelChooser(
        store.device,
        min_rows=1,
        options=STORE_PATHS,
        unmeasured=unmeasured_path,
        start=lambda measure: measure(),
    )
    store.add(
        torch.nn.functional.normalize(torch.randn(rows, dim, generator=gen), dim=1), 0, [math.inf] * rows
    )
    found = {}
    for q in queries:
        batch = torch.nn.functional.normalize(torch.randn(q, dim, generator=gen), dim=1)
        store.search(batch, 1, 0)
        shape = next(s for s in store.path_chooser.choices if s[0] == bucket(q))
        found[q] = (store.path_chooser.choices[shape], store.path_chooser.timings.get(shape, {}))
    return found
