"""Split reductions (TVM's `rfactor`): one reduction axis cut into independent parts.

    op2 = rfactor(op, "Y", "c", parts=4)

turns the stage `Y[n, k, y, x] = f(sum(c in C, r, s) {body})` into two stages

    Y_rf[c_part, n, k, y, x] = sum(c in C/parts, r, s) {body[c := c_part * C/parts + c]}
    Y[n, k, y, x]            = f(sum(c_part in parts) { Y_rf[c_part, n, k, y, x] })

so a GPU schedule can spread the parts of the reduction over blocks (split-K:
the batch-1 late layers of a CNN have too few output tiles to fill the GPU)
and sum them in a second, deterministic kernel (no atomics: the parts are
added in a fixed order, so every run gives the same bits). `Y_rf` is a local
stage; lowering gives it a workspace. The epilogue `f` (bias, activation,
residual add) stays in `Y`, computed once per output element.
"""

from __future__ import annotations

from dataclasses import replace

from wpk.core.errors import ScheduleError
from wpk.dsl import compute as C
from wpk.dsl.schedule import StageSchedule


def rf_stage_name(stage: str) -> str:
    """Name of the partial-sum stage `rfactor` adds for `stage`."""
    return f"{stage}_rf"


def part_axis_name(axis: str) -> str:
    """Name of the axis numbering the parts of reduction axis `axis`."""
    return f"{axis}_part"


def rfactor(op: C.Operator, stage_name: str, axis: str, parts: int) -> C.Operator:
    """`op` with reduction axis `axis` of stage `stage_name` split into `parts` partial
    reductions computed by a new stage (see the module docstring). The extent of `axis`
    must be a constant multiple of `parts` (specialise the operator first)."""
    stage = op.stage(stage_name)
    red = stage.reduce if stage is not None else None
    if red is None:
        raise ScheduleError(f"rfactor: {op.name} has no reduction stage {stage_name!r}")
    target = next((a for a in red.axes if a.name == axis), None)
    if target is None or not isinstance(target.extent, C.Const):
        raise ScheduleError(f"rfactor: {axis!r} is not a constant reduction axis of "
                            f"{stage_name}", hint="specialise the operator first")
    extent = int(target.extent.value)
    if parts < 1 or extent % parts:
        raise ScheduleError(f"rfactor: {parts} parts do not divide {axis} ({extent})")
    chunk = extent // parts
    part = C.IterVar(part_axis_name(axis), C.Const(parts), "spatial")
    inner = C.IterVar(axis, C.Const(chunk), "reduce")
    index = C.BinOp("+", C.BinOp("*", part, C.Const(chunk), C.INDEX), inner, C.INDEX)
    body = C.substitute(red.body, {axis: index})
    axes = tuple(inner if a.name == axis else a for a in red.axes)
    rf_name = rf_stage_name(stage_name)
    rf = C.Stage(rf_name, (part, *stage.axes), C.Reduce(red.op, body, axes, red.dtype),
                 red.dtype)
    summed = C.IterVar(part_axis_name(axis), C.Const(parts), "reduce")
    partial = C.Load(rf_name, (summed, *stage.axes), red.dtype)
    total = C.Reduce(red.op, partial, (summed,), red.dtype, red.init)
    final = replace(stage, body=C.replace_reduce(stage.body, total))
    position = op.stages.index(stage)
    stages = (*op.stages[:position], rf, final, *op.stages[position + 1:])
    return replace(op, stages=stages)


def schedule_part_sum(s: StageSchedule, threads: int) -> None:
    """CUDA schedule of the stage adding the parts: one output element per thread (blocks
    of `threads`), the parts added serially in order."""
    spatial = [a.name for a in s.roots if a.kind == "spatial"]
    fused = spatial[0]
    for nxt in spatial[1:]:
        fused = s.fuse(fused, nxt)
    block, thread = s.split(fused, min(threads, s.axes[fused].extent))
    s.bind(block, "blockIdx.x")
    s.bind(thread, "threadIdx.x")
