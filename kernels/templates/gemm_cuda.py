"""CUDA schedule of matrix products: a register-tiled GEMM, optionally split-K.

A stage is *matmul-like* when it reduces over one axis a product of two tensors and has
at least two spatial axes (`Y[.., m, n] = f(sum(k) A[.., m, k] * B[.., k, n])`, any
operand layout, as `matmul`, `batched_matmul`, `gemm_XY` and `dense`). Its tiled
schedule: a block computes a BM x BN tile of (m, n), BM = `tile_m` * `threads_m`, BN =
`tile_n` * (`threads` / `threads_m`); each thread owns a `tile_m` x `tile_n` register
tile, strided by the thread counts so a warp reads and writes consecutive columns; with
`tile_r` > 0 the reduction runs in chunks of `tile_r` whose A and B tiles are staged in
shared memory between barriers, and the inner product reads its operands from there
once per tile row/column. Leading (batch) axes join the block index.

`split_k` > 1 rewrites the operator with `wpk.dsl.rfactor`: the parts of the reduction
become extra blocks writing partial sums to a workspace, and a second kernel adds them
in a fixed order and applies the epilogue: what a GEMV (batch-1 fully connected layer:
m = 1) needs to fill a GPU.

The default knobs (`tile_m` = `tile_n` = `threads_m` = 1, `tile_r` = 0, `split_k` = 1)
select the generic one-output-per-thread schedule, so older configs keep their meaning.
"""

from __future__ import annotations

import math

from wpk.dsl import compute as C
from wpk.dsl.rfactor import rf_stage_name, schedule_part_sum
from wpk.dsl.schedule import Schedule, StageSchedule

GEMM_DEFAULTS = {"tile_m": 1, "tile_n": 1, "threads_m": 1, "tile_r": 0, "split_k": 1}
MIN_PART = 32               # reduction elements per split-K part, at least
SUM_THREADS = 256           # threads per block of the kernel adding split-K parts
SATURATING_THREADS_PER_SM = 512    # a quarter of an SM's threads, with a register tile's ILP


def operands(stage) -> list[str]:
    """The distinct tensors read inside a stage's reduction (in first-read order)."""
    names: list[str] = []
    for ld in C.loads(stage.reduce.body):
        if ld.tensor not in names:
            names.append(ld.tensor)
    return names


def is_matmul_like(stage) -> bool:
    """Whether `stage` is a product of two tensors reduced over one axis, >= 2 spatial axes."""
    red = stage.reduce
    if red is None or red.op != "sum" or len(red.axes) != 1 or len(stage.axes) < 2:
        return False
    body = red.body
    return (isinstance(body, C.BinOp) and body.op == "*" and len(operands(stage)) == 2
            and all(isinstance(side, C.Load) for side in (body.a, body.b)))


