"""`wpk inspect --export` and `wpk report --graph`: the graph after the passes and a plan's
chosen graph as ONNX files that pass `onnx.checker`, reload, run in onnxruntime where
their ops are standard, and name and annotate what wpk fused and chose."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import wpk
from tests.models import mobilenet_v2_like, tiny_conv_gemm
from wpk.cli import main
from wpk.frontend import load_model
from wpk.pipeline import model_bytes
from wpk.plans.assemble import whole_model_plan
from wpk.plans.planfile import read_plan
from wpk.runtime import Session

X = np.random.default_rng(0).random((1, 3, 8, 8)).astype(np.float32)


def reload(path) -> onnx.ModelProto:
    """The file read back and checked again (full check: shapes too)."""
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    return model


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "tiny.onnx"
    onnx.save(tiny_conv_gemm(), str(path))
    return path


def test_the_optimized_graph_is_valid_runnable_onnx_with_fused_nodes_named(tiny, tmp_path):
    out = tmp_path / "optimized.onnx"
    assert main(["inspect", str(tiny), "--gpu", "--export", str(out)]) == 0
    model = reload(out)
    names = [node.name for node in model.graph.node]
    assert len(names) == len(set(names)) and all(names)
    fused = [node for node in model.graph.node if "part of wpk fused node" in node.doc_string]
    assert {node.op_type for node in fused} == {"Conv", "Relu"}
    conv = next(node for node in fused if node.op_type == "Conv")
    assert f"'{conv.name}' (Conv +relu)" in conv.doc_string
    assert any(node.name == f"{conv.name}/Relu_1" for node in fused)
    assert "after wpk's graph passes for cuda" in model.graph.doc_string
    expected = run_ort(tiny_conv_gemm(), {"x": X})[0]
    np.testing.assert_allclose(run_ort(model, {"x": X})[0], expected, rtol=1e-5, atol=1e-6)


def test_blocked_layout_nodes_pass_the_checker_and_say_only_wpk_runs_them(tmp_path):
    source = tmp_path / "mobilenet.onnx"
    onnx.save(mobilenet_v2_like(image_size=64, classes=10), str(source))
    out = tmp_path / "optimized.onnx"
    assert main(["inspect", str(source), "--export", str(out)]) == 0
    model = reload(out)
    blocked = [node for node in model.graph.node if node.domain == "wpk.nchwc"]
    assert blocked and all("which only wpk runs" in node.doc_string for node in blocked)


def test_the_chosen_graph_says_what_runs_each_node(tiny, tmp_path):
    plan_path = tmp_path / "tiny.wpk"
    wpk.build(str(tiny), target="cpu", output=str(plan_path), progress=False, partition=False,
              warmup=1, repeats=3, min_time=0.0)
    out = tmp_path / "chosen.onnx"
    assert main(["report", str(plan_path), "--graph", str(out), "--format", "json",
                 "-o", str(tmp_path / "r.json")]) == 0
    model = reload(out)
    plan = read_plan(str(plan_path))
    by_name = {node.name: node for node in model.graph.node}
    for entry in plan.report["workloads"]:
        for node in entry["nodes"]:
            doc = by_name[node].doc_string
            assert f"wpk chose {entry['chosen']} ({entry['chosen_kind']})" in doc
            assert "per call measured alone" in doc and "why: " in doc
    ours = Session(plan).run({"x": X})["y"]
    np.testing.assert_allclose(run_ort(model, {"x": X})[0], ours, rtol=1e-5, atol=1e-6)


def test_a_whole_model_plan_exports_the_model_onnxruntime_runs(tiny, tmp_path):
    from wpk.commands.onnx_export import chosen_graph_model, write_onnx

    plan = whole_model_plan(load_model(str(tiny)), model_bytes(str(tiny)))
    plan.report = {"partition": {"reason": "onnxruntime runs the whole model 1.5x faster"}}
    out = tmp_path / "whole.onnx"
    write_onnx(chosen_graph_model(plan), out)
    model = reload(out)
    assert [n.op_type for n in model.graph.node] == [n.op_type for n in
                                                      tiny_conv_gemm().graph.node]
    assert all("onnxruntime runs the whole model 1.5x faster" in node.doc_string
               for node in model.graph.node)
