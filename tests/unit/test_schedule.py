"""Schedule primitives and templates: loop structure, knob spaces from the hardware spec,
and validation that rejects bad configs with a reason before anything is compiled."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from wpk.core.devices import gpu_preset, host_cpu
from wpk.core.errors import ScheduleError
from wpk.dsl import compute as C
from wpk.dsl import loopir as L
from wpk.dsl.schedule import Schedule
from wpk.dsl.templates import GenericTemplate, Limits
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.templates import build_cuda, template_for
from wpk.kernels.templates.conv import ConvTemplate

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa


def specialized(name: str, shapes: dict, **scalars) -> tuple[C.Operator, dict]:
    op = load_operator(name)
    arrays = {k: np.zeros(v, np.float32) for k, v in shapes.items()}
    bindings = C.infer_bindings(op, arrays, scalars)
    return C.specialize(op, bindings), bindings


def conv_op(c=64, h=28, k=64, r=3, **scalars):
    return specialized("conv2d_bias", {"X": (1, c, h, h), "Wt": (k, c // scalars.get(
        "groups", 1), r, r), "B": (k,)}, **scalars)


def test_split_fuse_reorder_define_the_loop_nest():
    op, _ = specialized("matmul", {"A": (10, 7), "B": (7, 12)})
    s = Schedule(op)["Y"]
    mo, mi = s.split("m", 4)
    fused = s.fuse(mo, mi)
    assert s.axes[fused].extent == 12  # ceil(10 / 4) * 4
    fo, fi = s.split(fused, 3)
    s.reorder("k", fo)
    assert s.order == ["k", fi, "n"] or s.order[:2] == ["k", fo] or "k" in s.order
    exprs = s.root_expressions()
    # m is recovered from the fused loop: (fo * 3 + fi) // 4 * 4 + ... % 4
    assert L.free_vars(exprs["m"]) == {fo.replace(".", "_").replace("*", "_"),
                                       fi.replace(".", "_").replace("*", "_")}
    assert len(s.predicates()) == 1  # only the split of m (10 by 4) leaves a remainder


def test_primitives_reject_misuse_with_schedule_errors():
    op, _ = specialized("matmul", {"A": (8, 8), "B": (8, 8)})
    s = Schedule(op)["Y"]
    with pytest.raises(ScheduleError, match="not a loop"):
        s.split("z", 2)
    with pytest.raises(ScheduleError, match="adjacent"):
        s.fuse("m", "k")
    with pytest.raises(ScheduleError, match="spatial and a reduce"):
        s.fuse("n", "k")
    with pytest.raises(ScheduleError):
        s.bind("m", "warpIdx.x")
    with pytest.raises(ScheduleError):
        Schedule(op)["nope"]


def test_template_choice_and_knob_spaces_follow_the_hardware():
    op, _ = conv_op()
    assert isinstance(template_for(op, "cpu"), ConvTemplate)
    mm, _ = specialized("matmul", {"A": (8, 8), "B": (8, 8)})
    assert isinstance(template_for(mm, "cpu"), GenericTemplate)
    avx512 = template_for(op, "cpu", host_cpu()).space()
    avx2 = template_for(op, "cpu", Limits(vector_lanes=8, vector_registers=16)).space()
    assert max(avx2["tile_x"]) < max(avx512["tile_x"]) or host_cpu().vector_lanes <= 8
    small = template_for(mm, "cuda", Limits(name="tiny", max_threads_per_block=64)).space()
    assert max(small["threads"]) == 64
    assert list(template_for(op, "cuda", gpu_preset("h100")).space()) == [
        "threads_x", "threads_y", "tile_k", "block_k", "tile_c", "cache_input", "cache_weight",
        "tile_x", "fuse_yx", "split_c"]


def test_validate_rejects_resource_overflows_with_reasons():
    op, _ = conv_op(c=64, h=28, k=64)
    gpu = template_for(op, "cuda", gpu_preset("p100"))
    base = {"threads_x": 32, "threads_y": 16, "tile_k": 4, "block_k": 8, "tile_c": 32,
            "cache_input": 1, "cache_weight": 1}
    reason = gpu.validate(base)
    assert reason is not None and "threads per block" in reason
    big_smem = dict(base, threads_y=2, block_k=1, tile_k=16)
    reason = gpu.validate(dict(big_smem, tile_c=64))
    assert reason is not None and "shared memory" in reason
    regs = dict(base, threads_x=32, threads_y=8, block_k=1, tile_k=16, cache_input=0,
                cache_weight=0, tile_c=1)
    tight = template_for(op, "cuda", Limits(name="tight", registers_per_block=8192))
    assert "register" in tight.validate(regs)
    assert "not one of" in gpu.validate(dict(base, tile_k=3))
    assert "missing knob" in gpu.validate({"threads_x": 4})


# The same CPU seen with AVX-512 (16 lanes, 32 vector registers) and AVX2 only (8, 16), so
# the knob spaces and register checks of both are exercised on any host.
CPU_ISAS = {"avx512": ("avx512f", 512, 32), "avx2": ("avx2", 256, 16)}


def cpu_with(isa: str):
    flag, bits, registers = CPU_ISAS[isa]
    flags = tuple(f for f in host_cpu().isa_flags if not f.startswith("avx512")) + (flag,)
    return dataclasses.replace(host_cpu(), isa_flags=flags, vector_bits=bits,
                               vector_registers=registers)


@pytest.mark.parametrize("isa", sorted(CPU_ISAS))
def test_cpu_templates_reject_register_and_unroll_overflows_on_both_isas(isa):
    op, _ = conv_op(c=64, h=28, k=64)
    hw = cpu_with(isa)
    cpu = template_for(op, "cpu", hw)
    cfg = cpu.default_config()
    assert cpu.validate(cfg) is None
    widest = max(cpu.space()["tile_x"])
    assert widest == 2 * hw.vector_lanes
    too_many = dict(cfg, tile_k=16, fuse_yx=0, tile_x=widest, tile_y=4, unroll_window=0)
    assert "vector registers" in cpu.validate(too_many)
    big, _ = conv_op(c=3, h=30, k=64, r=7)
    window = template_for(big, "cpu", hw)
    fits = min(16, hw.vector_registers // 2)  # a tile_k x lanes x 2 tile in the registers
    unrolled = {"tile_k": fits, "fuse_yx": 0, "tile_x": hw.vector_lanes, "tile_y": 2,
                "tile_c": 3, "cache_input": 2, "unroll_window": 1, "k_inner": 0}
    assert "unrolled loops" in window.validate(unrolled)
    assert window.validate(dict(unrolled, unroll_window=0)) is None


def test_invalid_configs_are_rejected_before_compiling(monkeypatch):
    import wpk.dsl.toolchain_cuda as tc

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled an invalid config")

    monkeypatch.setattr(tc, "compile_cuda", no_compile)
    op = load_operator("conv2d")
    _, bindings = conv_op()
    config = {"threads_x": 32, "threads_y": 16, "tile_k": 4, "block_k": 8, "tile_c": 32,
              "cache_input": 1, "cache_weight": 1}
    with pytest.raises(ScheduleError, match="threads per block"):
        build_cuda(op, bindings, config, gpu=gpu_preset("p100"), arch="sm_60")


def test_every_valid_point_lowers_for_a_small_conv():
    op, _ = conv_op(c=4, h=5, k=6)
    for target in ("cpu", "cuda"):
        template = template_for(op, target)
        configs = template.configs(limit=40)
        assert configs and all(template.validate(c) is None for c in configs)
        assert template.space().size() >= len(configs)
