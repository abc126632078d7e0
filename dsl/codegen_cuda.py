"""CUDA C code generation from loop IR: `extern "C" __global__` kernels + launch configs.

Loops bound to `blockIdx.*` / `threadIdx.*` become the built-in indices (the
launch configuration has exactly their extents, so no bounds test is
needed); `unroll` loops get `#pragma unroll`; shared buffers are
`__shared__` arrays and local ones per-thread arrays (registers once unrolled).
The source includes no header, so NVRTC compiles it as is.
"""

from __future__ import annotations

from dataclasses import dataclass

from wpk.dsl import loopir as L
from wpk.dsl.codegen_c import CPrinter
from wpk.dsl.templates import LaunchConfig, launch_of

CUDA_TYPES = {"f32": "float", "f64": "double", "f16": "__half", "i32": "int",
              "i64": "long long", "bool": "bool"}


class CudaPrinter(CPrinter):
    """Prints loop IR as CUDA C device code."""

    select_minmax = False   # fmaxf/fminf are single instructions on the GPU

    restrict = "__restrict__"

    def literal(self, value, dtype: str) -> str:
        text = super().literal(value, dtype)
        if "INFINITY" in text:
            sign = "-" if text.startswith("-") else ""
            return f"{sign}__int_as_float(0x7f800000)"
        if text == "NAN":
            return "__int_as_float(0x7fffffff)"
        return text

    def expr(self, e: L.Expr) -> str:
        if isinstance(e, L.Cast):
            return f"(({CUDA_TYPES[e.dtype]}){self.expr(e.value)})"
        return super().expr(e)

    def loop(self, s: L.For) -> None:
        if s.kind in L.GPU_BINDINGS:
            self.emit(f"int {s.var.name} = (int){s.kind};  // extent {s.extent}")
            self.stmt(s.body)
            return
        if s.kind == "unroll":
            self.emit("#pragma unroll")
        var = s.var.name
        self.emit(f"for (int {var} = 0; {var} < {s.extent}; ++{var}) {{")
        self.block(s.body)
        self.emit("}")

    def allocate(self, b: L.Buffer) -> None:
        prefix = "__shared__ " if b.scope == "shared" else ""
        self.emit(f"{prefix}{CUDA_TYPES[b.dtype]} {b.name}[{b.size}];")

    def barrier(self) -> None:
        self.emit("__syncthreads();")


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel of a CUDA module and how to launch it."""

    name: str
    launch: LaunchConfig


def generate_cuda(func: L.PrimFunc) -> tuple[str, list[KernelLaunch]]:
    """CUDA C source of every kernel of `func` and their launch configurations, in order.
    Every kernel takes all parameters, then the workspaces, as pointers."""
    outputs = set(func.meta.get("outputs", ()))
    args = []
    for b in func.params + func.workspaces:
        const = "const " if b.name not in outputs and b in func.params else ""
        args.append(f"{const}{CUDA_TYPES[b.dtype]}* __restrict__ {b.name}")
    printer = CudaPrinter()
    printer.emit(f"// wpk generated: {func.name}")
    launches = []
    for kernel in func.kernels:
        launch = launch_of(kernel)
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        launches.append(KernelLaunch(kernel.name, launch))
        printer.emit(f"// grid {launch.grid}, block {launch.block}, "
                     f"shared {launch.shared_bytes} bytes")
        printer.emit(f'extern "C" __global__ void __launch_bounds__({threads}) '
                     f"{kernel.name}({', '.join(args)}) {{")
        printer.indent += 1
        printer.stmt(kernel.body)
        printer.indent -= 1
        printer.emit("}")
        printer.emit("")
    return "\n".join(printer.lines), launches
