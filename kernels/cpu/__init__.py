"""CPU implementations of workloads (registered through `wpk.kernels.builtin`).

- `ort` (vendor, `ort_node`): every op wpk supports, one onnxruntime session
  per node plus its epilogue; `ort.fallback` (fallback): every other op
  onnxruntime can run. `ort_node.kind_for(workload)` tells which applies.
- `numpy.conv` (library, `conv_im2col`): Conv; configs `strategy` im2col,
  pointwise (1x1) or depthwise.
- `numpy.gemm`, `numpy.matmul` (library, `gemm`): Gemm and MatMul through BLAS.
- `numpy.elementwise` (`numpy_ops`): wpk Elementwise and the ONNX unary and
  binary elementwise ops; `numpy.sum`: Sum, Mean, variadic Max/Min;
  `numpy.copy`: Reshape-like ops, Transpose, Concat, Slice, Gather, Resize, Split;
  `numpy.softmax`, `numpy.layernorm`, `numpy.batchnorm`: in place;
  `numpy.formula`: pooling, LRN, Clip, Pad, LogSoftmax, Softmax before opset 13,
  ReduceMean/Sum/Max/Min, ConvTranspose.
- `native.nchwc` (library, `nchwc_native`): the blocked ChannelSlice, ReorderInput,
  ReorderOutput, nearest Upsample and MaxPool in C, single-threaded, each with a native
  form.

The dtype-generic formulas in `tensor_formulas` and `nn_formulas` serve both
the float64 references (`wpk.kernels.reference`) and `numpy.formula`; the
references of Conv, Gemm and MatMul are separate code. Kernels keep scratch
buffers between calls (never the caller's arrays) and so are not re-entrant.
"""
