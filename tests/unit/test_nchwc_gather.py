"""Channel Concat, shuffle and split of blocked tensors as ChannelGather nodes
(wpk/passes/nchwc_gather.py inside the NCHWc layout): ShuffleNet's block ends stay blocked,
with onnxruntime's outputs; what is not a channel shuffle is left alone."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.unit.nchwc_support import evaluate, model_x_to_y, ort_outputs
from wpk.core.numerics import relative_l2
from wpk.frontend import load_model
from wpk.kernels import nchwc_format as fmt
from wpk.passes.base import check_graph, readers_of
from wpk.passes.nchwc_gather import MAX_SOURCES, shuffle_permutation
from wpk.passes.nchwc_layout import NchwcLayout, NchwcOptions
from wpk.passes.nchwc_rules import conv_input_mode

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

B = fmt.host_block_size()
HALF = B + 4   # a multiple of 4, not of the block (ShuffleNet's 58 and 116 are not whole blocks)
SIZE = 6


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


class _Writer:
    """A ShuffleNet-v2-like model: a stem conv, then blocks of split, branch (1x1, depthwise
    3x3, 1x1), Concat, channel shuffle (Reshape, Transpose, Reshape), then a 1x1 conv."""

    def __init__(self, rng, half=HALF, groups=2, use_slice=False, perm=None, expose=False):
        self.rng, self.half, self.groups = rng, half, groups
        self.use_slice, self.perm, self.expose = use_slice, perm, expose
        self.nodes, self.inits, self.outputs = [], [], []

    def weight(self, name, out, inp, k=1):
        scale = np.sqrt(2.0 / (inp * k * k))
        self.inits.append(_const(name, self.rng.standard_normal((out, inp, k, k)) * scale))
        return name

    def conv(self, x, out, inp, name, k=1, group=1):
        w = self.weight(f"{name}_w", out, inp // group, k)
        self.nodes += [helper.make_node("Conv", [x, w], [f"{name}_c"], pads=[k // 2] * 4,
                                        group=group),
                       helper.make_node("Relu", [f"{name}_c"], [name])]
        return name

    def split(self, x, tag):
        a, b, c = f"{tag}_a", f"{tag}_b", 2 * self.half
        if self.use_slice:
            for piece, (start, end) in ((a, (0, self.half)), (b, (self.half, c))):
                self.inits += [_const(f"{piece}_s", [start], np.int64),
                               _const(f"{piece}_e", [end], np.int64),
                               _const(f"{piece}_ax", [1], np.int64)]
                self.nodes.append(helper.make_node(
                    "Slice", [x, f"{piece}_s", f"{piece}_e", f"{piece}_ax"], [piece]))
        else:
            self.inits.append(_const(f"{tag}_sizes", [self.half, self.half], np.int64))
            self.nodes.append(helper.make_node("Split", [x, f"{tag}_sizes"], [a, b], axis=1))
        return a, b

    def shuffle(self, x, tag):
        c, g = 2 * self.half, self.groups
        perm = self.perm or [0, 2, 1, 3, 4]
        self.inits += [_const(f"{tag}_s1", [1, g, c // g, SIZE, SIZE], np.int64),
                       _const(f"{tag}_s2", [1, c, SIZE, SIZE], np.int64)]
        self.nodes += [helper.make_node("Reshape", [x, f"{tag}_s1"], [f"{tag}_r"]),
                       helper.make_node("Transpose", [f"{tag}_r"], [f"{tag}_t"], perm=perm),
                       helper.make_node("Reshape", [f"{tag}_t", f"{tag}_s2"], [tag])]
        if self.expose:
            self.outputs.append((f"{tag}_r", [1, g, c // g, SIZE, SIZE]))
        return tag

    def block(self, x, tag):
        a, b = self.split(x, tag)
        h = self.half
        branch = self.conv(self.conv(self.conv(b, h, h, f"{tag}_e"), h, h, f"{tag}_d", 3, h),
                           h, h, f"{tag}_p")
        self.nodes.append(helper.make_node("Concat", [a, branch], [f"{tag}_cat"], axis=1))
        return self.shuffle(f"{tag}_cat", f"{tag}_shuffled")

    def model(self, blocks=3):
        x = self.conv("x", 2 * self.half, 3, "stem", 3)
        for index in range(blocks):
            x = self.block(x, f"b{index}")
        w = self.weight("head_w", 8, 2 * self.half)
        self.nodes.append(helper.make_node("Conv", [x, w], ["y"]))
        model = model_x_to_y("shufflenet_like", self.nodes, self.inits, [1, 3, SIZE, SIZE],
                             [1, 8, SIZE, SIZE])
        for name, shape in self.outputs:
            model.graph.output.append(helper.make_tensor_value_info(name, 1, shape))
        return model


def _optimize(model, rng, impl="native.nchwc", block=None):
    graph = load_model(model)
    feeds = {"x": rng.standard_normal(graph.tensors["x"].shape).astype(np.float32)}
    expected = ort_outputs(graph, feeds)
    optimized = NchwcLayout(NchwcOptions(block=block)).run(graph.copy())
    check_graph(optimized)
    actual = evaluate(optimized, feeds, impl)
    for name in graph.outputs:
        assert relative_l2(actual[name], expected[name]) <= 1e-5, name
    return optimized


def _ops(graph):
    return collections.Counter(n.op for n in graph.nodes)


@pytest.mark.parametrize("use_slice", [False, True])
@pytest.mark.parametrize("impl,block", [("native.nchwc", None), ("ort.nchwc", None),
                                        ("numpy.nchwc", 8), ("native.nchwc", 16)])
def test_shufflenet_block_ends_stay_blocked(use_slice, impl, block, rng):
    optimized = _optimize(_Writer(rng, use_slice=use_slice).model(), rng, impl, block)
    ops = _ops(optimized)
    for op in ("Concat", "Reshape", "Transpose", "Split", "Slice", "ReorderInput"):
        assert op not in ops, ops
    assert ops["ReorderOutput"] == 1   # the graph output's
    gathers = [n for n in optimized.nodes if n.op == "ChannelGather"]
    # block 0: its branch's half of the stem; then per block the next branch's half and
    # (from block 1 on) the pass-through half, written before it would read 3 tensors;
    # last the head's input
    assert len(gathers) == 1 + 2 * 2 + 1, [n.name for n in gathers]
    assert all(len(n.inputs) <= MAX_SOURCES for n in gathers)


@pytest.mark.parametrize("groups", [2, 4])
def test_other_group_counts_shuffle_the_same_way(groups, rng):
    half = 2 * B if groups == 4 else HALF   # 4 groups need 4 | 2 * half
    optimized = _optimize(_Writer(rng, half=half, groups=groups).model(blocks=2), rng)
    assert "Transpose" not in _ops(optimized)


def test_a_transpose_that_moves_the_pixels_is_not_a_shuffle(rng):
    model = _Writer(rng, perm=[0, 2, 1, 4, 3]).model(blocks=1)
    graph = load_model(model)
    reshape = next(n for n in graph.nodes if n.op == "Reshape")
    assert shuffle_permutation(graph, reshape, readers_of(graph)) is None
    assert "Transpose" in _ops(_optimize(model, rng))


def test_a_shuffle_whose_middle_is_read_elsewhere_is_left_alone(rng):
    model = _Writer(rng, expose=True).model(blocks=1)
    graph = load_model(model)
    reshape = next(n for n in graph.nodes if n.op == "Reshape")
    assert shuffle_permutation(graph, reshape, readers_of(graph)) is None
    assert "Transpose" in _ops(_optimize(model, rng))


def test_the_shuffle_permutation_is_the_transposed_channel_order(rng):
    graph = load_model(_Writer(rng, half=3, groups=2).model(blocks=1))
    reshape = next(n for n in graph.nodes if n.op == "Reshape")
    form = shuffle_permutation(graph, reshape, readers_of(graph))
    assert form.permutation.tolist() == [0, 3, 1, 4, 2, 5]
    assert [n.op for n in form.absorbed] == ["Transpose", "Reshape"]


def test_a_shuffle_of_an_nchw_tensor_stays_as_it_is(rng):
    """No conv before it: nothing it reads is blocked, the Reshape, Transpose and Reshape
    remain (the other conv reads a Relu of the input, blocked after it)."""
    writer = _Writer(rng)
    writer.shuffle("x0", "s")
    writer.nodes.insert(0, helper.make_node("Concat", ["x", "x"], ["x0"], axis=1))
    writer.nodes.append(helper.make_node("Conv", ["s", writer.weight("w", 8, 2 * HALF)],
                                         ["y"]))
    writer.nodes[:0] = [helper.make_node("Relu", ["x"], ["relu"]),
                        helper.make_node("Conv", ["relu", writer.weight("w0", HALF, HALF)],
                                         ["unused"])]
    model = model_x_to_y("nchw_shuffle", writer.nodes, writer.inits, [1, HALF, SIZE, SIZE],
                         [1, 8, SIZE, SIZE])
    model.graph.output.append(helper.make_tensor_value_info("unused", 1,
                                                            [1, HALF, SIZE, SIZE]))
    ops = _ops(_optimize(model, rng))
    assert ops["Transpose"] == 1 and ops["Reshape"] == 2


def test_convs_padded_by_at_most_a_quarter_take_the_layout(rng):
    def mode(out_channels):
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"])]
        w = _const("w", rng.standard_normal((out_channels, 2 * B, 1, 1)))
        graph = load_model(model_x_to_y("c", nodes, [w], [1, 2 * B, 4, 4],
                                        [1, out_channels, 4, 4]))
        return conv_input_mode(graph, graph.nodes[0], B, set())
    assert mode(4 * B - 2) == "blocked"   # 62 of 64 lanes (ShuffleNet's 58 of 64 alike)
    assert mode(B + 2) == ""              # 18 of 32: most of the second block wasted
    assert mode(B + 4) == "blocked"       # a multiple of 4, as before
    assert mode(4 * B - 1) == ""          # odd: an image output's count, as before


def _separable_model(rng, channels, tail="Conv"):
    """conv 1x1 (2B -> channels) -> Relu -> depthwise 3x3 -> `tail`: a conv 1x1 back to
    `channels` (NASNet's separable convs on 11 or 22 channels) or a Resize to the output
    (a segmentation head's classes)."""
    inits = [_const("w0", rng.standard_normal((channels, 2 * B, 1, 1)) * 0.3),
             _const("wd", rng.standard_normal((channels, 1, 3, 3)) * 0.3),
             _const("w1", rng.standard_normal((channels, channels, 1, 1)) * 0.3),
             _const("scales", [1, 1, 2, 2])]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "wd"], ["d"], group=channels, pads=[1, 1, 1, 1])]
    if tail == "Conv":
        nodes.append(helper.make_node("Conv", ["d", "w1"], ["y"]))
        out = [1, channels, 6, 6]
    else:
        nodes.append(helper.make_node("Resize", ["d", "", "scales"], ["y"]))
        out = [1, channels, 12, 12]
    return model_x_to_y("separable", nodes, inits, [1, 2 * B, 6, 6], out)


@pytest.mark.parametrize("impl", ["native.nchwc", "ort.nchwc"])
@pytest.mark.parametrize("channels", [11, B + 2])
def test_narrow_channels_a_conv_reads_take_the_layout(channels, impl, rng):
    """11 or B + 2 channels, at least half of their blocks' lanes, stay blocked where a
    conv reads them (NASNet's separable convs): no reorder between the convs, the same
    results; as a head's output (resized and returned) they stay NCHW."""
    optimized = _optimize(_separable_model(rng, channels), rng, impl)
    ops = _ops(optimized)
    assert ops["Conv"] == 3 and "Relu" not in ops, ops
    assert ops["ReorderInput"] == 1 and ops["ReorderOutput"] == 1   # the input's, output's
    head = load_model(_separable_model(rng, channels, tail="Resize"))
    depthwise = [n for n in head.nodes if n.op == "Conv"][1]
    assert conv_input_mode(head, depthwise, B, {"r"}) == ""
