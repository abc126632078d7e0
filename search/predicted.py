"""The runner of an offline GPU build: predicted, not timed.

    runner = PredictedRunner(gpu)             # a preset, e.g. gpu_preset("h100")
    measurements = runner.run(workload, candidates)

A generated kernel is compiled for the preset's arch (nvcc, or NVRTC 12 +
ptxas for p100/v100), its ptxas usage checked against the preset, its loop IR
verified in the GPU emulator on fresh random inputs against the float64
reference (sampled blocks for big grids), and its time predicted by the
analytical model (`wpk.kernels.cuda.analytic`) with its on-chip work counted
(`wpk.kernels.cuda.traffic`); vendor placeholders, device copies and host
steps are predicted by the model alone. Every measurement carries
`extra["predicted"]`; `prefetch` compiles a workload's generated candidates in
threads (`jobs`) while earlier ones are emulated.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from wpk.core.errors import ScheduleError, ToolchainError
from wpk.core.workload import Workload
from wpk.kernels.cuda import analytic
from wpk.kernels.cuda.generated import DSL_CUDA, CudaModuleImplementation
from wpk.kernels.cuda.kernel_by_kernel import (
    FULL_PIPELINE_LANES,
    checkable,
    earlier_lanes,
    verify_kernel_by_kernel,
)
from wpk.kernels.cuda.offline import check_usage, cubin_arch, spill_note, verify_emulated
from wpk.kernels.cuda.predicted import DEVICE_COPY, HOST_STEP
from wpk.kernels.cuda.traffic import kernel_work
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.kernels.registry import Candidate
from wpk.search.measure import Measurement, Status, output_quanta, tolerance_for
from wpk.search.runner import AnyCandidate, Runner, as_candidate
from wpk.search.workers import MeasureOptions


class PredictedRunner(Runner):
    """Predicts candidates on GPU preset `gpu` (see the module docstring)."""

    steady = True  # a prediction is the same every time

    def __init__(self, gpu, options: MeasureOptions | None = None, seed: int = 0,
                 jobs: int | None = None):
        super().__init__(options, seed)
        self.gpu = gpu
        self.jobs = jobs
        self._pool: ThreadPoolExecutor | None = None
        self._builds: dict = {}

    def prefetch(self, workload: Workload, candidates: Sequence[AnyCandidate]) -> None:
        """Start compiling the generated candidates in threads."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.jobs or os.cpu_count() or 1)
        for candidate in map(as_candidate, candidates):
            key = (workload.key, candidate.label)
            impl = candidate.implementation
            if isinstance(impl, CudaModuleImplementation) and key not in self._builds:
                self._builds[key] = self._pool.submit(impl.build, workload, candidate.config)

    def close(self) -> None:
        for future in self._builds.values():
            future.cancel()
        self._builds.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _build(self, workload: Workload, candidate):
        future = self._builds.pop((workload.key, candidate.label), None)
        return future.result() if future is not None \
            else candidate.implementation.build(workload, candidate.config)

    def measure(self, workload: Workload, candidate: AnyCandidate,
                options: MeasureOptions | None = None, seed: int | None = None) -> Measurement:
        options = options or self.options
        seed = self.seed_of(workload, candidate) if seed is None else seed
        candidate = as_candidate(candidate)
        impl = candidate.implementation
        base = dict(label=candidate.label, impl=impl.name, config=dict(candidate.config),
                    kind=impl.kind, workload_key=workload.key)
        if isinstance(impl, CudaModuleImplementation):
            return self._generated(workload, candidate, seed, base, options.tolerance)
        if hasattr(impl, "predict"):     # a placeholder with a model of its own
            prediction = impl.predict(workload, self.gpu)
        elif impl is HOST_STEP:
            prediction = analytic.predict_host(workload)
        elif impl is DEVICE_COPY:
            prediction = analytic.predict_copy(workload, self.gpu)
        else:
            prediction = analytic.predict_vendor(workload, self.gpu, impl.library)
        return Measurement(status=Status.OK, median_s=prediction.seconds,
                           spread_s=(prediction.seconds, prediction.seconds),
                           message="predicted by the analytical model",
                           extra={"predicted": True, "model": prediction.to_json()}, **base)

    def _generated(self, workload, candidate, seed, base, tolerance=None) -> Measurement:
        try:
            built = self._build(workload, candidate)
        except ScheduleError as exc:
            return Measurement(status=Status.COMPILE_ERROR, message=f"rejected before "
                               f"compiling: {exc.message}", extra={"predicted": True}, **base)
        except ToolchainError as exc:
            return Measurement(status=Status.COMPILE_ERROR, message=exc.message[:500],
                               extra={"predicted": True}, **base)
        usage = built.binary.kernels
        extra = {"predicted": True, "arch": built.binary.arch,
                 "compiler": built.binary.compiler, "cubin_arch": cubin_arch(built.binary.cubin),
                 "usage": {name: {"registers": u.registers, "shared_bytes": u.shared_bytes,
                                  "spill_stores": u.spill_stores, "spill_loads": u.spill_loads}
                           for name, u in usage.items()}}
        reason = check_usage(usage, built.launches, self.gpu)
        if reason is not None:
            reason = f"ptxas usage: {reason}"
        if extra["cubin_arch"] != self.gpu.arch:
            reason = f"the cubin is for {extra['cubin_arch']}, not {self.gpu.arch}"
        if reason is not None:
            return Measurement(status=Status.RUNTIME_ERROR, message=reason, extra=extra,
                               **base)
        verification = verify_generated(workload, built, seed, tolerance, candidate)
        extra["verified"] = verification.describe()
        extra["emulated_blocks"] = verification.blocks
        if not verification.ok:
            return Measurement(status=Status.WRONG_ANSWER, message=verification.message,
                               rel_l2_error=verification.rel_l2_error, extra=extra, **base)
        # the on-chip work (flops, load/store wavefronts) tells a tiled kernel from a naive one
        work = {kernel.name: kernel_work(kernel) for kernel in built.func.kernels}
        prediction = analytic.predict_generated(
            workload, self.gpu, built.launches, usage, work,
            candidate.implementation.algorithm_work(workload, candidate.config))
        extra["model"] = prediction.to_json()
        note = spill_note(usage)
        return Measurement(status=Status.OK, median_s=prediction.seconds,
                           spread_s=(prediction.seconds, prediction.seconds),
                           rel_l2_error=verification.rel_l2_error,
                           message="; ".join(filter(None, ["predicted; " + extra["verified"],
                                                           note])),
                           extra=extra, **base)


