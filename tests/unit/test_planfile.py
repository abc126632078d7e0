"""Plan files: round trip, integrity checks, versioning, atomic writes."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

from wpk.core.devices import cpu_fingerprint
from wpk.core.errors import OptionError, PlanError
from wpk.plans.planfile import FORMAT_VERSION, Plan, read_plan, write_plan

from .plan_helpers import tiny_plan


@pytest.fixture
def built(rng):
    return tiny_plan(rng)


def rewrite(path, change):
    """Rewrite the zip at `path`, passing every member's bytes through change(name, data)."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, change(name, data))


def test_round_trip_keeps_everything(built, tmp_path):
    graph, plan = built
    path = plan.save(tmp_path / "tiny.wpk")
    again = read_plan(path)
    assert again.steps == plan.steps
    assert again.workloads == plan.workloads
    assert again.buffer_plan == plan.buffer_plan
    assert again.report == {"note": "tiny"}
    assert again.inputs == [{"name": "x", "shape": [2, 8], "dtype": "float32"}]
    assert list(again.weights) == ["w/0:weird name"]
    np.testing.assert_array_equal(again.weights["w/0:weird name"],
                                  graph.constants["w/0:weird name"])
    assert again.manifest["format_version"] == FORMAT_VERSION
    assert set(again.manifest["members"]) == {"weights.npz", "report.json"}


def test_same_plan_gives_the_same_bytes(built, tmp_path):
    _, plan = built
    first, second = plan.save(tmp_path / "a.wpk"), plan.save(tmp_path / "b.wpk")
    assert first.read_bytes() == second.read_bytes()


def test_a_changed_member_is_named(built, tmp_path):
    _, plan = built
    path = plan.save(tmp_path / "p.wpk")

    def flip_last_weight_byte(name, data):
        return data[:-1] + bytes([data[-1] ^ 1]) if name == "weights.npz" else data
    rewrite(path, flip_last_weight_byte)
    with pytest.raises(PlanError, match=r"member 'weights.npz' changed") as info:
        read_plan(path)
    assert info.value.hint


def test_a_flipped_byte_in_the_file_is_named(built, tmp_path):
    _, plan = built
    path = plan.save(tmp_path / "p.wpk")
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("weights.npz")
    raw[info.header_offset + 30 + len("weights.npz") + 200] ^= 0xFF  # inside the stored data
    path.write_bytes(bytes(raw))
    with pytest.raises(PlanError, match="weights.npz"):
        read_plan(path)


def test_an_edited_manifest_is_detected(built, tmp_path):
    _, plan = built
    path = plan.save(tmp_path / "p.wpk")

    def swap_impl(name, data):
        if name != "manifest.json":
            return data
        manifest = json.loads(data)
        manifest["steps"][1]["impl"] = "something.else"
        return json.dumps(manifest).encode()
    rewrite(path, swap_impl)
    with pytest.raises(PlanError, match=r"member 'manifest.json' changed"):
        read_plan(path)


def test_a_newer_format_version_is_refused(built, tmp_path):
    _, plan = built
    path = plan.save(tmp_path / "p.wpk")

    def bump(name, data):
        if name != "manifest.json":
            return data
        manifest = json.loads(data)
        manifest["format_version"] = FORMAT_VERSION + 1
        return json.dumps(manifest).encode()
    rewrite(path, bump)
    expected = (f"plan format version {FORMAT_VERSION + 1} is newer than this wpk supports "
                f"({FORMAT_VERSION}); rebuild the plan or upgrade wpk")
    with pytest.raises(PlanError) as info:
        read_plan(path)
    assert str(info.value) == expected


def test_a_manifest_without_steps_is_refused(built, tmp_path):
    _, plan = built
    manifest = {k: v for k, v in plan.manifest.items() if k != "steps"}
    path = write_plan(Plan(manifest, plan.weights), tmp_path / "p.wpk")
    with pytest.raises(PlanError, match="the manifest lacks steps"):
        read_plan(path)


def _first_workload(manifest):
    return next(iter(manifest["workloads"].values()))


