"""`wpk dsl`: emitting IR/C/CUDA for DSL files and checking them against the reference."""

from __future__ import annotations

import json

import pytest

from wpk.cli import main
from wpk.commands.dsl import dsl_command
from wpk.core.errors import OptionError
from wpk.core.numerics import relative_l2 as relative_error
from wpk.dsl import toolchain_cuda
from wpk.kernels.dsl_library import operator_file

CONV = json.dumps({"op": "conv2d", "bindings": {
    "N": 1, "C": 4, "H": 7, "W": 6, "K": 4, "CG": 2, "R": 3, "S": 3, "groups": 2,
    "pad_t": 1, "pad_b": 1, "pad_l": 1, "pad_r": 1, "stride_h": 2}})


def test_emit_ir_shows_the_compute_ir_and_its_specialisation():
    text = dsl_command(str(operator_file("softmax")), emit="ir")
    assert "op softmax(X: f32[N, D]) -> (Y: f32[N, D])" in text
    assert "local Mx[n in N]: f32 = max(d in D) { X[n, d] }" in text
    assert "op softmax(X: f32[8, 8])" in text  # specialised with the default dims


@pytest.mark.isa  # ISA-dependent: scripts/isa_check.sh reruns it for AVX2
def test_emit_c_and_check_on_the_cpu():
    config = json.dumps({"op": "gemm_nt", "bindings": {"M": 5, "K": 7, "N": 3, "alpha": 0.5}})
    source = dsl_command(str(operator_file("gemm_nt")), emit="c", config_json=config)
    assert "gemm_nt" in source and "for (" in source
    report = dsl_command(str(operator_file("gemm_nt")), check=True, config_json=config)
    assert "M=5, K=7, N=3" in report and "alpha=0.5" in report
    assert "check gemm_nt.Y [C (gcc)]: relative L2 error" in report and report.endswith("ok")


def test_check_cuda_emulates_and_compiles_for_the_preset():
    report = dsl_command(str(operator_file("conv2d")), target="cuda", gpu="h100",
                         config_json=CONV, check=True)
    assert "check conv2d.Y [CUDA emulated for h100]" in report and report.endswith("ok")
    if toolchain_cuda.find_nvcc() is not None:
        assert "compile conv2d for sm_90: ok (" in report and "registers" in report
    source = dsl_command(str(operator_file("conv2d")), target="cuda", config_json=CONV,
                         emit="cuda")
    assert "__global__" in source


@pytest.mark.parametrize("config,fragment", [
    ("{not json", "--config is not valid JSON"),
    ("[1, 2]", "--config must be a JSON object"),
    ('{"op": "conv3d"}', "defines no operator 'conv3d'"),
    ('{"op": "matmul", "bindings": {"Q": 3}}', "bindings name Q"),
    ('{"op": "matmul", "bindings": {"M": "big"}}', "'bindings' must map names to numbers"),
    ('{"tile": 4}', "schedule knobs in --config need one operator"),
])
def test_bad_configs_are_option_errors(config, fragment):
    with pytest.raises(OptionError, match=fragment) as info:
        dsl_command(str(operator_file("matmul")), config_json=config)
    assert info.value.hint


def test_missing_scalars_are_named():
    with pytest.raises(OptionError, match="maxpool2d needs values for KH, KW"):
        dsl_command(str(operator_file("maxpool2d")), config_json='{"op": "maxpool2d"}')


def test_relative_error_flags_nan_and_shape_mismatch():
    import numpy as np

    assert relative_error(np.array([1.0, np.nan]), np.array([1.0, 2.0])) == float("inf")
    assert relative_error(np.zeros(3), np.zeros(2)) == float("inf")
    assert relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 0


def test_cli_reports_dsl_errors_with_location(tmp_path, capsys):
    bad = tmp_path / "bad.wpk"
    bad.write_text("op f(X: f32[N]) -> Y: f32[N] {\n  Y[i] = X[i, i]\n}\n")
    assert main(["dsl", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"error: {bad}:2:10: rank mismatch" in err and "hint:" in err
    good = tmp_path / "good.wpk"
    good.write_text("op twice(X: f32[N]) -> Y: f32[N] { Y[i] = 2 * X[i] }\n")
    assert main(["dsl", str(good), "--check", "--config", '{"bindings": {"N": 100}}']) == 0
    assert "check twice.Y [C (gcc)]" in capsys.readouterr().out