def verify_generated(workload: Workload, built, seed: int = 0, tolerance: float | None = None,
                     candidate=None):
    """Emulator verification of a built generated kernel on fresh random inputs (relative
    L2 `tolerance`, default the workload's, tightened to the implementation's own as
    `wpk.search.measure` does); `candidate` defaults to a `dsl.cuda` one."""
    candidate = candidate or Candidate(DSL_CUDA, {})
    impl, config = candidate.implementation, candidate.config
    rng = np.random.default_rng(seed)
    inputs = random_inputs(workload, rng)
    expected = reference(workload, inputs)
    feeds, output = impl.emulator_feeds(workload, inputs, config)
    limit = tolerance or tolerance_for(workload)
    own = impl.tolerance(workload, config)
    limit = limit if own is None else min(limit, own)
    pipeline = impl.is_pipeline(config)
    if pipeline and earlier_lanes(built.func) > FULL_PIPELINE_LANES and checkable(built.func):
        return verify_kernel_by_kernel(built.func, feeds, {output: expected[0]},
                                       tolerance=limit, seed=seed)
    quantum = output_quanta(workload)[0]
    return verify_emulated(built.func, feeds, {output: expected[0]}, tolerance=limit,
                           seed=seed, full_before_last=pipeline,
                           quanta={output: quantum} if quantum else None)
