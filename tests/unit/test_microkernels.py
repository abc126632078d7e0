"""NCHWc micro-kernels (`micro.nchwc`): every ISA's code against the float64 reference.

Odd shapes on purpose: channels not a multiple of the vector width, 1-pixel
images, asymmetric padding, stride 2 and 3 (with the phase split off and on),
dilation, depthwise 3x3 and 5x5, grouped convs whose groups (2-8 channels) are
narrower than a vector (as the layout pass widens them) and dense convs of groups that are
not whole blocks (`sparse_groups`), stems reading an NCHW input of
3 or 1 channels, the fused epilogues. Each case runs the default config and random configs of its
space (other tiles, so the interior's remainder tiles and the edges are hit),
for AVX-512 (where the host has it), AVX2 (forced on an AVX-512 host: it
compiles and runs there) and the portable path.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.unit.asm_checks import stack_accesses
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels import registry
from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags, usable_isas
from wpk.kernels.cpu.microkernels.kernel import MICRO_NCHWC, MicroKernels
from wpk.kernels.cpu.microkernels.space import (
    PX_CHOICES,
    MicroSpace,
    accumulator_registers,
    config_reason,
    conv_geometry,
    default_config,
    splittable,
)
from wpk.kernels.cpu.microkernels.templates import conv_source, split_floats
from wpk.kernels.cpu.microkernels.vector_c import half_last
from wpk.kernels.nchwc_reference import nchwc_reference
from wpk.kernels.random_inputs import random_inputs
from wpk.search.space import SearchSpace
from wpk.search.tuners import make_tuner

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

B = fmt.host_block_size()
USABLE = [isa.name for isa in usable_isas()]


def skip_unless_blocks_run(isa: str) -> None:
    """Skip unless this host runs `isa` code and the test block B is whole vectors of it."""
    if isa not in USABLE:
        pytest.skip(f"this host cannot run {isa} code")
    if B % ISAS[isa].lanes:
        pytest.skip(f"block {B} is not a multiple of {isa}'s lanes")


RELU = EpilogueStep("relu")


def geometry(workload: Workload):
    """The micro-kernel's geometry of a workload, stems (NCHW input) included."""
    return conv_geometry(workload, nchw_input=True)


