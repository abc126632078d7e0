"""The GPU benchmark's pieces that run without a GPU: the torch stand-ins for the ONNX
models and the goal summary."""

import importlib
import os
import re
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def scripts_on_path():
    sys.path.insert(0, str(SCRIPTS))
    yield
    sys.path.remove(str(SCRIPTS))


@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "bvlc_alexnet"])
def test_torch_models_have_the_onnx_models_parameters_and_outputs(scripts_on_path, name):
    pytest.importorskip("torch")
    from torch_models import check_against_onnx

    check = check_against_onnx(name)
    assert check["same_output_shape"], check
    assert check["torch_params"] == check["onnx_params_folded"], check


def test_goals_count_wins_over_cudnn_and_the_resnet_ratio(scripts_on_path):
    pytest.importorskip("torch")
    from bench_gpu import goals

    def row(generated, cudnn):
        return {"contenders": {"wpk_generated": {"median_s": generated} if generated else {},
                               "cudnn": {"median_s": cudnn}}}

    data = {"operators": [row(1.0, 2.0), row(3.0, 2.0), row(3.0, 2.5), row(None, 2.0),
                          {"workload": "w", "error": "boom"}],
            "end_to_end": [{"model": "resnet50", "contenders": {
                "wpk": {"median_s": 0.9}, "torch_eager": {"median_s": 1.0}}},
                {"model": "squeezenet", "error": "boom"}]}
    summary = goals(data)
    assert summary["generated_beats_cudnn"] == "1 of 3 workloads"
    assert summary["generated_goal_met"] is True
    assert summary["resnet50_wpk_over_eager"] == 0.9
    assert summary["resnet50_goal_met"] is False
    data["operators"].append(row(4.0, 2.0))
    assert goals(data)["generated_goal_met"] is False


def test_bench_e2e_selects_corpus_models(scripts_on_path, capsys):
    """`--models corpus` expands to every corpus_<architecture>_<exporter>; a corpus model
    comes with its benchmark feeds and the input shapes its declared -1 dims need."""
    import argparse

    import bench_e2e

    from tests import corpus

    parser = argparse.ArgumentParser()
    names = bench_e2e.model_names(parser, "corpus, light_squeezenet")
    assert names == [f"corpus_{name}" for name in corpus.CORPUS] + ["light_squeezenet"]
    with pytest.raises(SystemExit):
        bench_e2e.model_names(parser, "corpus_svtr_onnxmltools")
    assert "corpus_svtr_onnxmltools" in capsys.readouterr().err
    model, feeds, shapes = bench_e2e.load_benchmark_model("corpus_svtr_paddle", "ci")
    assert shapes == {"x": (1, 3, 32, 64)} and feeds["x"].shape == (1, 3, 32, 64)
    assert model.graph.input[0].type.tensor_type.shape.dim[3].dim_value == -1


@pytest.mark.parametrize("name", ["corpus_svtr_paddle", "corpus_mobilenetv3_torchscript"])
def test_bench_e2e_sets_an_open_batch_dimension(scripts_on_path, name):
    """`--batch N`: the model's open batch dimension (paddle's -1, torch's symbol) at N in
    the feeds and the build's shapes; asked of a model with fixed shapes, a clear error."""
    import bench_e2e

    _, plain_feeds, plain = bench_e2e.load_benchmark_model(name, "ci")
    _, feeds, shapes = bench_e2e.load_benchmark_model(name, "ci", batch=3)
    assert shapes == {"x": (3, *plain["x"][1:])} and feeds["x"].shape == shapes["x"]
    assert feeds["x"].dtype == plain_feeds["x"].dtype
    with pytest.raises(bench_e2e.BatchError, match="corpus_"):
        bench_e2e.load_benchmark_model("light_squeezenet", "ci", batch=3)


