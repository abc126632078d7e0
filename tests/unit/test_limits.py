"""Limits (issue 13.5): a few-hundred-byte model cannot make wpk hang or eat memory.

Every hostile model here is refused with exit code 2, one `error:` line naming the
node or tensor and a `hint:` line, before anything big is allocated or evaluated.
"""

from __future__ import annotations

import hashlib
import io
import json
import tracemalloc
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import wpk
from wpk.cli import main
from wpk.core.errors import OptionError, PlanError, ShapeError
from wpk.core.limits import LimitError, Limits, default_max_memory, machine_memory, parse_memory
from wpk.frontend import load_model
from wpk.frontend_shapes import bounded_evaluator
from wpk.plans.planfile import MANIFEST, WEIGHTS, _manifest_digest, read_plan, read_report

BIG = 2**20


def model(nodes, inputs, out_rank, inits=(), name="m", out_type=T.FLOAT):
    """A model of `nodes`; `inputs` maps names to (elem type, shape)."""
    graph = h.make_graph(
        nodes, name, [h.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [h.make_tensor_value_info("y", out_type, [f"d{i}" for i in range(out_rank)])],
        list(inits))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def constant_of_shape_model():
    return model([h.make_node("ConstantOfShape", ["s"], ["c"], name="huge",
                              value=h.make_tensor("v", T.FLOAT, [1], [1.0])),
                  h.make_node("Add", ["c", "x"], ["y"])], {"x": (T.FLOAT, [1, 4])}, 3,
                 [nh.from_array(np.array([BIG, BIG, 4], np.int64), "s")])


def pad_model():
    """A 1 GiB Pad of a 16-byte constant (1 x 4 float32 padded to 16385 x 16388)."""
    return model([h.make_node("Pad", ["w", "p"], ["t"], name="pad"),
                  h.make_node("Add", ["t", "x"], ["y"])], {"x": (T.FLOAT, [1, 1])}, 2,
                 [nh.from_array(np.ones((1, 4), np.float32), "w"),
                  nh.from_array(np.array([0, 0, 16384, 16384], np.int64), "p")])


def expand_model():
    return model([h.make_node("Expand", ["x", "s"], ["y"], name="expand")],
                 {"x": (T.FLOAT, [1, 4])}, 3,
                 [nh.from_array(np.array([2**16, 2**16, 4], np.int64), "s")])


def loop_body(out_shape=(1, 4), cond="cond_in"):
    return h.make_graph(
        [h.make_node("Identity", [cond], ["cond_out"]),
         h.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []),
         h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("v_in", T.FLOAT, list(out_shape))],
        [h.make_tensor_value_info("cond_out", T.BOOL, []),
         h.make_tensor_value_info("v_out", T.FLOAT, list(out_shape))],
        [nh.from_array(np.ones(out_shape, np.float32), "one")])


def loop_model(trips: int | None):
    """A Loop with a constant trip count (None: a while loop whose condition stays true)."""
    inits = [nh.from_array(np.array(True), "cond")]
    if trips is not None:
        inits.append(nh.from_array(np.array(trips, np.int64), "M"))
    return model([h.make_node("Loop", ["M" if trips is not None else "", "cond", "x"], ["y"],
                              name="loop", body=loop_body())],
                 {"x": (T.FLOAT, [1, 4])}, 2, inits)


def run_cli(capsys, *args) -> tuple[int, list[str]]:
    code = main(list(args))
    lines = capsys.readouterr().err.strip().splitlines()
    return code, lines


def assert_refused(code, lines, *words):
    assert code == 2, lines
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: ")
    for word in words:
        assert word in lines[0], lines


# --- the limit itself --------------------------------------------------------------------

@pytest.mark.parametrize(("text", "size"), [("4G", 4 << 30), ("512M", 512 << 20),
                                             ("1.5g", 3 << 29), ("2GiB", 2 << 30),
                                             ("64KB", 64 << 10), ("1048576", 1 << 20),
                                             (4096, 4096)])
def test_memory_sizes_are_read(text, size):
    assert parse_memory(text) == size


@pytest.mark.parametrize("text", ["", "G", "4X", "-1G", "0", "four", "1e3G", True])
def test_unreadable_memory_sizes_are_option_errors(text):
    with pytest.raises(OptionError):
        parse_memory(text)


def test_the_default_limit_is_half_the_ram():
    assert default_max_memory() == machine_memory() // 2
    assert Limits.of(None).max_memory == default_max_memory()
    assert Limits.of("1G").max_memory == 1 << 30


