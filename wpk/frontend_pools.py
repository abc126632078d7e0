"""Pools with `ceil_mode` for ONNX's checker and shape inference: the spec's output size.

    stand_in_ceil_mode_pools(skeleton)   # before onnx.checker / infer_shapes

The ONNX spec (and onnxruntime, and torch, whose exporters write these pools) computes a
pooling output size with `ceil_mode` set as `ceil((in + pads - extent) / stride) + 1` and
then drops the last window when it would start in the end padding. ONNX's own shape
inference (1.23) skips that drop: a torch `MaxPool2d(2, 2, padding=1, ceil_mode=True)`
over 5 pixels gives 3 outputs, but inference says 4. A plan built on inference's shapes
computed an extra row and column (found by a grid of single pools against onnxruntime,
after the passes' fuzzer's ceil_mode mutants), and a model whose exporter declared the
right shapes (torch's dynamo export) failed the checker.

Here each such pool that can drop a window (end pads, or a window narrower than its
stride; inference is right for the others) of the checker's and inference's copy of the
model (the skeleton; the model's own node keeps `ceil_mode`) becomes the equivalent pool
without it: `ceil_mode` 0 and its end pads grown until the floor formula gives the spec's
size. Growing the end pads adds only windows' padding, never a window, so every other
tensor is inferred as before. Where a size changed, the model's declared shapes after it
may be those of the same defect (torch's TorchScript exporter declares inference's), so
the skeleton's declared shapes are forgotten and inferred again.

A pool with `auto_pad` SAME has ceil(size / stride) outputs whatever its `ceil_mode`
(the spec, onnxruntime), but inference rounds up again where the window is shorter than
the stride (an AveragePool of a 1-wide window at stride 2 over 6 values: 4 outputs for
3); such a pool stands in without `ceil_mode`.
"""

from __future__ import annotations

import onnx

from wpk.core.onnx_pool import rounded_up_pool_size, spec_pool_size

POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})


def stand_in_ceil_mode_pools(skeleton: onnx.ModelProto) -> None:
    """Replace `ceil_mode` in the skeleton's pools that can drop a window (module
    docstring); where an output size differs from what ONNX's inference would have said,
    the skeleton's declared value shapes are forgotten."""
    same = [n for n in skeleton.graph.node
            if _ceil_mode_pool_padding(n) in ("SAME_UPPER", "SAME_LOWER")]
    for node in same:   # SAME fixes the size at ceil(size / stride); ceil_mode has no say
        _set_ceil_mode(node, 0)
    pools = [n for n in skeleton.graph.node if _is_ceil_mode_pool(n) and _may_drop_a_window(n)]
    changed = bool(same)
    shapes = _input_shapes(skeleton) if pools else {}
    for node in pools:
        shape = shapes.get(node.input[0])
        if shape is None:
            continue
        sizes_differ = _without_ceil_mode(node, shape)
        if sizes_differ:
            changed = True
            shapes = _input_shapes(skeleton)   # the sizes after this pool moved
    if changed:
        _forget_declared_shapes(skeleton)


def _forget_declared_shapes(model: onnx.ModelProto) -> None:
    """Drop the declared shapes of values (the outputs' dims made symbolic: the checker
    wants a shape there), so inference gives them all again."""
    del model.graph.value_info[:]
    for value in model.graph.output:
        dims = value.type.tensor_type.shape.dim
        for i, dim in enumerate(dims):
            dim.Clear()
            dim.dim_param = f"{value.name}_dim{i}"


def _attr(node: onnx.NodeProto, name: str, default):
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _ceil_mode_pool_padding(node: onnx.NodeProto) -> str | None:
    """The `auto_pad` of a pool with `ceil_mode` set (None for any other node)."""
    if node.op_type not in POOL_OPS or node.domain not in ("", "ai.onnx") \
            or _attr(node, "ceil_mode", 0) != 1:
        return None
    auto_pad = _attr(node, "auto_pad", b"NOTSET")
    return auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad


def _is_ceil_mode_pool(node: onnx.NodeProto) -> bool:
    return _ceil_mode_pool_padding(node) in ("NOTSET", "VALID")


def _set_ceil_mode(node: onnx.NodeProto, value: int) -> None:
    for attribute in node.attribute:
        if attribute.name == "ceil_mode":
            attribute.i = value


def _may_drop_a_window(node: onnx.NodeProto) -> bool:
    """Whether the spec's drop can apply: only with end pads, or a window narrower than its
    stride (else the last window starts before `size + pad_begin`)."""
    kernel = list(_attr(node, "kernel_shape", []))
    rank = len(kernel)
    strides = list(_attr(node, "strides", [1] * rank))
    dilations = list(_attr(node, "dilations", [1] * rank))
    pads = list(_attr(node, "pads", [0] * (2 * rank)))
    return any(pads[rank + i] > 0 or dilations[i] * (kernel[i] - 1) + 1 < strides[i]
               for i in range(rank))


def _without_ceil_mode(node: onnx.NodeProto, shape: tuple[int | None, ...]) -> bool:
    """Make `node` its equivalent without `ceil_mode` for inputs of `shape`; whether an
    output size differs from ONNX inference's (the drop)."""
    kernel = list(_attr(node, "kernel_shape", []))
    spatial = shape[2:]
    rank = len(kernel)
    if len(spatial) != rank or any(s is None for s in spatial):
        return False
    strides = list(_attr(node, "strides", [1] * rank))
    dilations = list(_attr(node, "dilations", [1] * rank))
    pads = list(_attr(node, "pads", [0] * (2 * rank)))
    differs = False
    for i in range(rank):
        extent = dilations[i] * (kernel[i] - 1) + 1
        out = spec_pool_size(spatial[i], kernel[i], strides[i], pads[i], pads[i + rank],
                             dilations[i])
        differs |= out != rounded_up_pool_size(spatial[i], extent, strides[i],
                                           pads[i] + pads[i + rank])
        pads[i + rank] = max(pads[i + rank], (out - 1) * strides[i] + extent - spatial[i]
                             - pads[i])
    kept = [a for a in node.attribute if a.name not in ("ceil_mode", "pads", "auto_pad")]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.extend([onnx.helper.make_attribute("pads", pads)])
    return differs


def _input_shapes(skeleton: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Tensor name -> shape as ONNX's inference (lenient, declared shapes set aside) gives
    it for the pools' inputs; empty where inference fails (the checker says why later)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(skeleton)
    _forget_declared_shapes(copy)
    try:
        inferred = onnx.shape_inference.infer_shapes(copy, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises several types; the checker reports
        return {}
    found = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            found[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                      for d in tensor.shape.dim)
    return found
