"""An op's own invariants (`wpk.core.op_checks`): what the ONNX checker lets through when a
model declares its output shapes, said in terms of the attribute or input to fix."""

from __future__ import annotations

import pytest

from wpk.core.op_checks import op_problem
from wpk.core.workload import TensorSpec, Workload


def conv(x=(1, 4, 8, 8), w=(8, 4, 3, 3), y=(1, 8, 8, 8), op="Conv", **attrs):
    attrs.setdefault("pads", (1, 1, 1, 1))
    return Workload(op, (TensorSpec(x), TensorSpec(w)), (TensorSpec(y),),
                    attrs=tuple(sorted(attrs.items())))


def test_valid_convolutions_pass():
    assert op_problem(conv()) is None
    assert op_problem(conv(w=(8, 1, 3, 3), group=4)) is None                  # grouped
    assert op_problem(conv(w=(4, 1, 3, 3), y=(1, 4, 8, 8), group=4)) is None  # depthwise
    assert op_problem(conv(y=(1, 8, 4, 4), strides=(2, 2))) is None
    assert op_problem(conv(y=(1, 8, 6, 6), pads=(0, 0, 0, 0))) is None
    assert op_problem(conv(y=(1, 8, 4, 4), dilations=(2, 2), pads=(0, 0, 0, 0))) is None
    assert op_problem(conv(x=(1, 4, 9), w=(8, 4, 3), y=(1, 8, 7), pads=(0, 0))) is None  # 1-d
    assert op_problem(conv(y=(1, 8, 3, 3), pads=None, auto_pad="SAME_UPPER")) is None


@pytest.mark.parametrize("workload,fragment", [
    (conv(group=0), "group=0"),
    (conv(group=-1), "group=-1"),
    (conv(w=(8, 3, 3, 3)), "4 channels"),
    (conv(w=(8, 1, 3, 3), group=3), "group=3 does not divide"),
    (conv(w=(6, 2, 3, 3), group=2, y=(1, 6, 8, 8)) , None),
    (conv(w=(7, 1, 3, 3), group=4, y=(1, 7, 8, 8)), "7 output channels"),
    (conv(kernel_shape=(5, 5)), "kernel_shape=[5, 5]"),
    (conv(y=(1, 8, 6, 6)), "[6, 6]"),
    (conv(strides=(0, 1)), "strides=[0, 1]"),
    (conv(dilations="x"), "dilations='x'"),
    (conv(group="2"), "not an integer"),
    (conv(op="ConvTranspose", w=(3, 8, 3, 3)), "4 channels"),
])
def test_each_violation_names_what_to_fix(workload, fragment):
    problem = op_problem(workload)
    if fragment is None:
        assert problem is None
    else:
        assert problem is not None and fragment in problem, problem


def test_other_ops_and_domains_are_left_to_their_kernels():
    assert op_problem(Workload("Relu", (TensorSpec((2,)),), (TensorSpec((2,)),))) is None
    attention = Workload("Attention", (TensorSpec((1, 2, 4, 8)),) * 3,
                         (TensorSpec((1, 2, 4, 8)),), domain="wpk")
    assert op_problem(attention) is None


def test_the_blocked_layouts_conv_and_pools_carry_their_block_and_window():
    """A plan's blocked Conv runs a kernel compiled at build time, which would not read a
    corrupted window: its block, channels, group and window must be whole and positive."""
    def blocked(**attrs):
        return Workload("Conv", (TensorSpec((1, 1, 8, 8, 16)), TensorSpec((16, 16, 3, 3))),
                        (TensorSpec((1, 1, 8, 8, 16)),), tuple(sorted(attrs.items())),
                        domain="wpk.nchwc")

    good = {"block": 16, "channels": 16, "group": 1, "kernel_shape": (3, 3),
            "strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}
    assert op_problem(blocked(**good)) is None
    assert "block" in op_problem(blocked())
    assert "group=-1" in op_problem(blocked(**{**good, "group": -1}))
    assert "dilations='x'" in op_problem(blocked(**{**good, "dilations": "x"}))
    assert "kernel_shape" in op_problem(blocked(block=16, channels=16))
    pool = Workload("MaxPool", (TensorSpec((1, 1, 8, 8, 16)),), (TensorSpec((1, 1, 4, 4, 16)),),
                    (("block", 16), ("channels", 0), ("kernel_shape", (2, 2))),
                    domain="wpk.nchwc")
    assert "channels=0" in op_problem(pool)
