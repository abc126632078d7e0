"""What crosses the boundary of a worker process: a candidate to rebuild, a compile job.

    spec = CandidateSpec("dsl.cpu", {"tile_k": 8}, modules=("wpk.kernels.generated",))
    job = CompileJob.dsl("gemm", {"M": 64, "N": 64, "K": 64}, config)   # -> .so path
    job = CompileJob.c_source(source)                                    # -> .so path

A `CandidateSpec` is a registry candidate by name: the worker imports
`modules` (those that register the implementation), looks the implementation
up (`wpk.kernels.registry.get`) and calls its `prepare`. A `CompileJob` names
a function "module:name" and its JSON keyword arguments; a compile worker
imports and calls it. The compile functions here go through the compile cache
(`wpk.dsl.toolchain`), so a measuring worker's `prepare` finds the library there.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from wpk.dsl import build
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.registry import Candidate


@dataclass(frozen=True)
class CandidateSpec:
    """A candidate a worker can rebuild: registry name, config, modules to import first
    (those that register the implementation) and, optionally, its compiled artifact."""

    impl: str
    config: Mapping[str, Any] = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    artifact: str | None = None

    @property
    def label(self) -> str:
        if not self.config:
            return self.impl
        return f"{self.impl}[{','.join(f'{k}={v}' for k, v in sorted(self.config.items()))}]"

    @staticmethod
    def of(candidate: Candidate | CandidateSpec, modules: Sequence[str] = ()) -> CandidateSpec:
        """The spec of a registry `Candidate` (its implementation's module is imported first)."""
        if isinstance(candidate, CandidateSpec):
            extra = tuple(m for m in modules if m not in candidate.modules)
            return replace(candidate, modules=candidate.modules + extra) if extra else candidate
        home = type(candidate.implementation).__module__
        names = tuple(dict.fromkeys([*modules, *([] if home == "__main__" else [home])]))
        return CandidateSpec(candidate.implementation.name, dict(candidate.config), names)

    @staticmethod
    def from_json(data: Mapping) -> CandidateSpec:
        return CandidateSpec(str(data["impl"]), dict(data.get("config") or {}),
                             tuple(data.get("modules") or ()), data.get("artifact"))

    def to_json(self) -> dict:
        return {"impl": self.impl, "config": dict(self.config), "modules": list(self.modules),
                "artifact": self.artifact}


@dataclass(frozen=True)
class CompileJob:
    """A call `function(**kwargs)` to run in a compile worker ("module:name")."""

    function: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    def run(self) -> Any:
        """Call the function in this process (what a compile worker does with the job)."""
        return import_function(self.function)(**self.kwargs)

    @staticmethod
    def c_source(source: str, flags: Sequence[str] | None = None, label: str = "") -> CompileJob:
        """C source -> path of its shared library (default flags: `toolchain.c_flags()`)."""
        kwargs = {"source": source} | ({} if flags is None else {"flags": list(flags)})
        return CompileJob("wpk.kernels.jobs:compile_c_source", kwargs, label or "C source")

    @staticmethod
    def dsl(op: str, bindings: Mapping[str, Any], config: Mapping[str, Any] | None = None,
            label: str = "") -> CompileJob:
        """DSL library operator `op` for `bindings` under schedule `config` -> .so path."""
        return CompileJob("wpk.kernels.jobs:compile_dsl_operator",
                          {"op": op, "bindings": dict(bindings),
                           "config": None if config is None else dict(config)},
                          label or f"{op}{dict(config or {})}")


def import_function(path: str):
    """The function a "module:name" path names (its module imported)."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"function {path!r} is not 'module:name'")
    return getattr(importlib.import_module(module), name)


def compile_c_source(source: str, flags: Sequence[str] | None = None) -> str:
    """Compile C source through the compile cache; the shared library's path."""
    return str(build.compile_c(source, None if flags is None else tuple(flags)))


def compile_dsl_operator(op: str, bindings: Mapping[str, Any],
                         config: Mapping[str, Any] | None = None) -> str:
    """Lower, generate and compile DSL library operator `op` (what `build_cpu` would load)."""
    # imported here: the DSL's lowering and code generators are for the jobs that compile
    from wpk.dsl.codegen_c import generate_c
    from wpk.kernels import templates

    func = templates.lower_for(load_operator(op), dict(bindings), config, "cpu")
    return str(build.compile_c(generate_c(func)))
