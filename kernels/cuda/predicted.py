"""CUDA steps that are not generated kernels: vendor placeholders, device copies, host steps.

An `--offline` CUDA plan must be complete, so every workload gets a step:

* `cuda.cudnn.predicted` / `cuda.cublas.predicted` (kind vendor): a cuDNN
  convolution or cuBLAS GEMM whose time is *predicted* by the analytical
  model. On the GPU, `prepare` hands the step to the real vendor
  implementation of that library registered for target 'cuda' (written by
  the GPU runtime); `wpk tune PLAN` replaces it by a measured choice.
* `cuda.copy` (kind library): data movement done on the device with the
  array module of the arrays it gets (cupy on a GPU, numpy elsewhere):
  Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout (inference),
  Concat, Transpose.
* `cuda.host` (kind fallback): any other op runs on the host: inputs are
  copied to the host, the CPU implementation named in the config (the first
  CPU library, else vendor, else fallback candidate) computes it, and the
  outputs are copied back. Reports count these as fallback nodes.

These implementations are registered under targets that the registry never
enumerates for 'cuda' ('cuda.predicted'); the CUDA target offers them itself
(`wpk.kernels.cuda.target.CudaTarget.candidates`), and `registry.get(name)`
finds them when a plan is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.errors import DeviceError
from wpk.core.workload import Workload
from wpk.kernels import registry
from wpk.kernels.cpu.tensor_formulas import split_bounds
from wpk.kernels.registry import (
    FALLBACK,
    LIBRARY,
    VENDOR,
    Implementation,
    Kernel,
    register,
)

PLACEHOLDER_TARGET = "cuda.predicted"
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
COPY_OPS = VIEW_OPS | {"Concat", "Transpose", "Split", "Gather"}


def vendor_library(workload: Workload) -> str | None:
    """'cudnn' for 2-D float32 convolutions, 'cublas' for float32 Gemm/MatMul, else None."""
    if any(s is not None and s.dtype != "float32" for s in workload.inputs):
        return None
    if workload.op == "Conv" and len(workload.inputs[0].shape) == 4:
        return "cudnn"
    if workload.op in ("Gemm", "MatMul") and len(workload.inputs[0].shape) >= 2 \
            and len(workload.inputs[1].shape) >= 2:
        return "cublas"
    return None


class PredictedVendor(Implementation):
    """A cuDNN/cuBLAS call of an offline plan, predicted by the analytical model."""

    kind = VENDOR
    target = PLACEHOLDER_TARGET

    def __init__(self, library: str):
        self.library = library
        self.name = f"cuda.{library}.predicted"

    def unsupported_reason(self, workload: Workload) -> str | None:
        found = vendor_library(workload)
        return None if found == self.library else f"not a {self.library} workload"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        for impl in registry.implementations("cuda"):
            if impl.kind == VENDOR and self.library in impl.name \
                    and impl.unsupported_reason(workload) is None:
                configs = impl.configs(workload) or [{}]
                return impl.prepare(workload, consts, configs[0])
        raise DeviceError(f"{workload.label}: the plan predicted a {self.library} call, and "
                          f"no {self.library} implementation is available here",
                          hint="run `wpk tune PLAN` on the GPU to measure and replace "
                               "predicted choices")


def array_module(arrays: Sequence):
    """cupy when any of `arrays` is a cupy array, else numpy."""
    for array in arrays:
        if array is not None and type(array).__module__.startswith("cupy"):
            import cupy  # optional (the cuda extra): only for cupy arrays

            return cupy
    return np


class DeviceCopy(Implementation):
    """Data movement on the device, in the arrays' own array module (cupy or numpy)."""

    name = "cuda.copy"
    kind = LIBRARY
    target = PLACEHOLDER_TARGET

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.op not in COPY_OPS or workload.domain not in ("", "ai.onnx"):
            return f"{workload.op} is not a data movement op"
        if len(workload.outputs) != 1 and workload.op != "Split":
            return f"{workload.op} with several outputs"
        if workload.epilogue:
            return "data movement with an epilogue"
        if workload.op == "Gather" and workload.static_value(1) is None:
            return "a Gather of computed indices (only static ones are a device copy)"
        if any(s is not None and s.dtype != workload.outputs[0].dtype
               for s in workload.inputs[:1]):
            return "a copy that changes the dtype"
        return None

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        op = workload.op
        axis = int(workload.attr("axis", 0))
        perm = workload.attr("perm")
        if op == "Split":
            axis, bounds = split_bounds(workload)
            pieces = [(slice(None),) * axis + (slice(lo, hi),) for lo, hi in bounds]
        if op == "Gather":
            axis %= len(workload.inputs[0].shape)
            indices = np.asarray(workload.static_value(1))
            indices = np.where(indices < 0, indices + workload.inputs[0].shape[axis], indices)

        module = []  # the arrays' module (cupy or numpy), found on the first run
        device_indices = []  # Gather's indices on the device, uploaded on the first run

        def kernel(inputs: Sequence, outputs: Sequence) -> None:
            if not module:
                module.append(array_module([*inputs, *outputs]))
            xp = module[0]
            out = outputs[0]
            if op == "Split":   # views of the input: one copy kernel per piece
                x = xp.asarray(inputs[0])
                for piece, target in zip(pieces, outputs):
                    target[...] = x[piece]
            elif op == "Gather":   # into the output, no temporary
                if not device_indices:
                    device_indices.append(xp.asarray(indices.ravel()))
                x = xp.asarray(inputs[0])
                flat = out.reshape(x.shape[:axis] + (indices.size,) + x.shape[axis + 1:])
                xp.take(x, device_indices[0], axis=axis, out=flat)
            elif op == "Concat":
                parts = [xp.asarray(a) for a in inputs if a is not None]
                xp.concatenate(parts, axis=axis % out.ndim, out=out)  # no temporary
            elif op == "Transpose":
                x = xp.asarray(inputs[0])
                out[...] = xp.transpose(x, None if perm is None else tuple(perm))
            else:
                out[...] = xp.asarray(inputs[0]).reshape(out.shape)

        return kernel