def _relu_file(folder, dims, name="relu") -> str:
    import onnx
    from onnx import TensorProto
    from onnx import helper as h

    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "relu",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    path = str(folder / f"{name}.onnx")
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def test_bench_e2e_times_a_users_model_file(scripts_on_path, tmp_path, capsys):
    """`--models PATH.onnx`: the file's open batch dimension at --batch (or 1) in the feeds
    and the build's shapes; an open dimension past the batch, a missing file: clear errors."""
    import argparse

    import bench_e2e

    path = _relu_file(tmp_path, ["n", 3, 5])
    assert bench_e2e.model_names(argparse.ArgumentParser(), path) == [path]
    with pytest.raises(SystemExit):
        bench_e2e.model_names(argparse.ArgumentParser(), str(tmp_path / "missing.onnx"))
    assert "missing.onnx" in capsys.readouterr().err
    _, feeds, shapes = bench_e2e.load_benchmark_model(path)
    assert shapes == {"x": (1, 3, 5)} and feeds["x"].shape == (1, 3, 5)
    _, feeds, shapes = bench_e2e.load_benchmark_model(path, batch=4)
    assert shapes == {"x": (4, 3, 5)} and feeds["x"].shape == (4, 3, 5)
    with pytest.raises(bench_e2e.BatchError, match="past the batch"):
        bench_e2e.load_benchmark_model(_relu_file(tmp_path, ["n", "c", 5], "open"))
    with pytest.raises(bench_e2e.BatchError, match="fixed the batch"):
        bench_e2e.load_benchmark_model(_relu_file(tmp_path, [2, 3, 5], "fixed"), batch=4)
    result = bench_e2e.bench_model(path, rounds=2, warmup=0, threads=1,
                                   build_options={"search": "none"}, breakdown=False,
                                   workdir=str(tmp_path), batch=2)
    assert result["input_shapes"] == {"x": [2, 3, 5]} and result["relative_l2_vs_ort"] < 1e-6


def test_bench_e2e_refuses_a_fixed_batch_dimension(scripts_on_path, monkeypatch):
    import bench_e2e

    model, _, _ = bench_e2e.load_benchmark_model("corpus_svtr_paddle", "ci")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    monkeypatch.setattr(bench_e2e.corpus, "build_model", lambda *_: model)
    with pytest.raises(bench_e2e.BatchError, match="fixed the batch dimension"):
        bench_e2e.load_benchmark_model("corpus_svtr_paddle", "ci", batch=2)


