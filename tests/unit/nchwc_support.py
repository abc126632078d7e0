"""Helpers of the NCHWc tests: a node-by-node evaluator, random weights, onnxruntime outputs."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort

from wpk.core.graph import Graph
from wpk.core.workload import Workload
from wpk.frontend import load_model
from wpk.kernels import registry
from wpk.passes.to_onnx import to_onnx
from wpk.workloads import workload_of

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def pick(workload: Workload, nchwc_impl: str) -> registry.Candidate:
    """`nchwc_impl` for blocked ops; onnxruntime (else any candidate) for the rest."""
    found = registry.candidates(workload, "cpu")
    want = nchwc_impl if workload.domain == "wpk.nchwc" else "ort"
    for candidate in found:
        if candidate.implementation.name == want:
            return candidate
    assert found, f"no implementation of {workload.label}"
    return found[0]


def evaluate(graph: Graph, feeds: dict[str, np.ndarray], nchwc_impl: str = "ort.nchwc"
             ) -> dict[str, np.ndarray]:
    """Run the graph node by node with prepared kernels on NaN-poisoned outputs."""
    values: dict[str, np.ndarray] = dict(graph.constants)
    values.update(feeds)
    for node in graph.nodes:
        workload = workload_of(graph, node)
        candidate = pick(workload, nchwc_impl)
        consts = {i: graph.constants[n] for i, n in enumerate(node.inputs)
                  if n in graph.constants}
        kernel = candidate.implementation.prepare(workload, consts, candidate.config)
        outputs = [np.full(s.shape, np.nan, dtype=s.dtype) for s in workload.outputs]
        kernel([values[i] if i else None for i in node.inputs], outputs)
        values.update(zip(node.outputs, outputs))
    return {name: values[name] for name in graph.outputs}


def randomize_weights(graph: Graph, rng: np.random.Generator) -> None:
    """Replace float constants by seeded random values (filters scaled by fan-in, 1-d > 0)."""
    for name, value in list(graph.constants.items()):
        if value.dtype != np.float32 or value.ndim == 0 or value.size == 1:
            continue
        if value.ndim == 1:
            new = rng.uniform(0.5, 1.5, value.shape)
        else:
            fan_in = int(np.prod(value.shape[1:]))
            new = rng.standard_normal(value.shape) * np.sqrt(2.0 / fan_in)
        graph.constants[name] = new.astype(np.float32)


def ort_outputs(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime (all optimizations) on the graph written back to ONNX."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(to_onnx(graph).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return dict(zip(graph.outputs, session.run(graph.outputs, feeds)))


def load_light(name: str, rng: np.random.Generator) -> tuple[Graph, dict[str, np.ndarray]]:
    """A light model from the onnx wheel, with random weights, and random feeds."""
    graph = load_model(os.path.join(LIGHT_DIR, f"{name}.onnx"))
    randomize_weights(graph, rng)
    expose_logits(graph)
    feeds = {name: rng.standard_normal(graph.tensors[name].shape).astype(np.float32)
             for name in graph.inputs if name not in graph.constants}
    return graph, feeds


def expose_logits(graph: Graph) -> None:
    """Also output the input of every Softmax producing a graph output (softmax saturates)."""
    for node in graph.nodes:
        if node.op == "Softmax" and node.outputs[0] in graph.outputs \
                and node.inputs[0] not in graph.outputs:
            graph.outputs.append(node.inputs[0])


def model_x_to_y(name: str, nodes, initializers, x_shape, y_shape) -> onnx.ModelProto:
    """An opset-17 float32 model with one input `x` and one output `y`."""
    from onnx import helper

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", 1, x_shape)],
                              [helper.make_tensor_value_info("y", 1, y_shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def check_blocked_activation_kernels(workload: Workload, node_ops: list[str], rng) -> None:
    """A blocked conv whose activation onnxruntime runs as a node after the conv: its
    candidate model holds `node_ops`, and it and the micro-kernel (which computes the
    activation on the registers) match the float64 reference on NaN-poisoned outputs."""
    from wpk.core.numerics import relative_l2
    from wpk.kernels.cpu.microkernels.kernel import MICRO_NCHWC
    from wpk.kernels.cpu.nchwc import ORT_NCHWC, build_ort_model
    from wpk.kernels.random_inputs import random_inputs
    from wpk.kernels.reference import reference

    inputs = random_inputs(workload, rng)
    consts = {i: inputs[i] for i in workload.const_inputs}
    model, _ = build_ort_model(workload, consts)
    assert [node.op_type for node in model.graph.node] == node_ops
    assert MICRO_NCHWC.unsupported_reason(workload) is None
    expected = reference(workload, [np.asarray(x, np.float64) for x in inputs])[0]
    for kernel in (ORT_NCHWC.prepare(workload, consts, {}),
                   MICRO_NCHWC.prepare(workload, consts, MICRO_NCHWC.configs(workload)[0])):
        out = np.full(workload.outputs[0].shape, np.nan, np.float32)
        kernel(inputs, [out])
        assert relative_l2(out, expected) < 1e-5
