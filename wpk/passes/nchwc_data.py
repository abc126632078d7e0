"""Which data-movement nodes can stay in the NCHWc blocked layout, and as what.

Used by `wpk.passes.nchwc_layout`; every function reads one node and returns
None when the node must see NCHW tensors.

- `upsample_form`: a Resize (opset 11+) over H and W by whole-number factors that
  onnxruntime's blocked Upsample computes exactly: bilinear with the
  asymmetric, half_pixel (pytorch_half_pixel is the same for these sizes) or
  align_corners transformation, and nearest-neighbour whenever the spec's
  source index of every output pixel is plain replication (out // factor;
  torch's and Keras' nearest upsampling are).
- `channel_pieces`: the pieces of a Split, or a Slice with step 1, along the channels;
  `channel_slices` the same when every piece starts on a block boundary and ends on one
  or at the last channel: each piece is whole blocks of the input (the padding lanes
  ride along with the last one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wpk.core.graph import Graph, Node
from wpk.kernels.cpu.resize import nearest_source
from wpk.passes.base import constant_input, slice_parameters

_LINEAR_TRANSFORMS = {"asymmetric": "asymmetric", "half_pixel": "half_pixel",
                      "pytorch_half_pixel": "half_pixel", "align_corners": "align_corners"}
_NEAREST_TRANSFORMS = frozenset({*_LINEAR_TRANSFORMS, "tf_half_pixel_for_nn"})


@dataclass(frozen=True)
class UpsampleForm:
    """A blocked Upsample: factors along H and W, mode and coordinate transformation."""

    scales: tuple[int, int]
    mode: str        # nearest | linear
    transform: str   # asymmetric (nearest) | asymmetric, half_pixel, align_corners (linear)


def _const(graph: Graph, node: Node, index: int) -> np.ndarray | None:
    """The constant input `index` of the node; an empty array when absent."""
    return constant_input(graph, node, index, absent=np.zeros(0))


def _factors(graph: Graph, node: Node) -> tuple[int, int] | None:
    """Whole-number H and W factors that the node's scales (or sizes) really use."""
    in_shape = graph.tensors[node.inputs[0]].shape
    out_shape = graph.tensors[node.outputs[0]].shape
    if len(in_shape) != 4 or in_shape[:2] != out_shape[:2] or 0 in in_shape:
        return None
    if any(o % i for i, o in zip(in_shape[2:], out_shape[2:])):
        return None
    factors = tuple(o // i for i, o in zip(in_shape[2:], out_shape[2:]))
    scales = _const(graph, node, 2)
    if scales is None or (scales.size and not np.array_equal(
            scales.astype(np.float64), np.array((1, 1, *factors), np.float64))):
        return None
    return factors if scales.size or _const(graph, node, 3) is not None else None


def upsample_form(graph: Graph, node: Node) -> UpsampleForm | None:
    """The blocked Upsample computing this Resize node (opset 11+) exactly, or None."""
    if node.op != "Resize" or node.domain not in ("", "ai.onnx") or graph.opset < 11:
        return None
    if graph.tensors[node.inputs[0]].dtype != "float32":
        return None
    if node.attr("axes") is not None or int(node.attr("antialias", 0)) \
            or node.text_attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        return None
    factors = _factors(graph, node)
    if factors is None:
        return None
    mode = node.text_attr("mode", "nearest")
    transform = node.text_attr("coordinate_transformation_mode", "half_pixel")
    if mode == "linear" and transform in _LINEAR_TRANSFORMS:
        return UpsampleForm(factors, "linear", _LINEAR_TRANSFORMS[transform])
    if mode != "nearest" or transform not in _NEAREST_TRANSFORMS:
        return None
    rounding = node.text_attr("nearest_mode", "round_prefer_floor")
    in_hw = graph.tensors[node.inputs[0]].shape[2:]
    for size, factor in zip(in_hw, factors):
        replicated = np.arange(size * factor) // factor
        if not np.array_equal(nearest_source(size, size * factor, float(factor), transform,
                                             rounding), replicated):
            return None
    return UpsampleForm(factors, "nearest", "asymmetric")


def _split_sizes(graph: Graph, node: Node, channels: int) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1]:
        sizes = graph.constants.get(node.inputs[1])
        return None if sizes is None else [int(v) for v in np.asarray(sizes).ravel()]
    if node.attr("split") is not None:
        return [int(v) for v in node.attr("split")]
    parts = int(node.attr("num_outputs", len(node.outputs)))
    size = -(-channels // parts)
    return [size] * (parts - 1) + [channels - size * (parts - 1)]


def _slice_range(graph: Graph, node: Node, channels: int) -> tuple[int, int] | None:
    found = slice_parameters(graph, node)
    if found is None:
        return None
    starts, ends, axes, steps = found
    if len(starts) != 1 or int(axes[0]) % 4 != 1 or int(steps[0]) != 1:
        return None
    start, end = (int(np.clip(v + channels if v < 0 else v, 0, channels))
                  for v in (starts[0], ends[0]))
    return (start, end) if end > start else None


def channel_pieces(graph: Graph, node: Node) -> list[tuple[int, int]] | None:
    """(first channel, channel count) of each output of a channel Split, or of a Slice
    with step 1 along the channels, of a 4-d float32 tensor; None for anything else."""
    if node.domain not in ("", "ai.onnx") or node.op not in ("Split", "Slice"):
        return None
    info = graph.tensors[node.inputs[0]]
    if len(info.shape) != 4 or info.dtype != "float32":
        return None
    channels = info.shape[1]
    if node.op == "Split":
        if int(node.attr("axis", 0)) % 4 != 1:
            return None
        sizes = _split_sizes(graph, node, channels)
        if sizes is None or len(sizes) != len(node.outputs) or sum(sizes) != channels:
            return None
        starts = [int(v) for v in np.cumsum([0, *sizes[:-1]])]
        return list(zip(starts, sizes))
    found = _slice_range(graph, node, channels)
    return None if found is None else [(found[0], found[1] - found[0])]


def spatial_crop(graph: Graph, node: Node) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(starts, ends) over H and W of a Slice with step 1 that crops H and W only (the
    batch and channels whole) of a 4-d float32 tensor (Keras' Cropping2D), normalized to
    the input's sizes; None for any other node or a crop that leaves nothing."""
    if node.op != "Slice" or node.domain not in ("", "ai.onnx"):
        return None
    info = graph.tensors[node.inputs[0]]
    found = slice_parameters(graph, node)
    if len(info.shape) != 4 or info.dtype != "float32" or found is None:
        return None
    starts, ends = [0, 0, 0, 0], list(info.shape)
    for start, end, axis, step in zip(*found):
        axis, size = int(axis) % 4, info.shape[int(axis) % 4]
        if int(step) != 1:
            return None
        starts[axis], ends[axis] = (int(np.clip(v + size if v < 0 else v, 0, size))
                                    for v in (start, end))
    if starts[:2] != [0, 0] or ends[:2] != list(info.shape[:2]) \
            or any(e <= s for s, e in zip(starts, ends)):
        return None
    return (starts[2], starts[3]), (ends[2], ends[3])


def channel_slices(graph: Graph, node: Node, block: int) -> list[tuple[int, int]] | None:
    """(first channel, channel count) of each output of a block-aligned channel Split or
    Slice, or None."""
    pieces = channel_pieces(graph, node)
    if pieces is None:
        return None
    channels = graph.tensors[node.inputs[0]].shape[1]
    for start, count in pieces:
        if start % block or ((start + count) % block and start + count != channels):
            return None
    return pieces
