"""Bad input through the CLI: exit code 2, one `error:` line and a hint, no traceback,
no partial plan left behind."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from wpk.cli import main


def _conv_model(path, rng, symbolic: bool = False, extra_op: str | None = None) -> str:
    """A small Conv+Relu(+extra op) model saved to `path`."""
    batch = "N" if symbolic else 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 8, 8])
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu")]
    if extra_op:
        nodes.append(helper.make_node(extra_op, ["r"], ["y"], name="odd_node", axis=1))
    else:
        nodes.append(helper.make_node("Identity", ["r"], ["y"], name="out"))
    graph = helper.make_graph(nodes, "g", [x], [y], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_user_error(code: int, err: str, *fragments: str) -> None:
    """Exit code 2, exactly one `error:` line mentioning every fragment, a hint, no traceback."""
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], err
    assert any(line.startswith("hint: ") for line in lines), err
    assert "Traceback" not in err


def test_missing_model_file(tmp_path, capsys):
    code, _, err = run_cli(capsys, "build", tmp_path / "nope.onnx", "--cpu")
    assert_user_error(code, err, "nope.onnx")
    assert not (tmp_path / "nope.wpk").exists()


def test_truncated_model_file(tmp_path, model, capsys):
    data = Path(model).read_bytes()
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(data[: len(data) // 2])
    code, _, err = run_cli(capsys, "build", broken, "--cpu", "-o", tmp_path / "b.wpk")
    assert_user_error(code, err, "broken.onnx")
    assert list(tmp_path.glob("b.wpk*")) == []


def test_garbage_model_file(tmp_path, capsys):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\xffnot a model at all" * 10)
    code, _, err = run_cli(capsys, "build", garbage, "--cpu", "-o", tmp_path / "g.wpk")
    assert_user_error(code, err, "garbage.onnx")


def test_model_failing_checker(tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    # Relu reads a tensor that nothing produces: the checker rejects the graph.
    graph = helper.make_graph([helper.make_node("Relu", ["missing"], ["y"], name="bad_relu")],
                              "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "invalid.onnx"
    onnx.save(model, str(path))
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", tmp_path / "i.wpk")
    assert_user_error(code, err, "invalid.onnx")
    assert not (tmp_path / "i.wpk").exists()


def test_strict_lists_unsupported_nodes(tmp_path, rng, capsys):
    path = _conv_model(tmp_path / "odd.onnx", rng, extra_op="Hardmax")
    code, _, err = run_cli(capsys, "build", path, "--cpu", "--strict", "-o", tmp_path / "o.wpk")
    assert_user_error(code, err, "odd_node", "Hardmax")
    assert list(tmp_path.glob("o.wpk*")) == []
    # without --strict the same model builds, the node falling back to onnxruntime
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", tmp_path / "o.wpk", "--quiet")
    assert code == 0, err
    report = json.loads(zipfile.ZipFile(tmp_path / "o.wpk").read("report.json"))
    assert "fallback" in json.dumps(report)


def test_missing_input_shape(tmp_path, rng, capsys):
    path = _conv_model(tmp_path / "sym.onnx", rng, symbolic=True)
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", tmp_path / "s.wpk")
    assert_user_error(code, err, "x")
    assert "--input-shape" in err
    code, _, err = run_cli(capsys, "build", path, "--cpu", "-o", tmp_path / "s.wpk",
                           "--input-shape", "x=2x3x8x8", "--quiet")
    assert code == 0, err


def test_bad_input_shape_flag(tmp_path, model, capsys):
    code, _, err = run_cli(capsys, "build", model, "--cpu", "--input-shape", "x=1xAx8")
    assert_user_error(code, err, "1xAx8")


def test_cpu_and_gpu_together(model, capsys):
    code, _, err = run_cli(capsys, "build", model, "--cpu", "--gpu", "h100")
    assert_user_error(code, err, "--cpu")


def test_unknown_flag_is_a_usage_error(model, capsys):
    code, _, err = run_cli(capsys, "build", model, "--fast")
    assert_user_error(code, err, "--fast")


@pytest.mark.parametrize("feeds, fragment", [
    ({"wrong_name": np.zeros((1, 3, 8, 8), np.float32)}, "wrong_name"),
    ({"x": np.zeros((1, 3, 9, 9), np.float32)}, "(1,3,9,9)"),
    ({"x": np.zeros((1, 3, 8, 8), np.float64)}, "float64"),
])
def test_wrong_inputs_at_run_time(tmp_path, plan, capsys, feeds, fragment):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **feeds)
    code, _, err = run_cli(capsys, "run", plan, "--inputs", inputs, "--output",
                           tmp_path / "out.npz")
    assert_user_error(code, err, fragment)
    assert not (tmp_path / "out.npz").exists()


def test_missing_inputs_file(tmp_path, plan, capsys):
    code, _, err = run_cli(capsys, "run", plan, "--inputs", tmp_path / "none.npz")
    assert_user_error(code, err, "none.npz")


def _rewrite_member(src: str, dst: str, name: str, transform) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            zout.writestr(item, transform(data) if item.filename == name else data)


def test_plan_with_a_changed_byte(tmp_path, plan, capsys):
    tampered = tmp_path / "tampered.wpk"

    def flip_last_byte(data: bytes) -> bytes:
        return data[:-1] + bytes([data[-1] ^ 0x01])

    _rewrite_member(plan, tampered, "weights.npz", flip_last_byte)
    code, _, err = run_cli(capsys, "run", tampered)
    assert_user_error(code, err, "weights.npz")


def _compressed_data_offsets(path: str) -> dict[str, tuple[int, int]]:
    """For each deflated member, the file offsets of its compressed bytes (start, end)."""
    raw = Path(path).read_bytes()
    offsets = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_DEFLATED or info.compress_size < 8:
                continue
            header = info.header_offset
            name_length = int.from_bytes(raw[header + 26:header + 28], "little")
            extra_length = int.from_bytes(raw[header + 28:header + 30], "little")
            start = header + 30 + name_length + extra_length
            offsets[info.filename] = (start, start + info.compress_size)
    return offsets


def test_plan_with_a_changed_byte_in_the_raw_file(tmp_path, plan, capsys):
    data = bytearray(Path(plan).read_bytes())
    data[len(data) // 3] ^= 0xFF
    tampered = tmp_path / "raw.wpk"
    tampered.write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "run", tampered)
    assert_user_error(code, err, "raw.wpk")


def test_plan_with_a_changed_byte_in_each_compressed_member(tmp_path, plan, capsys):
    """A flipped byte inside deflated data breaks the stream itself (zlib's error, not the
    checksum's): still one error line naming the plan, exit 2."""
    offsets = _compressed_data_offsets(plan)
    assert offsets, "the plan has no deflated member to damage"
    for index, (start, end) in enumerate(offsets.values()):
        # 0x07 opens a final block of the reserved type 3: zlib itself raises ("invalid
        # block type"); a flipped byte mid-stream fails zlib or the CRC, depending on where.
        for offset, value in ((start, 0x07), ((start + end) // 2, None)):
            data = bytearray(Path(plan).read_bytes())
            data[offset] = value if value is not None else data[offset] ^ 0xFF
            tampered = tmp_path / f"deflate_{index}_{offset}.wpk"
            tampered.write_bytes(bytes(data))
            code, _, err = run_cli(capsys, "run", tampered)
            assert_user_error(code, err, tampered.name)


def test_plan_from_a_newer_format_version(tmp_path, plan, capsys):
    newer = tmp_path / "newer.wpk"

    def bump(data: bytes) -> bytes:
        manifest = json.loads(data)
        manifest["format_version"] += 1
        return json.dumps(manifest).encode()

    _rewrite_member(plan, newer, "manifest.json", bump)
    code, _, err = run_cli(capsys, "run", newer)
    assert_user_error(code, err, "format version")


def _with_unknown_zip_version(path: str, copy: Path) -> Path:
    """A copy of the zip at `path` whose central directory says every member needs zip
    version 21.3 to extract: zipfile refuses it with NotImplementedError, not BadZipFile."""
    data = bytearray(Path(path).read_bytes())
    start = data.find(b"PK\x01\x02")
    assert start > 0, "no central directory entry"
    while start != -1:
        data[start + 6:start + 8] = (213).to_bytes(2, "little")   # version needed to extract
        start = data.find(b"PK\x01\x02", start + 4)
    copy.write_bytes(bytes(data))
    return copy


def test_a_zip_of_an_unknown_version_is_not_a_plan_nor_an_inputs_file(tmp_path, plan, capsys):
    """A plan whose zip says it needs version 21.3 (found by the CLI fuzzer, `scripts/fuzz.py
    --seed 72`): `wpk report` and `wpk run` ended in `internal error: NotImplementedError`;
    an inputs file of that kind did in `wpk run --inputs`."""
    damaged = _with_unknown_zip_version(plan, tmp_path / "version.wpk")
    for command in ("run", "report"):
        code, _, err = run_cli(capsys, command, damaged)
        assert_user_error(code, err, "version.wpk", "zip file version 21.3")
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.zeros((1, 3, 8, 8), np.float32))
    code, _, err = run_cli(capsys, "run", plan, "--inputs",
                           _with_unknown_zip_version(str(inputs), tmp_path / "version.npz"))
    assert_user_error(code, err, "version.npz")


def test_not_a_plan(tmp_path, model, capsys):
    code, _, err = run_cli(capsys, "run", model)
    assert_user_error(code, err, "model.onnx")


def test_missing_plan(tmp_path, capsys):
    code, _, err = run_cli(capsys, "report", tmp_path / "absent.wpk")
    assert_user_error(code, err, "absent.wpk")


def test_console_script_reports_without_traceback(tmp_path):
    """The real process: stderr has the error line and exit status 2."""
    result = subprocess.run([sys.executable, "-m", "wpk.cli", "build",
                             str(tmp_path / "absent.onnx"), "--cpu"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
