"""Building for a CUDA target: the GPU check, and `--offline` planning by prediction.

    gpu = check_cuda_target(options)                   # HardwareSpec of the preset
    choices = plan_offline(items, gpu, plan_options)   # predicted, not measured
    mark_predicted(plan, gpu)                          # manifest + report say so
    choices, _ = plan_measured(items, gpu, plan_options)  # GPU present: CUDA events

`--gpu NAME` without `--offline` needs that GPU to be present: otherwise a
DeviceError names the preset and what is present ("no GPU present" or "found
NVIDIA A100 (sm_80), not h100") and hints at `--offline`.

With `--offline` every workload gets candidates (`offline_candidates`):
generated kernels in a few configs for the preset, the cuDNN/cuBLAS
placeholder, a device copy for data movement, else a host step. Instead of
being timed, each candidate is *predicted* by `OfflinePredictor`: a
generated kernel is compiled for the preset's arch (nvcc, or NVRTC 12 +
ptxas for p100/v100), its ptxas usage checked against the preset, its loop
IR verified in the GPU emulator on fresh random inputs against the float64
reference (sampled blocks for big grids), and its time predicted by the
analytical model (`wpk.kernels.cuda.analytic`); vendor, copy and host steps
are predicted by that model alone. The planner then keeps the candidate
with the smallest predicted time. Plan and report carry `"predicted": true`
per choice and a statement that `wpk tune PLAN` on the GPU measures them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import numpy as np

from wpk.core.errors import DeviceError, OptionError, ScheduleError, ToolchainError
from wpk.core.workload import Workload
from wpk.kernels.registry import Candidate
from wpk.search.measure import Measurement, Status, tolerance_for

DEFAULT_CONFIGS = 3


def describe_present(gpus) -> str:
    """'no GPU present' or 'found NVIDIA A100 (sm_80)[, ...]'."""
    if not gpus:
        return "no GPU present"
    return "found " + ", ".join(f"{g.name} (sm_{g.compute_capability[0]}"
                                f"{g.compute_capability[1]})" for g in gpus)


def check_cuda_target(gpu_name: str | None, offline: bool, present=None):
    """The preset to build for; DeviceError when it is absent and the build is not offline.
    `present` is the list of detected GPUs (default: `detect_gpus()`)."""
    from wpk.core.devices import GPU_PRESETS, detect_gpus, gpu_preset

    name = (gpu_name or "auto").strip().lower()
    present = detect_gpus() if present is None else present
    if name == "auto":
        if offline:
            raise OptionError("--gpu auto --offline: auto means the GPU present; an offline "
                              "build needs a named preset",
                              hint=f"name one of: {', '.join(GPU_PRESETS)}")
        matching = [g for g in present if g.preset is not None]
        if not matching:
            what = describe_present(present) + (", none of them a wpk preset" if present
                                                 else "")
            raise DeviceError(f"target cuda (--gpu auto): {what}",
                              hint=f"name a preset ({', '.join(GPU_PRESETS)}) and add "
                              "--offline to build without the GPU, or build with --cpu")
        return GPU_PRESETS[matching[0].preset]
    gpu = gpu_preset(name)
    if not offline and not any(g.preset == gpu.name for g in present):
        raise DeviceError(f"--gpu {gpu.name}: {describe_present(present)}, not {gpu.name} "
                          f"({gpu.description}, {gpu.arch})",
                          hint=f"add --offline to compile and check kernels for {gpu.name} "
                               "without it (choices are then predicted, not measured), or "
                               "build with --cpu")
    return gpu


def device_of(gpu) -> dict:
    """The plan's device entry of a preset."""
    return {"kind": "cuda", "name": gpu.name, "arch": gpu.arch,
            "description": gpu.description, "fingerprint": gpu.fingerprint}


