"""SIMD micro-kernels of NCHWc convolutions, generated as C for the host's ISA.

One module per concern:

- `isa`: the instruction sets (vector lanes, registers, gcc flags), the host's;
- `space`: what a kernel computes (`ConvGeometry`: blocked input, or the NCHW
  input of a stem) and its config space (register tile, unroll, input blocks per
  pass, phase split, rows per unit, ISA), searchable by the GA/RL tuners;
- `templates`: the C source (vector accumulators, broadcast FMAs, fused epilogue,
  the phase split of a strided conv's input);
- `kernel`: the registered implementation `micro.nchwc` (filter packing,
  compilation, the kernel callable) and its `GeneratedKernels` for the search.
"""
