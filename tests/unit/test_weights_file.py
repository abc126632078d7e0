"""The plan's weights member: aligned npz writing, reading as views of one buffer."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import ml_dtypes
import numpy as np
import pytest

from wpk.plans.planfile import MANIFEST, WEIGHTS, Plan, _manifest_digest, read_plan
from wpk.plans.weights_file import ALIGN, aligned_buffer, npz_bytes, npz_views, read_stored_member

from .plan_helpers import tiny_plan


def _arrays(rng):
    """Arrays of every kind a plan holds: odd sizes, 0-d, empty, Fortran order, raw bytes."""
    return {
        "c0": rng.standard_normal((3, 5, 7)).astype(np.float32),
        "c1": np.arange(11, dtype=np.int64),
        "c2": np.array(2.5, dtype=np.float64),
        "c3": np.zeros((0, 4), np.float32),
        "c4": np.asfortranarray(rng.standard_normal((5, 3)).astype(np.float32)),
        "c5": rng.standard_normal(9).astype(np.float16),
        "c6": np.array([True, False, True]),
        "c7": rng.standard_normal(6).astype(ml_dtypes.bfloat16).view("V2"),
        "c8": np.arange(13, dtype=np.uint8),
    }


def _caps(arrays):
    return {key: array.nbytes + 4096 for key, array in arrays.items()}


def test_numpy_reads_what_is_written(rng):
    arrays = _arrays(rng)
    with np.load(io.BytesIO(npz_bytes(arrays)), allow_pickle=False) as npz:
        for key, array in arrays.items():
            assert npz[key].dtype == array.dtype
            np.testing.assert_array_equal(npz[key], array)


def test_every_array_starts_aligned_and_is_read_as_a_view(rng):
    arrays = _arrays(rng)
    data = npz_bytes(arrays)
    buffer = aligned_buffer(len(data))
    buffer[:] = np.frombuffer(data, np.uint8)
    views = npz_views(buffer, _caps(arrays))
    for key, array in arrays.items():
        got = views[key]
        assert got.dtype == array.dtype and got.shape == array.shape
        np.testing.assert_array_equal(got, array)
        if array.size:
            assert np.shares_memory(got, buffer), key   # no copy
            assert (got.ctypes.data - buffer.ctypes.data) % ALIGN == 0, key
            assert got.flags.writeable
    assert views["c4"].flags.f_contiguous


def test_an_npz_written_by_numpy_reads_the_same_values(rng):
    """Plans written before the padding: arrays at any offset, copied where misaligned."""
    arrays = _arrays(rng)
    stream = io.BytesIO()
    np.savez(stream, allow_pickle=False, **arrays)
    data = stream.getvalue()
    buffer = aligned_buffer(len(data))
    buffer[:] = np.frombuffer(data, np.uint8)
    views = npz_views(buffer, _caps(arrays))
    for key, array in arrays.items():
        np.testing.assert_array_equal(views[key], array)
        assert views[key].ctypes.data % views[key].dtype.alignment == 0


def test_a_deflated_member_is_inflated_no_further_than_its_cap(rng):
    array = rng.standard_normal(1000).astype(np.float32)
    stream = io.BytesIO()
    np.savez_compressed(stream, c0=array)
    data = stream.getvalue()
    buffer = aligned_buffer(len(data))
    buffer[:] = np.frombuffer(data, np.uint8)
    np.testing.assert_array_equal(npz_views(buffer, {"c0": array.nbytes + 200})["c0"], array)
    assert npz_views(buffer, {"c0": array.nbytes // 2})["c0"] is None
    assert npz_views(buffer, {"c9": 100})["c9"] is None


@pytest.mark.parametrize("damage", [b" ", b"(", b"@"])
def test_an_array_whose_header_dict_is_damaged_is_none_not_a_parser_error(damage):
    """numpy reads a `.npy` header's dict with Python's tokenizer and parser: a flipped
    byte there raised tokenize.TokenError, which `wpk run` reported as an internal error
    (found by tests/fuzzing on a rechecksummed plan). Such an array is not a plain one."""
    data = bytearray(npz_bytes({"c0": np.arange(6, dtype=np.float32)}))
    brace = data.find(b"}", data.find(b"'descr'"))
    data[brace:brace + 1] = damage
    buffer = aligned_buffer(len(data))
    buffer[:] = np.frombuffer(bytes(data), np.uint8)
    assert npz_views(buffer, {"c0": 1 << 20})["c0"] is None


def test_a_stored_member_is_read_from_the_file_straight_into_an_aligned_buffer(tmp_path):
    path = tmp_path / "a.zip"
    payload = bytes(range(256)) * 40
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("deflated", payload, compress_type=zipfile.ZIP_DEFLATED)
        archive.writestr("stored", payload, compress_type=zipfile.ZIP_STORED)
    with zipfile.ZipFile(path) as archive:
        stored = read_stored_member(str(path), archive.getinfo("stored"))
        assert read_stored_member(str(path), archive.getinfo("deflated")) is None
    assert stored.tobytes() == payload and stored.ctypes.data % ALIGN == 0
    truncated = tmp_path / "short.zip"
    truncated.write_bytes(path.read_bytes()[:-len(payload) // 2 - 200])
    with pytest.raises(EOFError):
        read_stored_member(str(truncated), archive.getinfo("stored"))


def test_a_loaded_plans_constants_are_views_of_one_buffer(rng, tmp_path):
    graph, plan = tiny_plan(rng)
    extra = {"big": rng.standard_normal((64, 33)).astype(np.float32),
             "ids": np.arange(7, dtype=np.int64)}
    plan = Plan(plan.manifest, {**plan.weights, **extra}, plan.report, plan.kernels)
    loaded = read_plan(plan.save(tmp_path / "p.wpk"))
    bases = {id(np.asarray(array).base.base) for array in loaded.weights.values()}
    assert len(bases) == 1
    for name, array in {**graph.constants, **extra}.items():
        np.testing.assert_array_equal(loaded.weights[name], array)
        assert loaded.weights[name].flags.writeable


def test_a_plan_with_a_numpy_written_weights_member_still_loads(rng, tmp_path):
    """Plans written before the aligned npz (np.savez's layout) load the same values."""
    graph, plan = tiny_plan(rng)
    path = plan.save(tmp_path / "p.wpk")
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    with np.load(io.BytesIO(members[WEIGHTS])) as npz:
        arrays = {key: npz[key] for key in npz.files}
    stream = io.BytesIO()
    np.savez(stream, **arrays)
    members[WEIGHTS] = stream.getvalue()
    manifest = json.loads(members[MANIFEST])
    manifest["members"][WEIGHTS] = hashlib.sha256(members[WEIGHTS]).hexdigest()
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    members[MANIFEST] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    loaded = read_plan(path)
    for name, array in graph.constants.items():
        np.testing.assert_array_equal(loaded.weights[name], array)