class HostStep(Implementation):
    """A step the device hands to the host: copy in, CPU implementation, copy out."""

    name = "cuda.host"
    kind = FALLBACK
    target = PLACEHOLDER_TARGET

    def unsupported_reason(self, workload: Workload) -> str | None:
        return None if host_config(workload) is not None else "no CPU implementation"

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        cpu = registry.get(config["host_impl"])
        host_consts = {i: _to_host(a) for i, a in consts.items()}
        inner = cpu.prepare(workload, host_consts, dict(config.get("host_config", {})))
        specs = workload.outputs

        def kernel(inputs: Sequence, outputs: Sequence) -> None:
            host_in = [None if a is None else _to_host(a) for a in inputs]
            host_out = [np.empty(s.shape, np.dtype(s.dtype)) for s in specs]
            inner(host_in, host_out)
            for target, value in zip(outputs, host_out):
                if hasattr(target, "set"):
                    target.set(value)
                else:
                    target[...] = value

        return kernel


def _to_host(array):
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) \
        else np.asarray(array)


def host_config(workload: Workload) -> dict | None:
    """The CPU implementation a host step runs: library first, then vendor, then fallback."""
    found = registry.candidates(workload, "cpu")
    rank = {LIBRARY: 0, VENDOR: 1, FALLBACK: 2}
    found = [c for c in found if c.implementation.kind in rank]
    if not found:
        return None
    best = min(found, key=lambda c: rank[c.implementation.kind])
    return {"host_impl": best.implementation.name, "host_config": dict(best.config)}


CUDNN = register(PredictedVendor("cudnn"))
CUBLAS = register(PredictedVendor("cublas"))
DEVICE_COPY = register(DeviceCopy())
HOST_STEP = register(HostStep())
