"""SIMD micro-kernels of NCHWc convolutions and GEMMs, generated as C for the host's ISA.

One module per concern:

- `isa`: the instruction sets (vector lanes, registers, gcc flags), the host's;
- `family`: `MicroFamily`, what every family shares as a target's generated kernels
  (support, compile jobs) for the search;
- `space`: what a kernel computes (`ConvGeometry`: blocked input, or the NCHW
  input of a stem) and its config space (register tile, unroll, input blocks per
  pass, phase split, rows per unit, ISA), searchable by the GA/RL tuners;
- `templates`: the C source (vector accumulators, broadcast FMAs, fused epilogue,
  the phase split of a strided or padded conv's input);
- `kernel`: the registered implementation `micro.nchwc` (filter packing,
  compilation, the kernel callable) and its `GeneratedKernels` for the search;
- `scratch`: `ScratchPool`, a kernel's working buffers, one per concurrent call;
- `winograd_space`, `winograd_templates`, `winograd`: the same three concerns for
  Winograd F(2x2,3x3) / F(4x4,3x3) of 3x3 stride-1 convs (`micro.winograd`: the
  transforms and error bound, the C source, the implementation and its family);
- `gemm_space` (`GemmGeometry`, config space), `gemm_templates` (C source),
  `gemm` (registered implementation, B packing, `GemmKernels`): the GEMM micro-kernels
  of MatMul and Gemm (`micro.gemm`), the same way; `vector_math`: glibc's SIMD math
  functions for their epilogues.
"""
