"""The build pipeline: ONNX model -> optimized graph -> workloads -> choices -> Plan.

    plan = build("model.onnx", target="cpu", output="model.wpk", strict=True)

One path for every target. `BuildOptions` holds every `wpk build` flag of
DESIGN.md; `build` validates them, makes the `Target` (a GPU preset must be
present unless `--offline`) and its `Runner`, and runs load_model -> optimize
-> extract_workloads -> `choose_implementations` -> plan assembly (buffer plan)
-> report, returning the `Plan` (saved atomically when `output` is given). A model
whose last nodes have shapes that depend on input values (NonMaxSuppression, NonZero,
...) is split there (`wpk.value_tail`): the static head goes this way, the tail is
attached to its plan as one onnxruntime model run after it.

`choose_implementations` measures what the target offers for every workload
(the planner); with `--search` it then tunes the generated kernel of every
tunable workload (`wpk.search.driver`), largest share of the latency first,
within `--trials` per workload and `--budget` for the build, and plans again
with each workload's best generated kernel among the candidates, next to
everything an untuned build offers (so tuning only adds candidates), all
measured side by side in that last pass (`RecordedRunner.side_by_side`; a
prediction needs no second look). With
`--search`, `--db` or `--cluster` every measurement goes through the tuning
records (in a worker process, so a crash or a hang costs one candidate): a
rebuild with complete records measures nothing new. With `--cluster` the
measurements are made on the nodes of a Ray cluster (`wpk.search.ray_runner`)
and committed to the records here as they arrive. An `--offline` target's
runner predicts instead of measuring.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import onnx

from wpk.core.errors import OptionError
from wpk.core.limits import parse_memory
from wpk.core.machine_load import cpu_use, load_summary
from wpk.core.safe_write import check_output
from wpk.in_run import tuned_and_untuned_mix
from wpk.kernels.target import Target, create_target, target_class
from wpk.native_bundle import bundle_native_libraries
from wpk.partition import choose_partition
from wpk.passes import optimize
from wpk.passes.quantize_dequantize import quantizes
from wpk.plans.assemble import assemble_plan, whole_model_plan
from wpk.plans.planfile import Plan
from wpk.plans.planner import (
    PlanChoices,
    PlanOptions,
    in_place_choices,
    on_generated_kernels,
    plan,
    untuned_choices,
    within_regions,
)
from wpk.plans.predicted import mark_predicted
from wpk.plans.progress import progress_bar
from wpk.plans.report import make_report
from wpk.search import input_sets
from wpk.search.cluster import parse_address
from wpk.search.compile_pool import CompilePool
from wpk.search.driver import TuneOptions, family_candidates, tune_families
from wpk.search.parallel_measure import ParallelSummary, check_streams
from wpk.search.recorded import RecordedRunner
from wpk.search.records import RecordStore
from wpk.search.runner import Runner, check_runner, create_runner
from wpk.search.workers import MeasureOptions
from wpk.value_tail import attach_tail, load_head
from wpk.workloads import extract_workloads

SEARCHES = ("none", "ga", "rl", "random", "grid")
# Measurements of a search (and of the records), in the worker; the planner's own
# measurements use the build's warmup/repeats/min_time.
SEARCH_MEASURE = MeasureOptions(warmup=1, repeats=3, min_time=0.02)
# Share of the remaining --budget the search may use; the rest covers re-measurement
# of the top candidates and the final planner pass.
SEARCH_SHARE = 0.9
MIN_SEARCH_S = 5.0


@dataclass(frozen=True)
class BuildOptions:
    """Every option of `wpk build` (see DESIGN.md, Contracts)."""

    target: str = "cpu"
    gpu: str | None = None
    search: str = "none"
    trials: int | None = None
    budget: float | None = None
    db: str | None = None
    jobs: int | None = None
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    strict: bool = False
    offline: bool = False
    warmup: int = 2
    repeats: int = 5
    min_time: float = 0.05
    seed: int = 0
    progress: bool = True
    parallel_measure: int | None = None
    # Measure on the nodes of a Ray cluster (`wpk.search.cluster.parse_address`).
    cluster: str | None = None
    # Measure the plan end to end against onnxruntime running the whole model and keep
    # the faster (`wpk.partition`), where the target has that peer.
    partition: bool = True
    # Bytes (or "4G", "512M") the model's tensors may take (`wpk.core.limits`); None:
    # half the machine's RAM.
    max_memory: int | str | None = None
    # A CPU plan carries its kernels' shared libraries, so it loads where no compiler is
    # (`wpk.native_bundle`); False for a plan that never leaves this machine (the ONNX
    # backend's in-memory plans), which saves the build a process that loads the plan.
    native_libraries: bool = True

    def __post_init__(self) -> None:
        target_class(self.target)  # OptionError naming the known targets
        if self.max_memory is not None:
            object.__setattr__(self, "max_memory", parse_memory(self.max_memory))
        if self.search not in SEARCHES:
            raise OptionError(f"unknown search '{self.search}'",
                              hint=f"use one of: {', '.join(SEARCHES)}")
        for name in ("trials", "jobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise OptionError(f"--{name} must be a positive integer, not {value!r}")
        if self.budget is not None and (not isinstance(self.budget, (int, float))
                                        or isinstance(self.budget, bool)
                                        or not self.budget > 0):
            raise OptionError(f"--budget must be a positive number of seconds, not "
                              f"{self.budget!r}")
        numbers = (self.warmup, self.repeats, self.min_time)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers) \
                or self.warmup < 0 or self.repeats < 1 or self.min_time < 0:
            raise OptionError("warmup must be >= 0, repeats >= 1 and min_time >= 0")
        if self.gpu is not None and self.target != "cuda":
            raise OptionError(f"--gpu {self.gpu} needs target 'cuda', not '{self.target}'")
        check_streams(self.parallel_measure)
        if self.cluster is not None:
            parse_address(self.cluster)  # OptionError naming the forms; Ray is not imported
        if not isinstance(self.input_shapes or {}, Mapping):
            raise OptionError(f"input_shapes must be a dict of name -> shape, not "
                              f"{type(self.input_shapes).__name__}",
                              hint="e.g. input_shapes={'x': (1, 3, 224, 224)}")
        shapes = {}
        for name, shape in dict(self.input_shapes or {}).items():
            try:
                shapes[str(name)] = tuple(int(d) for d in shape)
            except (TypeError, ValueError):
                raise OptionError(f"input shape of '{name}' must be a sequence of integers, "
                                  f"not {shape!r}", hint="e.g. input_shapes={'x': (1, 3, 224, "
                                  "224)} or --input-shape x=1x3x224x224") from None
        object.__setattr__(self, "input_shapes", shapes)


    @classmethod
    def from_kwargs(cls, **options: Any) -> BuildOptions:
        """Options from keyword arguments, with an OptionError naming any unknown one."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise OptionError(f"unknown build option(s): {', '.join(unknown)}",
                              hint=f"known options: {', '.join(sorted(known))}")
        return cls(**options)

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["input_shapes"] = {k: list(v) for k, v in self.input_shapes.items()}
        return data