# --- hostile models through the CLI -----------------------------------------------------

@pytest.mark.parametrize(("make", "words"), [
    (constant_of_shape_model, ["ConstantOfShape node 'huge'", "16.0 TiB"]),
    (expand_model, ["Expand node 'expand'", "64.0 GiB"]),
    (lambda: loop_model(10**12), ["Loop node 'loop'", "1000000000000"]),
])
def test_hostile_models_are_refused_by_inspect_and_build(make, words, tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(make(), str(path))
    assert_refused(*run_cli(capsys, "inspect", str(path)), *words)
    plan = tmp_path / "m.wpk"
    assert_refused(*run_cli(capsys, "build", str(path), "-o", str(plan), "-q"), *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no plan, no temp file


def test_a_1gb_pad_is_refused_under_max_memory_and_named(tmp_path, capsys):
    path = tmp_path / "pad.onnx"
    onnx.save(pad_model(), str(path))
    assert path.stat().st_size < 400
    for command in (["inspect"], ["build", "-q", "-o", str(tmp_path / "pad.wpk")]):
        code, lines = run_cli(capsys, *command, str(path), "--max-memory", "512M")
        assert_refused(code, lines, "Pad node 'pad'", "1.0 GiB", "512.0 MiB")
        assert "--max-memory" in lines[1]
    assert not (tmp_path / "pad.wpk").exists()
    with pytest.raises(LimitError, match="Pad node 'pad'"):
        wpk.build(str(path), max_memory="512M")


def test_a_bad_max_memory_is_exit_2(tmp_path, capsys):
    path = tmp_path / "pad.onnx"
    onnx.save(pad_model(), str(path))
    assert_refused(*run_cli(capsys, "inspect", str(path), "--max-memory", "lots"),
                   "--max-memory")


@pytest.mark.parametrize("dims", ["99999999999x4", "99999999999999999999x4"])
def test_huge_input_shapes_are_refused(dims, tmp_path, capsys):
    path = tmp_path / "dyn.onnx"
    onnx.save(model([h.make_node("Relu", ["x"], ["y"])], {"x": (T.FLOAT, ["n", 4])}, 2),
              str(path))
    assert_refused(*run_cli(capsys, "inspect", str(path), "--input-shape", f"x={dims}"),
                   "--input-shape")


def test_a_huge_sparse_initializer_is_refused_before_it_is_made_dense():
    sparse = h.make_sparse_tensor(nh.from_array(np.ones(1, np.float32), "w"),
                                  nh.from_array(np.zeros(1, np.int64), "w_idx"), [BIG, BIG])
    graph = h.make_graph([h.make_node("Add", ["x", "w"], ["y"])], "m",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 1])],
                         [h.make_tensor_value_info("y", T.FLOAT, [None, None])],
                         sparse_initializer=[sparse])
    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(LimitError, match="sparse initializer 'w'"):
        load_model(proto)


def test_a_huge_declared_initializer_is_refused():
    weight = nh.from_array(np.ones(4, np.float32), "w")
    del weight.dims[:]
    weight.dims.extend([BIG, BIG, BIG])  # 4 bytes of data, 2^60 elements declared
    proto = model([h.make_node("Add", ["x", "w"], ["y"])], {"x": (T.FLOAT, [1])}, 3, [weight])
    with pytest.raises(LimitError, match="initializer 'w'"):
        load_model(proto)


# --- bounded evaluation -------------------------------------------------------------------

def test_a_while_loop_evaluated_for_shapes_stops_at_the_trip_limit():
    proto = loop_model(None)
    limits = Limits(max_memory=1 << 30, max_loop_trips=50)
    with pytest.raises(LimitError, match="Loop node 'loop'.*evaluated for its shapes"):
        bounded_evaluator(proto, "m", limits).run(None, {"x": np.zeros((1, 4), np.float32)})
    with pytest.raises(LimitError, match="Loop node 'loop'"):
        load_model(proto, max_memory=limits)


def test_a_loop_within_the_trip_limit_is_evaluated():
    limits = Limits(max_memory=1 << 30, max_loop_trips=50)
    (result,) = bounded_evaluator(loop_model(50), "m", limits).run(
        None, {"x": np.zeros((1, 4), np.float32)})
    assert np.array_equal(result, np.full((1, 4), 50, np.float32))


