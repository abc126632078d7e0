"""What a GEMM micro-kernel computes (`GemmGeometry`) and the configs it can be built with.

    geometry = gemm_geometry(workload)    # GemmGeometry, or a str saying why it has none
    space = GemmSpace(geometry)           # space(), validate(config), default_config()

A MatMul (batched, broadcast batch dims, 1-D operands) or a Gemm (transA,
transB, alpha, beta, C) is seen as `batch` products of an M x K matrix by a
K x N one, the output C-contiguous [batch, M, N]. A config is
`{"isa", "mr", "nv", "kc", "mb", "nb", "unroll"}`: the register tile is `mr`
rows by `nv` vectors of columns (`mr * nv` accumulators, `nr = nv * lanes`
columns, B packed in panels of nr columns); the reduction runs in passes of
`kc` rows of B (partial sums parked in the output), so a panel's kc x nr slice
stays in L1 while the `mr`-row tiles of a block of `mb` tiles sweep it; a
parallel unit is one batch x `mb` row tiles x `nb` panels. `unroll` unrolls
the loop over k; the optional `pf` (0 when absent) has every k of a tile prefetch the
panel's row `pf` rows of B ahead (the first tile of a panel reads it from L3 or
memory). Every operand of the epilogue (Gemm's C, the fused steps' own
operands) is addressed as `b * sb + i * si + j * sj` in the output's
[batch, M, N] view: strides 0 broadcast it.
"""

from __future__ import annotations

import functools
import heapq
import math
import os
from dataclasses import dataclass

import numpy as np

from wpk.core.workload import EpilogueStep, Workload
from wpk.kernels.cpu.microkernels.isa import ISAS, Isa, isa_named, usable_isas
from wpk.kernels.cpu.node_model import core_input_count
from wpk.kernels.epilogue import validate_epilogue

KNOBS = ("isa", "mr", "nv", "kc", "mb", "nb", "unroll")
MR_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14)
NV_CHOICES = (1, 2, 3, 4, 6)
KC_CHOICES = (32, 64, 128, 256, 512, 1024)
MB_CHOICES = (1, 2, 4, 8, 16, 32, 64)
NB_CHOICES = (1, 2, 4, 8, 16, 32)
UNROLL_CHOICES = (1, 2, 4, 8)
PF_CHOICES = (0, 4, 8, 16)
# Knobs a config may leave out, and their values then (configs and records written before
# the knob existed stay valid and build the same kernel)
OPTIONAL_KNOBS = {"pf": 0}
# A panel's kc x nr slice the row tiles of a block sweep: kept within this many bytes, half
# of a 256 KiB L2 (the smallest of current x86 server cores). An L1-sized slice (32 KiB:
# kc 128 at 4 AVX-512 vectors) parks partial sums in the output once per 128 rows of B
# and ran BERT's and ViT's projections 3-7% slower than 512 rows (2026-11-29, AVX-512 and
# AVX2 code on one Zen 4 VM, 1 and 2 threads: `scripts/bench_micro_gemm.py --kc-sweep`)
PANEL_BYTES = 128 * 1024
# Parallel units per call the default aims at: a few per core, each of at least
# UNIT_FLOPS (a smaller product runs on the calling thread: waking a team costs more)
TARGET_UNITS = 4 * (os.cpu_count() or 1)
UNIT_FLOPS = 1 << 20
# Batch offset tables are baked into the source: at most this many batches
MAX_BATCH = 1 << 16


@dataclass(frozen=True)
class Operand:
    """An epilogue operand: workload input `index` read at `b * sb + i * si + j * sj`."""

    index: int
    sb: int
    si: int
    sj: int


