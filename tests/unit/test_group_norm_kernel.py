"""GroupNorm: `groupnorm.c` (kernels/cpu/group_norm_native) against the float64 reference,
plain (rank 3 to 5, odd and one-pixel images, 1 to 32 channels a group, batches, runtime
scale and bias) and blocked (b of 8 and 16, groups inside a block, across blocks and
straddling two, a partial last block whose input padding lanes hold NaN or huge values and
whose output padding lanes must be 0), with SiLU and ReLU, values far from zero (the
corrected two-pass numerics), an AVX2 build, the native chain, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from tests.isa import forced_isa
from tests.unit.native_checks import assert_chain_matches
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.group_norm_native import GROUP_NORM_C, blocked_split, group_norm_c_reason
from wpk.kernels.reference import reference

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

T = TensorSpec
SILU, RELU = (EpilogueStep("silu"),), (EpilogueStep("relu"),)


def plain_norm(x, groups, epilogue=(), consts=(1, 2), eps=1e-5, dtype="float32") -> Workload:
    """A plain GroupNorm of an X of shape `x`."""
    c = (x[1],)
    return Workload("GroupNorm", (T(x, dtype), T(c, dtype), T(c, dtype)), (T(x, dtype),),
                    (("epsilon", eps), ("groups", groups)), tuple(epilogue), "wpk",
                    tuple(consts))


def blocked_norm(n, channels, h, w, block, groups, epilogue=(), consts=(1, 2)) -> Workload:
    """A blocked GroupNorm of N x C x H x W in blocks of `block` lanes."""
    x = T((n, -(-channels // block), h, w, block))
    c = T((channels,))
    return Workload("GroupNorm", (x, c, c), (x,),
                    (("block", block), ("channels", channels), ("epsilon", 1e-5),
                     ("groups", groups)), tuple(epilogue), "wpk.nchwc", tuple(consts))


def arrays_for(w: Workload, rng, centre=2.0, spread=3.0, padding=np.nan) -> list[np.ndarray]:
    """X about `centre` with `spread` (a blocked X's padding lanes hold `padding`), scale and
    bias."""
    x = (rng.standard_normal(w.inputs[0].shape) * spread + centre).astype(np.float32)
    if w.domain == "wpk.nchwc":
        x[:, -1, ..., int(w.attr("channels")) % int(w.attr("block")) or x.shape[-1]:] = padding
    scale = rng.uniform(0.5, 1.5, w.inputs[1].shape).astype(np.float32)
    return [x, scale, rng.standard_normal(w.inputs[2].shape).astype(np.float32)]


def run(w: Workload, arrays: list[np.ndarray], par: int = 1) -> np.ndarray:
    """The kernel's output (poisoned beforehand, so every element must be written)."""
    consts = {i: arrays[i] for i in w.const_inputs}
    out = np.full(w.outputs[0].shape, np.nan, np.float32)
    GROUP_NORM_C.prepare(w, consts, {"par": par})(arrays, [out])
    return out


def assert_matches(w: Workload, arrays: list[np.ndarray], out: np.ndarray) -> None:
    """Within float32 rounding of the float64 reference: relative L2 and the largest error
    next to the output's scale; a blocked output's padding lanes exactly 0."""
    expected = reference(w, arrays)[0]
    assert np.isfinite(out).all()
    assert relative_l2(out, expected) < 1e-6
    assert np.abs(out - expected).max() <= 1e-5 * np.abs(expected).max()
    if w.domain == "wpk.nchwc":
        real = int(w.attr("channels")) % int(w.attr("block"))
        if real:
            assert (out[:, -1, ..., real:] == 0).all()


PLAIN = {
    "rank3": dict(x=(2, 8, 33), groups=4),
    "rank4_odd": dict(x=(2, 12, 5, 7), groups=4),
    "rank5": dict(x=(1, 6, 3, 4, 5), groups=2),
    "one_pixel": dict(x=(1, 64, 1, 1), groups=32),
    "one_channel_a_group": dict(x=(2, 32, 3, 3), groups=32),
    "four_channels_silu": dict(x=(1, 128, 8, 8), groups=32, epilogue=SILU),
    "thirty_two_channels": dict(x=(1, 64, 9, 9), groups=2),
    "relu": dict(x=(2, 24, 6, 5), groups=8, epilogue=RELU),
    "runtime_scale_and_bias": dict(x=(2, 16, 7, 3), groups=4, consts=()),
}


@pytest.mark.parametrize("case", PLAIN)
@pytest.mark.parametrize("par", [1, 0])
def test_plain_matches_the_reference(rng, case, par):
    w = plain_norm(**PLAIN[case])
    assert group_norm_c_reason(w) is None
    arrays = arrays_for(w, rng)
    assert_matches(w, arrays, run(w, arrays, par))


BLOCKED = {   # n, C, h, w, block, groups, epilogue
    "straddling_groups_b16": (1, 24, 5, 7, 16, 8, ()),    # group 5: channels 15-17
    "straddling_groups_b8": (2, 12, 4, 4, 8, 4, SILU),    # partial block of 4 lanes
    "groups_across_blocks": (1, 64, 6, 6, 16, 2, ()),     # 32 channels: two blocks a group
    "groups_inside_a_block": (1, 32, 5, 5, 8, 16, RELU),  # two channels a group
    "one_channel_a_group": (2, 20, 3, 3, 8, 20, ()),
    "one_pixel": (1, 24, 1, 1, 16, 6, SILU),
    "three_channels_a_group": (2, 96, 4, 6, 16, 32, SILU),
    "unequal_chunks": (1, 32, 30, 30, 16, 8, SILU),      # 14 chunks, the last shorter
    "unet_block": (1, 64, 32, 32, 16, 32, SILU),
    "runtime_scale_and_bias": (1, 40, 5, 7, 16, 10, RELU),
}


@pytest.mark.parametrize("case", BLOCKED)
@pytest.mark.parametrize("par", [1, 0])
def test_blocked_matches_the_reference(rng, case, par):
    *shape, epilogue = BLOCKED[case]
    consts = () if case == "runtime_scale_and_bias" else (1, 2)
    w = blocked_norm(*shape, epilogue=epilogue, consts=consts)
    assert group_norm_c_reason(w) is None
    arrays = arrays_for(w, rng)
    assert_matches(w, arrays, run(w, arrays, par))


def test_the_unequal_chunks_case_splits_a_block_unevenly():
    k, chunk = blocked_split(blocked_norm(*BLOCKED["unequal_chunks"][:6]))
    assert k > 1 and k * chunk > 900 > (k - 1) * chunk


@pytest.mark.parametrize("padding", [np.nan, 1e30, -np.inf])
@pytest.mark.parametrize("groups", [4, 12])
def test_garbage_in_the_input_padding_lanes_is_ignored(rng, padding, groups):
    w = blocked_norm(1, 24, 6, 6, 16, groups, epilogue=SILU)
    arrays = arrays_for(w, rng, padding=padding)
    assert_matches(w, arrays, run(w, arrays))


@pytest.mark.parametrize("w", [plain_norm((1, 32, 16, 16), 8, SILU),
                               blocked_norm(1, 48, 16, 16, 16, 16, SILU),
                               blocked_norm(1, 48, 16, 16, 16, 24, SILU),
                               blocked_norm(1, 20, 7, 9, 8, 5)],
                         ids=["plain", "b16_three_channels", "b16_two_channels", "b8"])
def test_values_far_from_zero_keep_their_digits(rng, w):
    """Values about 1000 with a spread of 1: a mean subtracted in float alone (or
    x * a + (b - mean * a)) would be off by its rounding, 3e-5."""
    arrays = arrays_for(w, rng, centre=1000.0, spread=1.0)
    assert_matches(w, arrays, run(w, arrays))


def test_a_constant_group_gives_its_bias():
    """Zero variance: the output is the channel's bias (eps keeps the division finite)."""
    w = plain_norm((1, 4, 3, 3), 2)
    x = np.full((1, 4, 3, 3), 5.0, np.float32)
    scale = np.array([2.0, 3.0, 1.0, 4.0], np.float32)
    bias = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    out = run(w, [x, scale, bias])
    np.testing.assert_allclose(out, np.broadcast_to(bias.reshape(1, 4, 1, 1), x.shape))


@pytest.mark.parametrize("w", [plain_norm((2, 24, 5, 7), 8, SILU),
                               blocked_norm(1, 24, 5, 7, 16, 8, SILU),
                               blocked_norm(2, 12, 4, 4, 8, 4, RELU)],
                         ids=["plain", "b16", "b8"])
def test_an_avx2_build_matches(rng, w):
    """Blocks of 8 or 16 lanes and the plain form built for an AVX2-only CPU."""
    arrays = arrays_for(w, rng)
    with forced_isa("avx2"):
        out = run(w, arrays)
    assert_matches(w, arrays, out)


@pytest.mark.parametrize("w", [plain_norm((2, 16, 8, 8), 4, SILU),
                               blocked_norm(1, 24, 8, 8, 16, 8, SILU)], ids=["plain", "blocked"])
def test_the_native_form_computes_the_same_in_a_chain(rng, w):
    arrays = arrays_for(w, rng)
    kernel = GROUP_NORM_C.prepare(w, {1: arrays[1], 2: arrays[2]}, {"par": 1})
    assert_chain_matches(kernel, arrays, reference(w, arrays)[0])


def test_the_planner_offers_it_next_to_onnxruntime():
    plain_names = {c.implementation.name for c in registry.candidates(plain_norm((1, 64, 8, 8),
                                                                                  32, SILU))}
    assert {"groupnorm.c", "ort.group_norm"} <= plain_names
    blocked = registry.candidates(blocked_norm(1, 64, 8, 8, 16, 32, SILU))
    assert "groupnorm.c" in {c.implementation.name for c in blocked}


def test_configs_and_algorithm():
    w, b = plain_norm((1, 8, 4, 4), 2), blocked_norm(1, 8, 4, 4, 8, 2)
    assert GROUP_NORM_C.configs(w) == [{"par": 1}, {"par": 0}]
    assert GROUP_NORM_C.algorithm(w, {"par": 1}) == "three passes"
    assert GROUP_NORM_C.algorithm(b, {"par": 0}) == "three passes, blocked, one thread"


def test_par_is_0_or_1():
    with pytest.raises(ValueError, match="par is 0 or 1"):
        GROUP_NORM_C.prepare(plain_norm((1, 8, 4, 4), 2), {}, {"par": 2})


@pytest.mark.parametrize("w, words", [
    (plain_norm((1, 8, 4, 4), 2, (EpilogueStep("add", operand=0),)), "unary steps only"),
    (plain_norm((1, 8, 4, 4), 2, (EpilogueStep("exp"),)), "Exp"),
    (plain_norm((1, 8, 4, 4), 2, (EpilogueStep("gelu_tanh"),)), "gelu_tanh"),
    (plain_norm((1, 8, 4, 4), 2, SILU + RELU), "one unary activation"),
    (plain_norm((1, 8, 4, 4), 2, dtype="float64"), "float32"),
    (plain_norm((1, 8, 4, 4), 3), "must divide"),
    (blocked_norm(1, 12, 4, 4, 8, 4, (EpilogueStep("sigmoid"),)), "map 0 to 0"),
    (Workload("Softmax", (T((4, 8)),), (T((4, 8)),)), "GroupNorm only"),
])
def test_what_it_refuses(w, words):
    assert words in group_norm_c_reason(w)
    assert words in GROUP_NORM_C.unsupported_reason(w)
    with pytest.raises(ValueError):
        GROUP_NORM_C.prepare(w, {}, {"par": 1})


def test_a_plain_sigmoid_is_computed(rng):
    """Only the blocked form needs act(0) == 0."""
    w = plain_norm((1, 8, 5, 5), 4, (EpilogueStep("sigmoid"),))
    assert group_norm_c_reason(w) is None
    arrays = arrays_for(w, rng)
    assert_matches(w, arrays, run(w, arrays))
