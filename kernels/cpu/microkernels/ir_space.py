"""What the fused inverted-residual kernel computes (`BlockGeometry`) and its config space.

    geometry = block_geometry(workload)   # BlockGeometry, or a str saying why it does not fit
    space = BlockSpace(geometry)          # space(), validate(config), default_config()

A config is `{"isa": name, "rows": output rows per strip (0: as many strips as threads),
"rt": output rows per row tile, "kv1"/"px1": vectors of expanded channels x pixels
per register tile of the expand conv, "kv2"/"px2": vectors of output channels x
pixels per register tile of the project conv, "cbt": input blocks per pass of a
1x1 conv}`. The kernel walks a
strip of output rows a row tile at a time, computing each row of the expanded
tensor once per strip as the depthwise needs it (the halo rows of the previous
tile are kept), so a strip recomputes only the K - S halo rows above it: fewer,
taller strips recompute less, more strips share the cores better. Taller row
tiles give the two 1x1 convs longer runs of pixels per pass over their weights,
and need a larger buffer. `kv1` x `px1` and `kv2` x `px2` are the register tiles
of the two 1x1 convs (kv x px accumulators in vector registers); the 1x1 convs
reduce over their input channels in passes of `cbt` blocks (partial sums kept in
the destination), so a pass's weights stay in L1 while it sweeps the row tile's
pixels. `BlockSpace` has the interface of a DSL schedule template, so the GA/RL
tuners of `wpk.search` search it.
"""

from __future__ import annotations

from dataclasses import dataclass

from wpk.core.workload import Workload
from wpk.kernels.cpu.inverted_residual_spec import inverted_residual_reason
from wpk.kernels.cpu.microkernels.isa import ISAS, Isa, isa_named, usable_isas

KNOBS = ("isa", "rows", "rt", "kv1", "px1", "kv2", "px2", "cbt")
ROWS_CHOICES = (0, 1, 2, 4, 7, 8, 14, 16, 28, 56)
RT_CHOICES = (1, 2, 3, 4, 5, 7, 8, 14)
# An untuned build's row tile gives each 1x1 conv run at least this many pixels, so the
# weights it streams through the cache serve that many pixels
RUN_PIXELS = 48
KV_CHOICES = (1, 2, 3, 4, 6, 8)
PX_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12)
CBT_CHOICES = (1, 2, 4, 8, 16, 32, 64)
# A pass over CBT input blocks keeps its weights in L1 when they take at most this many bytes
PASS_BYTES = 32 * 1024


@dataclass(frozen=True)
class BlockGeometry:
    """A fused block as the kernel sees it: sizes, blocks and the parts' epilogues."""

    n: int
    cb: int              # input channel blocks
    h: int
    w: int
    kbe: int             # expanded channel blocks
    kbo: int             # output channel blocks
    oh: int
    ow: int
    k: int
    s: int
    pt: int
    pl: int
    block: int
    in_channels: int
    expanded: int
    out_channels: int
    act1: tuple          # (step name or '', ((attr, value), ...))
    act2: tuple
    biases: tuple[bool, bool, bool]
    residual: bool
    expand: bool = True  # False: expansion 1, the depthwise reads X
    squeezed: int = 0    # the gate's reduced channels (0: no squeeze-excitation gate)
    se_act1: tuple = ("", ())
    se_act2: tuple = ("", ())

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of the real channels of the three convs."""
        out_pixels = self.n * self.oh * self.ow
        expand = self.n * self.h * self.w * self.in_channels * self.expanded if self.expand \
            else 0
        return 2 * (expand + out_pixels * self.expanded * (self.k * self.k + self.out_channels)
                    + self.n * self.expanded * self.squeezed * 2)


def block_geometry(workload: Workload) -> BlockGeometry | str:
    """The geometry of a well-formed fused block, or why it has none."""
    reason = inverted_residual_reason(workload)
    if reason:
        return reason
    attrs = dict(workload.attrs)
    x, y = workload.inputs[0].shape, workload.outputs[0].shape
    pt, pl = (int(p) for p in attrs["pads"][:2])
    k, s = int(attrs["kernel"]), int(attrs["stride"])
    b = int(attrs["block"])
    return BlockGeometry(
        n=x[0], cb=x[1], h=x[2], w=x[3], kbe=-(-int(attrs["expanded"]) // b), kbo=y[1],
        oh=y[2], ow=y[3], k=k, s=s, pt=pt, pl=pl, block=b,
        in_channels=workload.inputs[3].shape[0] if workload.inputs[1] is None
        else workload.inputs[1].shape[1], expanded=int(attrs["expanded"]),
        out_channels=int(attrs["channels"]),
        act1=(attrs["act1"], tuple(attrs.get("act1_attrs", ()))),
        act2=(attrs["act2"], tuple(attrs.get("act2_attrs", ()))),
        biases=tuple(workload.inputs[i] is not None for i in (2, 4, 6)),
        residual=bool(attrs.get("residual", 0)), expand=workload.inputs[1] is not None,
        squeezed=int(attrs.get("squeezed", 0)) if attrs.get("se", 0) else 0,
        se_act1=(attrs.get("se_act1", ""), tuple(attrs.get("se_act1_attrs", ()))),
        se_act2=(attrs.get("se_act2", ""), tuple(attrs.get("se_act2_attrs", ()))))


def tile_registers(kv: int, px: int) -> int:
    """Vector registers a kv x px tile of a 1x1 conv keeps live: accumulators, one input
    channel's weight vectors and one broadcast."""
    return kv * px + kv + 1


