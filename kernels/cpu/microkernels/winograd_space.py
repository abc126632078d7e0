"""Winograd F(m x m, 3 x 3) convolutions: the transforms, what fits, the config space.

    reason = winograd_reason(workload)     # None for a 3x3 stride-1 NCHWc conv it computes
    space = WinogradSpace(conv_geometry(workload))   # space(), validate(config), default_config()
    transforms(m)                          # (B^T, G, A^T) of F(m, 3) in float64

A config is `{"isa": name, "m": 2 or 4, "kv": output vectors, "px": tiles,
"unroll": n, "tb": tiles per round, "cc": input blocks per pass}`: the output
tile size m is an algorithm knob next to the batched GEMM's register tile (kv
vectors of output channels x px tiles, broadcast-FMA over the input channels,
`unroll` of that reduction), the number of tiles whose transforms are kept in
the scratch buffers at once (`tb`, a round: input transform, GEMM, output
transform) and the input blocks per GEMM pass (`cc`: partial sums kept in M,
so the slice of the transformed filter a pass reads stays in L1 while every
tile of the round uses it). `WinogradSpace` has the interface of a DSL
schedule template, so the GA/RL tuners search it.

Float32 error. Winograd's transforms add rounding that a direct conv does not
have, growing with m (the F(4,3) points +-2 scale values by up to 8). A direct
conv's float32 relative L2 error is about eps * sqrt(L) for a reduction of L
terms; the transforms add a rounding of relative size eps in every transformed
element, which the output transform amplifies (`amplification`: the root mean
square growth for independent random data, 1.7 for m 2, 31 for m 4).
`error_bound` = SAFETY * eps * (sqrt(L) + amplification(m)) is the tolerance a
Winograd kernel is verified with (see docs/winograd.md for the measured errors).
"""

from __future__ import annotations

import math
import os

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.cpu.microkernels.isa import ISAS, Isa, isa_named, usable_isas
from wpk.kernels.cpu.microkernels.space import ConvGeometry, conv_geometry

M_CHOICES = (2, 4)
KV_CHOICES = (1, 2, 3, 4, 6)
PX_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12)
UNROLL_CHOICES = (1, 2, 4, 8, 16)
TB_CHOICES = (8, 16, 32, 64, 128, 256, 512)
CC_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
KNOBS = ("isa", "m", "kv", "px", "unroll", "tb", "cc")
# knobs a config may leave out (records and plans written before them), with their default:
# `local` 1 runs each round (input transform, GEMM, output transform) on one thread, its
# own scratch, so no thread reads what another wrote (see `winograd_templates`)
OPTIONAL_KNOBS = {"local": 0}
# the most OpenMP threads a `local` kernel gives a scratch slice (more run as this many)
LOCAL_THREADS = max(1, os.cpu_count() or 1)
# a transformed filter up to this size takes `local` rounds by default: each thread then
# reads all of it once a round, from its own core's cache
LOCAL_FILTER_BYTES = 4 << 20
# A GEMM pass's slice of the transformed filter the default cc keeps within (half an L1)
PASS_BYTES = 16 * 1024
# Scratch of a round (transformed inputs and GEMM outputs) the default tb keeps within: about
# a core's L2, so the transforms' data stays there between the phases (measured on ResNet-50's
# 3x3 convs: rounds of 32-64 tiles beat both 16 and 256 at m 4)
ROUND_BYTES = 2 << 20
# Most bytes a config may take: the scratch of a round, the transformed filter (m+2)^2/9 times
# the filter's size
MAX_SCRATCH_BYTES = 64 << 20
MAX_FILTER_BYTES = 512 << 20
# float32 unit roundoff, and the safety factor of `error_bound` over the expected error
EPS32 = float(np.finfo(np.float32).eps) / 2
SAFETY = 4.0


