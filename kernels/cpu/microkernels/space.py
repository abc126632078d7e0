"""What a micro-kernel computes (`ConvGeometry`) and the configs it can be built with.

    geometry = conv_geometry(workload)      # ConvGeometry, or a str saying why it does not fit
    conv_geometry(workload, nchw_input=True)   # also a stem's (NCHW input)
    space = MicroSpace(geometry)            # space(), validate(config), default_config()

A config is `{"isa": name, "kv": output vectors, "px": output pixels, "unroll": n,
"cbt": input blocks per pass, "split": 0 or 1, "rows": output rows per unit}`, and
optionally `"pf"` (prefetch distance in input blocks, 0 when absent):
the register tile is kv vectors of output channels (kv * lanes channels) by px
output pixels of one row, `kv * px` accumulators; a depthwise tile is one
vector of channels by px pixels (kv is 1), and so is the tile of a grouped conv whose
groups are narrower than a vector (`group_width`: ResNeXt's 4 and 8 channels a group,
RegNet's 8), each input channel of a group reaching its group's lanes by a shuffle.
`unroll` unrolls the reduction over the input channels of a block (regular convs) or
over the filter rows (depthwise). A regular conv reduces over its input channels in passes of
`cbt` blocks (partial sums kept in the output), so the weights of a pass stay
in L1 while every tile of a row segment uses them; a parallel unit covers `rows`
output rows (the pass loop outside them), so on small images a pass's weights
serve more pixels. `pf` > 0 (regular convs) has each tap of a tile prefetch the
input pixels it reads `pf` blocks further along the reduction (another plane of
the blocked input, a stride the hardware prefetchers follow late). `split` 1
(strided regular convs, and padded KxK ones) phase-splits the input first
(space-to-depth with the padding made explicit, per call into a scratch buffer),
so every filter tap reads contiguous pixels of one phase and no tile checks the
image's edges; a strided 1x1 conv becomes a subsample followed by a flattened 1x1
conv, a stride-1 conv's one phase is its input with the padding written out (its
edge pixels then run in full tiles instead of one-pixel checked ones).

The input is blocked (N, CB, H, W, block), or NCHW (N, C, H, W) for a
network's first conv (`nchw_input`: 3 or 1 channels, each a "block" of one
input channel, so the same tile reads it). `MicroSpace` has the
interface of a DSL schedule template (`space()`, `validate(config)`,
`default_config()`), so the GA/RL tuners of `wpk.search` search it as they
search generated DSL kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from wpk.core.epilogue import FAKE_QUANT, epilogue_op
from wpk.core.workload import Workload
from wpk.kernels.cpu.microkernels.isa import ISAS, Isa, isa_named, usable_isas
from wpk.kernels.cpu.nchwc import activation_attrs, conv_epilogue_form
from wpk.kernels.cpu.window import pads_2d
from wpk.kernels.nchwc_format import GROUP_WIDTH, SPARSE_GROUPS, group_band
from wpk.kernels.nchwc_logical import NCHWC_DOMAIN, is_depthwise, logical_workload

KV_CHOICES = (1, 2, 3, 4, 6, 8)
PX_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
UNROLL_CHOICES = (1, 2, 4, 8, 16)
CBT_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
# A pass over CBT input blocks keeps its weights in L1 when they take at most this many bytes
PASS_BYTES = 32 * 1024
# A strided conv's default unit covers about this many output pixels (rows of a small output)
UNIT_PIXELS = 100
# ... and phase-splits rows of at most this many output pixels
SPLIT_ROW = 16
# A depthwise conv's default tile: at most this many pixels wide, units of this many rows
DEPTHWISE_PX = 8
DEPTHWISE_ROWS = 7
# ... and a strided conv of narrow groups': this many pixels on rows of at least this many
NARROW_STRIDED_PX = 4
NARROW_STRIDED_ROW = 28
# A dense conv of sparse groups' default tile: two vectors by at most this many pixels
SPARSE_PX = 8
# A padded stride-1 KxK conv's default unit (16 registers): this many output rows
PADDED_ROWS = 7
ROWS_CHOICES = (1, 2, 4, 7, 8, 14, 16, 28)
PF_CHOICES = (0, 1, 2, 4)
KNOBS = ("isa", "kv", "px", "unroll", "cbt", "split", "rows")
# Knobs a config may leave out, and their values then (configs and records written before
# the knob existed stay valid and build the same kernel)
OPTIONAL_KNOBS = {"pf": 0}
# The MLAS activations the epilogue computes (their ONNX names, as `activation_attrs` gives)
ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "HardSigmoid", "Sigmoid", "Tanh")
# ... and those MLAS has no form of (wpk step name -> the name the epilogue knows)
# The parameters of `fake_quant` as `templates.activation_lines` takes them, in order
FAKE_QUANT_PARAMS = ("scale", "zero_point", "low", "high")
VECTOR_ACTIVATIONS = {"silu": "Silu", "hard_swish": "HardSwish", "gelu": "Gelu",
                      "quick_gelu": "QuickGelu", "mish": "Mish"}


@dataclass(frozen=True)
class ConvGeometry:
    """A blocked convolution as the micro-kernel sees it (sizes in pixels and blocks).

    A 1x1 stride-1 unpadded conv is one row of H*W pixels (`flattened`), so its
    tiles never stop at a row's end. With an NCHW input (`nchw_input`) `cb` counts
    input channels, each a block of one (`in_block`).
    """

    n: int
    cb: int            # input channel blocks
    h: int
    w: int
    kb: int            # output channel blocks
    oh: int
    ow: int
    r: int
    s: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int
    block: int
    in_channels: int   # real input channels (the filter's), <= cb * block
    out_channels: int  # real output channels, <= kb * block
    depthwise: bool
    has_bias: bool
    sum_index: int | None
    activation: str | None
    activation_params: tuple[float, ...] = ()
    flattened: bool = False
    nchw_input: bool = False
    groups: int = 1    # of a grouped regular conv (a depthwise conv counts 1, and a
    #                    narrow-group one: its groups lie within vectors)
    group_width: int = 0   # channels per group of a conv whose groups are narrower than
    #                        a block (2-8), 0 otherwise
    sparse_groups: int = 0   # the group count of a dense conv whose filter is zero outside
    #                          groups that are not whole blocks (`SPARSE_GROUPS`), else 0

    @property
    def within_vector(self) -> bool:
        """Whether each output vector reduces over the input vector at the same channels
        only (a depthwise conv, or one of narrow groups): such convs run one vector of
        channels per tile."""
        return self.depthwise or self.group_width > 0

    @property
    def taps_width(self) -> int:
        """Input channels each output channel of a `within_vector` conv reduces over (1
        for a depthwise conv)."""
        return max(1, self.group_width)

    def fits_lanes(self, lanes: int) -> bool:
        """Whether vectors of `lanes` floats hold whole groups (every conv but a
        narrow-group one: any)."""
        return lanes % self.taps_width == 0

    @property
    def in_block(self) -> int:
        """Floats per input pixel and channel block: the block, or 1 for an NCHW input."""
        return 1 if self.nchw_input else self.block

    @property
    def strided(self) -> bool:
        """Whether the conv has a stride above 1 (a phase split applies)."""
        return self.sh > 1 or self.sw > 1

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of the real channels."""
        reduction = self.r * self.s * self.in_channels   # the filter's: one group's
        reduction //= max(1, self.sparse_groups)          # ... of sparse groups, too
        return 2 * self.n * self.out_channels * self.oh * self.ow * reduction

    def out_vectors(self, lanes: int) -> int:
        """Vectors of output channels in the blocked output."""
        return self.kb * self.block // lanes

    def group_vectors(self, lanes: int) -> int:
        """Vectors of output channels of one group (all of them when not grouped): a
        tile's height divides it, so no tile straddles two groups."""
        return self.out_vectors(lanes) // self.groups

    @property
    def reduction_blocks(self) -> int:
        """Input blocks an output channel reduces over: its group's, or all of them (at
        most, for sparse groups: `tile_bands`)."""
        return self.in_channels // self.in_block if self.groups > 1 else self.cb

    def tile_bands(self, lanes: int, kv: int) -> list[tuple[int, int]]:
        """(first input block, block count) each tile of kv vectors of output channels
        reduces over: its group's blocks (`GROUP_BASE`), all of them, or for sparse
        groups the band of blocks that hold its output channels' groups (`group_band`)."""
        tiles = -(-self.out_vectors(lanes) // kv)
        tk = kv * lanes
        if not self.sparse_groups:
            per_group = self.group_vectors(lanes) * lanes
            blocks = self.reduction_blocks
            return [(t * tk // per_group * blocks if self.groups > 1 else 0, blocks)
                    for t in range(tiles)]
        return [group_band(t * tk, (t + 1) * tk, self.in_channels, self.out_channels,
                           self.sparse_groups, self.in_block) for t in range(tiles)]


def step_activation(step) -> tuple[str | None, tuple[float, ...]] | str:
    """(name, parameters) of the activation epilogue step `step` as the vector kernels'
    `templates.activation_lines` take it ((None, ()) for no step), or why it has no
    vector form."""
    if step is None:
        return None, ()
    if step.op in VECTOR_ACTIVATIONS:   # their attributes in the row's order (QuickGelu's alpha)
        values = epilogue_op(step.op).attr_values(dict(step.attrs))
        return VECTOR_ACTIVATIONS[step.op], tuple(float(v) for v in values.values())
    if step.op == FAKE_QUANT:
        return "FakeQuant", tuple(float(step.attr(k)) for k in FAKE_QUANT_PARAMS)
    attrs = activation_attrs(step)
    if attrs["activation"] not in ACTIVATIONS:
        return f"activation {attrs['activation']} has no micro-kernel epilogue"
    return attrs["activation"], tuple(float(v) for v in attrs.get("activation_params", ()))


def conv_geometry(workload: Workload, nchw_input: bool = False) -> ConvGeometry | str:
    """The geometry of a blocked (`wpk.nchwc`) Conv on a blocked input, or why it has none;
    with `nchw_input` also on an NCHW input (a stem: `micro.nchwc` reads it, kernels built
    on this geometry for blocked inputs only keep refusing it)."""
    if workload.domain != NCHWC_DOMAIN or workload.op != "Conv":
        return "not a wpk.nchwc Conv"
    specs = [s for s in (*workload.inputs, *workload.outputs) if s is not None]
    if any(s.dtype != "float32" for s in specs):
        return "micro-kernels compute float32 only"
    x, wt, y = workload.inputs[0], workload.inputs[1], workload.outputs[0]
    if len(x.shape) not in ((4, 5) if nchw_input else (5,)) or wt is None \
            or len(wt.shape) != 4 or len(y.shape) != 5:
        return f"only 2-D convolutions on a blocked{' or NCHW' if nchw_input else ''} input"
    nchw = len(x.shape) == 4
    if nchw and int(workload.attr("group", 1)) != 1:
        return "an NCHW input is read by group-1 convolutions only"
    if 1 not in workload.const_inputs:
        return "the filter is not a constant (it is packed once)"
    has_bias = len(workload.inputs) > 2 and workload.inputs[2] is not None
    if has_bias and 2 not in workload.const_inputs:
        return "the bias is not a constant"
    if any(0 in s.shape for s in specs):
        return "empty tensors"
    depthwise = is_depthwise(workload)
    groups = 1 if depthwise else int(workload.attr("group", 1))
    width = narrow_group_width(workload)
    if isinstance(width, str):
        return width
    if width:
        groups = 1   # its groups lie within vectors: reduced like a depthwise conv's
    elif groups > 1 and (wt.shape[1] % x.shape[-1] or wt.shape[0] // groups % y.shape[-1]):
        return "a grouped conv's channels per group are not whole blocks"
    sparse = sparse_group_count(workload)
    if isinstance(sparse, str):
        return sparse
    form = conv_epilogue_form(workload)
    if isinstance(form, str):
        return form
    sum_index, step = form
    act = step_activation(step)
    if isinstance(act, str):
        return act
    found = pads_2d(logical_workload(workload), tuple(wt.shape[2:]))
    if found is None:
        return "the padding does not give the output size"
    (pt, pl, _, _), geom = found
    _, kb, oh, ow, block = y.shape
    n, cb, h, w = x.shape[:4]
    r, s = wt.shape[2:]
    (sh, sw), (dh, dw) = geom.strides, geom.dilations
    flat = (r, s, sh, sw, pt, pl, oh, ow) == (1, 1, 1, 1, 0, 0, h, w) and not depthwise \
        and not nchw and not width
    return ConvGeometry(
        n=n, cb=cb, h=1 if flat else h, w=h * w if flat else w, kb=kb, oh=1 if flat else oh,
        ow=oh * ow if flat else ow, r=r, s=s, sh=sh, sw=sw, pt=pt, pl=pl, dh=dh, dw=dw,
        block=block, in_channels=width or wt.shape[1], out_channels=wt.shape[0],
        depthwise=depthwise,
        has_bias=has_bias, sum_index=sum_index, activation=act[0], activation_params=act[1],
        flattened=flat, nchw_input=nchw, groups=groups, group_width=width,
        sparse_groups=sparse)


def sparse_group_count(workload: Workload) -> int | str:
    """The `sparse_groups` of a blocked Conv the layout pass made one dense group of
    groups that are not whole blocks (`nchwc_format.SPARSE_GROUPS`), 0 for any other, or
    why they do not fit: a group-1 conv on a blocked input, whose channels divide into them."""
    count = int(workload.attr(SPARSE_GROUPS, 0) or 0)
    if not count:
        return 0
    x, wt = workload.inputs[0], workload.inputs[1]
    if not (count > 1 and len(x.shape) == 5 and int(workload.attr("group", 1)) == 1
            and wt.shape[0] % count == 0 and wt.shape[1] % count == 0):
        return (f"{count} sparse groups need a group-1 conv on a blocked input whose input "
                "and output channels they divide")
    return count


def narrow_group_width(workload: Workload) -> int | str:
    """The `group_width` of a blocked Conv whose narrow groups the layout pass widened to
    one group per block (its filter zero outside them; `nchwc_format.GROUP_WIDTH`), 0 for
    any other Conv, or why its narrow groups do not fit: one widened group per block of
    input and of output, the width dividing the block."""
    width = int(workload.attr(GROUP_WIDTH, 0) or 0)
    if not width:
        return 0
    x, wt, y = workload.inputs[0], workload.inputs[1], workload.outputs[0]
    block, groups = y.shape[-1], int(workload.attr("group", 1))
    if not (0 < width < block and block % width == 0 and x.shape[-1] == block
            and groups == x.shape[1] == y.shape[1] and wt.shape[1] == block
            and wt.shape[0] == groups * block):
        return (f"groups of {width} channels widened to one per block need a width dividing "
                f"the block of {block} and one group per input and output block")
    return width


def accumulator_registers(geometry: ConvGeometry, isa: Isa, kv: int, px: int) -> int:
    """Vector registers the tile's inner loop keeps live: accumulators, the weights of one
    input channel (regular) or of a filter row and the input vectors of a row (depthwise),
    and one broadcast."""
    if geometry.within_vector:
        row = (px - 1) * geometry.sw + (geometry.s - 1) * geometry.dw + 1
        return px + geometry.s + min(row, 4) + (geometry.group_width > 0)   # + a shuffle
    return kv * px + kv + 1


class MicroSpace:
    """The config space of one workload's micro-kernel (a schedule template's interface)."""

    def __init__(self, geometry: ConvGeometry, isas: tuple[str, ...] | None = None):
        self.geometry = geometry
        self.isas = isas or tuple(i.name for i in usable_isas()
                                  if geometry.block % i.lanes == 0
                                  and geometry.fits_lanes(i.lanes))
        self.name = "micro.nchwc"

    def space(self) -> dict[str, tuple]:
        """Knob -> choices."""
        kv = (1,) if self.geometry.within_vector else KV_CHOICES
        cbt = (1,) if self.geometry.within_vector else CBT_CHOICES
        split = (0, 1) if splittable(self.geometry) else (0,)
        pf = (0,) if self.geometry.within_vector else PF_CHOICES
        return {"isa": self.isas, "kv": kv, "px": PX_CHOICES, "unroll": UNROLL_CHOICES,
                "cbt": cbt, "split": split, "rows": ROWS_CHOICES, "pf": pf}

    def validate(self, config) -> str | None:
        """None when `config` builds a correct kernel on this host, else why not."""
        return config_reason(self.geometry, config)

    def default_config(self) -> dict:
        """The preferred config at the host's widest ISA (see `default_config`)."""
        return default_config(self.geometry, self.isas[0] if self.isas else None)


def _padded(geometry: ConvGeometry) -> bool:
    """Whether some output pixel's window leaves the image (explicit or implied padding)."""
    g = geometry
    return bool(g.pt or g.pl or (g.oh - 1) * g.sh - g.pt + (g.r - 1) * g.dh >= g.h
                or (g.ow - 1) * g.sw - g.pl + (g.s - 1) * g.dw >= g.w)


def splittable(geometry: ConvGeometry) -> bool:
    """Whether a phase split applies: a strided regular conv, or a padded KxK one (its one
    phase is the input with the padding written out)."""
    if geometry.within_vector:
        return False
    return geometry.strided or (_padded(geometry) and (geometry.r, geometry.s) != (1, 1))


def config_reason(geometry: ConvGeometry, config) -> str | None:
    """None when `config` is a valid micro-kernel schedule of `geometry`, else why not."""
    if not set(KNOBS) <= set(config) <= set(KNOBS) | set(OPTIONAL_KNOBS):
        return (f"a micro-kernel config has the knobs {', '.join(KNOBS)} and optionally "
                f"{', '.join(OPTIONAL_KNOBS)}")
    try:
        isa = isa_named(str(config["isa"]))
    except ValueError as exc:
        return str(exc)
    kv, px, unroll, cbt = (int(config[k]) for k in ("kv", "px", "unroll", "cbt"))
    if cbt < 1:
        return "cbt (input blocks per pass) is positive"
    if int(config["rows"]) < 1:
        return "rows (output rows per parallel unit) is positive"
    if config["split"] not in (0, 1):
        return "split is 0 or 1"
    if config["split"] and not splittable(geometry):
        return "a phase split applies to strided or padded KxK regular convs only"
    pf = prefetch_distance(config)
    if pf not in PF_CHOICES:
        return f"pf (prefetch distance in input blocks) is one of {PF_CHOICES}"
    if pf and geometry.within_vector:
        return "prefetch applies to regular convs only (a depthwise tile reads one block)"
    if geometry.block % isa.lanes:
        return f"the block {geometry.block} is not a multiple of {isa.name}'s {isa.lanes} lanes"
    if not geometry.fits_lanes(isa.lanes):
        return (f"{isa.name}'s {isa.lanes} lanes do not hold whole groups of "
                f"{geometry.group_width} channels")
    if min(kv, px, unroll) < 1 or px > max(PX_CHOICES) or unroll > max(UNROLL_CHOICES):
        return "kv, px and unroll are positive (px <= 16, unroll <= 16)"
    if geometry.within_vector and kv != 1:
        return "a depthwise or narrow-group tile is one vector of channels (kv 1)"
    if kv > geometry.out_vectors(isa.lanes):
        return f"kv {kv} is more vectors than the {geometry.out_vectors(isa.lanes)} of the output"
    if geometry.groups > 1 and geometry.group_vectors(isa.lanes) % kv:
        return (f"kv {kv} does not divide a group's {geometry.group_vectors(isa.lanes)} "
                "output vectors (a tile lies within one group)")
    if accumulator_registers(geometry, isa, kv, px) > isa.registers:
        return (f"a {kv}x{px} tile needs more than {isa.name}'s {isa.registers} "
                "vector registers")
    return None


def prefetch_distance(config) -> int:
    """The config's prefetch distance in input blocks (0, no prefetch, when it has none)."""
    return int(config.get("pf", OPTIONAL_KNOBS["pf"]))


def _whole_kvs(geometry: ConvGeometry, isa: Isa) -> list[int]:
    """Tile heights (vectors) up to MLAS's (4 with 32 registers, 2 with 16) that divide the
    output's vectors (a group's, of a grouped conv)."""
    vectors = geometry.group_vectors(isa.lanes)
    return [k for k in (1, 2, 3, 4)[: 4 if isa.registers >= 32 else 2] if vectors % k == 0]


def _tile_height(geometry: ConvGeometry, isa: Isa) -> int:
    """The default tile height (vectors): the largest of `_whole_kvs`; with 16 registers
    2 also where the output's vector count is odd (an ungrouped conv's last tile then
    computes its last vector twice and stores it once, as MLAS's remainder filters do):
    RegNet's 104 and 440 channels are 13 and 55 vectors of 8, and one-vector tiles (6 of
    16 registers accumulating) ran 1.25-1.4x slower than two-vector ones on one thread of
    an AVX2 host. With 32 registers the tile stays a divisor (not measured otherwise)."""
    whole = max(_whole_kvs(geometry, isa))
    if isa.registers < 32 and geometry.groups == 1 and geometry.out_vectors(isa.lanes) > 1:
        return max(whole, 2)
    return whole


def mlas_tile(geometry: ConvGeometry, isa: Isa) -> dict:
    """The tile of MLAS's NCHWc kernels (kv, px 6, no split, one row per unit): the default
    of a stride-1 conv, the baseline the strided defaults were chosen against."""
    return {"kv": _tile_height(geometry, isa), "px": 6, "split": 0, "rows": 1}


def _widest_px(geometry: ConvGeometry, isa: Isa, kv: int, at_most: int = max(PX_CHOICES)) -> int:
    """The widest tile of `PX_CHOICES` (at most `at_most` pixels) whose kv x px tile the
    ISA's registers hold (1 where none does)."""
    return max([p for p in PX_CHOICES if p <= at_most
                 and accumulator_registers(geometry, isa, kv, p) <= isa.registers] or [1])


def _balanced_width(width: int, widest: int) -> int:
    """The narrowest tile of `PX_CHOICES` that covers a row of `width` pixels in as few
    tiles as ones of `widest` pixels do: 7 pixels as 4 + 3 instead of 6 + 1."""
    tiles = -(-width // widest)
    return min(p for p in PX_CHOICES if p * tiles >= width)


def _strided_tile(geometry: ConvGeometry, isa: Isa, kvs: list[int]) -> dict:
    """The default of a strided KxK conv on a blocked input: the most output vectors whose
    weights of one input block fit `PASS_BYTES` (a 3x3 filter's 4 vectors take 36 KiB on
    AVX-512 and crowd L1), the widest tile of pixels the registers hold, units of about
    `UNIT_PIXELS` output pixels (several rows of a small output), and the phase split for
    rows of at most `SPLIT_ROW` pixels, where one-pixel edge tiles would be a large share
    (on wider rows its copy of the input cost more than it saved). With 16 registers (6
    pixels wide) the row is cut into tiles of even width (`_balanced_width`): ResNet-50's
    3x3 stride-2 convs with 7- and 14-pixel output rows ran 1.13-1.2x faster in tiles of
    4 and 5 pixels than of 6 on an AVX2 host, one thread and two; with 32 registers a
    tile already spans such rows (not measured otherwise)."""
    per_vector = geometry.r * geometry.s * geometry.in_block * isa.lanes * 4
    kv = max([k for k in kvs if k * per_vector <= PASS_BYTES] or [1])
    px = _widest_px(geometry, isa, kv)
    if isa.registers < 32:
        px = _balanced_width(geometry.ow, px)
    rows = max(1, min(geometry.oh, UNIT_PIXELS // geometry.ow))
    return {"kv": kv, "px": px, "split": int(geometry.ow <= SPLIT_ROW), "rows": rows}


def _sparse_tile(geometry: ConvGeometry, isa: Isa, tile: dict) -> dict:
    """The default of a dense conv of sparse groups: two output vectors by up to
    `SPARSE_PX` pixels. Each tile reduces over its groups' band of input blocks, so a
    taller tile spans more groups and reads more blocks of zeros, a one-vector tile
    reuses each broadcast input once; on ShuffleNet's seven grouped 1x1 convs (two
    AVX-512 threads, the fastest of 300 calls each, 2026-12-03) two vectors by 8 pixels
    ran 0.99-1.19x as fast as MLAS's tile (1 or 3 vectors by 6), within 4% of the best of
    16 tiles on each but one (the 24->112 channel conv: 8%). On AVX2 not measured. A
    strided KxK one keeps the two vectors in the strided tile (whose own rule, vector counts
    dividing the output's, gave one-vector tiles for AVX2's 3-vector outputs: see
    `_tile_height` for what those cost)."""
    return dict(tile, kv=2, px=_widest_px(geometry, isa, 2, SPARSE_PX))


def _depthwise_tile(geometry: ConvGeometry, isa: Isa) -> dict:
    """A depthwise conv's default tile: up to `DEPTHWISE_PX` pixels (as many as the
    registers hold: 5 for a 7x7 filter with 16), in units of up to `DEPTHWISE_ROWS` output
    rows. A unit of one row of one channel block is a fraction of a microsecond of work,
    and the kernel hands units out one at a time (`schedule(dynamic, 1)`): on 2 threads of
    an AVX2 host MobileNet-v2's depthwise convs ran 1.9-5.7x slower in one-row units of
    4 pixels than in 7-row units of 8, and 1.2-2x slower on one thread. AVX-512's default
    was already 8 pixels wide; its units were one row too (not measured there: the cost of
    handing out units is the same). A strided conv of narrow groups on rows of at least
    `NARROW_STRIDED_ROW` output pixels takes tiles of `NARROW_STRIDED_PX`: its shuffled
    input vectors of a filter row (twice the tile's width) crowd the registers of a wider
    one; ResNeXt-50's and RegNet-Y-400MF's 3x3 stride-2 convs with 28- and 56-pixel rows
    ran 1.3-1.4x faster in 4-pixel tiles than in 8-pixel ones on two threads of an AVX-512
    host (the fastest of 45 calls each, 2026-12-03), those with 7- and 14-pixel rows
    0.88-0.94x (kept at 8)."""
    at_most = DEPTHWISE_PX
    if geometry.group_width and geometry.strided and geometry.ow >= NARROW_STRIDED_ROW:
        at_most = NARROW_STRIDED_PX
    return {"px": _widest_px(geometry, isa, 1, at_most),
            "rows": min(geometry.oh, DEPTHWISE_ROWS)}


def _padded_tile(geometry: ConvGeometry, isa: Isa, tile: dict) -> dict:
    """The default of a padded stride-1 KxK conv on a blocked input with 16 registers: the
    padding written out (the split's one phase), so the edge pixels run in full tiles
    instead of one-pixel checked ones (two of a 3x3's 28-pixel rows, a 2 x 1 tile at a
    fraction of the FMA rate), tiles of even width (`_balanced_width`) and units of
    `PADDED_ROWS` rows. ResNet-50's four 3x3 stride-1 convs ran 1.01-1.13x faster on two
    threads of an AVX2 host, 0.99-1.24x on one, than with the MLAS tile (and the grid of
    `scripts/bench_microkernels.py` picked the split for three of them); with 32 registers
    the MLAS tile stays (not measured there)."""
    return {**tile, "px": _balanced_width(geometry.ow, tile["px"]), "split": 1,
            "rows": min(geometry.oh, PADDED_ROWS)}


def default_config(geometry: ConvGeometry, isa_name: str | None = None) -> dict:
    """The untuned build's config: the widest usable ISA, and the tile of MLAS's NCHWc
    kernels (4 vectors of output channels x 6 pixels with 32 registers, 2 x 6 with 16;
    depthwise `_depthwise_tile`), fewer vectors where the output has fewer (`_tile_height`);
    full unroll; passes of as many input blocks as keep their weights within `PASS_BYTES`.
    Strided 1x1 convs take the phase split (a subsample, then a flattened 1x1 conv);
    strided KxK convs on a blocked input a tile of fewer vectors and more pixels and the
    split of short rows (`_strided_tile`); padded stride-1 KxK ones with 16 registers
    their padding written out (`_padded_tile`). The strided ones were faster than the MLAS
    tile in `scripts/bench_microkernels.py` on ResNet-50's stride-2 convs; on a stem (NCHW input)
    the split was slower (its phases hold one float per pixel): it keeps the MLAS tile.
    A grouped KxK conv takes no split: its copy of the input costs as much as an ungrouped
    conv's while a group reduces over a fraction of the channels. On two threads of an
    AVX2 host, in two runs over the grouped 3x3 convs of RegNet-Y-400MF and ResNeXt-50 (the
    tile otherwise the same, with and without the split alternating in one process), the
    strided ones (8, 16 and 32 channels a group) ran 1.3-4.7x faster without it, the padded
    stride-1 ones with 8 channels a group 1.04-1.75x, with 16 and 32 0.84-1.15x (ties
    within the runs' noise; 2026-12-01). On AVX-512 (where only the strided rule applies)
    not measured."""
    isa = ISAS[isa_name] if isa_name else next(
        i for i in usable_isas() if geometry.block % i.lanes == 0 and geometry.fits_lanes(i.lanes))
    if geometry.within_vector:
        return {"isa": isa.name, "kv": 1, "unroll": 16, "cbt": 1, "split": 0,
                **_depthwise_tile(geometry, isa)}
    tile = mlas_tile(geometry, isa)
    if geometry.sparse_groups and geometry.out_vectors(isa.lanes) > 1:
        tile = _sparse_tile(geometry, isa, tile)
    if geometry.strided and (geometry.r, geometry.s) == (1, 1):
        tile["split"] = 1
    elif geometry.strided and not geometry.nchw_input:   # sparse groups keep their height
        kvs = [tile["kv"]] if geometry.sparse_groups else _whole_kvs(geometry, isa)
        tile = _strided_tile(geometry, isa, kvs)
    elif splittable(geometry) and not geometry.nchw_input and isa.registers < 32:
        tile = _padded_tile(geometry, isa, tile)
    if geometry.groups > 1 and (geometry.r, geometry.s) != (1, 1):
        tile["split"] = 0   # grouped: see the docstring
    return with_passes(geometry, isa, tile)


def with_passes(geometry: ConvGeometry, isa: Isa, tile: dict) -> dict:
    """A full config of `tile` (kv, px, split, rows): full unroll, passes of as many input
    blocks as keep their weights within `PASS_BYTES`."""
    block_bytes = geometry.r * geometry.s * geometry.in_block * tile["kv"] * isa.lanes * 4
    cbt = max([c for c in CBT_CHOICES if c * block_bytes <= PASS_BYTES] or [1])
    return {"isa": isa.name, "unroll": 16, "cbt": cbt, **tile}
