"""cupy access for the GPU runtime: imported lazily, with one clear error when absent.

    cupy = require_cupy("running a cuDNN convolution")   # DeviceError without cupy/GPU
    if gpu_available(): ...                              # True only with cupy and a device

Every GPU module of wpk imports cupy through these functions, so wpk (offline
builds, tests, the CPU runtime) imports and runs on machines without cupy or
a GPU, and a GPU feature used there fails with a `DeviceError` that says what
is missing and what to install.
"""

from __future__ import annotations

import functools

from wpk.core.errors import DeviceError

INSTALL_HINT = ("install the CUDA extra on a machine with an NVIDIA GPU: "
                "pip install wpk[cuda] (cupy-cuda12x or cupy-cuda13x)")


def _import_cupy():
    try:
        import cupy
    except ImportError as exc:
        return None, f"cupy is not installed ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver or a device
        return None, f"cupy sees no CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return None, "cupy sees no CUDA device"
    return cupy, ""


@functools.cache
def _cupy_state():
    return _import_cupy()


def require_cupy(what: str):
    """The cupy module, or DeviceError saying that `what` needs cupy and an NVIDIA GPU."""
    cupy, why = _cupy_state()
    if cupy is None:
        raise DeviceError(f"{what} needs cupy and an NVIDIA GPU: {why}", hint=INSTALL_HINT)
    return cupy


def gpu_available() -> bool:
    """Whether cupy imports and sees at least one CUDA device."""
    return _cupy_state()[0] is not None


def missing_reason() -> str | None:
    """Why the GPU runtime cannot run here (None when it can)."""
    cupy, why = _cupy_state()
    return None if cupy is not None else why


def compute_capability() -> tuple[int, int]:
    """(major, minor) of the current CUDA device."""
    cupy = require_cupy("querying the GPU")
    text = cupy.cuda.Device().compute_capability  # e.g. '90'
    return int(text[:-1]), int(text[-1])


def device_description() -> dict:
    """Name, compute capability, SMs, L2 and memory of the current device (for results)."""
    cupy = require_cupy("describing the GPU")
    device = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"name": name, "compute_capability": device.compute_capability,
            "sm_count": int(props["multiProcessorCount"]),
            "l2_bytes": int(props["l2CacheSize"]), "memory_bytes": int(props["totalGlobalMem"]),
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "driver": cupy.cuda.runtime.driverGetVersion(), "cupy": cupy.__version__}
