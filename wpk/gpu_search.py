"""What `wpk build --gpu NAME --search ...` plugs into the search build (`wpk.search_build`).

    setup = cuda_search_setup(gpu, offline=False, worker=worker, parallel=4, summary=s)
    setup = cuda_search_setup(gpu, offline=True)     # the analytical model as objective

On the GPU present (online) a candidate is measured by
`wpk.search.measure_cuda.measure_isolated_cuda` in the isolated worker: fresh
random inputs, NaN-poisoned outputs, the float64 reference and, for generated
kernels, the vendor library's answer; CUDA events and an L2 flush per run.
With `--parallel-measure N` each tuner batch is timed on N streams at once
(`wpk.search.parallel_measure.isolated_batch`).

With `--offline` the objective is the offline build's `OfflinePredictor`: each
candidate compiled for the preset's arch, its ptxas usage checked, its loop IR
verified in the GPU emulator, its time predicted by the analytical model;
predictions are recorded under a fingerprint of their own ('predicted:...'),
so they never stand in for measurements on a GPU, and nothing is re-measured
(a prediction does not change).

Records of a preset carry its name in the device fingerprint (h100 and h200
share sm_90 but not their timings).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.registry import Candidate
from wpk.search.generated_target import GeneratedTarget, generated_target

PREDICTED_PREFIX = "predicted:"


@dataclass
class SearchSetup:
    """A target for `plan_with_search`: fingerprint, the generated implementation tuned, the
    first planner pass's candidates, how a candidate is measured and re-measured."""

    target: str
    fingerprint: object                  # wpk.search.records.TargetFingerprint
    generated: GeneratedTarget
    base_provider: Callable[[Workload, str], list[Candidate]]
    measure_fn: Callable | None = None   # RecordedMeasurer.measure_fn (None: CPU worker)
    batch_fn: Callable | None = None     # RecordedMeasurer.batch_fn (--parallel-measure)
    finalize_k: int = 3
    predicted: bool = False


def cuda_fingerprint(gpu, offline: bool):
    """The records fingerprint of preset `gpu`: measured, or predicted (`offline`)."""
    from wpk.search.records import target_fingerprint

    found = target_fingerprint(gpu)
    device = f"{found.device}:{gpu.name}"
    return replace(found, device=(PREDICTED_PREFIX + device) if offline else device)


def base_provider(gpu, offline: bool):
    """The first planner pass's candidates on `gpu`: everything but generated kernels
    (cuDNN/cuBLAS, or their predicted placeholders offline, device copies), and the host
    step where nothing else runs the workload."""
    from wpk.kernels.cuda.generated import DSL_CUDA
    from wpk.kernels.cuda.predicted import HOST_STEP, host_config, offline_candidates

    found: dict[str, list[Candidate]] = {}

    def provide(workload: Workload, target: str) -> list[Candidate]:
        if target != "cuda":
            return []
        if workload.key not in found:
            if offline:
                listed = offline_candidates(workload, gpu, 0)
            else:
                from wpk.commands.tune import tune_candidates

                listed = tune_candidates(workload, gpu, 0)
            listed = [c for c in listed if c.implementation is not DSL_CUDA]
            config = host_config(workload) if not listed else None
            found[workload.key] = listed or ([Candidate(HOST_STEP, config)] if config else [])
        return found[workload.key]

    return provide


def predicted_measure(predictor, workload: Workload, spec, options=None,
                      seed: int = 0):
    """A `RecordedMeasurer.measure_fn` that predicts with an `OfflinePredictor`."""
    import importlib

    from wpk.kernels import registry

    for module in spec.modules:
        importlib.import_module(module)
    candidate = Candidate(registry.get(spec.impl), dict(spec.config))
    tolerance = None if options is None else options.tolerance
    return predictor(workload, candidate, rng=np.random.default_rng(seed), tolerance=tolerance)


def cuda_search_setup(gpu, offline: bool, worker=None, parallel: int | None = None,
                      summary=None, seed: int = 0) -> SearchSetup:
    """The `SearchSetup` of preset `gpu`: predicted (`offline`) or measured on the GPU in
    `worker` (a `MeasureWorker`), tuner batches on `parallel` streams when given (their
    totals added to `summary`, a `ParallelSummary`)."""
    generated = generated_target("cuda", gpu)
    provider = base_provider(gpu, offline)
    fingerprint = cuda_fingerprint(gpu, offline)
    if offline:
        from wpk.offline import OfflinePredictor

        measure = functools.partial(predicted_measure, OfflinePredictor(gpu, seed))
        return SearchSetup("cuda", fingerprint, generated, provider, measure, None,
                           finalize_k=0, predicted=True)
    from wpk.search.measure_cuda import measure_isolated_cuda

    batch = None
    if parallel:
        from wpk.search.parallel_measure import isolated_batch

        batch = isolated_batch(worker, summary, parallel)
    return SearchSetup("cuda", fingerprint, generated, provider,
                       functools.partial(measure_isolated_cuda, worker), batch)
