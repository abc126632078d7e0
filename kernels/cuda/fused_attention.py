"""Fused attention on the CUDA target: the loop IR of softmax(Q K^T scale + mask) V.

    config = {"tq": 64, "tk": 32, "split": 2}
    reason = attention_config_reason(shape, config, gpu)    # None if it fits the preset
    func = lower_attention(workload, config)                # loop IR (cuda)

The DSL's reductions need every score of a row before its softmax (a
[heads, seq, seq] workspace), so this kernel is written directly in loop IR,
the form the DSL's CUDA schedules lower to; the CUDA printer, the GPU
emulator (races, out-of-bounds accesses) and the analytical model read it as
they read any lowered DSL operator.

Schedule: one block per (query tile of `tq` rows, batch x head), `split`
threads per query row. The block stages its Q tile in shared memory (rows
padded by one float so the threads' reads hit distinct banks), then walks the
keys in tiles of `tk`: the block stages the K and V tile in shared memory,
each thread computes the logits of its tk/split keys of the tile in registers
(scale, mask, keys past the end at -inf) and folds them into its running max,
running sum and `dv` accumulators with the online softmax (rescale by
exp(old max - new max)). At the end the `split` threads of a row publish
their partial states in shared memory and merge them (each rescaled to the
row's max), each writing every split-th output feature. No [heads, seq, seq]
tensor exists anywhere. `split` multiplies the threads of a small problem
(batch x heads x seq is few threads for a big GPU) without redundant work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from wpk.core.workload import Workload
from wpk.dsl import loopir as L
from wpk.kernels.cpu.attention_spec import (
    AttentionShape,
    attention_shape,
    kernel_rank,
    mask_strides,
)

KNOBS = {"tq": (8, 16, 32, 64, 128), "tk": (16, 32, 64), "split": (1, 2, 4, 8, 16)}
MIN_THREADS, MAX_THREADS = 32, 256
PARALLEL_TARGET = 1 << 15    # threads a grid should have to fill a big GPU (assumption)
REGISTER_ALLOWANCE = 32      # addressing, loop counters, the softmax state
FLOAT_BYTES = 4
_NEG_INF = L.const(-math.inf, "f32")


def attention_space(shape: AttentionShape) -> list[dict]:
    """Every (tq, tk, split) point, preferred first: enough threads in the grid to fill a
    big GPU (PARALLEL_TARGET), then tiles close to the sequence, then the fewest threads
    per row (merge work), mid-size key tiles (registers), big query tiles."""
    def rank(point):
        tq, tk, split = point["tq"], point["tk"], point["split"]
        blocks = shape.batch * math.ceil(shape.sq / tq)
        waste = math.ceil(shape.sq / tq) * tq - shape.sq + math.ceil(shape.sk / tk) * tk \
            - shape.sk
        return (-min(blocks * tq * split, PARALLEL_TARGET), waste, split,
                abs(tk - 32), -tq)

    points = [{"tq": tq, "tk": tk, "split": split} for tq in KNOBS["tq"]
              for tk in KNOBS["tk"] for split in KNOBS["split"]]
    return sorted(points, key=rank)


def shared_bytes(shape: AttentionShape, config: Mapping) -> int:
    """Shared memory of a block: the padded Q tile and one buffer for the K and V tile
    (reused for the merge of the split threads' partial states)."""
    tq, tk, split = config["tq"], config["tk"], config.get("split", 1)
    return FLOAT_BYTES * (tq * (shape.d + 1) + max(tk * (shape.d + shape.dv),
                                                    tq * split * (shape.dv + 2)))


def attention_config_reason(shape: AttentionShape, config: Mapping, gpu) -> str | None:
    """None when `config` is a valid schedule for `gpu`, else why not."""
    for knob, values in KNOBS.items():
        if config.get(knob) not in values:
            return f"{knob} must be one of {values}"
    threads = config["tq"] * config["split"]
    if not MIN_THREADS <= threads <= MAX_THREADS:
        return f"tq x split = {threads} threads, not in {MIN_THREADS}..{MAX_THREADS}"
    if config["tk"] % config["split"]:
        return "split must divide tk"
    smem = shared_bytes(shape, config)
    if smem > gpu.shared_memory_per_block:
        return f"{smem} bytes of shared memory exceed the {gpu.name} limit of " \
               f"{gpu.shared_memory_per_block}"
    registers = config["tk"] // config["split"] + shape.dv + REGISTER_ALLOWANCE
    if registers > gpu.max_registers_per_thread:
        return f"about {registers} registers per thread exceed the {gpu.name} limit of " \
               f"{gpu.max_registers_per_thread}"
    if registers * threads > gpu.registers_per_block:
        return f"about {registers} registers x {threads} threads exceed the register file"
    return None


class _Ix:
    """Index helpers of one attention workload (flat row-major offsets)."""

    def __init__(self, workload: Workload, shape: AttentionShape):
        self.s = shape
        q = workload.inputs[0].shape
        self.heads = q[-3] if len(q) >= 4 else 1
        self.mask = mask_strides(shape, kernel_rank(len(q))) if shape.mask_shape else None

    def k(self, b, key, c):
        s = self.s
        if s.k_transposed:
            return (b * s.d + c) * s.sk + key
        return (b * s.sk + key) * s.d + c

    def mask_index(self, b, row, key):
        s0, s1, s2, s3 = self.mask
        b0, b1 = L.binary("//", b, self.heads), L.binary("%", b, self.heads)
        return b0 * s0 + b1 * s1 + row * s2 + key * s3


def _f(value) -> L.Expr:
    return L.const(float(value), "f32")


def _fbin(op, a, b) -> L.Expr:
    return L.Bin(op, a, b, "f32")


def _stage(tile: str, count: int, threads: int, t: L.Var, item) -> L.Stmt:
    """The block's threads copy `count` elements into shared `tile`: element e = i*threads
    + t; `item(e)` gives (value (a guarded load), index in the tile)."""
    i = L.Var(f"{tile}_i")
    e = L.add(L.mul(i, threads), t)
    value, index = item(e)
    body = L.Store(tile, index, value)
    if count % threads:
        body = L.IfThenElse(L.binary("<", e, count), body)
    return L.For(i, math.ceil(count / threads), body)


def lower_attention(workload: Workload, config: Mapping) -> L.PrimFunc:
    """The CUDA loop IR of a fused attention workload under `config` (see the docstring)."""
    shape = attention_shape(workload)
    ix = _Ix(workload, shape)
    tq, tk, split = int(config["tq"]), int(config["tk"]), int(config.get("split", 1))
    threads, per = tq * split, tk // split
    d, dv, sq, sk = shape.d, shape.dv, shape.sq, shape.sk
    b, qt, t = L.Var("b"), L.Var("qt"), L.Var("t")
    r, part = L.binary("%", t, tq), L.binary("//", t, tq)
    row = L.add(L.mul(qt, tq), r)
    qpad, slot = d + 1, dv + 2

    def q_item(e):
        rr, c = L.binary("//", e, d), L.binary("%", e, d)
        grow = L.add(L.mul(qt, tq), rr)
        value = L.Select(L.binary("<", grow, sq), L.Load("Q", (b * sq + grow) * d + c), _f(0))
        return value, L.add(L.mul(rr, qpad), c)

    kt = L.Var("kt")
    key0 = L.mul(kt, tk)

    def k_item(e):
        if shape.k_transposed:      # K^T [d, sk]: consecutive threads read consecutive keys
            j, c = L.binary("%", e, tk), L.binary("//", e, tk)
        else:
            j, c = L.binary("//", e, d), L.binary("%", e, d)
        key = L.add(key0, j)
        return L.Select(L.binary("<", key, sk), L.Load("K", ix.k(b, key, c)), _f(0)), \
            L.add(L.mul(j, d), c)

    def v_item(e):
        key = L.add(key0, L.binary("//", e, dv))
        return L.Select(L.binary("<", key, sk),
                        L.Load("V", (b * sk + key) * dv + L.binary("%", e, dv)), _f(0)), \
            L.add(e, tk * d)

    j, c, f = L.Var("j"), L.Var("c"), L.Var("f")
    s_j = L.Load("s", j)
    st = [L.Load("st", L.const(i)) for i in range(4)]    # max, sum, new max, rescale
    m_old, l_sum, m_new = st[:3]
    kj = L.add(L.mul(j, split), part)                     # this thread's j-th key of the tile
    key = L.add(key0, kj)
    logit = _fbin("*", s_j, _f(shape.scale))
    if ix.mask is not None:
        inside = L.Bin("and", L.binary("<", key, sk), L.binary("<", row, sq), "bool")
        logit = _fbin("+", logit, L.Select(inside, L.Load("M", ix.mask_index(b, row, key)),
                                           _f(0)))
    scores = L.seq(
        L.For(j, per, L.Store("s", j, _f(0)), "unroll"),
        L.For(c, d, L.For(j, per, L.Store("s", j, _fbin("+", s_j, _fbin(
            "*", L.Load("qs", L.add(L.mul(r, qpad), c)),
            L.Load("kv", L.add(L.mul(kj, d), c))))), "unroll")),
        L.Store("st", L.const(2), m_old),
        L.For(j, per, L.seq(
            L.Store("s", j, L.Select(L.binary("<", key, sk), logit, _NEG_INF)),
            L.Store("st", L.const(2), _fbin("max", m_new, s_j))), "unroll"))
    # exponents relative to the new max, or to 0 while every key so far was -inf
    m_safe = L.Select(L.Bin(">", m_new, _NEG_INF, "bool"), m_new, _f(0))
    online = L.seq(
        L.Store("st", L.const(3), L.Call("exp", (_fbin("-", m_old, m_safe),))),
        L.Store("st", L.const(1), _fbin("*", l_sum, st[3])),
        L.For(f, dv, L.Store("acc", f, _fbin("*", L.Load("acc", f), st[3])), "unroll"),
        L.For(j, per, L.seq(
            L.Store("s", j, L.Call("exp", (_fbin("-", s_j, m_safe),))),
            L.Store("st", L.const(1), _fbin("+", l_sum, s_j))), "unroll"),
        L.For(j, per, L.For(f, dv, L.Store("acc", f, _fbin(
            "+", L.Load("acc", f), _fbin("*", s_j, L.Load("kv", L.add(
                L.add(L.mul(kj, dv), f), tk * d))))), "unroll"), "unroll"),
        L.Store("st", L.const(0), m_new))
    key_loop = L.For(kt, math.ceil(sk / tk), L.seq(
        L.Barrier(), _stage("kv", tk * d, threads, t, k_item),
        _stage("kv", tk * dv, threads, t, v_item), L.Barrier(), scores, online))
    body = L.seq(*(L.Allocate(x) for x in _buffers(shape, tq, tk, split)),
                 _stage("qs", tq * d, threads, t, q_item),
                 L.Store("st", L.const(0), _NEG_INF), L.Store("st", L.const(1), _f(0)),
                 L.For(f, dv, L.Store("acc", f, _f(0)), "unroll"), key_loop,
                 _merge(t, r, part, row, b, shape, tq, split, slot))
    body = L.For(b, shape.batch, L.For(qt, math.ceil(sq / tq), L.For(t, threads, body,
                                                                     "threadIdx.x"),
                                       "blockIdx.x"), "blockIdx.y")
    params = _params(workload)
    name = "wpk_attention"
    kernel = L.Kernel(name, body, tuple(p.name for p in params))
    return L.PrimFunc(name, tuple(params), (), (), (kernel,), "cuda", meta={"outputs": ("Y",)})


def _buffers(shape: AttentionShape, tq: int, tk: int, split: int) -> list[L.Buffer]:
    """Shared: the padded Q tile; one buffer for the K and V tile, reused for the partial
    states of the merge. Local: scores, accumulators, softmax state."""
    kv = max(tk * (shape.d + shape.dv), tq * split * (shape.dv + 2))
    return [L.Buffer("qs", "f32", (tq * (shape.d + 1),), "shared"),
            L.Buffer("kv", "f32", (kv,), "shared"),
            L.Buffer("s", "f32", (tk // split,), "local"),
            L.Buffer("acc", "f32", (shape.dv,), "local"), L.Buffer("st", "f32", (4,), "local")]


def _merge(t, r, part, row, b, shape: AttentionShape, tq: int, split: int, slot: int):
    """The `split` threads of a row publish their (acc, max, sum) in shared memory; then
    each writes every split-th output feature of the row from all of them, rescaled to
    the row's max."""
    dv, sq = shape.dv, shape.sq
    f, p, fl = L.Var("f"), L.Var("p"), L.Var("fl")
    mine = L.mul(t, slot)
    publish = L.seq(L.For(f, dv, L.Store("kv", L.add(mine, f), L.Load("acc", f)), "unroll"),
                    L.Store("kv", L.add(mine, dv), L.Load("st", L.const(0))),
                    L.Store("kv", L.add(mine, dv + 1), L.Load("st", L.const(1))))
    theirs = L.mul(L.add(L.mul(p, tq), r), slot)
    m_p, l_p = L.Load("kv", L.add(theirs, dv)), L.Load("kv", L.add(theirs, dv + 1))
    big = L.Load("st", L.const(0))
    weight = L.Call("exp", (_fbin("-", m_p, big),))
    feature = L.add(L.mul(fl, split), part)
    total = L.seq(
        L.Store("st", L.const(0), _NEG_INF),
        L.For(p, split, L.Store("st", L.const(0), _fbin("max", big, m_p)), "unroll"),
        L.Store("st", L.const(1), _f(0)),
        L.For(p, split, L.Store("st", L.const(1), _fbin(
            "+", L.Load("st", L.const(1)), _fbin("*", l_p, weight))), "unroll"))
    out = L.For(fl, math.ceil(dv / split), L.IfThenElse(
        L.Bin("and", L.binary("<", feature, dv), L.binary("<", row, sq), "bool"), L.seq(
            L.Store("st", L.const(2), _f(0)),
            L.For(p, split, L.Store("st", L.const(2), _fbin(
                "+", L.Load("st", L.const(2)),
                _fbin("*", L.Load("kv", L.add(theirs, feature)), weight))), "unroll"),
            L.Store("Y", (b * sq + row) * dv + feature,
                    _fbin("/", L.Load("st", L.const(2)), L.Load("st", L.const(1)))))), "unroll")
    return L.seq(L.Barrier(), publish, L.Barrier(), total, out)


def _params(workload: Workload) -> list[L.Buffer]:
    names = ["Q", "K", "V", "M"]
    params = [L.Buffer(names[i], "f32", tuple(s.shape))
              for i, s in enumerate(workload.inputs) if s is not None]
    params.append(L.Buffer("Y", "f32", tuple(workload.outputs[0].shape)))
    return params


def attention_feeds(workload: Workload) -> dict[str, int]:
    """Parameter name -> the step's input index."""
    names = ["Q", "K", "V", "M"]
    return {names[i]: i for i, s in enumerate(workload.inputs) if s is not None}
