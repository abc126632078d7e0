"""Hostile input through the CLI and the Python API (issue 13 items 3, 4, 6): each defect
found by attacking wpk with bad files, flags and paths has its test here. The contract:
exit code 2, exactly one `error:` line with a hint, no traceback, no stray warning line,
no partial or misplaced file; the API raises only `WpkError`s.
(docs/HOSTILE_INPUT.md lists defect -> test.)"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import stat
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from tests.integration.test_cli_errors import _conv_model, assert_user_error, run_cli
from wpk.core.devices import cpu_fingerprint
from wpk.core.errors import WpkError
from wpk.frontend import load_model
from wpk.plans.assemble import whole_model_plan
from wpk.plans.planfile import MANIFEST, _manifest_digest

vi = helper.make_tensor_value_info


def _save(nodes, inputs, outputs, path, initializers=()) -> str:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def _relu_model(path, outputs=("y",)) -> str:
    nodes = [helper.make_node("Relu", ["x"], [outputs[0]], name="relu")]
    nodes += [helper.make_node("Sigmoid", ["x"], [name], name=f"sig_{i}")
              for i, name in enumerate(outputs[1:])]
    return _save(nodes, [vi("x", TensorProto.FLOAT, [2, 3])],
                 [vi(name, TensorProto.FLOAT, [2, 3]) for name in outputs], path)


def assert_clean_error(code: int, err: str, *fragments: str) -> None:
    """`assert_user_error`, and no line of stderr but the error and its hint."""
    assert_user_error(code, err, *fragments)
    lines = [line for line in err.splitlines() if line.strip()]
    assert all(line.startswith(("error: ", "hint: ")) for line in lines), err


# -- outputs: checked before the work, never over the input, a device or through a link --

def test_build_into_a_missing_folder_fails_before_the_build(tmp_path, rng, capsys):
    # a model whose build would fail: the output path is checked first, so the error is
    # about the folder, not the model (the build used to run to the end, then exit 1)
    symbolic = _conv_model(tmp_path / "sym.onnx", rng, symbolic=True)
    code, _, err = run_cli(capsys, "build", symbolic, "--cpu", "-o", tmp_path / "no" / "m.wpk")
    assert_clean_error(code, err, "no", "does not exist")
    assert not (tmp_path / "no").exists()


def test_run_output_and_report_into_a_missing_folder(tmp_path, plan, capsys):
    for args in (("run", plan, "--output", tmp_path / "no" / "o.npz", "--repeat", "1"),
                 ("run", plan, "--profile", tmp_path / "no" / "t.json", "--repeat", "1"),
                 ("report", plan, "-o", tmp_path / "no" / "r.html", "--format", "html"),
                 ("report", plan, "--graph", tmp_path / "no" / "g.onnx")):
        code, out, err = run_cli(capsys, *args)
        assert_clean_error(code, err, "does not exist")
        assert "latency" not in out  # checked before the runs
    assert not (tmp_path / "no").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder(tmp_path, model, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        code, _, err = run_cli(capsys, "build", model, "--cpu", "-o", folder / "m.wpk")
        assert_clean_error(code, err, "not writable")
    finally:
        folder.chmod(0o700)


def test_build_refuses_to_overwrite_its_input(tmp_path, model, capsys, monkeypatch):
    before = Path(model).read_bytes()
    monkeypatch.chdir(tmp_path)
    for output in (model, "model.onnx", "./model.onnx"):
        code, _, err = run_cli(capsys, "build", model, "--cpu", "-o", output, "--quiet")
        assert_clean_error(code, err, "input file")
    assert Path(model).read_bytes() == before
    with pytest.raises(WpkError, match="input file"):  # the API too
        wpk.build(model, target="cpu", output=model, progress=False)
    assert Path(model).read_bytes() == before


def test_output_onto_a_device_is_refused(model, plan, capsys, char_device, tmp_path):
    db = tmp_path / "db.jsonl"
    db.write_text("")
    for args in (("build", model, "--cpu", "-o", char_device, "--quiet"),
                 ("run", plan, "--output", char_device, "--repeat", "1"),
                 ("report", plan, "-o", char_device),
                 ("records", "merge", db, "-o", char_device)):
        code, _, err = run_cli(capsys, *args)
        assert_clean_error(code, err, char_device, "device")
        assert stat.S_ISCHR(os.lstat(char_device).st_mode)


def test_a_link_planted_at_the_old_temporary_names_redirects_nothing(tmp_path, plan, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    # the fixed names `wpk report -o` and `wpk run --output` wrote through
    for name in (".r.html.tmp", ".o.npz.tmp", ".r.json.tmp"):
        (tmp_path / name).symlink_to(victim)
    code, _, err = run_cli(capsys, "report", plan, "--format", "html", "-o", tmp_path / "r.html")
    assert code == 0, err
    code, _, err = run_cli(capsys, "report", plan, "--format", "json", "-o", tmp_path / "r.json")
    assert code == 0, err
    code, _, err = run_cli(capsys, "run", plan, "--output", tmp_path / "o.npz", "--repeat", "1")
    assert code == 0, err
    assert victim.read_text() == "precious"
    assert (tmp_path / "r.html").read_text().startswith("<!")
    assert json.loads((tmp_path / "r.json").read_text())["target"] == "cpu"
    assert set(np.load(tmp_path / "o.npz").files) == {"y"}


def test_output_names_that_are_savez_keywords_round_trip(tmp_path, capsys):
    names = ("y", "allow_pickle", "file", "args", "kwds")
    model = _relu_model(tmp_path / "names.onnx", outputs=names)
    code, _, err = run_cli(capsys, "build", model, "--cpu", "-o", tmp_path / "n.wpk", "-q")
    assert code == 0, err
    code, _, err = run_cli(capsys, "run", tmp_path / "n.wpk", "--output", tmp_path / "o.npz",
                           "--repeat", "1")
    assert code == 0, err
    x = wpk.load(tmp_path / "n.wpk")
    expected = x.run(dict(zip(["x"], [np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)])))
    with np.load(tmp_path / "o.npz", allow_pickle=False) as saved:
        assert sorted(saved.files) == sorted(names)
        for name in names:
            assert saved[name].shape == expected[name].shape


# -- bad models: model errors named as such ---------------------------------------------

def test_string_tensors(tmp_path, capsys):
    path = _save([helper.make_node("Identity", ["s"], ["y"], name="ident")],
                 [vi("s", TensorProto.STRING, [2])], [vi("y", TensorProto.STRING, [2])],
                 tmp_path / "string.onnx")
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", tmp_path / "s.wpk")
    assert_clean_error(code, err, "'s'", "STRING")
    assert not (tmp_path / "s.wpk").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_attributes(tmp_path, capsys, value):
    path = _save([helper.make_node("LeakyRelu", ["x"], ["y"], name="leaky", alpha=value)],
                 [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])],
                 tmp_path / "attr.onnx")
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", tmp_path / "a.wpk")
    assert_clean_error(code, err, "alpha", "'leaky'")


def test_node_name_that_is_not_utf8(tmp_path, capsys):
    path = _save([helper.make_node("Relu", ["x"], ["y"], name="r")],
                 [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])],
                 tmp_path / "name.onnx")
    data = Path(path).read_bytes()
    assert data.count(b"\x1a\x01r") == 1  # NodeProto.name (field 3) = "r"
    Path(path).write_bytes(data.replace(b"\x1a\x01r", b"\x1a\x01\xff"))
    for command in ("build", "inspect"):
        code, _, err = run_cli(capsys, command, path, "--cpu")
        assert_clean_error(code, err, "UTF-8", "Relu")


def test_huge_input_shape_flag(tmp_path, rng, capsys):
    path = _conv_model(tmp_path / "sym.onnx", rng, symbolic=True)
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", tmp_path / "s.wpk",
                           "--input-shape", "x=99999999999999999999x3x8x8")
    assert_clean_error(code, err, "99999999999999999999")


def test_range_with_step_zero(tmp_path, capsys):
    consts = [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("start", 0.0), ("limit", 4.0), ("delta", 0.0))]
    path = _save([helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="rng")],
                 [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, ["n"])],
                 tmp_path / "range.onnx", consts)
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", tmp_path / "r.wpk")
    assert_clean_error(code, err, "Range", "'rng'", "0")


@pytest.mark.parametrize("case,fragment", [
    ("group0", "group=0"),
    ("channels", "channels"),
])
def test_conv_model_errors_are_model_errors(tmp_path, capsys, rng, case, fragment):
    weight = (4, 3, 3, 3) if case == "group0" else (4, 2, 3, 3)
    w = numpy_helper.from_array(rng.standard_normal(weight).astype(np.float32), "w")
    attrs = {"group": 0} if case == "group0" else {}
    path = _save([helper.make_node("Conv", ["x", "w"], ["y"], name="bad_conv",
                                   pads=[1, 1, 1, 1], **attrs)],
                 [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                 [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])], tmp_path / "conv.onnx", [w])
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", tmp_path / "c.wpk")
    assert_clean_error(code, err, "'bad_conv'", fragment)
    assert "bug" not in err and "fix the model" in err


def test_op_without_a_needed_shape_names_it(capsys):
    code, _, err = run_cli(capsys, "op", "Gemm", "--shape", "A=2x3", "--search", "none")
    assert_clean_error(code, err, "B")
    assert "checker" not in err and "ModelProto" not in err
    code, _, err = run_cli(capsys, "op", "NoSuchOp", "--shape", "A=2x3", "--search", "none")
    assert_clean_error(code, err, "NoSuchOp")
    for attr, fragment in (("foo=1", "foo"), ("alpha=nan", "alpha")):
        code, _, err = run_cli(capsys, "op", "LeakyRelu", "--shape", "X=2x3", "--attr", attr,
                               "--search", "none")
        assert_clean_error(code, err, "wpk op LeakyRelu", fragment)
        assert "--attr" in err and "ModelProto" not in err and "fix the model" not in err


def test_dsl_file_that_is_a_device_or_not_utf8(tmp_path, capsys):
    binary = tmp_path / "bin.wpk"
    binary.write_bytes(b"op x\n\xff\xfe\n")
    code, _, err = run_cli(capsys, "dsl", binary)
    assert_clean_error(code, err, "bin.wpk:2", "UTF-8")
    if os.path.exists("/dev/zero"):  # was read until memory ran out
        code, _, err = run_cli(capsys, "dsl", "/dev/zero")
        assert_clean_error(code, err, "/dev/zero", "regular file")


# -- bad inputs to a plan ---------------------------------------------------------------

def test_run_inputs_npy_and_bad_files(tmp_path, plan, capsys):
    x = np.ones((1, 3, 8, 8), np.float32)
    np.save(tmp_path / "x.npy", x)  # one array for a one-input plan is accepted
    code, _, err = run_cli(capsys, "run", plan, "--inputs", tmp_path / "x.npy", "--repeat", "1")
    assert code == 0, err
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object))
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "text.npy").write_text("hello")
    for name in ("obj.npy", "junk.npz", "text.npy"):
        code, _, err = run_cli(capsys, "run", plan, "--inputs", tmp_path / name)
        assert_clean_error(code, err, name)
        assert "allow_pickle" not in err and "__enter__" not in err


def test_api_raises_wpk_errors_for_bad_arguments(plan):
    session = wpk.load(plan)
    for feeds in ({"x": "abc"}, {"x": b"abc"}, {"x": [[1, 2], [3]]}, {"x": object()}):
        with pytest.raises(WpkError, match="'x'"):
            session.run(feeds)
    with pytest.raises(WpkError, match="output names"):
        session.run(3, {"x": np.ones((1, 3, 8, 8), np.float32)})
    for path in (None, 3, ["a.wpk"]):
        with pytest.raises(WpkError):
            wpk.load(path)


@pytest.mark.parametrize("options", [
    {"input_shapes": ["x"]}, {"output": 123}, {"budget": "x"}, {"repeats": "many"},
])
def test_build_api_raises_wpk_errors_for_bad_options(model, options):
    with pytest.raises(WpkError):
        wpk.build(model, target="cpu", progress=False, **options)


# -- records and plans tampered with ------------------------------------------------------

@pytest.fixture(params=["per_op", "whole_model"])
def any_plan(request, tmp_path, model, capsys) -> str:
    """A plan of wpk's per-operator steps (--no-partition), and a plan of one step,
    onnxruntime's whole model (what a build picks when onnxruntime is faster)."""
    path = tmp_path / f"{request.param}.wpk"
    if request.param == "whole_model":
        whole_model_plan(load_model(model), Path(model).read_bytes(),
                         dict(cpu_fingerprint())).save(path)
        return str(path)
    code, _, err = run_cli(capsys, "build", model, "--cpu", "-o", path, "-q", "--no-partition")
    assert code == 0, err
    return str(path)


