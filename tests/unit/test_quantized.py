"""Quantized models: DequantizeLinear at every opset in onnx.reference, the QDQ pairs as the
float step `fake_quant` (wpk/passes/quantize_dequantize.py) in every backend, verification
that tells rounding flips from wrong answers, and whole QDQ and QOperator models built and
run against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from wpk.core.onnx_quantize import REFERENCE_OPS
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.frontend import load_model
from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags, usable_isas
from wpk.kernels.epilogue import apply_epilogue
from wpk.passes import optimize
from wpk.passes.base import check_graph
from wpk.passes.quantize_dequantize import QuantizeDequantize, fake_quant_step, quantizes
from wpk.runtime import Session
from wpk.search.measure import compare, output_quanta

SHAPE = [1, 8, 6, 6]


def _literal_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime running the model's nodes as written (no fusion into integer kernels)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------ DequantizeLinear reference

@pytest.mark.parametrize("opset", [10, 13, 17])
def test_dequantize_linear_runs_in_onnx_reference_at_old_opsets(opset):
    axis_scale = opset >= 13   # per-axis scales came with opset 13
    scale = np.array([0.5, 0.25, 2.0], np.float32) if axis_scale else np.array(0.5, np.float32)
    zero = np.array([3, 0, 250], np.uint8) if axis_scale else np.array(7, np.uint8)
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"],
                            **({"axis": 1} if axis_scale else {}))
    graph = helper.make_graph(
        [node], "dq", [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    x = np.random.default_rng(opset).integers(0, 256, (2, 3, 4), dtype=np.uint8)
    got = ReferenceEvaluator(model, new_ops=list(REFERENCE_OPS)).run(None, {"x": x})[0]
    shape = (1, 3, 1) if axis_scale else ()
    expected = (x.astype(np.float32) - zero.reshape(shape)) * scale.reshape(shape)
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(Exception, match="DequantizeLinear"):   # what wpk had before
        ReferenceEvaluator(model).run(None, {"x": x})


# ------------------------------------------------------------------ the fake_quant step

def _qdq_pair_model(scale: float, zero_point: int, dtype) -> onnx.ModelProto:
    tensor_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    graph = helper.make_graph(
        nodes, "pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096])],
        [numpy_helper.from_array(np.array(scale, np.float32), "s"),
         numpy_helper.from_array(np.array(zero_point, dtype), "z")])
    assert tensor_type
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("scale,zero_point,dtype", [(0.05, 128, np.uint8), (0.1, 0, np.int8),
                                                    (0.02, -3, np.int8), (0.25, 7, np.uint8)])
def test_fake_quant_step_is_the_pair_onnxruntime_runs(scale, zero_point, dtype):
    """Exact ties (x / scale = k + 1/2, rounding half to even), saturation on both sides and
    random values: the numpy step and onnxruntime's QuantizeLinear/DequantizeLinear agree
    bit for bit."""
    rng = np.random.default_rng(zero_point + 1000)
    ties = (np.arange(-300, 300) + 0.5) * np.float32(scale)
    x = np.concatenate([ties, rng.standard_normal(4096 - ties.size) * 40 * scale])
    x = x.astype(np.float32)
    expected = _literal_session(_qdq_pair_model(scale, zero_point, dtype)).run(
        None, {"x": x})[0]
    step = fake_quant_step(scale, zero_point, np.dtype(dtype).name)
    got = apply_epilogue(x.copy(), (step,), [])
    np.testing.assert_array_equal(got, expected)
    assert np.unique(np.round(expected / np.float32(scale))).size > 100


def test_fake_quant_keeps_zero_and_is_bounded():
    step = fake_quant_step(0.1, 10, "uint8")
    got = apply_epilogue(np.array([0.0, -1e30, 1e30], np.float32), (step,), [])
    np.testing.assert_allclose(got, [0.0, -1.0, 24.5], rtol=1e-6)


# ------------------------------------------------------------------ the pass

def _conv_qdq_model(*, axis_scale=False, other_scale=False, extra_reader=False,
                    q_output=False, opset=13) -> onnx.ModelProto:
    """x -> Conv -> c -> QuantizeLinear -> q -> DequantizeLinear (twice) -> relu / tanh."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3)
                                     .astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0.05] * 8 if axis_scale else 0.05, np.float32),
                                     "s"),
             numpy_helper.from_array(np.array([128] * 8 if axis_scale else 128, np.uint8), "z"),
             numpy_helper.from_array(np.array(0.07 if other_scale else 0.05, np.float32), "s2"),
             numpy_helper.from_array(np.array(128, np.uint8), "z2")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d1"]),
             helper.make_node("DequantizeLinear", ["q", "s2", "z2"], ["d2"]),
             helper.make_node("Relu", ["d1"], ["y1"]),
             helper.make_node("Tanh", ["d2"], ["y2"])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in ("y1", "y2")]
    if extra_reader:
        nodes.append(helper.make_node("Cast", ["q"], ["y3"], to=TensorProto.FLOAT))
        outputs.append(helper.make_tensor_value_info("y3", TensorProto.FLOAT, SHAPE))
    if q_output:
        outputs.append(helper.make_tensor_value_info("q", TensorProto.UINT8, SHAPE))
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, SHAPE)], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _run_pass(model):
    graph = load_model(model)
    found = QuantizeDequantize().run(graph)
    check_graph(found)
    return found


