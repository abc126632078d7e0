"""The epilogue table (wpk.core.epilogue): every row, as every backend builds it, computes the
same thing on random inputs. numpy in float64 is the oracle; against it: numpy in float32,
the DSL (compute IR interpreter, the compiled C kernel, the GPU emulator), the CUDA kernel
source (evaluated as text), and ONNX nodes run by onnxruntime, with and without the row's
single op. Attribute defaults and swapped binary operands are cases of their own; ONNX nodes
parse back to their step; the table agrees with ONNX's own operator schemas."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from scipy.special import expit

from wpk.core import epilogue as table
from wpk.core.epilogue import (
    EPILOGUE_TABLE,
    ONNX_BINARY_STEPS,
    EpilogueOp,
    argument_uses,
    step_from_onnx,
    step_value,
)
from wpk.core.workload import BINARY_EPILOGUE_OPS, UNARY_EPILOGUE_OPS, EpilogueStep
from wpk.dsl.compute import evaluate, infer_bindings
from wpk.dsl.epilogue import with_epilogue
from wpk.dsl.toolchain_cuda import compile_cuda, nvrtc_available
from wpk.kernels import templates
from wpk.kernels.cpu.node_model import ir_version_for
from wpk.kernels.cuda.epilogue_cuda import epilogue_source
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.epilogue import (
    OnnxBuilder,
    apply_epilogue,
    apply_epilogue_into,
    epilogue_onnx_nodes,
)

from .cuda_c_eval import run_c_body

N = 64
# Non-default attribute values; every row with attributes must have some (checked below).
ATTR_CASES = {
    "clip": [(("min", -0.5), ("max", 1.0)), (("min", -0.5),), (("max", 1.0),)],
    "leaky_relu": [(("alpha", 0.2),)],
    "hard_sigmoid": [(("alpha", 0.3), ("beta", 0.6))],
    "quick_gelu": [(("alpha", 1.0),), (("alpha", -0.75),)],
    # a power-of-two scale: x / scale is exact in float32 and float64 alike, no rounding flips
    "fake_quant": [(("scale", 0.25), ("zero_point", 3.0), ("low", -128.0), ("high", 127.0))],
}
POSITIVE_BASE = {"log", "sqrt", "pow"}  # x > 0 (pow: the operand too)
# Opsets: Clip with attributes, and no HardSwish or Gelu (9); Clip with inputs (13);
# HardSwish (14) and Gelu (20) as single ops (24, and 28: the newest onnx 1.23 knows).
OPSETS = (9, 13, 24, 28)
RTOL, ATOL = 2e-5, 2e-6


def _cases() -> list[EpilogueStep]:
    steps = []
    for name, row in EPILOGUE_TABLE.items():
        if row.arity == 2:
            steps += [EpilogueStep(name, operand=1, swap=swap) for swap in (False, True)]
        else:
            steps.append(EpilogueStep(name))
            steps += [EpilogueStep(name, attrs) for attrs in ATTR_CASES.get(name, ())]
    return steps


def _id(step: EpilogueStep) -> str:
    attrs = "".join(f"_{k}{v:g}" for k, v in step.attrs)
    return f"{step.op}{attrs}{'_swap' if step.swap else ''}"


CASES = _cases()


def _inputs(step: EpilogueStep, rng) -> tuple[np.ndarray, np.ndarray]:
    """x and the operand, float32 values held in float64 (every backend reads the same)."""
    def draw(low, high, signed):
        value = rng.uniform(low, high, N) * (rng.choice([-1.0, 1.0], N) if signed else 1.0)
        return value.astype(np.float32).astype(np.float64)

    positive = step.op in POSITIVE_BASE
    return draw(0.25, 4.0, not positive), draw(0.25, 2.0, step.op != "pow")


def _reference(step, x, w) -> np.ndarray:
    return apply_epilogue(x.copy(), [step], [x, w])


def _close(got, expected, rtol=RTOL, atol=ATOL) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=rtol, atol=atol)


def _run_onnx(nodes, opset: int, x, w) -> np.ndarray:
    kind = onnx.TensorProto.FLOAT
    x_info, w_info, y_info = (helper.make_tensor_value_info(n, kind, [N]) for n in "xwy")
    graph = helper.make_graph(nodes, "epilogue", [x_info, w_info], [y_info])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version_for(opset)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.astype(np.float32), "w": w.astype(np.float32)})[0]


# ------------------------------------------------------------------ the table itself


def test_the_step_sets_are_the_table():
    assert set(EPILOGUE_TABLE) == UNARY_EPILOGUE_OPS | BINARY_EPILOGUE_OPS
    assert all(EPILOGUE_TABLE[n].arity == 1 for n in UNARY_EPILOGUE_OPS)
    assert set(table.BINARY_OPS) == BINARY_EPILOGUE_OPS  # the builder's ops are the steps
    assert {r.onnx.op for r in EPILOGUE_TABLE.values() if r.arity == 2} == set(ONNX_BINARY_STEPS)


def test_every_row_with_attributes_has_cases_and_an_onnx_mapping():
    for name, row in EPILOGUE_TABLE.items():
        if row.attrs:
            assert ATTR_CASES.get(name), f"{name}: add non-default attribute cases above"
        if row.onnx is not None:
            assert {a.step for a in row.onnx.attrs} == {k for k, _ in row.attrs}, name


@pytest.mark.parametrize("name", sorted(n for n, r in EPILOGUE_TABLE.items() if r.onnx))
def test_onnx_forms_agree_with_the_onnx_schemas(name):
    row = EPILOGUE_TABLE[name]
    form = row.onnx
    schema = onnx.defs.get_schema(form.op, form.since)
    assert schema.since_version <= form.since
    if form.since > 1:  # the op does not exist before `since`
        with pytest.raises(onnx.defs.SchemaError):
            onnx.defs.get_schema(form.op, form.since - 1)
    defaults = dict(row.attrs)
    for spec in form.attrs:
        if spec.input_since is not None:
            inputs = onnx.defs.get_schema(form.op, spec.input_since).inputs
            assert inputs[spec.index].name == spec.onnx
        if defaults[spec.step] is not None:
            onnx_default = helper.get_attribute_value(schema.attributes[spec.onnx].default_value)
            assert np.float32(defaults[spec.step]) == np.float32(onnx_default)
    for attr, _, default in form.fixed:
        value = helper.get_attribute_value(schema.attributes[attr].default_value)
        assert (value.decode() if isinstance(value, bytes) else value) == default


def test_every_formula_reads_each_intermediate_once():
    for name, row in EPILOGUE_TABLE.items():
        optional = [k for k, default in row.attrs if default is None]
        for mask in range(1 << len(optional)):
            given = frozenset(k for i, k in enumerate(optional) if mask >> i & 1)
            given |= {k for k, default in row.attrs if default is not None}
            uses = argument_uses(name, given)
            assert len(uses) == row.arity and all(u >= 1 for u in uses), (name, given, uses)


def test_a_formula_reading_an_intermediate_twice_is_refused(monkeypatch):
    def square_twice(b, x):
        y = b.mul(x, x)
        return b.add(y, y)

    monkeypatch.setitem(EPILOGUE_TABLE, "square_twice", EpilogueOp("square_twice", 1,
                                                                    square_twice))
    with pytest.raises(ValueError, match="intermediate value twice"):
        argument_uses("square_twice", frozenset())


# ------------------------------------------------------------------ every backend agrees


@pytest.mark.parametrize("step", CASES, ids=_id)
def test_numpy_float32_matches_float64(step, rng):
    x, w = _inputs(step, rng)
    y = x.astype(np.float32)
    result = apply_epilogue(y, [step], [None, w.astype(np.float32)])
    assert result is y and result.dtype == np.float32
    _close(result, _reference(step, x, w))


@pytest.mark.parametrize("step", CASES, ids=_id)
def test_numpy_into_an_output_leaves_the_input_alone(step, rng):
    x, w = _inputs(step, rng)
    before, out = x.copy(), np.full(N, np.nan)
    apply_epilogue_into(out, x, [step], [x, w])
    np.testing.assert_array_equal(x, before)
    np.testing.assert_array_equal(out, _reference(step, x, w))


@pytest.mark.isa  # ISA-dependent: scripts/isa_check.sh reruns it for AVX2
@pytest.mark.parametrize("step", CASES, ids=_id)
def test_dsl_interpreter_c_kernel_and_gpu_emulator_match_numpy(step, rng):
    x, w = _inputs(step, rng)
    expected = _reference(step, x, w)
    binary = EPILOGUE_TABLE[step.op].arity == 2
    op = with_epilogue(load_operator("copy"), [step], {1: (N,)} if binary else {})
    arrays = {"X": x, "E1": w} if binary else {"X": x}
    _close(evaluate(op, arrays)["Y"], expected, rtol=1e-12, atol=1e-14)
    singles = {k: v.astype(np.float32) for k, v in arrays.items()}
    bindings = infer_bindings(op, singles)
    _close(templates.build_cpu(op, bindings)(**singles)["Y"], expected)
    _close(templates.emulate_cuda(op, bindings, None, singles)["Y"], expected)


@pytest.mark.parametrize("step", CASES, ids=_id)
def test_cuda_source_matches_numpy(step, rng):
    x, w = _inputs(step, rng)
    source = epilogue_source([step])
    assert source.operands == ((1,) if EPILOGUE_TABLE[step.op].arity == 2 else ())
    got = run_c_body(source.body, x.astype(np.float32), [w.astype(np.float32)])
    _close(got, _reference(step, x, w), rtol=1e-12, atol=1e-14)


def _cupy_like_kernel(name: str, step: EpilogueStep) -> str:
    """The body of `step` in a kernel shaped like the one cupy's ElementwiseKernel makes."""
    source = epilogue_source([step])
    params = ", ".join(["float* y_", *(f"const float* o{i}_" for i in range(len(source.operands)))])
    reads = "".join(f"const float o{i} = o{i}_[i]; " for i in range(len(source.operands)))
    return (f'extern "C" __global__ void {name}({params}, int n) {{\n'
            f"int i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return; {reads}"
            f"float& y = y_[i];\n{source.body}\n}}")


