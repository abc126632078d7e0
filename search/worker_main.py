"""The worker process of `wpk.search.workers`: `python -m wpk.search.worker_main`.

Protocol: one JSON object a line. Requests arrive on stdin; replies leave on
the stdout the process started with, which is moved to a private descriptor
first (fd 1 then points at stderr, so a kernel that prints cannot corrupt a
reply). The worker says `{"ready": pid}` once its imports are done, then
answers each request in turn:

* `{"kind": "init", "sys_path": [...]}` -> `{"ok": true}` (the parent's import path);
* `{"kind": "measure", "workload": ..., "candidate": CandidateSpec JSON,
  "options": {...}, "seed": int, "timer": "host" | "cuda-events"}` ->
  `{"measurement": Measurement JSON}` (the timer's function of
  `wpk.search.runner.TIMERS`; its exceptions, such as no GPU, are failed
  measurements);
* `{"kind": "call", "function": "module:name", "kwargs": {...}}` ->
  `{"result": ...}` (compile jobs);

and any request that raises -> `{"error": first line, "detail": message,
"traceback": ...}`. A
crash (signal) or a hang is the parent's to detect. The process asks the
kernel to kill it when its parent dies (Linux), so no worker outlives a build.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import os
import signal
import sys
import traceback
from collections.abc import Mapping

from wpk.core.devices import restrict_cpu_flags
from wpk.search.worker_process import CPU_FLAGS_OPTION

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: EOF on stdin still ends the worker
        pass


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _measure(request: Mapping) -> dict:
    # Imported once the worker runs: `main` has moved stdout away from the reply channel
    # first, so nothing an import prints can corrupt a reply.
    import numpy as np

    from wpk.core.workload import Workload
    from wpk.kernels import registry
    from wpk.kernels.registry import Candidate
    from wpk.search.measure import Measurement, Status
    from wpk.search.runner import timer_function

    workload = Workload.from_json(request["workload"])
    spec = request["candidate"]
    options = request.get("options", {})
    impl_name, config = spec["impl"], dict(spec.get("config") or {})
    args = ",".join(f"{k}={v}" for k, v in sorted(config.items()))
    label = f"{impl_name}[{args}]" if config else impl_name

    def failure(status: Status, message: str) -> dict:
        return {"measurement": Measurement(label=label, impl=impl_name, config=config,
                                           status=status, workload_key=workload.key,
                                           message=message).to_json()}

    try:
        for module in spec.get("modules") or ():
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImportError(f"module {module!r} does not import ({_describe(exc)})") from None
        implementation = registry.get(impl_name)
        artifact = spec.get("artifact")
        if artifact and not os.path.exists(artifact):
            raise FileNotFoundError(f"artifact {artifact} is missing")
    except Exception as exc:  # the candidate cannot be built here: a compile error
        return failure(Status.COMPILE_ERROR,
                       f"cannot load implementation {impl_name!r}: {_describe(exc)}")
    try:
        measure = timer_function(request.get("timer", "host"))
        measurement = measure(
            workload, Candidate(implementation, config),
            rng=np.random.default_rng(request["seed"]), warmup=options.get("warmup", 2),
            repeats=options.get("repeats", 5), max_repeats=options.get("max_repeats", 50),
            min_time=options.get("min_time", 0.05), tolerance=options.get("tolerance"),
            timeout=options.get("run_timeout_s"))
    except Exception as exc:  # no GPU for a CUDA timer, a device error ...
        return failure(Status.RUNTIME_ERROR, _describe(exc))
    return {"measurement": measurement.to_json()}


def _handle(request: Mapping) -> dict:
    kind = request.get("kind")
    if kind == "init":
        sys.path[:] = list(request["sys_path"])
        importlib.invalidate_caches()
        return {"ok": True}
    if kind == "measure":
        return _measure(request)
    if kind == "call":
        from wpk.kernels.jobs import import_function  # what compiles it is imported anyway

        function = import_function(request["function"])
        return {"result": function(**dict(request.get("kwargs") or {}))}
    raise ValueError(f"unknown request kind {kind!r}")


def main(argv: list[str] | None = None) -> None:
    """Serve requests until stdin closes; `argv` names modules to import up front, and
    `--cpu-flags=a,b` the CPU flags the parent restricted itself to."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    faulthandler.enable()
    _die_with_parent()
    import numpy  # noqa: F401  (paid once, before the first request's clock starts)

    import wpk.search.measure  # noqa: F401

    for argument in sys.argv[1:] if argv is None else argv:
        if argument.startswith(CPU_FLAGS_OPTION):
            restrict_cpu_flags(argument.removeprefix(CPU_FLAGS_OPTION).split(","))
        else:
            importlib.import_module(argument)
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = _handle(json.loads(line))
        except Exception as exc:
            reply = {"error": _describe(exc), "detail": str(exc)[-4000:],
                     "traceback": traceback.format_exc()[-4000:]}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