def gemm_knobs(stage, max_threads: int) -> dict:
    """The tiled-GEMM knobs of a matmul-like specialised stage."""
    m, n = (int(a.extent.value) for a in stage.axes[-2:])
    k = int(stage.reduce.axes[0].extent.value)
    return {
        "tile_m": [t for t in (1, 2, 4, 8) if t == 1 or t <= m],
        "tile_n": [t for t in (1, 2, 4, 8) if t == 1 or t <= n],
        "threads_m": [t for t in (1, 2, 4, 8, 16) if t == 1 or (t <= m and t < max_threads)],
        "tile_r": [t for t in (0, 8, 16, 32) if t <= max(8, k)],
        "split_k": [s for s in (1, 2, 4, 8, 16, 32) if s == 1 or (k % s == 0
                                                                  and k // s >= MIN_PART)],
    }


def is_tiled(config: dict) -> bool:
    """Whether a config selects the tiled GEMM schedule (any GEMM knob off its default)."""
    return any(config.get(knob, value) != value for knob, value in GEMM_DEFAULTS.items())


def check_gemm_knobs(config: dict) -> str | None:
    """Why a combination of GEMM knobs makes no sense, or None."""
    if not is_tiled(config):
        return None
    if config["per_thread"] != 1:
        return "per_thread applies to the one-output-per-thread schedule (tiled GEMM knobs set)"
    if config["threads"] % config["threads_m"]:
        return f"threads_m={config['threads_m']} does not divide threads={config['threads']}"
    return None


def schedule_gemm_cuda(sched: Schedule, stage_name: str, config: dict) -> None:
    """Schedule the matmul-like stage (and with `split_k` its partial-sum stage)."""
    if config["split_k"] == 1:
        _tiled(sched[stage_name], config, None, _param_operands(sched.op, stage_name))
        return
    rf = rf_stage_name(stage_name)
    part = sched[rf].roots[0].name          # rfactor's leading axis numbers the parts
    _tiled(sched[rf], config, part, _param_operands(sched.op, rf))
    schedule_part_sum(sched[stage_name], SUM_THREADS)


def _param_operands(op, stage_name: str) -> list[str]:
    return [t for t in operands(op.stage(stage_name)) if op.param(t) is not None]


def _tiled(s: StageSchedule, config: dict, part: str | None, staged: list[str]) -> None:
    """The register-tiled schedule of one matmul-like stage; `staged`: operands to copy
    into shared memory per reduction chunk (with `tile_r`)."""
    spatial = [a.name for a in s.roots if a.kind == "spatial"]
    (kk,) = [a.name for a in s.roots if a.kind == "reduce"]
    *batch, m, n = spatial
    tm, tn, thm = config["tile_m"], config["tile_n"], config["threads_m"]
    thn = config["threads"] // thm
    mo, mt = s.split(m, tm * thm)
    mi, mth = s.split(mt, thm)
    no, nt = s.split(n, tn * thn)
    ni, nth = s.split(nt, thn)
    reduce = list(s.split(kk, config["tile_r"])) if config["tile_r"] else [kk]
    blocks = [b for b in batch if b != part]
    s.reorder(*([part] if part else []), *blocks, mo, no, mth, nth, *reduce, mi, ni)
    fused = mo
    for axis in reversed(blocks):
        fused = s.fuse(axis, fused)
    fused = s.fuse(fused, no)
    s.bind(fused, "blockIdx.x")
    if part is not None:
        s.bind(part, "blockIdx.y")
    s.bind(mth, "threadIdx.y")
    s.bind(nth, "threadIdx.x")
    s.cache_write(nth)
    s.unroll(mi)
    s.unroll(ni)
    if config["tile_r"]:
        for tensor in staged:
            s.cache_read(tensor, "shared", reduce[0])


# ----------------------------------------------------------------------------- ordering
HEAD_SIZE = 48


def preferred_points(template):
    """Points of a matmul-like stage's CUDA space, best first for a short search: tiled
    GEMM shapes staged in shared memory ranked by `gemm_cost`, then the one-output-per-
    thread points (256 threads first), then the rest of the space, lazily."""
    space = template.space()
    stage = template.main_stage
    *batch, m, n = (int(a.extent.value) for a in stage.axes)
    k = int(stage.reduce.axes[0].extent.value)
    rows = m * math.prod(batch)
    sms = max(1, template.limits.cores)
    head = [p for p in space.points() if is_tiled(p) and p["per_thread"] == 1
            and p["tile_r"] in (8, 16) and p["threads"] in (64, 128, 256)]
    head.sort(key=lambda p: gemm_cost(p, rows, n, k, sms))
    seen = set()
    for point in head[:HEAD_SIZE]:
        seen.add(tuple(point.values()))
        yield point
    legacy = [p for p in space.points() if not is_tiled(p)]
    legacy.sort(key=lambda p: (p["threads"] != 256, p["per_thread"]))
    for point in legacy:
        seen.add(tuple(point.values()))
        yield point
    for point in space.points():
        if tuple(point.values()) not in seen:
            yield point


def gemm_cost(point: dict, m: int, n: int, k: int, sms: int) -> float:
    """A unitless estimate for ordering (not a time): wasted tile work, shared-memory
    operand loads per FMA, how the grid's threads fill `sms` multiprocessors, and the
    split-K pass."""
    tm, tn, thm = point["tile_m"], point["tile_n"], point["threads_m"]
    bm, bn = tm * thm, tn * (point["threads"] // thm)
    tiles_m, tiles_n = math.ceil(m / bm), math.ceil(n / bn)
    waste = tiles_m * bm * tiles_n * bn / (m * n)
    blocks = tiles_m * tiles_n * point["split_k"]
    fill = min(1.0, blocks * point["threads"] / (sms * SATURATING_THREADS_PER_SM))
    split_pass = 0.1 * (point["split_k"] - 1) / point["split_k"]
    return waste * (1 + (tm + tn) / (tm * tn)) / fill + split_pass
