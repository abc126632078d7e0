"""convtranspose.c (kernels/cpu/conv_transpose_native.py): ConvTranspose by output phase
against the float64 reference on odd sizes -- channels not a multiple of the channel
tile, rows not a multiple of the vector, 1-pixel inputs, kernels equal to, larger and
smaller than the stride (4x4 stride 2 pad 1, 3x3 stride 2 with output padding, stride 1,
a stride of 3, unequal strides), asymmetric pads, batches, with and without bias, on the
calling thread and the OpenMP threads --, its native form, what it refuses, and the
planner's choice of it in a model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.conv_transpose_channels import (
    channels_source,
    pack_channel_weights,
    phase_taps,
    tile_shape,
)
from wpk.kernels.cpu.conv_transpose_native import (
    PAR_MIN,
    _geometry,
    channel_tile,
    pack_weights,
)
from wpk.kernels.cpu.native_chain import chain_kernel
from wpk.kernels.reference import reference

# ISA-dependent code (the vector width and registers of the host's ISA)
pytestmark = pytest.mark.isa

CT = registry.get("convtranspose.c")


def _workload(n=1, ci=5, co=7, h=3, w=21, k=(2, 2), bias=True, strides=None, pads=(0,) * 4,
              output_padding=(0, 0), **attrs) -> Workload:
    """A ConvTranspose workload; the output size by the spec's formula."""
    strides = strides or k
    inputs = [TensorSpec((n, ci, h, w)), TensorSpec((ci, co, *k))]
    if bias:
        inputs.append(TensorSpec((co,)))
    oh, ow = ((size - 1) * s - pads[a] - pads[a + 2] + kk + e
              for a, (size, s, kk, e) in enumerate(zip((h, w), strides, k, output_padding)))
    merged = {"kernel_shape": k, "strides": strides, "pads": pads, **attrs}
    if any(output_padding):
        merged["output_padding"] = output_padding
    return Workload("ConvTranspose", tuple(inputs), (TensorSpec((n, co, oh, ow)),),
                    tuple(sorted(merged.items())), const_inputs=tuple(range(1, len(inputs))))


CASES = {
    "2x2, odd sizes": _workload(),
    "2x2, threads": _workload(n=2, ci=9, co=11, h=37, w=45),
    "3x3, no bias": _workload(ci=4, co=3, h=5, w=19, k=(3, 3), bias=False),
    "1x2": _workload(ci=3, co=6, h=4, w=33, k=(1, 2)),
    "1 pixel": _workload(ci=2, co=3, h=1, w=1),
    "one output channel (DBNet's last)": _workload(ci=24, co=1, h=6, w=40),
    "4x4 stride 2 pad 1 (DCGAN, U-Net)": _workload(ci=6, co=9, h=7, w=37, k=(4, 4),
                                                   strides=(2, 2), pads=(1, 1, 1, 1)),
    "4x4 stride 2 pad 1, threads": _workload(n=2, ci=16, co=17, h=20, w=24, k=(4, 4),
                                             strides=(2, 2), pads=(1, 1, 1, 1)),
    "3x3 stride 2 pad 1 output padding 1": _workload(ci=5, co=4, h=9, w=18, k=(3, 3),
                                                     strides=(2, 2), pads=(1, 1, 1, 1),
                                                     output_padding=(1, 1)),
    "3x3 stride 1 pad 1 (a conv)": _workload(ci=3, co=5, h=6, w=35, k=(3, 3), strides=(1, 1),
                                             pads=(1, 1, 1, 1)),
    "5x5 stride 3, asymmetric pads": _workload(ci=3, co=4, h=5, w=11, k=(5, 5),
                                               strides=(3, 3), pads=(2, 0, 1, 3)),
    "1x1 stride 2 (zero rows and columns)": _workload(ci=4, co=3, h=4, w=20, k=(1, 1),
                                                      strides=(2, 2)),
    "3x2 stride (2, 1)": _workload(ci=4, co=6, h=5, w=30, k=(3, 2), strides=(2, 1),
                                   pads=(1, 0, 0, 1)),
    "4x4 stride 2 pad 1, 1 pixel": _workload(ci=3, co=2, h=1, w=1, k=(4, 4), strides=(2, 2),
                                             pads=(1, 1, 1, 1)),
    # a DCGAN's small inputs: the channel-vectorized form's case
    "4x4 stride 2 pad 1, 4x4 input (DCGAN)": _workload(ci=12, co=37, h=4, w=4, k=(4, 4),
                                                       strides=(2, 2), pads=(1, 1, 1, 1)),
    "4x4 stride 1, 1x1 input (DCGAN's first)": _workload(ci=10, co=20, h=1, w=1, k=(4, 4),
                                                         strides=(1, 1)),
    "3x3 stride 2, 3x5 input, threads": _workload(n=2, ci=40, co=70, h=3, w=5, k=(3, 3),
                                                  strides=(2, 2), pads=(1, 1, 1, 1)),
}
ALONG = ("positions", "channels")


