"""Imports the modules that register the built-in CUDA implementations (one line each):
imported only where a CUDA implementation is asked for, so loading a CPU plan skips them
and the DSL's loop IR and CUDA code generator they import."""

from __future__ import annotations

import wpk.kernels.cuda.fused  # noqa: F401  (fused CUDA kernels: attention; unfused peer)
import wpk.kernels.cuda.generated  # noqa: F401  (generated CUDA kernels for GPU presets)
import wpk.kernels.cuda.predicted  # noqa: F401  (cuDNN/cuBLAS placeholders, copies, host steps)
import wpk.kernels.cuda.vendor_cublas  # noqa: F401  (cuBLAS Gemm/MatMul, im2col Conv; GPU only)
import wpk.kernels.cuda.vendor_cudnn  # noqa: F401  (cuDNN Conv engines; GPU only)
