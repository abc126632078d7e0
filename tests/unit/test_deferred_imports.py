"""What loading a plan imports: onnx and scipy.special only where a step needs them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from wpk.core.deferred import DeferredModule
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels.cpu.node_model import core_input_count, schema_for


def _fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_runtime_imports_neither_onnx_nor_scipy_special():
    """onnx (with ml_dtypes, about a second on the VMs) and scipy.special (0.2-0.3 s) wait
    for a step that uses them."""
    out = _fresh("""
        import sys
        import wpk.runtime, wpk.kernels.builtin, wpk.kernels.reference
        print(sorted(m for m in ("onnx", "ml_dtypes", "scipy.special") if m in sys.modules))
    """)
    assert out == "[]"


def test_a_deferred_module_imports_on_its_first_attribute_read():
    out = _fresh("""
        import sys
        from wpk.core.deferred import DeferredModule
        colorsys = DeferredModule("colorsys")
        before = "colorsys" in sys.modules
        value = colorsys.rgb_to_hsv(1.0, 0.0, 0.0)
        print(before, "colorsys" in sys.modules, value, repr(colorsys).endswith("(imported)>"))
    """)
    assert out == "False True (0.0, 1.0, 1.0) True"


def test_a_deferred_module_refuses_attribute_writes_and_names_missing_ones():
    stand_in = DeferredModule("json")
    with pytest.raises(AttributeError, match="stand-in"):
        stand_in.dumps = None
    with pytest.raises(AttributeError, match="no_such_function"):
        stand_in.no_such_function  # noqa: B018


@pytest.mark.parametrize("op, inputs", [
    ("Conv", 3), ("Conv", 2), ("Gemm", 3), ("Gemm", 2), ("Softmax", 1), ("Clip", 3),
    ("Resize", 4), ("Concat", 5), ("LayerNormalization", 3), ("MatMul", 2)])
def test_without_epilogue_operands_every_input_is_the_ops_as_its_schema_says(op, inputs):
    """The count read without the schema (onnx not imported) is the schema's answer."""
    specs = tuple(TensorSpec((2, 3), "float32") for _ in range(inputs))
    workload = Workload(op, specs, (TensorSpec((2, 3), "float32"),), opset=17)
    schema = schema_for(workload)
    assert core_input_count(workload) == min(max(inputs, schema.min_input),
                                             schema.max_input, inputs)


def test_an_epilogue_operand_after_the_ops_inputs_is_still_told_apart():
    specs = tuple(TensorSpec((2, 3), "float32") for _ in range(3))
    workload = Workload("MatMul", specs, (TensorSpec((2, 3), "float32"),), opset=17,
                        epilogue=(EpilogueStep("Add", operand=2),))
    assert core_input_count(workload) == 2


def test_a_plan_with_bfloat16_weights_reads_in_a_process_without_onnx(rng, tmp_path):
    """bfloat16 is ml_dtypes', which numpy knows only once it is imported (onnx imports it):
    the manifest's check imports it where the manifest names such a dtype."""
    import ml_dtypes

    from wpk.plans.planfile import Plan

    from .plan_helpers import tiny_plan

    _, plan = tiny_plan(rng)
    narrow = rng.standard_normal(5).astype(ml_dtypes.bfloat16)
    plan = Plan(plan.manifest, {**plan.weights, "narrow": narrow}, plan.report, plan.kernels)
    path = plan.save(tmp_path / "bf16.wpk")
    out = _fresh(f"""
        import sys
        from wpk.plans.planfile import read_plan
        narrow = read_plan({str(path)!r}).weights["narrow"]
        print(narrow.dtype.name, narrow.astype("float32").tolist(), "onnx" in sys.modules)
    """)
    assert out == f"bfloat16 {narrow.astype(np.float32).tolist()} False"
