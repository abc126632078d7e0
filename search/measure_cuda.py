"""Measuring candidates on the GPU: verify against float64, time with CUDA events.

    m = measure_candidate(workload, candidate, rng=rng)          # in this process
    MeasureWorker(timer="cuda-events").measure(workload, spec)   # the same in a worker
    result = measure_parallel(workload, candidates, rng=rng)     # several streams at once

`measure_candidate` has the signature of `wpk.search.measure.measure_candidate`
(the 'cuda-events' timer of `wpk.search.runner.TIMERS`): fresh random inputs (static
inputs exact; the candidates of one workload share one set and its float64
reference, `shared_inputs`), uploaded once; constants passed to `prepare` as device
arrays; outputs poisoned with NaN on the device; the relative L2 error
against the float64 reference on the host; a second input set when both a run
and the reference are cheap; for generated kernels, the same inputs through the vendor library
(cuDNN/cuBLAS) when one takes the workload, its disagreement kept in
`extra['vendor_rel_l2']`. Timing: `warmup` runs, then `repeats` ..
`max_repeats` runs until `min_time` seconds, each between two CUDA events
on a non-default stream, with the L2 cache flushed before each run by
writing a buffer twice the L2 size (`l2_flush_bytes`). Median and
interquartile range are kept, as on the CPU.

`measure_parallel` times several verified candidates at once, each on its
own stream, re-measures the `top` fastest alone (with L2 flushes), and
picks the winner among those; it reports the tuning time it saved against
measuring every candidate alone (estimated from the medians).

Without cupy or a GPU these functions raise `DeviceError`; the worker turns
that into a failed measurement.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels import registry
from wpk.kernels.cuda.cupy_support import require_cupy
from wpk.kernels.registry import GENERATED, VENDOR, Candidate
from wpk.search.measure import (
    SECOND_CHECK_MAX_S,
    InputsFn,
    Measurement,
    ReferenceFn,
    Status,
    _default_inputs_fn,
    _default_reference_fn,
    _describe,
    _failure,
    compare,
    output_quanta,
    tolerance_for,
)

DEFAULT_L2_BYTES = 50 * 1024 * 1024


def l2_flush_bytes(l2_bytes: int | None) -> int:
    """Bytes written between timed runs: twice the L2 size (50 MiB assumed when unknown),
    rounded up to whole float32 elements."""
    size = 2 * (l2_bytes if l2_bytes and l2_bytes > 0 else DEFAULT_L2_BYTES)
    return -(-size // 4) * 4


def needs_more_runs(times: Sequence[float], repeats: int, max_repeats: int,
                    min_time: float) -> bool:
    """Whether timing goes on: fewer than `repeats` runs, or under `min_time` seconds and
    under `max_repeats` runs."""
    if len(times) < max(1, repeats):
        return True
    return sum(times) < min_time and len(times) < max_repeats


def summarize(times: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """Median and interquartile range of the timed runs."""
    q25, median, q75 = np.percentile(np.asarray(times, dtype=np.float64), [25, 50, 75])
    return float(median), (float(q25), float(q75))


def _cupy():
    return require_cupy("GPU measurement")


class L2Flusher:
    """Evicts the L2 cache by filling a device buffer of `l2_flush_bytes` on a stream."""

    def __init__(self, cupy, l2_bytes: int | None = None):
        if l2_bytes is None:
            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            l2_bytes = int(props.get("l2CacheSize", 0))
        self.buffer = cupy.empty(l2_flush_bytes(l2_bytes) // 4, cupy.float32)
        self._value = 0.0

    def __call__(self) -> None:
        self._value += 1.0
        self.buffer.fill(self._value)


def time_gpu(kernel: Callable, inputs: Sequence, outputs: Sequence, *, stream=None,
             flush: Callable | None = None, warmup: int = 2, repeats: int = 5,
             max_repeats: int = 50, min_time: float = 0.05) -> list[float]:
    """Seconds per run between CUDA events on `stream` (a new non-blocking one by default);
    `flush` runs on the same stream before each timed run."""
    cupy = _cupy()
    stream = stream or cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times: list[float] = []
    with stream:
        for _ in range(warmup):
            kernel(inputs, outputs)
        stream.synchronize()
        while needs_more_runs(times, repeats, max_repeats, min_time):
            if flush is not None:
                flush()
            start.record(stream)
            kernel(inputs, outputs)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return times


def _upload(cupy, arrays: Sequence[np.ndarray | None]) -> list:
    return [None if a is None else cupy.asarray(np.ascontiguousarray(a)) for a in arrays]


def _poisoned(cupy, workload: Workload) -> list:
    outs = []
    for spec in workload.outputs:
        dtype = np.dtype(spec.dtype)
        fill = np.nan if dtype.kind in "fc" else (np.iinfo(dtype).max if dtype.kind in "iu"
                                                  else True)
        outs.append(cupy.full(spec.shape, fill, dtype=dtype))
    return outs


_REFERENCES: OrderedDict = OrderedDict()
REFERENCE_CACHE_SIZE = 2


def shared_inputs(workload: Workload, rng: np.random.Generator, inputs_fn: InputsFn,
                  reference_fn: ReferenceFn) -> tuple[list, list, float]:
    """(inputs, float64 reference outputs, seconds the reference took) for a workload.
    The candidates of one workload measured one after another share one input set drawn
    from the first one's `rng` (fresh for every binary: drawn when it is measured, never
    seen at build time), so the host reference, which costs far more than a GPU run, is
    computed once per workload, not once per candidate."""
    key = (workload.key, inputs_fn, reference_fn)  # the functions stay alive while cached
    if key in _REFERENCES:
        _REFERENCES.move_to_end(key)
        return _REFERENCES[key]
    inputs = list(inputs_fn(workload, rng))
    started = time.perf_counter()
    expected = list(reference_fn(workload, inputs))
    entry = (inputs, expected, time.perf_counter() - started)
    _REFERENCES[key] = entry
    while len(_REFERENCES) > REFERENCE_CACHE_SIZE:
        _REFERENCES.popitem(last=False)
    return entry


def _run_checked(cupy, kernel, workload: Workload, host_inputs, device_inputs,
                 expected: Sequence, limit: float) -> tuple[float, str, float]:
    """Run once on poisoned outputs: (error, why wrong or '', seconds of the run)."""
    outputs = _poisoned(cupy, workload)
    cupy.cuda.Device().synchronize()
    started = time.perf_counter()
    kernel(device_inputs, outputs)
    cupy.cuda.Device().synchronize()
    seconds = time.perf_counter() - started
    for index, (host, device) in enumerate(zip(host_inputs, device_inputs)):
        if host is not None and not np.array_equal(host, cupy.asnumpy(device),
                                                   equal_nan=host.dtype.kind in "fc"):
            return float("inf"), f"the kernel overwrote its input {index}", seconds
    error, why = compare([cupy.asnumpy(o) for o in outputs], expected,
                         output_quanta(workload))
    if not why and error > limit:
        why = f"relative L2 error {error:.3g} exceeds {limit:.3g}"
    return error, why, seconds


def vendor_disagreement(workload: Workload, candidate: Candidate, device_inputs,
                        outputs) -> float | None:
    """Relative L2 difference between a generated kernel's outputs and the vendor library's
    on the same inputs (None when no vendor implementation takes the workload)."""
    if candidate.implementation.kind != GENERATED:
        return None
    cupy = _cupy()
    consts = {i: device_inputs[i] for i in workload.const_inputs if device_inputs[i] is not None}
    for impl in registry.implementations("cuda"):
        if impl.kind != VENDOR or impl.unsupported_reason(workload) is not None:
            continue
        try:
            configs = impl.configs(workload) or [{}]
            kernel = impl.prepare(workload, consts, configs[0])
            expected = _poisoned(cupy, workload)
            kernel(device_inputs, expected)
        except Exception:
            continue
        error, _ = compare([cupy.asnumpy(o) for o in outputs],
                           [cupy.asnumpy(e).astype(np.float64) for e in expected])
        return error
    return None


def measure_candidate(workload: Workload, candidate: Candidate, *,
                      rng: np.random.Generator, warmup: int = 2, repeats: int = 5,
                      max_repeats: int = 50, min_time: float = 0.05,
                      tolerance: float | None = None, timeout: float | None = None,
                      inputs_fn: InputsFn | None = None,
                      reference_fn: ReferenceFn | None = None,
                      flusher: L2Flusher | None = None) -> Measurement:
    """Prepare, verify and time one candidate on the current GPU (see the module docstring).
    DeviceError without cupy or a GPU; every failure of the candidate is a status."""
    cupy = _cupy()
    inputs_fn = inputs_fn or _default_inputs_fn()
    reference_fn = reference_fn or _default_reference_fn()
    limit = tolerance_for(workload) if tolerance is None else tolerance
    host_inputs, expected, reference_s = shared_inputs(workload, rng, inputs_fn, reference_fn)
    device_inputs = _upload(cupy, host_inputs)
    consts = {i: device_inputs[i] for i in workload.const_inputs if device_inputs[i] is not None}
    try:
        kernel = candidate.implementation.prepare(workload, consts, candidate.config)
    except Exception as exc:  # DeviceError, ToolchainError, cuDNN declining the graph ...
        return _failure(workload, candidate, Status.COMPILE_ERROR, _describe(exc))
    try:
        error, why, first_run = _run_checked(cupy, kernel, workload, host_inputs,
                                             device_inputs, expected, limit)
    except Exception as exc:
        return _failure(workload, candidate, Status.RUNTIME_ERROR, _describe(exc))
    if timeout is not None and first_run > timeout:
        return _failure(workload, candidate, Status.TIMEOUT,
                        f"one run took {first_run:.3g} s, over the {timeout:.3g} s limit")
    if why:
        return _failure(workload, candidate, Status.WRONG_ANSWER, why, error)
    if first_run < SECOND_CHECK_MAX_S and reference_s < SECOND_CHECK_MAX_S:
        fresh = list(inputs_fn(workload, rng))
        second = [host_inputs[i] if i in consts else fresh[i] for i in range(len(fresh))]
        second_device = [device_inputs[i] if i in consts else d
                         for i, d in enumerate(_upload(cupy, second))]
        try:
            error2, why, _ = _run_checked(cupy, kernel, workload, second, second_device,
                                          reference_fn(workload, second), limit)
        except Exception as exc:
            return _failure(workload, candidate, Status.RUNTIME_ERROR, _describe(exc))
        if why:
            return _failure(workload, candidate, Status.WRONG_ANSWER,
                            why + " (second input set)", error2)
        error = max(error, error2)
    outputs = _poisoned(cupy, workload)
    extra: dict = {"device": _device_name(cupy), "timer": "cuda_events"}
    try:
        flush = flusher or L2Flusher(cupy)
        times = time_gpu(kernel, device_inputs, outputs, flush=flush, warmup=warmup,
                         repeats=repeats, max_repeats=max_repeats, min_time=min_time)
        disagreement = vendor_disagreement(workload, candidate, device_inputs, outputs)
    except Exception as exc:
        return _failure(workload, candidate, Status.RUNTIME_ERROR, _describe(exc))
    if disagreement is not None:
        extra["vendor_rel_l2"] = disagreement
    plan = getattr(kernel, "plan", None)
    if plan:
        extra["vendor_plan"] = dict(plan)
    median, spread = summarize(times)
    impl = candidate.implementation
    return Measurement(label=candidate.label, impl=impl.name, kind=impl.kind,
                       config=dict(candidate.config), status=Status.OK, times_s=tuple(times),
                       median_s=median, spread_s=spread, rel_l2_error=error,
                       workload_key=workload.key, extra=extra)


# ----------------------------------------------------------------------------- workers


# ----------------------------------------------------------------------------- parallel


def top_candidates(measurements: Sequence[Measurement], k: int) -> list[int]:
    """Indices of the `k` fastest verified measurements, fastest first."""
    ok = [i for i, m in enumerate(measurements) if m.ok and np.isfinite(m.median_s)]
    return sorted(ok, key=lambda i: measurements[i].median_s)[:max(0, k)]


def runs_alone(median_s: float, repeats: int = 5, max_repeats: int = 50,
               min_time: float = 0.05) -> int:
    """How many timed runs `time_gpu` makes for a kernel of `median_s` seconds."""
    if not median_s > 0:
        return max(1, repeats)
    wanted = int(np.ceil(min_time / median_s)) if min_time > 0 else 0
    return max(max(1, repeats), min(max_repeats, wanted))


def estimated_sequential_s(medians: Sequence[float], flush_s: float, warmup: int = 2,
                           repeats: int = 5, max_repeats: int = 50,
                           min_time: float = 0.05) -> float:
    """What timing every candidate alone (`measure_candidate`: `warmup` runs, then
    `runs_alone` flushed runs) would have cost, from each one's median run time."""
    total = 0.0
    for median in medians:
        if np.isfinite(median):
            runs = runs_alone(median, repeats, max_repeats, min_time)
            total += (warmup + runs) * median + runs * flush_s
    return total