def _model_name(model: Any) -> str:
    if isinstance(model, (str, os.PathLike)):
        return os.path.basename(os.fspath(model))
    graph = getattr(model, "graph", None)
    return getattr(graph, "name", "") or "<model>"


def model_bytes(model: Any) -> bytes:
    """The serialized model (path, bytes or ModelProto; external data loaded)."""
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model))
    return model.SerializeToString()


def whole_model_runs(graph) -> bool:
    """Whether onnxruntime's whole model can stand in for the plan: it has inputs to feed,
    and no output is a constant (a plan keeps those among its weights)."""
    return bool([n for n in graph.inputs if n not in graph.constants]) and \
        not any(name in graph.constants for name in graph.outputs)


def build(model: Any, target: str = "cpu", output: str | os.PathLike | None = None,
          **options: Any) -> Plan:
    """Build a plan for an ONNX model (path, bytes or ModelProto).

    `options` are the fields of `BuildOptions`. The plan is returned and,
    when `output` is given, written there atomically.
    """
    started, machine_before = time.perf_counter(), cpu_use()
    opts = BuildOptions.from_kwargs(target=target, **options)
    build_target = create_target(opts.target, gpu=opts.gpu, offline=opts.offline)
    check_runner(build_target, opts.parallel_measure, opts.cluster)  # before reading the model
    if output is not None:  # before the work: a build must not end in an unwritable path
        check_output(output, "output", inputs=[model] if isinstance(model, (str, os.PathLike))
                     else [])
    graph, head, tail = load_head(model, opts.input_shapes, opts.max_memory, opts.strict)
    optimized, pass_report = optimize(graph, opts.target)
    items = extract_workloads(optimized)
    choices, search, parallel = plan_workloads(items, build_target, opts, started)
    if opts.target == "cpu":
        choices = in_place_choices(choices)
    input_sets.clear()   # the measurements' shared inputs are not needed past this point

    def assembled(chosen: PlanChoices) -> Plan:
        result = assemble_plan(optimized, items, chosen, opts.target,
                               device=build_target.device())
        result.report = make_report(
            chosen, target=opts.target, model=_model_name(model),
            device=result.manifest["device"], pass_report=pass_report,
            build_time_s=time.perf_counter() - started, buffers=result.buffer_plan,
            options=opts.to_json())
        if search is not None:
            result.report["search"] = search
        if parallel is not None:
            result.report["parallel_measure"] = parallel
        if build_target.predicted:
            mark_predicted(result, build_target.hardware, chosen)
        return result

    result = assembled(choices)
    if opts.partition and build_target.onnxruntime_peer and whole_model_runs(graph):
        whole = whole_model_plan(graph, model_bytes(head), result.manifest["device"])
        kept, pooled = within_regions(choices), on_generated_kernels(choices)
        regions = assembled(kept) if kept is not None else None
        one_pool = assembled(pooled) if pooled is not None else None
        untuned, mixed, taken = _untuned_contenders(choices, pooled or choices,
                                                    one_pool or result, assembled)
        chosen, summary = choose_partition(result, whole, regions=regions, one_pool=one_pool,
                                           untuned=untuned, mixed=mixed,
                                           quantized=quantizes(graph))
        report = next((p.report for p in (regions, one_pool, untuned, mixed) if chosen is p),
                      result.report)  # per operator
        if mixed is not None:
            summary["from_untuned"] = taken
        chosen.report = {**report, "partition": summary}
        result = chosen
    if opts.target == "cpu" and opts.native_libraries:
        result = bundle_native_libraries(result)
    if tail is not None:
        attach_tail(result, tail, graph)
    # others' share of the cores while this machine measured (a cluster's nodes measure)
    load = None if opts.cluster is not None else load_summary(machine_before, cpu_use())
    if load is not None:
        result.report = {**result.report, "machine_load": load}
    if output is not None:
        result.save(output)
    return result