MALFORMED_FIELDS = [
    ("steps/1/inputs", lambda m: m["steps"][1].update(inputs="x")),
    ("buffers/buffers/0/nbytes", lambda m: m["buffers"]["buffers"][0].update(nbytes=-1)),
    ("inputs/0/shape/0", lambda m: m["inputs"][0].update(shape=[1.5])),
    ("outputs", lambda m: m.update(outputs=[])),
    ("steps/0/config", lambda m: m["steps"][0].update(config="fast")),
    ("static_inputs/0", lambda m: _first_workload(m).update(static_inputs=[[1]])),
    ("static_inputs/0/0", lambda m: _first_workload(m).update(static_inputs=[["a", 1]])),
]


@pytest.mark.parametrize("field,change", MALFORMED_FIELDS, ids=[f for f, _ in MALFORMED_FIELDS])
def test_a_malformed_manifest_field_is_named(built, tmp_path, field, change):
    """A manifest checksummed again after an edit: the schema check (fastjsonschema, the
    message from jsonschema) names the field before anything reads it."""
    _, plan = built
    manifest = json.loads(json.dumps(plan.manifest))
    change(manifest)
    path = write_plan(Plan(manifest, plan.weights), tmp_path / "p.wpk")
    with pytest.raises(PlanError, match=r"manifest field \S*" + field + r" is malformed"):
        read_plan(path)


def test_not_a_plan(tmp_path):
    text = tmp_path / "model.onnx"
    text.write_bytes(b"\x08\x07garbage")
    with pytest.raises(PlanError, match="is not a wpk plan"):
        read_plan(text)
    other_zip = tmp_path / "other.zip"
    with zipfile.ZipFile(other_zip, "w") as archive:
        archive.writestr("hello.txt", "hi")
    with pytest.raises(PlanError, match=r"not a wpk plan \(no manifest.json\)"):
        read_plan(other_zip)
    with pytest.raises(PlanError, match="does not exist"):
        read_plan(tmp_path / "missing.wpk")


def test_a_missing_cpu_feature_is_named(built, tmp_path):
    _, plan = built
    manifest = dict(plan.manifest, requires={"isa": ["avx2", "avx9000"], "machine": None})
    path = write_plan(Plan(manifest, plan.weights, plan.report), tmp_path / "p.wpk")
    with pytest.raises(PlanError, match="lacks: avx9000"):
        read_plan(path)
    assert read_plan(path, check_device=False).steps == plan.steps


def test_a_failing_weight_leaves_no_file_and_keeps_the_old_one(built, tmp_path):
    _, plan = built
    path = plan.save(tmp_path / "p.wpk")
    before = path.read_bytes()
    bad = Plan(plan.manifest, {"obj": np.array([object()], dtype=object)}, plan.report)
    with pytest.raises(ValueError):
        bad.save(path)
    with pytest.raises(ValueError):
        bad.save(tmp_path / "new.wpk")
    assert sorted(os.listdir(tmp_path)) == ["p.wpk"]
    assert path.read_bytes() == before


def test_a_failure_in_the_middle_of_the_zip_leaves_no_file(built, tmp_path, monkeypatch):
    _, plan = built
    written = []
    original = zipfile.ZipFile.writestr

    def disk_full_on_second_member(self, info, data, *args, **kw):
        written.append(info)
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        return original(self, info, data, *args, **kw)
    monkeypatch.setattr(zipfile.ZipFile, "writestr", disk_full_on_second_member)
    with pytest.raises(OptionError, match="No space left"):  # a user error: exit code 2
        plan.save(tmp_path / "p.wpk")
    assert os.listdir(tmp_path) == []


def test_plan_files_hold_no_pickle(built, tmp_path):
    _, plan = built
    path = plan.save(tmp_path / "p.wpk")
    with zipfile.ZipFile(path) as archive:
        weights = archive.read("weights.npz")
    with zipfile.ZipFile(__import__("io").BytesIO(weights)) as npz:
        for name in npz.namelist():
            header = npz.read(name)[:128]
            assert b"'descr': '|O'" not in header
    assert cpu_fingerprint()["kind"] == "cpu"