def alone_estimates(parallel: Sequence[Measurement], remeasured: Mapping[int, Measurement],
                    timed: Sequence[int]) -> list[float]:
    """Each timed candidate's median alone: its re-measurement, else its contended median
    scaled by the median (alone / contended) ratio of the re-measured ones."""
    ratios = [remeasured[i].median_s / parallel[i].median_s for i in timed
              if i in remeasured and remeasured[i].ok and parallel[i].median_s > 0]
    scale = float(np.median(ratios)) if ratios else 1.0
    return [remeasured[i].median_s if i in remeasured and remeasured[i].ok
            else parallel[i].median_s * scale for i in timed]


@dataclass(frozen=True)
class ParallelResult:
    """Parallel timing (contended), the alone re-measurements, the winner and time saved.

    `parallel[i]` is candidate i's verification failure or its contended timing
    (`extra["contended"]`); `remeasured[i]` its timing alone (flushed, sequential) for the
    top ones; `winner` the index of the fastest re-measured one (None when none verified).
    """

    parallel: list[Measurement]
    remeasured: dict[int, Measurement]
    winner: int | None
    wall_s: float
    estimated_sequential_s: float
    streams: int = 1

    @property
    def saved_s(self) -> float:
        """Estimated sequential time minus the wall time (0 when parallel was slower)."""
        return max(0.0, self.estimated_sequential_s - self.wall_s)

    def measurements(self) -> list[Measurement]:
        """Per candidate: its re-measurement alone when it has one, else `parallel[i]`."""
        return [self.remeasured.get(i, m) for i, m in enumerate(self.parallel)]

    def to_json(self) -> dict:
        return {"parallel": [m.to_json() for m in self.parallel],
                "remeasured": {str(i): m.to_json() for i, m in self.remeasured.items()},
                "winner": self.winner, "wall_s": self.wall_s,
                "estimated_sequential_s": self.estimated_sequential_s,
                "streams": self.streams}

    @staticmethod
    def from_json(data: Mapping) -> ParallelResult:
        return ParallelResult([Measurement.from_json(m) for m in data["parallel"]],
                              {int(i): Measurement.from_json(m)
                               for i, m in data["remeasured"].items()},
                              data["winner"], float(data["wall_s"]),
                              float(data["estimated_sequential_s"]), int(data["streams"]))


