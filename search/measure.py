"""Measuring one candidate: prepare, verify against the float64 reference, time.

A `Measurement` is a frozen record with a `Status`. `measure_candidate` runs in
the calling process: it draws fresh random inputs for the workload (static
inputs exact, weights random), prepares the kernel with the drawn constants,
runs it on outputs poisoned with NaN, compares every output with the float64
reference by relative L2 error, verifies once more on a second input set when
that is cheap, and then times it: warm-up runs, then at least `repeats` runs
(more, up to `max_repeats`, until `min_time` seconds have been spent), with
the caches flushed before each run when the working set is small enough to
stay cached, and, in a process whose OpenMP threads spin long after a kernel
(`wpk.dsl.build.threads_spin_long`), only once they stop. The median and the
interquartile range are kept.
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from wpk.core.epilogue import FAKE_QUANT
from wpk.core.idle import wait_until_idle
from wpk.core.numerics import ROUNDING_OPS, is_ml_dtype, rounding_flips
from wpk.core.workload import TensorSpec, Workload
from wpk.dsl.build import threads_spin_long
from wpk.kernels.cpu.blas_threads import one_blas_thread
from wpk.kernels.cpu.native_chain import chain_kernel, native_call
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.kernels.registry import Candidate
from wpk.search import input_sets

InputsFn = Callable[[Workload, np.random.Generator], Sequence[np.ndarray | None]]
ReferenceFn = Callable[[Workload, Sequence[np.ndarray | None]], Sequence[np.ndarray]]

# Default relative L2 tolerance per output dtype (float32 accumulations of a
# few thousand terms stay well under 1e-5; half precision keeps ~3 digits).
DEFAULT_TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}
INTEGER_TOLERANCE = 0.0
_INTEGER_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "int32"})
# Verify a second input set only when one kernel run took less than this.
SECOND_CHECK_MAX_S = 0.05
# Inputs are checked for being overwritten by a run whole up to this many values, larger
# ones by a strided sample of about as many (`_snapshot`)
OVERWRITE_CHECK_VALUES = 1 << 22


class Status(enum.StrEnum):
    """Outcome of measuring one candidate."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    WRONG_ANSWER = "wrong_answer"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Measurement:
    """The verified timing (or the failure) of one candidate on one workload."""

    label: str
    impl: str
    config: Mapping[str, Any]
    status: Status
    times_s: tuple[float, ...] = ()
    median_s: float = float("nan")
    spread_s: tuple[float, float] = (float("nan"), float("nan"))
    rel_l2_error: float = float("nan")
    message: str = ""
    kind: str = ""
    workload_key: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def to_json(self) -> dict:
        """JSON form (NaN becomes null)."""
        return {
            "label": self.label, "impl": self.impl, "kind": self.kind,
            "config": dict(self.config), "status": self.status.value,
            "workload_key": self.workload_key,
            "times_s": list(self.times_s), "median_s": _finite_or_none(self.median_s),
            "spread_s": [_finite_or_none(v) for v in self.spread_s],
            "rel_l2_error": _finite_or_none(self.rel_l2_error),
            "message": self.message, "extra": dict(self.extra),
        }

    @staticmethod
    def from_json(data: Mapping) -> Measurement:
        spread = data.get("spread_s") or (None, None)
        return Measurement(
            label=data["label"], impl=data["impl"], kind=data.get("kind", ""),
            config=dict(data.get("config", {})), status=Status(data["status"]),
            workload_key=data.get("workload_key", ""),
            times_s=tuple(float(t) for t in data.get("times_s", ())),
            median_s=_none_to_nan(data.get("median_s")),
            spread_s=(_none_to_nan(spread[0]), _none_to_nan(spread[1])),
            rel_l2_error=_none_to_nan(data.get("rel_l2_error")),
            message=data.get("message", ""), extra=dict(data.get("extra", {})),
        )


def pooled(rounds: Sequence[Measurement]) -> Measurement:
    """One candidate's measurements of several rounds as one: every round's times, their
    median and quartiles, the largest error, `extra["rounds"]`. A round that did not
    verify decides: its measurement is returned as it is."""
    failed = next((m for m in rounds if not m.ok), None)
    if failed is not None:
        return failed
    times = [t for m in rounds for t in m.times_s]
    q25, median, q75 = np.percentile(times, [25, 50, 75])
    first = rounds[0]
    return replace(first, times_s=tuple(times), median_s=float(median),
                   spread_s=(float(q25), float(q75)),
                   rel_l2_error=max(m.rel_l2_error for m in rounds),
                   extra={**first.extra, "rounds": len(rounds)})


