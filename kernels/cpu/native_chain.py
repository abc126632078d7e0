"""Consecutive generated-kernel steps of a plan executed by one native call.

A plan's generated kernels are C functions whose arguments, once the runtime has bound
a step to its arena buffers, never change: the input and output views, the packed
weights, the scratch buffers. Calling each through ctypes costs about 1-2 us a step (a
Python call, argument conversion, the GIL released and taken back), more than
onnxruntime's executor spends per node (under 1 us, `scripts/bench_step_overhead.py`),
which a plan of many small steps (a transformer's) pays dozens of times per run. So the
runtime asks each prepared kernel for its native form (`kernel.native(inputs, outputs)`:
the C function's address and its pointer arguments, or None when a call does more than
that, e.g. copies an operand first) and runs every run of two or more consecutive
native steps as one call of a small C driver that calls the functions in order
(`chain_kernel`). Nothing is chosen differently: the same verified kernels run on the
same buffers in the same order, checked against step-by-step execution by the tests.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from wpk.dsl import toolchain

# The most pointer arguments a chained function may take (generated kernels take one per
# tensor, packed weight and scratch buffer: a dozen at most today).
MAX_ARGS = 32

NativeCall = tuple[int, Sequence[int]]   # (function address, pointer arguments)


def _driver_source() -> str:
    """C of `wpk_run_chain(n, fns, arity, args)`: calls fns[i] with its arity[i] pointers,
    taken in order from args, and of `wpk_run_chain_timed(n, fns, arity, args, stamps)`,
    which does the same and writes the CLOCK_MONOTONIC time (the clock of Python's
    `time.perf_counter` on Linux) in seconds before the first call to stamps[0] and
    after call i to stamps[i + 1]. Each function is called through a pointer of its own
    type (void f(void*, ..., void*) with that many arguments), as C requires."""
    cases = []
    for count in range(MAX_ARGS + 1):
        params = ", ".join(["void *"] * count) or "void"
        args = ", ".join(f"a[{i}]" for i in range(count))
        cases.append(f"    case {count}: ((void (*)({params}))fn)({args}); break;")
    return "\n".join([
        "#define _POSIX_C_SOURCE 199309L",
        "#include <stdint.h>",
        "#include <time.h>",
        "static void call_one(void *fn, int64_t arity, void *const *a) {",
        "    switch (arity) {",
        *cases,
        "    default: break;",
        "    }",
        "}",
        "void wpk_run_chain(int64_t n, void *const *fns, const int64_t *arity,",
        "                   void *const *args) {",
        "    for (int64_t i = 0; i < n; i++) {",
        "        call_one(fns[i], arity[i], args);",
        "        args += arity[i];",
        "    }",
        "}",
        "static double now_s(void) {",
        "    struct timespec t;",
        "    clock_gettime(CLOCK_MONOTONIC, &t);",
        "    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;",
        "}",
        "void wpk_run_chain_timed(int64_t n, void *const *fns, const int64_t *arity,",
        "                         void *const *args, double *stamps) {",
        "    stamps[0] = now_s();",
        "    for (int64_t i = 0; i < n; i++) {",
        "        call_one(fns[i], arity[i], args);",
        "        args += arity[i];",
        "        stamps[i + 1] = now_s();",
        "    }",
        "}",
        ""])


@cache
def _library():
    return toolchain.compile_c_shared(_driver_source())


@cache
def _driver():
    return toolchain.load_function(_library(), "wpk_run_chain", [ctypes.c_int64] +
                                   [ctypes.c_void_p] * 3)


@cache
def _timed_driver():
    return toolchain.load_function(_library(), "wpk_run_chain_timed", [ctypes.c_int64] +
                                   [ctypes.c_void_p] * 4)


def native_call(kernel: Callable, inputs: Sequence, outputs: Sequence) -> NativeCall | None:
    """The kernel's native form on these buffers, or None when it has none."""
    native = getattr(kernel, "native", None)
    if native is None:
        return None
    found = native(inputs, outputs)
    if found is None or len(found[1]) > MAX_ARGS:
        return None
    return found


def chain_kernel(calls: Sequence[NativeCall], keep: Sequence = ()) -> Callable:
    """One kernel running the native calls in order (`kernel(inputs, outputs)`; its
    buffers are the ones the calls were bound to). `keep`: objects (the member kernels,
    their packed weights) that must live as long as the chain."""
    functions = np.array([address for address, _ in calls], np.uint64)
    arity = np.array([len(pointers) for _, pointers in calls], np.int64)
    arguments = np.array([pointer or 0 for _, pointers in calls for pointer in pointers] or [0],
                         np.uint64)
    driver, count = _driver(), len(calls)
    f_ptr, n_ptr, a_ptr = functions.ctypes.data, arity.ctypes.data, arguments.ctypes.data

    def kernel(inputs, outputs) -> None:
        driver(count, f_ptr, n_ptr, a_ptr)

    def timed() -> np.ndarray:
        """Run the chain once; the clock (seconds, as `time.perf_counter` reads it)
        before the first call and after each call: len(calls) + 1 values."""
        stamps = np.zeros(count + 1, np.float64)
        _timed_driver()(count, f_ptr, n_ptr, a_ptr, stamps.ctypes.data)
        return stamps

    kernel.timed = timed
    kernel.keep = (functions, arity, arguments, tuple(keep))
    return kernel


def plain(array, shape: Sequence[int] | None = None) -> bool:
    """Whether `array` is a C-contiguous float32 array (of `shape`, when given): a buffer a
    kernel passes to C as it is, without a copy."""
    return (isinstance(array, np.ndarray) and array.dtype == np.float32
            and array.flags.c_contiguous and (shape is None or array.shape == tuple(shape)))


def function_address(fn) -> int:
    """The address of a ctypes function."""
    return ctypes.cast(fn, ctypes.c_void_p).value