@dataclass
class _Setup:
    """A verified candidate prepared again for the parallel phase, on its own buffers."""

    kernel: Callable
    inputs: list
    outputs: list
    stream: object
    events: tuple
    times: list


def _parallel_setups(cupy, workload: Workload, candidates: Sequence[Candidate],
                     live: Sequence[int], host: Sequence, pool: Sequence,
                     failed: dict[int, Measurement]) -> dict[int, _Setup]:
    """Prepare every verified candidate on its own inputs/outputs and stream (round robin);
    one untimed run each as warm-up. A candidate that fails here goes to `failed`."""
    setups: dict[int, _Setup] = {}
    for i in live:
        stream = pool[len(setups) % len(pool)]
        try:
            device_inputs = _upload(cupy, host)
            consts = {j: device_inputs[j] for j in workload.const_inputs
                      if device_inputs[j] is not None}
            kernel = candidates[i].implementation.prepare(workload, consts,
                                                          candidates[i].config)
            outputs = _poisoned(cupy, workload)
            with stream:
                kernel(device_inputs, outputs)
        except Exception as exc:
            failed[i] = _failure(workload, candidates[i], Status.RUNTIME_ERROR,
                                 "parallel setup: " + _describe(exc))
            continue
        setups[i] = _Setup(kernel, device_inputs, outputs, stream,
                           (cupy.cuda.Event(), cupy.cuda.Event()), [])
    for setup in setups.values():
        setup.stream.synchronize()
    return setups


