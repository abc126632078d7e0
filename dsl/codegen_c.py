"""C code generation from loop IR (shared printer, also the base of the CUDA generator).

The C function takes one `restrict` pointer per parameter buffer (inputs, then
outputs); its workspaces and big copies live in scratch memory it keeps per
calling thread. `parallel` loops become
`#pragma omp parallel for schedule(dynamic)` (a thread that the OS preempts on a
busy machine does not hold the others back; chunks of at least `CHUNK_WORK` scalar
iterations) unless the loop nest has fewer than
`MIN_PARALLEL_WORK` iterations (then it runs on the calling thread: handing a few
microseconds of work to the thread team costs more than it saves), `vectorize` loops
`#pragma omp simd`, `unroll` loops `#pragma GCC unroll`. Built with `gcc -O3 -fopenmp`
for the host's ISA level (`wpk.dsl.toolchain.c_flags`).
"""

from __future__ import annotations

import math

from wpk.dsl import loopir as L

# Scalar iterations below which a `parallel` loop nest runs on the calling thread: a
# fork/join of a spinning 2-thread team costs 2-3 us, a woken one 15-30 us
# (`scripts/bench_step_overhead.py`), while 8192 iterations of an elementwise body take
# about that long.
MIN_PARALLEL_WORK = 8192
# Scalar iterations a thread takes from a dynamic schedule at a time: one outer iteration
# of an elementwise loop is a vector (16 floats), and handing those out one by one made a
# 64K-float Add 30x slower (an atomic per vector, threads writing one cache line in turn).
CHUNK_WORK = 2048

C_TYPES = {"f32": "float", "f64": "double", "f16": "_Float16", "i32": "int32_t",
           "i64": "int64_t", "bool": "bool"}
_F32_FUNCS = {"exp": "expf", "log": "logf", "sqrt": "sqrtf", "tanh": "tanhf", "erf": "erff",
              "abs": "fabsf", "floor": "floorf", "ceil": "ceilf",
              "round": "rintf"}  # rintf: half to even in the default rounding mode
_F64_FUNCS = {k: v[:-1] for k, v in _F32_FUNCS.items()}
HEAP_THRESHOLD = 64 * 1024  # bytes: bigger buffers outside all loops go to kept scratch memory
_BYTES = {"f16": 2, "f32": 4, "f64": 8, "i32": 4, "i64": 8, "bool": 1}
_INFIX = {"+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!="}

PRELUDE = """#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
// max/min as compare-and-select: gcc vectorizes these (vmaxps), not fmaxf/fminf calls
static inline float wpk_maxf(float a, float b) { return a > b ? a : b; }
static inline float wpk_minf(float a, float b) { return a < b ? a : b; }
static inline double wpk_max(double a, double b) { return a > b ? a : b; }
static inline double wpk_min(double a, double b) { return a < b ? a : b; }
// glibc's vector math (libmvec, linked through -lm) for these inside `omp simd` loops
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erff(float);
"""