@pytest.fixture
def record_line(tmp_path, model, capsys) -> str:
    """One real tuning record line, from a build with --db."""
    db = tmp_path / "real.jsonl"
    code, _, err = run_cli(capsys, "build", model, "--cpu", "--db", db, "-o",
                           tmp_path / "real.wpk", "--quiet")
    assert code == 0, err
    return db.read_text().splitlines()[0]


def _bad_record_lines(line: str) -> list[str]:
    record = json.loads(line)
    huge_dim = copy.deepcopy(record)
    huge_dim["workload"]["inputs"][0]["shape"][0] = "DIM"
    return [re.sub(r'"median_s":[^,}]+', '"median_s":1e400', line),
            line.replace('"schema_version":1', '"schema_version":1e400'),
            line.replace('"schema_version":1', '"schema_version":' + "9" * 400),
            json.dumps(huge_dim).replace('"DIM"', "9" * 400),
            "[" * 200_000 + "]" * 200_000]


def test_records_lines_out_of_range_are_one_warning_each(tmp_path, model, record_line, capsys):
    bad = _bad_record_lines(record_line)
    db = tmp_path / "db.jsonl"
    db.write_text("\n".join([record_line, *bad]) + "\n")
    code, out, err = run_cli(capsys, "records", "list", db)
    assert code == 0, err
    lines = [text for text in err.splitlines() if text.strip()]
    assert len(lines) == len(bad), err
    for number, text in enumerate(lines, start=2):
        assert text.startswith(f"warning: {db}:{number}: corrupted record"), err
    assert "1 tuning records" in " ".join(out.split())
    code, _, err = run_cli(capsys, "build", model, "--cpu", "--db", db, "-o",
                           tmp_path / "m.wpk", "--quiet")
    assert code == 0, err
    assert all(text.startswith(("warning: ", "wrote ")) for text in err.splitlines()), err