def _finite_or_none(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def _none_to_nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def tolerance_for(workload: Workload) -> float:
    """Default relative L2 tolerance: the loosest of the output dtypes' tolerances."""
    tolerances = [DEFAULT_TOLERANCE.get(spec.dtype, INTEGER_TOLERANCE)
                  for spec in workload.outputs]
    return max(tolerances, default=DEFAULT_TOLERANCE["float32"])


def output_quanta(workload: Workload) -> tuple[float | None, ...]:
    """Per output: the quantization step where an output is quantized (see `compare`): the
    scale of a workload whose epilogue ends in `fake_quant` (output 0), 1 for the integer
    outputs of an op that rounds to them (`ROUNDING_OPS`), None elsewhere."""
    quanta: list[float | None] = [None] * len(workload.outputs)
    if workload.op in ROUNDING_OPS:
        quanta = [1.0 if spec.dtype in _INTEGER_DTYPES else None for spec in workload.outputs]
    steps = workload.epilogue
    if steps and steps[-1].op == FAKE_QUANT:
        quanta[0] = float(steps[-1].attr("scale"))
    return tuple(quanta)


def poisoned_outputs(specs: Sequence[TensorSpec]) -> list[np.ndarray]:
    """Fresh C-contiguous output arrays filled with NaN (or a sentinel for integers)."""
    return [poison(np.empty(spec.shape, dtype=np.dtype(spec.dtype))) for spec in specs]


def poison(array: np.ndarray) -> np.ndarray:
    """Fill an output array with a value a correct kernel overwrites everywhere."""
    if array.dtype.kind in "fc":
        array.fill(np.nan)
    elif array.dtype.kind in "iu":
        array.fill(np.iinfo(array.dtype).max)
    elif array.dtype.kind == "b":
        array.fill(True)
    return array


def _beyond_range(ref: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """Where the (float64) reference is finite but beyond the output float type's range, or
    None where there is no such element. HF transformers' attention masks are
    `(1 - mask) * finfo(float32).min`: on verification's random inputs the exact value can
    exceed float32's range, and inf is then the correctly rounded output."""
    if np.dtype(dtype).kind != "f" or is_ml_dtype(dtype) or ref.dtype.kind != "f":
        return None   # ml_dtypes' narrow floats (float8: some without inf) keep the plain rule
    limit = float(np.finfo(dtype).max)
    if ref.size == 0:
        return None
    low, high = float(ref.min()), float(ref.max())   # no copy; NaN or inf: the full test
    if -limit <= low and high <= limit:
        return None
    with np.errstate(invalid="ignore"):
        beyond = np.abs(ref) > limit
    beyond &= np.isfinite(ref)
    return beyond if beyond.any() else None


def compare(outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray],
            quanta: Sequence[float | None] = ()) -> tuple[float, str]:
    """Worst relative L2 error over the outputs and, when it is wrong, why.

    Non-finite values must match the reference exactly (a NaN left from the
    poison where the reference is finite is an unwritten element). Where the reference is
    finite but beyond the output type's range, the output must be infinite (or the type's
    largest value) with the reference's sign; those elements leave the L2 error. Integer
    and bool outputs (ids, indices, masks) must equal the reference exactly. An output
    with a quantization step in `quanta` (`output_quanta`) may lie one step off the
    reference in a few elements (`wpk.core.numerics.rounding_flips`), which leave the L2
    error.
    """
    if len(outputs) != len(expected):
        return float("inf"), f"{len(outputs)} outputs but the reference has {len(expected)}"
    worst = 0.0
    for index, (out, ref) in enumerate(zip(outputs, expected)):
        ref = np.asarray(ref)
        if out.shape != ref.shape:
            return float("inf"), f"output {index} has shape {out.shape}, expected {ref.shape}"
        quantum = quanta[index] if index < len(quanta) else None
        if out.dtype.kind in "iu" and quantum:   # a quantized integer output
            flips, why = rounding_flips(out.astype(np.float64), ref.astype(np.float64),
                                         quantum)
            if flips is None:
                return float("inf"), f"output {index}: {why}"
            continue
        if out.dtype.kind in "biu":   # ids, indices, masks: every element exactly
            wrong = int(np.count_nonzero(out != ref))
            if wrong:
                return float("inf"), (f"output {index} ({out.dtype}) differs from the "
                                      f"reference in {wrong} of {out.size} elements")
            continue
        error, why = _float_error(index, out, ref, quantum)
        if why:
            return float("inf"), why
        worst = max(worst, error)
    return worst, ""


def _float_error(index: int, out: np.ndarray, ref: np.ndarray,
                 quantum: float | None) -> tuple[float, str]:
    """`compare` for one float output: (relative L2 error, "") or (inf, why it is wrong).
    The common case (a finite reference within the output type's range, no quantization
    step) takes no masks: the masked path copies every output twice more (on a 56 x 56 x
    256 output 27.6 ms against 18.9 ms)."""
    got = out.astype(np.float64) if out.dtype.kind != "c" else out.astype(np.complex128)
    finite_ref = np.isfinite(ref)
    all_finite = bool(finite_ref.all())
    beyond = _beyond_range(ref, out.dtype)
    if all_finite and not quantum and beyond is None:
        if not np.isfinite(got).all():
            count = int(np.count_nonzero(~np.isfinite(got)))
            return float("inf"), (f"output {index} has {count} of {got.size} elements NaN/inf "
                                  "(unwritten or overflowed)")
        diff, norm = np.linalg.norm(got - ref), np.linalg.norm(ref)
        return (float(diff / norm) if norm > 0 else float(diff)), ""
    if not all_finite:
        same_special = (np.isnan(got) & np.isnan(ref)) | (got == ref)
        if not same_special[~finite_ref].all():
            return float("inf"), f"output {index} differs where the reference is inf/nan"
    if beyond is not None:   # float32 rounds these to inf (or its largest value)
        sign_kept = np.sign(got[beyond]) == np.sign(ref[beyond])
        large = np.abs(got[beyond]) >= np.finfo(out.dtype).max
        if not (sign_kept & large).all():
            return float("inf"), (f"output {index} is finite and in range where the "
                                  f"reference lies beyond {out.dtype}'s range")
        finite_ref = finite_ref & ~beyond
        got = np.where(beyond, ref, got)
    if quantum:
        flips, why = rounding_flips(got, ref, quantum)
        if flips is None:
            return float("inf"), f"output {index}: {why}"
        finite_ref = finite_ref & ~flips
    bad = ~np.isfinite(got) & finite_ref
    if bad.any():
        count = int(bad.sum())
        return float("inf"), (f"output {index} has {count} of {bad.size} elements NaN/inf "
                              "(unwritten or overflowed)")
    diff = np.linalg.norm(got[finite_ref] - ref[finite_ref])
    norm = np.linalg.norm(ref[finite_ref])
    return (float(diff / norm) if norm > 0 else float(diff)), ""


@functools.cache
def _l2_cache_bytes() -> int:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as handle:
            text = handle.read().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
        return int(text.rstrip("KM")) * scale
    except (OSError, ValueError, IndexError):
        return 1 << 20


@functools.cache
def _flush_buffer() -> np.ndarray:
    return np.zeros(2 * _l2_cache_bytes() // 8, dtype=np.float64)


class CacheFlusher:
    """Evicts a small working set from L1/L2 by writing a buffer twice the L2 size."""

    def __init__(self, working_set_bytes: int):
        self.enabled = working_set_bytes < 2 * _l2_cache_bytes()
        self._buffer = _flush_buffer() if self.enabled else None
        self._value = 0.0

    def __call__(self) -> None:
        if self._buffer is not None:
            self._value += 1.0
            self._buffer.fill(self._value)


def _working_set(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> int:
    return sum(a.nbytes for a in inputs if a is not None) + sum(a.nbytes for a in outputs)


def _snapshot(array: np.ndarray) -> tuple[int, np.ndarray]:
    """(step, copy of every step-th value): what `_overwritten` compares after a run. Whole
    up to `OVERWRITE_CHECK_VALUES` values; a larger input (VGG's 100M-value classifier
    weight) by a strided sample of about that many: a kernel that uses an input as scratch
    space changes most of it, and copying and comparing the whole weight cost 0.1 s a
    measurement."""
    flat = array.reshape(-1)
    step = max(1, flat.size // OVERWRITE_CHECK_VALUES)
    return step, flat[::step].copy()


def _overwritten(snapshot: tuple[int, np.ndarray], array: np.ndarray) -> bool:
    step, before = snapshot
    return not np.array_equal(before, array.reshape(-1)[::step],
                              equal_nan=before.dtype.kind in "fc")


def _default_inputs_fn() -> InputsFn:
    return random_inputs


def _default_reference_fn() -> ReferenceFn:
    return reference


def _failure(workload: Workload, candidate: Candidate, status: Status, message: str,
             error: float = float("nan"), times: tuple[float, ...] = ()) -> Measurement:
    impl = candidate.implementation
    return Measurement(label=candidate.label, impl=impl.name, kind=impl.kind,
                       config=dict(candidate.config), status=status, message=message,
                       rel_l2_error=error, times_s=times, workload_key=workload.key)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def measure_candidate(workload: Workload, candidate: Candidate, *,
                      rng: np.random.Generator, warmup: int = 2, repeats: int = 5,
                      max_repeats: int = 50, min_time: float = 0.05,
                      tolerance: float | None = None, timeout: float | None = None,
                      inputs_fn: InputsFn | None = None,
                      reference_fn: ReferenceFn | None = None) -> Measurement:
    """Prepare, verify and time one candidate in this process.

    `repeats` is the least number of timed runs; more are made (up to
    `max_repeats`) until `min_time` seconds of kernel time are collected.
    `tolerance` defaults to `tolerance_for(workload)`, tightened to the implementation's
    own (`Implementation.tolerance`: Winograd's grows with the reduction length). With
    `timeout`, a first run slower than it ends the measurement with status timeout (an
    in-process run cannot be interrupted; worker processes can). `inputs_fn`
    and `reference_fn` default to `wpk.kernels.random_inputs.random_inputs`
    and `wpk.kernels.reference.reference`.

    BLAS runs on one thread throughout, the float64 reference included: OpenBLAS's
    worker threads spin for about 0.1 s after a call (yielding, not sleeping), and a
    reference computed on two threads left one spinning on the core the candidate's
    second OpenMP thread needed. On 2 cores a fused block then timed 1.05 ms instead of
    0.48 ms, and the planner chose onnxruntime's slower steps over it.
    """
    with one_blas_thread():
        return _measure_candidate(workload, candidate, rng, warmup, repeats, max_repeats,
                                  min_time, tolerance, timeout, inputs_fn, reference_fn)


def _measure_candidate(workload: Workload, candidate: Candidate, rng: np.random.Generator,
                       warmup: int, repeats: int, max_repeats: int, min_time: float,
                       tolerance: float | None, timeout: float | None,
                       inputs_fn: InputsFn | None,
                       reference_fn: ReferenceFn | None) -> Measurement:
    """`measure_candidate`, with BLAS already on one thread."""
    shared = inputs_fn is None and reference_fn is None   # input sets drawn once per seed
    inputs_fn = inputs_fn or _default_inputs_fn()
    reference_fn = reference_fn or _default_reference_fn()
    limit = tolerance_for(workload) if tolerance is None else tolerance
    own = candidate.implementation.tolerance(workload, candidate.config)
    limit = limit if own is None else min(limit, own)
    if shared:
        first = input_sets.draw(workload, rng)
        inputs, expected = first.inputs, first.expected
    else:
        inputs = list(inputs_fn(workload, rng))
        expected = functools.partial(reference_fn, workload, inputs)
    consts = {i: inputs[i] for i in workload.const_inputs if inputs[i] is not None}
    try:
        kernel = candidate.implementation.prepare(workload, consts, candidate.config)
    except Exception as exc:  # any failure of an implementation is a measured outcome
        return _failure(workload, candidate, Status.COMPILE_ERROR, _describe(exc))

    outputs = poisoned_outputs(workload.outputs)
    originals = [None if x is None else _snapshot(x) for x in inputs]
    try:
        start = time.perf_counter()
        kernel(inputs, outputs)
        first_run = time.perf_counter() - start
    except Exception as exc:
        return _failure(workload, candidate, Status.RUNTIME_ERROR, _describe(exc))
    if timeout is not None and first_run > timeout:
        return _failure(workload, candidate, Status.TIMEOUT,
                        f"one run took {first_run:.3g} s, over the {timeout:.3g} s limit")
    for index, (before, after) in enumerate(zip(originals, inputs)):
        if before is not None and _overwritten(before, after):
            return _failure(workload, candidate, Status.WRONG_ANSWER,
                            f"the kernel overwrote its input {index}")
    quanta = output_quanta(workload)
    error, why = compare(outputs, expected(), quanta)
    if why or error > limit:
        return _failure(workload, candidate, Status.WRONG_ANSWER,
                        why or f"relative L2 error {error:.3g} exceeds {limit:.3g}", error)

    if first_run < SECOND_CHECK_MAX_S:
        # Same constants (the kernel may have packed them), fresh data inputs.
        if shared:
            again = input_sets.draw(workload, rng, first, kept=tuple(consts))
            second, expected2 = again.inputs, again.expected
        else:
            fresh = list(inputs_fn(workload, rng))
            second = [inputs[i] if i in consts else fresh[i] for i in range(len(inputs))]
            expected2 = functools.partial(reference_fn, workload, second)
        for out in outputs:
            poison(out)
        try:
            kernel(second, outputs)
        except Exception as exc:
            return _failure(workload, candidate, Status.RUNTIME_ERROR, _describe(exc))
        error2, why = compare(outputs, expected2(), quanta)
        if why or error2 > limit:
            return _failure(workload, candidate, Status.WRONG_ANSWER,
                            (why or f"relative L2 error {error2:.3g} exceeds {limit:.3g}")
                            + " (second input set)", error2)
        error = max(error, error2)

    try:
        planned = outputs_as_planned(candidate, workload, inputs, outputs)
        times = _time_kernel(as_run(kernel, inputs, planned), inputs, planned, warmup=warmup,
                             repeats=repeats, max_repeats=max_repeats, min_time=min_time)
    except Exception as exc:
        return _failure(workload, candidate, Status.RUNTIME_ERROR, _describe(exc))
    q25, median, q75 = np.percentile(times, [25, 50, 75])
    impl = candidate.implementation
    return Measurement(label=candidate.label, impl=impl.name, kind=impl.kind,
                       config=dict(candidate.config), status=Status.OK, times_s=tuple(times),
                       median_s=float(median), spread_s=(float(q25), float(q75)),
                       rel_l2_error=error, workload_key=workload.key)


def as_run(kernel: Callable, inputs: Sequence[np.ndarray | None],
           outputs: Sequence[np.ndarray]) -> Callable:
    """The kernel as a CPU plan runs it on these buffers: a kernel with a native form (a C
    function and its pointers, `native_chain`) through the chain driver, as the runtime
    runs every step that has one, alone or with its neighbours, without the Python
    wrapper's per-call work (about 1 us an operand: a fused block's wrapper took 5 us a
    call, 5% of a 14x14 block); any other kernel (onnxruntime's, GPU ones) as it is."""
    native = native_call(kernel, inputs, outputs)
    return kernel if native is None else chain_kernel([native], keep=[kernel])


def outputs_as_planned(candidate: Candidate, workload: Workload,
                       inputs: Sequence[np.ndarray | None],
                       outputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
    """The outputs a CPU plan hands the kernel: a step that views its input (a Reshape-like
    that the buffer plan gives its input's buffer, `views_input`) writes onto that buffer
    itself, where its copy is skipped, so it is timed that way (verified on an output of
    its own first); any other step, the outputs as given."""
    views_input = getattr(candidate.implementation, "views_input", None)
    source = inputs[0] if inputs else None
    if views_input is None or source is None or not views_input(workload) \
            or not source.flags.c_contiguous or source.size != outputs[0].size:
        return outputs
    return [source.reshape(outputs[0].shape)]


def time_kernel(kernel: Callable, inputs: Sequence[np.ndarray | None],
                outputs: Sequence[np.ndarray], *, warmup: int = 2, repeats: int = 5,
                max_repeats: int = 50, min_time: float = 0.05) -> list[float]:
    """Seconds per run: `warmup` untimed runs, then `repeats`..`max_repeats` timed ones,
    with BLAS on one thread as the runtime runs it (`one_blas_thread`)."""
    with one_blas_thread():
        return _time_kernel(kernel, inputs, outputs, warmup=warmup, repeats=repeats,
                            max_repeats=max_repeats, min_time=min_time)


def _time_kernel(kernel: Callable, inputs: Sequence[np.ndarray | None],
                 outputs: Sequence[np.ndarray], *, warmup: int, repeats: int,
                 max_repeats: int, min_time: float) -> list[float]:
    flush = CacheFlusher(_working_set(inputs, outputs))
    if threads_spin_long():   # the last candidate's OpenMP threads may still hold the cores
        wait_until_idle()
    for _ in range(warmup):
        kernel(inputs, outputs)
    times: list[float] = []
    total, clock = 0.0, time.perf_counter
    while len(times) < max(1, repeats) or (total < min_time and len(times) < max_repeats):
        flush()
        start = clock()
        kernel(inputs, outputs)
        times.append(clock() - start)
        total += times[-1]
    return times