@pytest.mark.skipif(not nvrtc_available(), reason="the NVRTC 12 and ptxas wheels are missing")
def test_cuda_sources_compile_with_nvrtc():
    """NVRTC, which cupy compiles with, has no math.h: infinities and NaN need no macro."""
    odd = [EpilogueStep("clip", (("min", -math.inf), ("max", math.inf))),
           EpilogueStep("clip", (("max", math.nan),)),
           EpilogueStep("leaky_relu", (("alpha", -2.0),))]
    steps = CASES + odd
    source = "\n".join(_cupy_like_kernel(f"k{i}", step) for i, step in enumerate(steps))
    binary = compile_cuda(source, "sm_90", compiler="nvrtc")
    assert set(binary.kernels) == {f"k{i}" for i in range(len(steps))}
    x = np.array([-np.inf, -3.0, 0.5, np.inf], np.float32)
    got = run_c_body(epilogue_source(odd[:1]).body, x, [])
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("step", CASES, ids=_id)
def test_onnx_nodes_match_numpy(step, opset, rng):
    x, w = _inputs(step, rng)
    nodes = epilogue_onnx_nodes([step], "x", {1: "w"}, "y", "e_", opset=opset)
    ops = [n.op_type for n in nodes if n.op_type != "Constant"]
    form = EPILOGUE_TABLE[step.op].onnx
    if form is not None and opset >= form.since:
        assert ops == [form.op]  # the single op, not the formula
    elif form is not None:
        assert form.op not in ops
    _close(_run_onnx(nodes, opset, x, w), _reference(step, x, w))