class OfflinePredictor:
    """A planner `measure` function that predicts instead of timing (module docstring).
    Generated kernels are compiled, resource-checked and emulator-verified first."""

    def __init__(self, gpu, seed: int = 0, pool=None):
        self.gpu = gpu
        self.seed = seed
        self.pool = pool              # a concurrent.futures executor for `prefetch`
        self._builds: dict = {}

    def prefetch(self, workload: Workload, candidate: Candidate) -> None:
        """Start building (compiling) a generated candidate in the pool, so compilation
        overlaps the emulator runs of the candidates before it."""
        from wpk.kernels.cuda.generated import build_for

        key = (workload.key, candidate.label)
        if self.pool is not None and key not in self._builds:
            self._builds[key] = self.pool.submit(build_for, workload, candidate.config)

    def _build(self, workload: Workload, candidate: Candidate):
        from wpk.kernels.cuda.generated import build_for

        future = self._builds.pop((workload.key, candidate.label), None)
        return future.result() if future is not None else build_for(workload, candidate.config)

    def __call__(self, workload: Workload, candidate: Candidate, rng=None, **_timing
                 ) -> Measurement:
        impl = candidate.implementation
        base = dict(label=candidate.label, impl=impl.name, config=dict(candidate.config),
                    kind=impl.kind, workload_key=workload.key)
        if impl.name == "dsl.cuda":
            return self._generated(workload, candidate, rng, base, _timing.get("tolerance"))
        from wpk.kernels.cuda import analytic
        from wpk.kernels.cuda.predicted import DEVICE_COPY, HOST_STEP

        if impl is HOST_STEP:
            prediction = analytic.predict_host(workload)
        elif impl is DEVICE_COPY:
            prediction = analytic.predict_copy(workload, self.gpu)
        else:
            prediction = analytic.predict_vendor(workload, self.gpu, impl.library)
        return Measurement(status=Status.OK, median_s=prediction.seconds,
                           spread_s=(prediction.seconds, prediction.seconds),
                           message="predicted by the analytical model",
                           extra={"predicted": True, "model": prediction.to_json()}, **base)

    def _generated(self, workload, candidate, rng, base, tolerance=None) -> Measurement:
        from wpk.kernels.cuda.analytic import predict_generated
        from wpk.kernels.cuda.offline import check_usage, cubin_arch, spill_note

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
                 "compiler": built.binary.compiler,
                 "usage": {name: {"registers": u.registers, "shared_bytes": u.shared_bytes,
                                  "spill_stores": u.spill_stores, "spill_loads": u.spill_loads}
                           for name, u in usage.items()}}
        extra["cubin_arch"] = cubin_arch(built.binary.cubin)
        reason = check_usage(usage, built.launches, self.gpu)
        if reason is not None:
            reason = f"ptxas usage: {reason}"
        if extra["cubin_arch"] != self.gpu.arch:
            reason = f"the cubin is for {extra['cubin_arch']}, not {self.gpu.arch}"
        if reason is not None:
            return Measurement(status=Status.RUNTIME_ERROR, message=reason, extra=extra,
                               **base)
        verification = verify_generated(workload, built, rng, self.seed, tolerance)
        extra["verified"] = verification.describe()
        extra["emulated_blocks"] = verification.blocks
        if not verification.ok:
            return Measurement(status=Status.WRONG_ANSWER, message=verification.message,
                               rel_l2_error=verification.rel_l2_error, extra=extra, **base)
        from wpk.kernels.cuda.traffic import kernel_work

        # the on-chip work (flops, load/store wavefronts) tells a tiled kernel from a naive one
        work = {kernel.name: kernel_work(kernel) for kernel in built.func.kernels}
        prediction = predict_generated(workload, self.gpu, built.launches, usage, work)
        extra["model"] = prediction.to_json()
        note = spill_note(usage)
        return Measurement(status=Status.OK, median_s=prediction.seconds,
                           spread_s=(prediction.seconds, prediction.seconds),
                           rel_l2_error=verification.rel_l2_error,
                           message="; ".join(filter(None, ["predicted; " + extra["verified"],
                                                           note])),
                           extra=extra, **base)


def verify_generated(workload: Workload, built, rng=None, seed: int = 0,
                     tolerance: float | None = None):
    """Emulator verification of a built generated kernel on fresh random inputs (relative
    L2 `tolerance`, default the workload's)."""
    from wpk.kernels.cuda.generated import _mapping
    from wpk.kernels.cuda.offline import verify_emulated
    from wpk.kernels.random_inputs import random_inputs
    from wpk.kernels.reference import reference

    rng = rng if rng is not None else np.random.default_rng(seed)
    mapping = _mapping(workload)
    inputs = random_inputs(workload, rng)
    expected = reference(workload, inputs)
    feeds = {name: np.asarray(inputs[index]) for name, index in mapping.feeds.items()}
    return verify_emulated(built.func, feeds, {mapping.output: expected[0]},
                           tolerance=tolerance or tolerance_for(workload), seed=seed)


