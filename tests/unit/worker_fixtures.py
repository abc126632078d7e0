"""Test implementations the measurement worker imports by module name.

Real C kernels compiled with gcc through the DSL toolchain (and its compile
cache): a correct Relu, one that segfaults (a store far outside its
buffers), one that never returns, and one that writes wrong values. A
tunable Relu (`test.worker.tiled`, config `{"block": b, "unroll": u}`)
serves the tuning-loop tests. They are registered but support no workload
(`unsupported_reason` always answers), so the planner never draws them;
the worker measures them by name.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

from wpk.core.workload import TensorSpec, Workload
from wpk.dsl.toolchain import load_function
from wpk.kernels.jobs import compile_c_source
from wpk.kernels.registry import Implementation, register

RELU_WORKLOAD = Workload("Relu", (TensorSpec((64, 64)),), (TensorSpec((64, 64)),))

BODIES = {
    "good": "y[i] = x[i] > 0.0f ? x[i] : 0.0f;",
    # A store 1 TiB past the input: SIGSEGV, with nothing the compiler may fold into a trap.
    "segfault": "y[i] = x[i]; if (i == n - 1) ((volatile float *)x)[(long)1 << 38] = 1.0f;",
    "hang": "y[i] = x[i]; while (spin) { }",
    "wrong": "y[i] = x[i];",  # no clamp: negative inputs come out wrong
}

SOURCE = """
volatile int spin = 1;
void relu(const float *x, float *y, long n) {
    for (long i = 0; i < n; ++i) { %s }
}
"""

TILED_SOURCE = """
void relu(const float *restrict x, float *restrict y, long n) {
    for (long b = 0; b < n; b += %(block)d) {
        long end = b + %(block)d < n ? b + %(block)d : n;
        #pragma GCC unroll %(unroll)d
        for (long i = b; i < end; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    }
}
"""

ARGTYPES = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long)


def _kernel_from_source(source: str):
    function = load_function(compile_c_source(source), "relu", ARGTYPES)

    def kernel(inputs, outputs):
        x, y = inputs[0], outputs[0]
        function(x.ctypes.data, y.ctypes.data, x.size)
    return kernel


class CRelu(Implementation):
    """A C Relu whose loop body is `BODIES[behaviour]`."""

    def __init__(self, behaviour: str):
        self.behaviour = behaviour
        self.name = f"test.worker.{behaviour}"

    def unsupported_reason(self, workload):
        return "test fixture: measured by name only"

    def prepare(self, workload, consts, config):
        return _kernel_from_source(source_of(self.behaviour))


class TiledRelu(Implementation):
    """A C Relu with a tunable block size and unroll factor."""

    name = "test.worker.tiled"

    def unsupported_reason(self, workload):
        return "test fixture: measured by name only"

    def configs(self, workload):
        return [{"block": b, "unroll": u} for b in (64, 256, 1024) for u in (1, 4)]

    def prepare(self, workload, consts, config):
        return _kernel_from_source(tiled_source(config))


class PythonRaises(Implementation):
    """A kernel that raises an exception (runtime_error without a crash)."""

    name = "test.worker.raises"

    def unsupported_reason(self, workload):
        return "test fixture: measured by name only"

    def prepare(self, workload, consts, config):
        def kernel(inputs, outputs):
            raise FloatingPointError("kernel gave up")
        return kernel


IMPLEMENTATIONS = {b: register(CRelu(b)) for b in BODIES}
TILED = register(TiledRelu())
RAISES = register(PythonRaises())


def source_of(behaviour: str) -> str:
    """The C source of `CRelu(behaviour)` (to compile ahead in a CompilePool)."""
    return SOURCE % BODIES[behaviour]


def tiled_source(config) -> str:
    """The C source of `TiledRelu` under `config`."""
    return TILED_SOURCE % {"block": int(config["block"]), "unroll": int(config["unroll"])}


def slow_compile(seconds: float) -> str:
    """A compile job that takes `seconds` (to test the pool's timeout)."""
    time.sleep(seconds)
    return "slow"


def crashing_compile() -> str:
    """A compile job whose process dies by SIGSEGV."""
    os.kill(os.getpid(), signal.SIGSEGV)
    return "unreachable"
