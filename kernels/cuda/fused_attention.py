"""Fused attention on the CUDA target: the loop IR of softmax(Q K^T scale + mask) V.

    reason = attention_config_reason(shape, {"tq": 64, "tk": 32}, gpu)   # None if it fits
    func = lower_attention(workload, {"tq": 64, "tk": 32})                # loop IR (cuda)

The DSL's reductions need every score of a row before its softmax (a
[heads, seq, seq] workspace), so this kernel is written directly in loop IR,
the form the DSL's CUDA schedules lower to; the CUDA printer, the GPU
emulator (races, out-of-bounds accesses) and the analytical model read it as
they read any lowered DSL operator.

Schedule: one block per (query tile of `tq` rows, batch x head), one thread
per query row. The block stages its Q tile in shared memory (rows padded by
one float so the threads' reads hit distinct banks), then walks the keys in
tiles of `tk`: the block stages the K and V tile in shared memory, each
thread computes its `tk` logits in registers (scale, mask, keys past the end
at -inf) and folds them into its running max, running sum and `dv`
accumulators with the online softmax (rescale by exp(old max - new max)).
No [heads, seq, seq] tensor exists anywhere; the output row is the
accumulators over the sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from wpk.core.workload import Workload
from wpk.dsl import loopir as L
from wpk.kernels.cpu.attention_spec import AttentionShape, attention_shape, mask_strides

KNOBS = {"tq": (32, 64, 128), "tk": (16, 32, 64)}
REGISTER_ALLOWANCE = 32      # addressing, loop counters, the softmax state
FLOAT_BYTES = 4
_NEG_INF = L.const(-math.inf, "f32")


def attention_space(shape: AttentionShape) -> list[dict]:
    """Every (tq, tk) point, preferred first: tiles close to the sequence, mid-size key
    tiles (registers) before big ones."""
    def rank(point):
        waste_q = math.ceil(shape.sq / point["tq"]) * point["tq"] - shape.sq
        waste_k = math.ceil(shape.sk / point["tk"]) * point["tk"] - shape.sk
        return (waste_q + waste_k, abs(point["tk"] - 32), -point["tq"])

    points = [{"tq": tq, "tk": tk} for tq in KNOBS["tq"] for tk in KNOBS["tk"]]
    return sorted(points, key=rank)


def shared_bytes(shape: AttentionShape, config: Mapping) -> int:
    """Shared memory of a block: the padded Q tile and one K and one V tile."""
    tq, tk = config["tq"], config["tk"]
    return FLOAT_BYTES * (tq * (shape.d + 1) + tk * (shape.d + shape.dv))


def attention_config_reason(shape: AttentionShape, config: Mapping, gpu) -> str | None:
    """None when `config` is a valid schedule for `gpu`, else why not."""
    for knob, values in KNOBS.items():
        if config.get(knob) not in values:
            return f"{knob} must be one of {values}"
    smem = shared_bytes(shape, config)
    if smem > gpu.shared_memory_per_block:
        return f"{smem} bytes of shared memory exceed the {gpu.name} limit of " \
               f"{gpu.shared_memory_per_block}"
    registers = config["tk"] + shape.dv + REGISTER_ALLOWANCE
    if registers > gpu.max_registers_per_thread:
        return f"about {registers} registers per thread exceed the {gpu.name} limit of " \
               f"{gpu.max_registers_per_thread}"
    if registers * config["tq"] > gpu.registers_per_block:
        return f"about {registers} registers x {config['tq']} threads exceed the register file"
    return None


class _Ix:
    """Index helpers of one attention workload (flat row-major offsets)."""

    def __init__(self, workload: Workload, shape: AttentionShape):
        self.s = shape
        q = workload.inputs[0].shape
        self.heads = q[1] if len(q) == 4 else 1
        self.mask = mask_strides(shape, len(q)) if shape.mask_shape else None

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
    tq, tk = int(config["tq"]), int(config["tk"])
    d, dv, sq, sk = shape.d, shape.dv, shape.sq, shape.sk
    b, qt, t = L.Var("b"), L.Var("qt"), L.Var("t")
    row = L.add(L.mul(qt, tq), t)
    qpad = d + 1

    def q_item(e):
        r, c = L.binary("//", e, d), L.binary("%", e, d)
        grow = L.add(L.mul(qt, tq), r)
        value = L.Select(L.binary("<", grow, sq), L.Load("Q", (b * sq + grow) * d + c), _f(0))
        return value, L.add(L.mul(r, qpad), c)

    stage_q = _stage("qs", tq * d, tq, t, q_item)

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

    stage_k = _stage("ks", tk * d, tq, t, k_item)

    def v_item(e):
        j = L.binary("//", e, dv)
        key = L.add(key0, j)
        return L.Select(L.binary("<", key, sk),
                        L.Load("V", (b * sk + key) * dv + L.binary("%", e, dv)), _f(0)), e

    stage_v = _stage("vs", tk * dv, tq, t, v_item)
    j, c, f = L.Var("j"), L.Var("c"), L.Var("f")
    s_j = L.Load("s", j)
    m_old, l_sum, m_new = (L.Load("st", L.const(i)) for i in range(3))
    key = L.add(key0, j)
    logit = _fbin("*", s_j, _f(shape.scale))
    if ix.mask is not None:
        inside = L.Bin("and", L.binary("<", key, sk), L.binary("<", row, sq), "bool")
        logit = _fbin("+", logit, L.Select(inside, L.Load("M", ix.mask_index(b, row, key)),
                                           _f(0)))
    scores = L.seq(
        L.For(j, tk, L.Store("s", j, _f(0)), "unroll"),
        L.For(c, d, L.For(j, tk, L.Store("s", j, _fbin("+", s_j, _fbin(
            "*", L.Load("qs", L.add(L.mul(t, qpad), c)), L.Load("ks", L.add(L.mul(j, d), c))))),
            "unroll")),
        L.Store("st", L.const(2), m_old),
        L.For(j, tk, L.seq(
            L.Store("s", j, L.Select(L.binary("<", key, sk), logit, _NEG_INF)),
            L.Store("st", L.const(2), _fbin("max", m_new, s_j))), "unroll"))
    corr = L.Call("exp", (_fbin("-", m_old, m_new),))
    online = L.seq(
        L.Store("st", L.const(3), corr),
        L.Store("st", L.const(1), _fbin("*", l_sum, L.Load("st", L.const(3)))),
        L.For(f, dv, L.Store("acc", f, _fbin("*", L.Load("acc", f), L.Load("st", L.const(3)))),
              "unroll"),
        L.For(j, tk, L.seq(
            L.Store("s", j, L.Call("exp", (_fbin("-", s_j, m_new),))),
            L.Store("st", L.const(1), _fbin("+", l_sum, s_j))), "unroll"),
        L.For(j, tk, L.For(f, dv, L.Store("acc", f, _fbin(
            "+", L.Load("acc", f), _fbin("*", s_j, L.Load("vs", L.add(L.mul(j, dv), f))))),
            "unroll"), "unroll"),
        L.Store("st", L.const(0), m_new))
    key_loop = L.For(kt, math.ceil(sk / tk), L.seq(
        L.Barrier(), stage_k, stage_v, L.Barrier(), scores, online))
    write = L.IfThenElse(L.binary("<", row, sq), L.For(f, dv, L.Store(
        "Y", (b * sq + row) * dv + f, _fbin("/", L.Load("acc", f), l_sum)), "unroll"))
    buffers = [L.Buffer("qs", "f32", (tq * qpad,), "shared"),
               L.Buffer("ks", "f32", (tk * d,), "shared"),
               L.Buffer("vs", "f32", (tk * dv,), "shared"),
               L.Buffer("s", "f32", (tk,), "local"), L.Buffer("acc", "f32", (dv,), "local"),
               L.Buffer("st", "f32", (4,), "local")]
    body = L.seq(*(L.Allocate(x) for x in buffers), stage_q,
                 L.Store("st", L.const(0), _NEG_INF), L.Store("st", L.const(1), _f(0)),
                 L.For(f, dv, L.Store("acc", f, _f(0)), "unroll"), key_loop, write)
    body = L.For(b, shape.batch, L.For(qt, math.ceil(sq / tq), L.For(t, tq, body,
                                                                     "threadIdx.x"),
                                       "blockIdx.x"), "blockIdx.y")
    params = _params(workload)
    name = "wpk_attention"
    kernel = L.Kernel(name, body, tuple(p.name for p in params))
    return L.PrimFunc(name, tuple(params), (), (), (kernel,), "cuda", meta={"outputs": ("Y",)})


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
