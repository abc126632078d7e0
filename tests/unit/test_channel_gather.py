"""The blocked ChannelGather (kernels/cpu/channel_gather.py, and onnxruntime's and numpy's
forms of it): every implementation against the float64 reference on odd channel counts,
dirty padding lanes, several images, one pixel and the threaded path, for both block
sizes; its native form in a chain; how its terms are grouped."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import nchwc_format as fmt
from wpk.kernels import registry
from wpk.kernels.cpu.channel_gather import PAR_MIN, gather_terms
from wpk.kernels.cpu.native_chain import chain_kernel
from wpk.kernels.nchwc_reference import nchwc_reference

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

BLOCKS = (8, 16)


def _gather(b: int, channels: tuple[int, ...], indices, n: int = 1, hw=(5, 7)) -> Workload:
    ins = tuple(TensorSpec(fmt.blocked_shape((n, c, *hw), b), "float32") for c in channels)
    out = TensorSpec(fmt.blocked_shape((n, len(indices), *hw), b), "float32")
    return Workload("ChannelGather", ins, (out,),
                    (("block", b), ("channels", len(indices)),
                     ("indices", tuple(int(i) for i in indices))), domain="wpk.nchwc")


def _shuffle_halves(b: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    """ShuffleNet's block end on two inputs of `half` channels each: Concat, shuffle with
    2 groups, Split in two; each half as indices into the padded lanes."""
    padded = fmt.round_up(half, b)
    lanes = np.array([*range(half), *(padded + i for i in range(half))])
    shuffled = lanes.reshape(2, half).T.ravel()
    return shuffled[:half], shuffled[half:]


def _cases(b: int) -> dict[str, Workload]:
    half = 2 * b + 5   # a partial last block, as ShuffleNet's 58 and 116
    first, second = _shuffle_halves(b, half)
    big = fmt.round_up(PAR_MIN // (40 * 40) + 1, b)   # more than PAR_MIN floats out
    rng = np.random.default_rng(7)
    return {
        "shuffle, first half": _gather(b, (half, half), first),
        "shuffle, second half": _gather(b, (half, half), second),
        "shuffle, aligned halves": _gather(b, (2 * b, 2 * b), _shuffle_halves(b, 2 * b)[0]),
        "concat of odd counts, 2 images": _gather(
            b, (3, b + 1), [0, 1, 2, *(fmt.round_up(3, b) + i for i in range(b + 1))], n=2),
        "three inputs, random lanes, repeats": _gather(
            b, (b + 3, 5, 2 * b), rng.choice(
                np.r_[0:b + 3, 2 * b:2 * b + 5, 3 * b:5 * b], size=3 * b + 1)),
        "one pixel": _gather(b, (half, half), second, hw=(1, 1)),
        "threads": _gather(b, (big, big), _shuffle_halves(b, big)[1], hw=(40, 40)),
    }


CASES = [pytest.param(b, name, id=f"b{b}-{name}") for b in BLOCKS for name in _cases(b)]


def _implementations(b: int) -> list[str]:
    """onnxruntime's blocked region form only runs with the host's block."""
    return ["native.nchwc", "numpy.nchwc"] + (["ort.nchwc"] if b == fmt.host_block_size()
                                              else [])


def _inputs(workload: Workload, rng) -> list[np.ndarray]:
    """Random inputs, padding lanes included (dirty: the gather must not read them)."""
    return [rng.standard_normal(s.shape).astype(np.float32) for s in workload.inputs]


def _run(kernel, workload: Workload, inputs) -> np.ndarray:
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)   # every lane must be written
    kernel(inputs, [y])
    return y


@pytest.mark.parametrize(("b", "name"), CASES)
def test_every_implementation_matches_the_reference(b, name, rng):
    workload = _cases(b)[name]
    for impl_name in _implementations(b):
        impl = registry.get(impl_name)
        assert impl.unsupported_reason(workload) is None, impl_name
        kernel = impl.prepare(workload, {}, {})
        for _ in range(2):   # new buffers: the table is rebuilt, not stale
            inputs = _inputs(workload, rng)
            expected = nchwc_reference(workload, inputs)[0].astype(np.float32)
            np.testing.assert_array_equal(_run(kernel, workload, inputs), expected,
                                          err_msg=impl_name)


def test_the_reference_takes_the_indexed_lanes_and_zero_padding(rng):
    b = 8
    workload = _gather(b, (3, 2), [8, 0, 9], hw=(1, 2))
    x0, x1 = _inputs(workload, rng)
    y = nchwc_reference(workload, [x0, x1])[0]
    np.testing.assert_array_equal(y[0, 0, :, :, :3],
                                  np.stack([x1[0, 0, :, :, 0], x0[0, 0, :, :, 0],
                                            x1[0, 0, :, :, 1]], axis=-1))
    assert not y[0, 0, :, :, 3:].any()


@pytest.mark.parametrize(("b", "name"), CASES)
def test_its_native_form_in_a_chain_computes_the_same(b, name, rng):
    workload = _cases(b)[name]
    kernel = registry.get("native.nchwc").prepare(workload, {}, {})
    inputs = _inputs(workload, rng)
    y = np.full(workload.outputs[0].shape, np.nan, np.float32)
    call = kernel.native(inputs, [y])
    assert call is not None
    chain_kernel([call, call], keep=[kernel])([], [])
    np.testing.assert_array_equal(y, _run(kernel, workload, inputs))


def test_its_native_form_declines_views_and_overlaps(rng):
    workload = _cases(8)["shuffle, first half"]
    kernel = registry.get("native.nchwc").prepare(workload, {}, {})
    inputs = _inputs(workload, rng)
    y = np.empty(workload.outputs[0].shape, np.float32)
    strided = np.empty((*inputs[0].shape[:-1], 16), np.float32)[..., :8]
    assert kernel.native([strided, inputs[1]], [y]) is None
    assert y.shape == inputs[1].shape
    assert kernel.native([inputs[0], y], [y]) is None   # in place: lanes overwritten early


def test_a_shuffled_block_takes_one_term_per_source_block():
    """Aligned halves: each output block interleaves 8 lanes of one block of each input
    (the first half of the shuffle: the first blocks' lanes 0-7, then 8-15)."""
    b = 16
    terms = gather_terms(_gather(b, (2 * b, 2 * b), _shuffle_halves(b, 2 * b)[0]))
    assert terms.starts.tolist() == [0, 2, 4]
    assert terms.sources == ((0, 0), (1, 0), (0, 0), (1, 0))
    assert terms.perm[0].tolist() == [v for i in range(8) for v in (i, -1)]
    assert terms.perm[1].tolist() == [v for i in range(8) for v in (-1, i)]
    assert terms.perm[2].tolist() == [v for i in range(8, 16) for v in (i, -1)]


def test_a_plan_on_generated_kernels_may_keep_it():
    workload = _cases(fmt.host_block_size())["shuffle, first half"]
    names = {c.implementation.name for c in registry.candidates(workload, "cpu")}
    assert {"native.nchwc", "ort.nchwc", "numpy.nchwc"} <= names


@pytest.mark.parametrize(("change", "words"), [
    (dict(indices=(0, 99)), "not one of the inputs' 32 lanes"),
    (dict(indices=(0, -1)), "not one of the inputs'"),
    (dict(channels=3), "do not give attribute channels=3"),
    (dict(block=8), "not its tensors' block 16"),
    (dict(hw=(5, 6)), "one batch, size and block"),
])
def test_a_gather_that_cannot_be_one_is_refused_before_any_kernel(change, words):
    """A plan's manifest edited by hand must not send the C kernel out of its buffers."""
    from wpk.core.op_checks import op_problem
    from wpk.kernels.support import unsupported_reason

    b = 16
    good = _gather(b, (b, 5), (0, b + 1))
    assert op_problem(good) is None and unsupported_reason(good) is None
    attrs = dict(good.attrs)
    hw = change.pop("hw", None)
    attrs.update(change)
    inputs = good.inputs if hw is None else (
        good.inputs[0], TensorSpec(fmt.blocked_shape((1, 5, *hw), b), "float32"))
    bad = Workload("ChannelGather", inputs, good.outputs, tuple(sorted(attrs.items())),
                   domain="wpk.nchwc")
    assert words in op_problem(bad)
    assert "a blocked ChannelGather" in unsupported_reason(bad)
