"""Consecutive `ort.nchwc` steps of a plan executed as one onnxruntime session.

Every step of a plan is chosen, verified and timed on its own; running dozens
of one-node sessions back to back then costs a session call per node (input
and output binding, execution frame, thread-pool hand-off). When several
consecutive steps were all given to `ort.nchwc`, the runtime may execute them
as one session holding exactly those nodes, with exactly the same packed
weights and attributes (`build_ort_model` of each step), graph optimizations
disabled so onnxruntime runs the same kernels. The outputs that later steps
or the graph read are bound to their arena buffers; the others stay inside the
session. On request (`Session(spin_threads=True)`) the session's threads spin
between its nodes during a run, as onnxruntime's own default does (no worker
wake-up per node: about 25% faster on an idle 2-core machine), and stop
spinning when the run returns (`session_options(spin_during_run=True)`), so
they leave no core busy for what follows. Off by default: with another busy
process on the cores, spinning workers wait on each other (up to 2x slower).
Nothing is chosen differently: it is an execution strategy of already
verified kernels, checked against step-by-step execution by the tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

from wpk.core.workload import Workload
from wpk.kernels.cpu.nchwc import _CPU, ORT_NCHWC_DOMAIN, build_ort_model
from wpk.kernels.cpu.nchwc_standard import declared_shapes
from wpk.kernels.cpu.node_model import MS_DOMAIN
from wpk.kernels.cpu.ort_node import session_options
from wpk.kernels.registry import Kernel

REGION_IMPL = "ort.nchwc"


@dataclass(frozen=True)
class RegionMember:
    """One plan step of a region: its workload, constants and tensor names."""

    workload: Workload
    consts: Mapping[int, np.ndarray]
    inputs: Sequence[str]
    output: str


def region_model(members: Sequence[RegionMember], exported: set[str] | None = None):
    """The merged model, its external input names (in order) and its output names: the
    members' outputs in `exported` (all of them when None); the others stay inside the
    session, in onnxruntime's own memory. A tensor that a member declares with another
    shape than the one it was produced or bound with (the 4-d view of a blocked tensor
    read 5-d by a broadcasting Elementwise, or back) is read through a Reshape."""
    merged = _Merged()
    for index, member in enumerate(members):
        model, feeds = build_ort_model(member.workload, member.consts)
        declared = declared_shapes(model)
        rename = {"y": member.output}
        for local, input_index in feeds:
            rename[local] = merged.read(member.inputs[input_index], declared[local])
        prefix = f"s{index}/"
        for tensor in model.graph.initializer:
            rename[tensor.name] = prefix + tensor.name
            tensor.name = rename[tensor.name]
            merged.initializers.append(tensor)
        for node in model.graph.node:
            node.input[:] = [rename.get(name, prefix + name) if name else ""
                             for name in node.input]
            node.output[:] = [rename.get(name, prefix + name) for name in node.output]
            node.name = prefix + (node.name or node.op_type)
            merged.nodes.append(node)
        merged.shapes[member.output] = declared["y"]
    outputs = [m.output for m in members if exported is None or m.output in exported]
    shapes = merged.shapes
    graph = helper.make_graph(
        merged.nodes, "nchwc_region",
        [helper.make_tensor_value_info(n, 1, shapes[n]) for n in merged.external],
        [helper.make_tensor_value_info(n, 1, shapes[n]) for n in outputs], merged.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ORT_NCHWC_DOMAIN, 1),
                                                    helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 8
    return model, merged.external, outputs, shapes


@dataclass
class _Merged:
    """The region model being assembled: nodes, initializers, tensor shapes, inputs."""

    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    shapes: dict[str, list[int]] = field(default_factory=dict)
    external: list[str] = field(default_factory=list)
    reshaped: dict[tuple[str, tuple[int, ...]], str] = field(default_factory=dict)

    def read(self, name: str, shape: list[int]) -> str:
        """The tensor to read `name` as `shape`: itself, or one shared Reshape of it."""
        if name not in self.shapes:  # first read of a region input: bound with this shape
            self.external.append(name)
            self.shapes[name] = list(shape)
        if self.shapes[name] == list(shape):
            return name
        key = (name, tuple(shape))
        if key not in self.reshaped:
            target = f"{name}@{'x'.join(map(str, shape))}"
            self.initializers.append(numpy_helper.from_array(
                np.asarray(shape, dtype=np.int64), f"{target}/shape"))
            self.nodes.append(helper.make_node("Reshape", [name, f"{target}/shape"], [target],
                                               name=f"reshape/{target}"))
            self.reshaped[key] = target
        return self.reshaped[key]


def region_kernel(members: Sequence[RegionMember], exported: set[str] | None = None,
                  spin: bool = False) -> tuple[Kernel, list[str], list[str]]:
    """A kernel(inputs, outputs) running the merged session, and the tensor names of its
    inputs and outputs (in the order the kernel takes the arrays); with `spin`, its threads
    spin during a run (see the module docstring)."""
    model, external, outputs, shapes = region_model(members, exported)
    session = ort.InferenceSession(model.SerializeToString(),
                                   session_options(optimization="disabled", spin_during_run=spin),
                                   providers=["CPUExecutionProvider"])
    binding = session.io_binding()._iobinding
    run = session._sess.run_with_iobinding
    run_options = ort.RunOptions()
    float32 = np.dtype(np.float32)
    bound: list[int] = []

    def kernel(inputs, outs) -> None:
        arrays = [*inputs, *outs]
        addresses = [a.ctypes.data for a in arrays]
        if addresses != bound:
            if not all(a.dtype == float32 and a.flags.c_contiguous for a in arrays):
                raise ValueError("an nchwc region needs C-contiguous float32 buffers")
            for name, address in zip(external, addresses):
                binding.bind_input(name, _CPU, float32, shapes[name], address)
            for name, address in zip(outputs, addresses[len(external):]):
                binding.bind_output(name, _CPU, float32, shapes[name], address)
            bound[:] = addresses
        run(binding, run_options)

    return kernel, external, outputs