def _parallel_rounds(cupy, workload: Workload, candidates: Sequence[Candidate],
                     setups: dict[int, _Setup], runs: int,
                     failed: dict[int, Measurement]) -> None:
    """`runs` rounds: every candidate launched between its own two events on its own
    stream, then every end event waited for. A candidate that raises leaves `setups`."""
    for _ in range(runs):
        for i, setup in list(setups.items()):
            start, end = setup.events
            try:
                with setup.stream:
                    start.record(setup.stream)
                    setup.kernel(setup.inputs, setup.outputs)
                    end.record(setup.stream)
            except Exception as exc:
                failed[i] = _failure(workload, candidates[i], Status.RUNTIME_ERROR,
                                     "parallel run: " + _describe(exc))
                del setups[i]
        for setup in setups.values():
            start, end = setup.events
            end.synchronize()
            setup.times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)


def measure_parallel(workload: Workload, candidates: Sequence[Candidate], *,
                     rng: np.random.Generator, streams: int = 4, top: int = 3, runs: int = 20,
                     warmup: int = 2, repeats: int = 5, max_repeats: int = 50,
                     min_time: float = 0.05, tolerance: float | None = None,
                     timeout: float | None = None, inputs_fn: InputsFn | None = None,
                     reference_fn: ReferenceFn | None = None) -> ParallelResult:
    """Verify every candidate (`measure_candidate`, one flushed run), time the verified
    ones concurrently on `streams` streams for `runs` rounds (no L2 flush: contended
    times rank, they do not decide), re-measure the `top` fastest alone with
    `measure_candidate` (flushed, `warmup`/`repeats`/... as given) and pick the fastest
    of those. The time saved is estimated against timing every verified candidate alone
    with the same options (`estimated_sequential_s`)."""
    cupy = _cupy()
    started = time.perf_counter()
    seed = int(rng.integers(2**31))
    flusher = L2Flusher(cupy)
    check = dict(tolerance=tolerance, timeout=timeout, inputs_fn=inputs_fn,
                 reference_fn=reference_fn, flusher=flusher)
    parallel = [measure_candidate(workload, c, rng=np.random.default_rng(seed), warmup=1,
                                  repeats=1, max_repeats=1, min_time=0.0, **check)
                for c in candidates]
    verify_s = time.perf_counter() - started
    live = [i for i, m in enumerate(parallel) if m.ok]
    failed: dict[int, Measurement] = {}
    setups: dict[int, _Setup] = {}
    if live:
        host, _, _ = shared_inputs(workload, np.random.default_rng(seed),
                                   inputs_fn or _default_inputs_fn(),
                                   reference_fn or _default_reference_fn())
        pool = [cupy.cuda.Stream(non_blocking=True) for _ in range(max(1, streams))]
        setups = _parallel_setups(cupy, workload, candidates, live, host, pool, failed)
        _parallel_rounds(cupy, workload, candidates, setups, max(1, runs), failed)
    for i, bad in failed.items():
        parallel[i] = bad
    for i, setup in setups.items():
        median, spread = summarize(setup.times)
        parallel[i] = replace(parallel[i], times_s=tuple(setup.times), median_s=median,
                              spread_s=spread, extra={**parallel[i].extra, "contended": True,
                                                      "streams": min(streams, len(setups))})
    timing = dict(warmup=warmup, repeats=repeats, max_repeats=max_repeats, min_time=min_time)
    remeasured = {i: measure_candidate(workload, candidates[i],
                                       rng=np.random.default_rng(seed), **timing, **check)
                  for i in top_candidates(parallel, top)}
    alone_ok = [i for i, m in remeasured.items() if m.ok and np.isfinite(m.median_s)]
    winner = min(alone_ok, key=lambda i: remeasured[i].median_s, default=None)
    wall = time.perf_counter() - started
    timed = list(setups)
    estimate = verify_s + estimated_sequential_s(
        alone_estimates(parallel, remeasured, timed), _flush_seconds(cupy, flusher), **timing)
    return ParallelResult(parallel, remeasured, winner, wall, estimate, max(1, streams))


def _flush_seconds(cupy, flusher: L2Flusher) -> float:
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    flusher()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / 1e3


def _device_name(cupy) -> str:
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)
