"""GPU emulator: executes CUDA-scheduled loop IR with blocks/threads as lanes, barriers as
phase boundaries and shared memory per block, and reports races and bad accesses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from wpk.core.numerics import relative_l2
from wpk.dsl import compute as C
from wpk.dsl import loopir as L
from wpk.dsl.emulator import EmulatorError, emulate, kernel_source
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.templates import build_cuda, lower_for

tx, bx = L.Var("tx"), L.Var("bx")


def func(body: L.Stmt, n: int = 4) -> L.PrimFunc:
    params = (L.Buffer("X", "f32", (n,)), L.Buffer("Y", "f32", (n,)))
    return L.PrimFunc("k", params, (), (), (L.Kernel("k", body, ("X", "Y")),), "cuda",
                      meta={"outputs": ("Y",)})


def threads(body: L.Stmt, n: int = 4) -> L.Stmt:
    return L.For(tx, n, body, "threadIdx.x")


X = np.arange(4, dtype=np.float32) + 1


def reverse_through_shared(with_barrier: bool) -> L.PrimFunc:
    shared = L.Buffer("S", "f32", (4,), "shared")
    body = L.seq(L.Allocate(shared), threads(L.seq(
        L.Store("S", tx, L.Load("X", tx)),
        L.Barrier() if with_barrier else None,
        L.Store("Y", tx, L.Load("S", L.binary("-", 3, tx))))))
    return func(body)


def test_shared_memory_with_barrier_works():
    assert np.array_equal(emulate(reverse_through_shared(True), {"X": X})["Y"], X[::-1])


def test_missing_barrier_is_reported_as_a_race():
    with pytest.raises(EmulatorError, match="data race"):
        emulate(reverse_through_shared(False), {"X": X})


def test_out_of_bounds_read_is_reported():
    body = threads(L.Store("Y", tx, L.Load("X", L.binary("+", tx, 1))))
    with pytest.raises(EmulatorError, match=r"out-of-bounds read of X\[4\]"):
        emulate(func(body), {"X": X})


def test_guarded_read_is_fine_and_unwritten_outputs_stay_nan():
    cond = L.Bin("<", tx, L.const(2), "bool")
    body = threads(L.IfThenElse(cond, L.Store("Y", tx, L.Load("X", L.binary("+", tx, 5)))))
    with pytest.raises(EmulatorError, match="out-of-bounds"):
        emulate(func(body), {"X": X})
    body = threads(L.IfThenElse(cond, L.Store("Y", tx, L.Load("X", tx))))
    out = emulate(func(body), {"X": X})["Y"]
    assert np.array_equal(out[:2], X[:2]) and np.isnan(out[2:]).all()


def test_divergent_barrier_and_duplicate_writes_are_reported():
    cond = L.Bin("<", tx, L.const(2), "bool")
    with pytest.raises(EmulatorError, match="part of a block"):
        emulate(func(threads(L.IfThenElse(cond, L.Barrier()))), {"X": X})
    with pytest.raises(EmulatorError, match="same element"):
        emulate(func(threads(L.Store("Y", L.const(0), L.Load("X", tx)))), {"X": X})


def test_blocks_have_their_own_shared_memory():
    n = 8
    shared = L.Buffer("S", "f32", (4,), "shared")
    gid = L.binary("+", L.binary("*", bx, 4), tx)
    body = L.seq(L.Allocate(shared), L.For(bx, 2, threads(L.seq(
        L.Store("S", tx, L.Load("X", gid)), L.Barrier(),
        L.Store("Y", gid, L.Load("S", L.binary("-", 3, tx))))), "blockIdx.x"))
    x = np.arange(n, dtype=np.float32)
    out = emulate(func(body, n), {"X": x})["Y"]
    assert np.array_equal(out, np.concatenate([x[3::-1], x[:3:-1]]))


def _drop_barriers(stmt):
    if isinstance(stmt, L.Seq):
        return L.seq(*[_drop_barriers(s) for s in stmt.stmts if not isinstance(s, L.Barrier)])
    if isinstance(stmt, (L.For, L.IfThenElse)):
        field = "body" if isinstance(stmt, L.For) else "then"
        return dataclasses.replace(stmt, **{field: _drop_barriers(getattr(stmt, field))})
    return stmt


def conv_workload():
    op = load_operator("conv2d")
    rng = np.random.default_rng(5)
    arrays = {"X": rng.standard_normal((1, 4, 6, 7)).astype(np.float32),
              "Wt": rng.standard_normal((4, 4, 3, 3)).astype(np.float32)}
    scalars = {"pad_t": 1, "pad_l": 1, "pad_b": 1, "pad_r": 1}
    bindings = C.infer_bindings(op, arrays, scalars)
    return op, bindings, arrays, C.evaluate(op, arrays, bindings)["Y"]


def test_conv_with_shared_caches_needs_its_barriers():
    op, bindings, arrays, ref = conv_workload()
    config = {"threads_x": 4, "threads_y": 2, "tile_k": 2, "block_k": 2, "tile_c": 2,
              "cache_input": 1, "cache_weight": 1}
    lowered = lower_for(op, bindings, config, "cuda")
    assert relative_l2(emulate(lowered, arrays)["Y"], ref) < 1e-5
    kernel = lowered.kernels[0]
    broken = dataclasses.replace(lowered, kernels=(dataclasses.replace(
        kernel, body=_drop_barriers(kernel.body)),))
    with pytest.raises(EmulatorError, match="data race"):
        emulate(broken, arrays)


def test_cuda_kernel_object_emulates_and_exposes_python_source():
    op, bindings, arrays, ref = conv_workload()
    kernel = build_cuda(op, bindings, compile=False)
    assert relative_l2(kernel.emulate(**arrays)["Y"], ref) < 1e-5
    assert kernel.launch.grid[0] >= 1
    assert "def _kernel" in kernel_source(kernel.func.kernels[0], {})


def _read_then_write(reader_index: L.Expr, writer_cond: L.Expr) -> L.PrimFunc:
    """S filled and synchronised; every thread reads S[reader_index] into Y, then the
    threads where `writer_cond` holds overwrite S[0] with no barrier in between."""
    shared = L.Buffer("S", "f32", (4,), "shared")
    body = L.seq(L.Allocate(shared), threads(L.seq(
        L.Store("S", tx, L.Load("X", tx)), L.Barrier(),
        L.Store("Y", tx, L.Load("S", reader_index)),
        L.IfThenElse(writer_cond, L.Store("S", L.const(0), L.Load("X", tx))))))
    return func(body)


def test_write_after_a_read_by_other_threads_is_a_race():
    one = L.Bin("==", tx, L.const(1), "bool")
    with pytest.raises(EmulatorError, match="data race"):   # threads 0-3 read S[0]
        emulate(_read_then_write(L.const(0), one), {"X": X})
    pairs = L.binary("*", L.binary("//", tx, 2), 2)          # threads 0 and 1 read S[0]
    with pytest.raises(EmulatorError, match="data race"):   # and thread 1 writes it
        emulate(_read_then_write(pairs, one), {"X": X})
    zero = L.Bin("==", tx, L.const(0), "bool")
    with pytest.raises(EmulatorError, match="data race"):   # thread 0 read it: 1 writes
        emulate(_read_then_write(tx, one), {"X": X})
    # thread 0 alone read S[0] and thread 0 alone writes it: no race
    out = emulate(_read_then_write(tx, zero), {"X": X})["Y"]
    assert np.array_equal(out, X)


def test_duplicate_shared_stores_in_one_statement_are_a_race():
    shared = L.Buffer("S", "f32", (4,), "shared")
    body = L.seq(L.Allocate(shared), threads(L.seq(
        L.Store("S", L.const(0), L.Load("X", tx)), L.Barrier(),
        L.Store("Y", tx, L.Load("S", L.const(0))))))
    with pytest.raises(EmulatorError, match="data race"):
        emulate(func(body), {"X": X})