def test_bench_tuned_times_blocks_against_onnxruntimes_default_spinning(scripts_on_path,
                                                                        tmp_path, capsys):
    """Issue 10 item 6's method: a searched build, then blocks of runs per engine against
    onnxruntime at its default (spinning); the JSON says so and holds the ratio. With
    --fresh-process the same timing again in a new process that loads the saved plan."""
    import json
    import os

    import bench_tuned

    assert bench_tuned.main(["--models", "transformer_encoder", "--search", "random",
                             "--budget", "20", "--trials", "2", "--rounds", "2",
                             "--warmup", "0", "--block", "3", "--db-dir", str(tmp_path / "db"),
                             "--fresh-process", "--results-dir", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("tuned-*.json")
    report = json.loads(written.read_text())
    assert report["block"] == 3 and report["ort_spinning"] is True
    assert "3 run(s) of each per round" in report["method"]
    assert report["fresh_process"] is True and "fresh process" in report["method"]
    (result,) = report["results"]
    assert result["model"] == "transformer_encoder" and result["ratio_wpk_over_ort"] > 0
    # each block's first run is untimed (what the other engine left running lands there)
    assert result["wpk"]["runs"] == result["onnxruntime"]["runs"] == 4
    assert result["search"]["search"] == "random" and result["relative_l2_vs_ort"] < 1e-4
    fresh = result["fresh_process"]
    assert fresh["wpk"]["runs"] == fresh["onnxruntime"]["runs"] == 4
    assert fresh["relative_l2_vs_ort"] < 1e-4 and fresh["pid"] != os.getpid()
    assert fresh["ratio_wpk_over_ort"] == pytest.approx(
        fresh["wpk"]["median_ms"] / fresh["onnxruntime"]["median_ms"])
    low, high = fresh["ratio_interval_95"]
    assert low <= fresh["ratio_wpk_over_ort"] <= high
    out = capsys.readouterr().out
    assert "| transformer_encoder |" in out and "| transformer_encoder (fresh process) |" in out


def test_the_e2e_ratio_interval_separates_a_real_difference_from_noise(scripts_on_path):
    import numpy as np
    from bench_e2e import markdown_table, ratio_interval, verdict

    rng = np.random.default_rng(3)
    rounds, block = 10, 9
    # the machine's speed drifts from round to round; both engines' blocks drift together
    drift = np.repeat(rng.uniform(0.8, 1.3, rounds), block)
    ort = list(drift * rng.normal(1.0, 0.05, rounds * block))
    same = list(drift * rng.normal(1.0, 0.05, rounds * block))
    faster = list(drift * rng.normal(0.9, 0.05, rounds * block))
    tie, win = ratio_interval(same, ort, rounds), ratio_interval(faster, ort, rounds)
    assert tie[0] < 1 < tie[1] and verdict(tie) == "tie within noise"
    assert win[1] < 1 and verdict(win) == "faster"
    assert verdict((1.02, 1.08)) == "slower"
    row = {"model": "m", "build_s": 1.0, "steps": 3, "fallback_steps": 0,
           "relative_l2_vs_ort": 1e-7, "ratio_wpk_over_ort": 0.9,
           "wpk": {"median_ms": 0.9, "p25_ms": 0.8, "p75_ms": 1.0, "min_ms": 0.7},
           "onnxruntime": {"median_ms": 1.0, "p25_ms": 0.9, "p75_ms": 1.1, "min_ms": 0.8},
           "ratio_interval_95": list(win), "verdict": verdict(win)}
    assert f"| {win[0]:.2f}-{win[1]:.2f} | faster |" in markdown_table([row], 2)


def test_the_e2e_summary_counts_verdicts_and_prints_an_earlier_runs_table(scripts_on_path,
                                                                         tmp_path, capsys):
    import json

    from bench_e2e import WHOLE_MODEL, main, summary_text

    def row(model, ratio, verdict, fallback=0):
        return {"model": model, "build_s": 1.0, "steps": 4, "fallback_steps": fallback,
                "relative_l2_vs_ort": 1e-7, "ratio_wpk_over_ort": ratio,
                "wpk": {"median_ms": ratio, "p25_ms": ratio, "p75_ms": ratio, "min_ms": ratio},
                "onnxruntime": {"median_ms": 1.0, "p25_ms": 1.0, "p75_ms": 1.0, "min_ms": 1.0},
                "ratio_interval_95": [ratio * 0.9, ratio * 1.1], "verdict": verdict}

    rows = [row("a", 0.5, "faster"), row("b", 2.0, "tie within noise", fallback=1),
            row("c", 1.0, WHOLE_MODEL), row("d", 1.25, "slower")]
    line = summary_text(rows)
    # (0.5 * 2.0 * 1.0 * 1.25) ** (1/4) = 1.057
    assert line == ("4 models: geometric mean wpk/ort 1.06x; of 3 wpk plans 1 faster, 1 ties, "
                    "1 slower (95% intervals); 1 builds kept onnxruntime's whole model; "
                    "1 fallback steps")
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"threads": 2, "results": rows}))
    assert main(["--table", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "| c | 1.0 |" in out and out.rstrip().endswith(line)
    for bad in (tmp_path / "missing.json", tmp_path / "other.json"):
        if bad.name == "other.json":
            bad.write_text('{"rows": []}')   # another benchmark's JSON
        assert main(["--table", str(bad)]) == 2
        assert capsys.readouterr().err.startswith(f"error: --table {bad}: ")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads Linux's /proc")
def test_a_second_run_of_the_day_never_overwrites_the_first_ones_results(scripts_on_path,
                                                                         tmp_path):
    """A run writes PREFIX-DATE-HOST.json, the next ones of the day -2, -3: the README
    cites results by file name (a run of 2026-12-07 once replaced the one it cited)."""
    import json

    import bench_e2e

    report = {"machine": {"host": "vm"}}
    paths = [bench_e2e.write_results({**report, "run": run}, "e2e", tmp_path)
             for run in range(3)]
    stem = paths[0].stem
    assert [p.name for p in paths] == [f"{stem}.json", f"{stem}-2.json", f"{stem}-3.json"]
    assert [json.loads(p.read_text())["run"] for p in paths] == [0, 1, 2]


def test_bench_e2e_builds_beside_busy_processes_that_end_with_the_build(scripts_on_path):
    """`--busy-build N`: N processes that each burn CPU while the block runs, none after."""
    import time

    from bench_e2e import busy_processes

    def cpu_ticks(pid: int) -> int:   # utime + stime, /proc/PID/stat fields 14 and 15
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    with busy_processes(2) as procs:
        assert len(procs) == 2
        time.sleep(0.5)
        before = [cpu_ticks(p.pid) for p in procs]
        time.sleep(0.5)
        assert all(cpu_ticks(p.pid) > b for p, b in zip(procs, before))
    assert all(p.poll() is not None for p in procs)


def test_bench_ort_threads_times_both_sessions_in_swapping_blocks(scripts_on_path, tmp_path):
    import json

    import bench_ort_threads

    out = tmp_path / "ort-threads.json"
    assert bench_ort_threads.main(["--models", "transformer_encoder", "--rounds", "2",
                                   "--block", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["results"][0]
    assert result["default"]["runs"] == result["threads_set"]["runs"] == 2  # first untimed
    assert result["ratio_default_over_set"] > 0
    assert set(result["worker_affinity"]) == {"default", "threads set"}


def test_the_gpu_plan_audit_counts_host_steps(scripts_on_path, tmp_path, capsys):
    """An op with no device kernel (Sin) is a host step of an offline GPU plan; a plan
    without one passes."""
    from audit_gpu_plans import main
    from onnx import TensorProto, helper, save

    def model(ops, path):
        nodes = [helper.make_node(op, [f"t{i}"], [f"t{i + 1}"]) for i, op in enumerate(ops)]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [2, 64])],
            [helper.make_tensor_value_info(f"t{len(ops)}", TensorProto.FLOAT, [2, 64])])
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                               ir_version=8), str(path))
        return str(path)

    with_sin = model(["Relu", "Sin"], tmp_path / "sin.onnx")
    clean = model(["Relu", "Sigmoid"], tmp_path / "clean.onnx")
    assert main(["--gpu", "t4", with_sin]) == 1
    assert "host steps: Sin x1" in capsys.readouterr().out
    assert main(["--gpu", "t4", clean]) == 0
    out = capsys.readouterr().out
    assert "host steps: none" in out and "predicted " in out
    assert re.search(r"largest share: (Relu|Sigmoid|Elementwise)\b.*\d+%", out), out