def test_evaluation_stops_when_its_outputs_go_over_the_memory_limit():
    proto = model([h.make_node("Tile", ["x", "r"], ["t"], name="tile"),
                   h.make_node("Relu", ["t"], ["y"])], {"x": (T.FLOAT, [1, 1024])}, 2,
                  [nh.from_array(np.array([256, 1], np.int64), "r")])
    evaluator = bounded_evaluator(proto, "m", Limits(max_memory=512 << 10))
    with pytest.raises(LimitError, match="Tile node 'tile' made 't'"):
        evaluator.run(None, {"x": np.zeros((1, 1024), np.float32)})


def test_a_deep_chain_of_value_dependencies_is_no_recursion_error():
    depth = 3000
    nodes = [h.make_node("Identity", [f"s{i}"], [f"s{i + 1}"]) for i in range(depth)]
    nodes.append(h.make_node("Reshape", ["x", f"s{depth}"], ["y"], name="reshape"))
    proto = model(nodes, {"x": (T.FLOAT, [2, 3]), "s0": (T.INT64, [2])}, 2)
    with pytest.raises(ShapeError, match="Reshape node 'reshape'"):
        load_model(proto)


# --- plan files ---------------------------------------------------------------------------

@pytest.fixture
def plan_path(rng, tmp_path):
    from tests.unit.plan_helpers import tiny_plan

    _, plan = tiny_plan(rng)
    plan.report = {"model": "tiny.onnx", "ops": []}
    return plan.save(tmp_path / "tiny.wpk")


def members_of(path):
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rewrite(path, members, big=None):
    """Write `members` back to `path`; `big` = (name, chunk, count) streams a member of
    `count` copies of `chunk` without holding it in memory."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, data in members.items():
            if big is None or name != big[0]:
                archive.writestr(name, data)
        if big is not None:
            name, chunk, count = big
            with archive.open(name, "w", force_zip64=True) as stream:
                for _ in range(count):
                    stream.write(chunk)


def rechecksum(members):
    """The members with the manifest's checksums recomputed (a tamperer's plan)."""
    manifest = json.loads(members[MANIFEST])
    manifest["members"] = {n: hashlib.sha256(d).hexdigest() for n, d in members.items()
                           if n != MANIFEST}
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    return {**members, MANIFEST: json.dumps(manifest).encode()}


def test_a_manifest_inflating_to_1gb_is_refused_at_once_with_little_memory(plan_path, capsys):
    members = members_of(plan_path)
    rewrite(plan_path, members, big=(MANIFEST, b" " * (1 << 20), 1024))
    assert plan_path.stat().st_size < 8 << 20
    tracemalloc.start()
    try:
        with pytest.raises(PlanError, match="'manifest.json' would inflate to 1.0 GiB"):
            read_plan(plan_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    for command in (["report"], ["run"]):
        assert_refused(*run_cli(capsys, *command, str(plan_path)), "manifest.json")


def test_a_member_compressed_like_a_zip_bomb_is_refused(plan_path):
    members = members_of(plan_path)
    rewrite(plan_path, members, big=("kernels/bomb.so", bytes(1 << 20), 8))
    with pytest.raises(PlanError, match="'kernels/bomb.so' would inflate .* times"):
        read_plan(plan_path)


def test_an_array_header_larger_than_its_data_is_refused_before_numpy_allocates(plan_path):
    """The header agrees with the manifest (which the manifest checks accept), but the
    member holds 16 bytes of its data: refused from the header, before numpy reads."""
    members = members_of(plan_path)
    manifest = json.loads(members[MANIFEST])
    constant = manifest["constants"][0]
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": constant["dtype"], "fortran_order": False,
                 "shape": tuple(constant["shape"])})
    buffer.write(bytes(16))
    weights = io.BytesIO()
    with zipfile.ZipFile(weights, "w") as inner:
        for index in range(len(manifest["constants"])):
            inner.writestr(f"c{index}.npy", buffer.getvalue())
    members = rechecksum({**members, WEIGHTS: weights.getvalue()})
    rewrite(plan_path, members)
    with pytest.raises(PlanError, match=f"constant '{constant['name']}' in 'weights.npz' "
                                        "does not match"):
        read_plan(plan_path)


def test_wpk_report_reads_only_the_manifest_and_the_report(plan_path, capsys):
    members = members_of(plan_path)
    damaged = bytearray(members[WEIGHTS])
    damaged[len(damaged) // 2] ^= 0xFF
    rewrite(plan_path, {**members, WEIGHTS: bytes(damaged)})
    with pytest.raises(PlanError, match="weights.npz"):
        read_plan(plan_path)
    manifest, report = read_report(plan_path)
    assert report["model"] == "tiny.onnx" and manifest["target"] == "cpu"
    assert main(["report", str(plan_path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "tiny.onnx"
