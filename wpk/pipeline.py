"""The build pipeline: ONNX model -> optimized graph -> workloads -> choices -> Plan.

    plan = build("model.onnx", target="cpu", output="model.wpk", strict=True)

`BuildOptions` holds every `wpk build` flag of DESIGN.md; `build` validates
them, runs load_model -> optimize -> extract_workloads -> planner -> buffer
plan -> report, and returns the `Plan` (saved atomically when `output` is given).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wpk.core.errors import OptionError
from wpk.plans.planfile import Plan

TARGETS = ("cpu", "cuda")
SEARCHES = ("none", "ga", "rl", "random", "grid")


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

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise OptionError(f"unknown target '{self.target}'",
                              hint=f"use one of: {', '.join(TARGETS)}")
        if self.search not in SEARCHES:
            raise OptionError(f"unknown search '{self.search}'",
                              hint=f"use one of: {', '.join(SEARCHES)}")
        for name in ("trials", "jobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise OptionError(f"--{name} must be a positive integer, not {value!r}")
        if self.budget is not None and not self.budget > 0:
            raise OptionError(f"--budget must be a positive number of seconds, not "
                              f"{self.budget!r}")
        if self.warmup < 0 or self.repeats < 1 or self.min_time < 0:
            raise OptionError("warmup must be >= 0, repeats >= 1 and min_time >= 0")
        if self.gpu is not None and self.target != "cuda":
            raise OptionError(f"--gpu {self.gpu} needs target 'cuda', not '{self.target}'")
        self._check_parallel_measure()
        shapes = {}
        for name, shape in dict(self.input_shapes or {}).items():
            try:
                shapes[str(name)] = tuple(int(d) for d in shape)
            except (TypeError, ValueError):
                raise OptionError(f"input shape of '{name}' must be a sequence of integers, "
                                  f"not {shape!r}", hint="e.g. input_shapes={'x': (1, 3, 224, "
                                  "224)} or --input-shape x=1x3x224x224") from None
        object.__setattr__(self, "input_shapes", shapes)

    def _check_parallel_measure(self) -> None:
        """--parallel-measure N: CUDA streams, so an online GPU build only."""
        from wpk.search.parallel_measure import check_streams

        if check_streams(self.parallel_measure) is None:
            return
        if self.target != "cuda":
            raise OptionError(f"--parallel-measure times candidates on CUDA streams; target "
                              f"'{self.target}' has none",
                              hint="drop --parallel-measure, or build with --gpu NAME on a "
                                   "machine with that GPU")
        if self.offline:
            raise OptionError("--parallel-measure times candidates on the GPU, and an "
                              "--offline build predicts instead of timing",
                              hint="drop --parallel-measure, then run `wpk tune PLAN "
                                   "--parallel-measure N` on the GPU")

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


def _check_target(options: BuildOptions):
    """None for the CPU; for cuda the GPU preset (DeviceError when it is absent and the
    build is not --offline, see `wpk.offline.check_cuda_target`)."""
    if options.target != "cuda":
        return None
    from wpk.offline import check_cuda_target

    return check_cuda_target(options.gpu, options.offline)


def build(model: Any, target: str = "cpu", output: str | os.PathLike | None = None,
          **options: Any) -> Plan:
    """Build a plan for an ONNX model (path, bytes or ModelProto).

    `options` are the fields of `BuildOptions`. The plan is returned and,
    when `output` is given, written there atomically.
    """
    started = time.perf_counter()
    opts = BuildOptions.from_kwargs(target=target, **options)
    gpu = _check_target(opts)
    from wpk.frontend import load_model
    from wpk.passes import optimize
    from wpk.plans.assemble import assemble_plan
    from wpk.plans.planner import PlanOptions, plan
    from wpk.plans.progress import progress_bar
    from wpk.plans.report import make_report
    from wpk.workloads import extract_workloads

    graph = load_model(model, opts.input_shapes)
    optimized, pass_report = optimize(graph, opts.target)
    items = extract_workloads(optimized)
    plan_options = PlanOptions(warmup=opts.warmup, repeats=opts.repeats,
                               min_time=opts.min_time, seed=opts.seed, strict=opts.strict)
    search_summary = None
    parallel_summary = None
    if opts.search != "none" or (opts.db is not None and gpu is None):  # records, search
        from wpk.search_build import plan_with_search

        choices, search_summary = plan_with_search(items, opts, plan_options, gpu=gpu)
        parallel_summary = search_summary.get("parallel_measure")
    elif gpu is not None and opts.offline:  # every choice predicted (wpk.offline)
        from wpk.offline import plan_offline

        choices = plan_offline(items, gpu, plan_options, opts.progress, seed=opts.seed,
                               jobs=opts.jobs)
    elif gpu is not None:  # the GPU is present: measured with CUDA events
        from wpk.offline import plan_measured

        choices, parallel_summary = plan_measured(items, gpu, plan_options, opts.progress,
                                                  parallel=opts.parallel_measure)
    else:
        with progress_bar(opts.progress, description="measuring") as on_progress:
            choices = plan(items, opts.target, plan_options, on_progress)
    device = None
    if gpu is not None:
        from wpk.offline import device_of

        device = device_of(gpu)
    result = assemble_plan(optimized, items, choices, opts.target, device=device)
    result.report = make_report(
        choices, target=opts.target, model=_model_name(model),
        device=result.manifest["device"], pass_report=pass_report,
        build_time_s=time.perf_counter() - started, buffers=result.buffer_plan,
        options=opts.to_json())
    if search_summary is not None:
        result.report["search"] = search_summary
    if parallel_summary is not None:
        result.report["parallel_measure"] = parallel_summary
    if gpu is not None and opts.offline:
        from wpk.offline import mark_predicted

        mark_predicted(result, gpu, choices)
    if output is not None:
        result.save(output)
    return result