def test_time_builds_times_an_empty_and_a_warm_compile_cache(scripts_on_path, tmp_path,
                                                             cache_dir):
    import json
    import os

    import time_builds

    out = tmp_path / "times.json"
    assert time_builds.main(["--models", "transformer_encoder", "--jobs", "1", "2",
                             "--fast", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["jobs"] for r in rows] == [1, 2]
    assert all(r["empty_cache_s"] > 0 and r["warm_cache_s"] > 0 for r in rows)
    assert os.environ["WPK_CACHE_DIR"] == cache_dir     # the caller's cache is back


def test_bench_conv_schedules_times_both_winograd_rounds_and_dilated_convs(scripts_on_path,
                                                                          tmp_path):
    """One conv of each part, one round: every contender timed, ratios against the faster
    onnxruntime pool, the JSON written."""
    import json

    import bench_conv_schedules

    out = tmp_path / "schedules.json"
    assert bench_conv_schedules.main(["--limit", "1", "--rounds", "1", "--repeat", "1",
                                      "--output", str(out)]) == 0
    parts = json.loads(out.read_text())["parts"]
    (winograd,), (dilated,) = parts["winograd rounds"], parts["dilated direct"]
    assert {"m2 local", "m2 shared", "m4 local", "m4 shared", "onnxruntime"} == set(winograd["us"])
    assert set(dilated["us"]) == {"direct", "onnxruntime"} and "d6" in dilated["conv"]
    for row in (winograd, dilated):
        for name, ratio in row["onnxruntime_over"].items():
            # the JSON rounds ratios to 3 decimals: a contender 50x slower than onnxruntime
            # (0.0175 written 0.017, under load) is off by 3% but by under 5e-4
            assert ratio == pytest.approx(row["us"]["onnxruntime"] / row["us"][name], rel=1e-2,
                                          abs=5e-4)


def test_bench_moves_verifies_and_times_every_form_of_the_copy(scripts_on_path, tmp_path):
    """Two cases (a transpose shared out to the threads, a Concat), one round: every form
    verified against numpy's copy and timed, the JSON written."""
    import json

    import bench_moves

    out = tmp_path / "moves.json"
    assert bench_moves.main(["--cases", "svtr-heads,yolo-concat", "--rounds", "1",
                             "--repeat", "1", "--output", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["svtr-heads", "yolo-concat"]
    for row in rows:
        assert set(row["us"]) == {"numpy.copyto", *bench_moves.FORMS}
        assert all(t > 0 for t in row["us"].values())
        assert row["gb_s"]["numpy.copyto"] == pytest.approx(
            2 * row["bytes"] / row["us"]["numpy.copyto"] / 1e3)


def test_step_drift_times_each_step_alone_and_inside_runs(scripts_on_path, tmp_path, capsys):
    """Every step of a small plan (here one onnxruntime region, timed whole) gets both
    times; the totals line adds up the rows; a missing plan is an error line."""
    import json

    from step_drift import main

    from tests.models import tiny_conv_gemm
    from wpk.pipeline import build

    plan = tmp_path / "tiny.wpk"
    build(tiny_conv_gemm(), "cpu", plan, partition=False)
    assert main([str(plan), "--runs", "3", "--repeats", "3", "--json",
                 str(tmp_path / "drift.json")]) == 0
    rows = json.loads((tmp_path / "drift.json").read_text())["steps"]
    assert sum(len(r["nodes"]) for r in rows) == 4   # Conv, pool, Flatten, Gemm
    assert all(r["alone_s"] > 0 and r["in_run_s"] > 0 for r in rows)
    first = capsys.readouterr().out.splitlines()[0]
    alone = sum(r["alone_s"] for r in rows) * 1e3
    assert f"4 steps in {len(rows)} timed units: alone {alone:.2f} ms" in first
    assert main([str(tmp_path / "none.wpk")]) == 2
    assert "error:" in capsys.readouterr().err


def test_machine_phases_splits_rounds_by_onnxruntimes_block_times(scripts_on_path, tmp_path,
                                                                  capsys):
    """The quiet and contended phases are the rounds where onnxruntime's block ran fastest
    and slowest; each phase's ratio is its medians' quotient and every step of the plan
    has its times; a missing plan, a file that is no model and a model whose inputs are
    not the plan's are error lines."""
    import json

    import onnx
    from machine_phases import main, phases

    from tests.models import tiny_conv_gemm
    from wpk.pipeline import build

    rounds = [{"wpk": w, "onnxruntime": o, "units": {"a": w / 2}}
              for w, o in ((1.0, 2.0), (3.0, 4.0), (2.0, 3.0), (5.0, 9.0), (1.5, 2.5))]
    found = phases(rounds)
    assert (found["quiet"]["onnxruntime_s"], found["contended"]["onnxruntime_s"]) == (2.0, 9.0)
    assert found["contended"]["ratio"] == pytest.approx(5 / 9)
    assert found["all"]["rounds"] == 5 and found["all"]["units_s"]["a"] == 1.0

    model = tiny_conv_gemm()
    onnx.save(model, tmp_path / "tiny.onnx")
    plan = tmp_path / "tiny.wpk"
    build(model, "cpu", plan, partition=False)
    assert main([str(plan), str(tmp_path / "tiny.onnx"), "--seconds", "0.2", "--block", "2",
                 "--json", str(tmp_path / "phases.json")]) == 0
    saved = json.loads((tmp_path / "phases.json").read_text())["phases"]
    for phase in saved.values():
        assert phase["ratio"] == pytest.approx(phase["wpk_s"] / phase["onnxruntime_s"])
        assert all(t > 0 for t in phase["units_s"].values())
    assert saved["all"]["rounds"] >= 2 and saved["all"]["units_s"]
    assert "contended / quiet: wpk" in capsys.readouterr().out
    (tmp_path / "bad.onnx").write_text("not a model")
    other = tiny_conv_gemm()
    other.graph.input[0].name = other.graph.node[0].input[0] = "renamed"
    onnx.save(other, tmp_path / "other.onnx")
    for args in ([str(tmp_path / "none.wpk"), str(tmp_path / "tiny.onnx")],
                 [str(plan), str(tmp_path / "bad.onnx")],
                 [str(plan), str(tmp_path / "other.onnx")]):
        assert main(args) == 2
        assert capsys.readouterr().err.startswith("error:")


def test_the_demo_compares_a_model_whose_output_depends_on_its_input(tmp_path):
    """The README's first command (`scripts/demo.py`) on a small light model: it builds,
    runs, compares and reports through the CLI, on random weights by default (the shipped
    ones give one output for every input), and an unknown model is an error line."""
    import subprocess

    demo = [sys.executable, str(SCRIPTS / "demo.py"), "--model", "light_squeezenet",
            "--workdir", str(tmp_path)]
    done = subprocess.run(demo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "model.onnx").is_file() and (tmp_path / "model.wpk").is_file()
    spread = float(re.search(r"spread ([0-9.e+-]+) \(std\)", done.stdout).group(1))
    assert spread > 1e-4   # the shipped weights give 1e-10 here
    error = float(re.search(r"relative L2 error vs onnxruntime: ([0-9.e+-]+)",
                            done.stdout).group(1))
    assert error < 1e-4
    assert "$ wpk report" in done.stdout
    unknown = subprocess.run([*demo[:2], "--model", "no_such_net"], capture_output=True,
                             text=True, timeout=60)
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: no model")
    assert "light_squeezenet" in unknown.stderr


def test_the_gpu_check_script_runs_every_gpu_test_file():
    """`scripts/gpu_check.sh` is the one command a lent GPU runs: a file of tests/gpu it
    does not name would never run anywhere."""
    script = (SCRIPTS / "gpu_check.sh").read_text()
    files = sorted(p.name for p in (SCRIPTS.parent / "tests" / "gpu").glob("test_*.py"))
    assert files and [name for name in files if f"tests/gpu/{name}" not in script] == []


def test_bench_concat_in_place_times_a_plan_against_its_copy_without_placements(
        scripts_on_path, tmp_path):
    """SqueezeNet (eight Fire concats), two rounds: both plans match onnxruntime, the copy
    places nothing, the JSON has the row."""
    import json

    import bench_concat_in_place

    import wpk

    out = tmp_path / "concat.json"
    assert bench_concat_in_place.main(["--models", "light_squeezenet", "--rounds", "2",
                                       "--runs", "1", "--output", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["concat_steps"] == 8 and row["pieces_at_nonzero_offsets"] > 0
    assert max(row["relative_l2_vs_ort"].values()) < 1e-4
    assert row["rounds"] == 2 and all(t > 0 for t in row["median_ms"].values())
    model, _, _ = bench_concat_in_place.load_benchmark_model("light_squeezenet")
    plan = wpk.build(model, target="cpu", search="none", progress=False, partition=False,
                     warmup=0, repeats=1, min_time=0.0)
    assert plan.buffer_plan.tensor_offsets
    assert not bench_concat_in_place.without_placements(plan).buffer_plan.tensor_offsets


def test_bench_load_times_both_engines_in_fresh_processes(scripts_on_path, tmp_path, capsys):
    import json

    import bench_load

    out = tmp_path / "load.json"
    assert bench_load.main(["--models", "light_squeezenet", "--rounds", "2", "--dir",
                            str(tmp_path), "--json", str(out), "--no-save"]) == 0
    result = json.loads(out.read_text())["results"][0]
    assert (tmp_path / "light_squeezenet.wpk").exists() and result["build_s"] > 0
    assert len(result["wpk_runs"]) == len(result["ort_runs"]) == len(result["ratios"]) == 2
    for runs in (result["wpk_runs"], result["ort_runs"]):
        assert all(run["seconds"] > 0 and run["peak_mb"] > 10 for run in runs)
        assert all(run["first_run_s"] > 0 and run["second_run_s"] > 0 for run in runs)
        assert all(run["bytecode_cached"] for run in runs)   # as an installed package
    assert "| light_squeezenet |" in capsys.readouterr().out


def test_the_pool_grid_finds_onnx_references_average_pools_wrong_and_wpks_right(
        scripts_on_path, capsys):
    """`scripts/pool_grids.py --reference` (the README's figures): onnx.reference's own
    ceil_mode AveragePool is wrong on some of the draws, the one wpk gives it on none."""
    from pool_grids import main

    assert main(["--reference", "--count", "150", "--without-wpk-pools"]) == 1
    alone = capsys.readouterr().out
    assert "wrong: AveragePool" in alone
    assert main(["--reference", "--count", "150"]) == 0
    assert re.search(r"(\d+) pools that onnxruntime runs, \1 right, 0 wrong",
                     capsys.readouterr().out)


def test_idle_gaps_children_get_the_users_environment(scripts_on_path):
    """A build in the benchmark's own process sets wpk's OpenMP policy there; the children
    must start from the environment before it, or the plan's own policy never shows."""
    from bench_idle_gaps import child_env

    user = {"PATH": "/bin"}
    assert child_env(user, None) == user
    assert child_env(user, 30000) == {"PATH": "/bin", "OMP_WAIT_POLICY": "passive",
                                      "GOMP_SPINCOUNT": "30000"}


def test_idle_gaps_sleep_each_gap_before_every_timed_run(scripts_on_path):
    import time

    from bench_idle_gaps import time_after_gaps

    starts = []
    rows = time_after_gaps(lambda: starts.append(time.perf_counter()), [0.0, 0.03], runs=3,
                           warmup=2)
    assert [row["gap_ms"] for row in rows] == [0.0, 30.0]
    assert len(starts) == 2 + 6
    assert min(b - a for a, b in zip(starts[-3:], starts[-2:])) >= 0.03


def test_bench_tvm_checks_tvms_outputs_and_times_three_engines(tmp_path):
    """TVM's Relax importer and compile run for real (untuned: MetaSchedule's trials take
    minutes even on a small model here); TVM's output agrees with onnxruntime's and the JSON
    holds both ratios. In a subprocess: importing TVM installs its own crash handlers."""
    pytest.importorskip("tvm")
    import json
    import subprocess

    script = [sys.executable, str(SCRIPTS / "bench_tvm.py"), "--models", "espcn_like",
              "--tvm-trials", "0", "--rounds", "2", "--block", "2", "--warmup", "1",
              "--results-dir", str(tmp_path)]
    done = subprocess.run(script, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| espcn_like |" in done.stdout and "geometric mean wpk/TVM" in done.stdout
    [written] = tmp_path.glob("tvm-*.json")
    report = json.loads(written.read_text())
    result = report["results"][0]
    assert report["tvm_trials"] == 0 and result["tvm"]["compile_s"] > 0, result["tvm"]
    errors = result["relative_l2_vs_ort"]
    assert errors["tvm"] < 1e-4 and errors["wpk"] < 1e-4, errors
    assert set(result["timings"]) == {"wpk", "tvm", "onnxruntime"}
    assert all(t["runs"] == 2 for t in result["timings"].values())   # 2 rounds of 2, 1 untimed
    for peer in ("tvm", "onnxruntime"):
        low, high = result[f"wpk_over_{peer}"]["ratio_interval_95"]
        assert 0 < low <= high


def test_bench_tvm_reports_which_models_tvm_runs(tmp_path):
    """`--coverage` runs TVM's importer, compile and one run on exporters' graphs: tf2onnx's
    YOLO head, whose Resize has an empty scales input beside its sizes (as ONNX allows and
    tf2onnx writes it), gives a row with TVM's import error; the ConvNeXt runs to
    onnxruntime's outputs."""
    pytest.importorskip("tvm")
    import json
    import subprocess

    script = [sys.executable, str(SCRIPTS / "bench_tvm.py"), "--coverage", "--models",
              "corpus_yolo_tf,corpus_convnext_tf", "--corpus-size", "ci",
              "--results-dir", str(tmp_path)]
    done = subprocess.run(script, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TVM ran 1 of 2 models, 1 of them within 0.0001 of onnxruntime's" in done.stdout
    [written] = tmp_path.glob("tvm-coverage-*.json")
    yolo, convnext = json.loads(written.read_text())["results"]
    assert yolo["stage"] == "import" and "Resize" in yolo["error"], yolo
    assert convnext["stage"] == "ran" and convnext["relative_l2_vs_ort"] < 1e-4, convnext


@pytest.mark.parametrize("script, blocked, unknown", [
    ("export_keras_models", "tensorflow", "alexnet"),
    ("export_paddle_models", "paddle", "vit"),
    ("export_hf_models", "transformers", "t5"),
])
def test_a_model_export_says_what_to_install_without_its_exporter(script, blocked, unknown,
                                                                  scripts_on_path, tmp_path,
                                                                  monkeypatch, capsys):
    """The export scripts need their exporters (TensorFlow and tf2onnx, PaddlePaddle and
    paddle2onnx, transformers: no dependencies of wpk): without one, one error line with
    the install hint and nothing written; an unknown model is a usage error."""
    main = importlib.import_module(script).main
    monkeypatch.setitem(sys.modules, blocked, None)
    assert main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {blocked} is not installed") and "hint:" in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--models", unknown])
    assert f"unknown model(s) {unknown}" in capsys.readouterr().err
