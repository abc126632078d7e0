"""The inverted-residual block on the CUDA target: loop IR with the expanded tensor on chip.

    config = {"tile": 4, "ec": 16, "threads": 128, "cs": 1}
    reason = irb_config_reason(workload, config, gpu)    # None if it fits the preset
    func = lower_irb(workload, config)                   # loop IR (cuda)

One block computes a `tile` x `tile` tile of output pixels of one image for
its share of the output channels (`cs` blocks split them; each recomputes the
tile's expanded values, which buys parallelism where an image has few tiles).
It stages the input patch the tile needs (all input channels) in shared memory
once, then walks the expanded channels in chunks
of `ec`: the block computes the chunk's expanded values H1 = act1(W1 X + B1)
over the patch into shared memory (zero outside the image: the depthwise
conv's padding) from the chunk's expand weights, staged in shared memory with
its project weights, the depthwise H2 = act2(dw(H1) + B2) over the tile into
shared memory, and each thread adds the chunk's share of the project conv
into its accumulators (output channel x pixel pairs, in registers). H1 and H2
never reach global memory; Y = acc + B3 [+ X] is written once. Activations
are the epilogue table's formulas, built as loop IR.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from wpk.core.epilogue import Builder, step_value
from wpk.core.workload import Workload
from wpk.dsl import loopir as L
from wpk.kernels.cpu.inverted_residual_spec import activation_step
from wpk.kernels.cuda.irb_spec import depthwise_size

KNOBS = {"tile": (1, 2, 4, 8), "ec": (8, 16, 32), "threads": (64, 128, 256),
         "cs": (1, 2, 4)}
BLOCK_TARGET = 256           # blocks a grid should have for a big GPU (assumption)
MAX_ACCUMULATORS = 64        # output (channel, pixel) pairs a thread keeps in registers
REGISTER_ALLOWANCE = 40
FLOAT_BYTES = 4
NAMES = ("X", "W1", "B1", "W2", "B2", "W3", "B3")


class _LoopBuilder(Builder[L.Expr]):
    """Epilogue formulas as float32 loop-IR expressions."""

    _OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "pow", "max": "max",
            "min": "min"}

    def const(self, value: float) -> L.Expr:
        return L.const(float(value), "f32")

    def binary(self, op: str, a: L.Expr, b: L.Expr) -> L.Expr:
        return L.Bin(self._OPS[op], a, b, "f32")

    def call(self, fn: str, x: L.Expr) -> L.Expr:
        if fn == "log1p":
            return L.Call("log", (self.add(self.const(1.0), x),))
        return L.Call(fn, (x,))

    def less(self, a: L.Expr, b: L.Expr) -> L.Expr:
        return L.Bin("<", a, b, "bool")

    def select(self, cond: L.Expr, a: L.Expr, b: L.Expr) -> L.Expr:
        return L.Select(cond, a, b)


def activation(attrs: Mapping, which: str, value: L.Expr) -> L.Expr:
    """`value` through the block's activation `which` ('act1' or 'act2'), if any."""
    for step in activation_step(attrs[which], attrs.get(f"{which}_attrs", ())):
        value = step_value(_LoopBuilder(), step, value)
    return value


class IrbShape:
    """The sizes of one block workload."""

    def __init__(self, workload: Workload):
        attrs = dict(workload.attrs)
        self.attrs = attrs
        self.n, self.cin, self.h, self.w = workload.inputs[0].shape
        self.e, self.cout = int(attrs["expanded"]), int(attrs["channels"])
        self.k, self.s = int(attrs["kernel"]), int(attrs["stride"])
        self.pt, self.pl = int(attrs["pads"][0]), int(attrs["pads"][1])
        self.oh, self.ow = depthwise_size(attrs, self.h, self.w)
        self.residual = bool(attrs.get("residual", 0))
        self.biases = tuple(workload.inputs[i] is not None for i in (2, 4, 6))

    def patch(self, tile: int) -> int:
        """Input pixels along one side of a tile's patch."""
        return (tile - 1) * self.s + self.k


