"""CUDA schedule of 2-D convolutions: a register-tiled implicit GEMM, optionally split-C.

The convolution `Y[n, k, y, x] = sum(c, r, s) X[...] * W[k, c, r, s]` is a GEMM of
(output channels) x (output pixels) over the reduction (c, r, s). One thread block
computes a BM x BN tile of it, BM = `tile_k` * `block_k` output channels and BN =
`tile_x` * (pixel threads) pixels; each thread owns a `tile_k` x `tile_x` register tile
(channels contiguous per thread, pixels strided by the thread count so a warp touches
consecutive pixels). The reduction runs over chunks of `tile_c` input channels: with
`cache_input` / `cache_weight` the block first stages the chunk's input patch and
weights in shared memory (cooperative copy between barriers), then every thread
accumulates its tile from them, the operands of one step loaded once per tile row or
column (loads invariant in an unrolled loop are CSE'd by the compiler).

Pixels are mapped as (y, x) tiles, or with `fuse_yx` as one axis y*x, which for a 1x1
stride-1 convolution makes the staged input a dense [tile_c, BN] box (the lowering
merges the fused coordinates back into one dim). With `split_c` > 1 the operator is
first rewritten by `wpk.dsl.rfactor`: the channel parts become `blockIdx.y` of the
first kernel, which writes partial sums to a workspace, and a second kernel sums the
parts in a fixed order and applies the epilogue (deterministic; no atomics).
"""

from __future__ import annotations

import itertools
import math

from wpk.dsl.rfactor import rf_stage_name, schedule_part_sum
from wpk.dsl.schedule import Schedule, StageSchedule

SPLITS = (1, 2, 4, 8, 16)
MIN_PART_CHANNELS = 16      # a channel part smaller than this is not worth a workspace pass
SUM_THREADS = 256           # threads per block of the kernel summing split-C parts
SATURATING_THREADS_PER_SM = 512    # a quarter of an SM's threads, with a register tile's ILP