class CPrinter:
    """Prints loop-IR expressions and statements as C."""

    restrict = "restrict"
    select_minmax = True   # float min/max as the prelude's wpk_max* (vectorizable) helpers

    def __init__(self):
        self.lines: list[str] = []
        self.indent = 0
        self.loop_depth = 0

    # ------------------------------------------------------------------ expressions
    def expr(self, e: L.Expr) -> str:
        if isinstance(e, L.Var):
            return e.name
        if isinstance(e, L.Imm):
            return self.literal(e.value, e.dtype)
        if isinstance(e, L.Load):
            return f"{e.buffer}[{self.expr(e.index)}]"
        if isinstance(e, L.Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, L.Cast):
            return f"(({C_TYPES[e.dtype]}){self.expr(e.value)})"
        if isinstance(e, L.Call):
            return self.call(e)
        if isinstance(e, L.Bin):
            return self.binary(e)
        raise TypeError(e)

    def literal(self, value, dtype: str) -> str:
        if dtype == "bool":
            return "true" if value else "false"
        if dtype in ("i32", "i64"):
            return str(int(value))
        value = float(value)
        suffix = "f" if dtype == "f32" else ""
        if math.isinf(value):
            return ("-" if value < 0 else "") + "INFINITY"
        if math.isnan(value):
            return "NAN"
        text = repr(value)
        return f"{text}{suffix}" if ("." in text or "e" in text) else f"{text}.0{suffix}"

    def binary(self, e: L.Bin) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        floating = e.dtype in ("f32", "f64", "f16")
        if e.op in _INFIX:
            return f"({a} {e.op} {b})"
        if e.op == "and":
            return f"({a} && {b})"
        if e.op == "or":
            return f"({a} || {b})"
        if e.op == "//":
            return f"({a} / {b})"
        if e.op == "%":
            return f"({a} % {b})"
        if e.op in ("min", "max"):
            if floating and self.select_minmax:
                return f"wpk_{e.op}{self.fsuffix(e.dtype)}({a}, {b})"
            if floating:
                return f"{'fmin' if e.op == 'min' else 'fmax'}{self.fsuffix(e.dtype)}({a}, {b})"
            cmp = "<" if e.op == "min" else ">"
            return f"(({a}) {cmp} ({b}) ? ({a}) : ({b}))"
        if e.op == "pow":
            return f"pow{self.fsuffix(e.dtype)}({a}, {b})"
        raise ValueError(f"unknown operator {e.op}")

    def fsuffix(self, dtype: str) -> str:
        return "f" if dtype == "f32" else ""

    def call(self, e: L.Call) -> str:
        args = [self.expr(a) for a in e.args]
        x = args[0]
        one = self.literal(1.0, e.dtype)
        if e.func == "sigmoid":
            return f"({one} / ({one} + {self.math('exp', e.dtype)}(-({x}))))"
        if e.func == "rsqrt":
            return f"({one} / {self.math('sqrt', e.dtype)}({x}))"
        if e.func == "neg":
            return f"(-({x}))"
        if e.func == "not":
            return f"(!({x}))"
        if e.func == "abs" and e.dtype in ("i32", "i64"):
            return f"(({x}) < 0 ? -({x}) : ({x}))"
        return f"{self.math(e.func, e.dtype)}({', '.join(args)})"

    def math(self, func: str, dtype: str) -> str:
        return (_F32_FUNCS if dtype == "f32" else _F64_FUNCS)[func]

    # ------------------------------------------------------------------ statements
    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def stmt(self, s: L.Stmt) -> None:
        if isinstance(s, L.Seq):
            self.sequence(list(s.stmts))
        elif isinstance(s, L.For):
            self.loop(s)
        elif isinstance(s, L.Allocate):
            self.allocate(s.buffer)
        elif isinstance(s, L.Store):
            self.emit(f"{s.buffer}[{self.expr(s.index)}] = {self.expr(s.value)};")
        elif isinstance(s, L.IfThenElse):
            self.emit(f"if ({self.expr(s.cond)}) {{")
            self.block(s.then)
            if s.orelse is not None:
                self.emit("} else {")
                self.block(s.orelse)
            self.emit("}")
        elif isinstance(s, L.Barrier):
            self.barrier()
        elif isinstance(s, L.Comment):
            self.emit(f"// {s.text}")
        else:
            raise TypeError(s)

    def block(self, s: L.Stmt) -> None:
        self.indent += 1
        self.stmt(s)
        self.indent -= 1

    def sequence(self, stmts: list[L.Stmt]) -> None:
        """Statements in order; consecutive parallel loops share one OpenMP parallel region
        (one wake-up of the thread team; `omp for`'s implicit barrier orders them)."""
        i = 0
        while i < len(stmts):
            run = 0
            while i + run < len(stmts) and runs_parallel(stmts[i + run]):
                run += 1
            if run < 2:
                self.stmt(stmts[i])
                i += 1
                continue
            self.emit("#pragma omp parallel")
            self.emit("{")
            self.indent += 1
            for loop in stmts[i:i + run]:
                self.loop(loop, pragma="#pragma omp for schedule(dynamic)")
            self.indent -= 1
            self.emit("}")
            i += run

    def loop(self, s: L.For, pragma: str = "#pragma omp parallel for schedule(dynamic)") -> None:
        if runs_parallel(s):
            chunk = -(-CHUNK_WORK // loop_work(s.body))
            if chunk > 1:
                pragma = pragma.replace("schedule(dynamic)", f"schedule(dynamic, {chunk})")
            self.emit(pragma)
        elif s.kind == "vectorize":
            self.emit("#pragma omp simd")
        elif s.kind == "unroll":
            self.emit(f"#pragma GCC unroll {s.extent}")
        var = s.var.name
        self.emit(f"for (int32_t {var} = 0; {var} < {s.extent}; ++{var}) {{")
        self.loop_depth += 1
        self.block(s.body)
        self.loop_depth -= 1
        self.emit("}")

    def allocate(self, b: L.Buffer) -> None:
        ctype = C_TYPES[b.dtype]
        if self.loop_depth == 0 and b.size * 8 > HEAP_THRESHOLD:
            self.scratch(b)
            return
        self.emit(f"{ctype} {b.name}[{b.size}] __attribute__((aligned(64)));")

    def scratch(self, b: L.Buffer) -> None:
        """A big buffer as per-calling-thread memory kept between calls: allocating and
        freeing megabytes per call costs page faults that made kernels 3x slower at random
        on a busy machine. OpenMP workers share the pointer; it is never freed (one buffer
        per kernel per calling thread, like a runtime's arena)."""
        ctype = C_TYPES[b.dtype]
        nbytes = (b.size * _BYTES.get(b.dtype, 8) + 63) // 64 * 64
        keep = f"wpk_keep_{b.name}"
        self.emit(f"static __thread {ctype}* {keep};")
        self.emit(f"if (!{keep}) {keep} = ({ctype}*)aligned_alloc(64, {nbytes});")
        self.emit(f"{ctype}* restrict {b.name} = {keep};")

    def barrier(self) -> None:
        raise ValueError("barriers only exist in CUDA kernels")


def c_signature(func: L.PrimFunc, restrict: str = "restrict") -> str:
    """`name(const float* restrict X, ..., float* restrict Y)`."""
    n_in = len(func.params) - len(func.meta.get("outputs", ())) if func.meta.get("outputs") \
        else None
    args = []
    for i, b in enumerate(func.params):
        const = "const " if n_in is not None and i < n_in else ""
        args.append(f"{const}{C_TYPES[b.dtype]}* {restrict} {b.name}")
    return f"{func.name}({', '.join(args)})"


def generate_c(func: L.PrimFunc) -> str:
    """C source of the whole operator as one exported function `void <name>(...)`."""
    printer = CPrinter()
    printer.emit(f"// wpk generated: {func.name}")
    printer.emit(f"void {c_signature(func)} {{")
    printer.indent += 1
    for w in func.workspaces:
        printer.scratch(w)
    for k in func.kernels:
        if len(func.kernels) > 1:
            printer.emit(f"// stage {k.name}")
        printer.stmt(k.body)
    printer.indent -= 1
    printer.emit("}")
    return PRELUDE + "\n" + "\n".join(printer.lines) + "\n"


def loop_work(stmt: L.Stmt) -> int:
    """Scalar iterations of the statement's innermost bodies (a loop nest's trip counts
    multiplied, sequences added, the longer branch of an if)."""
    if isinstance(stmt, L.For):
        return stmt.extent * loop_work(stmt.body)
    if isinstance(stmt, L.Seq):
        return max(1, sum(loop_work(s) for s in stmt.stmts))
    if isinstance(stmt, L.IfThenElse):
        return max(loop_work(stmt.then), loop_work(stmt.orelse) if stmt.orelse else 1)
    return 1


def runs_parallel(stmt: L.Stmt) -> bool:
    """Whether the statement is a `parallel` loop with enough work for the thread team."""
    return isinstance(stmt, L.For) and stmt.kind == "parallel" and \
        loop_work(stmt) >= MIN_PARALLEL_WORK
