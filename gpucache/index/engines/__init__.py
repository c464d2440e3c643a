"""Scan engines: each computes one scan's top-k over a ``RowsView``, on one kind of hardware.

    torch_engine.TorchEngine      chunked matmul + block top-k in torch (CPU and CUDA; any dtype)
    numpy_engine.NumpyEngine      fp32 on a CPU whose fp32 products are faster in numpy's BLAS
    int8_cpu.Int8CpuEngine        int8 rows on a CPU: int32 products, or a GEMV for one query
    triton_engine.TritonEngine    the fused kernel of ``gpucache.kernels`` (fp32/fp16/bf16)

``choose.default_engine`` picks one per device and storage dtype when an index is built; on
CUDA with Triton, ``kernel_choice`` picks between torch and Triton per shape by timing both.
"""