def shared_bytes(shape: IrbShape, config: Mapping) -> int:
    """The input patch (every input channel), one chunk of H1 and H2, and the chunk's
    expand and project weights."""
    pp, tp, ec = shape.patch(config["tile"]) ** 2, config["tile"] ** 2, config["ec"]
    return FLOAT_BYTES * (shape.cin * pp + ec * (pp + tp + shape.cin
                                                 + block_channels(shape, config)))


def block_channels(shape: IrbShape, config: Mapping) -> int:
    """Output channels one block computes (`cs` blocks share a tile's channels)."""
    return math.ceil(shape.cout / config.get("cs", 1))


def accumulators(shape: IrbShape, config: Mapping) -> int:
    """Output (channel, pixel) pairs a thread accumulates."""
    return math.ceil(block_channels(shape, config) * config["tile"] ** 2 / config["threads"])


def irb_config_reason(workload: Workload, config: Mapping, gpu) -> str | None:
    """None when `config` is a valid schedule for `gpu`, else why not."""
    for knob, values in KNOBS.items():
        if config.get(knob) not in values:
            return f"{knob} must be one of {values}"
    shape = IrbShape(workload)
    smem = shared_bytes(shape, config)
    if smem > gpu.shared_memory_per_block:
        return f"{smem} bytes of shared memory exceed the {gpu.name} limit of " \
               f"{gpu.shared_memory_per_block}"
    acc = accumulators(shape, config)
    if acc > MAX_ACCUMULATORS:
        return f"{acc} accumulators per thread exceed {MAX_ACCUMULATORS}"
    if (acc + REGISTER_ALLOWANCE) * config["threads"] > gpu.registers_per_block:
        return f"about {acc + REGISTER_ALLOWANCE} registers x {config['threads']} threads " \
               "exceed the register file"
    return None


def irb_space(workload: Workload) -> list[dict]:
    """Every point, preferred first: little tile padding, few accumulators, no channel
    split (each split recomputes the tile's expanded values), more blocks (BLOCK_TARGET),
    128 threads, chunks of 16, big tiles (less halo recomputed)."""
    shape = IrbShape(workload)

    def rank(p):
        tiles = math.ceil(shape.oh / p["tile"]) * math.ceil(shape.ow / p["tile"])
        waste = tiles * p["tile"] ** 2 - shape.oh * shape.ow
        blocks = tiles * shape.n * p["cs"]
        return (waste > shape.oh * shape.ow // 4, accumulators(shape, p) > 16, p["cs"],
                -min(blocks, BLOCK_TARGET) // 64, abs(p["threads"] - 128),
                abs(p["ec"] - 16), -p["tile"])

    points = [{"tile": t, "ec": e, "threads": n, "cs": cs} for t in KNOBS["tile"]
              for e in KNOBS["ec"] for n in KNOBS["threads"] for cs in KNOBS["cs"]]
    return sorted(points, key=rank)


def _each(count: int, threads: int, t: L.Var, name: str, body) -> L.Stmt:
    """Element e = i*threads + t of `count` for every thread: `body(e)` (guarded)."""
    i = L.Var(f"{name}_i")
    e = L.add(L.mul(i, threads), t)
    stmt = body(e)
    if count % threads:
        stmt = L.IfThenElse(L.binary("<", e, count), stmt)
    return L.For(i, math.ceil(count / threads), stmt)


def _f(value) -> L.Expr:
    return L.const(float(value), "f32")


def _fadd(a, b) -> L.Expr:
    return L.Bin("+", a, b, "f32")


def _fmul(a, b) -> L.Expr:
    return L.Bin("*", a, b, "f32")


def _all(*conds) -> L.Expr:
    return L.logical_and([c for c in conds if c is not None])