def offline_provider(gpu, count: int = DEFAULT_CONFIGS):
    """A planner candidate provider for an offline build for `gpu` (cached per workload)."""
    from wpk.kernels.cuda.predicted import offline_candidates

    found: dict[str, list[Candidate]] = {}

    @functools.wraps(offline_candidates)
    def provide(workload: Workload, target: str) -> list[Candidate]:
        if target != "cuda":
            return []
        if workload.key not in found:
            found[workload.key] = offline_candidates(workload, gpu, count)
        return found[workload.key]

    return provide


def plan_offline(items: Sequence, gpu, plan_options, progress: bool = False,
                 count: int = DEFAULT_CONFIGS, seed: int = 0, jobs: int | None = None):
    """The planner's choices for `items` on `gpu`, every candidate predicted. Generated
    kernels compile in `jobs` threads (default: the CPU count) ahead of their checks."""
    from concurrent.futures import ThreadPoolExecutor

    from wpk.plans.planner import plan
    from wpk.plans.progress import progress_bar

    provider = offline_provider(gpu, count)
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool, \
            progress_bar(progress, description=f"predicting for {gpu.name}") as on_progress:
        predictor = OfflinePredictor(gpu, seed, pool)
        workloads = {item.workload.key: item.workload for item in items}
        for workload in workloads.values():
            for candidate in provider(workload, "cuda"):
                if candidate.implementation.name == "dsl.cuda":
                    predictor.prefetch(workload, candidate)
        try:
            return plan(items, "cuda", plan_options, on_progress, providers=[provider],
                        measure=predictor)
        finally:
            for future in predictor._builds.values():
                future.cancel()


def plan_measured(items: Sequence, gpu, plan_options, progress: bool = False,
                  count: int = DEFAULT_CONFIGS, parallel: int | None = None):
    """(choices, parallel summary or None): the planner's choices for `items` measured on
    the GPU present (CUDA events, `wpk.search.measure_cuda`), over the candidates `wpk tune`
    measures; with `parallel` streams, each workload's candidates are timed together and
    the fastest re-measured alone (`wpk.search.parallel_measure`)."""
    from wpk.commands.tune import tune_candidates
    from wpk.plans.planner import plan
    from wpk.plans.progress import progress_bar
    from wpk.search.measure_cuda import measure_candidate

    def provide(workload: Workload, target: str) -> list[Candidate]:
        return tune_candidates(workload, gpu, count) if target == "cuda" else []

    summary = many = None
    if parallel:
        from wpk.search.parallel_measure import ParallelSummary, in_process_many

        summary = ParallelSummary(parallel)
        many = in_process_many(summary, parallel)
    with progress_bar(progress, description=f"measuring on {gpu.name}") as on_progress:
        choices = plan(items, "cuda", plan_options, on_progress, providers=[provide],
                       measure=measure_candidate, measure_many=many)
    return choices, None if summary is None else summary.to_json()


def predicted_statement(gpu_name: str) -> str:
    return (f"choices predicted by the analytical model, not measured: run `wpk tune PLAN` "
            f"on a {gpu_name} to measure")


def mark_predicted(plan, gpu, choices=None) -> None:
    """Record in the plan's manifest and report which choices are predicted; with the
    planner's `choices`, each report candidate also gets the model's terms (roofline,
    efficiency, occupancy, waves), the arch, ptxas usage and the emulator check."""
    details = {}
    for choice in choices or ():
        for m in choice.measurements:
            details[(choice.workload.key, m.label)] = {
                k: m.extra[k] for k in ("model", "arch", "cubin_arch", "usage", "verified")
                if k in m.extra}
    predicted_keys = set()
    for entry in plan.report.get("workloads", []):
        entry["predicted"] = True
        predicted_keys.add(entry["key"])
        for cand in entry["candidates"]:
            cand["predicted"] = True
            cand.update(details.get((entry["key"], cand["label"]), {}))
    for step in plan.manifest["steps"]:
        step["predicted"] = step["workload_key"] in predicted_keys
    summary = {"by": "analytical model", "gpu": gpu.name, "arch": gpu.arch,
               "workloads": len(predicted_keys), "statement": predicted_statement(gpu.name)}
    plan.manifest["predicted"] = summary
    plan.report["predicted"] = summary
    plan.report["device"] = device_of(gpu)

