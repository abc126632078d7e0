"""The CUDA template of matrix products: the generic schedule, or the tiled GEMM.

A matmul-like stage (`wpk.kernels.templates.gemm_cuda.is_matmul_like`) on CUDA
gets the generic knobs plus the tiled GEMM's (`tile_m`, `tile_n`, `threads_m`,
`tile_r`, `split_k`); a tiled config schedules the GEMM stage (and, with
`split_k` > 1, its rfactor stage, `wpk.dsl.rfactor`), the generic schedule
everything else. The CPU needs no template of its own: the generic one already
has a (rows x vector) register tile for reductions.
"""

from __future__ import annotations

from wpk.dsl.rfactor import rf_stage_name, rfactor
from wpk.dsl.schedule import Schedule
from wpk.dsl.templates import GenericTemplate, KnobSpace
from wpk.kernels.templates import gemm_cuda


class MatmulTemplate(GenericTemplate):
    """A matmul-like operator on CUDA (see the module docstring)."""

    name = "matmul"
    splits_reductions = False   # its reductions have their own schedule

    def space(self) -> KnobSpace:
        space = super().space()
        space.update(gemm_cuda.gemm_knobs(self.main_stage, self.limits.max_threads_per_block))
        return space

    def knob_defaults(self) -> dict:
        return dict(gemm_cuda.GEMM_DEFAULTS)

    def check_knobs(self, config: dict) -> str | None:
        return gemm_cuda.check_gemm_knobs(config)

    def transformed(self, config: dict):
        """With `split_k` > 1, the operator summing partial products (`wpk.dsl.rfactor`)."""
        if config.get("split_k", 1) == 1:
            return self.op
        stage = self.main_stage
        return rfactor(self.op, stage.name, stage.reduce.axes[0].name, config["split_k"])

    def preferred_points(self):
        return gemm_cuda.preferred_points(self)

    def _apply(self, sched: Schedule, config: dict) -> None:
        if not gemm_cuda.is_tiled(config):
            self.apply_generic(sched, config)
            return
        gemm_cuda.schedule_gemm_cuda(sched, self.main_stage.name, config)
        name = self.main_stage.name
        self.apply_generic(sched, config, done={name, rf_stage_name(name)})
