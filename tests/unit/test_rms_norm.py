"""wpk's RMSNorm: the CPU rule `rms_norm` on the forms torch's exporters write, where it
must not fire, the op's kernels (`layernorm.c`, `ort.rms_norm`) against the float64
reference, its ONNX form, and a build of a LLaMA-style block against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.frontend import load_model
from wpk.kernels import registry
from wpk.kernels.reference import reference
from wpk.passes import optimize
from wpk.passes.to_onnx import to_onnx

D = 24   # not a multiple of a vector


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def rms_model(form: str, opset: int = 17, gamma: bool = True, shape=(2, 5, D),
              axes=(-1,), eps=1e-6, mean_centred: bool = False) -> onnx.ModelProto:
    """x -> the written-out RMS normalization -> y (+ a residual Add reading x, as
    transformer blocks have). Forms: 'reciprocal' (dynamo: Pow, Reciprocal, Mul),
    'one_over' (TorchScript's rsqrt: Pow, Div(1, .), Mul), 'div' (Mul(x, x), Div(x, .))."""
    n = helper.make_node
    x = "x"
    nodes, inits = [], [_const("two", 2.0), _const("eps", eps), _const("one", 1.0)]
    if mean_centred:   # a LayerNorm without its scale: not an RMS normalization
        nodes.append(n("ReduceMean", ["x"], ["mu"], axes=list(axes), keepdims=1))
        nodes.append(n("Sub", ["x", "mu"], ["xc"]))
        x = "xc"
    nodes.append(n("Mul", [x, x], ["sq"]) if form == "div" else n("Pow", [x, "two"], ["sq"]))
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        nodes.append(n("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1))
    else:
        nodes.append(n("ReduceMean", ["sq"], ["ms"], axes=list(axes), keepdims=1))
    nodes += [n("Add", ["ms", "eps"], ["var"]), n("Sqrt", ["var"], ["rms"])]
    if form == "div":
        nodes.append(n("Div", [x, "rms"], ["normed"]))
    else:
        nodes.append(n("Reciprocal", ["rms"], ["inv"]) if form == "reciprocal"
                     else n("Div", ["one", "rms"], ["inv"]))
        nodes.append(n("Mul", [x, "inv"], ["normed"]))
    last = "normed"
    if gamma:
        inits.append(_const("gamma", np.linspace(0.5, 1.5, D)))
        nodes.append(n("Mul", ["gamma", "normed"], ["scaled"]))
        last = "scaled"
    nodes.append(n("Add", [last, "x"], ["y"]))
    graph = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, list(shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _outputs(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


FUSED = {
    "reciprocal (dynamo), opset 18": dict(form="reciprocal", opset=18),
    "one over (TorchScript's rsqrt)": dict(form="one_over"),
    "div of Mul(x, x), no gamma": dict(form="div", gamma=False),
    "two trailing axes": dict(form="reciprocal", axes=(1, 2)),
}


@pytest.mark.parametrize("case", sorted(FUSED))
def test_the_exporters_forms_become_one_rms_norm(case, rng):
    """Each form becomes one wpk RMSNorm (Scale materialized, ones without gamma) whose
    graph, expanded back to standard nodes by to_onnx, computes what the model did."""
    model = rms_model(**FUSED[case])
    graph = load_model(model)
    optimized, report = optimize(graph, target="cpu")
    assert report.rules["rms_norm"] == 1
    (norm,) = [node for node in optimized.nodes if node.op == "RMSNorm"]
    assert norm.domain == "wpk" and norm.attrs["epsilon"] == pytest.approx(1e-6)
    axes = FUSED[case].get("axes", (-1,))
    assert norm.attrs["axis"] == min(a % 3 for a in axes)
    assert optimized.tensors[norm.inputs[1]].shape == (2, 5, D)[norm.attrs["axis"]:]
    assert not {"Sqrt", "Reciprocal", "Pow", "ReduceMean"} & set(optimized.op_counts())
    exported = to_onnx(optimized)
    onnx.checker.check_model(exported, full_check=True)
    x = rng.standard_normal((2, 5, D)).astype(np.float32)
    assert relative_l2(_outputs(exported, x), _outputs(model, x)) < 1e-6


@pytest.mark.parametrize("what", ["mean-centred (a LayerNorm)", "a middle axis",
                                  "the rms read elsewhere", "cuda"])
def test_what_is_no_rms_norm_is_left_alone(what, rng):
    """A centred x over sqrt(mean(x^2) + eps) is a LayerNorm (its rule runs first); a mean
    over an axis that is not trailing, a root mean square read elsewhere, and the CUDA
    target (no RMSNorm kernel there) keep the nodes."""
    centred = what.startswith("mean")
    model = rms_model("div" if centred else "reciprocal", mean_centred=centred,
                      axes=(1,) if what == "a middle axis" else (-1,))
    if what == "the rms read elsewhere":   # the root mean square is also a graph output
        model.graph.output.append(helper.make_tensor_value_info("rms", TensorProto.FLOAT,
                                                                [2, 5, 1]))
    graph = load_model(model)
    optimized, report = optimize(graph, target="cuda" if what == "cuda" else "cpu")
    assert report.rules.get("rms_norm", 0) == 0
    assert "RMSNorm" not in optimized.op_counts()
    assert ("LayerNormalization" in optimized.op_counts()) == centred


def _workload(shape=(7, 3, D), axis=-1, dtype="float32", opset=17) -> Workload:
    x = TensorSpec(shape, dtype)
    scale = TensorSpec(tuple(shape[axis % len(shape):]), dtype)
    return Workload("RMSNorm", (x, scale), (x,), (("axis", axis), ("epsilon", 1e-5)),
                    domain="wpk", const_inputs=(1,), opset=opset)


@pytest.mark.parametrize("impl", ["layernorm.c", "ort.rms_norm"])
@pytest.mark.parametrize("workload", [_workload(), _workload(axis=1), _workload(opset=18),
                                      _workload((300, 5, D))],
                         ids=["rows", "two axes", "opset 18", "rows on threads"])
def test_its_kernels_match_the_float64_reference(impl, workload, rng):
    implementation = registry.get(impl)
    assert implementation.unsupported_reason(workload) is None
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, workload.inputs[1].shape).astype(np.float32)
    (expected,) = reference(workload, [x, scale])
    for config in implementation.configs(workload):
        kernel = implementation.prepare(workload, {1: scale}, config)
        out = np.full(x.shape, np.nan, np.float32)
        kernel([x, scale], [out])
        assert relative_l2(out, expected) < 1e-6, config
    add = Workload("Add", workload.inputs, workload.outputs[:1])
    assert "only" in implementation.unsupported_reason(add)   # an Add is no RMSNorm
    mean_square = (x.astype(np.float64) ** 2).mean(axis=tuple(range(
        workload.attr("axis") % 3, 3)), keepdims=True)
    np.testing.assert_allclose(expected, x / np.sqrt(mean_square + 1e-5) * scale, rtol=1e-12)


def test_a_llama_style_block_builds_with_one_rms_norm_step_and_matches(tmp_path, rng):
    """RMSNorm, a projection and a residual: the build measures layernorm.c beside
    onnxruntime's written-out form, both verified; the plan computes what the model did."""
    model = rms_model("reciprocal", opset=18, shape=(1, 64, D))
    plan = wpk.build(model, target="cpu", progress=False, partition=False)
    (entry,) = [w for w in plan.report["workloads"] if w["op"] == "RMSNorm"]
    statuses = {c["impl"]: c["status"] for c in entry["candidates"]}
    assert statuses["layernorm.c"] == "ok" and statuses["ort.rms_norm"] == "ok"
    plan.save(str(tmp_path / "rms.wpk"))
    x = rng.standard_normal((1, 64, D)).astype(np.float32)
    got = wpk.load(str(tmp_path / "rms.wpk")).run({"x": x})["y"]
    assert relative_l2(got, _outputs(model, x)) < 1e-5
