"""A plan's chosen graph: its steps as a `Graph` again, with its weights.

    graph = plan_graph(plan)      # one node per step: op, attributes, fused epilogue

Each step's workload holds what its node computes (op, domain, attributes
with ONNX defaults written out, fused epilogue, tensor shapes), so the graph
the plan executes comes back from the manifest alone; `wpk.passes.to_onnx`
writes it as ONNX (`wpk report --graph`). A plan of onnxruntime's whole model
has no graph of steps: `whole_model_bytes` gives the model it holds.
"""

from __future__ import annotations

from wpk.core.errors import PlanError
from wpk.core.graph import Graph, Node, TensorInfo
from wpk.kernels.cpu.ort_model import MODEL_FILE, ORT_MODEL
from wpk.plans.planfile import Plan


def is_whole_model(plan: Plan) -> bool:
    """Whether onnxruntime's whole-model session is the plan (`wpk.partition`)."""
    return [step.impl for step in plan.steps] == [ORT_MODEL.name]


def whole_model_bytes(plan: Plan) -> bytes:
    """The ONNX model a whole-model plan runs."""
    (step,) = plan.steps
    member = next((m for m in step.artifacts if m.endswith("/" + MODEL_FILE)), None)
    if member is None or member not in plan.kernels:
        raise PlanError("the plan's onnxruntime model is missing", hint="rebuild the plan")
    return plan.kernels[member]


def plan_graph(plan: Plan) -> Graph:
    """The graph the plan's steps execute (see the module docstring)."""
    workloads = plan.workloads
    tensors: dict[str, TensorInfo] = {}
    nodes = []
    for step in plan.steps:
        workload = workloads[step.workload_key]
        for name, spec in [*zip(step.inputs, workload.inputs), *zip(step.outputs,
                                                                    workload.outputs)]:
            if name and spec is not None:
                tensors.setdefault(name, TensorInfo(tuple(spec.shape), spec.dtype))
        nodes.append(Node(step.op, list(step.inputs), list(step.outputs), step.node,
                          dict(workload.attrs), workload.domain, tuple(workload.epilogue)))
    for entry in [*plan.inputs, *plan.outputs]:
        tensors.setdefault(entry["name"], TensorInfo(tuple(entry["shape"]), entry["dtype"]))
    for name, value in plan.weights.items():
        tensors.setdefault(name, TensorInfo(tuple(value.shape), value.dtype.name))
    opset = max((w.opset for w in workloads.values()), default=17)
    return Graph(nodes, [e["name"] for e in plan.inputs], [e["name"] for e in plan.outputs],
                 tensors, dict(plan.weights), name=plan.manifest.get("graph") or "plan",
                 opsets={"": opset})
