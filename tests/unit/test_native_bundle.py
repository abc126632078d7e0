"""A CPU plan carries its kernels' shared libraries: it loads without a C compiler."""

from __future__ import annotations

import copy
import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from wpk.dsl import toolchain
from wpk.kernels import registry
from wpk.native_bundle import bundle_native_libraries, native_libraries
from wpk.plans.planfile import Plan, read_plan
from wpk.runtime import Session


def _matmul_model(rng, m: int = 6, k: int = 24, n: int = 40):
    """y = x @ w for x [m, k] and a constant w [k, n]: the model and w."""
    weight = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, weight


def _on_generated_gemm(plan: Plan) -> Plan:
    """The plan with its step given to micro.gemm's default schedule (a compiled kernel,
    whatever the build's timing chose)."""
    manifest = copy.deepcopy(plan.manifest)
    impl = registry.get("micro.gemm")
    for step in manifest["steps"]:
        workload = plan.workload(step["workload_key"])
        step.update(impl=impl.name, kind=impl.kind, config=impl.configs(workload)[0],
                    artifacts=[])
    return Plan(manifest, plan.weights, plan.report, {})


@pytest.fixture(scope="module")
def bundled_plan(tmp_path_factory):
    rng = np.random.default_rng(7)
    model, weight = _matmul_model(rng)
    built = wpk.build(model, target="cpu", progress=False, partition=False)
    generated = _on_generated_gemm(built)
    Session(generated)   # as in a build, this process has loaded the plan's kernels already
    plan = bundle_native_libraries(generated)
    path = tmp_path_factory.mktemp("bundle") / "mm.wpk"
    plan.save(path)
    return path, weight


def test_the_plan_holds_the_library_its_step_loads(bundled_plan):
    path, _ = bundled_plan
    plan = read_plan(path)
    libraries = native_libraries(plan)
    assert len(libraries) >= 1
    for data in libraries.values():
        assert data[:4] == b"\x7fELF"
    assert plan.manifest["requires"]["machine"] == plan.manifest["device"]["machine"]


def _load_and_run_without_a_compiler(path, cache, x):
    code = textwrap.dedent(f"""
        import numpy as np, wpk
        x = np.load({str(cache / 'x.npy')!r})
        session = wpk.load({str(path)!r})
        np.save({str(cache / 'y.npy')!r}, session.run(None, {{"x": x}})[0])
        print([step.impl for step in session.plan.steps])
    """)
    np.save(cache / "x.npy", x)
    env = {**os.environ, "WPK_CACHE_DIR": str(cache / "empty-cache"), "CC": "/nonexistent/gcc"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)


def test_it_loads_and_runs_where_no_compiler_is_and_the_cache_is_empty(bundled_plan,
                                                                       tmp_path):
    path, weight = bundled_plan
    x = np.random.default_rng(8).standard_normal((6, 24)).astype(np.float32)
    done = _load_and_run_without_a_compiler(path, tmp_path, x)
    assert done.returncode == 0, done.stderr
    assert "micro.gemm" in done.stdout
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), x @ weight, rtol=1e-5, atol=1e-5)


def test_without_its_libraries_the_same_plan_needs_the_compiler(bundled_plan, tmp_path):
    """What the libraries spare: the plan less its native members cannot load there."""
    path, _ = bundled_plan
    bare_path = _bare(read_plan(path)).save(tmp_path / "bare.wpk")
    done = _load_and_run_without_a_compiler(bare_path, tmp_path, np.zeros((6, 24), np.float32))
    assert done.returncode != 0
    assert "/nonexistent/gcc" in done.stderr


def _bare(plan: Plan) -> Plan:
    """The plan less the libraries it carries."""
    return Plan(plan.manifest, plan.weights, plan.report,
                {k: v for k, v in plan.kernels.items() if not k.startswith("native/")})


