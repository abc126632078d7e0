"""Isolated measurement and parallel compilation in worker processes.

    spec = CandidateSpec("dsl.cpu", {"tile_k": 8}, modules=("wpk.kernels.generated",))
    with MeasureWorker() as worker:                     # one long-lived child process
        m = worker.measure(workload, spec, MeasureOptions(repeats=10), seed=0)
    with MeasureWorker(timer="cuda-events") as worker:  # CUDA events, on the GPU
        ...
    with CompilePool(jobs=4) as pool:                   # one worker per core by default
        results = pool.compile([CompileJob.dsl("gemm", bindings, config), ...], timeout_s=60)

Every child is `python -m wpk.search.worker_main` (see its docstring for the
protocol), in its own session so a Ctrl-C reaches only the build, which then
kills its workers. A `MeasureWorker` verifies and times candidates with the
function of its timer (`wpk.search.runner.TIMERS`: fresh random inputs,
NaN-poisoned outputs, float64 reference, warm-up, repeats, median and spread,
cache or L2 flush). The parent turns what the child cannot report into a
`Measurement`: a hang past `timeout_s` is killed (status timeout), a death by
signal is a runtime_error naming the signal (SIGSEGV ...) with the tail of the
child's stderr (faulthandler's traceback). The worker is restarted only after
such a failure, so its start cost is paid once per build, not per candidate.

A candidate crosses the process boundary as a `CandidateSpec`
(`wpk.kernels.jobs`): the child imports its modules, looks the implementation
up by name in the registry and calls its `prepare`; generated kernels are
registered implementations whose `prepare` loads from the compile cache,
which a `CompilePool` has filled in parallel beforehand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from wpk.core.errors import OptionError
from wpk.core.workload import Workload
from wpk.kernels.jobs import CandidateSpec
from wpk.kernels.registry import Candidate
from wpk.search.measure import Measurement, Status
from wpk.search.worker_process import WorkerCrash, WorkerProcess, WorkerTimeout

MEASURE_PRELOAD = ("wpk.kernels.builtin",)


# ----------------------------------------------------------------------------- measuring
@dataclass(frozen=True)
class MeasureOptions:
    """How a worker measures: warm-up runs, least/most timed runs and the least total time
    (see `measure_candidate`), relative L2 tolerance (None: by dtype), the longest one run
    may take (checked in the child), and the wall-clock limit of the whole measurement
    (prepare, verify, time), after which the parent kills the worker."""

    warmup: int = 2
    repeats: int = 5
    max_repeats: int = 50
    min_time: float = 0.05
    tolerance: float | None = None
    run_timeout_s: float | None = None
    timeout_s: float = 120.0

    def __post_init__(self):
        if self.timeout_s <= 0 or self.repeats < 1 or self.warmup < 0:
            raise OptionError(f"invalid measure options {self}",
                              hint="timeout_s > 0, repeats >= 1 and warmup >= 0")

    def to_json(self) -> dict:
        return {"warmup": self.warmup, "repeats": self.repeats, "max_repeats": self.max_repeats,
                "min_time": self.min_time, "tolerance": self.tolerance,
                "run_timeout_s": self.run_timeout_s}

    def timing(self) -> dict:
        """Keyword arguments of a measuring function (`measure_candidate`)."""
        return {"warmup": self.warmup, "repeats": self.repeats,
                "max_repeats": self.max_repeats, "min_time": self.min_time,
                "tolerance": self.tolerance, "timeout": self.run_timeout_s}

    def scaled(self, factor: int) -> MeasureOptions:
        """The same options with `factor` times the repeats, their cap, the least time and
        the wall-clock limit."""
        return replace(self, repeats=self.repeats * factor, max_repeats=self.max_repeats * factor,
                       min_time=self.min_time * factor, timeout_s=self.timeout_s * factor)


def failed_measurement(workload_key: str, spec: CandidateSpec, status: Status,
                       message: str) -> Measurement:
    """A measurement that never reached the kernel (compile error, crash, timeout)."""
    return Measurement(label=spec.label, impl=spec.impl, config=dict(spec.config),
                       status=status, message=message, workload_key=workload_key)


def crash_location(stderr: str) -> str:
    """The innermost Python frame of a faulthandler dump ('file:line in function'), or the
    last line of stderr when there is no dump."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.endswith("(most recent call first):") and index + 1 < len(lines):
            frame = lines[index + 1]  # File "x.py", line 57 in kernel
            if frame.startswith('File "'):
                path, _, rest = frame[6:].partition('", line ')
                return f"{path}:{rest}"
            return frame
    return lines[-1] if lines else ""


class MeasureWorker:
    """A long-lived child process that verifies and times one candidate at a time.

    `options` are the defaults of `measure`; `env` the child's environment (default:
    this process's when the child starts, e.g. WPK_CACHE_DIR); `timer` names the
    measuring function (`wpk.search.runner.TIMERS`).
    """

    def __init__(self, options: MeasureOptions | None = None,
                 env: Mapping[str, str] | None = None, timer: str = "host"):
        self.options = options or MeasureOptions()
        self.timer = timer
        self.process = WorkerProcess(MEASURE_PRELOAD, env)
        self.measurements = 0

    @property
    def starts(self) -> int:
        """How many worker processes were started (1 + restarts after failures)."""
        return self.process.starts

    def __enter__(self) -> MeasureWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.process.close()

    def measure(self, workload: Workload, candidate: Candidate | CandidateSpec,
                options: MeasureOptions | None = None, seed: int = 0) -> Measurement:
        """Verify and time `candidate` on `workload` in the child; never raises for a
        failing candidate (the status says what happened)."""
        options = options or self.options
        spec = CandidateSpec.of(candidate)
        message = {"kind": "measure", "workload": workload.to_json(), "candidate": spec.to_json(),
                   "options": options.to_json(), "seed": int(seed), "timer": self.timer}
        self.measurements += 1
        try:
            reply = self.process.request(message, options.timeout_s)
        except WorkerTimeout:
            return failed_measurement(workload.key, spec, Status.TIMEOUT,
                                      f"no result within {options.timeout_s:g} s; worker killed")
        except WorkerCrash as crash:
            where = crash_location(crash.stderr_tail)
            failure = failed_measurement(workload.key, spec, Status.RUNTIME_ERROR,
                                         crash.reason + (f" at {where}" if where else ""))
            return replace(failure, extra={"worker_stderr": crash.stderr_tail})
        if "error" in reply:
            return failed_measurement(workload.key, spec, Status.RUNTIME_ERROR,
                                      f"worker failed: {reply['error']}")
        measurement = Measurement.from_json(reply["measurement"])
        return replace(measurement, workload_key=workload.key,
                       extra={**measurement.extra, **({"artifact": spec.artifact}
                                                      if spec.artifact else {})})