def _inputs(workload: Workload, rng) -> list[np.ndarray]:
    return [rng.standard_normal(s.shape).astype(np.float32) for s in workload.inputs]


def _checked(workload: Workload, along: str, rng):
    """(kernel, inputs, output) of `along`'s form on random inputs, the output checked
    against the float64 reference of the node and its epilogue (poisoned with NaN first)."""
    assert CT.unsupported_reason(workload) is None
    inputs = _inputs(workload, rng)
    kernel = CT.prepare(workload, {i: inputs[i] for i in workload.const_inputs},
                        {"along": along})
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel(inputs, [y])
    expected = reference(workload, [a.astype(np.float64) for a in inputs])[0]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    return kernel, inputs, y


@pytest.mark.parametrize("along", ALONG)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_the_reference(name, along, rng):
    """Both vectorizations (over output positions, over output channels) on every case."""
    workload = CASES[name]
    assert {"along": along} in CT.configs(workload)
    kernel, inputs, y = _checked(workload, along, rng)
    call = kernel.native(inputs, [y2 := np.full_like(y, np.nan)])
    chain_kernel([call], keep=[kernel])([], [])
    np.testing.assert_array_equal(y2, y)
    kernel(inputs, [y3 := np.full_like(y, np.nan)])   # a second call: the same padded copy
    np.testing.assert_array_equal(y3, y)


ACTIVATIONS = {
    "relu": EpilogueStep("relu"), "sigmoid": EpilogueStep("sigmoid"),
    "tanh": EpilogueStep("tanh"), "leaky_relu": EpilogueStep("leaky_relu", (("alpha", 0.2),)),
    "clip": EpilogueStep("clip", (("max", 0.7), ("min", -0.3))),
    "hard_swish": EpilogueStep("hard_swish"), "silu": EpilogueStep("silu"),
    "gelu": EpilogueStep("gelu"), "mish": EpilogueStep("mish"),
    "quick_gelu": EpilogueStep("quick_gelu", (("alpha", 1.702),)),
}


@pytest.mark.parametrize("along", ALONG)
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("name", ["2x2, threads", "4x4 stride 2 pad 1, 4x4 input (DCGAN)",
                                  "5x5 stride 3, asymmetric pads"])
def test_applies_a_fused_activation_before_every_store(name, activation, along, rng):
    """An activation in the epilogue (DBNet's ReLU and Sigmoid, a DCGAN's ReLU and Tanh)
    is applied to every accumulator: both forms, three geometries, against the float64
    reference of the ConvTranspose and its epilogue."""
    workload = dataclasses.replace(CASES[name], epilogue=(ACTIVATIONS[activation],))
    _, inputs, y = _checked(workload, along, rng)
    plain = reference(CASES[name], [a.astype(np.float64) for a in inputs])[0]
    assert not np.allclose(y, plain, rtol=1e-3, atol=1e-3)   # the activation changed it


@pytest.mark.parametrize("epilogue, why", [
    ((EpilogueStep("relu"), EpilogueStep("tanh")), "not one activation"),
    ((EpilogueStep("add", operand=3),), "not one activation"),
    ((EpilogueStep("exp"),), "not one activation"),
])
def test_refuses_an_epilogue_other_than_one_activation(epilogue, why):
    assert why in CT.unsupported_reason(dataclasses.replace(CASES["2x2, odd sizes"],
                                                            epilogue=epilogue))


def test_packs_a_units_weights_in_reading_order():
    w = np.arange(2 * 5 * 2 * 2, dtype=np.float32).reshape(2, 5, 2, 2)
    packed = pack_weights(w, 3)    # 5 output channels in tiles of 3: one padded tile
    assert packed.shape == (2, 2, 3, 2, 2)
    assert np.array_equal(packed[1, 0, 1], w[0, 4]) and not packed[1, :, 2].any()
    # 7 channels fit 32 registers with 4 phases; 24 channels take 4 tiles of 6, not 7
    assert channel_tile(24, 4, 32) == 6 and channel_tile(28, 4, 32) == 7
    assert channel_tile(1, 4, 32) == 1 and channel_tile(24, 16, 16) == 1


