"""A tiny hand-made graph (MatMul -> Relu -> Add) with real numpy implementations.

Used by the plan file and runtime tests, independent of the kernel library.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import types
from dataclasses import dataclass

import numpy as np
import pytest

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.registry import Candidate, Implementation
from wpk.plans.assemble import assemble_plan
from wpk.plans.planner import PlanOptions, plan
from wpk.search.measure import measure_candidate
from wpk.search.runner import Runner


@contextlib.contextmanager
def without_micro_kernels():
    """Builds inside offer none of the micro-kernel families' default configs, so the
    planner leaves convolutions, fused blocks and products to onnxruntime and consecutive
    onnxruntime steps form regions (what region tests need; a micro-kernel that wins one
    conv breaks a region apart)."""
    from wpk.kernels.cpu.microkernels.gemm import MicroGemm
    from wpk.kernels.cpu.microkernels.inverted_residual import MicroInvertedResidual
    from wpk.kernels.cpu.microkernels.kernel import MicroNchwc
    from wpk.kernels.cpu.microkernels.winograd import MicroWinograd

    with pytest.MonkeyPatch.context() as patch:
        for family in (MicroNchwc, MicroWinograd, MicroInvertedResidual, MicroGemm):
            patch.setattr(family, "configs", lambda self, workload: [])
        yield


def ensure_builtin_importable() -> None:
    """Until the kernel library's `builtin` module lands, let the registry import an empty one."""
    try:
        import wpk.kernels.builtin  # noqa: F401
    except ImportError:
        sys.modules["wpk.kernels.builtin"] = types.ModuleType("wpk.kernels.builtin")


# The test implementations are registered (the runtime finds implementations by
# name), under a target of their own so that no real build ever draws them.
TEST_TARGET = "wpk-unit-test"


class TestMatMul(Implementation):
    name = "planfile_test.matmul"
    target = TEST_TARGET

    def unsupported_reason(self, workload):
        return None if workload.op == "MatMul" else "MatMul only"

    def prepare(self, workload, consts, config):
        weight = np.ascontiguousarray(consts[1])
        return lambda inputs, outputs: np.matmul(inputs[0], weight, out=outputs[0])


class TestRelu(Implementation):
    name = "planfile_test.relu"
    target = TEST_TARGET

    def unsupported_reason(self, workload):
        return None if workload.op == "Relu" else "Relu only"

    def prepare(self, workload, consts, config):
        return lambda inputs, outputs: np.maximum(inputs[0], 0, out=outputs[0])


class TestAdd(Implementation):
    name = "planfile_test.add"
    target = TEST_TARGET

    def unsupported_reason(self, workload):
        return None if workload.op == "Add" else "Add only"

    def prepare(self, workload, consts, config):
        def kernel(inputs, outputs):  # accumulates into its output, as GEMM kernels do
            outputs[0].fill(0.0)
            outputs[0] += inputs[0]
            outputs[0] += inputs[1]
        return kernel


IMPLEMENTATIONS = [TestMatMul(), TestRelu(), TestAdd()]


def register_test_implementations() -> None:
    ensure_builtin_importable()
    for impl in IMPLEMENTATIONS:
        if impl.name not in registry._REGISTRY:
            registry.register(impl)


def random_inputs(workload, rng):
    return [rng.standard_normal(s.shape).astype(s.dtype) for s in workload.inputs]


def reference(workload, inputs):
    wide = [x.astype(np.float64) for x in inputs]
    if workload.op == "MatMul":
        return [wide[0] @ wide[1]]
    if workload.op == "Relu":
        return [np.maximum(wide[0], 0)]
    return [wide[0] + wide[1]]


@dataclass
class NodeWorkload:
    node: Node
    workload: Workload


def tiny_graph(rng: np.random.Generator) -> Graph:
    """y = relu(x @ w) + relu(x @ w)', with an odd constant name."""
    tensors = {"x": TensorInfo((2, 8)), "w/0:weird name": TensorInfo((8, 5)),
               "t": TensorInfo((2, 5)), "r": TensorInfo((2, 5)), "y": TensorInfo((2, 5))}
    nodes = [Node("MatMul", ["x", "w/0:weird name"], ["t"], "mm"),
             Node("Relu", ["t"], ["r"], "relu"),
             Node("Add", ["r", "t"], ["y"], "add")]
    weight = rng.standard_normal((8, 5)).astype(np.float32)
    return Graph(nodes, ["x"], ["y"], tensors, {"w/0:weird name": weight}, name="tiny")


def workloads_of(graph: Graph) -> list[NodeWorkload]:
    items = []
    for node in graph.nodes:
        specs = tuple(graph.tensors[i].spec for i in node.inputs)
        consts = tuple(i for i, name in enumerate(node.inputs) if name in graph.constants)
        items.append(NodeWorkload(node, Workload(node.op, specs, (TensorSpec((2, 5)),),
                                                 const_inputs=consts)))
    return items


class FunctionRunner(Runner):
    """A runner over a measuring function with the signature of `measure_candidate`
    (the tests' fake implementations bring their own inputs and reference)."""

    def __init__(self, function, options=None, seed: int = 0):
        super().__init__(options, seed)
        self.function = function

    def measure(self, workload, candidate, options=None, seed=None):
        seed = self.seed_of(workload, candidate) if seed is None else seed
        return self.function(workload, candidate, rng=np.random.default_rng(seed),
                             **(options or self.options).timing())


def tiny_choices(rng: np.random.Generator, extra=()):
    """The tiny graph, its node workloads and the planner's choices (test implementations)."""
    register_test_implementations()
    graph = tiny_graph(rng)
    items = workloads_of(graph)

    def provider(workload):
        return [Candidate(i, {}) for i in [*IMPLEMENTATIONS, *extra]
                if i.unsupported_reason(workload) is None]
    measure = functools.partial(measure_candidate, inputs_fn=random_inputs, reference_fn=reference)
    choices = plan(items, provider, FunctionRunner(measure),
                   PlanOptions(warmup=0, repeats=2, min_time=0.0))
    return graph, items, choices


def tiny_plan(rng: np.random.Generator):
    """A real plan of the tiny graph, planned with the test implementations."""
    graph, items, choices = tiny_choices(rng)
    return graph, assemble_plan(graph, items, choices, "cpu", {"note": "tiny"})


SLEEP_S = 0.002


class SlowMatMul(Implementation):
    """A correct MatMul that sleeps 2 ms (`SLEEP_S`) first: a plan of these is certainly
    slower than onnxruntime's whole model, and inside a run slower than any other MatMul
    kernel of a tiny shape, whatever else the machine does."""

    name = "test.slow_matmul"
    target = "test"  # never among the cpu target's candidates; plans name it explicitly

    def unsupported_reason(self, workload):
        return None if workload.op == "MatMul" else "MatMul only"

    def prepare(self, workload, consts, config):
        def kernel(inputs, outputs):
            time.sleep(SLEEP_S)
            np.matmul(inputs[0], inputs[1], out=outputs[0])
        return kernel


SLOW = registry.register(SlowMatMul())


def assert_matches_onnxruntime(session, model, feeds: dict, tolerance: float = 1e-5) -> None:
    """Every output of `session.run(feeds)` within `tolerance` (relative L2) of what
    onnxruntime computes for `model` (an onnx.ModelProto)."""
    import onnxruntime

    from wpk.core.numerics import relative_l2

    got = session.run(feeds)
    reference = onnxruntime.InferenceSession(model.SerializeToString(),
                                             providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    for name, expected in zip(names, reference.run(names, feeds)):
        assert relative_l2(got[name], expected) < tolerance, name
