"""Imports the modules that register the built-in implementations (one line each)."""

from __future__ import annotations

import wpk.kernels.cpu.attention  # noqa: F401  (fused attention: generated C, onnxruntime)
import wpk.kernels.cpu.conv_im2col  # noqa: F401  (numpy im2col / depthwise convolution)
import wpk.kernels.cpu.gemm  # noqa: F401  (numpy BLAS Gemm and MatMul)
import wpk.kernels.cpu.microkernels.gemm  # noqa: F401  (MatMul/Gemm SIMD micro-kernels, C)
import wpk.kernels.cpu.microkernels.inverted_residual  # noqa: F401  (fused inverted residual)
import wpk.kernels.cpu.microkernels.kernel  # noqa: F401  (NCHWc conv SIMD micro-kernels, C)
import wpk.kernels.cpu.microkernels.winograd  # noqa: F401  (Winograd 3x3 NCHWc convs, C)
import wpk.kernels.cpu.nchwc  # noqa: F401  (onnxruntime MLAS kernels of the wpk.nchwc ops)
import wpk.kernels.cpu.nchwc_library  # noqa: F401  (wpk.nchwc ops through library kernels)
import wpk.kernels.cpu.nchwc_native  # noqa: F401  (blocked data movement and MaxPool in C)
import wpk.kernels.cpu.numpy_ops  # noqa: F401  (numpy elementwise, data movement, norms)
import wpk.kernels.cpu.onnx_reference  # noqa: F401  (onnx.reference, the last resort)
import wpk.kernels.cpu.ort_model  # noqa: F401  (onnxruntime running a whole model)
import wpk.kernels.cpu.ort_node  # noqa: F401  (onnxruntime vendor and fallback kernels)
import wpk.kernels.cuda.fused  # noqa: F401  (fused CUDA kernels: attention; unfused peer)
import wpk.kernels.cuda.generated  # noqa: F401  (generated CUDA kernels for GPU presets)
import wpk.kernels.cuda.predicted  # noqa: F401  (cuDNN/cuBLAS placeholders, copies, host steps)
import wpk.kernels.cuda.vendor_cublas  # noqa: F401  (cuBLAS Gemm/MatMul, im2col Conv; GPU only)
import wpk.kernels.cuda.vendor_cudnn  # noqa: F401  (cuDNN Conv engines; GPU only)
import wpk.kernels.generated  # noqa: F401  (generated DSL kernels, configs from the search)