def conv(cin, cout, hw, k, stride=1, pads=None, group=1, bias=True, epilogue=(),
         residual=False, dilation=1, batch=1, group_width=0, sparse_groups=0) -> Workload:
    """A blocked Conv workload (pads: t, l, b, r; default `k // 2` everywhere); with
    `group_width` its groups are narrower ones widened, with `sparse_groups` a dense conv
    of that many groups that are not whole blocks, as the layout pass writes them."""
    h, w = hw
    pt, pl, pb, pr = pads if pads is not None else (k // 2,) * 4
    ext = dilation * (k - 1) + 1
    oh, ow = (h + pt + pb - ext) // stride + 1, (w + pl + pr - ext) // stride + 1
    y = TensorSpec((batch, -(-cout // B), oh, ow, B))
    inputs = [TensorSpec((batch, -(-cin // B), h, w, B)),
              TensorSpec((cout, cin // group, k, k)), TensorSpec((cout,)) if bias else None]
    if residual:
        inputs.append(y)
    attrs = {"kernel_shape": (k, k), "strides": (stride, stride), "pads": (pt, pl, pb, pr),
             "dilations": (dilation, dilation), "group": group, "block": B, "channels": cout}
    if group_width:
        attrs["group_width"] = group_width
    if sparse_groups:
        attrs["sparse_groups"] = sparse_groups
    return Workload("Conv", tuple(inputs), (y,), tuple(sorted(attrs.items())), tuple(epilogue),
                    "wpk.nchwc", (1, 2) if bias else (1,))


def narrow(blocks, hw, k, width, **options) -> Workload:
    """A conv of groups of `width` channels (in as out) over `blocks` blocks as the layout
    pass leaves it: one group per block, its filter zero between the narrow groups
    (`random_inputs` draws it so), `group_width` set."""
    return conv(blocks * B, blocks * B, hw, k, group=blocks, group_width=width, **options)


def sparse(per_group_in, per_group_out, groups, hw, k, **options) -> Workload:
    """A conv of `groups` groups that are not whole blocks as the layout pass leaves it:
    one dense group, its filter zero outside the groups (`random_inputs` draws it so),
    `sparse_groups` set."""
    return conv(per_group_in * groups, per_group_out * groups, hw, k,
                sparse_groups=groups, **options)


def stem(cin, cout, hw, k, stride=2, pads=None, epilogue=(RELU,)) -> Workload:
    """A network's first conv: NCHW input with fewer channels than a block, blocked output."""
    blocked = conv(cin, cout, hw, k, stride, pads, epilogue=epilogue)
    n, _, h, w, _ = blocked.inputs[0].shape
    return Workload("Conv", (TensorSpec((n, cin, h, w)), *blocked.inputs[1:]), blocked.outputs,
                    blocked.attrs, blocked.epilogue, blocked.domain, blocked.const_inputs)


ADD3 = EpilogueStep("add", operand=3)
CASES = {
    "3x3_odd_channels": conv(20, 24, (9, 7), 3, epilogue=(RELU,)),
    "3x3_stride2_residual": conv(2 * B + 3, 40, (11, 10), 3, stride=2, residual=True,
                                 epilogue=(ADD3, RELU)),
    "3x3_one_pixel": conv(20, 36, (1, 1), 3),
    "3x3_asymmetric_pads": conv(B, 2 * B + 5, (7, 6), 3, pads=(1, 0, 2, 1), bias=False),
    "3x3_dilated": conv(12, 20, (9, 9), 3, dilation=2, pads=(2, 2, 2, 2)),
    # ASPP's: the window (2 * 6 + 1 = 13 columns, 19 with dilation 9) wider than the image,
    # no interior: pieces of the row between the columns where a tap enters or leaves
    "3x3_dilation6_wider_than_the_image": conv(20, 24, (11, 23), 3, dilation=6,
                                               pads=(6, 6, 6, 6), epilogue=(RELU,)),
    "3x3_dilation9_residual_batch2": conv(B, 20, (7, 17), 3, dilation=9, pads=(9, 9, 9, 9),
                                          residual=True, batch=2, epilogue=(ADD3, RELU)),
    "1x1_flat_residual_clip": conv(3 * B, 50, (5, 7), 1, residual=True, epilogue=(
        ADD3, EpilogueStep("clip", (("min", 0.0), ("max", 6.0))))),
    "1x1_stride2_batch2": conv(24, 4 * B, (9, 9), 1, stride=2, batch=2,
                               epilogue=(EpilogueStep("leaky_relu"),)),
    "1x1_sigmoid_padded": conv(B, 20, (3, 3), 1, epilogue=(EpilogueStep("sigmoid"),)),
    "1x1_one_pixel_hard_sigmoid": conv(40, 24, (1, 1), 1, epilogue=(
        EpilogueStep("hard_sigmoid", (("alpha", 0.3),)),)),
    # the exporters' activations MLAS has no form of: on the vectors
    "3x3_residual_silu": conv(20, 2 * B + 3, (7, 9), 3, residual=True,
                              epilogue=(ADD3, EpilogueStep("silu"))),
    "1x1_stride2_hard_swish": conv(3 * B, 24, (9, 8), 1, stride=2,
                                   epilogue=(EpilogueStep("hard_swish"),)),
    # erf's GELU (wav2vec2's and ConvNeXt's), a vector erf on the registers
    "3x3_residual_gelu": conv(20, 2 * B + 3, (7, 9), 3, residual=True,
                              epilogue=(ADD3, EpilogueStep("gelu"))),
    "1x1_stride2_gelu": conv(3 * B, 24, (9, 8), 1, stride=2, epilogue=(EpilogueStep("gelu"),)),
    # CLIP's QuickGELU and YOLOv4's Mish
    "3x3_residual_quick_gelu": conv(20, 2 * B + 3, (7, 9), 3, residual=True, epilogue=(
        ADD3, EpilogueStep("quick_gelu", (("alpha", 1.702),)))),
    "1x1_stride2_mish": conv(3 * B, 24, (9, 8), 1, stride=2, epilogue=(EpilogueStep("mish"),)),
    "depthwise_3x3": conv(40, 40, (9, 8), 3, group=40, epilogue=(RELU,)),
    "depthwise_3x3_stride2_tanh": conv(3 * B, 3 * B, (11, 12), 3, stride=2, group=3 * B,
                                       epilogue=(EpilogueStep("tanh"),)),
    "depthwise_5x5_asymmetric": conv(20, 20, (8, 13), 5, pads=(2, 1, 2, 3), group=20,
                                     bias=False),
    "depthwise_5x5_one_pixel": conv(B, B, (1, 1), 5, group=B),
    "stem_7x7_stride2": stem(3, 24, (17, 14), 7, pads=(3, 3, 3, 3)),
    "stem_3x3_stride2_asymmetric": stem(3, 2 * B + 3, (9, 8), 3, pads=(0, 1, 1, 0)),
    "stem_one_channel_one_pixel": stem(1, 20, (1, 1), 3, epilogue=()),
    "3x3_stride2_dilated_asymmetric": conv(20, 24, (12, 9), 3, stride=2, pads=(0, 1, 2, 2),
                                           dilation=2),
    "5x5_stride3": conv(12, 36, (11, 13), 5, stride=3, pads=(2, 1, 2, 2)),
    "1x1_stride2_padded_odd": conv(B + 5, 20, (7, 9), 1, stride=2, pads=(1, 1, 0, 0)),
    # a YOLO box head: 4 output channels, padded to one block
    "1x1_four_outputs": conv(B, 4, (10, 10), 1, bias=True),
    # grouped convs with whole blocks per group (RegNet, ResNeXt's wide stages, ShuffleNet)
    "grouped_3x3_residual": conv(4 * B, 4 * B, (7, 9), 3, group=4, residual=True,
                                 epilogue=(ADD3, RELU)),
    "grouped_3x3_stride2_two_blocks_out": conv(2 * B, 4 * B, (11, 10), 3, stride=2,
                                               group=2, epilogue=(RELU,)),
    "grouped_1x1": conv(4 * B, 2 * B, (5, 7), 1, group=2),
    "grouped_1x1_stride2": conv(6 * B, 3 * B, (9, 9), 1, stride=2, group=3, bias=False),
    # groups narrower than a vector (ResNeXt's 4 and 8 channels, RegNet's 8), widened
    "narrow_groups_3x3": narrow(2, (9, 7), 3, B // 4, epilogue=(RELU,)),
    "narrow_groups_3x3_stride2_residual": narrow(3, (11, 10), 3, B // 2, stride=2,
                                                 residual=True, epilogue=(ADD3, RELU)),
    "narrow_groups_of_two_one_pixel": narrow(1, (1, 1), 3, 2),
    "narrow_groups_asymmetric_no_bias": narrow(2, (5, 9), 3, B // 2, pads=(0, 1, 2, 1),
                                               bias=False),
    "narrow_groups_dilated_batch2_silu": narrow(1, (9, 8), 3, B // 4, dilation=2,
                                                pads=(2, 2, 2, 2), batch=2,
                                                epilogue=(EpilogueStep("silu"),)),
    "narrow_groups_1x1": narrow(2, (5, 7), 1, B // 2),
    # groups that are neither whole blocks nor within one (ShuffleNet's 34, 68, 136), dense
    "sparse_groups_1x1": sparse(B + 1, B + 1, 4, (5, 7), 1, epilogue=(RELU,)),
    "sparse_groups_1x1_residual_batch2": sparse(B + 2, B + 2, 3, (6, 6), 1, residual=True,
                                                batch=2, epilogue=(ADD3, RELU)),
    "sparse_groups_1x1_expand_one_pixel": sparse(6, 28, 4, (1, 1), 1, bias=False),
    "sparse_groups_1x1_stride2": sparse(2 * B + 4, B + 2, 2, (9, 9), 1, stride=2),
    "sparse_groups_3x3_stride2": sparse(10, 5, 4, (11, 10), 3, stride=2, epilogue=(RELU,)),
    "sparse_groups_3x3_asymmetric_pads": sparse(B + B // 2 + 2, B + 2, 2, (7, 6), 3,
                                                pads=(1, 0, 2, 1)),
}


def skip_unless_groups_fit(workload: Workload, isa: str) -> None:
    """Skip where `isa`'s vectors are narrower than the workload's narrow groups."""
    if not geometry(workload).fits_lanes(ISAS[isa].lanes):
        pytest.skip(f"{isa}'s {ISAS[isa].lanes} lanes are narrower than a group")


def _random_configs(workload: Workload, isa: str, count: int, seed: int) -> list[dict]:
    space = MicroSpace(geometry(workload), (isa,))
    knobs = space.space()
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(200):
        config = {k: v[rng.integers(len(v))] for k, v in knobs.items()}
        config = {k: (v.item() if hasattr(v, "item") else v) for k, v in config.items()}
        if space.validate(config) is None and config not in found:
            found.append(config)
        if len(found) == count:
            break
    return found


def _check(workload: Workload, config: dict, rng) -> float:
    inputs = random_inputs(workload, rng)
    consts = {i: inputs[i] for i in workload.const_inputs}
    kernel = MICRO_NCHWC.prepare(workload, consts, config)
    out = np.full(workload.outputs[0].shape, np.nan, np.float32)   # poisoned
    kernel(inputs, [out])
    expected = nchwc_reference(workload, inputs)[0]
    assert np.isfinite(out).all(), f"{config}: elements left unwritten"
    return relative_l2(out, expected)


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_float64_reference(case, isa, rng):
    if isa not in USABLE:
        pytest.skip(f"this host cannot run {isa} code")
    workload = CASES[case]
    assert MICRO_NCHWC.unsupported_reason(workload) is None
    if B % ISAS[isa].lanes:
        pytest.skip(f"block {B} is not a multiple of {isa}'s lanes")
    skip_unless_groups_fit(workload, isa)
    configs = [default_config(geometry(workload), isa)]
    configs += _random_configs(workload, isa, 2, seed=len(case))
    for config in configs:
        err = _check(workload, config, rng)
        assert err < 1e-5, f"{case} {config}: relative L2 {err:.2e}"


SPLITTABLE = [c for c in CASES if splittable(geometry(CASES[c]))]


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("case", SPLITTABLE)
def test_phase_split_and_direct_tiles_both_match(case, isa, rng):
    """Strided convs (stems included) and padded stride-1 KxK convs (dilated, asymmetric
    pads, windows wider than the image) with the phase split off and on, several tiles."""
    skip_unless_blocks_run(isa)
    workload = CASES[case]
    default = default_config(geometry(workload), isa)
    for config in [default, *_random_configs(workload, isa, 2, seed=len(case) + 7)]:
        for split in (0, 1):
            err = _check(workload, dict(config, split=split), rng)
            assert err < 1e-5, f"{case} {config} split {split}: relative L2 {err:.2e}"


@pytest.mark.parametrize("isa", list(ISAS))
def test_default_tile_of_an_odd_vector_count(isa, rng):
    """RegNet's 104 channels: 13 vectors of 8 lanes (7 of 16 with 8 padding lanes). With 16
    registers the default tile is two vectors tall all the same (the last tile computes the
    last vector twice, stores it once); with 32 it stays a divisor (1 of 7). Either matches
    the reference, one pixel and a residual included."""
    skip_unless_blocks_run(isa)
    vectors = -(-104 // B) * B // ISAS[isa].lanes
    wide = ISAS[isa].registers >= 32
    for workload in (conv(48, 104, (7, 9), 1, epilogue=(RELU,)),
                     conv(104, 104, (1, 1), 3, residual=True, epilogue=(ADD3, RELU))):
        config = default_config(geometry(workload), isa)
        assert config["kv"] == (max(k for k in (1, 2, 3, 4) if vectors % k == 0) if wide
                                else 2), config
        err = _check(workload, config, rng)
        assert err < 1e-5, f"{config}: relative L2 {err:.2e}"
    # a grouped conv's tile never straddles two groups: one vector per group stays one
    grouped = conv(13 * ISAS[isa].lanes, 13 * ISAS[isa].lanes, (5, 5), 3, group=13)
    if ISAS[isa].lanes == B:
        assert default_config(geometry(grouped), isa)["kv"] == 1


@pytest.mark.parametrize("isa", list(ISAS))
def test_strided_default_cuts_short_rows_into_even_tiles(isa, rng):
    """ResNet-50's 3x3 stride-2 convs with 7- and 14-pixel output rows: with 16 registers
    (tiles of at most 6 pixels) the default cuts them 4 + 3 and 5 + 5 + 4, not 6 + 1 and
    6 + 6 + 2; a 28-pixel row keeps 6. With 32 registers the widest tile stays. Each
    matches the reference."""
    skip_unless_blocks_run(isa)
    narrow = ISAS[isa].registers < 32
    for hw, expected in (((14, 14), 4), ((28, 28), 5), ((56, 56), 6)):
        workload = conv(2 * B, 2 * B, hw, 3, stride=2, epilogue=(RELU,))
        config = default_config(geometry(workload), isa)
        widest = max(p for p in PX_CHOICES if accumulator_registers(
            geometry(workload), ISAS[isa], config["kv"], p) <= ISAS[isa].registers)
        assert config["px"] == (expected if narrow else widest), (hw, config)
        err = _check(workload, config, rng)
        assert err < 1e-5, f"{hw} {config}: relative L2 {err:.2e}"


@pytest.mark.parametrize("isa", list(ISAS))
def test_depthwise_default_hands_out_units_of_several_rows(isa, rng):
    """A depthwise conv's default: 8 pixels wide where the registers hold them (a 7x7 filter
    with 16 registers: 5), units of 7 output rows (fewer in a shorter output), not one row
    of one block per unit; it matches the reference, a stride-2 and a 3-row output included."""
    skip_unless_blocks_run(isa)
    narrow = ISAS[isa].registers < 32
    c = 3 * B
    for workload, px, rows in ((conv(c, c, (20, 19), 3, group=c, epilogue=(RELU,)), 8, 7),
                               (conv(c, c, (13, 12), 3, 2, group=c), 8, 7),
                               (conv(c, c, (3, 17), 7, group=c, epilogue=(RELU,)),
                                5 if narrow else 8, 3)):
        config = default_config(geometry(workload), isa)
        assert (config["px"], config["rows"]) == (px, rows), config
        err = _check(workload, config, rng)
        assert err < 1e-5, f"{config}: relative L2 {err:.2e}"


@pytest.mark.parametrize("isa", list(ISAS))
def test_padded_stride1_default_writes_the_padding_out(isa, rng):
    """With 16 registers a padded 3x3 stride-1 conv's default splits (its one phase: the
    input with the padding written out; no one-pixel edge tiles), in even tiles and units
    of 7 rows; with 32 the MLAS tile stays. A 1x1 conv has nothing to write out. Each
    default matches the reference."""
    skip_unless_blocks_run(isa)
    narrow = ISAS[isa].registers < 32
    for workload, px in ((conv(20, 24, (9, 7), 3, epilogue=(RELU,)), 4),
                         (conv(B, 2 * B, (16, 14), 3, pads=(1, 0, 2, 1)), 5)):
        config = default_config(geometry(workload), isa)
        expected = (1, px, 7) if narrow else (0, 6, 1)
        assert (config["split"], config["px"], config["rows"]) == expected, config
        err = _check(workload, config, rng)
        assert err < 1e-5, f"{config}: relative L2 {err:.2e}"
    flat = default_config(geometry(CASES["1x1_four_outputs"]), isa)
    assert flat["split"] == 0


@pytest.mark.parametrize("isa", list(ISAS))
def test_grouped_kxk_default_takes_no_phase_split(isa, rng):
    """RegNet's and ResNeXt's grouped 3x3 convs (a group of one or several blocks), strided
    with short rows and padded stride 1: where the same ungrouped conv's default splits, the
    grouped one's does not (its input copy outweighs a group's work). Each matches the
    reference."""
    skip_unless_blocks_run(isa)
    narrow = ISAS[isa].registers < 32
    c = 4 * B
    for hw, stride, splits in (((14, 14), 2, True), ((9, 7), 1, narrow)):
        ungrouped = default_config(geometry(conv(c, c, hw, 3, stride, epilogue=(RELU,))), isa)
        assert ungrouped["split"] == int(splits), ungrouped
        for group in (4, 2):   # a block, two blocks a group
            workload = conv(c, c, hw, 3, stride, group=group, epilogue=(RELU,))
            config = default_config(geometry(workload), isa)
            assert config["split"] == 0, (hw, group, config)
            err = _check(workload, config, rng)
            assert err < 1e-5, f"{hw} group {group} {config}: relative L2 {err:.2e}"


NARROW = [c for c in CASES if c.startswith("narrow_groups")]


@pytest.mark.parametrize("case", NARROW)
def test_narrow_groups_reduce_over_their_own_channels_only(case):
    """A widened conv of narrow groups is reduced like a depthwise one (a vector of
    channels a tile) over its groups' channels: the geometry counts their multiply-adds,
    the config space holds one-vector tiles, the report names the algorithm, and its
    source shuffles each input channel to its group's lanes."""
    workload = CASES[case]
    g = geometry(workload)
    width = dict(workload.attrs)["group_width"]
    assert g.group_width == width and g.within_vector and not g.depthwise and g.groups == 1
    n, _, oh, ow, _ = workload.outputs[0].shape
    assert g.flops == 2 * n * g.out_channels * oh * ow * g.r * g.s * width
    assert MicroSpace(g).space()["kv"] == (1,) and not splittable(g)
    config = default_config(g)
    assert MICRO_NCHWC.algorithm(workload, config) == \
        f"grouped, {width} channels a group in a vector"
    source = conv_source(g, config)
    assert f"#define GW {width}" in source and "__builtin_shuffle" in source


SPARSE = [c for c in CASES if c.startswith("sparse_groups")]


@pytest.mark.parametrize("case", SPARSE)
def test_sparse_groups_reduce_each_tile_over_its_groups_blocks_only(case):
    """A dense conv of sparse groups reduces each tile of output channels over the input
    blocks that hold its channels' groups: every weight outside a tile's band is zero,
    the band is no wider than the blocks its groups span, the geometry counts the groups'
    multiply-adds, the report names the algorithm and the source holds the bands."""
    workload = CASES[case]
    g = geometry(workload)
    groups = dict(workload.attrs)["sparse_groups"]
    assert g.sparse_groups == groups and g.groups == 1 and not g.within_vector
    n, _, oh, ow, _ = workload.outputs[0].shape
    assert g.flops == 2 * n * g.out_channels * oh * ow * g.r * g.s * g.in_channels // groups
    weight = random_inputs(workload, np.random.default_rng(0))[1]
    in_group, out_group = g.in_channels // groups, g.out_channels // groups
    for isa in (i for i in USABLE if B % ISAS[i].lanes == 0):
        lanes = ISAS[isa].lanes
        for kv in MicroSpace(g, (isa,)).space()["kv"]:
            bands = g.tile_bands(lanes, kv)
            assert len(bands) == -(-g.out_vectors(lanes) // kv)
            for t, (first, count) in enumerate(bands):
                rows = weight[t * kv * lanes:(t + 1) * kv * lanes]
                if not len(rows):   # a tile of padding lanes only
                    continue
                used = np.flatnonzero(np.abs(rows).sum(axis=(0, 2, 3)))
                assert used.min() // g.in_block >= first
                assert used.max() // g.in_block < first + count
                spanned = (min(t * kv * lanes + kv * lanes, g.out_channels) - 1) // out_group \
                    - t * kv * lanes // out_group + 1
                assert count <= -(-spanned * in_group // g.in_block) + 1
    config = default_config(g)
    assert f"{groups} groups in bands of blocks" in MICRO_NCHWC.algorithm(workload, config)
    assert config["kv"] == (2 if g.out_vectors(ISAS[config["isa"]].lanes) > 1 else 1)
    assert "BAND_BASE" in conv_source(g, config)


def test_sparse_groups_refuse_what_they_cannot_compute(rng):
    """A filter not zero outside its tiles' bands is refused at prepare (the planner keeps
    another kernel); a `sparse_groups` that does not divide the channels says why."""
    workload = CASES["sparse_groups_1x1"]
    inputs = random_inputs(workload, rng)
    dense = inputs[1].copy()
    dense[0, -1] = 1.0   # output channel 0 (group 0) reading the last group's last channel
    with pytest.raises(ValueError, match="not zero outside its sparse groups"):
        MICRO_NCHWC.prepare(workload, {1: dense, 2: inputs[2]}, default_config(geometry(workload)))
    odd = conv(2 * B + 2, 2 * B + 2, (5, 5), 1, sparse_groups=4)
    assert "divide" in MICRO_NCHWC.unsupported_reason(odd)


@pytest.mark.parametrize("isa", list(ISAS))
def test_strided_narrow_groups_default_to_narrow_tiles_on_long_rows(isa, rng):
    """A strided conv of narrow groups takes 4-pixel tiles on rows of 28 output pixels or
    more (its shuffled inputs crowd a wider tile's registers), 8 on shorter rows and
    stride 1; each default matches the reference."""
    skip_unless_blocks_run(isa)
    for hw, stride, px in (((56, 56), 2, 4), ((26, 26), 2, 8), ((28, 28), 1, 8)):
        workload = narrow(1, hw, 3, 2, stride=stride, epilogue=(RELU,))
        config = default_config(geometry(workload), isa)
        assert config["px"] == px, (hw, stride, config)
        err = _check(workload, config, rng)
        assert err < 1e-5, f"{hw} {config}: relative L2 {err:.2e}"


def test_narrow_groups_refuse_what_they_cannot_compute(rng):
    """A filter that is not zero outside its groups is refused at prepare (the planner then
    keeps another kernel); a group wider than an ISA's vector is not in its config space;
    a `group_width` that does not fit the widened layout says why."""
    workload = CASES["narrow_groups_3x3"]
    inputs = random_inputs(workload, rng)
    dense = inputs[1].copy()
    dense[0, -1] = 1.0   # output channel 0 reading the block's last lane: another group's
    with pytest.raises(ValueError, match="not zero outside its groups"):
        MICRO_NCHWC.prepare(workload, {1: dense, 2: inputs[2]}, default_config(geometry(workload)))
    wide = geometry(narrow(1, (5, 5), 3, 8)) if B == 16 else None
    if wide is not None:
        assert "portable" not in MicroSpace(wide).isas
        portable = dict(default_config(wide, "avx2"), isa="portable")
        assert "whole groups" in config_reason(wide, portable)
    odd = conv(2 * B, 2 * B, (5, 5), 3, group=2, group_width=3)
    assert "dividing the block" in MICRO_NCHWC.unsupported_reason(odd)


def test_concurrent_calls_of_a_split_kernel_each_get_their_own_scratch(rng):
    """Two threads calling one phase-split kernel at once (ctypes lets go of the GIL during
    a call) on different images: each output is its own image's conv, i.e. the calls never
    share the buffer the split writes."""
    workload = conv(3 * B, 2 * B, (40, 40), 3, epilogue=(RELU,))
    config = dict(default_config(geometry(workload), USABLE[0]), split=1)
    first = random_inputs(workload, rng)
    second = [rng.standard_normal(first[0].shape).astype(np.float32), *first[1:]]
    kernel = MICRO_NCHWC.prepare(workload, {i: first[i] for i in workload.const_inputs},
                                 config)
    expected = [nchwc_reference(workload, inputs)[0] for inputs in (first, second)]
    errors = []

    def calls(inputs, reference):
        out = np.empty(workload.outputs[0].shape, np.float32)
        for _ in range(40):
            kernel(inputs, [out])
            errors.append(relative_l2(out, reference))

    threads = [threading.Thread(target=calls, args=pair)
               for pair in zip((first, second), expected)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 80 and max(errors) < 1e-5, max(errors)


def test_phase_split_sizes_its_scratch_buffer():
    """The split of a 3x3 stride-2 conv holds 2 x 2 phases padded to whole windows; a strided
    1x1 conv's only one phase (a subsample); no split, no buffer."""
    g = geometry(CASES["3x3_stride2_residual"])   # 11 x 10 -> 6 x 5, pads 1
    config = dict(default_config(g), split=1)
    assert split_floats(g, config) == g.cb * 4 * (6 + 1) * (5 + 1) * B
    assert split_floats(g, dict(config, split=0)) == 0
    one = geometry(CASES["1x1_stride2_batch2"])     # 9 x 9 -> 5 x 5, two images
    assert split_floats(one, dict(default_config(one), split=1)) == 2 * one.cb * 25 * B
    assert default_config(one)["split"] == 1 and default_config(g)["split"] == 1
    stem_g = geometry(CASES["stem_7x7_stride2"])
    assert default_config(stem_g)["split"] == 0   # one float per phase pixel: slower


def test_stem_reads_nchw_input_channels_one_by_one():
    g = geometry(CASES["stem_7x7_stride2"])
    # only asked for: kernels on this geometry for blocked inputs (Winograd) keep refusing it
    assert "blocked input" in conv_geometry(CASES["stem_7x7_stride2"])
    assert g.nchw_input and g.in_block == 1 and g.cb == 3 and (g.sh, g.pt) == (2, 3)
    assert MicroSpace(g).space()["split"] == (0, 1)
    source = conv_source(g, default_config(g))
    assert "#define IB 1\n" in source and "#define XSTEP 2\n" in source


def test_every_remainder_tile_and_chunking(rng):
    """Rows of 37 pixels with every tile width: the interior's last smaller tile is each
    of 1 .. px-1 somewhere, the column chunks split rows; units of 1, 2 and 3 of the 5 rows
    (the last block partial)."""
    workload = conv(3 * B, 2 * B, (5, 37), 3, epilogue=(RELU,))   # 2 passes of cbt 2
    isa = USABLE[0]
    for px, rows in ((2, 1), (3, 2), (5, 3), (7, 2)):
        config = {"isa": isa, "kv": 1, "px": px, "unroll": 4, "cbt": 2, "split": 0, "rows": rows}
        assert _check(workload, config, rng) < 1e-5


def test_avx2_source_uses_eight_lanes_and_its_flags():
    g = geometry(CASES["3x3_odd_channels"])
    source = conv_source(g, {"isa": "avx2", "kv": 2, "px": 6, "unroll": 16, "cbt": 1,
                             "split": 0, "rows": 1})
    assert "vector_size(8 * 4)" in source and "#define VW 8" in source
    assert "-march=x86-64-v3" in compile_flags(ISAS["avx2"])
    assert "-march=x86-64-v4" in compile_flags(ISAS["avx512"])
    portable = compile_flags(ISAS["portable"])
    assert not any(f.startswith("-march=x86") for f in portable)


@pytest.mark.skipif(not {"avx2", "avx512"} & set(USABLE), reason="x86 FMA ISAs only")
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_register_tiles_keep_every_vector_in_registers(isa, tmp_path):
    """Tiles that fill the registers (2 x 6 of 16 on AVX2, 4 x 6 and 2 x 12 of 32 on
    AVX-512), on ResNet-50 shapes where gcc 12 spilled vectors of the 2 x 6 tile functions
    (6 stack accesses in the full tile) when their FMAs were `+=`: no tile function touches
    the stack."""
    if isa not in USABLE:
        pytest.skip(f"this host cannot run {isa} code")
    lanes = ISAS[isa].lanes
    tiles = [(2, 6)] if lanes == 8 else [(4, 6), (2, 12)]
    shapes = [(conv(1024, 512, (14, 14), 1), 0), (conv(512, 512, (7, 7), 3), 0),
              (conv(128, 128, (28, 28), 3), 1), (conv(256, 256, (28, 28), 3, stride=2), 1)]
    for workload, split in shapes:
        g = geometry(workload)
        for kv, px in tiles:
            config = dict(default_config(g, isa), kv=kv, px=px, split=split)
            found = stack_accesses(conv_source(g, config), compile_flags(ISAS[isa]),
                                   tmp_path, ("tile_",))
            # (gcc folds identical tiles into one: a split conv's edge and full tiles)
            assert found and not any(found.values()), (workload.label, config, found)


def test_config_space_rejects_what_does_not_fit():
    g = geometry(CASES["3x3_odd_channels"])
    fits = {"isa": "portable", "kv": 3, "px": 3, "unroll": 1, "cbt": 1, "split": 0, "rows": 1}
    assert config_reason(g, fits) is None
    # 4 x 3 accumulators + 4 weight vectors + a broadcast: 17 of 16 registers
    assert "registers" in config_reason(g, dict(fits, kv=4))
    assert "knobs" in config_reason(g, {"isa": "portable", "kv": 1})
    assert "unknown" in config_reason(g, dict(fits, isa="sse9"))
    kv = g.out_vectors(ISAS["portable"].lanes) + 1
    too_many = config_reason(g, dict(fits, kv=kv, px=1))
    assert "vectors" in too_many
    dw = geometry(CASES["depthwise_3x3"])
    assert "depthwise" in config_reason(dw, dict(fits, kv=2, px=1))
    assert config_reason(g, dict(fits, split=1)) is None   # padded 3x3: the padding written out
    flat = geometry(CASES["1x1_four_outputs"])
    assert "strided or padded" in config_reason(flat, dict(fits, split=1))   # nothing to split
    assert "split" in config_reason(g, dict(fits, split=2))
    for workload in CASES.values():
        found = geometry(workload)
        assert config_reason(found, default_config(found)) is None


PREFETCHED = ("3x3_odd_channels", "3x3_stride2_residual", "1x1_stride2_batch2",
              "1x1_flat_residual_clip", "stem_7x7_stride2", "grouped_3x3_residual")


@pytest.mark.parametrize("case", PREFETCHED)
def test_prefetch_knob_builds_correct_kernels_one_block_ahead(case, rng):
    """pf 1 and 4 (with the phase split off and on where it applies) compute what pf 0
    does; each tap prefetches its pixels `pf` input blocks ahead: PLANE is the distance
    between input blocks of what the tile reads (the image, or the phase split)."""
    workload, isa = CASES[case], USABLE[0]
    g = geometry(workload)
    if B % ISAS[isa].lanes:
        pytest.skip(f"block {B} is not a multiple of {isa}'s lanes")
    for split in ((0, 1) if g.strided else (0,)):
        for pf in (1, 4):
            config = dict(default_config(g, isa), split=split, pf=pf)
            assert _check(workload, config, rng) < 1e-5, config
            source = conv_source(g, config)
            assert f"#define PF {pf}\n" in source and "__builtin_prefetch(xp + PF * PLANE" \
                in source
            plane = int(source.split("#define PLANE ")[1].split("\n")[0])
            if split:
                assert plane * g.n * g.cb == split_floats(g, config)
            else:
                assert plane == g.h * g.w * g.in_block


def test_configs_without_the_prefetch_knob_build_the_kernel_they_built_before():
    """`pf` is optional: a config (or tuning record) from before it existed is valid and
    its source has no prefetch; the space offers it for regular convs only."""
    g = geometry(CASES["3x3_odd_channels"])
    config = default_config(g)
    assert "pf" not in config and config_reason(g, config) is None
    source = conv_source(g, config)
    assert source == conv_source(g, dict(config, pf=0))
    assert "__builtin_prefetch" not in source and "#define PF" not in source
    assert MicroSpace(g).space()["pf"] == (0, 1, 2, 4)
    assert "pf" in config_reason(g, dict(config, pf=3))
    dw = geometry(CASES["depthwise_3x3"])
    assert MicroSpace(dw).space()["pf"] == (0,)
    assert "depthwise" in config_reason(dw, dict(default_config(dw), pf=1))
    assert "knobs" in config_reason(g, dict(config, prefetch=1))


def _float64_activation(step: str):
    from math import erf, exp, log1p, sqrt, tanh

    def sigmoid(v):
        return 1 / (1 + exp(-v)) if v > -700 else 0.0

    def softplus(v):
        return v + log1p(exp(-v)) if v > 0 else log1p(exp(v))

    return {"gelu": lambda v: v * (1 + erf(v / sqrt(2))) / 2, "tanh": tanh, "sigmoid": sigmoid,
            # alpha as the kernel reads it, a float32 (e^(alpha x) magnifies its rounding)
            "quick_gelu": lambda v: v * sigmoid(float(np.float32(QUICK_GELU_ALPHA)) * v),
            "mish": lambda v: v * tanh(softplus(v))}[step]


QUICK_GELU_ALPHA = 1.702
EXTREME_STEPS = {"gelu": EpilogueStep("gelu"), "tanh": EpilogueStep("tanh"),
                 "sigmoid": EpilogueStep("sigmoid"), "mish": EpilogueStep("mish"),
                 "quick_gelu": EpilogueStep("quick_gelu", (("alpha", QUICK_GELU_ALPHA),))}


@pytest.mark.parametrize("step", sorted(EXTREME_STEPS))
@pytest.mark.parametrize("isa", USABLE)
def test_vector_activations_match_their_definition_on_extreme_inputs(isa, step):
    """The epilogue's GELU (a vector erf: Abramowitz and Stegun's 7.1.26 on the vector exp
    and reciprocal), tanh, sigmoid, QuickGELU and Mish (x p / (p + 2), p = e^x (e^x + 2)) as
    compiled for each ISA against their definitions in float64, from -200 to 200, near 0
    (tanh's two formulas meet at 1/4) and at +-0: within 2e-7 |x| (GELU's erf) plus a few
    float32 ulp; NaN stays NaN."""
    import ctypes

    from wpk.dsl.toolchain import compile_c, load_function
    from wpk.kernels.cpu.microkernels.templates import VECTOR_HEADER, _epilogue

    lanes = ISAS[isa].lanes
    g = geometry(conv(B, B, (3, 3), 1, epilogue=(EXTREME_STEPS[step],)))
    assert g.activation.lower() == step.replace("_", "")
    source = (VECTOR_HEADER.format(lanes=lanes) + _epilogue(g)
              + "void wpk_act(float *x, int n) {\n"
                f"    for (int i = 0; i < n; i += {lanes}) epilogue(vload(x + i), 0, x + i);\n}}\n")
    run = load_function(compile_c(source, compile_flags(ISAS[isa])).path, "wpk_act",
                        [ctypes.c_void_p, ctypes.c_int])
    x = np.concatenate([np.linspace(-200, 200, 4001), np.linspace(-6, 6, 2401),
                        np.linspace(-0.3, 0.3, 601), [0.25, -0.25, np.nextafter(0.25, 0)],
                        [0.0, -0.0, 1e-30, -1e-30, 87.5, -87.5]]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % 16, np.float32), [np.nan] * 16]).astype(
        np.float32)
    got = x.copy()
    run(got.ctypes.data, len(got))
    assert np.isnan(got[-16:]).all()
    x, got = x[:-16].astype(np.float64), got[:-16].astype(np.float64)
    expected = np.array([_float64_activation(step)(v) for v in x])
    assert np.all(np.isfinite(got))
    error = np.abs(got - expected)
    eps = np.finfo(np.float32).eps
    bound = 4 * eps * np.abs(expected) + (2e-7 * np.abs(x) if step == "gelu" else 1e-30)
    if step == "quick_gelu":   # alpha x rounded to float32 moves e^(alpha x) by |alpha x| eps/2
        bound += eps * np.abs(QUICK_GELU_ALPHA * x * expected)
    assert np.all(error <= bound), (x[error > bound][:5], got[error > bound][:5])


def test_1x1_stride1_convs_are_one_row_of_pixels():
    g = geometry(CASES["1x1_flat_residual_clip"])
    assert g.flattened and (g.h, g.w, g.oh, g.ow) == (1, 35, 1, 35)
    assert not geometry(CASES["1x1_stride2_batch2"]).flattened


def test_unsupported_workloads_say_why():
    grouped = conv(2 * B, 2 * B, (5, 5), 3, group=4)   # half a block per group
    assert "per group" in MICRO_NCHWC.unsupported_reason(grouped)
    plain = Workload("Conv", (TensorSpec((1, 3, 8, 8)), TensorSpec((B, 1, 3, 3))),
                     (TensorSpec((1, 1, 8, 8, B)),), (("block", B), ("channels", B),
                                                     ("group", 3), ("pads", (1, 1, 1, 1))),
                     domain="wpk.nchwc", const_inputs=(1,))
    assert "NCHW input" in MICRO_NCHWC.unsupported_reason(plain)
    variable = conv(B, B, (5, 5), 3)
    variable = Workload(variable.op, variable.inputs, variable.outputs, variable.attrs,
                        domain=variable.domain, const_inputs=(2,))
    assert "filter" in MICRO_NCHWC.unsupported_reason(variable)
    swish = conv(B, B, (5, 5), 3, epilogue=(EpilogueStep("relu"), EpilogueStep("relu")))
    assert MICRO_NCHWC.unsupported_reason(swish) is not None


@pytest.mark.parametrize("case", ["3x3_stride2_residual", "stem_7x7_stride2"])
def test_untuned_build_offers_the_default_next_to_onnxruntime(case):
    """Where onnxruntime's NCHWc conv (its NCHW-input kernel for a stem) is a candidate, so
    is the micro-kernel's default."""
    workload = CASES[case]
    found = {c.implementation.name: c.config for c in registry.candidates(workload, "cpu")}
    assert "ort.nchwc" in found
    assert found["micro.nchwc"] == default_config(geometry(workload))


def test_a_build_verifies_the_stem_micro_kernel_and_matches_onnxruntime(tmp_path, rng):
    """The NCHWc layout pass leaves a first conv reading the NCHW image; an untuned build
    measures the micro-kernel for it (verified) next to onnxruntime's, and the plan's
    output matches onnxruntime's whatever was chosen."""
    import json
    import zipfile

    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import wpk

    weights = {"w1": rng.standard_normal((20, 3, 7, 7)).astype(np.float32) * 0.1,
               "b1": rng.standard_normal(20).astype(np.float32),
               "w2": rng.standard_normal((20, 20, 3, 3)).astype(np.float32) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[7, 7],
                              strides=[2, 2], pads=[3, 3, 3, 3]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], kernel_shape=[3, 3],
                              strides=[2, 2], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 29, 23])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 20, 8, 6])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "stem.onnx")
    wpk.build(str(tmp_path / "stem.onnx"), target="cpu", partition=False,
              output=tmp_path / "stem.wpk")
    report = json.loads(zipfile.ZipFile(tmp_path / "stem.wpk").read("report.json"))
    stem = next(w for w in report["workloads"] if w["label"].startswith("Conv 1x3x29x23"))
    statuses = {c["impl"]: c["status"] for c in stem["candidates"]}
    assert statuses["micro.nchwc"] == "ok" and statuses["ort.nchwc"] == "ok"
    x = rng.standard_normal((1, 3, 29, 23)).astype(np.float32)
    got = wpk.load(tmp_path / "stem.wpk").run({"x": x})["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert relative_l2(got, session.run(None, {"x": x})[0]) < 1e-5


def test_tuner_searches_the_space_and_every_proposal_is_correct(rng):
    """The GA proposes configs from the micro-kernel's space (the DSL templates' interface);
    the valid ones build kernels that match the reference."""
    workload = CASES["3x3_asymmetric_pads"]
    space = SearchSpace.from_template(MicroKernels().template(workload))
    tuner = make_tuner("ga", space, 0)
    batch = tuner.next_batch(4)
    assert batch and all(space.is_valid(space.indices(c)) for c in batch)
    for config in batch[:2]:
        assert _check(workload, config, rng) < 1e-5
    tuner.update(batch, [float(i + 1) for i in range(len(batch))])
    assert tuner.next_batch(2)


# --- the benchmark scripts' pieces ---------------------------------------------------------

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def scripts_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))


def test_cpu_peak_measures_fma_peak_and_bandwidth(scripts_on_path):
    import cpu_peak

    peak = cpu_peak.measure_peak(1, repeat=1)
    assert peak["isa"] == USABLE[0] and peak["lanes"] == ISAS[USABLE[0]].lanes
    assert 0.1 < peak["gflops"] < 1e5
    bandwidth = cpu_peak.measure_bandwidth(1, mib=8, repeat=1)
    assert 0.01 < bandwidth["copy_gbs"] < 1e4 and 0.01 < bandwidth["triad_gbs"] < 1e4


@pytest.mark.parametrize("isa_name", sorted(ISAS))
def test_cpu_peak_chains_fit_the_vector_registers(scripts_on_path, isa_name):
    # 16 chains and the two constants on AVX2's 16 registers spilled to the stack: an AVX2
    # core's peak read 51 GFLOP/s instead of 91, and kernels showed 148% of "peak"
    import cpu_peak

    isa = ISAS[isa_name]
    assert 8 <= cpu_peak.chains(isa) <= isa.registers - 2


def test_cpu_peak_leaves_the_openmp_team_size_alone(scripts_on_path):
    # measuring one thread's peak once set omp_set_num_threads(1) for the whole process:
    # every generated kernel a benchmark timed afterwards ran on one thread
    import ctypes
    import ctypes.util

    import cpu_peak

    gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(3)
    try:
        cpu_peak.measure_peak(2, repeat=1)
        cpu_peak.measure_bandwidth(1, mib=8, repeat=1)
        assert gomp.omp_get_max_threads() == 3
    finally:
        gomp.omp_set_num_threads(before)


def test_bench_summary_checks_the_goals(scripts_on_path):
    from bench_microkernels import summarize

    def row(group, ratio, flops, pct):
        return {"group": group, "ratio_to_ort": ratio, "flops": flops, "label": f"{group} {flops}",
                "percent_of_peak": {"micro": pct}}

    rows = [row("1x1", 1.0, 10, 50.0), row("1x1", 0.9, 20, 85.0), row("1x1", 0.96, 5, 10.0),
            row("3x3 s1", 0.8, 30, 40.0), row("depthwise", 1.2, 1, 5.0),
            row("3x3 s2", 0.7, 3, 1.0), row("3x3 s2", 1.2, 4, 1.0), row("3x3 s2", 1.1, 5, 1.0),
            row("stem", 0.85, 6, 1.0)]
    summary = summarize(rows)
    assert summary["1x1"]["median_ratio_to_ort"] == 0.96 and summary["1x1"]["met"]
    assert not summary["3x3 s1"]["met"] and summary["depthwise"]["met"]
    # stride-2 convs and stems are judged on each conv: a median of 1.1 with one at 0.7 fails
    assert summary["3x3 s2"]["median_ratio_to_ort"] == 1.1 and not summary["3x3 s2"]["met"]
    assert summary["stem"]["met"] and summary["stem"]["goal_on"] == "each"
    assert summary["largest_1x1"] == {"label": "1x1 20", "percent_of_peak": 85.0,
                                      "goal": 80.0, "met": True}


def test_bench_groups_and_grid_cover_the_strided_knobs(scripts_on_path):
    from bench_dsl_cpu import ConvShape
    from bench_microkernels import grid_configs, group_of, nchwc_workload

    stem_shape = ConvShape(3, 224, 224, 64, 7, 7, 2, 3)
    assert group_of(stem_shape) == "stem"
    assert group_of(ConvShape(256, 56, 56, 512, 1, 1, 2, 0)) == "1x1 s2"
    assert len(nchwc_workload(stem_shape, B).inputs[0].shape) == 4   # the NCHW image
    strided = nchwc_workload(ConvShape(64, 14, 14, 64, 3, 3, 2, 1), B)
    grid = grid_configs(MicroKernels().template(strided), 8)
    assert {c["split"] for c in grid} == {0, 1} and len({c["rows"] for c in grid}) == 2


def test_bench_times_sparse_groups_against_onnxruntimes_own_grouped_conv(scripts_on_path):
    """ShuffleNet's grouped 1x1 convs go to the bench as the layout pass writes them (one
    dense group, `sparse_groups`); onnxruntime's NCHW grouped conv, verified, is a peer."""
    import argparse
    import time

    from bench_dsl_cpu import ConvShape
    from bench_microkernels import bench_shape, nchwc_workload, shufflenet_convs

    assert all(dict(nchwc_workload(s, B).attrs).get("sparse_groups") == 4
               for s in shufflenet_convs() if s.c % (4 * B))
    args = argparse.Namespace(threads=1, rounds=1, repeat=1, grid=1, peak=100.0,
                              clock=time.perf_counter, stat="median")
    row = bench_shape(ConvShape(4 * (B + 1), 5, 5, 4 * (B + 1), 1, 1, 1, 0, 4, "test"), args,
                      np.random.default_rng(0))
    assert {"ort", "ort_no_spin", "ort_grouped", "micro"} <= set(row["seconds"])
    assert row["ratio_to_ort"] > 0 and row["ort_relative_l2"] < 1e-4


def test_prefetch_bench_verifies_and_times_every_pf_of_conv_and_gemm(scripts_on_path,
                                                                    tmp_path):
    import json

    import bench_prefetch

    output = tmp_path / "pf.json"
    assert bench_prefetch.main(["--rounds", "1", "--repeat", "1", "--limit", "1",
                                "--output", str(output)]) == 0
    report = json.loads(output.read_text())["rows"][0]
    conv_row, gemm_row = report["conv"]["rows"][0], report["gemm"]["rows"][0]
    assert conv_row["label"].startswith("stem") and set(conv_row["speedup"]) == {"1", "2", "4"}
    assert set(gemm_row["speedup"]) == {"4", "8", "16"} and "bert_base_layer" in gemm_row["label"]
    for row in (conv_row, gemm_row):
        assert max(row["relative_l2"].values()) < 1e-4
        assert all(s > 0 for s in row["speedup"].values())
    assert report["gemm"]["summary"]["8"]["min"] == gemm_row["speedup"]["8"]


def test_search_driver_tunes_micro_kernels_through_records(tmp_path):
    """`tune_workload` with the micro-kernels as the generated family: configs compiled in
    the compile pool, verified and timed in the isolated worker, recorded; the winner is a
    valid config of the space."""
    from wpk.kernels.target import create_target
    from wpk.search.compile_pool import CompilePool
    from wpk.search.driver import tune_workload
    from wpk.search.recorded import RecordedRunner
    from wpk.search.records import RecordStore
    from wpk.search.runner import IsolatedRunner
    from wpk.search.workers import MeasureOptions, MeasureWorker

    workload = CASES["3x3_odd_channels"]
    generated = MicroKernels()
    with MeasureWorker(MeasureOptions(warmup=1, repeats=3, min_time=0.002)) as worker, \
            CompilePool(jobs=2) as pool:
        runner = RecordedRunner(IsolatedRunner(options=worker.options, worker=worker),
                                RecordStore(tmp_path / "r.jsonl"),
                                create_target("cpu").fingerprint())
        result = tune_workload(workload, "ga", trials=4, runner=runner, generated=generated,
                               compile_pool=pool, seed=1, finalize_k=2)
    assert result.trials == 4 and result.failed == 0
    assert config_reason(geometry(workload), result.best_config) is None
    assert result.final_s is not None and math.isfinite(result.final_s)


@pytest.mark.parametrize("isa", list(ISAS))
def test_the_last_tile_computes_only_its_vectors_its_last_a_half_vector(isa, rng):
    """Where KV tiles overhang the output vectors (5 vectors in tiles of 2) or the last
    vector holds at most half a vector of real channels (24 or 116 channels in blocks of
    16), the last tile is a function of its own: only its vectors, the last of them a half
    vector (256-bit FMAs on AVX-512), its padding lanes written as zeros; 1x1, 3x3 direct
    and phase split, residual and activation, every tile width."""
    skip_unless_blocks_run(isa)
    lanes = ISAS[isa].lanes
    with_last = 0
    for cout, kv in ((24, 2), (40, 2), (116, 4), (50, 3), (2 * B, 2)):
        for workload in (conv(20, cout, (9, 7), 3, residual=True, epilogue=(ADD3, RELU)),
                         conv(B + 3, cout, (11, 10), 3, stride=2),
                         conv(2 * B, cout, (5, 7), 1, epilogue=(RELU,))):
            g = geometry(workload)
            vectors = g.out_vectors(lanes)
            last_kv = vectors - (-(-vectors // kv) - 1) * kv
            half = half_last(cout, vectors, lanes)
            for px, split in ((1, 0), (3, 1), (6, 0)):
                config = dict(default_config(g, isa), kv=kv, px=px, split=split)
                if MicroSpace(g, (isa,)).validate(config):
                    continue
                source = conv_source(g, config)
                assert ("tile_full_last" in source) == (last_kv < kv or half), config
                assert ("= vhload(ws + " in source) == half, config   # a half weight vector
                with_last += last_kv < kv or half
                err = _check(workload, config, rng)
                assert err < 1e-5, f"{workload.label} {config}: relative L2 {err:.2e}"
    assert with_last >= 4


@pytest.mark.skipif(not {"avx2", "avx512"} & set(USABLE), reason="x86 FMA ISAs only")
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_last_tile_with_a_half_vector_keeps_every_vector_in_registers(isa, tmp_path):
    """The last tile of a conv with 116 and 232 output channels (ShuffleNet's) at the
    register-filling tiles: its half vector and its widened store touch no stack."""
    if isa not in USABLE:
        pytest.skip(f"this host cannot run {isa} code")
    lanes = ISAS[isa].lanes
    tiles = [(2, 6)] if lanes == 8 else [(4, 6), (2, 12)]
    for workload in (conv(116, 116, (28, 28), 1), conv(232, 232, (14, 14), 3)):
        g = geometry(workload)
        for kv, px in tiles:
            config = dict(default_config(g, isa), kv=kv, px=px)
            found = stack_accesses(conv_source(g, config), compile_flags(ISAS[isa]),
                                   tmp_path, ("tile_",))
            assert found and not any(found.values()), (workload.label, config, found)
