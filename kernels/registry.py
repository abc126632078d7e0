"""Implementations of workloads, and the registry the planner draws candidates from.

Every way of computing a workload (an onnxruntime single-node kernel, a
numpy/BLAS routine, later a generated DSL kernel or a cuDNN engine) is an
`Implementation`. The planner asks the registry for every implementation that
supports a workload, expands each into its configs, prepares, verifies and
times each candidate, and keeps the fastest verified one. Generated kernels
are just more implementations: registering one is all it takes to compete.

A prepared kernel is a callable `kernel(inputs, outputs) -> None` that reads
the input arrays (constants included, in node-input order; None for an
absent optional input) and writes every element of the preallocated,
C-contiguous output arrays. It must not keep references to its arguments.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.workload import Workload

Kernel = Callable[[Sequence[np.ndarray | None], Sequence[np.ndarray]], None]

# Implementation kinds, as shown in reports.
LIBRARY = "library"      # wpk's own numpy/BLAS routines
VENDOR = "vendor"        # onnxruntime, cuDNN, cuBLAS
GENERATED = "generated"  # DSL kernels found by search
FALLBACK = "fallback"    # an op wpk does not implement, run by onnxruntime


class Implementation(ABC):
    """One way to compute workloads; `name` is unique and stored in plans."""

    name: str = ""
    kind: str = LIBRARY
    target: str = "cpu"
    # Whether the runtime may run consecutive steps of implementations that join regions as
    # one onnxruntime session (`wpk.kernels.cpu.ort_region`): such a step saves a call
    # there. Those implementations give their ONNX form (`onnx_part`, `onnx_opset`).
    joins_regions: bool = False
    # Whether its kernels may call BLAS (numpy matmul): the runtime then limits BLAS to one
    # thread while it runs (`wpk.kernels.cpu.blas_threads`); a plan without any skips that.
    uses_blas: bool = True
    # Whether it computes on the calling thread or the generated kernels' OpenMP threads,
    # never on a pool of its own (numpy's data movement and elementwise kernels, wpk's C
    # data movement): a plan on generated kernels may keep its steps without waking a
    # second pool (`wpk.plans.planner.on_generated_kernels`).
    one_pool: bool = False
    # Whether onnxruntime computes it: the report sets every choice next to onnxruntime's
    # own kernel for the workload.
    onnxruntime: bool = False
    # A last resort (onnx.reference, slow): the planner measures it for a workload only
    # when no other candidate computes it correctly (`wpk.plans.planner.plan`).
    last_resort: bool = False

    def native_chain(self, workload: Workload) -> bool:
        """Whether its kernel for `workload` has a native form (`kernel.native`), so it
        joins the chain of native calls around it (`wpk.kernels.cpu.native_chain`):
        wpk's generated kernels do; library kernels say so for themselves."""
        return self.kind == GENERATED

    @abstractmethod
    def unsupported_reason(self, workload: Workload) -> str | None:
        """None when this implementation can compute the workload, else why not."""

    def tolerance(self, workload: Workload, config: Mapping) -> float | None:
        """The relative L2 error its kernel of `config` may have on `workload` when that is
        tighter than the dtype's default (None: the default, `wpk.search.measure`)."""
        return None

    def configs(self, workload: Workload) -> list[dict]:
        """The configurations worth measuring (JSON-able dicts); one empty one by default."""
        return [{}]

    @abstractmethod
    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        """Build a kernel for the workload; `consts` maps input index to its constant value."""

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """The algorithm this implementation computes the workload with under `config`, as
        reports show it ('direct', '1x1', 'depthwise', 'winograd m=4', 'gemm', ...); by
        default the implementation's name. Kernels whose algorithm is a knob of their config
        override it, so a report tells which one the search chose."""
        return self.name

    def onnx_part(self, workload: Workload, consts: Mapping[int, np.ndarray]):
        """The step's ONNX form (`wpk.kernels.cpu.node_model.OnnxPart`) for an onnxruntime
        region; implementations that join regions define it."""
        raise NotImplementedError(f"{self.name} has no ONNX form")

    def onnx_opset(self, workload: Workload) -> int:
        """The default-domain opset of `onnx_part` (a region runs at its members' newest, see
        `wpk.kernels.cpu.ort_region.upgraded`)."""
        return workload.opset


@dataclass(frozen=True)
class Candidate:
    """An implementation with one configuration, as the planner measures it."""

    implementation: Implementation
    config: Mapping

    @property
    def label(self) -> str:
        if not self.config:
            return self.implementation.name
        args = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.implementation.name}[{args}]"


_REGISTRY: dict[str, Implementation] = {}


def register(implementation: Implementation) -> Implementation:
    """Add an implementation to the registry (names are unique)."""
    if implementation.name in _REGISTRY and _REGISTRY[implementation.name] is not implementation:
        raise ValueError(f"implementation {implementation.name!r} registered twice")
    _REGISTRY[implementation.name] = implementation
    return implementation


def get(name: str) -> Implementation:
    """The implementation registered under `name` (KeyError if none)."""
    _load_builtin("cpu")
    if name not in _REGISTRY:
        _load_builtin()
    return _REGISTRY[name]


def implementations(target: str = "cpu") -> list[Implementation]:
    """Every registered implementation for a target."""
    _load_builtin(target)
    return [impl for impl in _REGISTRY.values() if impl.target == target]


def candidates(workload: Workload, target: str = "cpu",
               last_resort: bool = False) -> list[Candidate]:
    """Every (implementation, config) pair that supports the workload on the target; the
    last-resort implementations too when `last_resort` (for the planner)."""
    found = []
    for impl in implementations(target):
        if impl.last_resort and not last_resort:
            continue
        if impl.unsupported_reason(workload) is None:
            found.extend(Candidate(impl, config) for config in impl.configs(workload))
    return found


def _load_builtin(target: str | None = None) -> None:
    """Import the modules that register the built-in implementations: the CPU ones, and
    the CUDA ones unless `target` is "cpu"."""
    import wpk.kernels.builtin  # noqa: F401  (registers on import)

    if target != "cpu":
        import wpk.kernels.builtin_cuda  # noqa: F401