@pytest.mark.parametrize("step", CASES, ids=_id)
def test_onnx_formula_nodes_match_numpy_too(step, rng):
    """The formula's ONNX nodes, which opsets without the single op get, for every row."""
    x, w = _inputs(step, rng)
    builder = OnnxBuilder("f_", "float32", 17)  # onnxruntime has no float64 Erf
    builder.finish(step_value(builder, step, "x", "w"), "y")
    _close(_run_onnx(builder.nodes, 17, x, w), _reference(step, x, w))


# ------------------------------------------------------------------ ONNX back to steps


def _node_values(nodes) -> tuple[onnx.NodeProto, list[float | None]]:
    constants = {n.output[0]: float(numpy_helper.to_array(n.attribute[0].t))
                 for n in nodes if n.op_type == "Constant"}
    (node,) = [n for n in nodes if n.op_type != "Constant"]
    return node, [constants.get(name) for name in node.input]


@pytest.mark.parametrize("opset", (9, 24))
@pytest.mark.parametrize("step", [s for s in CASES if EPILOGUE_TABLE[s.op].onnx], ids=_id)
def test_single_onnx_ops_parse_back_to_their_step(step, opset):
    row = EPILOGUE_TABLE[step.op]
    if opset < row.onnx.since:
        pytest.skip(f"{row.onnx.op} is not in opset {opset}")
    node, inputs = _node_values(epilogue_onnx_nodes([step], "x", {1: "w"}, "y", "p_",
                                                     opset=opset))
    if row.arity == 2:
        assert ONNX_BINARY_STEPS[node.op_type] == step.op
        assert list(node.input) == (["w", "x"] if step.swap else ["x", "w"])
        return
    expected = row.attr_values(dict(step.attrs))
    for spec in row.onnx.attrs:  # an attribute cannot be absent: the open bound is written
        if expected[spec.step] is None and not spec.as_input(opset):
            expected[spec.step] = spec.unset
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    name, parsed = step_from_onnx(node.op_type, attrs, [None, *inputs[1:]])
    assert name == step.op
    assert [k for k, _ in parsed] == [k for k, v in expected.items() if v is not None]
    for key, value in parsed:  # ONNX holds float32 values
        assert np.float32(value) == np.float32(expected[key]), key


