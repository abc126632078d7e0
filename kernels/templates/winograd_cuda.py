"""CUDA schedule of the Winograd convolution operators (`kernels/dsl/winograd.wpk`).

The operator has three stages, each one kernel:

* `V` (input transform) and `Y` (output transform with the fused bias and epilogue):
  the generic GPU schedule, one output element (or `per_thread` consecutive ones) per
  thread, `threads` per block;
* `M` (the batched GEMM over the (m+2)^2 tile positions, `M[e] = U[e] V[e]`): the
  register-tiled GEMM of `gemm_cuda` (`tile_m` x `tile_n` per thread, `threads_m` of
  `gemm_threads` threads along the output channels, the reduction over input channels
  in chunks of `tile_r` staged in shared memory), the tile position joining the block
  index.

`WinogradTemplate` is the schedule template of one operator (one m: the operator's
transform size T = m + 2 is a shape). `WinogradSpace` is what the search explores: the
output tile size `m` is a knob next to the stages' knobs, each point validated and
lowered by the template of its m.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

from wpk.dsl.schedule import Schedule
from wpk.dsl.templates import GenericTemplate, KnobSpace, _generic_gpu
from wpk.kernels.templates import gemm_cuda

OPERATORS = ("winograd_conv2d", "winograd_conv2d_bias")
GEMM_STAGE = "M"
TRANSFORM_STAGES = ("V", "Y")
M_CHOICES = (4, 2)                 # the preferred order: fewer multiplies first
GEMM_KNOBS = ("gemm_threads", "tile_m", "tile_n", "threads_m", "tile_r")
HEAD_PER_M = 24                    # preferred GEMM shapes per m, before the rest


def is_winograd(op) -> bool:
    """Whether a (specialised) operator is one of the Winograd convolution operators."""
    return op.name in OPERATORS


class WinogradTemplate(GenericTemplate):
    """The CUDA schedule of one specialised Winograd operator (see the module docstring)."""

    name = "winograd"
    splits_reductions = False   # its reductions have their own schedule

    @property
    def gemm_stage(self):
        return self.op.stage(GEMM_STAGE)

    def space(self) -> KnobSpace:
        space = super().space()            # threads, per_thread: the transforms
        if self.target != "cuda":
            return space
        gemm = gemm_cuda.gemm_knobs(self.gemm_stage, self.limits.max_threads_per_block)
        space["gemm_threads"] = [t for t in (64, 128, 256)
                                 if t <= self.limits.max_threads_per_block]
        for knob in GEMM_KNOBS[1:]:
            space[knob] = gemm[knob]
        return space

    def check_knobs(self, config: dict) -> str | None:
        if self.target == "cuda" and config["gemm_threads"] % config["threads_m"]:
            return (f"threads_m={config['threads_m']} does not divide "
                    f"gemm_threads={config['gemm_threads']}")
        return None

    def _apply(self, sched: Schedule, config: dict) -> None:
        if self.target != "cuda":
            self.apply_generic(sched, config)
            return
        gemm_cuda.schedule_gemm_cuda(sched, GEMM_STAGE, gemm_config(config))
        for stage in TRANSFORM_STAGES:
            _generic_gpu(sched[stage], {"threads": config["threads"],
                                        "per_thread": config["per_thread"]})

    def preferred_points(self):
        """Tiled GEMM shapes ranked by `gemm_cost`, transforms at 256 (else 128) threads."""
        space = self.space()
        stage = self.gemm_stage
        e, k, p = (int(a.extent.value) for a in stage.axes)
        c = int(stage.reduce.axes[0].extent.value)
        sms = max(1, self.limits.cores)
        points = list(space.points())
        points.sort(key=lambda q: (q["tile_r"] == 0, q["per_thread"] != 1,
                                   q["threads"] not in (256, 128), q["threads"] != 256,
                                   gemm_cuda.gemm_cost(gemm_config(q), e * k, p, c, sms)))
        return points


def gemm_config(config: Mapping) -> dict:
    """The `gemm_cuda` knobs of the GEMM stage (no split-K: the tile positions already
    give the grid (m+2)^2 times the blocks of one GEMM)."""
    return {"threads": config["gemm_threads"], "tile_m": config["tile_m"],
            "tile_n": config["tile_n"], "threads_m": config["threads_m"],
            "tile_r": config["tile_r"], "split_k": 1, "per_thread": 1}


class WinogradSpace:
    """The search space of one workload's Winograd kernel: `m` and the stages' knobs.

    `templates` maps m to the `WinogradTemplate` of the workload's operator for that m
    (a callable, so an m is specialised only when asked for). It has the interface of a
    schedule template the tuners use: `space`, `validate`, `preferred_points`,
    `default_config`."""

    name = "winograd"

    def __init__(self, templates: Callable[[int], WinogradTemplate],
                 m_choices: tuple[int, ...] = M_CHOICES):
        self._templates = templates
        self.m_choices = m_choices

    def template(self, m: int) -> WinogradTemplate:
        """The schedule template of the operator for output tiles of m x m."""
        return self._templates(m)

    def space(self) -> KnobSpace:
        """`m`, then the union of the per-m templates' choices of every knob."""
        space = KnobSpace(m=list(self.m_choices))
        for m in self.m_choices:
            for knob, choices in self.template(m).space().items():
                merged = space.setdefault(knob, [])
                merged.extend(c for c in choices if c not in merged)
        return space

    def validate(self, config: Mapping) -> str | None:
        """None when `config` schedules the operator of its m, else why not."""
        m = config.get("m")
        if m not in self.m_choices:
            return f"knob m={m!r} is not one of {list(self.m_choices)}"
        knobs = {k: v for k, v in config.items() if k != "m"}
        return self.template(m).validate(knobs)

    def preferred_points(self):
        """Each m's preferred points, interleaved (the best of every m first)."""
        heads = [itertools.islice(self.template(m).preferred_points(), HEAD_PER_M)
                 for m in self.m_choices]
        for row in itertools.zip_longest(*heads):
            for m, point in zip(self.m_choices, row):
                if point is not None:
                    yield {"m": m, **point}

    def default_config(self) -> dict:
        """The first valid preferred point."""
        for point in self.preferred_points():
            if self.validate(point) is None:
                return point
        m = self.m_choices[0]
        return {"m": m, **self.template(m).default_config()}

    def preferred_configs(self, count: int, scan: int = 48) -> list[dict]:
        """Up to `count` valid points: the best of each m first, then the next ones."""
        found: list[dict] = []
        for point in itertools.islice(self.preferred_points(), scan):
            if len(found) >= count:
                break
            if self.validate(point) is None:
                found.append(point)
        return found
