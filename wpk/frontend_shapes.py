"""Shapes that ONNX shape inference leaves open, completed for the frontend.

Dropout's mask (old opsets) takes the data's shape. Everything else is found
by evaluating the model (`onnx.reference`) on constant inputs, after making
sure the shape cannot depend on the *values* of graph inputs: a tensor whose
producer is data-dependent by nature (NonZero, Unique, ...), or reads a
shape-defining input (a Reshape shape, Pad pads, Slice bounds, ...) computed
from graph input values, has no static shape, which is a `ShapeError`.

The evaluation is bounded (`wpk.core.limits`): a `Loop` stops with a
`LimitError` after `max_loop_trips` iterations, and the outputs computed so far
may not sum over `max_memory`.
"""

from __future__ import annotations

import numpy as np
import onnx

from wpk.core.epilogue import ONNXRUNTIME_DOMAIN
from wpk.core.errors import ShapeError, ValueShapeError
from wpk.core.graph import Graph, Node, TensorInfo
from wpk.core.limits import LimitError, Limits, format_bytes, shape_text
from wpk.core.onnx_loop import Loop
from wpk.core.onnx_quantize import REFERENCE_OPS

SHAPE_HINT = "give the input shape, e.g. --input-shape NAME=1x3x224x224"
# When the model's own nodes fail on inputs of the shapes given
EVALUATION_HINT = ("the model's nodes fail on inputs of these shapes (the message above): "
                   "check the nodes that compute those tensors against the ONNX spec; "
                   "onnxruntime runs some invalid graphs anyway (it skips a Concat's empty "
                   "inputs)")
# Ops whose output shape depends on input values whatever the inputs are.
VALUE_SHAPED_OPS = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression",
                              "StringSplit", "RegexFullMatch", "TfIdfVectorizer"})
# Inputs (by index) that define the output shape of an op by their values.
SHAPE_INPUTS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Pad": (1, 3), "Slice": (1, 2, 3, 4),
    "ConstantOfShape": (0,), "Range": (0, 1, 2), "Resize": (1, 2, 3), "Upsample": (1,),
    "TopK": (1,), "OneHot": (1,), "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
    "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,), "CenterCropPad": (1,),
    "Col2Im": (1, 2), "AffineGrid": (1,), "MaxUnpool": (2,), "STFT": (2, 3), "DFT": (1,),
    "BlackmanWindow": (0,), "HammingWindow": (0,), "HannWindow": (0,), "MelWeightMatrix": (0,),
}


def complete_shapes(proto: onnx.ModelProto, graph: Graph, unknown: list[str],
                    limits: Limits | None = None) -> None:
    """Give every tensor in `unknown` a static shape, or raise `ShapeError` (`LimitError`
    when evaluating the model would go over `limits`)."""
    _fill_mask_shapes(graph, unknown)
    if not unknown:
        return
    _reject_value_shaped(graph, unknown)
    _evaluate_shapes(proto, graph, unknown, Limits.of(limits))


def _fill_mask_shapes(graph: Graph, unknown: list[str]) -> None:
    """Dropout's mask output (old opsets infer no shape for it) has the data's shape."""
    for node in graph.nodes:
        if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1] in unknown:
            data = graph.tensors.get(node.inputs[0])
            if data is not None:
                dtype = "bool" if graph.opset >= 10 else data.dtype
                graph.tensors[node.outputs[1]] = TensorInfo(data.shape, dtype)
                unknown.remove(node.outputs[1])


def _reject_value_shaped(graph: Graph, unknown: list[str]) -> None:
    producers = {o: n for n in graph.nodes for o in n.outputs if o}
    value_memo = _input_valued(graph, producers)

    def reads_input_values(name: str) -> bool:
        """Whether the value of `name` is computed from the value of a graph input."""
        return value_memo.get(name, False)

    for name in unknown:
        node = producers.get(name)
        if node is None:
            continue
        if node.op in VALUE_SHAPED_OPS or any(
                index < len(node.inputs) and node.inputs[index]
                and reads_input_values(node.inputs[index])
                for index in SHAPE_INPUTS.get(node.op, ())):
            raise _value_shaped(graph, name, node)


def _input_valued(graph: Graph, producers: dict[str, Node]) -> dict[str, bool]:
    """For every tensor: whether its value is computed from a graph input's value. One
    pass in topological order (no recursion: a graph may be thousands of nodes deep)."""
    valued = dict.fromkeys(graph.inputs, True)
    for node in graph.nodes:  # ONNX nodes are in topological order
        result = node.op not in ("Shape", "Size") and any(
            valued.get(i, False) for i in node.inputs if i)
        for output in node.outputs:
            if output:
                valued[output] = result
    return valued


