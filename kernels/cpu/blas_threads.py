"""One BLAS thread while wpk runs or times kernels.

OpenBLAS's worker threads busy-wait for a while after each call. In a plan
where a numpy/BLAS step (a Gemm, an im2col convolution) is followed by
onnxruntime steps, they keep a core busy that the next kernel needs: on
light_resnet50 (2 cores), whose last layers are a BLAS Gemm and a Softmax,
the following onnxruntime run took 35 ms instead of 20 ms. So the runtime and
the planner's timing run BLAS on one thread (the planner then sees what the
runtime will get), and the caller's setting is restored afterwards.
"""

from __future__ import annotations

import contextlib
import sys
from contextlib import AbstractContextManager


class OneBlasThread:
    """A reusable context factory limiting every BLAS library loaded at construction time
    (numpy's, scipy's, ...) to one thread; entering costs a few microseconds, constructing
    about a millisecond (it scans the loaded libraries)."""

    def __init__(self) -> None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            self._controller = None
            return
        controller = ThreadpoolController().select(user_api="blas")
        self._controller = controller if controller.lib_controllers else None

    def __call__(self) -> AbstractContextManager:
        if self._controller is None:
            return contextlib.nullcontext()
        return self._controller.limit(limits=1)


# The factory `one_blas_thread` reuses, with the count of imported modules when it was made
_shared: tuple[int, OneBlasThread] | None = None


def one_blas_thread() -> AbstractContextManager:
    """A context in which every BLAS library loaded now uses a single thread.

    The scan of the loaded libraries is made again only when modules were imported since
    the last one (a BLAS library comes with an extension module: numpy's, scipy's,
    torch's). A scan per call cost about 1 ms, and DenseNet-121's build times 1,163
    candidates, each inside this context."""
    global _shared
    modules = len(sys.modules)
    if _shared is None or _shared[0] != modules:
        _shared = (modules, OneBlasThread())
    return _shared[1]()
