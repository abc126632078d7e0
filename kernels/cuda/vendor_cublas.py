"""cuBLAS candidates: Gemm and MatMul (batched, transposes, alpha/beta), and an im2col Conv.

    cublas = registry.get("cublas")            # Gemm / MatMul, target 'cuda'
    im2col = registry.get("cublas.im2col")     # Conv = im2col kernel + cuBLAS GEMM

Arrays are row-major (C-contiguous); cuBLAS is column-major. A row-major
matrix is the column-major transpose of itself, so `C = op(A) @ op(B)` is
computed as the column-major `C^T = op(B)^T @ op(A)^T`: cuBLAS gets B first,
the transposes of the row-major problem, m and n swapped, and leading
dimensions equal to the stored row lengths (`gemm_call`, unit-tested against
a column-major emulation in numpy). Batched MatMul uses the strided-batched
call with stride 0 for an operand broadcast over the batch. Gemm's C is
copied (broadcast) into the output first and accumulated with beta; a fused
epilogue runs as one elementwise kernel (`epilogue_cuda`). Every call goes to
the current cupy stream with host pointer mode and allocates nothing; it goes
through wpk's own ctypes binding (`cublas_library`), since CuPy's wrappers
refuse to run during a CUDA-graph capture.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cuda.cublas_library import cublas_library
from wpk.kernels.cuda.cupy_support import missing_reason, require_cupy
from wpk.kernels.cuda.epilogue_cuda import epilogue_kernel
from wpk.kernels.registry import VENDOR, Implementation, Kernel, register


@dataclass(frozen=True)
class GemmCall:
    """One column-major (strided-batched) cuBLAS GEMM computing a row-major product."""

    trans_first: bool          # op of the first cuBLAS operand (the row-major B)
    trans_second: bool         # op of the second cuBLAS operand (the row-major A)
    m: int                     # rows of the column-major result = N of the row-major problem
    n: int                     # = M
    k: int
    ld_first: int
    ld_second: int
    ldc: int
    stride_first: int = 0      # elements between batch items (0: broadcast)
    stride_second: int = 0
    stride_c: int = 0
    batch: int = 1


def gemm_call(m: int, n: int, k: int, trans_a: bool, trans_b: bool, batch: int = 1,
              batch_a: bool = True, batch_b: bool = True) -> GemmCall:
    """The cuBLAS call for row-major `C[M,N] = op(A) @ op(B)`: A stored (M,K) or, with
    `trans_a`, (K,M); B stored (K,N) or (N,K). `batch_a`/`batch_b`: whether that operand
    has its own matrix per batch item (else it is broadcast, stride 0)."""
    cols_a = m if trans_a else k
    cols_b = k if trans_b else n
    return GemmCall(trans_first=trans_b, trans_second=trans_a, m=n, n=m, k=k,
                    ld_first=cols_b, ld_second=cols_a, ldc=n,
                    stride_first=k * n if batch_b and batch > 1 else 0,
                    stride_second=m * k if batch_a and batch > 1 else 0,
                    stride_c=m * n if batch > 1 else 0, batch=batch)


@dataclass(frozen=True)
class GemmProblem:
    """A workload as a (batched) row-major GEMM."""

    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    alpha: float
    beta: float
    batch: int
    batch_a: bool
    batch_b: bool
    has_c: bool


def gemm_problem(workload: Workload) -> GemmProblem | str:
    """The GEMM a float32 Gemm/MatMul workload is, or why cuBLAS does not take it."""
    if workload.op not in ("Gemm", "MatMul") or workload.domain not in ("", "ai.onnx"):
        return f"{workload.op} is not a GEMM"
    specs = [s for s in workload.inputs[:2] if s is not None]
    if len(specs) < 2 or any(s.dtype != "float32" for s in specs) \
            or workload.outputs[0].dtype != "float32":
        return "cuBLAS candidates take float32 operands"
    a, b = workload.inputs[0].shape, workload.inputs[1].shape
    if workload.op == "Gemm":
        trans_a, trans_b = bool(workload.attr("transA", 0)), bool(workload.attr("transB", 0))
        if len(a) != 2 or len(b) != 2:
            return "Gemm operands must be matrices"
        m, k = (a[1], a[0]) if trans_a else a
        n = b[0] if trans_b else b[1]
        has_c = len(workload.inputs) > 2 and workload.inputs[2] is not None
        return GemmProblem(m, n, k, trans_a, trans_b, float(workload.attr("alpha", 1.0)),
                           float(workload.attr("beta", 1.0)) if has_c else 0.0, 1, True,
                           True, has_c)
    if len(a) < 2 or len(b) < 2:
        return "MatMul with a vector operand"
    batch_shape = tuple(workload.outputs[0].shape[:-2])
    own_a, own_b = _owns_batch(a, batch_shape), _owns_batch(b, batch_shape)
    if own_a is None or own_b is None:
        return "MatMul batch broadcasting other than a whole operand"
    return GemmProblem(a[-2], b[-1], a[-1], False, False, 1.0, 0.0, math.prod(batch_shape),
                       own_a, own_b, False)


def _owns_batch(shape: Sequence[int], batch_shape: tuple[int, ...]) -> bool | None:
    """True: one matrix per batch item; False: one matrix for all; None: partial broadcast."""
    lead = tuple(shape[:-2])
    lead = (1,) * (len(batch_shape) - len(lead)) + lead
    if lead == batch_shape:
        return True
    return False if math.prod(lead) == 1 else None


def run_gemm(cupy, call: GemmCall, first, second, out, alpha: np.ndarray,
             beta: np.ndarray) -> None:
    """Issue `call` on the current stream; `alpha`/`beta` are float32 host scalars that
    outlive the call (host pointer mode reads them at launch or capture). Through wpk's own
    binding (`cublas_library`: capturable in a CUDA graph), else through CuPy's wrappers
    (which refuse a capture)."""
    direct = cublas_library(cupy)
    if direct is not None:
        direct.sgemm(direct.handle(cupy), call, first, second, out, alpha, beta)
        return
    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:  # pragma: no cover - older/newer cupy layouts
        from cupy.cuda import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    op = {False: cublas.CUBLAS_OP_N, True: cublas.CUBLAS_OP_T}
    if call.batch == 1:
        cublas.sgemm(handle, op[call.trans_first], op[call.trans_second], call.m, call.n,
                     call.k, alpha.ctypes.data, first.data.ptr, call.ld_first,
                     second.data.ptr, call.ld_second, beta.ctypes.data, out.data.ptr,
                     call.ldc)
    else:
        cublas.sgemmStridedBatched(
            handle, op[call.trans_first], op[call.trans_second], call.m, call.n, call.k,
            alpha.ctypes.data, first.data.ptr, call.ld_first, call.stride_first,
            second.data.ptr, call.ld_second, call.stride_second, beta.ctypes.data,
            out.data.ptr, call.ldc, call.stride_c, call.batch)


def _cupy(what: str):
    return require_cupy(what)


def _support_reason() -> str | None:
    return missing_reason()


class CublasGemm(Implementation):
    """Gemm / MatMul through cuBLAS (sgemm, strided-batched), epilogue fused after."""

    name = "cublas"
    kind = VENDOR
    target = "cuda"

    def unsupported_reason(self, workload: Workload) -> str | None:
        problem = gemm_problem(workload)
        if isinstance(problem, str):
            return problem
        if workload.epilogue and workload.outputs[0].dtype != "float32":
            return "epilogue on a non-float32 output"
        return _support_reason()

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        cupy = _cupy("a cuBLAS GEMM")
        problem = gemm_problem(workload)
        call = gemm_call(problem.m, problem.n, problem.k, problem.trans_a, problem.trans_b,
                         problem.batch, problem.batch_a, problem.batch_b)
        alpha = np.array([problem.alpha], np.float32)
        beta = np.array([problem.beta], np.float32)
        epilogue = epilogue_kernel(workload)
        has_c = problem.has_c and problem.beta != 0.0

        def kernel(inputs: Sequence, outputs: Sequence) -> None:
            out = outputs[0]
            if has_c:
                cupy.copyto(out, inputs[2])
            run_gemm(cupy, call, inputs[1], inputs[0], out, alpha, beta)
            if epilogue is not None:
                epilogue(out, inputs)

        kernel.keep = (alpha, beta)  # the host scalars live as long as the kernel
        return kernel


# ------------------------------------------------------------------------- im2col conv

_IM2COL = r"""
const long long p = i % P;
const long long rest = i / P;
const long long crs = rest % CRS;
const long long n = rest / CRS;
const int s = crs % S;
const int r = (crs / S) % R;
const int c = crs / (R * S);
const int oh = p / OW;
const int ow = p % OW;
const int ih = oh * SH - PT + r * DH;
const int iw = ow * SW - PL + s * DW;
col = (ih >= 0 && ih < H && iw >= 0 && iw < W)
    ? x[((n * C + c) * H + ih) * W + iw] : 0.0f;