def test_the_channel_form_packs_each_phases_taps_in_reading_order():
    """Per tile of output channels, phase after phase, [input channel][tap][channel]; the
    3x5 input's 15 positions take two tiles of 8, the last ending at the last position."""
    workload = CASES["3x3 stride 2, 3x5 input, threads"]
    g = _geometry(workload)
    lanes = 4
    w = np.arange(np.prod(workload.inputs[1].shape), dtype=np.float32).reshape(
        workload.inputs[1].shape)
    packed = pack_channel_weights(w, lanes, g)
    assert packed.shape == (-(-70 // lanes), 40 * 9 * lanes)   # every tap once, in phases
    base = 0
    for _, _, taps in phase_taps(g):
        for ci in (0, 39):
            for t, (ky, _, kx, _) in enumerate(taps):
                at = base + (ci * len(taps) + t) * lanes
                assert np.array_equal(packed[17, at:at + 2], w[ci, 68:70, ky, kx])
                assert not packed[17, at + 2:at + lanes].any()   # past the 70 channels
        base += 40 * len(taps) * lanes
    assert tile_shape(g) == (1, 8) and g.positions() == (3, 5)
    assert "#define PAR 0\n" in channels_source(g, 1, 8, lanes, g.parallel())
    # a DCGAN's 512 -> 256 layer: a small output (16K floats) but 34M multiply-adds: threads
    dcgan = _geometry(_workload(ci=512, co=256, h=4, w=4, k=(4, 4), strides=(2, 2),
                                pads=(1, 1, 1, 1)))
    assert dcgan.co * dcgan.oh * dcgan.ow < PAR_MIN and dcgan.parallel()


@pytest.mark.parametrize(("attrs", "why"), [
    ({"group": 2, "ci": 4, "co": 3}, "group"),
    ({"dilations": (2, 2)}, "dilation"),
    ({"k": (5, 5), "strides": (5, 5)}, "16 output phases"),
])
def test_refuses_what_it_does_not_compute(attrs, why):
    assert why in CT.unsupported_reason(_workload(**attrs))
    variable = Workload("ConvTranspose", _workload().inputs, _workload().outputs,
                        _workload().attrs, const_inputs=())
    assert "constants" in CT.unsupported_reason(variable)
    grown = _workload(k=(3, 3), strides=(2, 2))   # an output_shape past the full result
    grown = Workload(grown.op, grown.inputs, (TensorSpec((1, 7, 9, 45)),),
                     tuple(sorted({**dict(grown.attrs), "output_shape": (9, 45)}.items())),
                     const_inputs=grown.const_inputs)
    assert "begin pads" in CT.unsupported_reason(grown)


@pytest.mark.parametrize("kernel, pads", [(2, 0), (4, 1)], ids=["2x2", "4x4 pad 1"])
def test_a_build_verifies_and_measures_it_next_to_onnxruntime(kernel, pads, rng, tmp_path):
    """In a model (a 2x2 upsampling ConvTranspose or a DCGAN's 4x4 one, BatchNormalization
    folded into it, then ReLU) the build measures convtranspose.c beside onnxruntime's
    kernel, verified, and the plan computes what onnxruntime does."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import wpk

    def const(name, *shape, positive=False):
        value = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
        return numpy_helper.from_array(value.astype(np.float32), name)

    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"],
                              kernel_shape=[kernel, kernel], strides=[2, 2], pads=[pads] * 4),
             helper.make_node("BatchNormalization", ["t", "s", "o", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    graph = helper.make_graph(
        nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 20, 36])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 40, 72])],
        [const("w", 8, 6, kernel, kernel), const("b", 6), const("s", 6, positive=True),
         const("o", 6), const("m", 6), const("v", 6, positive=True)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = wpk.build(model, target="cpu", progress=False, partition=False)
    (entry,) = [w for w in plan.report["workloads"] if w["op"] == "ConvTranspose"]
    assert entry["label"].endswith("+relu") and len(plan.steps) == 1   # ReLU in its stores
    ours = next(c for c in entry["candidates"] if c["impl"] == "convtranspose.c")
    assert ours["status"] == "ok" and ours["rel_l2_error"] < 1e-5
    assert any(c["impl"] == "ort" and c["status"] == "ok" for c in entry["candidates"])
    x = rng.standard_normal((1, 8, 20, 36)).astype(np.float32)
    path = tmp_path / "up.wpk"
    plan.save(str(path))
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = wpk.load(str(path)).run({"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_the_benchmark_verifies_and_times_every_candidate(monkeypatch, tmp_path):
    """scripts/bench_conv_transpose.py on one small workload: each candidate verified
    against the reference, timed, its GFLOP/s and onnxruntime's time over it written."""
    import json
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_conv_transpose

    small = bench_conv_transpose.conv_transpose("small", (1, 3, 5, 9), 4, 4, 2, 1)
    assert small[1].outputs[0].shape == (1, 4, 10, 18)
    monkeypatch.setattr(bench_conv_transpose, "WORKLOADS", [small])
    out = tmp_path / "ct.json"
    assert bench_conv_transpose.main(["--rounds", "1", "--repeat", "1", "--output",
                                      str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert {"convtranspose.c[along=positions]", "convtranspose.c[along=channels]", "ort",
            "numpy.formula"} <= set(row["median_ms"])
    assert row["ort_over"]["ort"] == 1.0 and max(row["relative_l2"].values()) < 1e-5
    assert all(value > 0 for value in row["gflops"].values())