def transforms(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B^T, G, A^T) of F(m, 3): Y = A^T [(G g G^T) * (B^T d B)] A (points 0, +-1, +-2, inf
    for m 4; 0, +-1, inf for m 2)."""
    if m == 2:
        bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        g = [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]
        at = [[1, 1, 1, 0], [0, 1, -1, -1]]
    elif m == 4:
        bt = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
              [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
        g = [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
             [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]
        at = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
              [0, 1, -1, 8, -8, 1]]
    else:
        raise ValueError(f"Winograd F({m}, 3) is not implemented (m is 2 or 4)")
    return tuple(np.array(a, np.float64) for a in (bt, g, at))


def filter_transform_matrix(m: int) -> np.ndarray:
    """G (x) G, [(m+2)^2, 9] in float64: times a flattened 3x3 filter, its G g G^T."""
    g = transforms(m)[1]
    return np.kron(g, g)


def filter_transform(weight: np.ndarray, m: int) -> np.ndarray:
    """G g G^T of every 3x3 filter of an OIHW `weight`, [m+2, m+2, O, I] in float64: one
    GEMM of the Kronecker product G (x) G [(m+2)^2, 9] by the filters [9, O*I] (a
    512 x 512 layer's 262144 filters in 0.03 s where numpy's einsum of the three factors
    took 0.16 s; a VGG-19 plan's 15 layers took 1.9 s of its load that way)."""
    t = m + 2
    out_channels, in_channels = weight.shape[:2]
    filters = np.asarray(weight, np.float64).reshape(out_channels * in_channels, 9)
    return (filter_transform_matrix(m) @ filters.T).reshape(t, t, out_channels, in_channels)


def amplification(m: int) -> float:
    """How much the output transform grows a rounding of relative size 1 in each transformed
    element, relative to the output's magnitude, for independent unit-variance inputs and
    filters (root mean square; the worst output position of the tile). The transformed
    product z_pq = (G g G^T)_pq (B^T d B)_pq has variance |G_p|^2 |G_q|^2 |B_p|^2 |B_q|^2
    per input channel, an output y_ij = sum A_ip A_jq z_pq, and a direct output has 9 terms
    of variance 1 per input channel."""
    bt, g, at = transforms(m)
    gn, bn = (g ** 2).sum(1), (bt ** 2).sum(1)
    z = np.outer(gn, gn) * np.outer(bn, bn)
    variance = np.einsum("ip,jq,pq->ij", at ** 2, at ** 2, z)
    return math.sqrt(float(variance.max()) / 9)


def error_bound(geometry: ConvGeometry, m: int) -> float:
    """The relative L2 error a float32 F(m, 3) conv of `geometry` may have against float64:
    SAFETY * eps32 * (sqrt(reduction length) + amplification(m))."""
    reduction = geometry.r * geometry.s * geometry.in_channels
    return SAFETY * EPS32 * (math.sqrt(reduction) + amplification(m))


def winograd_reason(workload: Workload) -> str | None:
    """None when `workload` is an NCHWc conv Winograd F(m, 3) computes, else why not."""
    g = conv_geometry(workload)
    if isinstance(g, str):
        return g
    return geometry_reason(g)


def geometry_reason(g: ConvGeometry) -> str | None:
    """None for a 3x3 stride-1, dilation-1, ungrouped conv, else why Winograd does not fit."""
    if g.within_vector:   # its geometry counts one group: the filter's zeros are cut out
        return "Winograd computes regular (not depthwise or narrow-group) convolutions"
    if g.groups > 1:
        return "Winograd computes ungrouped convolutions (its GEMM spans every input block)"
    if (g.r, g.s, g.sh, g.sw, g.dh, g.dw) != (3, 3, 1, 1, 1, 1):
        return "Winograd F(m, 3) computes 3x3 stride-1 dilation-1 convolutions"
    return None


def tiles(g: ConvGeometry, m: int) -> int:
    """Output tiles of m x m pixels over every image."""
    return g.n * -(-g.oh // m) * -(-g.ow // m)


def gemm_registers(kv: int, px: int) -> int:
    """Vector registers of the GEMM's inner loop: accumulators, weight vectors, a broadcast."""
    return kv * px + kv + 1


class WinogradSpace:
    """The config space of one workload's Winograd kernel (a schedule template's interface)."""

    def __init__(self, geometry: ConvGeometry, isas: tuple[str, ...] | None = None):
        self.geometry = geometry
        self.isas = isas or tuple(i.name for i in usable_isas()
                                  if geometry.block % i.lanes == 0)
        self.name = "micro.winograd"

    def space(self) -> dict[str, tuple]:
        """Knob -> choices."""
        return {"isa": self.isas, "m": M_CHOICES, "kv": KV_CHOICES, "px": PX_CHOICES,
                "unroll": UNROLL_CHOICES, "tb": TB_CHOICES, "cc": CC_CHOICES, "local": (0, 1)}

    def validate(self, config) -> str | None:
        """None when `config` builds a correct kernel on this host, else why not."""
        return config_reason(self.geometry, config)

    def default_config(self) -> dict:
        """The preferred config at the host's widest ISA (see `default_config`)."""
        return default_config(self.geometry, self.isas[0] if self.isas else None)


def config_reason(g: ConvGeometry, config) -> str | None:
    """None when `config` is a valid Winograd schedule of `g`, else why not."""
    if not set(KNOBS) <= set(config) <= set(KNOBS) | set(OPTIONAL_KNOBS):
        return f"a Winograd config has the knobs {', '.join(KNOBS)} and may have " \
               f"{', '.join(OPTIONAL_KNOBS)}"
    if is_local(config) not in (0, 1):
        return "local is 0 or 1"
    reason = geometry_reason(g)
    if reason:
        return reason
    try:
        isa = isa_named(str(config["isa"]))
    except ValueError as exc:
        return str(exc)
    m, kv, px, unroll, tb, cc = (int(config[k]) for k in KNOBS[1:])
    if m not in M_CHOICES:
        return f"m is one of {M_CHOICES}"
    if g.block % isa.lanes:
        return f"the block {g.block} is not a multiple of {isa.name}'s {isa.lanes} lanes"
    if min(kv, px, unroll, tb, cc) < 1 or px > max(PX_CHOICES) \
            or unroll > max(UNROLL_CHOICES):
        return "kv, px, unroll, tb and cc are positive (px <= 12, unroll <= 16)"
    if kv > g.out_vectors(isa.lanes):
        return f"kv {kv} is more vectors than the {g.out_vectors(isa.lanes)} of the output"
    if gemm_registers(kv, px) > isa.registers:
        return f"a {kv}x{px} tile needs more than {isa.name}'s {isa.registers} vector registers"
    return _memory_reason(g, isa, m, kv, tb, is_local(config))


def is_local(config) -> int:
    """The config's `local` knob (0 when it has none)."""
    return int(config.get("local", OPTIONAL_KNOBS["local"]))


def _memory_reason(g: ConvGeometry, isa: Isa, m: int, kv: int, tb: int,
                   local: int = 0) -> str | None:
    """Why the config's scratch or transformed filter is too large, or None."""
    kp = -(-g.out_vectors(isa.lanes) // kv) * kv * isa.lanes
    cp, t2 = g.cb * g.block, (m + 2) ** 2
    scratch = t2 * min(tb, tiles(g, m)) * (cp + kp) * 4 * (LOCAL_THREADS if local else 1)
    if scratch > MAX_SCRATCH_BYTES:
        return f"rounds of {tb} tiles need {scratch >> 20} MiB of scratch (at most " \
               f"{MAX_SCRATCH_BYTES >> 20})"
    if t2 * kp * cp * 4 > MAX_FILTER_BYTES:
        return f"the F({m}, 3) filter would take more than {MAX_FILTER_BYTES >> 20} MiB"
    return None


def _default_kv(g: ConvGeometry, isa: Isa) -> int:
    vectors = g.out_vectors(isa.lanes)
    return max(k for k in (1, 2, 3, 4)[: 4 if isa.registers >= 32 else 2] if vectors % k == 0)


def default_config(g: ConvGeometry, isa_name: str | None = None, m: int = 4,
                   local: bool | None = None) -> dict:
    """A config of F(m, 3) at the widest usable ISA: the direct kernel's register tile
    (4 x 6 with 32 registers, 2 x 6 with 16), rounds of as many tiles (at most every tile)
    as keep their scratch within `ROUND_BYTES`: the fewer rounds, the fewer times the
    transformed filter is streamed through the cache; passes of as many input blocks as
    keep their slice of it within `PASS_BYTES`. A transformed filter of at most
    `LOCAL_FILTER_BYTES` takes `local` rounds (or as `local` says), each thread's scratch
    within its share of `ROUND_BYTES` and at least two rounds a thread."""
    isa = ISAS[isa_name] if isa_name else next(
        i for i in usable_isas() if g.block % i.lanes == 0)
    kv, px = _default_kv(g, isa), 6
    per_tile = (m + 2) ** 2 * (g.cb + g.kb) * g.block * 4
    count = tiles(g, m)
    local = int(filter_bytes(g, m) <= LOCAL_FILTER_BYTES if local is None else local)
    if local:   # at least two rounds a thread, each thread's scratch in its share
        tb = max([t for t in TB_CHOICES if t * 2 * LOCAL_THREADS <= max(count, 1)
                  and t * per_tile <= ROUND_BYTES // LOCAL_THREADS] or [TB_CHOICES[0]])
    else:
        tb = max([t for t in TB_CHOICES if min(t, count) * per_tile <= ROUND_BYTES]
                 or [TB_CHOICES[0]])
    pass_block = g.block * kv * isa.lanes * 4
    cc = max([c for c in CC_CHOICES if c * pass_block <= PASS_BYTES] or [1])
    return {"isa": isa.name, "m": m, "kv": kv, "px": px, "unroll": 4, "tb": tb, "cc": cc,
            "local": local}


def filter_bytes(g: ConvGeometry, m: int) -> int:
    """Bytes of the F(m, 3) transformed filter (output and input channels padded to
    blocks)."""
    return (m + 2) ** 2 * g.kb * g.cb * g.block * g.block * 4