def test_ops_that_are_no_step_do_not_parse():
    assert step_from_onnx("Swish", {}) is None  # see the silu row
    assert step_from_onnx("Add", {}) is None and step_from_onnx("Cosh", {}) is None
    assert step_from_onnx("Gelu", {"approximate": b"tanh"}) == ("gelu_tanh", ())


# ------------------------------------------------------------------ numerics kept


def test_sigmoid_and_silu_are_exact_for_large_negative_inputs():
    x = np.array([-1000.0, -104.0, -88.0, -20.0, 0.0, 20.0, 1000.0])
    for dtype in (np.float32, np.float64):
        got = apply_epilogue(x.astype(dtype), [EpilogueStep("sigmoid")], [])
        np.testing.assert_array_equal(got, expit(x.astype(dtype)))
        silu = apply_epilogue(x.astype(dtype), [EpilogueStep("silu")], [])
        np.testing.assert_array_equal(silu, x.astype(dtype) * expit(x.astype(dtype)))


def test_gelu_uses_the_exact_erf_and_softplus_does_not_overflow():
    x = np.linspace(-6, 6, 97)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(apply_epilogue(x.copy(), [EpilogueStep("gelu")], []), exact,
                               rtol=1e-14, atol=1e-300)
    big = np.array([-1000.0, -50.0, 50.0, 1000.0])
    expected = np.logaddexp(0, big)
    step = EpilogueStep("softplus")
    np.testing.assert_allclose(apply_epilogue(big.copy(), [step], []), expected, rtol=1e-15)
    op = with_epilogue(load_operator("copy"), [step])
    singles = {"X": big.astype(np.float32)}
    c_result = templates.build_cpu(op, infer_bindings(op, singles))(**singles)["Y"]
    np.testing.assert_allclose(c_result, expected, rtol=1e-6, atol=1e-6)
    got = run_c_body(epilogue_source([step]).body, big.astype(np.float32), [])
    np.testing.assert_allclose(got, expected, rtol=1e-15)