def config_reason(geometry: BlockGeometry, config) -> str | None:
    """None when `config` is a valid schedule of `geometry` on this host, else why not."""
    if set(config) != set(KNOBS):
        return f"a fused-block config has the knobs {', '.join(KNOBS)}"
    try:
        isa = isa_named(str(config["isa"]))
    except ValueError as exc:
        return str(exc)
    rows, rt, kv1, px1, kv2, px2, cbt = (int(config[k]) for k in KNOBS[1:])
    if geometry.block % isa.lanes:
        return f"the block {geometry.block} is not a multiple of {isa.name}'s {isa.lanes} lanes"
    if rows < 0 or min(rt, kv1, px1, kv2, px2, cbt) < 1 or max(px1, px2) > max(PX_CHOICES):
        return (f"rows >= 0 (0: one strip per thread), rt, kv1, px1, kv2, px2, cbt >= 1, "
                f"px <= {max(PX_CHOICES)}")
    lanes = geometry.block // isa.lanes
    for name, kv, px, blocks in (("kv1", kv1, px1, geometry.kbe),
                                 ("kv2", kv2, px2, geometry.kbo)):
        if (blocks * lanes) % kv:
            return f"{name} {kv} does not divide the {blocks * lanes} vectors it tiles"
        if tile_registers(kv, px) > isa.registers:
            return f"a {kv}x{px} tile needs more than {isa.name}'s {isa.registers} registers"
    return None


def register_tile(vectors: int, isa: Isa) -> tuple[int, int]:
    """(kv, px) of a 1x1 conv's default tile, kv dividing `vectors`: the most FMAs per input
    channel less half the loads they need (kv + px), within the registers less two with 32
    (gcc spills a tile that takes all of them: checked with `gcc -S`, a 3 x 9 tile on 32)
    and less one with 16: a 2 x 6 tile (15 registers) kept every vector in registers in
    MobileNet-v2's blocks (`gcc -S`, AVX2), and against the 2 x 5 tile the limit of two left
    the blocks ran 1.06x faster in the median over MobileNet-v2's (0.88-1.09x), 1.03x over
    EfficientNet-B0's (0.89-1.08x) and 1.00x over MobileNetV3-small's (0.78-1.12x) on two
    threads of an AVX2 host (old and new tiles alternating in one process)."""
    spare = 2 if isa.registers >= 32 else 1
    tiles = [(k, p) for k in KV_CHOICES for p in PX_CHOICES if vectors % k == 0
             and tile_registers(k, p) <= isa.registers - spare]
    return max(tiles, key=lambda t: (t[0] * t[1] - (t[0] + t[1]) / 2, t[0]))


def default_config(geometry: BlockGeometry, isa_name: str | None = None) -> dict:
    """The untuned build's config: the widest usable ISA, one strip per thread, row tiles of
    at least `RUN_PIXELS` pixels, the register tile of each 1x1 conv with the most
    accumulators (`register_tile`) and passes of as many input blocks as keep their weights
    within `PASS_BYTES`."""
    isa = ISAS[isa_name] if isa_name else next(
        i for i in usable_isas() if geometry.block % i.lanes == 0)
    lanes = geometry.block // isa.lanes
    kv1, px1 = register_tile(geometry.kbe * lanes, isa)
    kv2, px2 = register_tile(geometry.kbo * lanes, isa)
    block_bytes = geometry.block * max(kv1, kv2) * isa.lanes * 4   # one input block's weights
    return {"isa": isa.name, "rows": 0,
            "rt": max(1, min(geometry.oh, -(-RUN_PIXELS // geometry.ow))), "kv1": kv1,
            "px1": px1, "kv2": kv2, "px2": px2,
            "cbt": max(c for c in CBT_CHOICES if c == 1 or c * block_bytes <= PASS_BYTES)}


class BlockSpace:
    """The config space of one fused block (a schedule template's interface)."""

    def __init__(self, geometry: BlockGeometry, isas: tuple[str, ...] | None = None):
        self.geometry = geometry
        self.isas = isas or tuple(i.name for i in usable_isas()
                                  if geometry.block % i.lanes == 0)
        self.name = "micro.inverted_residual"

    def space(self) -> dict[str, tuple]:
        """Knob -> choices."""
        rows = tuple(r for r in ROWS_CHOICES if r <= self.geometry.oh)
        return {"isa": self.isas, "rows": rows, "rt": RT_CHOICES, "kv1": KV_CHOICES,
                "px1": PX_CHOICES, "kv2": KV_CHOICES, "px2": PX_CHOICES, "cbt": CBT_CHOICES}

    def validate(self, config) -> str | None:
        """None when `config` builds a correct kernel on this host, else why not."""
        return config_reason(self.geometry, config)

    def default_config(self) -> dict:
        """The preferred config at the host's widest ISA (see `default_config`)."""
        return default_config(self.geometry, self.isas[0] if self.isas else None)