def _rewrite_manifest(src: str, dst, change) -> None:
    """A copy of plan `src` whose manifest `change` edited, its checksum made valid again."""
    with zipfile.ZipFile(src) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    manifest = json.loads(members[MANIFEST])
    change(manifest)
    manifest.pop("manifest_sha256", None)
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    members[MANIFEST] = json.dumps(manifest).encode()
    with zipfile.ZipFile(dst, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _set(path, value):
    """Edit `path` of the manifest ("*": the first workload, its Conv when it has one)."""
    def change(manifest):
        target = manifest
        for key in path[:-1]:
            if isinstance(target, dict) and key not in target:
                convs = [k for k, v in target.items() if isinstance(v, dict)
                         and v.get("op") == "Conv"]
                key = convs[0] if convs else next(iter(target))
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return change


@pytest.mark.parametrize("path,value", [
    (("steps", 0, "impl"), KeyError),
    (("steps", 0, "inputs"), []),
    (("buffers", "tensors", 0, "name"), 1),
    (("buffers", "buffers", 0, "offset"), -1),
    (("buffers", "tensors"), KeyError),
    (("inputs", 0, "shape"), "x"),
    (("inputs", 0, "dtype"), "object"),
    (("constants", 0), {}),
    (("workloads", "*", "outputs", 0, "shape"), []),
    (("workloads", "*", "attrs", "dilations"), "x"),
    (("workloads", "*", "attrs", "group"), -1),
    (("workloads", "*", "attrs"), KeyError),
])
def test_rechecksummed_manifest_with_bad_fields(tmp_path, capsys, path, value):
    model = _conv_model(tmp_path / "model.onnx", np.random.default_rng(0))
    plan = tmp_path / "per_op.wpk"
    code, _, err = run_cli(capsys, "build", model, "--cpu", "-o", plan, "-q", "--no-partition")
    assert code == 0, err
    bad = tmp_path / "bad.wpk"
    _rewrite_manifest(plan, bad, _set(path, value))
    for args in (("run", bad, "--repeat", "1", "--warmup", "0"), ("report", bad)):
        code, _, err = run_cli(capsys, *args)
        assert_clean_error(code, err, "bad.wpk")
    with pytest.raises(WpkError):
        wpk.load(bad)


@pytest.mark.parametrize("change,fragment", [
    (lambda m: m["tail"]["reads"].append("nowhere"), "its tail reads 'nowhere'"),
    (lambda m: m["tail"]["graph_outputs"].append(
        {"name": "ghost", "shape": [None], "dtype": "int64"}), "output 'ghost' is computed"),
    (lambda m: m["tail"].update(model="other.onnx"), "kernels/other.onnx is not a member"),
    (lambda m: m["tail"].update(outputs=[]), "tail"),
    (lambda m: m["tail"]["outputs"][0].update(shape=["n"]), "tail"),
])
def test_a_rechecksummed_tail_that_does_not_fit_its_plan_is_refused(tmp_path, capsys, change,
                                                                     fragment):
    """A plan with a value-dependent tail (`wpk.value_tail`), its manifest's `tail` entry
    edited and the checksum made valid again: a PlanError naming what does not fit."""
    from tests.unit.test_value_tail import FAST, detector_model

    plan = tmp_path / "detector.wpk"
    wpk.build(detector_model(), target="cpu", output=str(plan), **FAST)
    bad = tmp_path / "bad.wpk"
    _rewrite_manifest(plan, bad, change)
    code, _, err = run_cli(capsys, "run", bad, "--repeat", "1", "--warmup", "0")
    assert_clean_error(code, err, "bad.wpk", fragment)
    with pytest.raises(WpkError, match=re.escape(fragment)):
        wpk.load(bad)


def test_a_tail_model_that_onnxruntime_cannot_load_is_a_plan_error(tmp_path, capsys):
    """The tail's bytes replaced (and every checksum made valid again): onnxruntime refuses
    them when the plan loads, a PlanError, not a crash at the first run."""
    from tests.unit.test_value_tail import FAST, detector_model

    plan = tmp_path / "detector.wpk"
    wpk.build(detector_model(), target="cpu", output=str(plan), **FAST)
    with zipfile.ZipFile(plan) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members["kernels/tail.onnx"] = b"not an onnx model"
    manifest = json.loads(members[MANIFEST])
    manifest["members"]["kernels/tail.onnx"] = hashlib.sha256(
        members["kernels/tail.onnx"]).hexdigest()
    manifest.pop("manifest_sha256")
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    members[MANIFEST] = json.dumps(manifest).encode()
    bad = tmp_path / "bad.wpk"
    with zipfile.ZipFile(bad, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    code, _, err = run_cli(capsys, "run", bad, "--repeat", "1", "--warmup", "0")
    assert_clean_error(code, err, "bad.wpk", "its tail model does not load in onnxruntime")


def test_every_manifest_field_removed_or_retyped(tmp_path, any_plan, capsys):
    """Every field of a real manifest, removed or given another JSON type: exit 0 or 2."""
    plan = any_plan
    with zipfile.ZipFile(plan) as archive:
        manifest = json.loads(archive.read(MANIFEST))

    def paths(value, prefix=()):
        if prefix:
            yield prefix
        items = value.items() if isinstance(value, dict) else \
            enumerate(value[:1]) if isinstance(value, list) else ()
        for key, child in items:
            if key not in ("members", "manifest_sha256"):
                yield from paths(child, (*prefix, key))

    code, _, err = run_cli(capsys, "run", plan, "--repeat", "1", "--warmup", "0")
    assert code == 0, err  # the checks pass every field of a plan as written
    failures = []
    for path in paths(manifest):
        for value in (KeyError, None, "x", 1.5, []):
            def change(edited, path=path, value=value):
                target = edited
                for key in path[:-1]:
                    target = target[key]
                if value is KeyError:
                    target.pop(path[-1])
                else:
                    target[path[-1]] = value
            bad = tmp_path / "bad.wpk"
            _rewrite_manifest(plan, bad, lambda m, change=change: change(m))
            code, _, err = run_cli(capsys, "run", bad, "--repeat", "1", "--warmup", "0")
            if code not in (0, 2) or "Traceback" in err:
                failures.append((path, value, err.splitlines()[:1]))
    assert failures == [], failures[:5]


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_records_from_a_device_are_refused_not_read_forever(tmp_path, model, capsys):
    code, _, err = run_cli(capsys, "records", "list", "/dev/zero")
    assert_clean_error(code, err, "/dev/zero", "regular file")
    code, _, err = run_cli(capsys, "build", model, "--cpu", "--db", "/dev/zero", "-o",
                           tmp_path / "m.wpk")
    assert_clean_error(code, err, "/dev/zero")
    assert not (tmp_path / "m.wpk").exists()


def test_a_step_onnxruntime_refuses_at_run_time_is_a_plan_error(tmp_path, capsys):
    """An attribute edited into another valid value that the op checks do not model (the
    axes of ReduceProd, which only onnxruntime runs): the step now computes another shape
    than its buffers', onnxruntime fails on the verified step when it runs, so the plan was
    altered (exit 2)."""
    # two steps onnxruntime runs: one region session
    path = _save([helper.make_node("ReduceProd", ["x"], ["h"], name="flat", axes=[1],
                                   keepdims=1),
                  helper.make_node("Hardmax", ["x"], ["y"], name="second", axis=1)],
                 [vi("x", TensorProto.FLOAT, [1, 8, 2, 2])],
                 [vi("h", TensorProto.FLOAT, [1, 1, 2, 2]),
                  vi("y", TensorProto.FLOAT, [1, 8, 2, 2])], tmp_path / "reduce.onnx")
    plan = tmp_path / "reduce.wpk"
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", plan, "-q", "--no-partition")
    assert code == 0, err
    bad = tmp_path / "bad.wpk"

    def change(manifest):
        # a new key too: this process keeps the kernel it built for the original key
        key = manifest["steps"][0]["workload_key"]
        workload = manifest["workloads"].pop(key)
        workload["attrs"]["axes"] = [2]
        manifest["workloads"]["0123456789abcdef"] = workload
        manifest["steps"][0]["workload_key"] = "0123456789abcdef"
    _rewrite_manifest(plan, bad, change)
    code, _, err = run_cli(capsys, "run", bad, "--repeat", "1", "--warmup", "0")
    assert_clean_error(code, err, "bad.wpk", "'flat", "onnxruntime")
    with zipfile.ZipFile(plan) as archive:
        assert json.loads(archive.read(MANIFEST))["steps"][0]["impl"] == "ort.fallback"
    assert "rebuild" in err


@pytest.mark.parametrize("attrs", [{"axis": 2}, {"keepdims": 0}, {"axis": 7}])
def test_an_argmax_whose_axis_no_longer_fits_is_refused(tmp_path, capsys, attrs):
    """An ArgMax's axis or keepdims edited (wpk's numpy kernel would write indices of
    another shape): the op checks refuse it when the plan is read."""
    path = _save([helper.make_node("ArgMax", ["x"], ["h"], name="best", axis=1, keepdims=1)],
                 [vi("x", TensorProto.FLOAT, [1, 8, 2, 2])],
                 [vi("h", TensorProto.INT64, [1, 1, 2, 2])], tmp_path / "argmax.onnx")
    plan = tmp_path / "argmax.wpk"
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", plan, "-q", "--no-partition")
    assert code == 0, err

    def change(manifest):
        manifest["workloads"][manifest["steps"][0]["workload_key"]]["attrs"].update(attrs)
    bad = tmp_path / "bad.wpk"
    _rewrite_manifest(plan, bad, change)
    code, _, err = run_cli(capsys, "run", bad, "--repeat", "1", "--warmup", "0")
    assert_clean_error(code, err, "bad.wpk", "ArgMax")


@pytest.mark.parametrize("blocksize", [1, 4, 0])
def test_a_pixel_shuffle_whose_blocksize_no_longer_fits_is_refused(tmp_path, capsys, blocksize):
    """A DepthToSpace's blocksize edited into another value (wpk's own copy would move the
    same 128 floats to other places, or none): the op checks refuse it when the plan is
    read, whichever kernel runs the step."""
    path = _save([helper.make_node("DepthToSpace", ["x"], ["y"], name="shuffle", blocksize=2,
                                   mode="CRD")],
                 [vi("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                 [vi("y", TensorProto.FLOAT, [1, 2, 8, 8])], tmp_path / "d2s.onnx")
    plan = tmp_path / "d2s.wpk"
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", plan, "-q", "--no-partition")
    assert code == 0, err
    bad = tmp_path / "bad.wpk"
    _rewrite_manifest(plan, bad, _set(("workloads", "*", "attrs", "blocksize"), blocksize))
    for args in (("run", bad, "--repeat", "1", "--warmup", "0"), ("report", bad)):
        code, _, err = run_cli(capsys, *args)
        assert_clean_error(code, err, "bad.wpk", "blocksize")


@pytest.mark.parametrize("command", ["run", "report"])
def test_a_device_given_as_the_plan_is_refused_not_read_forever(command):
    """`wpk run /dev/zero` read zeros until stopped: the plan reader takes regular files only
    (in a child with a time limit, so that a regression fails instead of hanging the suite)."""
    import subprocess
    import sys

    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero on this system")
    script = "import sys; from wpk.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", script, command, "/dev/zero"],
                          capture_output=True, text=True, timeout=120)
    assert_user_error(done.returncode, done.stderr, "/dev/zero", "not a regular file")