def _untuned_contenders(choices: PlanChoices, tuned: PlanChoices, tuned_plan: Plan,
                        assembled: Callable[[PlanChoices], Plan]
                        ) -> tuple[Plan | None, Plan | None, int]:
    """A tuned build's extra plans for the end-to-end check (None, None, 0 for an untuned
    build): the plan of its untuned candidates (on generated kernels where close), the
    tuned plan (`tuned`, run as `tuned_plan`) with the untuned candidates of the workloads
    whose steps ran faster inside runs (`wpk.in_run`; None when that is one of the two),
    and how many workloads that mix took from the untuned plan."""
    if choices.untuned is None:
        return None, None, 0
    untuned = on_generated_kernels(choices.untuned) or choices.untuned
    untuned_plan = assembled(untuned)
    mix = tuned_and_untuned_mix(tuned, tuned_plan, untuned, untuned_plan)
    if mix is None:
        return untuned_plan, None, 0
    taken = sum((choice.reason or {}).get("rule") == "in-run" for choice in mix)
    return untuned_plan, assembled(mix), taken


def plan_workloads(items: Sequence, target: Target, opts: BuildOptions,
                   started: float | None = None, records: bool | None = None):
    """(choices, search summary or None, parallel summary or None) of `items`
    (NodeWorkloads) on `target`, as `opts` says. `records` (default: with --search, --db
    or --cluster) measures through the tuning records."""
    started = time.perf_counter() if started is None else started
    summary = ParallelSummary(opts.parallel_measure) if opts.parallel_measure else None
    if records is None:
        records = opts.search != "none" or opts.db is not None or opts.cluster is not None
    runner = create_runner(target, isolated=records and not target.predicted,
                           parallel=opts.parallel_measure, seed=opts.seed, jobs=opts.jobs,
                           summary=summary, options=SEARCH_MEASURE if records else None,
                           cluster=opts.cluster)
    with runner:
        if records:
            runner = RecordedRunner(runner, RecordStore(opts.db), target.fingerprint())
        choices, search = choose_implementations(items, target, runner, opts, started)
    return choices, search, None if summary is None else summary.to_json()