def test_a_library_the_host_lacks_is_named_with_how_to_get_it(bundled_plan, tmp_path,
                                                              monkeypatch):
    """A carried kernel library needs a shared library the loading host lacks (libgomp on
    a slim image): `wpk run` names the node and the library and says how to install it.
    Real libraries and a real loader: the kernel compiled by a gcc that also links a
    library, which is deleted before the load."""
    absent = tmp_path / "libwpk_absent_for_test.so.1"
    source = tmp_path / "absent.c"
    source.write_text("int wpk_absent_for_test(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{absent.name}", "-o", str(absent),
                    str(source)], check=True)
    linking_more = tmp_path / "gcc-linking-more"
    linking_more.write_text(f'#!/bin/sh\nexec gcc "$@" -L{tmp_path} -Wl,-rpath,{tmp_path} '
                            f'-Wl,--no-as-needed -l:{absent.name}\n')
    linking_more.chmod(0o755)
    monkeypatch.setenv("CC", str(linking_more))
    monkeypatch.setenv("WPK_CACHE_DIR", str(tmp_path / "cache"))
    carried = bundle_native_libraries(_bare(read_plan(bundled_plan[0])))
    assert native_libraries(carried), carried.report
    path = carried.save(tmp_path / "needs.wpk")
    absent.unlink()
    np.savez(tmp_path / "x.npz", x=np.zeros((6, 24), np.float32))
    env = {**os.environ, "WPK_CACHE_DIR": str(tmp_path / "fresh-cache")}
    done = subprocess.run([sys.executable, "-m", "wpk.cli", "run", str(path), "--inputs",
                           str(tmp_path / "x.npz")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "node 'mm' (micro.gemm) failed to load" in done.stderr
    assert f"it needs {absent.name}, which this host does not have" in done.stderr
    assert f"hint: install the package that provides {absent.name} on this host" in done.stderr


@pytest.mark.parametrize("kept", [0.5, 0.97])
def test_a_library_cut_short_under_new_checksums_is_an_error_not_a_crash(bundled_plan,
                                                                         tmp_path, kept):
    """A carried library cut short, the plan saved again (checksums that match it): the
    loader mapped its missing pages and `wpk run` died of SIGBUS, saying nothing (found
    by tests/fuzzing). Now an error names the member, before anything is loaded."""
    plan = read_plan(bundled_plan[0])
    (key, data), *_ = native_libraries(plan).items()
    member = f"native/{key}.so"
    damaged = Plan(plan.manifest, plan.weights, plan.report,
                   {**plan.kernels, member: data[:int(len(data) * kept)]})
    path = damaged.save(tmp_path / "cut.wpk")
    np.savez(tmp_path / "x.npz", x=np.zeros((6, 24), np.float32))
    env = {**os.environ, "WPK_CACHE_DIR": str(tmp_path / "fresh-cache")}
    done = subprocess.run([sys.executable, "-m", "wpk.cli", "run", str(path), "--inputs",
                           str(tmp_path / "x.npz")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert f"kernels/{member} is not a loadable kernel library" in done.stderr
    assert "cut short" in done.stderr and "hint: " in done.stderr


def test_a_missing_openmp_runtime_gets_the_packages_to_install():
    """The loader's words for a missing libgomp, as a slim image's loader says them."""
    error = toolchain._load_error("/c/kernel.so", "wpk_micro_gemm", OSError(
        "libgomp.so.1: cannot open shared object file: No such file or directory"))
    assert isinstance(error, toolchain.MissingLibraryError)
    assert "apt install libgomp1" in error.hint and "it needs libgomp.so.1" in error.message
    gone = toolchain._load_error("/c/kernel.so", "f", OSError(
        "/c/kernel.so: cannot open shared object file: No such file or directory"))
    assert not isinstance(gone, toolchain.MissingLibraryError)   # the library itself: the cache


def test_a_bundled_library_is_what_compile_c_returns_for_its_source(tmp_path, monkeypatch):
    monkeypatch.setenv("WPK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(toolchain, "_BUNDLED", {})
    source = "int wpk_answer(void) { return 42; }\n"
    with toolchain.recording_libraries() as found:
        compiled = toolchain.compile_c(source)
    (key, path), = found.items()
    assert path == compiled.path and key == toolchain.bundle_key(
        source, [*toolchain.c_flags(), "-lm"])
    toolchain.use_bundled_libraries({key: compiled.path.read_bytes()})
    monkeypatch.setenv("CC", "/nonexistent/gcc")
    again = toolchain.compile_c(source)
    assert again.path.name.startswith("bundled_") and again.cached
    assert toolchain.load_function(again.path, "wpk_answer", [], ctypes.c_int)() == 42


def test_an_unwritable_cache_puts_the_libraries_in_a_private_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain, "_BUNDLED", {})
    source = "int wpk_seven(void) { return 7; }\n"
    monkeypatch.setenv("WPK_CACHE_DIR", str(tmp_path / "writable"))
    key = toolchain.bundle_key(source, [*toolchain.c_flags(), "-lm"])
    data = toolchain.compile_c(source).path.read_bytes()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")   # no cache can be made under it, even by root
    monkeypatch.setenv("WPK_CACHE_DIR", str(blocked / "cache"))
    toolchain.use_bundled_libraries({key: data})
    monkeypatch.setenv("CC", "/nonexistent/gcc")
    carried = toolchain.compile_c(source).path
    assert carried.name.startswith("bundled_") and not carried.is_relative_to(blocked)
    assert toolchain.load_function(carried, "wpk_seven", [], ctypes.c_int)() == 7


def test_a_plan_whose_recording_fails_keeps_no_libraries_and_says_why(bundled_plan,
                                                                      monkeypatch):
    from wpk import native_bundle

    plan = read_plan(bundled_plan[0])
    monkeypatch.setattr(native_bundle.sys, "executable", "/nonexistent/python")
    kept = bundle_native_libraries(plan)
    assert native_libraries(kept) == {}
    assert "nonexistent" in kept.report["native_libraries"]["error"]
