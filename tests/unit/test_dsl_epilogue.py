"""Workload epilogues fused into DSL operators, checked against kernels.epilogue (numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.errors import DslError
from wpk.core.workload import UNARY_EPILOGUE_OPS, EpilogueStep
from wpk.dsl.compute import evaluate, infer_bindings
from wpk.dsl.epilogue import operand_name, with_epilogue
from wpk.kernels import templates
from wpk.kernels.dsl_library import load_operator
from wpk.kernels.epilogue import apply_epilogue

UNARY_ATTRS = {"clip": (("max", 6.0), ("min", 0.0)), "leaky_relu": (("alpha", 0.2),),
               "hard_sigmoid": (("alpha", 0.3), ("beta", 0.4))}


@pytest.mark.parametrize("name", sorted(UNARY_EPILOGUE_OPS))
def test_every_unary_epilogue_matches_numpy(rng, name):
    step = EpilogueStep(name, UNARY_ATTRS.get(name, ()))
    op = with_epilogue(load_operator("copy"), [step])
    x = rng.standard_normal(64)
    if name in ("log", "sqrt"):
        x = np.abs(x) + 0.1
    expected = apply_epilogue(x.copy(), [step], [])
    np.testing.assert_allclose(evaluate(op, {"X": x})["Y"], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.isa  # ISA-dependent: scripts/isa_check.sh reruns it for AVX2
def test_gemm_with_bias_residual_and_activation_chain(rng):
    # inputs of the fused node: 0 = A, 1 = B, 2 = bias [N], 3 = residual [M, N], 4 = scale [1, N]
    steps = [EpilogueStep("add", operand=2), EpilogueStep("relu"),
             EpilogueStep("add", operand=3), EpilogueStep("sub", operand=4, swap=True),
             EpilogueStep("clip", (("max", 1.5), ("min", -1.0)))]
    op = with_epilogue(load_operator("matmul"), steps, {2: (5,), 3: (4, 5), 4: (1, 5)})
    assert [p.name for p in op.params] == ["A", "B", "E2", "E3", "E4"]
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    bias, res = rng.standard_normal(5), rng.standard_normal((4, 5))
    scale = rng.standard_normal((1, 5))
    arrays = {"A": a, "B": b, operand_name(2): bias, "E3": res, "E4": scale}
    expected = apply_epilogue(a @ b, steps, [a, b, bias, res, scale])
    np.testing.assert_allclose(evaluate(op, arrays)["Y"], expected, rtol=1e-12)
    kernel = templates.build_cpu(op, infer_bindings(op, arrays))  # the fused C kernel agrees
    np.testing.assert_allclose(kernel(**arrays)["Y"], expected, rtol=1e-5, atol=1e-5)


def test_conv_with_channel_bias_and_silu(rng):
    steps = [EpilogueStep("add", operand=2), EpilogueStep("silu")]
    op = with_epilogue(load_operator("conv2d"), steps, {2: (3, 1, 1)})
    x, w, bias = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3)), \
        rng.standard_normal((3, 1, 1))
    plain = evaluate(load_operator("conv2d"), {"X": x, "Wt": w})["Y"]
    y = evaluate(op, {"X": x, "Wt": w, "E2": bias})["Y"]
    np.testing.assert_allclose(y, apply_epilogue(plain.copy(), steps, [x, w, bias]), rtol=1e-12)


def test_mismatched_operands_are_reported():
    op = with_epilogue(load_operator("copy"), [EpilogueStep("add", operand=1)], {1: (7,)})
    with pytest.raises(DslError, match="epilogue operand 1 has size 7 where the output has L"):
        evaluate(op, {"X": np.zeros(5), "E1": np.zeros(7)})
    with pytest.raises(DslError, match="rank 2, more than the output's 1"):
        with_epilogue(load_operator("copy"), [EpilogueStep("mul", operand=1)], {1: (1, 5)})
    with pytest.raises(DslError, match="needs the shape of operand 1"):
        with_epilogue(load_operator("copy"), [EpilogueStep("mul", operand=1)])
    with pytest.raises(DslError, match="unknown epilogue step 'swish2'"):
        with_epilogue(load_operator("copy"), [EpilogueStep("swish2")])
    assert with_epilogue(load_operator("copy"), []) is load_operator("copy")
