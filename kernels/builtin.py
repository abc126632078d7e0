"""Imports the modules that register the built-in implementations (one line each)."""

from __future__ import annotations

import wpk.kernels.cpu.conv_im2col  # noqa: F401  (numpy im2col / depthwise convolution)
import wpk.kernels.cpu.gemm  # noqa: F401  (numpy BLAS Gemm and MatMul)
import wpk.kernels.cpu.numpy_ops  # noqa: F401  (numpy elementwise, data movement, norms)
import wpk.kernels.cpu.ort_node  # noqa: F401  (onnxruntime vendor and fallback kernels)
