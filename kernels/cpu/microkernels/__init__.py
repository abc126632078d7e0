"""SIMD micro-kernels of NCHWc convolutions and GEMMs, generated as C for the host's ISA.

One module per concern:

- `isa`: the instruction sets (vector lanes, registers, gcc flags), the host's;
- `space`: what a kernel computes (`ConvGeometry`) and its config space
  (register tile, unroll, ISA), searchable by the GA/RL tuners;
- `templates`: the C source (vector accumulators, broadcast FMAs, fused epilogue);
- `kernel`: the registered implementation `micro.nchwc` (filter packing,
  compilation, the kernel callable) and its `GeneratedKernels` for the search.

The GEMM micro-kernels of MatMul and Gemm (`micro.gemm`), the same way:
`gemm_space` (`GemmGeometry`, config space), `gemm_templates` (C source),
`gemm` (registered implementation, B packing, `GemmKernels`), and
`vector_math` (glibc's SIMD math functions for their epilogues).
"""