def test_pass_turns_a_pair_and_its_twin_into_one_fake_quant_step():
    graph = _run_pass(_conv_qdq_model())
    ops = [n.op for n in graph.nodes]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    fused = [n for n in graph.nodes if n.op == "Elementwise"]
    assert len(fused) == 1 and [s.op for s in fused[0].epilogue] == ["fake_quant"]
    assert dict(fused[0].epilogue[0].attrs) == pytest.approx(
        {"scale": 0.05, "zero_point": 128.0, "low": 0.0, "high": 255.0})
    readers = [n for n in graph.nodes if fused[0].outputs[0] in n.inputs]
    assert sorted(n.op for n in readers) == ["Relu", "Tanh"]


@pytest.mark.parametrize("case", [{"axis_scale": True}, {"other_scale": True},
                                  {"extra_reader": True}, {"q_output": True}, {"opset": 10}])
def test_pass_leaves_pairs_that_are_not_exactly_the_step(case):
    model = _conv_qdq_model(**case)
    if case == {"opset": 10}:   # per-tensor only, no Round: a model of opset 10 keeps them
        model = _conv_qdq_model(opset=10)
    graph = _run_pass(model)
    assert [n.op for n in graph.nodes].count("QuantizeLinear") == 1


def test_whole_pipeline_fuses_the_step_into_the_conv_and_matches_the_pair():
    model = _conv_qdq_model()
    graph, report = optimize(load_model(model), "cpu")
    assert report.passes["quantize_dequantize"] == 1
    epilogues = [s.op for n in graph.nodes for s in n.epilogue]
    assert "fake_quant" in epilogues
    assert quantizes(load_model(model)) and not quantizes(graph)


# ------------------------------------------------------------------ verification

def _workload_with(step: EpilogueStep) -> Workload:
    spec = TensorSpec((1, 2048))
    return Workload("Relu", (spec,), (spec,), epilogue=(step,))


def test_output_quanta_name_the_steps_and_the_rounding_ops():
    step = fake_quant_step(0.05, 3, "int8")
    assert output_quanta(_workload_with(step)) == (0.05,)
    assert output_quanta(_workload_with(EpilogueStep("relu"))) == (None,)
    q = Workload("QuantizeLinear", (TensorSpec((4,)), TensorSpec(()), TensorSpec((), "uint8")),
                 (TensorSpec((4,), "uint8"),))
    assert output_quanta(q) == (1.0,)


def test_compare_takes_rare_rounding_flips_and_refuses_real_errors():
    rng = np.random.default_rng(1)
    scale = 0.05
    ref = np.round(rng.standard_normal(4096) * 40) * scale
    got = ref.astype(np.float32)
    got[5] += scale                            # one flip to the next step: fine
    assert compare([got], [ref], (scale,))[1] == ""
    assert compare([got], [ref])[0] > 1e-4      # without the quantum it is an error
    two = got.copy()
    two[7] += 2 * scale                        # two steps off: wrong
    assert "more than one step" in compare([two], [ref], (scale,))[1]
    shifted = ref.astype(np.float32) + np.float32(scale)   # a wrong zero point: all flip
    assert "one step off" in compare([shifted], [ref], (scale,))[1]
    ints = np.arange(4096) % 256
    off = ints.astype(np.uint8)
    off[3] += 1
    assert compare([off], [ints], (1.0,))[1] == ""
    assert compare([off], [ints])[1] != ""


