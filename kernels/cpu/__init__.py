"""CPU implementations: onnxruntime single-node kernels and numpy/BLAS library kernels."""
