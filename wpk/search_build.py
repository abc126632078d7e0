"""Planning with tuning records and searched generated kernels (`wpk build --search/--db`).

    choices, summary = plan_with_search(items, options, plan_options)

1. Every measurement goes through a `RecordedMeasurer` on a `RecordStore`
   (`--db FILE`, else a temporary file removed afterwards), in an isolated
   worker: a rebuild with complete records measures nothing new.
2. A first planner pass measures the vendor and library candidates; their
   times (x node count) are the workloads' shares of the model latency.
3. With `--search ga|rl|random|grid`, `tune_model` searches the generated
   kernel of every workload that maps to a DSL operator, largest share first,
   within `--trials` per workload and `--budget` for the build; the top
   candidates of each tuned workload are re-measured before choosing.
4. A second planner pass chooses among vendor, library and the best generated
   candidate of each workload (final re-measurements preferred), so the report
   lists generated and vendor candidates side by side.

The same steps serve a CUDA build (`gpu=`, see `wpk.gpu_search`): candidates
measured on the GPU present in the isolated worker (tuner batches on several
streams with `--parallel-measure`), or, with `--offline`, predicted by the
analytical model after compiling for the preset and checking in the emulator.

`summary` (stored as `report["search"]`) says what was tuned, measured and reused.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from wpk.plans.planner import PlanChoices, PlanOptions, plan, registry_candidates

# Share of the remaining --budget the search may use; the rest covers re-measurement
# of the top candidates and the final planner pass.
SEARCH_SHARE = 0.9
MIN_SEARCH_S = 5.0


def _store_path(db: str | None) -> tuple[Path, bool]:
    """The records file and whether it is a temporary one."""
    if db:
        return Path(db), False
    root = Path(os.environ.get("WPK_CACHE_DIR") or Path(tempfile.gettempdir()) / "wpk-cache")
    root.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="records-", suffix=".jsonl", dir=root)
    os.close(fd)
    return Path(name), True


def cpu_search_setup():
    """The `SearchSetup` of the host CPU: C kernels measured by the CPU worker."""
    from wpk.gpu_search import SearchSetup
    from wpk.search.generated_target import generated_target
    from wpk.search.records import target_fingerprint

    return SearchSetup("cpu", target_fingerprint(), generated_target("cpu"),
                       registry_candidates)


def plan_with_search(items: Sequence, options, plan_options: PlanOptions,
                     started: float | None = None, gpu=None) -> tuple[PlanChoices, dict]:
    """Plan `items` (NodeWorkloads) measuring through records and, with `options.search`
    other than 'none', tuning generated kernels first (see the module docstring).
    `options` is a `BuildOptions`; `started` the build's `time.monotonic()` start; `gpu`
    the preset of a CUDA build (measured on it, or predicted with `options.offline`)."""
    from wpk.plans.progress import progress_bar
    from wpk.search.driver import TuneOptions, final_preferring, generated_provider, tune_model
    from wpk.search.recorded import RecordedMeasurer
    from wpk.search.records import RecordStore
    from wpk.search.workers import CompilePool, MeasureOptions, MeasureWorker

    started = time.monotonic() if started is None else started
    path, temporary = _store_path(options.db)
    store = RecordStore(path)
    summary: dict = {"search": options.search, "db": options.db, "tuned": []}
    parallel = _parallel_summary(options, gpu)
    try:
        with MeasureWorker(MeasureOptions(warmup=1, repeats=3, min_time=0.02)) as worker, \
                CompilePool(options.jobs) as pool:
            setup = _setup(options, gpu, worker, parallel)
            measurer = RecordedMeasurer(store, setup.fingerprint, worker=worker,
                                        seed=options.seed, measure_fn=setup.measure_fn,
                                        batch_fn=setup.batch_fn)
            providers = None if setup.target == "cpu" else [setup.base_provider]  # default
            with progress_bar(options.progress, description="measuring") as on_progress:
                choices = plan(items, setup.target, plan_options, on_progress,
                               providers=providers, measure=final_preferring(measurer))
            if options.search != "none":
                vendor = {c.workload.key: c.measurement.median_s for c in choices}
                budget = None
                if options.budget is not None:
                    left = options.budget - (time.monotonic() - started)
                    budget = max(SEARCH_SHARE * left, MIN_SEARCH_S)
                tune = TuneOptions(options.search, options.trials, budget, options.seed,
                                   finalize_k=setup.finalize_k)
                results = tune_model(items, tune, vendor, measurer=measurer,
                                     compile_pool=pool, progress=options.progress,
                                     target=setup.target, generated=setup.generated)
                summary["tuned"] = [r.to_json() for r in results.values()]
                providers = [setup.base_provider, generated_provider(results, setup.generated)]
                with progress_bar(options.progress, description="planning") as on_progress:
                    choices = plan(items, setup.target, plan_options, on_progress,
                                   providers=providers, measure=final_preferring(measurer))
            summary.update(measured=measurer.measured, reused=measurer.reused,
                           records=len(store), fingerprint=setup.fingerprint.to_json())
            if setup.predicted:
                summary["predicted"] = True
            if parallel is not None:
                summary["parallel_measure"] = parallel.to_json()
    finally:
        if temporary:
            path.unlink(missing_ok=True)
    return choices, summary


def _parallel_summary(options, gpu):
    """A `ParallelSummary` for an online GPU build with --parallel-measure, else None."""
    if gpu is None or options.offline or not getattr(options, "parallel_measure", None):
        return None
    from wpk.search.parallel_measure import ParallelSummary

    return ParallelSummary(options.parallel_measure)


def _setup(options, gpu, worker, parallel):
    if gpu is None:
        return cpu_search_setup()
    from wpk.gpu_search import cuda_search_setup

    return cuda_search_setup(gpu, options.offline, worker,
                             None if parallel is None else parallel.streams, parallel,
                             seed=options.seed)