@dataclass(frozen=True)
class GemmGeometry:
    """`batch` products (M x K) @ (K x N) as the micro-kernel sees them."""

    m: int
    k: int
    n: int
    a_offsets: tuple[int, ...]     # per output batch: offset of its A matrix
    b_offsets: tuple[int, ...]     # per output batch: which B matrix (index into b_count)
    b_count: int                   # distinct B matrices (B's own batches)
    lda_m: int                     # A's stride between rows i
    lda_k: int                     # A's stride along k
    trans_b: bool                  # B is stored N x K
    alpha: float
    const_b: bool                  # B is a constant: packed once at prepare time
    c: Operand | None              # Gemm's C (times beta)
    beta: float
    steps: tuple[EpilogueStep, ...]
    operands: tuple[Operand, ...]  # of the binary steps, by their input index

    @property
    def batch(self) -> int:
        return len(self.a_offsets)

    @property
    def flops(self) -> int:
        """2 x multiply-adds of the products."""
        return 2 * self.batch * self.m * self.k * self.n

    def vectors(self, lanes: int) -> int:
        """Vectors of `lanes` floats that cover a row of the output."""
        return -(-self.n // lanes)


@functools.lru_cache(maxsize=256)
def operand_strides(shape: tuple[int, ...], out: tuple[int, ...],
                    view: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """(sb, si, sj) of a tensor of `shape` broadcast to `out` in the [batch, M, N] `view`
    of the output, or None when its elements are not at such affine offsets."""
    try:
        if np.broadcast_shapes(shape, out) != out:
            return None
    except ValueError:
        return None
    index = np.broadcast_to(np.arange(math.prod(shape)).reshape(shape), out).reshape(view)
    strides = tuple(int(index[tuple(1 if d == axis else 0 for d in range(3))] - index[0, 0, 0])
                    if view[axis] > 1 else 0 for axis in range(3))
    grid = np.ix_(*(np.arange(v) for v in view))
    expected = sum(s * g for s, g in zip(strides, grid)) + index[0, 0, 0]
    return strides if np.array_equal(index, np.broadcast_to(expected, view)) else None


def _batch_table(batch_shape: tuple[int, ...], out_batch: tuple[int, ...]) -> tuple[int, ...]:
    """For each output batch (row-major), the index of the operand's own batch matrix."""
    own = np.arange(math.prod(batch_shape)).reshape(batch_shape)
    return tuple(int(v) for v in np.broadcast_to(own, out_batch).ravel())


def _products(workload: Workload, fold: bool = True):
    """(m, k, n, a batch shape, b batch shape, out batch, lda_m, lda_k, trans_b) or a str.
    With `fold`, a MatMul whose B has no batch dims takes A's batch dims into M: one
    (batch * M) x K product, not `batch` thin ones (torch's seq-first attention projects
    a (128, 1, 256) A: 128 products of one row each)."""
    a, b = workload.inputs[0].shape, workload.inputs[1].shape
    if workload.op == "Gemm":
        if len(a) != 2 or len(b) != 2:
            return "Gemm takes 2-D A and B"
        trans_a, trans_b = bool(workload.attr("transA", 0)), bool(workload.attr("transB", 0))
        m, k = (a[1], a[0]) if trans_a else a
        n = b[0] if trans_b else b[1]
        lda = (1, m) if trans_a else (k, 1)
        return m, k, n, (), (), (), *lda, trans_b
    if not a or not b:
        return "MatMul of scalars"
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    try:
        out_batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        return "batch dims that do not broadcast"
    m, k, n = a2[-2], a2[-1], b2[-1]
    if fold and not b2[:-2] and a2[:-2]:
        return math.prod(a2[:-1]), k, n, (), (), (), k, 1, False
    return m, k, n, a2[:-2], b2[:-2], out_batch, k, 1, False


def _operand(workload: Workload, index: int, view) -> Operand | str:
    spec = workload.inputs[index]
    if spec is None or spec.dtype != "float32":
        return f"epilogue operand {index} is not float32"
    strides = operand_strides(tuple(spec.shape), tuple(workload.outputs[0].shape), view)
    if strides is None:
        return f"epilogue operand {index} {spec.shape} does not broadcast by rows and columns"
    return Operand(index, *strides)


def gemm_geometry(workload: Workload) -> GemmGeometry | str:
    """The geometry of a float32 MatMul or Gemm, or why the micro-kernel does not compute it:
    A's batch dims folded into M where B has none and every epilogue operand still lies at
    affine offsets of the folded view, else batch by batch."""
    folded = _geometry(workload, fold=True)
    return _geometry(workload, fold=False) if isinstance(folded, str) else folded


def _geometry(workload: Workload, fold: bool) -> GemmGeometry | str:
    if workload.domain not in ("", "ai.onnx") or workload.op not in ("MatMul", "Gemm"):
        return "not a MatMul or Gemm"
    specs = [s for s in (*workload.inputs, *workload.outputs) if s is not None]
    if any(s.dtype != "float32" for s in specs):
        return "GEMM micro-kernels compute float32 only"
    if len(workload.inputs) < 2 or workload.inputs[1] is None or len(workload.outputs) != 1:
        return "a product of two inputs into one output"
    if any(0 in s.shape for s in specs):
        return "empty tensors"
    found = _products(workload, fold)
    if isinstance(found, str):
        return found
    m, k, n, a_batch, b_batch, out_batch, lda_m, lda_k, trans_b = found
    batch = math.prod(out_batch)
    if batch > MAX_BATCH:
        return f"more than {MAX_BATCH} batches"
    view = (batch, m, n)
    if math.prod(workload.outputs[0].shape) != batch * m * n:
        return "the output does not hold the product"
    core = core_input_count(workload)
    c = None
    if workload.op == "Gemm" and core > 2 and workload.inputs[2] is not None:
        c = _operand(workload, 2, view)
        if isinstance(c, str):
            return c
    reason = validate_epilogue(workload.epilogue, len(workload.inputs))
    if reason:
        return reason
    operands = []
    for index in sorted({s.operand for s in workload.epilogue if s.operand is not None}):
        found_op = _operand(workload, index, view)
        if isinstance(found_op, str):
            return found_op
        operands.append(found_op)
    a_table = _batch_table(a_batch, out_batch)
    return GemmGeometry(
        m=m, k=k, n=n, a_offsets=tuple(i * m * k for i in a_table),
        b_offsets=_batch_table(b_batch, out_batch), b_count=math.prod(b_batch),
        lda_m=lda_m, lda_k=lda_k, trans_b=trans_b,
        alpha=float(workload.attr("alpha", 1.0)) if workload.op == "Gemm" else 1.0,
        const_b=1 in workload.const_inputs, c=c,
        beta=float(workload.attr("beta", 1.0)) if workload.op == "Gemm" else 1.0,
        steps=tuple(workload.epilogue), operands=tuple(operands))


def tile_registers(nv: int, mr: int) -> int:
    """Vector registers the inner loop keeps live: accumulators, a row of B, a broadcast."""
    return mr * nv + nv + 1


def config_reason(g: GemmGeometry, config) -> str | None:
    """None when `config` is a valid GEMM micro-kernel schedule of `g`, else why not."""
    if not set(KNOBS) <= set(config) <= set(KNOBS) | set(OPTIONAL_KNOBS):
        return (f"a GEMM micro-kernel config has the knobs {', '.join(KNOBS)} and "
                f"optionally {', '.join(OPTIONAL_KNOBS)}")
    try:
        isa = isa_named(str(config["isa"]))
    except ValueError as exc:
        return str(exc)
    mr, nv, kc, mb, nb, unroll = (int(config[k]) for k in KNOBS[1:])
    if min(mr, nv, kc, mb, nb, unroll) < 1:
        return "mr, nv, kc, mb, nb and unroll are positive"
    if mr > max(MR_CHOICES) or unroll > max(UNROLL_CHOICES):
        return f"mr <= {max(MR_CHOICES)}, unroll <= {max(UNROLL_CHOICES)}"
    if mr > g.m:
        return f"mr {mr} is more rows than the {g.m} of the product"
    if nv > g.vectors(isa.lanes):
        return f"nv {nv} is more vectors than the {g.vectors(isa.lanes)} of a row"
    if tile_registers(nv, mr) > isa.registers:
        return f"a {mr}x{nv} tile needs more than {isa.name}'s {isa.registers} vector registers"
    if prefetch_rows(config) not in PF_CHOICES:
        return f"pf (rows of B prefetched ahead) is one of {PF_CHOICES}"
    return None


def prefetch_rows(config) -> int:
    """Rows of B a config's tiles prefetch ahead (0, none, when it has no `pf`)."""
    return int(config.get("pf", OPTIONAL_KNOBS["pf"]))


def _at_least(choices: tuple[int, ...], value: int) -> int:
    """The smallest choice >= value (the largest choice when none is)."""
    return next((c for c in choices if c >= value), choices[-1])


def panel_vectors(vectors: int, registers: int, const_b: bool = False) -> int:
    """The register tile's vectors of columns for an output row of `vectors` vectors: 4
    with 32 registers (with 16: 3 for a constant B, else 2), unless the last panel would
    be computed more than a tenth empty; then the width among 4, 3, 2 (3, 2, 1 or 2, 1)
    that wastes least. ConvNeXt's 3136x384 @ 384x96 (6 vectors: panels of 4 and 2) ran at
    163 GFLOP/s with 4, 219-224 with 3 or 2 (2-core Zen 4 VM, 2026-11-29, the register
    tiles' order shuffled per round). With 16 registers a 4 x 3 tile (12 accumulators, 3
    + 4 loads per 12 FMAs; all 16 registers, none spilled in `gcc -S`) ran the constant-B
    products of `scripts/bench_micro_gemm.py`'s models 1.035x faster than 6 x 2 in the
    median (0.98-1.14x; BERT's FFN down 1.04-1.14x in three runs) on two threads of an
    AVX2 host, the two alternating in one process; on attention's batched products of a
    variable B (K or N of 64) it ran 0.84-1.07x, so those keep 6 x 2."""
    if registers >= 32:
        widths = (4, 3, 2)
    else:
        widths = (3, 2, 1) if const_b else (2, 1)
    widths = tuple(w for w in widths if w <= vectors) or (vectors,)

    def waste(width: int) -> float:
        return -(-vectors // width) * width / vectors - 1

    if waste(widths[0]) <= 0.1:
        return widths[0]
    return min(widths, key=waste)


def default_config(g: GemmGeometry, isa_name: str | None = None) -> dict:
    """The untuned build's config: the widest usable ISA; 6 rows x 4 vectors with 32
    registers, 4 x 3 with 16 for a constant B and 6 x 2 otherwise (fewer vectors where a
    row's vectors leave the last panel part-empty, `panel_vectors`; rows as many as the
    registers hold, at most 8; fewer rows for short products); k passes whose panel slice
    fits `PANEL_BYTES`; units of every row tile and as many panels as leave about
    `TARGET_UNITS` units of at least `UNIT_FLOPS` each (fewer rows only when the columns
    run out). Every knob is one of its choices."""
    isa: Isa = ISAS[isa_name] if isa_name else usable_isas()[0]
    nv = panel_vectors(g.vectors(isa.lanes), isa.registers, g.const_b)
    mr = max(r for r in MR_CHOICES if tile_registers(nv, r) <= isa.registers and r <= 8)
    mr = max(r for r in MR_CHOICES if r <= min(mr, g.m))
    nr = nv * isa.lanes
    kc = max([c for c in KC_CHOICES if c * nr * 4 <= PANEL_BYTES] or [KC_CHOICES[0]])
    row_tiles, panels = -(-g.m // mr), -(-g.n // nr)
    mb, nb = _at_least(MB_CHOICES, row_tiles), _at_least(NB_CHOICES, panels)

    def units(mb_: int, nb_: int) -> int:
        return g.batch * -(-row_tiles // mb_) * -(-panels // nb_)

    target = min(TARGET_UNITS, max(1, g.flops // UNIT_FLOPS))
    # split the columns first: a unit of all rows streams its panels of B once, where
    # units of fewer rows would each read B again (it outgrows L2 in BERT's FFN)
    while units(mb, nb) < target and nb > 1:
        nb //= 2
    while units(mb, nb) < target and mb > 1:
        mb //= 2
    # then fewer rows per unit where that evens out the cores' shares: ViT's 197 tokens are
    # 33 row tiles, one block of them 9 units for 2 cores (204 GFLOP/s), blocks of 16 tiles
    # 27 units, 9 of them small (221)
    best = mb
    for fewer in (mb // 2, mb // 4):
        if fewer >= 1 and g.flops >= UNIT_FLOPS * units(fewer, nb) and \
                busy_share(g.batch, row_tiles, fewer, panels, nb) > \
                busy_share(g.batch, row_tiles, best, panels, nb) + 0.02:
            best = fewer
    return {"isa": isa.name, "mr": mr, "nv": nv, "kc": kc, "mb": best, "nb": nb, "unroll": 4}


def busy_share(batch: int, row_tiles: int, mb: int, panels: int, nb: int,
                cores: int | None = None) -> float:
    """The share of the cores' time the kernel's units keep busy when each is handed, in
    the kernel's order, to whichever core is free first (`schedule(dynamic, 1)`), a unit
    taking as long as its tiles; 1 for more units than a few per core."""
    cores = cores or os.cpu_count() or 1
    rows = [min(mb, row_tiles - r) for r in range(0, row_tiles, mb)]
    cols = [min(nb, panels - c) for c in range(0, panels, nb)]
    work = [r * c for r in rows for c in cols] * batch
    if len(work) > 64 * cores:
        return 1.0
    finish = [0] * cores
    for tiles in work:
        heapq.heapreplace(finish, finish[0] + tiles)
    return sum(work) / (cores * max(finish))


class GemmSpace:
    """The config space of one workload's GEMM micro-kernel (a schedule template's
    interface: `space()`, `validate(config)`, `default_config()`)."""

    def __init__(self, geometry: GemmGeometry, isas: tuple[str, ...] | None = None):
        self.geometry = geometry
        self.isas = isas or tuple(i.name for i in usable_isas())
        self.name = "micro.gemm"

    def space(self) -> dict[str, tuple]:
        """Knob -> choices."""
        return {"isa": self.isas, "mr": MR_CHOICES, "nv": NV_CHOICES, "kc": KC_CHOICES,
                "mb": MB_CHOICES, "nb": NB_CHOICES, "unroll": UNROLL_CHOICES, "pf": PF_CHOICES}

    def validate(self, config) -> str | None:
        """None when `config` builds a correct kernel on this host, else why not."""
        return config_reason(self.geometry, config)

    def default_config(self) -> dict:
        """The preferred config at the widest ISA of the space."""
        return default_config(self.geometry, self.isas[0])