# ------------------------------------------------------------------ whole models

def _float_model() -> onnx.ModelProto:
    """A small CNN with what quantized models are made of: convs, a residual add, a
    HardSwish written out, a global pool and a classifier."""
    rng = np.random.default_rng(3)

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       name)

    inits = [weight("w1", (16, 3, 3, 3)), weight("b1", (16,)), weight("w2", (16, 16, 3, 3)),
             weight("w3", (10, 16)), weight("b3", (10,))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a"]),
             helper.make_node("HardSigmoid", ["a"], ["h"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["a", "h"], ["hs"]),
             helper.make_node("GlobalAveragePool", ["hs"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 32, 32])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _quantized(tmp_path, quant_format) -> onnx.ModelProto:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [{"x": np.random.default_rng(i).standard_normal((1, 3, 32, 32))
                          .astype(np.float32)} for i in range(4)]

        def get_next(self):
            return self.left.pop() if self.left else None

    source, target = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(_float_model(), source)
    formats = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}
    quantize_static(str(source), str(target), Reader(), quant_format=formats[quant_format],
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=quant_format == "qdq")
    return onnx.load(target)


@pytest.mark.parametrize("quant_format", ["qdq", "qoperator"])
def test_quantized_model_builds_and_computes_its_nodes(tmp_path, quant_format):
    import wpk

    model = _quantized(tmp_path, quant_format)
    ops = {n.op_type for n in model.graph.node}
    assert ("QLinearConv" in ops) == (quant_format == "qoperator")
    per_op = wpk.build(model, target="cpu", progress=False, partition=False)
    fallbacks = [w["label"] for w in per_op.report["workloads"] if w["fallback"]]
    if quant_format == "qdq":   # every node generated or onnxruntime's, the pairs as steps
        assert not fallbacks and "fake_quant" in str(per_op.report["workloads"])
    x = np.random.default_rng(9).standard_normal((1, 3, 32, 32)).astype(np.float32)
    ours = Session(per_op).run({"x": x})["y"]
    theirs = _literal_session(model).run(None, {"x": x})[0]
    assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 1e-4
    partition = wpk.build(model, target="cpu", progress=False).report["partition"]
    if partition["rel_l2_between"] > 1e-4:   # onnxruntime's integer kernels round elsewhere
        assert partition["rel_l2_literal"] <= max(1e-4, 2 * partition[
            "rel_l2_onnxruntime_spread"]) and "wpk_median_s" in partition


def test_the_passes_keep_a_qdq_models_meaning_exactly(tmp_path):
    """The graph after the passes (the CUDA target's: the CPU's blocked layout writes wpk's
    own ops), back in standard ONNX (`to_onnx`: fake_quant as Div, Clip, Round, Mul), run by
    onnxruntime as written, gives the original model's outputs bit for bit."""
    from wpk.passes import to_onnx

    model = _quantized(tmp_path, "qdq")
    graph, report = optimize(load_model(model), "cuda")
    assert report.passes["quantize_dequantize"] > 0
    x = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)
    rewritten = _literal_session(to_onnx(graph)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(rewritten, _literal_session(model).run(None, {"x": x})[0])


# ------------------------------------------------------------------ the generated kernels

def _conv_with(step: EpilogueStep, residual: bool) -> Workload:
    from tests.unit.test_microkernels import ADD3, B, conv

    return conv(2 * B + 3, 40, (9, 7), 3, residual=residual,
                epilogue=((ADD3,) if residual else ()) + (step,))


@pytest.mark.isa  # ISA-dependent: scripts/isa_check.sh reruns it for AVX2
@pytest.mark.parametrize("isa", [i.name for i in usable_isas()])
def test_vector_fake_quant_is_the_numpy_step_bit_for_bit(isa):
    """The micro-kernels' epilogue (clip, the 1.5 * 2^23 rounding, scale) on exact ties,
    saturation both ways and random values equals the numpy step exactly."""
    import ctypes

    from wpk.dsl.toolchain import compile_c, load_function
    from wpk.kernels.cpu.microkernels.space import conv_geometry
    from wpk.kernels.cpu.microkernels.templates import VECTOR_HEADER, _epilogue

    step = fake_quant_step(0.05, 3, "int8")
    lanes = ISAS[isa].lanes
    source = (VECTOR_HEADER.format(lanes=lanes) + _epilogue(conv_geometry(_conv_with(
        step, False))) + "void wpk_act(float *x, int n) {\n"
        f"    for (int i = 0; i < n; i += {lanes}) epilogue(vload(x + i), 0, x + i);\n}}\n")
    run = load_function(compile_c(source, compile_flags(ISAS[isa])).path, "wpk_act",
                        [ctypes.c_void_p, ctypes.c_int])
    rng = np.random.default_rng(4)
    x = np.concatenate([(np.arange(-200, 200) + 0.5) * np.float32(0.05),
                        rng.standard_normal(1200) * 5, [1e30, -1e30, 0.0, -0.0]])
    x = np.concatenate([x, np.zeros(-len(x) % 16)]).astype(np.float32)
    got = x.copy()
    run(got.ctypes.data, len(got))
    np.testing.assert_array_equal(got, apply_epilogue(x.copy(), (step,), []))


@pytest.mark.isa
@pytest.mark.parametrize("residual", [False, True])
def test_micro_conv_with_a_fake_quant_epilogue_verifies(residual, rng):
    """micro.nchwc with the step fused after the conv (and a residual add): against the
    float64 reference, only rare rounding flips (`output_quanta`)."""
    from wpk.kernels.cpu.microkernels.kernel import MICRO_NCHWC
    from wpk.kernels.nchwc_reference import nchwc_reference
    from wpk.kernels.random_inputs import random_inputs

    workload = _conv_with(fake_quant_step(0.05, 3, "int8"), residual)
    assert MICRO_NCHWC.unsupported_reason(workload) is None
    inputs = random_inputs(workload, rng)
    config = MICRO_NCHWC.configs(workload)[0]
    kernel = MICRO_NCHWC.prepare(workload, {i: inputs[i] for i in workload.const_inputs},
                                 config)
    out = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel(inputs, [out])
    expected = nchwc_reference(workload, inputs)[0]
    error, why = compare([out], [expected], output_quanta(workload))
    assert why == "" and error < 1e-5
    assert np.unique(np.round(out / np.float32(0.05))).size > 20   # it did quantize


def test_offline_cuda_verification_knows_rounding_flips():
    """The emulator's check of a CUDA kernel ending in fake_quant (an offline GPU build of
    a QDQ model): rare one-step flips pass with the quantum, nothing else does."""
    from wpk.kernels.cuda.generated import build_for
    from wpk.kernels.cuda.offline import verify_emulated
    from wpk.kernels.reference import reference
    from wpk.search.predicted import verify_generated

    spec = TensorSpec((400,))
    workload = Workload("Relu", (spec,), (spec,), epilogue=(fake_quant_step(0.25, 3, "int8"),))
    built = build_for(workload, dict(threads=32, per_thread=1, gpu="t4"), compile=False)
    assert verify_generated(workload, built, seed=2).ok
    x = np.random.default_rng(0).standard_normal(400).astype(np.float32) * 6
    expected = reference(workload, [x])[0]
    flipped = expected.copy()
    flipped[11] += 0.25
    assert verify_emulated(built.func, {"X": x}, {"Y": flipped}, quanta={"Y": 0.25}).ok
    assert not verify_emulated(built.func, {"X": x}, {"Y": flipped}).ok
    flipped[12] += 0.5
    off = verify_emulated(built.func, {"X": x}, {"Y": flipped}, quanta={"Y": 0.25})
    assert not off.ok and "more than one step" in off.message


def test_blocked_layout_keeps_a_qdq_hard_swish_blocked(tmp_path):
    """QDQ splits HardSwish into a hard sigmoid and a multiply, each quantized: the hard
    sigmoid's chain leaves its padding lanes dirty (finite: `BOUNDED_STEPS`), the multiply
    by the clean input cleans them, so both stay on blocked tensors and no reorder comes
    between the convs and the pool."""
    graph, _ = optimize(load_model(_quantized(tmp_path, "qdq")), "cpu")
    chains = {tuple(s.op for s in n.epilogue): n for n in graph.nodes if n.op == "Elementwise"}
    for steps in [("hard_sigmoid", "fake_quant"), ("mul", "fake_quant"), ("add", "fake_quant")]:
        assert chains[steps].outputs[0].endswith("_nchwc"), steps
    assert [n.op for n in graph.nodes].count("ReorderOutput") == 1   # before the classifier
    assert [s.op for n in graph.nodes if n.op == "Conv" for s in n.epilogue] == \
        ["fake_quant", "fake_quant"]
