"""CUDA kernels: generated DSL kernels for GPU presets, offline checks, analytical model."""
