"""Offline CUDA checks: the analytical model on hand-computed cases, resource rejection,
sampled-block emulator verification (a correct kernel passes, an off-by-one one fails),
the GPU-presence errors and cubin arch decoding. No GPU needed."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import pytest

from wpk.core.devices import DetectedGpu, gpu_preset
from wpk.core.errors import DeviceError, OptionError
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.dsl import loopir as L
from wpk.dsl.codegen_cuda import KernelLaunch
from wpk.dsl.templates import LaunchConfig
from wpk.dsl.toolchain_cuda import ResourceUsage
from wpk.kernels.cuda import analytic
from wpk.kernels.cuda.generated import DSL_CUDA, build_for, cuda_template, preferred_configs
from wpk.kernels.cuda.offline import check_usage, cubin_arch, sample_blocks, verify_emulated
from wpk.kernels.cuda.target import CudaTarget, preset_to_build_for
from wpk.kernels.registry import Candidate
from wpk.search.predicted import PredictedRunner, verify_generated

H100, P100, T4 = gpu_preset("h100"), gpu_preset("p100"), gpu_preset("t4")


def _gemm(m, n, k) -> Workload:
    return Workload("Gemm", (TensorSpec((m, k)), TensorSpec((k, n))), (TensorSpec((m, n)),))


def _conv(c=8, k=16, size=20) -> Workload:
    return Workload("Conv", (TensorSpec((1, c, size, size)), TensorSpec((k, c, 3, 3))),
                    (TensorSpec((1, k, size, size)),), (("pads", (1, 1, 1, 1)),))


# ----------------------------------------------------------------------------- analytic model
def test_occupancy_hand_computed():
    # 256 threads = 8 warps; 2048/256 = 8 blocks by threads; 32 regs -> 1024 per warp ->
    # 65536 / (1024 * 8) = 8 blocks by registers: 64 of 64 warps.
    occ = analytic.occupancy(H100, threads=256, registers=32, shared_bytes=0)
    assert (occ.blocks_per_sm, occ.occupancy) == (8, 1.0)
    # 128 regs -> 4096 per warp -> 65536 / (4096 * 8) = 2 blocks: 16/64 warps.
    occ = analytic.occupancy(H100, threads=256, registers=128, shared_bytes=0)
    assert (occ.blocks_per_sm, occ.limited_by, occ.occupancy) == (2, "registers", 0.25)
    # P100: 64 KiB shared per SM, 40 KiB per block -> 1 block of 4 warps: 4/64.
    occ = analytic.occupancy(P100, threads=128, registers=16, shared_bytes=40 * 1024)
    assert (occ.blocks_per_sm, occ.limited_by) == (1, "shared memory")
    assert occ.occupancy == pytest.approx(4 / 64)
    # T4 (sm_75): at most 16 blocks and 32 warps per SM: 32-thread blocks give 16/32.
    occ = analytic.occupancy(T4, threads=32, registers=16, shared_bytes=0)
    assert (occ.blocks_per_sm, occ.limited_by, occ.occupancy) == (16, "blocks", 0.5)


def test_workload_work_and_roofline_hand_computed():
    flops, nbytes = analytic.workload_work(_gemm(1024, 1024, 1024))
    assert flops == 2 * 1024 ** 3
    assert nbytes == 3 * 1024 * 1024 * 4
    # H100: compute 2.147e9 / 67e12 = 32.05 us > memory 12.6e6 / 3.35e12 = 3.76 us.
    assert analytic.roofline_seconds(flops, nbytes, H100) == pytest.approx(2 * 1024 ** 3 / 67e12)
    conv_flops, conv_bytes = analytic.workload_work(_conv(8, 16, 20))
    assert conv_flops == 2 * 16 * 20 * 20 * 8 * 9
    assert conv_bytes == 4 * (8 * 400 + 16 * 8 * 9 + 16 * 400)
    # An elementwise op is memory bound: 2 x 4 MiB over 732 GB/s on a P100.
    relu = Workload("Relu", (TensorSpec((1 << 20,)),), (TensorSpec((1 << 20,)),))
    assert analytic.roofline_seconds(*analytic.workload_work(relu), P100) == \
        pytest.approx(8 * 2 ** 20 / 732e9)


def test_vendor_prediction_is_roofline_at_stated_efficiency():
    w = _gemm(1024, 1024, 1024)
    roof = 2 * 1024 ** 3 / 67e12
    got = analytic.predict_vendor(w, H100, "cublas")
    assert got.seconds == pytest.approx(roof / analytic.VENDOR_EFFICIENCY["cublas"]
                                        + analytic.LAUNCH_OVERHEAD_S)
    with_epilogue = dataclasses.replace(w, epilogue=(
        EpilogueStep("sigmoid"),))
    extra = 2 * 1024 * 1024 * 4 / 3350e9 + analytic.LAUNCH_OVERHEAD_S
    assert analytic.predict_vendor(with_epilogue, H100, "cublas").seconds == \
        pytest.approx(got.seconds + extra, rel=1e-3)


def test_generated_prediction_waves_and_occupancy():
    w = _gemm(1024, 1024, 1024)
    roof = 2 * 1024 ** 3 / 67e12
    usage = {"k": ResourceUsage(registers=32)}
    # 264 blocks of 256 threads: 8 per SM x 132 SMs = 1056 per wave -> 1 wave, 1/4 full.
    quarter = [KernelLaunch("k", LaunchConfig((264, 1, 1), (256, 1, 1), 0))]
    got = analytic.predict_generated(w, H100, quarter, usage)
    assert got.waves == 1 and got.occupancy == 1.0
    assert got.efficiency == pytest.approx(analytic.GENERATED_EFFICIENCY * 0.25)
    assert got.seconds == pytest.approx(roof / got.efficiency + analytic.LAUNCH_OVERHEAD_S)
    # 2112 blocks: exactly 2 full waves -> efficiency GENERATED_EFFICIENCY, 4x faster.
    full = [KernelLaunch("k", LaunchConfig((2112, 1, 1), (256, 1, 1), 0))]
    assert analytic.predict_generated(w, H100, full, usage).efficiency == \
        pytest.approx(analytic.GENERATED_EFFICIENCY)
    # Spilling halves the efficiency.
    spilled = {"k": ResourceUsage(registers=32, spill_stores=8)}
    assert analytic.predict_generated(w, H100, full, spilled).efficiency == \
        pytest.approx(analytic.GENERATED_EFFICIENCY * analytic.SPILL_FACTOR)


def _softmax(rows: int, length: int) -> Workload:
    return Workload("Softmax", (TensorSpec((rows, length)),), (TensorSpec((rows, length)),),
                    (("axis", 1),), opset=13)


def test_one_threads_chain_of_global_loads_bounds_a_kernel():
    # Softmax over 1x1000, one thread per row: the max and the sum each read 1000
    # elements in a serial loop; cut into 50 parts (the largest divisor of 1000 up to
    # 64), each part reads 20 and the parts' reduction 50.
    from wpk.kernels.cuda.traffic import SERIAL_LOAD_CYCLES, kernel_work, latency_seconds

    w = _softmax(1, 1000)
    serial = {k.name: kernel_work(k).serial_loads for k in build_for(
        w, dict(threads=32, per_thread=1, reduce_parts=1, gpu="h100"), compile=False).func.kernels}
    assert sorted(serial.values()) == [1, 1000, 1000]
    split = {k.name: kernel_work(k).serial_loads for k in build_for(
        w, dict(threads=32, per_thread=1, reduce_parts=64, gpu="h100"), compile=False).func.kernels}
    assert sorted(split.values()) == [1, 20, 20, 50, 50]
    clock = H100.fp32_tflops * 1e12 / (H100.sm_count * 2 * 128)
    work = next(kernel_work(k) for k in build_for(
        w, dict(threads=32, per_thread=1, reduce_parts=1, gpu="h100"),
        compile=False).func.kernels if kernel_work(k).serial_loads == 1000)
    assert latency_seconds(work, H100) == pytest.approx(1000 * SERIAL_LOAD_CYCLES / clock)


def test_a_long_row_is_reduced_in_parts_on_the_gpu():
    # AlexNet's classifier Softmax (1x1000) took 122 us on an H200 with one thread
    # reducing the row; offline builds now offer it cut into parts, and predict that
    # faster.
    w = _softmax(1, 1000)
    configs = preferred_configs(w, H100, 3)
    assert configs[0]["reduce_parts"] > 1 and any(c["reduce_parts"] == 1 for c in configs)
    runner = PredictedRunner(H100)
    times = {}
    for config in configs:
        m = runner.measure(w, Candidate(DSL_CUDA, config))
        assert m.ok and m.rel_l2_error < 1e-5, (config, m.message)
        times[config["reduce_parts"]] = m.median_s
    assert times[configs[0]["reduce_parts"]] * 3 < times[1], times
    # reports name the choice
    assert DSL_CUDA.algorithm(w, configs[0]) == \
        f"split reduction, up to {configs[0]['reduce_parts']} parts"
    assert DSL_CUDA.algorithm(w, dict(configs[0], reduce_parts=1)) == "dsl.cuda"
    # many short rows fill the GPU with one thread per row: nothing to split
    assert "reduce_parts" not in cuda_template(_softmax(8192, 100), H100).space()


@pytest.mark.parametrize("op, bindings, parts", [
    ("softmax", {"N": 3, "D": 1000}, 64),        # 50 parts of 20
    ("softmax", {"N": 2, "D": 997}, 64),         # a prime row: one thread, not split
    ("log_softmax", {"N": 5, "D": 96}, 16),
    ("layernorm", {"N": 7, "D": 768, "eps": 1e-5}, 256),
])
def test_reductions_in_parts_match_numpy_in_the_emulator(op, bindings, parts):
    from wpk.kernels.dsl_library import load_operator
    from wpk.kernels.templates import emulate_cuda

    rng = np.random.default_rng(6)
    rows, length = bindings["N"], bindings["D"]
    x = rng.standard_normal((rows, length)).astype(np.float32)
    arrays = {"X": x}
    x64 = x.astype(np.float64)
    if op == "layernorm":
        arrays.update(Gamma=rng.standard_normal(length).astype(np.float32),
                      Beta=rng.standard_normal(length).astype(np.float32))
        mean = x64.mean(1, keepdims=True)
        expected = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(1, keepdims=True) + 1e-5) \
            * arrays["Gamma"] + arrays["Beta"]
    else:
        shifted = x64 - x64.max(1, keepdims=True)
        log_sum = np.log(np.exp(shifted).sum(1, keepdims=True))
        expected = shifted - log_sum if op == "log_softmax" else np.exp(shifted - log_sum)
    config = {"threads": 32, "per_thread": 2, "reduce_parts": parts}
    got = emulate_cuda(load_operator(op), bindings, config, arrays, H100)["Y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- resources
def test_ptxas_usage_over_the_preset_is_rejected():
    launch = [KernelLaunch("wpk_k", LaunchConfig((10, 1, 1), (512, 1, 1), 0))]
    assert check_usage({"wpk_k": ResourceUsage(registers=64)}, launch, H100) is None
    reason = check_usage({"wpk_k": ResourceUsage(registers=255)}, launch, H100)
    assert "255 registers x 512 threads" in reason and "65536" in reason
    reason = check_usage({"wpk_k": ResourceUsage(registers=32, shared_bytes=64 * 1024)},
                         launch, P100)
    assert "65536 bytes of shared memory" in reason and "p100" in reason


@pytest.mark.private_compile_cache   # nothing compiled: a cache no other test writes to
def test_config_over_the_shared_memory_limit_is_rejected_before_compiling():
    w = Workload("Conv", (TensorSpec((1, 64, 28, 28)), TensorSpec((128, 64, 3, 3))),
                 (TensorSpec((1, 128, 28, 28)),), (("pads", (1, 1, 1, 1)),))
    config = dict(threads_x=8, threads_y=8, tile_k=16, block_k=4, tile_c=32, cache_input=1,
                  cache_weight=1, gpu="p100")
    cache = os.environ["WPK_CACHE_DIR"]
    before = sorted(str(p) for p in Path(cache).rglob("cu_*"))
    result = PredictedRunner(P100).measure(w, Candidate(DSL_CUDA, config))
    assert result.status.value == "compile_error"
    assert "rejected before compiling" in result.message and "49152" in result.message
    after = sorted(str(p) for p in Path(cache).rglob("cu_*"))
    assert after == before   # nothing was compiled


# ----------------------------------------------------------------------------- emulator
def _shift_input_loads(stmt, buffer: str):
    """The loop IR with every load of `buffer` reading one element further (off by one)."""
    def expr(e):
        if isinstance(e, L.Load) and e.buffer == buffer:
            return dataclasses.replace(e, index=L.add(expr(e.index), 1))
        if dataclasses.is_dataclass(e) and isinstance(e, L.Expr):
            return dataclasses.replace(e, **{f.name: _visit(getattr(e, f.name), expr)
                                             for f in dataclasses.fields(e)})
        return e

    return _visit(stmt, expr)


def _visit(node, expr):
    if isinstance(node, L.Expr):
        return expr(node)
    if isinstance(node, tuple):
        return tuple(_visit(n, expr) for n in node)
    if dataclasses.is_dataclass(node) and isinstance(node, (L.Stmt, L.Kernel)):
        return dataclasses.replace(node, **{f.name: _visit(getattr(node, f.name), expr)
                                            for f in dataclasses.fields(node)})
    return node


def test_sampled_emulation_passes_correct_kernel_and_catches_off_by_one():
    w = _conv(8, 16, 20)
    config = dict(threads_x=4, threads_y=4, tile_k=4, block_k=1, tile_c=8, cache_input=0,
                  cache_weight=0, gpu="h100")
    built = build_for(w, config, compile=False)
    assert math.prod(built.launches[-1].launch.grid) > 16   # big enough to be sampled
    good = verify_generated(w, built, seed=1)
    assert good.ok and good.sampled and good.elements > 0, good
    assert good.rel_l2_error < 1e-5
    kernels = tuple(dataclasses.replace(k, body=_shift_input_loads(k.body, "X"))
                    for k in built.func.kernels)
    built.func = dataclasses.replace(built.func, kernels=kernels)
    bad = verify_generated(w, built, seed=1)
    assert not bad.ok
    assert "relative L2 error" in bad.message or "out-of-bounds" in bad.message


def test_full_emulation_reports_unwritten_outputs():
    w = Workload("Relu", (TensorSpec((40,)),), (TensorSpec((40,)),))
    built = build_for(w, dict(threads=32, per_thread=1, gpu="t4"), compile=False)
    x = np.random.default_rng(0).standard_normal(40).astype(np.float32)
    ok = verify_emulated(built.func, {"X": x}, {"Y": np.maximum(x, 0)})
    assert ok.ok and not ok.sampled and ok.elements == 40
    wrong = verify_emulated(built.func, {"X": x}, {"Y": np.maximum(x, 0) + 1})
    assert not wrong.ok and "relative L2" in wrong.message


def test_sample_blocks_covers_first_last_and_edges():
    blocks = sample_blocks((10, 4, 2), np.random.default_rng(0), count=3)
    assert {0, 79, 9, 30, 40} <= set(blocks)
    assert len(blocks) <= 8 and all(0 <= b < 80 for b in blocks)
    assert blocks == sample_blocks((10, 4, 2), np.random.default_rng(0), count=3)


# ----------------------------------------------------------------------------- compile + arch
@pytest.mark.parametrize("preset, arch", [("h100", "sm_90"), ("p100", "sm_60")])
def test_generated_kernel_compiles_for_the_preset_arch(preset, arch):
    w = Workload("Relu", (TensorSpec((1000,)),), (TensorSpec((1000,)),))
    gpu = gpu_preset(preset)
    configs = preferred_configs(w, gpu, count=2)
    assert configs and all(c["gpu"] == preset for c in configs)
    built = build_for(w, configs[0])
    assert built.binary.arch == arch and cubin_arch(built.binary.cubin) == arch
    result = PredictedRunner(gpu).measure(w, Candidate(DSL_CUDA, configs[0]))
    assert result.ok and result.extra["predicted"] and result.extra["arch"] == arch
    assert "emulator" in result.message and result.median_s > 0


# ----------------------------------------------------------------------------- presence
def _a100():
    return DetectedGpu(0, "NVIDIA A100-SXM4-80GB", (8, 0), 80 << 30, "a100")


def test_absent_gpu_without_offline_names_both():
    with pytest.raises(DeviceError) as info:
        preset_to_build_for("h100", offline=False, present=[])
    assert "h100" in info.value.message and "no GPU present" in info.value.message
    assert "--offline" in info.value.hint
    with pytest.raises(DeviceError) as info:
        preset_to_build_for("h100", offline=False, present=[_a100()])
    assert "found NVIDIA A100-SXM4-80GB (sm_80), not h100" in info.value.message
    assert preset_to_build_for("h100", offline=True, present=[]).name == "h100"
    assert preset_to_build_for("a100", offline=False, present=[_a100()]).name == "a100"
    assert preset_to_build_for("auto", offline=False, present=[_a100()]).name == "a100"
    with pytest.raises(OptionError):
        preset_to_build_for("auto", offline=True, present=[])


# ----------------------------------------------------------------------------- other steps
def offline_candidates(workload, gpu, count=None):
    return CudaTarget.for_preset(gpu, predicted=True).candidates(workload, count)


def test_offline_candidates_keep_every_plan_complete():
    conv = {c.implementation.name for c in offline_candidates(_conv(), H100, 2)}
    assert conv == {"dsl.cuda", "cuda.cudnn.predicted"}
    cat = Workload("Concat", (TensorSpec((1, 2, 3)), TensorSpec((1, 4, 3))),
                   (TensorSpec((1, 6, 3)),), (("axis", 1),))
    assert [c.implementation.name for c in offline_candidates(cat, H100)] == ["cuda.copy"]
    sin = Workload("Sin", (TensorSpec((5,)),), (TensorSpec((5,)),))
    (host,) = offline_candidates(sin, H100)
    assert host.implementation.name == "cuda.host" and host.implementation.kind == "fallback"
    assert analytic.predict_host(sin).seconds == pytest.approx(
        40 / (analytic.HOST_LINK_GBS * 1e9) + analytic.HOST_SYNC_S)


def test_lrn_runs_on_the_device_not_the_host():
    # AlexNet's first LRN: on an H200 it ran on the host between CUDA graphs, 4.8x slower
    # than PyTorch end to end, until LRN became a DSL operator.
    lrn = Workload("LRN", (TensorSpec((1, 96, 54, 54)),), (TensorSpec((1, 96, 54, 54)),),
                   (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0), ("size", 5)))
    names = [c.implementation.name for c in offline_candidates(lrn, H100)]
    assert names and set(names) == {"dsl.cuda"}
    config = preferred_configs(lrn, H100)[0]
    result = verify_generated(lrn, build_for(lrn, config, compile=False), seed=3)
    assert result.ok and result.rel_l2_error < 1e-5, result


def test_a_batchnorm_left_after_a_concat_runs_on_the_device():
    # DenseNet-121's pre-activation BNs follow Concats, so no conv absorbs them: its h200
    # plan ran 62 of them on the host until BatchNormalization became a DSL operator.
    bn = Workload("BatchNormalization", (TensorSpec((1, 288, 28, 28)),) + tuple(
        TensorSpec((288,)) for _ in range(4)), (TensorSpec((1, 288, 28, 28)),),
        (("epsilon", 1e-5),), (EpilogueStep("relu"),), const_inputs=(1, 2, 3, 4))
    names = [c.implementation.name for c in offline_candidates(bn, H100)]
    assert names and set(names) == {"dsl.cuda"}
    config = preferred_configs(bn, H100)[0]
    result = verify_generated(bn, build_for(bn, config, compile=False), seed=4)
    assert result.ok and result.rel_l2_error < 1e-5, result


@pytest.mark.parametrize("workload", [
    # a diffusion UNet's GroupNorm with its SiLU (32 groups of 2 channels)
    Workload("GroupNorm", (TensorSpec((1, 64, 12, 10)), TensorSpec((64,)), TensorSpec((64,))),
             (TensorSpec((1, 64, 12, 10)),), (("epsilon", 1e-5), ("groups", 32)),
             (EpilogueStep("silu"),), domain="wpk", const_inputs=(1, 2)),
    # odd sizes, batch 2, rank 5
    Workload("InstanceNormalization", (TensorSpec((2, 6, 3, 7, 5)), TensorSpec((6,)),
                                       TensorSpec((6,))), (TensorSpec((2, 6, 3, 7, 5)),),
             (("epsilon", 1e-3),), const_inputs=(1, 2)),
], ids=["GroupNorm+SiLU", "InstanceNormalization"])
def test_normalizations_run_on_the_device(workload):
    # the UNet's GroupNorms ran on the host (cuda.host) until `groupnorm` became a DSL
    # operator
    names = [c.implementation.name for c in offline_candidates(workload, H100)]
    assert names and set(names) == {"dsl.cuda"}, names
    for gpu in (H100, P100, T4):
        config = preferred_configs(workload, gpu)[0]
        result = verify_generated(workload, build_for(workload, config, compile=False), seed=6)
        assert result.ok and result.rel_l2_error < 1e-5, (gpu.name, result)


@pytest.mark.parametrize("workload", [
    Workload("ReduceMean", (TensorSpec((1, 64, 7, 7)),), (TensorSpec((1, 64, 1, 1)),),
             (("axes", (2, 3)),)),
    Workload("Slice", (TensorSpec((1, 64, 20, 20)),) + (TensorSpec((1,), "int64"),) * 3,
             (TensorSpec((1, 32, 20, 20)),), const_inputs=(1, 2, 3), opset=13,
             static_inputs=((1, np.array([32])), (2, np.array([64])), (3, np.array([1])))),
    Workload("Resize", (TensorSpec((1, 32, 10, 10)), None, TensorSpec((4,))),
             (TensorSpec((1, 32, 20, 20)),), (("mode", b"nearest"),), const_inputs=(2,),
             static_inputs=((2, np.array([1, 1, 2, 2], np.float32)),), opset=13),
    Workload("ConvTranspose", (TensorSpec((1, 32, 20, 20)), TensorSpec((32, 16, 2, 2)),
                               TensorSpec((16,))), (TensorSpec((1, 16, 40, 40)),),
             (("strides", (2, 2)),), const_inputs=(1, 2)),
    Workload("Resize", (TensorSpec((1, 16, 10, 12)), None, TensorSpec((4,))),
             (TensorSpec((1, 16, 20, 24)),), (("mode", b"linear"),), const_inputs=(2,),
             static_inputs=((2, np.array([1, 1, 2, 2], np.float32)),), opset=13),
    Workload("Resize", (TensorSpec((1, 8, 9, 7)), None, None, TensorSpec((4,), "int64")),
             (TensorSpec((1, 8, 13, 16)),),
             (("coordinate_transformation_mode", b"align_corners"), ("mode", b"cubic")),
             const_inputs=(3,), static_inputs=((3, np.array([1, 8, 13, 16])),), opset=13),
], ids=["ReduceMean", "Slice", "Resize", "ConvTranspose", "Resize linear", "Resize cubic"])
def test_the_exporters_reductions_and_copies_run_on_the_device(workload):
    # an offline audit of the corpus's h200 plans found these on the host
    # (ConvTranspose: the DB text detectors' upsampling head)
    names = {c.implementation.name for c in offline_candidates(workload, H100)}
    assert "dsl.cuda" in names and "cuda.host" not in names, names
    config = preferred_configs(workload, H100)[0]
    result = verify_generated(workload, build_for(workload, config, compile=False), seed=5)
    assert result.ok and result.rel_l2_error < 1e-5, result


def test_device_copy_splits_and_gathers_into_its_outputs():
    # the YOLOs' and transformers' Splits and the ViTs' class-token Gather: host steps
    # of the corpus's h200 plans before
    from wpk.kernels.cuda.predicted import DEVICE_COPY

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 6, 4, 5)).astype(np.float32)
    split = Workload("Split", (TensorSpec((1, 6, 4, 5)),),
                     (TensorSpec((1, 2, 4, 5)), TensorSpec((1, 4, 4, 5))), (("axis", 1),))
    outs = [np.full(o.shape, np.nan, np.float32) for o in split.outputs]
    DEVICE_COPY.prepare(split, {}, {})([x], outs)
    np.testing.assert_array_equal(outs[0], x[:, :2])
    np.testing.assert_array_equal(outs[1], x[:, 2:])
    for index in (np.array(0), np.array([3, -1, 0])):
        gather = Workload("Gather", (TensorSpec((1, 6, 4, 5)), TensorSpec(index.shape, "int64")),
                          (TensorSpec((1,) + index.shape + (4, 5)),), (("axis", 1),),
                          const_inputs=(1,), static_inputs=((1, index),))
        assert DEVICE_COPY.unsupported_reason(gather) is None
        out = np.full(gather.outputs[0].shape, np.nan, np.float32)
        DEVICE_COPY.prepare(gather, {1: index}, {})([x, index], [out])
        np.testing.assert_array_equal(out, np.take(x, index, axis=1))
    computed = Workload("Gather", (TensorSpec((6, 5)), TensorSpec((2,), "int64")),
                        (TensorSpec((2, 5)),))
    assert "computed indices" in DEVICE_COPY.unsupported_reason(computed)


def test_device_copy_and_host_step_compute_on_numpy_arrays():
    from wpk.kernels.cuda.predicted import DEVICE_COPY, HOST_STEP, host_config

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 2, 3)), rng.standard_normal((1, 4, 3))
    cat = Workload("Concat", (TensorSpec((1, 2, 3)), TensorSpec((1, 4, 3))),
                   (TensorSpec((1, 6, 3)),), (("axis", -2),))
    out = np.full((1, 6, 3), np.nan, np.float32)
    DEVICE_COPY.prepare(cat, {}, {})([a, b], [out])
    np.testing.assert_allclose(out, np.concatenate([a, b], axis=1), rtol=1e-6)
    tr = Workload("Transpose", (TensorSpec((2, 3)),), (TensorSpec((3, 2)),), (("perm", (1, 0)),))
    out = np.full((3, 2), np.nan, np.float32)
    DEVICE_COPY.prepare(tr, {}, {})([a[0, :, :]], [out])
    np.testing.assert_allclose(out, a[0].T, rtol=1e-6)
    sin = Workload("Sin", (TensorSpec((5,)),), (TensorSpec((5,)),))
    x = rng.standard_normal(5).astype(np.float32)
    out = np.full(5, np.nan, np.float32)
    HOST_STEP.prepare(sin, {}, host_config(sin))([x], [out])
    np.testing.assert_allclose(out, np.sin(x), rtol=1e-5)


def test_measured_candidates_leave_out_the_predicted_placeholders():
    names = [c.implementation.name for c in CudaTarget.for_preset(H100).candidates(_conv(), 2)]
    assert "dsl.cuda" in names and not any(n.endswith(".predicted") for n in names)
