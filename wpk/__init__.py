"""wpk: a hardware-aware inference engine for ONNX models.

    plan = wpk.build("model.onnx", target="cpu")      # optimize, tune, plan
    plan.save("model.wpk")
    session = wpk.load("model.wpk")
    outputs = session.run({"input": x})              # dict name -> array

Imports are lazy so that `import wpk.dsl` (or any subsystem) stays light.
"""

from __future__ import annotations

from wpk.core.version import __version__

__all__ = ["__version__", "build", "load"]


def build(model, target: str = "cpu", **options):
    """Build a plan for an ONNX model (path, bytes or ModelProto); see `wpk.pipeline.build`."""
    # Imported on call: every `import wpk.<module>` runs this file first, and the pipeline
    # imports nearly all of wpk (and onnxruntime); `import wpk` stays light.
    from wpk.core import forks
    from wpk.pipeline import build as _build

    # in a forked child on a thread of its own: OpenMP's threads did not survive the fork
    return forks.fork_safe_call(_build, model, target=target, **options)


def load(path, spin_threads: bool = False):
    """Load a plan file and return a `wpk.runtime.Session` ready to run (`spin_threads`:
    onnxruntime's threads spin while a run lasts, see `wpk.kernels.cpu.ort_region`)."""
    from wpk.runtime import Session  # on call, as in `build`

    return Session.load(path, spin_threads=spin_threads)
