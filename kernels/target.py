"""The Target interface: what a build needs to know of one backend (DESIGN.md, Layout).

    target = create_target("cpu")                            # this host's CPU
    target = create_target("cuda", gpu="h100", offline=True)  # a preset, predicted
    target.candidates(workload)       # what an untuned build measures for a workload
    target.generated.template(w)      # the generated kernel's schedule template (search space)
    target.generated.compile_jobs(w, configs)   # fill the compile cache in parallel
    target.families                   # every generated family a search tunes (generated first)
    target.fingerprint()              # what tuning records of this target are keyed by
    target.create_options()           # what makes the same target on another machine
    target.device()                   # the plan's device entry

A target says what it can do in capability fields, which the layers above
read instead of branching on its name (after tinygrad's renderers):

* `timer`: how a candidate is timed ('host': wall clock on this CPU,
  'cuda-events': CUDA events on the GPU); `wpk.search.runner` picks the
  measurement from it;
* `streams`: candidates may be timed concurrently on device streams;
* `predicted`: choices come from the analytical model, not from timing (an
  offline build for a GPU that is not present);
* `session`: "module:Class" of the runtime session that executes its plans;
* `onnxruntime_peer`: onnxruntime runs whole models on it, so a plan is
  measured end to end against that (`wpk.partition`).

A new backend is one module with a `Target` subclass, named in `TARGETS`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from wpk.core.devices import HardwareSpec
from wpk.core.errors import OptionError
from wpk.core.workload import Workload
from wpk.dsl import toolchain
from wpk.kernels import registry
from wpk.kernels.generated import map_workload
from wpk.kernels.jobs import CandidateSpec, CompileJob
from wpk.kernels.registry import Candidate

# name -> "module:Class" of every target (imported when asked for).
TARGETS = {"cpu": "wpk.kernels.cpu.target:CpuTarget",
           "cuda": "wpk.kernels.cuda.target:CudaTarget"}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class TargetFingerprint:
    """What a measurement depends on besides the workload: device, compiler, code generator."""

    device: str      # e.g. 'cpu:x86_64:avx2,fma' or 'cuda:sm_90:h100' (HardwareSpec.fingerprint)
    compiler: str    # first line of `gcc --version` / nvcc version
    codegen: str     # `codegen_version()`: the kernel code's version and digest

    @property
    def key(self) -> str:
        """16 hex digits identifying the fingerprint."""
        return hashlib.sha256(_canonical(self.to_json()).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {"device": self.device, "compiler": self.compiler, "codegen": self.codegen}

    @staticmethod
    def from_json(data: Mapping) -> TargetFingerprint:
        return TargetFingerprint(str(data["device"]), str(data["compiler"]),
                                 str(data["codegen"]))


# The packages whose source makes, prepares and runs every kernel a record times, and the
# files of them that count (the DSL's grammar included)
KERNEL_CODE = ("wpk.dsl", "wpk.kernels")
KERNEL_CODE_SUFFIXES = (".py", ".lark")


@functools.cache
def codegen_version() -> str:
    """The `codegen` of this wpk's fingerprints: `CODEGEN_VERSION` and 16 hex digits of the
    source of `KERNEL_CODE`. A kernel template or a library kernel that changes changes it,
    so tuning records timed and verified with other kernel code never match: a rebuild from
    old records would otherwise take a candidate that the code it now compiles was never
    verified or timed as (the compile cache is keyed by the source itself; the records were
    keyed by `CODEGEN_VERSION` alone, which no template change had bumped)."""
    digest = hashlib.sha256()
    for package in KERNEL_CODE:
        root = Path(importlib.import_module(package).__path__[0])
        for path in sorted(root.rglob("*")):
            if path.suffix in KERNEL_CODE_SUFFIXES and "__pycache__" not in path.parts:
                digest.update(f"{package}/{path.relative_to(root).as_posix()}\0".encode())
                digest.update(path.read_bytes())
    return f"{toolchain.CODEGEN_VERSION}+{digest.hexdigest()[:16]}"


def fingerprint_of(hw: HardwareSpec, compiler: Callable[[], str],
                   device: str | None = None) -> TargetFingerprint:
    """The fingerprint of hardware `hw` whose kernels `compiler()` names the compiler of
    (`device` overrides its device string); compiler 'none' when there is none, so such
    records never match a real compiler's."""
    try:
        version = compiler()
    except Exception:  # no compiler: records still work, they just never match a real one
        version = "none"
    return TargetFingerprint(device or hw.fingerprint, version, codegen_version())


