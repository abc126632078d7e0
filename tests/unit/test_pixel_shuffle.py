"""DepthToSpace and SpaceToDepth (a super-resolution network's PixelShuffle): as NCHW copies
(`numpy.copy`), and DepthToSpace read straight from the blocked layout (`native.nchwc`,
`numpy.nchwc`) against ONNX's own op on the real lanes; when the NCHWc layout pass takes it
and when it must not; whole builds against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from wpk.core.numerics import relative_l2
from wpk.core.op_checks import op_problem
from wpk.core.workload import TensorSpec, Workload
from wpk.frontend import load_model
from wpk.kernels import nchwc_format as fmt
from wpk.kernels import registry
from wpk.kernels.cpu.native_chain import chain_kernel
from wpk.kernels.nchwc_reference import nchwc_reference
from wpk.kernels.reference import reference
from wpk.kernels.support import unsupported_reason
from wpk.passes.base import check_graph
from wpk.passes.nchwc_layout import NchwcLayout, NchwcOptions

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

COPY = registry.get("numpy.copy")
NATIVE = registry.get("native.nchwc")
NUMPY_NCHWC = registry.get("numpy.nchwc")
BLOCKS = (8, 16)


def _plain(op: str, shape: tuple[int, ...], r: int, mode: str | None = None,
           opset: int = 13) -> Workload:
    n, c, h, w = shape
    out = (n, c // (r * r), h * r, w * r) if op == "DepthToSpace" else \
        (n, c * r * r, h // r, w // r)
    attrs = (("blocksize", r),) + ((("mode", mode),) if mode else ())
    return Workload(op, (TensorSpec(shape, "float32"),), (TensorSpec(out, "float32"),), attrs,
                    opset=opset)


PLAIN = {
    "DCR r3": _plain("DepthToSpace", (2, 18, 5, 7), 3, "DCR"),
    "CRD r3 (ESPCN's)": _plain("DepthToSpace", (1, 27, 4, 6), 3, "CRD"),
    "CRD r2, 1 pixel": _plain("DepthToSpace", (2, 8, 1, 1), 2, "CRD"),
    "DCR by default": _plain("DepthToSpace", (1, 12, 3, 2), 2),
    "SpaceToDepth r2": _plain("SpaceToDepth", (2, 3, 6, 4), 2),
    "SpaceToDepth r3": _plain("SpaceToDepth", (1, 5, 9, 3), 3),
    "SpaceToDepth CRD (opset 24)": _plain("SpaceToDepth", (2, 3, 6, 4), 2, "CRD", opset=24),
    "SpaceToDepth DCR (opset 24)": _plain("SpaceToDepth", (1, 2, 4, 6), 2, "DCR", opset=24),
}


@pytest.mark.parametrize("name", PLAIN)
def test_nchw_pixel_shuffles_are_exact_copies(name, rng):
    workload = PLAIN[name]
    assert COPY.unsupported_reason(workload) is None
    kernel = COPY.prepare(workload, {}, {})
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    expected = reference(workload, [x])[0].astype(np.float32)   # onnx.reference's op
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel([x], [y])
    np.testing.assert_array_equal(y, expected)
    y[...] = np.nan
    call = kernel.native([x], [y])   # one strided native copy: it joins a chain
    assert call is not None
    chain_kernel([call], keep=[kernel])([], [])
    np.testing.assert_array_equal(y, expected)


def _blocked(b: int, out_channels: int, r: int, h: int, w: int, mode: str,
             batch: int = 1) -> Workload:
    x = fmt.blocked_shape((batch, out_channels * r * r, h, w), b)
    return Workload("DepthToSpace", (TensorSpec(x, "float32"),),
                    (TensorSpec((batch, out_channels, h * r, w * r), "float32"),),
                    tuple(sorted({"block": b, "channels": out_channels, "blocksize": r,
                                  "mode": mode}.items())), domain="wpk.nchwc")


def _blocked_cases(b: int) -> dict[str, Workload]:
    return {
        "CRD r3, 27 channels (ESPCN's)": _blocked(b, 3, 3, 5, 7, "CRD"),
        "DCR r3, a phase's channels across blocks": _blocked(b, 3, 3, 5, 7, "DCR"),
        "CRD r2, batch 2, whole blocks": _blocked(b, b // 2, 2, 3, 4, "CRD", batch=2),
        "DCR r2, 1 pixel": _blocked(b, 5, 2, 1, 1, "DCR"),
        "CRD r4, 1 channel": _blocked(b, 1, 4, 2, 3, "CRD"),
        # more floats than PAR_MIN: the rows over OpenMP threads
        "CRD r3, threads": _blocked(b, 3, 3, 61, 37, "CRD"),
        "DCR r2, threads, batch 2": _blocked(b, 7, 2, 41, 29, "DCR", batch=2),
    }


BLOCKED = [pytest.param(b, name, id=f"b{b}-{name}") for b in BLOCKS for name in
           _blocked_cases(b)]


@pytest.mark.parametrize(("b", "name"), BLOCKED)
@pytest.mark.parametrize("impl", [NATIVE, NUMPY_NCHWC], ids=lambda i: i.name)
def test_blocked_depth_to_space_matches_onnx_on_the_real_lanes(impl, b, name, rng):
    workload = _blocked_cases(b)[name]
    assert impl.unsupported_reason(workload) is None
    kernel = impl.prepare(workload, {}, {})
    for _ in range(2):   # new buffers: rebound, not stale
        x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)  # dirty lanes
        y = np.full(workload.outputs[0].shape, np.nan, np.float32)
        kernel([x], [y])
        np.testing.assert_array_equal(y, nchwc_reference(workload, [x])[0].astype(np.float32))


@pytest.mark.parametrize(("b", "name"), BLOCKED[:3])
def test_the_blocked_depth_to_space_runs_in_a_chain(b, name, rng):
    workload = _blocked_cases(b)[name]
    kernel = NATIVE.prepare(workload, {}, {})
    x = rng.standard_normal(workload.inputs[0].shape).astype(np.float32)
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)
    chain_kernel([kernel.native([x], [y])], keep=[kernel])([], [])
    np.testing.assert_array_equal(y, nchwc_reference(workload, [x])[0].astype(np.float32))


def test_the_reference_is_onnx_depth_to_space_of_the_real_lanes(rng):
    """Checked by hand on one pixel: CRD puts channel (c*r + i)*r + j at (i, j) of channel
    c; DCR channel (i*r + j)*C + c."""
    b, r, c = 8, 2, 3
    for mode, index in (("CRD", lambda k, i, j: (k * r + i) * r + j),
                        ("DCR", lambda k, i, j: (i * r + j) * c + k)):
        workload = _blocked(b, c, r, 1, 1, mode)
        x = rng.standard_normal(workload.inputs[0].shape)
        y = nchwc_reference(workload, [x])[0]
        flat = fmt.unblock(x, c * r * r)[0, :, 0, 0]
        for k in range(c):
            for i in range(r):
                for j in range(r):
                    assert y[0, k, i, j] == flat[index(k, i, j)]


def test_what_the_blocked_depth_to_space_refuses():
    good = _blocked(8, 3, 3, 4, 4, "CRD")
    assert NATIVE.unsupported_reason(good) is None
    bad_mode = Workload(good.op, good.inputs, good.outputs,
                        tuple((k, "XYZ" if k == "mode" else v) for k, v in good.attrs),
                        domain=good.domain)
    assert "DCR or CRD" in unsupported_reason(bad_mode)
    wrong_size = Workload(good.op, good.inputs, (TensorSpec((1, 3, 8, 8), "float32"),),
                          good.attrs, domain=good.domain)
    assert "r^2" in unsupported_reason(wrong_size)


# --- the NCHWc layout pass ------------------------------------------------------------------

def sr_head(out_channels: int = 3, r: int = 3, mode: str = "CRD", extra_reader: str = "",
            size: int = 8) -> onnx.ModelProto:
    """x (1, 3, size, size) -> 3x3 conv to 16, ReLU -> 3x3 conv to out_channels * r^2 ->
    DepthToSpace -> Clip to [0, 1]; `extra_reader`: 'output' (the shuffle's input is a
    graph output too) or 'relu' (a Relu reads it besides the shuffle)."""
    rng = np.random.default_rng(3)
    depth = out_channels * r * r
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n)
             for n, s in (("w1", (16, 3, 3, 3)), ("b1", (16,)), ("w2", (depth, 16, 3, 3)),
                          ("b2", (depth,)))]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("lo", 0.0), ("hi", 1.0))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("DepthToSpace", ["c2"], ["s"], blocksize=r, mode=mode),
             helper.make_node("Clip", ["s", "lo", "hi"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader == "output":
        outputs.append(helper.make_tensor_value_info("c2", TensorProto.FLOAT, None))
    if extra_reader == "relu":
        nodes.append(helper.make_node("Relu", ["c2"], ["r2"]))
        outputs.append(helper.make_tensor_value_info("r2", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "sr", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, size, size])], outputs, inits)
    return onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _layout(model: onnx.ModelProto, block: int = 8):
    graph = NchwcLayout(NchwcOptions(block=block, min_convs=1)).run(load_model(model))
    check_graph(graph)
    return [(n.op, n.domain) for n in graph.nodes]


@pytest.mark.parametrize("mode", ["CRD", "DCR"])
def test_the_layout_keeps_the_shuffled_conv_blocked_and_reads_its_blocks(mode):
    ops = _layout(sr_head(mode=mode))
    assert ops.count(("Conv", "wpk.nchwc")) == 2   # 27 outputs: blocked all the same
    assert ("DepthToSpace", "wpk.nchwc") in ops
    assert ("ReorderOutput", "wpk.nchwc") not in ops   # the shuffle writes NCHW itself


@pytest.mark.parametrize("extra_reader", ["output", "relu"])
def test_a_conv_of_27_channels_read_by_more_than_the_shuffle_stays_nchw(extra_reader):
    ops = _layout(sr_head(extra_reader=extra_reader))
    assert ops.count(("Conv", "wpk.nchwc")) == 1 and ("Conv", "") in ops
    assert ("DepthToSpace", "") in ops


def test_a_shuffle_of_an_nchw_tensor_is_left_alone():
    model = sr_head(out_channels=4, r=2)     # 16 channels: the conv may be blocked ...
    ops = _layout(model)
    assert ("DepthToSpace", "wpk.nchwc") in ops
    nchw = NchwcLayout(NchwcOptions(enabled=False)).run(load_model(model))
    assert [n.op for n in nchw.nodes].count("DepthToSpace") == 1   # ... or not at all
    assert all(n.domain == "" for n in nchw.nodes)


@pytest.mark.parametrize("mode", ["CRD", "DCR"])
def test_builds_match_onnxruntime(mode):
    model = sr_head(mode=mode, size=20)
    x = np.random.default_rng(0).random((1, 3, 20, 20), np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    plan = wpk.build(model, target="cpu", progress=False, partition=False)
    shuffle = [s for s in plan.steps if s.op == "DepthToSpace"]
    assert len(shuffle) == 1 and shuffle[0].impl in ("native.nchwc", "numpy.nchwc")
    assert not any(s.op == "ReorderOutput" for s in plan.steps)
    got = wpk.runtime.Session(plan).run({"x": x})
    got = got["y"] if isinstance(got, dict) else got[0]
    assert relative_l2(got, expected) < 1e-5


def test_the_op_checks_refuse_a_blocksize_that_does_not_give_the_shapes():
    assert all(op_problem(w) is None for w in PLAIN.values())
    assert op_problem(_blocked(8, 3, 3, 4, 4, "CRD")) is None
    d2s = PLAIN["DCR r3"]   # 18 channels, blocksize 3
    for r, words in ((2, "does not divide"), (1, "gives"), (0, "positive")):
        edited = Workload(d2s.op, d2s.inputs, d2s.outputs, (("blocksize", r),), opset=13)
        assert words in op_problem(edited)
    s2d = PLAIN["SpaceToDepth r2"]   # 6 x 4 pixels
    edited = Workload(s2d.op, s2d.inputs, s2d.outputs, (("blocksize", 4),), opset=13)
    assert "not multiples" in op_problem(edited)
    blocked = _blocked(8, 3, 3, 4, 4, "CRD")
    edited = Workload(blocked.op, blocked.inputs, blocked.outputs,
                      tuple((k, 2 if k == "blocksize" else v) for k, v in blocked.attrs),
                      domain=blocked.domain)
    assert "gives" in op_problem(edited)
