"""Assembling a `Plan` from a graph, its workloads and the planner's choices, or from a
whole model onnxruntime runs (`whole_model_plan`).

Steps follow the graph's node order; the buffer plan comes from tensor
lifetimes; constants the steps read (or that are graph outputs) become the
weights. Implementations may contribute kernel artifacts (optional hook
`artifacts(workload, config) -> {name: bytes}`) and CPU requirements
(optional hook `required_isa(workload, config) -> iterable of ISA flags`). On the CPU, a
step whose output is its first input reinterpreted (optional hook `views_input(workload)
-> bool`: a Reshape-like copy) gives both tensors one buffer, and its copy has nothing to
do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from wpk.core.devices import cpu_fingerprint
from wpk.core.graph import Graph
from wpk.core.version import __version__
from wpk.kernels.cpu.ort_model import MODEL_FILE, MODEL_OP, ORT_MODEL, model_workload
from wpk.plans.buffers import plan_graph_buffers
from wpk.plans.planfile import FORMAT_VERSION, Plan, Step
from wpk.plans.planner import NodeWorkloadLike, PlanChoices


def tensor_nbytes(graph: Graph, name: str) -> int:
    """Bytes of a tensor of the graph, from its static shape and dtype."""
    info = graph.tensors[name]
    return int(np.prod(info.shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize


def _tensor_entry(graph: Graph, name: str) -> dict:
    info = graph.tensors[name]
    return {"name": name, "shape": [int(d) for d in info.shape], "dtype": info.dtype}


def assemble_plan(graph: Graph, node_workloads: Sequence[NodeWorkloadLike],
                  choices: PlanChoices, target: str = "cpu",
                  report: Mapping[str, Any] | None = None,
                  device: Mapping[str, Any] | None = None) -> Plan:
    """The plan executing `node_workloads` (in graph order) with the chosen implementations."""
    steps: list[Step] = []
    kernels: dict[str, bytes] = {}
    isa: set[str] = set()
    views: list[tuple[str, str]] = []
    parts: list[tuple[str, str, int]] = []   # (input, output, byte offset): a Concat's pieces
    slices: list[tuple[str, str, int]] = []  # (output, input, byte offset): a ChannelSlice's
    for item in node_workloads:
        node, workload = item.node, item.workload
        choice = choices[workload.key]
        impl = choice.candidate.implementation
        config = dict(choice.candidate.config)
        artifacts: list[str] = []
        provide = getattr(impl, "artifacts", None)
        for file_name, data in (provide(workload, config) if provide else {}).items():
            member = f"{workload.key}/{impl.name}/{file_name}"
            kernels[member] = bytes(data)
            artifacts.append(member)
        needs = getattr(impl, "required_isa", None)
        if needs:
            isa.update(needs(workload, config))
        is_view = getattr(impl, "views_input", None)
        if target == "cpu" and is_view and is_view(workload):
            views.append((node.outputs[0], node.inputs[0]))
        places = getattr(impl, "places_inputs", None)
        offsets = places(workload) if target == "cpu" and places else None
        if offsets:
            parts += [(name, node.outputs[0], offset)
                      for name, offset in zip(node.inputs, offsets)]
        sliced = getattr(impl, "slices_input", None)
        start = sliced(workload) if target == "cpu" and sliced else None
        if start is not None:
            slices.append((node.outputs[0], node.inputs[0], start))
        steps.append(Step(node.name, node.op, workload.key, impl.name, config, impl.kind,
                          tuple(node.inputs), tuple(o for o in node.outputs if o),
                          tuple(artifacts)))

    return _plan(graph, steps, kernels, isa, [c.workload for c in choices], target, report,
                 device, views, parts, slices)


def whole_model_plan(graph: Graph, model_bytes: bytes, device: Mapping[str, Any] | None = None
                     ) -> Plan:
    """The plan of one step: onnxruntime runs the whole model (`ort.model`, the model file
    among the plan's kernels); `graph` is the model as loaded (before wpk's passes)."""
    workload = model_workload(graph)
    member = f"{workload.key}/{ORT_MODEL.name}/{MODEL_FILE}"
    inputs = tuple(workload.attr("inputs"))
    step = Step("onnxruntime", MODEL_OP, workload.key, ORT_MODEL.name, {}, ORT_MODEL.kind,
                inputs, tuple(graph.outputs), (member,))
    return _plan(graph, [step], {member: bytes(model_bytes)}, set(), [workload], "cpu", None,
                 device)


def _plan(graph: Graph, steps: list[Step], kernels: dict[str, bytes], isa: set[str],
          workloads: Sequence, target: str, report: Mapping[str, Any] | None,
          device: Mapping[str, Any] | None, views: Sequence[tuple[str, str]] = (),
          parts: Sequence[tuple[str, str, int]] = (),
          slices: Sequence[tuple[str, str, int]] = ()) -> Plan:
    constants = set(graph.constants)
    used = {name for step in steps for name in step.inputs if name in constants}
    used |= {name for name in graph.outputs if name in constants}
    weights = {name: np.asarray(graph.constants[name], order="C")  # keeps 0-d arrays 0-d
               for name in graph.constants if name in used}
    step_io = [([i for i in step.inputs if i and i not in constants], list(step.outputs))
               for step in steps]
    sizes = {name: tensor_nbytes(graph, name)
             for inputs, outputs in step_io for name in [*inputs, *outputs]}
    sizes.update({name: tensor_nbytes(graph, name) for name in [*graph.inputs, *graph.outputs]
                  if name not in constants})
    buffers = plan_graph_buffers(step_io, sizes, graph.inputs, graph.outputs, constants, views,
                                 parts, slices)
    host = dict(device or cpu_fingerprint())
    manifest = {
        "format_version": FORMAT_VERSION,
        "wpk_version": __version__,
        "target": target,
        "graph": graph.name,
        "device": host,
        "requires": {"isa": sorted(isa), "machine": host.get("machine") if kernels else None},
        "steps": [s.to_json() for s in steps],
        "workloads": {w.key: w.to_json() for w in workloads},
        "buffers": buffers.to_json(),
        "inputs": [_tensor_entry(graph, n) for n in graph.inputs if n not in constants],
        "outputs": [_tensor_entry(graph, n) for n in graph.outputs],
    }
    return Plan(manifest, weights, dict(report or {}), kernels)