class GeneratedKernels(ABC):
    """A target's generated implementation (DSL kernels with a searched schedule)."""

    impl: ClassVar[str]                  # registry name, e.g. 'dsl.cpu'
    modules: ClassVar[tuple[str, ...]]   # what a worker imports to find it

    @abstractmethod
    def template(self, workload: Workload):
        """The schedule template of the workload's kernel (its knob space and `validate`);
        a WpkError when the workload has no generated kernel on this target."""

    def config(self, knobs: Mapping) -> dict:
        """The implementation's config of a point of the template's space."""
        return dict(knobs)

    def spec(self, knobs: Mapping) -> CandidateSpec:
        """The worker-side spec of the kernel scheduled by `knobs`."""
        return CandidateSpec(self.impl, self.config(knobs), self.modules)

    def candidate(self, knobs: Mapping) -> Candidate:
        """The planner candidate of the kernel scheduled by `knobs`."""
        for module in self.modules:
            importlib.import_module(module)
        return Candidate(registry.get(self.impl), self.config(knobs))

    @abstractmethod
    def compile_jobs(self, workload: Workload, configs: Sequence[Mapping]) -> list[CompileJob]:
        """`CompileJob`s that put the kernels of `configs` in the compile cache."""

    def supports(self, workload: Workload) -> bool:
        """Whether a search tunes this family for `workload` (default: the workload maps to
        a DSL kernel; `template` may still find no space for it on the target)."""
        return not isinstance(map_workload(workload), str)


class Target(ABC):
    """One backend: its hardware, its candidates, its generated kernels, how it is timed."""

    name: ClassVar[str]
    timer: ClassVar[str]
    streams: ClassVar[bool] = False
    session: ClassVar[str]
    onnxruntime_peer: ClassVar[bool] = False
    # How many preferred configs of the generated kernel an untuned build measures.
    default_generated: ClassVar[int] = 0

    def __init__(self, hardware: HardwareSpec, generated: GeneratedKernels,
                 predicted: bool = False, also: Sequence[GeneratedKernels] = ()):
        self.hardware = hardware
        self.generated = generated
        self.predicted = predicted
        # Every generated family a search tunes: `generated` first, then `also` (each keeps
        # its own implementation name, so their records never mix).
        self.families: tuple[GeneratedKernels, ...] = (generated, *also)

    def family(self, impl: str) -> GeneratedKernels | None:
        """The generated family whose implementation is called `impl`, or None."""
        return next((f for f in self.families if f.impl == impl), None)

    def __repr__(self) -> str:
        mode = " (predicted)" if self.predicted else ""
        return f"<{type(self).__name__} {self.hardware.name}{mode}>"

    @classmethod
    @abstractmethod
    def create(cls, **options: Any) -> Target:
        """The target for `options` (the build's flags); DeviceError when it is absent."""

    @abstractmethod
    def candidates(self, workload: Workload, generated: int | None = None) -> list[Candidate]:
        """What a build measures for `workload`: vendor, library and fallback candidates,
        and the generated kernel in up to `generated` preferred configs (default
        `default_generated`; a search adds its own)."""

    @abstractmethod
    def fingerprint(self) -> TargetFingerprint:
        """What tuning records of this target are keyed by."""

    @abstractmethod
    def device(self) -> dict:
        """The plan's device entry (what loading a plan checks against the machine)."""

    def create_options(self) -> dict:
        """The `create` options that make this target again on another machine of the same
        kind (a cluster node makes it to check its fingerprint); none by default."""
        return {}


def target_class(name: str) -> type[Target]:
    """The Target subclass called `name` (OptionError naming the known ones)."""
    path = TARGETS.get(name)
    if path is None:
        raise OptionError(f"unknown target '{name}'", hint=f"use one of: {', '.join(TARGETS)}")
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)


def create_target(name: str, **options: Any) -> Target:
    """The target `name` ('cpu', or 'cuda' with gpu=PRESET|'auto' and offline=bool);
    a DeviceError when the hardware it needs is absent."""
    return target_class(name).create(**options)