def split_choices(channels: int) -> list[int]:
    """`split_c` choices for a convolution with `channels` input channels per group."""
    return [s for s in SPLITS if s == 1 or (channels % s == 0
                                            and channels // s >= MIN_PART_CHANNELS)]


def schedule_conv_cuda(sched: Schedule, stage, config: dict, inputs) -> None:
    """Schedule the conv `stage` (and, with `split_c`, its partial-sum stage) for CUDA."""
    parts = config["split_c"]
    if parts == 1:
        _tiled(sched[stage.name], config, inputs, part=None)
        return
    rf = sched[rf_stage_name(stage.name)]
    _tiled(rf, config, inputs, part=rf.roots[0].name)   # rfactor's leading axis: the parts
    schedule_part_sum(sched[stage.name], SUM_THREADS)


def _tiled(s: StageSchedule, config: dict, inputs, part: str | None) -> None:
    """The register-tiled schedule of one conv stage (axes [part,] n, k, y, x; c, r, s)."""
    spatial = [a.name for a in s.roots if a.kind == "spatial"]
    n, k, y, x = spatial[-4:]
    c, r, w = (a.name for a in s.roots if a.kind == "reduce")
    co, ci = s.split(c, config["tile_c"])
    ko, kt = s.split(k, config["tile_k"] * config["block_k"])
    kb, ki = s.split(kt, config["tile_k"])
    blocks, threads, tile = _pixels(s, y, x, config)
    lead = [part] if part is not None else []
    s.reorder(*lead, n, ko, *blocks, kb, *threads, co, ci, r, w, ki, *tile)
    fused = n
    for nxt in [ko, *blocks]:
        fused = s.fuse(fused, nxt)
    s.bind(fused, "blockIdx.x")
    if part is not None:
        s.bind(part, "blockIdx.y")
    s.bind(kb, "threadIdx.z")
    s.bind(threads[0], "threadIdx.y")
    s.bind(threads[1], "threadIdx.x")
    s.cache_write(threads[1])
    s.unroll(ki)
    for loop in tile:
        s.unroll(loop)
    if config["cache_input"] and inputs[0] is not None:
        s.cache_read(inputs[0], "shared", co)
    if config["cache_weight"] and inputs[1] is not None:
        s.cache_read(inputs[1], "shared", co)


def _pixels(s: StageSchedule, y: str, x: str, config: dict):
    """Split the pixel loops: (block loops, [thread y, thread x], register-tile loops)."""
    tx, ty, tn = config["threads_x"], config["threads_y"], config["tile_x"]
    if config["fuse_yx"]:
        p = s.fuse(y, x)
        po, pt = s.split(p, tx * ty * tn)
        pi, pth = s.split(pt, tx * ty)
        pty, ptx = s.split(pth, tx)
        return [po], [pty, ptx], [pi]
    yo, yi = s.split(y, ty)
    xo, xt = s.split(x, tx * tn)
    if tn == 1:
        return [yo, xo], [yi, xt], []
    xi, xth = s.split(xt, tx)
    return [yo, xo], [yi, xth], [xi]


# ----------------------------------------------------------------------------- ordering
def cuda_preferred_points(template):
    """Points of the conv template's CUDA space, best first for a short search: a head of
    register-tiled implicit-GEMM shapes ranked by `tile_cost`, then every other point in
    the space's order (lazily: the space has some 10^5 points)."""
    space = template.space()
    n, k, y, x, c, r, s = template._extents()
    head = list(_head_candidates(space, c))
    sms = max(1, template.limits.cores)
    head.sort(key=lambda p: tile_cost(p, n, k, y, x, sms))
    seen = set()
    for point in head:
        key = tuple(point.values())
        if key not in seen:
            seen.add(key)
            yield point
    for point in space.points():
        if tuple(point.values()) not in seen:
            yield point


def _head_candidates(space, channels: int):
    """Register-tiled points with both operands staged in shared memory."""
    shapes = [(16, 1, 8), (32, 1, 8), (8, 2, 8), (16, 2, 8), (8, 4, 8), (16, 2, 4),
              (32, 1, 4), (8, 1, 8), (16, 1, 4), (8, 2, 4)]
    tiles = [(4, 4), (8, 4), (4, 8), (8, 8), (4, 2), (2, 4), (2, 2), (8, 2), (4, 1)]
    for (tx, ty, bk), (tk, tn), tc, split, fuse in itertools.product(
            shapes, tiles, (16, 8, 32), space["split_c"], (1, 0)):
        point = {"threads_x": tx, "threads_y": ty, "tile_k": tk, "block_k": bk,
                 "tile_c": min(tc, channels // split), "cache_input": 1, "cache_weight": 1,
                 "tile_x": tn, "fuse_yx": fuse, "split_c": split}
        if all(point[knob] in choices for knob, choices in space.items()):
            yield point


def tile_cost(point: dict, n: int, k: int, y: int, x: int, sms: int) -> float:
    """A unitless estimate for ordering (not a time): wasted tile work, operand loads per
    FMA from shared memory, and how well the grid's threads fill `sms` multiprocessors
    (SATURATING_THREADS_PER_SM each). Fusing pixels comes first among equals: a 1x1
    stride-1 convolution is then a dense GEMM; the validation rejects fused points whose
    staged input would be too big (strided or padded large images)."""
    bm = point["tile_k"] * point["block_k"]
    tx, ty, tn = point["threads_x"], point["threads_y"], point["tile_x"]
    if point["fuse_yx"]:
        tiles = math.ceil(y * x / (tx * ty * tn))
        covered = tiles * tx * ty * tn
    else:
        tiles = math.ceil(y / ty) * math.ceil(x / (tx * tn))
        covered = math.ceil(y / ty) * ty * math.ceil(x / (tx * tn)) * tx * tn
    k_tiles = math.ceil(k / bm)
    waste = k_tiles * bm * covered / (k * y * x)
    blocks = n * k_tiles * tiles * point["split_c"]
    threads = tx * point["threads_y"] * point["block_k"]
    fill = min(1.0, blocks * threads / (sms * SATURATING_THREADS_PER_SM))
    tm = point["tile_k"]
    loads_per_fma = (tm + tn) / (tm * tn)
    split_pass = 0.1 * (point["split_c"] - 1) / point["split_c"]
    return waste * (1 + loads_per_fma) / fill + split_pass + 0.01 * (1 - point["fuse_yx"])