def choose_implementations(items: Sequence, target: Target, runner: Runner,
                           opts: BuildOptions, started: float) -> tuple[PlanChoices, dict | None]:
    """The planner's choices for `items` and, with records, the search summary (stored as
    `report["search"]`: what was tuned, measured and reused); see the module docstring."""
    plan_options = PlanOptions(warmup=opts.warmup, repeats=opts.repeats,
                               min_time=opts.min_time, strict=opts.strict)
    searching = opts.search != "none"
    offered = 0 if searching else None  # a search finds the generated kernels itself
    description = f"predicting for {target.hardware.name}" if target.predicted else "measuring"
    with progress_bar(opts.progress, description=description) as on_progress:
        choices = plan(items, lambda w: target.candidates(w, offered), runner, plan_options,
                       on_progress)
    if not isinstance(runner, RecordedRunner):
        return choices, None
    summary: dict = {"search": opts.search, "db": opts.db, "tuned": []}
    if searching:
        results = _tune(items, target, runner, opts, choices, started)
        summary["tuned"] = [r.to_json() for found in results.values()
                            for r in found.values()]
        extra = family_candidates(results, target.families)
        last_pass = nullcontext() if target.predicted else runner.side_by_side()
        offered: dict[str, set[str]] = {}   # what an untuned build offers, by workload

        def final_candidates(workload):
            found = target.candidates(workload)
            offered[workload.key] = {c.label for c in found}
            return [*found, *extra(workload)]

        with progress_bar(opts.progress, description="planning") as on_progress, last_pass:
            choices = plan(items, final_candidates, runner, plan_options, on_progress)
        choices.untuned = untuned_choices(choices, offered)
    summary.update(measured=runner.measured, reused=runner.reused,
                   records=len(runner.database), fingerprint=runner.fingerprint.to_json(),
                   contended=list(runner.contended))
    if runner.summary() is not None:
        summary["cluster"] = runner.summary()
    if target.predicted:
        summary["predicted"] = True
    return choices, summary


def _tune(items: Sequence, target: Target, runner: RecordedRunner, opts: BuildOptions,
          choices: PlanChoices, started: float) -> dict:
    """Tune every tunable workload in each of the target's generated families
    (`wpk.search.driver.tune_families`) within the rest of the budget:
    `{impl: {workload key: TuneResult}}`."""
    vendor = {c.workload.key: c.measurement.median_s for c in choices}
    budget = None
    if opts.budget is not None:
        left = opts.budget - (time.perf_counter() - started)
        budget = max(SEARCH_SHARE * left, MIN_SEARCH_S)
    tune = TuneOptions(opts.search, opts.trials, budget, opts.seed,
                       finalize_k=0 if target.predicted else 3)  # a prediction never changes
    pool = nullcontext() if runner.compiles else CompilePool(opts.jobs)  # a cluster compiles
    with pool as compile_pool:
        return tune_families(items, tune, vendor, runner=runner, families=target.families,
                             compile_pool=compile_pool, progress=opts.progress)