def _value_shaped(graph: Graph, name: str, node: Node) -> ShapeError:
    return ValueShapeError(f"the shape of tensor '{name}' (output of {node.op} node "
                           f"'{node.name}') in '{graph.source}' depends on the values of the "
                           "inputs",
                           hint="wpk needs static shapes: make that input a constant of the "
                                "model", tensor=name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _evaluate_shapes(proto: onnx.ModelProto, graph: Graph, unknown: list[str],
                    limits: Limits) -> None:
    """Fill shapes by running the model on constant inputs (all 0, then all 1).

    A shape that differs between the two runs depends on input values after all. The
    values themselves do not matter, so numpy's floating-point warnings on them stay
    quiet (a padding mask of -inf makes a softmax of constant inputs NaN: not the user's
    concern). onnx.reference runs the model; onnxruntime does where onnx.reference has
    no implementation of onnxruntime's own ops (a QOperator-quantized model's QLinearAdd,
    QGemm, ...: `_onnxruntime_runs`).
    """
    runs = []
    for fill in (0, 1):
        feeds = {name: np.full(graph.tensors[name].shape, fill, graph.tensors[name].dtype)
                 for name in graph.inputs}
        try:
            with np.errstate(all="ignore"):
                runs.append(bounded_evaluator(proto, graph.source, limits).run(
                    None, feeds, intermediate=True))
        except LimitError:
            raise
        except Exception as exc:  # noqa: BLE001 - any evaluation failure means no shapes
            runs = _onnxruntime_runs(proto, graph, unknown) if _contrib_ops(graph) else None
            if runs is None:
                raise ShapeError(
                    f"cannot determine the shapes of {', '.join(unknown[:5])} in "
                    f"'{graph.source}': shape inference left them open and evaluating the "
                    f"model failed: {_first_line(exc)}", hint=EVALUATION_HINT) from exc
            break
    for name in unknown:
        values = [run.get(name) for run in runs]
        if any(v is None for v in values):
            raise ShapeError(f"cannot determine the shape of tensor '{name}' in "
                             f"'{graph.source}'", hint=SHAPE_HINT)
        first, second = (np.asarray(v) for v in values)
        if first.shape != second.shape:
            raise ValueShapeError(f"the shape of tensor '{name}' in '{graph.source}' depends "
                                  f"on the values of the inputs ({first.shape} or "
                                  f"{second.shape})",
                                  hint="wpk needs static shapes: make that input a constant",
                                  tensor=name)
        graph.tensors[name] = TensorInfo(tuple(first.shape), first.dtype.name)


def _contrib_ops(graph: Graph) -> bool:
    """Whether the graph holds onnxruntime's own ops and no loop (an evaluation by
    onnxruntime cannot be bounded as `bounded_evaluator`'s is)."""
    domains = {node.domain for node in graph.nodes}
    return ONNXRUNTIME_DOMAIN in domains and not any(
        node.op in ("Loop", "Scan") for node in graph.nodes)


def _onnxruntime_runs(proto: onnx.ModelProto, graph: Graph, unknown: list[str]
                      ) -> list[dict[str, np.ndarray]] | None:
    """The `unknown` tensors' values in onnxruntime's runs of the model on all-0 and all-1
    inputs (the nodes as written: graph optimizations off), None when it cannot run it."""
    import onnxruntime as ort

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    listed = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in unknown if n not in listed)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return [dict(zip(names, session.run(None, {
            name: np.full(graph.tensors[name].shape, fill, graph.tensors[name].dtype)
            for name in graph.inputs}))) for fill in (0, 1)]
    except Exception:  # noqa: BLE001 - onnxruntime raises its own untyped errors
        return None


def bounded_evaluator(proto: onnx.ModelProto, source: str, limits: Limits):
    """An `onnx.reference.ReferenceEvaluator` of `proto` whose `Loop`s stop after
    `limits.max_loop_trips` iterations and whose node outputs may not sum over
    `limits.max_memory` (LimitError naming the node)."""
    from onnx.reference import ReferenceEvaluator

    others = [op for op in REFERENCE_OPS if op is not Loop]
    evaluator = ReferenceEvaluator(proto, new_ops=[_bounded_loop(limits, source), *others])
    used = [0]
    for node in evaluator.rt_nodes_:
        node.run = _counted(node.run, node.onnx_node, source, limits, used)
    return evaluator


def _counted(run, onnx_node, source: str, limits: Limits, used: list[int]):
    def counted(*args, **kwargs):
        outputs = run(*args, **kwargs)
        for name, value in zip(onnx_node.output, outputs):
            size = int(getattr(value, "nbytes", 0))
            used[0] += size
            if used[0] > limits.max_memory:
                raise LimitError(
                    f"evaluating '{source}' for its shapes takes more than --max-memory "
                    f"{format_bytes(limits.max_memory)}: {onnx_node.op_type} node "
                    f"'{onnx_node.name}' made '{name}' "
                    f"({shape_text(getattr(value, 'shape', ()))}, {format_bytes(size)})",
                    hint=limits.hint(used[0]))
        return outputs

    return counted


def _bounded_loop(limits: Limits, source: str):
    """onnx.reference's Loop (scan outputs stacked as the spec says: `wpk.core.onnx_loop`),
    stopped with a LimitError after `max_loop_trips` trips."""

    def _run(self, *args, **kwargs):
        self.trips = 0
        return Loop._run(self, *args, **kwargs)

    def __init__(self, onnx_node, run_params):
        Loop.__init__(self, onnx_node, run_params)
        body = self._run_body  # set per instance by OpRun from the `body` attribute
        what = f"Loop node '{onnx_node.name}' in '{source}' (evaluated for its shapes)"

        def counted(*args, **kwargs):
            self.trips += 1
            limits.check_trips(self.trips, what)
            return body(*args, **kwargs)

        self._run_body = counted

    return type("Loop", (Loop,), {"op_domain": "", "__init__": __init__, "_run": _run})
