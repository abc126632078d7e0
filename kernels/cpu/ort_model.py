"""A whole model run by onnxruntime as its users run it (`ort.model`).

    workload = model_workload(graph)               # op 'Model' (domain wpk): inputs -> outputs
    kernel = ORT_MODEL.prepare_from_artifacts(workload, {}, {}, {MODEL_FILE: model_bytes})

The peer a plan is measured against end to end (`wpk.partition`): when
onnxruntime runs the user's model faster than wpk's per-operator plan, the
plan is this one step holding the model (`model.onnx` among the plan's
kernels), so a plan is never slower than onnxruntime on the machine it was
built on. The session uses onnxruntime's default options (all graph
optimizations, its default thread count and spinning), not wpk's: that is the
latency onnxruntime's users see.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

from wpk.core.errors import UnsupportedError
from wpk.core.graph import Graph
from wpk.core.workload import Workload
from wpk.kernels.registry import VENDOR, Implementation, Kernel, register

MODEL_OP = "Model"
MODEL_DOMAIN = "wpk"
MODEL_FILE = "model.onnx"


def model_workload(graph: Graph) -> Workload:
    """The workload of a whole model: the graph's inputs (not constants) to its outputs,
    their names kept as attributes (what the session is fed and asked for)."""
    inputs = [name for name in graph.inputs if name not in graph.constants]
    return Workload(MODEL_OP, tuple(graph.tensors[n].spec for n in inputs),
                    tuple(graph.tensors[n].spec for n in graph.outputs),
                    (("inputs", tuple(inputs)), ("outputs", tuple(graph.outputs))),
                    domain=MODEL_DOMAIN)


def default_session(model_bytes: bytes) -> ort.InferenceSession:
    """An onnxruntime CPU session with onnxruntime's default options."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initializers are not news here
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


class OrtModel(Implementation):
    """The whole model in one onnxruntime session (see the module docstring)."""

    name = "ort.model"
    onnxruntime = True
    kind = VENDOR
    uses_blas = False

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.op == MODEL_OP and workload.domain == MODEL_DOMAIN:
            return None
        return "runs whole models only"

    def configs(self, workload: Workload) -> list[dict]:
        return []  # never an operator's candidate: the partition step offers it

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        raise UnsupportedError("ort.model runs the model stored in the plan",
                               hint="load the plan with wpk.load")

    def prepare_from_artifacts(self, workload: Workload, consts: Mapping[int, np.ndarray],
                               config: Mapping, files: Mapping[str, bytes]) -> Kernel:
        """A kernel(inputs, outputs) running the stored model once per call."""
        session = default_session(bytes(files[MODEL_FILE]))
        names = list(workload.attr("inputs"))
        wanted = list(workload.attr("outputs"))

        def kernel(inputs, outputs) -> None:
            results = session.run(wanted, dict(zip(names, inputs)))
            for out, result in zip(outputs, results):
                np.copyto(out, result, casting="unsafe")

        def run_feeds(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            """The outputs (fresh arrays, in `output_names` order) of one run on `feeds`,
            fed as they are: what a plan of this one step runs (`Session`)."""
            return session.run(wanted, feeds)

        run_feeds.output_names = tuple(wanted)
        kernel.run_feeds = run_feeds
        return kernel


ORT_MODEL = register(OrtModel())