def lower_irb(workload: Workload, config: Mapping) -> L.PrimFunc:
    """The CUDA loop IR of a block workload under `config` (see the module docstring)."""
    sh = IrbShape(workload)
    tile, ec, threads = int(config["tile"]), int(config["ec"]), int(config["threads"])
    side, tp = sh.patch(tile), tile * tile
    pp = side * side
    tiles_x = math.ceil(sh.ow / tile)
    n, blk, t = L.Var("n"), L.Var("tile"), L.Var("t")
    oy0, ox0 = L.mul(L.binary("//", blk, tiles_x), tile), L.mul(L.binary("%", blk, tiles_x), tile)
    iy0, ix0 = L.binary("-", L.mul(oy0, sh.s), sh.pt), L.binary("-", L.mul(ox0, sh.s), sh.pl)

    def in_image(pix):
        iy = L.add(iy0, L.binary("//", pix, side))
        ix = L.add(ix0, L.binary("%", pix, side))
        inside = _all(L.binary(">=", iy, 0), L.binary("<", iy, sh.h), L.binary(">=", ix, 0),
                      L.binary("<", ix, sh.w))
        return inside, iy, ix

    def stage_x(e):
        ci, pix = L.binary("//", e, pp), L.binary("%", e, pp)
        inside, iy, ix = in_image(pix)
        load = L.Load("X", ((n * sh.cin + ci) * sh.h + iy) * sh.w + ix)
        return L.Store("xs", e, L.Select(inside, load, _f(0)))

    ch, ci = L.Var("ch"), L.Var("ci")
    e0 = L.mul(ch, ec)

    def bias(index, channel):
        return L.Load(NAMES[index], channel) if sh.biases[(index - 2) // 2] else _f(0)

    def expand(e):
        c, pix = L.binary("//", e, pp), L.binary("%", e, pp)
        eg = L.add(e0, c)
        inside, _, _ = in_image(pix)
        valid = _all(inside, L.binary("<", eg, sh.e))
        dot = L.For(ci, sh.cin, L.Store("a", L.const(0), _fadd(L.Load("a", L.const(0)), _fmul(
            L.Load("w1s", c * sh.cin + ci), L.Load("xs", ci * pp + pix)))))
        h1 = activation(sh.attrs, "act1", _fadd(L.Load("a", L.const(0)), bias(2, eg)))
        return L.seq(L.Store("a", L.const(0), _f(0)),
                     L.IfThenElse(L.binary("<", eg, sh.e), dot),
                     L.Store("h1s", e, L.Select(valid, h1, _f(0))))

    ky, kx = L.Var("ky"), L.Var("kx")

    def depthwise(e):
        c, p = L.binary("//", e, tp), L.binary("%", e, tp)
        eg = L.add(e0, c)
        py, px = L.binary("//", p, tile), L.binary("%", p, tile)
        tap = L.add(L.mul(L.add(L.mul(py, sh.s), ky), side), L.add(L.mul(px, sh.s), kx))
        dot = L.For(ky, sh.k, L.For(kx, sh.k, L.Store("a", L.const(0), _fadd(
            L.Load("a", L.const(0)), _fmul(L.Load("W2", (eg * sh.k + ky) * sh.k + kx),
                                           L.Load("h1s", c * pp + tap)))), "unroll"), "unroll")
        h2 = activation(sh.attrs, "act2", _fadd(L.Load("a", L.const(0)), bias(4, eg)))
        return L.seq(L.Store("a", L.const(0), _f(0)),
                     L.IfThenElse(L.binary("<", eg, sh.e), dot),
                     L.Store("h2s", e, L.Select(L.binary("<", eg, sh.e), h2, _f(0))))

    r, c, z = L.Var("r"), L.Var("c"), L.Var("z")
    racc, per = accumulators(sh, config), block_channels(sh, config)
    o = L.add(L.mul(r, threads), t)
    cl, p = L.binary("//", o, tp), L.binary("%", o, tp)
    co = L.add(L.mul(z, per), cl)
    mine = _all(L.binary("<", o, per * tp), L.binary("<", co, sh.cout))
    w3 = L.Load("w3s", cl * ec + c)

    def stage_w1(e):
        inside = L.binary("<", L.add(L.mul(e0, sh.cin), e), sh.e * sh.cin)
        return L.Store("w1s", e, L.Select(inside, L.Load("W1", L.add(L.mul(e0, sh.cin), e)),
                                          _f(0)))

    def stage_w3(e):
        row, col = L.add(L.mul(z, per), L.binary("//", e, ec)), L.add(e0, L.binary("%", e, ec))
        inside = _all(L.binary("<", row, sh.cout), L.binary("<", col, sh.e))
        return L.Store("w3s", e, L.Select(inside, L.Load("W3", row * sh.e + col), _f(0)))

    project = L.For(r, racc, L.IfThenElse(mine, L.For(
        c, ec, L.Store("acc", r, _fadd(L.Load("acc", r), _fmul(w3, L.Load("h2s", c * tp + p)))))),
        "unroll")
    chunks = L.For(ch, math.ceil(sh.e / ec), L.seq(
        L.Barrier(), _each(ec * sh.cin, threads, t, "w1", stage_w1),
        _each(per * ec, threads, t, "w3", stage_w3), L.Barrier(),
        _each(ec * pp, threads, t, "h1", expand), L.Barrier(),
        _each(ec * tp, threads, t, "h2", depthwise), L.Barrier(), project))
    oy, ox = L.add(oy0, L.binary("//", p, tile)), L.add(ox0, L.binary("%", p, tile))
    value = _fadd(L.Load("acc", r), bias(6, co))
    if sh.residual:
        value = _fadd(value, L.Load("X", ((n * sh.cin + co) * sh.h + oy) * sh.w + ox))
    write = L.For(r, racc, L.IfThenElse(
        _all(mine, L.binary("<", oy, sh.oh), L.binary("<", ox, sh.ow)),
        L.Store("Y", ((n * sh.cout + co) * sh.oh + oy) * sh.ow + ox, value)), "unroll")
    buffers = [L.Buffer("xs", "f32", (sh.cin * pp,), "shared"),
               L.Buffer("h1s", "f32", (ec * pp,), "shared"),
               L.Buffer("h2s", "f32", (ec * tp,), "shared"),
               L.Buffer("w1s", "f32", (ec * sh.cin,), "shared"),
               L.Buffer("w3s", "f32", (per * ec,), "shared"),
               L.Buffer("acc", "f32", (racc,), "local"), L.Buffer("a", "f32", (1,), "local")]
    body = L.seq(*(L.Allocate(b) for b in buffers), _each(sh.cin * pp, threads, t, "x", stage_x),
                 L.For(r, racc, L.Store("acc", r, _f(0)), "unroll"), L.Barrier(), chunks, write)
    grid = math.ceil(sh.oh / tile) * tiles_x
    body = L.For(z, int(config.get("cs", 1)), L.For(n, sh.n, L.For(blk, grid, L.For(
        t, threads, body, "threadIdx.x"), "blockIdx.x"), "blockIdx.y"), "blockIdx.z")
    params = [L.Buffer(NAMES[i], "f32", tuple(s.shape))
              for i, s in enumerate(workload.inputs) if s is not None]
    params.append(L.Buffer("Y", "f32", tuple(workload.outputs[0].shape)))
    kernel = L.Kernel("wpk_inverted_residual", body, tuple(b.name for b in params))
    return L.PrimFunc("wpk_inverted_residual", tuple(params), (), (), (kernel,), "cuda",
                      meta={"outputs": ("Y",)})


def irb_feeds(workload: Workload) -> dict[str, int]:
    """Parameter name -> the step's input index."""
    return {NAMES[i]: i for i, s in enumerate(workload.inputs) if s is not None}
