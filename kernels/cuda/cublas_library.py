"""cuBLAS called directly (ctypes), with handles of wpk's own, so GEMMs can be graph-captured.

    library = cublas_library(cupy)             # None where libcublas cannot be bound
    handle = library.handle(cupy)              # wpk's handle, on the current stream
    library.sgemm(handle, call, first, second, out, alpha, beta)

CuPy's cuBLAS wrappers refuse to run while a stream is capturing ("calling
cuBLAS API during stream capture is currently unsupported"): on the first GPU
run (H200, 2026-11-27) every plan segment holding a cuBLAS step therefore ran
eagerly instead of as a CUDA graph. wpk calls the same library through ctypes
instead, with one handle of its own per device. The library is the one CuPy
loaded (found in /proc/self/maps, else by its soname). Like CuPy's wrappers,
each call points the handle at the current stream and leaves the workspace to
cuBLAS's default pool, which keeps one per stream: the runtime runs every step
once on its stream before capturing, so nothing is allocated during a capture.
Scalars use host pointer mode; the math mode stays cuBLAS's default (float32,
no TF32).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterable

from wpk.core.errors import DeviceError

SONAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")
POINTER_MODE_HOST = 0
OP = {False: 0, True: 1}       # CUBLAS_OP_N, CUBLAS_OP_T
STATUS_NAMES = {1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE",
                8: "ARCH_MISMATCH", 11: "MAPPING_ERROR", 13: "EXECUTION_FAILED",
                14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR"}

_P, _I, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
_SIGNATURES = {
    "cublasCreate_v2": [ctypes.POINTER(_P)],
    "cublasSetStream_v2": [_P, _P],
    "cublasSetPointerMode_v2": [_P, _I],
    "cublasSgemm_v2": [_P, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I],
    "cublasSgemmStridedBatched": [_P, _I, _I, _I, _I, _I, _P, _P, _I, _LL, _P, _I, _LL, _P,
                                  _P, _I, _LL, _I],
}


def loaded_cublas_path(maps_lines: Iterable[str]) -> str | None:
    """The path of libcublas (not cublasLt) among a process's memory maps, or None."""
    for line in maps_lines:
        path = line.split()[-1] if line.split() else ""
        name = path.rsplit("/", 1)[-1]
        if name.startswith("libcublas.so"):
            return path
    return None


def _open_library() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps") as maps:
            path = loaded_cublas_path(maps)
    except OSError:
        path = None
    for name in ([path] if path else []) + list(SONAMES):
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            for function, argtypes in _SIGNATURES.items():
                getattr(library, function).argtypes = argtypes
                getattr(library, function).restype = ctypes.c_int
        except AttributeError:   # not cuBLAS's v2 API
            continue
        return library
    return None


def check(status: int, what: str) -> None:
    """DeviceError naming the cuBLAS status when `status` is not CUBLAS_STATUS_SUCCESS."""
    if status != 0:
        raise DeviceError(f"cuBLAS {what} failed: CUBLAS_STATUS_"
                          f"{STATUS_NAMES.get(status, status)}",
                          hint="check the GPU with `nvidia-smi`; rebuild the plan")


class CublasLibrary:
    """libcublas bound through ctypes, with one handle of wpk's own per device."""

    def __init__(self, library: ctypes.CDLL):
        self.library = library
        self._handles: dict[int, int] = {}
        self._streams: dict[int, int] = {}   # the stream each handle was last pointed at

    def handle(self, cupy) -> int:
        """wpk's handle for the current device (made the first time, outside any capture,
        since the runtime runs every step once before capturing), pointed at the current
        cupy stream."""
        device = cupy.cuda.runtime.getDevice()
        if device not in self._handles:
            handle = _P()
            check(self.library.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
            check(self.library.cublasSetPointerMode_v2(handle, POINTER_MODE_HOST),
                  "cublasSetPointerMode")
            self._handles[device] = handle.value
        stream = cupy.cuda.get_current_stream().ptr
        if self._streams.get(device) != stream:
            check(self.library.cublasSetStream_v2(_P(self._handles[device]), _P(stream)),
                  "cublasSetStream")
            self._streams[device] = stream
        return self._handles[device]

    def sgemm(self, handle: int, call, first, second, out, alpha, beta) -> None:
        """`call` (a vendor_cublas.GemmCall) on device arrays; `alpha`/`beta` are float32
        host arrays that outlive the call."""
        lib, h = self.library, _P(handle)
        ops = OP[call.trans_first], OP[call.trans_second]
        scalars = _P(alpha.ctypes.data), _P(beta.ctypes.data)
        if call.batch == 1:
            status = lib.cublasSgemm_v2(
                h, *ops, call.m, call.n, call.k, scalars[0], _P(first.data.ptr),
                call.ld_first, _P(second.data.ptr), call.ld_second, scalars[1],
                _P(out.data.ptr), call.ldc)
            check(status, "cublasSgemm")
            return
        status = lib.cublasSgemmStridedBatched(
            h, *ops, call.m, call.n, call.k, scalars[0], _P(first.data.ptr), call.ld_first,
            call.stride_first, _P(second.data.ptr), call.ld_second, call.stride_second,
            scalars[1], _P(out.data.ptr), call.ldc, call.stride_c, call.batch)
        check(status, "cublasSgemmStridedBatched")


@functools.cache
def cublas_library(cupy) -> CublasLibrary | None:
    """The bound library, or None: the one `cupy` loads for its own handle (asked for once,
    here, so the library is in the process before it is looked for)."""
    cupy.cuda.device.get_cublas_handle()
    library = _open_library()
    return None if library is None else CublasLibrary(library)
