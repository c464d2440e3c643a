"""``ExactScanStore``: every stored row is scored against every query.

Why an exact scan rather than an approximate index: a semantic cache must be able to say
"nothing stored is close enough", and an approximate index can only say "nothing I looked at
is". At the sizes a response cache reaches (1e4..1e6 rows) a dense matmul over the whole store
is also fast on a GPU and tolerable on a CPU, and it needs no training or rebuild.

The store composes its parts (shapes as in ``interface.py``):
- ``RowTable`` (rows.py): which rows are used, their scope ids and expiry times;
- a codec (codecs.py): the rows on the device, in fp32, fp16, bf16 or int8 with block scales;
- ``FullCopy`` and ``RefinePolicy`` (refine.py): a quantized store's exact host copy, the
  over-fetch and the exact rescore;
- an engine (engines/): the chunked scan for the device and dtype, chosen once;
- ``OomFallback`` (fallback.py): a scan that runs out of device memory retries smaller, then
  runs on the CPU;
- ``ScanScratch`` (scratch.py): a CPU scan's product buffers, kept between scans.

The scan walks the rows in chunks so the ``(Q, chunk)`` score block stays within
``scan_budget_bytes``, with a running top-K, so a million rows scan in a few megabytes of
scratch. ``max_device_bytes`` caps the allocation; the store then holds at most ``max_rows``
rows and the cache evicts to stay within them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from gpucache.devices import DeviceLike, resolve_device
from gpucache.index.codecs import Codec, make_codec
from gpucache.index.engines.base import RowsView, ScanEngine, ScanJob
from gpucache.index.engines.choose import default_engine, engine_for
from gpucache.index.fallback import OomFallback
from gpucache.index.interface import DEFAULT_SCAN_BUDGET_BYTES, SCAN_KERNELS, check_quantization
from gpucache.index.kernel_choice import STORE_PATHS, ScanKernelChooser, bucket_top
from gpucache.index.paths import PATH_CHOICE_MIN_ROWS, resolve_quantization, unmeasured_path
from gpucache.index.refine import FullCopy, RefinePolicy, matmul_is_exact, overfetch, rescore_rows
from gpucache.index.rows import RowTable
from gpucache.index.scratch import BufferSource, ScanScratch, host_buffer

TopK = tuple[torch.Tensor, torch.Tensor]  # (scores, rows), each (Q, K)


class ExactScanStore:
    """Rows of unit vectors with a scope and an expiry each, searched by exact dot product.

    Args:
        dim: embedding dimension D.
        device: where the vectors live ("auto", "cpu", "cuda[:N]").
        initial_rows: rows allocated up front; the tensors double when they fill.
        scan_budget_bytes: the most memory one (Q, chunk) fp32 score block may take.
        quantization: None or "fp32" (full precision on the device), "fp16", "bf16", "int8",
            or "auto" (``resolve_quantization``: int8 on a CPU for single lookups' sake, fp32
            elsewhere). ``store.quantization`` holds the mode in use.
        max_device_bytes: the most device memory the store's tensors may take; None: no cap.
        scan_kernel: "auto", "torch" (chunked matmul + topk) or "triton" (the fused kernel
            of ``gpucache.kernels``; fp32/fp16/bf16 storage, CUDA or Triton's CPU interpreter).
            "auto" times both on this store's own scans on CUDA when Triton is installed and
            keeps the faster per shape (``ScanKernelChooser``); elsewhere it is "torch".
        engine: the scan engine to use instead of the one ``scan_kernel`` chooses (tests and
            benchmarks pick engines this way; ``gpucache.index.engines``).
        refine: when a quantized CPU store answers a batch from its exact copy
            (``RefinePolicy``); None takes the measured defaults.
    """

    def __init__(
        self,
        dim: int,
        *,
        device: DeviceLike = "auto",
        initial_rows: int = 1024,
        scan_budget_bytes: int = DEFAULT_SCAN_BUDGET_BYTES,
        quantization: str | None = None,
        max_device_bytes: int | None = None,
        scan_kernel: str = "auto",
        engine: ScanEngine | None = None,
        refine: RefinePolicy | None = None,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if isinstance(initial_rows, bool) or not isinstance(initial_rows, int) or initial_rows < 1:
            raise ValueError(f"initial_rows must be an int >= 1, got {initial_rows!r}")
        if (
            isinstance(scan_budget_bytes, bool)
            or not isinstance(scan_budget_bytes, int)
            or scan_budget_bytes < 4
        ):
            raise ValueError(f"scan_budget_bytes must be an int >= 4, got {scan_budget_bytes!r}")
        check_quantization(quantization)
        self.device = resolve_device(device)
        mode = resolve_quantization(quantization, self.device, dim, max_device_bytes, scan_kernel)
        if scan_kernel not in SCAN_KERNELS:
            raise ValueError(f"scan_kernel must be 'auto', 'torch' or 'triton', got {scan_kernel!r}")
        if scan_kernel == "triton":
            from gpucache.kernels import triton_available

            if not triton_available():
                raise ValueError("scan_kernel='triton' needs triton: pip install 'gpucache[kernels]'")
            if mode == "int8":
                raise ValueError("scan_kernel='triton' supports fp32, fp16 and bf16 storage")
        self.dim = dim
        self.quantization = mode
        self.scan_budget_bytes = scan_budget_bytes
        self.row_bytes = Codec.row_bytes(mode, dim)
        if max_device_bytes is None:
            self.max_rows: int | None = None
        else:
            if (
                isinstance(max_device_bytes, bool)
                or not isinstance(max_device_bytes, int)
                or (max_device_bytes < self.row_bytes)
            ):
                raise ValueError(
                    f"max_device_bytes must be an int >= {self.row_bytes} (one row), got {max_device_bytes!r}"
                )
            self.max_rows = max_device_bytes // self.row_bytes
            initial_rows = min(initial_rows, self.max_rows)
        self.max_device_bytes = max_device_bytes
        self.rows = RowTable(initial_rows, self.device)
        self.codec = make_codec(mode, dim, initial_rows, self.device)
        self.copy = FullCopy(dim, initial_rows) if mode != "fp32" else None
        # a quantized CPU store measures, per query bucket and size class, whether its
        # quantized rows or its exact copy answer faster (``path_chooser``); a caller who
        # passes an engine or a refine policy has pinned the path instead
        self.refine = refine if refine is not None else RefinePolicy()
        self._path_chooser: ScanKernelChooser | None = None
        self.path_chooser = None  # and the search path chosen (the setter)
        if (
            refine is None
            and engine is None
            and self.device.type == "cpu"
            and mode in ("int8", "bf16")
            and scan_kernel != "triton"
        ):
            self.path_chooser = ScanKernelChooser(
                self.device, min_rows=PATH_CHOICE_MIN_ROWS, options=STORE_PATHS, unmeasured=unmeasured_path
            )
        self.kernel_chooser: ScanKernelChooser | None = None
        if engine is None:
            engine, self.kernel_chooser = engine_for(scan_kernel, self.device, self.codec.dtype)
            if scan_kernel == "auto" and self.kernel_chooser is None:
                scan_kernel = "torch"  # nothing to choose between: said so in the attribute
        self.scan_kernel = scan_kernel
        self.engine = engine
        self.oom = OomFallback()
        self.scratch = ScanScratch()  # a CPU scan's product buffers, kept between scans

    def __len__(self) -> int:
        return self.rows.count

    @property
    def path_chooser(self) -> ScanKernelChooser | None:
        return self._path_chooser

    @path_chooser.setter
    def path_chooser(self, chooser: ScanKernelChooser | None) -> None:
        """The chooser of a quantized CPU store's paths, and the search path, chosen here once
        (also for a benchmark's own chooser): fp32 rows scan exactly; quantized ones ask their
        refine policy per batch size, then, where a chooser measures, take its path."""
        self._path_chooser = chooser
        if self.copy is None:
            self._search = self._search_fp32
        elif chooser is None:
            self._search = self._search_refined
        else:
            self._search = self._search_measured

    @property
    def nbytes(self) -> int:
        """Device bytes held by the allocated tensors (used and spare rows)."""
        return self.codec.nbytes + self.rows.nbytes

    @property
    def host_nbytes(self) -> int:
        """Host bytes held by the full-precision copy (quantized modes only)."""
        return self.copy.nbytes if self.copy is not None else 0

    @property
    def scan_retries(self) -> int:
        return self.oom.scan_retries

    @property
    def cpu_fallbacks(self) -> int:
        return self.oom.cpu_fallbacks

    # ----------------------------------------------------------------------------- writes

    def add(self, vectors: torch.Tensor, scope_id: int, expires_at: Sequence[float]) -> list[int]:
        """Store (M, D) vectors in ``scope_id``; returns the M row numbers they took."""
        m = vectors.shape[0]
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape (M, {self.dim}), got {tuple(vectors.shape)}")
        if len(expires_at) != m:
            raise ValueError(f"expires_at has {len(expires_at)} entries for {m} vectors")
        if scope_id < 0:
            raise ValueError(f"scope_id must be >= 0, got {scope_id}")
        needed = self.rows.high + self.rows.fresh_needed(m)
        if needed > self.rows.capacity:
            self._grow(needed)
        rows = self.rows.take(m)
        full = vectors.to(self.device, torch.float32)
        if self.copy is not None:
            self.copy.write(rows, full)
        self.rows.assign(rows, scope_id, expires_at)
        self.codec.write(rows, full, self.copy.data if self.copy is not None else full, self.rows.scopes)
        return rows

    def remove(self, rows: Sequence[int]) -> None:
        """Free ``rows``; a removed row can never be returned by ``search`` again."""
        self.rows.release(rows)

    def set_expiry(self, rows: Sequence[int], expires_at: Sequence[float]) -> None:
        """Give stored ``rows`` new expiry times (seconds on the cache's clock, inf = never)."""
        self.rows.set_expiry(rows, expires_at)

    def expires_at(self, row: int) -> float:
        return self.rows.expires_at(row)

    def expired_rows(self, now: float) -> list[int]:
        """Rows in use whose expiry is at or before ``now``."""
        return self.rows.expired_rows(now)

    def clear(self) -> None:
        self.rows.clear()
        self.scratch.release()

    def vectors(self, rows: Sequence[int]) -> torch.Tensor:
        """(M, D) full-precision copies of stored rows (for persistence): fp32, on the device
        for fp32 storage, on the host for quantized storage."""
        if self.copy is not None:
            return self.copy.gather(rows)
        return self.codec.data[torch.tensor(list(rows), dtype=torch.int64, device=self.device)]

    def _grow(self, needed: int) -> None:
        if self.max_rows is not None and needed > self.max_rows:
            raise RuntimeError(f"gpucache bug: {needed} rows asked of a store capped at {self.max_rows} rows")
        size = max(needed, 2 * self.rows.capacity)
        if self.max_rows is not None:
            size = min(size, self.max_rows)
        extra = size - self.rows.capacity
        self.rows.grow(extra)
        self.codec.grow(extra)
        if self.copy is not None:
            self.copy.grow(extra)

    # ----------------------------------------------------------------------------- search

    def search(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float = -math.inf
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` rows by dot product among live rows of ``scope_id``, per query.

        Returns ``(scores, rows)``, both ``(Q, K)``, best first, padded with ``-inf`` / ``-1``
        where fewer than ``k`` rows qualify. Rows whose expiry is at or before ``now`` and rows
        of other scopes are masked inside the scan, never filtered afterwards in Python.
        """
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must have shape (Q, {self.dim}), got {tuple(queries.shape)}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        q = queries.shape[0]
        if q == 0 or len(self) == 0:
            return (
                torch.full((q, k), -math.inf, dtype=torch.float32, device=self.device),
                torch.full((q, k), -1, dtype=torch.int64, device=self.device),
            )
        return self._search(queries.to(self.device, torch.float32), k, scope_id, now)

    def _search_fp32(self, queries: torch.Tensor, k: int, scope_id: int, now: float) -> TopK:
        return self._scan_exactly(queries, k, scope_id, now, self.codec.data)

    def _refined_takes_copy(self, q: int) -> bool:
        """Whether the refine policy answers ``q`` queries from the exact copy (per search)."""
        return self.refine.scans_copy(
            self.quantization, self.device.type == "cpu", self.scan_kernel == "torch", q, self.rows.high
        )

    def _search_refined(self, queries: torch.Tensor, k: int, scope_id: int, now: float) -> TopK:
        assert self.copy is not None
        if self._refined_takes_copy(queries.shape[0]):
            return self._scan_exactly(queries, k, scope_id, now, self.copy.data)
        return self._scan_quantized(queries, k, scope_id, now)

    def _search_measured(self, queries: torch.Tensor, k: int, scope_id: int, now: float) -> TopK:
        assert self.copy is not None and self._path_chooser is not None
        q = queries.shape[0]
        if self._refined_takes_copy(q):
            return self._scan_exactly(queries, k, scope_id, now, self.copy.data)
        copy_view, quantized_view = self._view(self.copy.data), self._view(self.codec.data)

        # measured at the bucket's largest batch: these queries, repeated to its size
        top = bucket_top(q)
        sample = queries.repeat((top + q - 1) // q, 1)[:top]

        def measured(path: str) -> object:
            # the measurement may run after this search returned, while the store changes:
            # it scans these views (their tensors stay alive) into buffers of its own
            view = copy_view if path == "copy" else quantized_view
            return self._search_path(path, view, sample, k, scope_id, now, host_buffer)

        chooser, high = self._path_chooser, self.rows.high
        path = chooser.choose(q, high, measured)
        with chooser.scanning():
            begun = time.perf_counter()
            found = (
                self._scan_exactly(queries, k, scope_id, now, self.copy.data)
                if path == "copy"
                else self._scan_quantized(queries, k, scope_id, now)
            )
            chooser.observe(q, high, path, time.perf_counter() - begun)
        return found

    def _scan_quantized(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The quantized rows' top candidates, rescored exactly from the fp32 copy."""
        assert self.copy is not None
        wide = min(overfetch(k), self.rows.high)
        _, rows = self._scan(queries, wide, scope_id, now, exact=False)  # (Q, wide) by quantized score
        scores, rows = self.copy.rescore(queries, rows, k)
        return scores.to(self.device), rows.to(self.device)

    def _scan_exactly(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float, exact_rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The fp32 scan's top ``k``, its scores exact even where this process lowered fp32
        matmul precision (bf16 on a CPU with AMX, TF32 on a GPU): then the scan only ranks,
        over-fetching, and ``exact_rows`` (the fp32 rows it scanned) score the candidates."""
        if matmul_is_exact(self.device):
            return self._scan(queries, k, scope_id, now, exact=True)
        wide = min(overfetch(k), self.rows.high)
        _, rows = self._scan(queries, wide, scope_id, now, exact=True)
        scores, rows = rescore_rows(exact_rows, queries, rows, k)
        return scores.to(self.device), rows.to(self.device)

    @property
    def scan_paths(self) -> dict[str, str]:
        """How a quantized CPU store answers each query bucket, as measured so far: bucket
        ("1", "<=64", ">64") and size class (rows in powers of 4) -> "quantized" (its int8 or
        bf16 rows, then the exact rescore) or "copy" (the exact fp32 copy). Empty elsewhere."""
        if self.path_chooser is None:
            return {}
        choices = sorted(self.path_chooser.choices.items())
        return {f"{b} queries, 4^{c} rows": path for (b, c), path in choices}

    def _search_path(
        self,
        path: str,
        view: RowsView,
        queries: torch.Tensor,
        k: int,
        scope_id: int,
        now: float,
        buffer: BufferSource,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One search by ``path`` over ``view`` with no OOM handling (CPU stores only): what
        the path chooser times."""
        assert self.copy is not None
        chunk = max(1, min(view.high, self.scan_budget_bytes // (4 * queries.shape[0])))
        if path == "copy":
            job = ScanJob(queries, k, scope_id, now, chunk, self.scan_budget_bytes)
            return default_engine(self.device, torch.float32).scan(view, job, buffer)
        wide = min(overfetch(k), view.high)
        job = ScanJob(queries, wide, scope_id, now, chunk, self.scan_budget_bytes)
        _, rows = self.engine.scan(view, job, buffer)
        return self.copy.rescore(queries, rows, k)

    def _scan(
        self, queries: torch.Tensor, k: int, scope_id: int, now: float, exact: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunked scan with out-of-memory handling. ``exact``: of fp32 rows, the device
        rows of an fp32 store or a quantized store's host copy; else of the quantized rows."""
        high = self.rows.high
        if exact and self.copy is not None:
            view = self._view(self.copy.data)
            engine = default_engine(self.device, torch.float32)
        else:
            view = self._view(self.codec.data)
            engine = self.engine

        def on_device(chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
            job = ScanJob(queries, k, scope_id, now, chunk, self.scan_budget_bytes)
            with self.scratch.lend() as buffer:
                return engine.scan(view, job, buffer)

        def on_cpu(chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
            # fp32 rows on the host: a quantized store's exact copy (a CPU has no fast
            # half-precision product), or a copy of an fp32 store's device rows
            cpu = torch.device("cpu")
            vectors = self.copy.data[:high] if self.copy is not None else self.codec.data[:high].cpu()
            rows = RowsView(
                vectors, torch.ones(0), self.rows.scopes[:high].cpu(), self.rows.expires[:high].cpu(), high
            )
            job = ScanJob(queries.cpu(), k, scope_id, now, chunk, self.scan_budget_bytes)
            with self.scratch.lend(keep=False) as buffer:
                scores, found = default_engine(cpu, torch.float32).scan(rows, job, buffer)
            return scores.to(self.device), found.to(self.device)

        chunk = max(1, min(high, self.scan_budget_bytes // (4 * queries.shape[0])))
        return self.oom.run(on_device, on_cpu, chunk)

    def _view(self, vectors: torch.Tensor) -> RowsView:
        return RowsView(vectors, self.codec.scales, self.rows.scopes, self.rows.expires, self.rows.high)