"""


@dataclass(frozen=True)
class ConvGeometry:
    """A 2-D NCHW convolution's sizes, strides, pads (top, left, bottom, right), dilations."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    oh: int
    ow: int
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilations: tuple[int, int]
    groups: int


def conv_geometry(workload: Workload) -> ConvGeometry | str:
    """The geometry of a float32 2-D Conv workload, or why it is not one."""
    if workload.op != "Conv" or workload.domain not in ("", "ai.onnx"):
        return f"{workload.op} is not a Conv"
    x, w = workload.inputs[0], workload.inputs[1]
    if x is None or w is None or len(x.shape) != 4 or len(w.shape) != 4:
        return "only 2-D convolutions"
    if any(s is not None and s.dtype != "float32" for s in workload.inputs) \
            or workload.outputs[0].dtype != "float32":
        return "only float32 convolutions"
    if workload.attr("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return "auto_pad is resolved by the frontend; explicit pads expected"
    strides = tuple(workload.attr("strides", (1, 1)))
    dilations = tuple(workload.attr("dilations", (1, 1)))
    pads = tuple(workload.attr("pads", (0, 0, 0, 0)))
    out = workload.outputs[0].shape
    return ConvGeometry(x.shape[0], x.shape[1], x.shape[2], x.shape[3], w.shape[0],
                        w.shape[2], w.shape[3], out[2], out[3], strides,
                        (pads[0], pads[1], pads[2], pads[3]), dilations,
                        int(workload.attr("group", 1)))


class CublasIm2col(Implementation):
    """Conv as an im2col kernel (one column matrix per image) and one batched cuBLAS GEMM;
    bias and epilogue in one elementwise kernel. For comparison with cuDNN and generated
    kernels (groups of 1 only)."""

    name = "cublas.im2col"
    kind = VENDOR
    target = "cuda"

    def unsupported_reason(self, workload: Workload) -> str | None:
        geometry = conv_geometry(workload)
        if isinstance(geometry, str):
            return geometry
        if geometry.groups != 1:
            return "grouped convolution"
        return _support_reason()

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        cupy = _cupy("an im2col convolution")
        g = conv_geometry(workload)
        crs, p = g.c * g.r * g.s, g.oh * g.ow
        col = cupy.empty((g.n, crs, p), cupy.float32)  # the workspace, allocated once
        consts_text = (f"const long long P = {p}, CRS = {crs}; const int C = {g.c}, H = {g.h}, "
                       f"W = {g.w}, R = {g.r}, S = {g.s}, OW = {g.ow}, SH = {g.strides[0]}, "
                       f"SW = {g.strides[1]}, PT = {g.pads[0]}, PL = {g.pads[1]}, "
                       f"DH = {g.dilations[0]}, DW = {g.dilations[1]};")
        im2col = cupy.ElementwiseKernel("raw float32 x", "float32 col",
                                        consts_text + _IM2COL, "wpk_im2col")
        # out[n] (K x P) = W (K x CRS) @ col[n] (CRS x P): W broadcast over the batch
        call = gemm_call(g.k, p, crs, False, False, g.n, batch_a=False, batch_b=True)
        alpha, beta = np.array([1.0], np.float32), np.array([0.0], np.float32)
        has_bias = len(workload.inputs) > 2 and workload.inputs[2] is not None
        bias_add = cupy.ElementwiseKernel("float32 b", "float32 y", "y = y + b", "wpk_bias") \
            if has_bias else None
        epilogue = epilogue_kernel(workload)

        def kernel(inputs: Sequence, outputs: Sequence) -> None:
            out = outputs[0]
            im2col(inputs[0], col)
            run_gemm(cupy, call, col, inputs[1], out, alpha, beta)
            if bias_add is not None:
                bias_add(inputs[2].reshape(1, g.k, 1, 1), out)
            if epilogue is not None:
                epilogue(out, inputs)

        kernel.keep = (alpha, beta, col)
        return kernel


CUBLAS = register(CublasGemm())
CUBLAS_IM2COL = register(CublasIm2col())
