"""Register-tiled CUDA schedules (implicit-GEMM conv, tiled GEMM, split-C/K through rfactor):
the GPU emulator against numpy/float64 on small shapes, old configs keep their meaning,
the preferred configs compile with nvcc (sm_90) and NVRTC + ptxas (sm_60) without spills and
verify on sampled blocks, and the on-chip work count sees the register tile's reuse."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.devices import gpu_preset
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.dsl import compute as C
from wpk.dsl import loopir as L
from wpk.dsl.emulator import emulate
from wpk.dsl.rfactor import rfactor
from wpk.dsl.toolchain_cuda import find_nvcc, nvrtc_available
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.templates import lower_for, template_for

H100 = gpu_preset("h100")
PAD1 = {"pad_t": 1, "pad_l": 1, "pad_b": 1, "pad_r": 1}
CONV = {"threads_x": 8, "threads_y": 1, "tile_k": 4, "block_k": 4, "tile_c": 8,
        "cache_input": 1, "cache_weight": 1}
GEMM = {"threads": 64, "per_thread": 1, "tile_m": 2, "tile_n": 2, "threads_m": 4,
        "tile_r": 8, "split_k": 1}


def _arrays(rng, **shapes):
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def _check(name, arrays, scalars, config):
    """Emulate `config` and compare with the float64 reference; returns the loop IR."""
    op = load_operator(name)
    bindings = C.infer_bindings(op, arrays, scalars)
    template = template_for(C.specialize(op, bindings), "cuda", H100)
    assert template.validate(config) is None
    func = lower_for(op, bindings, config, "cuda", H100)
    got = emulate(func, arrays)
    want = C.evaluate(op, arrays, bindings)
    for out, ref in want.items():
        err = np.linalg.norm(got[out] - ref) / np.linalg.norm(ref)
        assert err < 1e-5, f"{name} {config}: relative L2 error {err}"
    return func


def _shared(func) -> dict[str, tuple]:
    return {n.buffer.name: n.buffer.shape for k in func.kernels for n in L.walk(k.body)
            if isinstance(n, L.Allocate) and n.buffer.scope == "shared"}


def test_rfactor_computes_the_same_operator(rng):
    op = load_operator("conv2d_bias_relu_add")
    arrays = _arrays(rng, X=(1, 32, 5, 5), Wt=(8, 32, 3, 3), B=(8,), Res=(1, 8, 5, 5))
    bindings = C.infer_bindings(op, arrays, PAD1)
    spec = C.specialize(op, bindings)
    split = rfactor(spec, "Y", "c", 4)
    assert [s.name for s in split.stages] == ["Y_rf", "Y"]
    want, got = C.evaluate(spec, arrays, {}), C.evaluate(split, arrays, {})
    np.testing.assert_allclose(got["Y"], want["Y"], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("knobs", [
    {"tile_x": 4, "fuse_yx": 1, "split_c": 1},
    {"tile_x": 2, "fuse_yx": 0, "split_c": 1},
    {"tile_x": 2, "fuse_yx": 1, "split_c": 2},
], ids=["fused-1x1", "yx-tiles", "split-c"])
def test_tiled_1x1_conv_matches_numpy(rng, knobs):
    arrays = _arrays(rng, X=(1, 32, 6, 6), Wt=(24, 32, 1, 1), B=(24,))
    func = _check("conv2d_bias", arrays, {}, dict(CONV, **knobs))
    if knobs["fuse_yx"]:  # the fused pixels are staged as one dim: a [tile_c, BN] box
        assert _shared(func)["X_shared"] == (1, 8, 8 * knobs["tile_x"])
    assert len(func.kernels) == (2 if knobs["split_c"] > 1 else 1)


@pytest.mark.parametrize("stride,knobs", [
    (1, {"tile_x": 2, "fuse_yx": 0, "split_c": 1}),
    (2, {"tile_x": 2, "fuse_yx": 1, "split_c": 1, "threads_x": 4}),
    (1, {"tile_x": 4, "fuse_yx": 1, "split_c": 2}),
], ids=["3x3", "3x3-s2-fused", "3x3-split"])
def test_tiled_3x3_conv_with_epilogue_matches_numpy(rng, stride, knobs):
    out = 7 if stride == 1 else 4
    arrays = _arrays(rng, X=(1, 32, 7, 7), Wt=(12, 32, 3, 3), B=(12,), Res=(1, 12, out, out))
    scalars = dict(PAD1, stride_h=stride, stride_w=stride)
    _check("conv2d_bias_relu_add", arrays, scalars, dict(CONV, **knobs))


@pytest.mark.parametrize("name,shapes,knobs", [
    ("matmul", {"A": (10, 40), "B": (40, 24)}, {}),
    ("dense", {"X": (1, 256), "Wt": (40, 256), "B": (40,)},
     {"threads": 32, "tile_m": 1, "threads_m": 1, "tile_r": 16, "split_k": 4}),
    ("gemm_tn", {"A": (64, 5), "B": (64, 24), "C": (5, 24)}, {"tile_r": 0}),
    ("batched_matmul", {"A": (3, 5, 64), "B": (3, 64, 7)}, {"split_k": 2}),
])
def test_tiled_gemm_matches_numpy(rng, name, shapes, knobs):
    _check(name, _arrays(rng, **shapes), {}, dict(GEMM, **knobs))


def test_configs_without_the_new_knobs_keep_their_schedule():
    op = load_operator("conv2d")
    shapes = {"X": np.zeros((1, 8, 9, 9), np.float32), "Wt": np.zeros((16, 8, 3, 3), np.float32)}
    bindings = C.infer_bindings(op, shapes, PAD1)
    old = dict(CONV, tile_c=4)
    new = dict(old, tile_x=1, fuse_yx=0, split_c=1)
    assert L.to_text(lower_for(op, bindings, old, "cuda", H100)) == \
        L.to_text(lower_for(op, bindings, new, "cuda", H100))
    template = template_for(C.specialize(op, bindings), "cuda", H100)
    assert "channels of one" in template.validate(dict(new, tile_c=8, split_c=2)) \
        if 2 in template.space()["split_c"] else True


def test_preferred_points_start_with_register_tiles():
    op = load_operator("conv2d")
    shapes = {"X": np.zeros((1, 64, 14, 14), np.float32),
              "Wt": np.zeros((64, 64, 1, 1), np.float32)}
    template = template_for(C.specialize(op, C.infer_bindings(op, shapes, {})), "cuda", H100)
    first = next(iter(template.preferred_points()))
    assert first["tile_k"] * first["tile_x"] >= 4 and first["cache_input"] == 1
    assert template.validate(first) is None


def test_work_count_sees_the_register_tile():
    from wpk.kernels.cuda.traffic import kernel_work

    op = load_operator("matmul")
    bindings = C.infer_bindings(op, {"A": np.zeros((64, 64)), "B": np.zeros((64, 64))}, {})
    naive = lower_for(op, bindings, {"threads": 64, "per_thread": 1}, "cuda", H100)
    tiled = lower_for(op, bindings, dict(GEMM, tile_m=4, tile_n=4, tile_r=16), "cuda", H100)
    per_flop = [kernel_work(f.kernels[0]).memory_ops / kernel_work(f.kernels[0]).flops
                for f in (naive, tiled)]
    assert per_flop[1] * 2 < per_flop[0]


def _resnet_like(c, k, size, window, epilogue=()):
    pads = (("pads", (1, 1, 1, 1)),) if window == 3 else ()
    inputs = (TensorSpec((1, c, size, size)), TensorSpec((k, c, window, window)),
              TensorSpec((k,)))
    return Workload("Conv", inputs, (TensorSpec((1, k, size, size)),), pads, tuple(epilogue),
                    const_inputs=(1, 2))


WORKLOADS = {
    "1x1-256-64-14": _resnet_like(256, 64, 14, 1, [EpilogueStep("relu")]),
    "3x3-64-64-14": _resnet_like(64, 64, 14, 3),
    "dense-1-512-200": Workload("Gemm", (TensorSpec((1, 512)), TensorSpec((200, 512)),
                                         TensorSpec((200,))), (TensorSpec((1, 200)),),
                                (("transB", 1),), const_inputs=(1, 2)),
}


@pytest.mark.parametrize("preset,compiler", [
    pytest.param("h100", "nvcc", marks=pytest.mark.skipif(find_nvcc() is None,
                                                         reason="nvcc is not installed")),
    pytest.param("p100", "nvrtc", marks=pytest.mark.skipif(not nvrtc_available(),
                                                          reason="NVRTC wheels not installed")),
])
@pytest.mark.parametrize("key", sorted(WORKLOADS))
def test_preferred_configs_compile_without_spills_and_verify(preset, compiler, key):
    from wpk.kernels.cuda.generated import build_for, preferred_configs
    from wpk.kernels.cuda.offline import check_usage, verify_emulated
    from wpk.kernels.generated import map_workload

    workload, gpu = WORKLOADS[key], gpu_preset(preset)
    configs = preferred_configs(workload, gpu, count=2)
    assert configs
    first = configs[0]
    assert first.get("tile_x", 1) * first.get("tile_k", 1) > 1 or first.get("tile_r", 0) > 0
    rng = np.random.default_rng(0)
    mapping = map_workload(workload)
    for config in configs:
        built = build_for(workload, config)
        usage = built.binary.kernels
        assert check_usage(usage, built.launches, gpu) is None
        assert not any(u.spills for u in usage.values()), (config, usage)
    arrays = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in ((p.name, tuple(int(d.value) for d in p.shape))
                                  for p in C.specialize(mapping.op, mapping.bindings).params)}
    expected = C.evaluate(mapping.op, arrays, mapping.bindings)
    result = verify_emulated(built.func, arrays, expected)
    assert result.ok, result.message


def test_split_kernels_verify_on_sampled_columns():
    """A split-C conv's partial-sum kernel runs on sampled columns (every part of a few
    tiles), the sum kernel on all blocks: the tiles covered are checked, the rest are NaN
    and left out; a wrong expectation still fails."""
    from wpk.kernels.cuda.generated import build_for, preferred_configs
    from wpk.kernels.cuda.offline import verify_emulated
    from wpk.kernels.generated import map_workload

    workload = _resnet_like(512, 64, 14, 1, [EpilogueStep("relu")])
    split = [c for c in preferred_configs(workload, H100, count=8) if c.get("split_c", 1) > 1]
    assert split, "no split-C config among the preferred ones"
    mapping = map_workload(workload)
    func = build_for(workload, split[0], compile=False).func
    assert len(func.kernels) == 2
    rng = np.random.default_rng(1)
    arrays = {p.name: rng.standard_normal(tuple(int(d.value) for d in p.shape))
              .astype(np.float32) for p in C.specialize(mapping.op, mapping.bindings).params}
    expected = C.evaluate(mapping.op, arrays, mapping.bindings)
    result = verify_emulated(func, arrays, expected)
    assert result.ok, result.message
    assert result.blocks < result.grid_blocks and result.elements > 0
    wrong = {name: value * 1.01 for name, value in expected.items()}
    assert not verify_emulated(func, arrays, wrong).ok
