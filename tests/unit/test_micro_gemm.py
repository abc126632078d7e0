"""GEMM micro-kernels (`micro.gemm`): every ISA's code against the float64 reference.

Odd shapes on purpose: M = 1 (a 1-D A), K and N not multiples of any vector
width, batched and broadcast batch dims, a variable B (packed per call),
Gemm's transA/transB/alpha/beta with every broadcast of C, fused epilogues
(erf-GELU, residual add, constant operands by rows and by columns). Each case
runs the default config and random configs of its space (other tiles, so the
remainder rows, the buffered last panel and several k passes are hit), for
AVX-512 (where the host has it), AVX2 (forced on an AVX-512 host) and the
portable path; outputs are poisoned with NaN first.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.asm_checks import stack_accesses
from wpk.core.numerics import relative_l2
from wpk.core.workload import EpilogueStep, TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.microkernels.gemm import MICRO_GEMM, GemmKernels
from wpk.kernels.cpu.microkernels.gemm_space import (
    GemmSpace,
    busy_share,
    config_reason,
    default_config,
    gemm_geometry,
    panel_vectors,
)
from wpk.kernels.cpu.microkernels.gemm_templates import gemm_source
from wpk.kernels.cpu.microkernels.isa import ISAS, compile_flags, usable_isas
from wpk.kernels.cpu.microkernels.vector_math import has_vector_variants, vector_math
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference
from wpk.search.space import SearchSpace
from wpk.search.tuners import make_tuner

USABLE = [isa.name for isa in usable_isas()]
T = TensorSpec


def matmul(a, b, out, const_b=True, epilogue=(), extra=()) -> Workload:
    """A MatMul workload (B constant unless `const_b` is False; `extra` operand specs)."""
    return Workload("MatMul", (T(a), T(b), *(T(e) for e in extra)), (T(out),), (),
                    tuple(epilogue), "", (1,) if const_b else ())


def gemm(m, k, n, trans_a=0, trans_b=0, alpha=1.0, beta=1.0, c=None, epilogue=(),
         extra=()) -> Workload:
    """A Gemm workload with constant B (and C when given)."""
    a = (k, m) if trans_a else (m, k)
    b = (n, k) if trans_b else (k, n)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta}
    inputs = (T(a), T(b), None if c is None else T(c), *(T(e) for e in extra))
    return Workload("Gemm", inputs, (T((m, n)),), tuple(sorted(attrs.items())),
                    tuple(epilogue), "", (1, 2) if c is not None else (1,))


GELU = EpilogueStep("gelu")
CASES = {
    "vector_times_matrix": matmul((37,), (37, 23), (23,)),
    "one_row_wide": matmul((1, 70), (70, 133), (1, 133), epilogue=(EpilogueStep("relu"),)),
    "odd_k_and_n_gelu": matmul((13, 37), (37, 29), (13, 29), epilogue=(GELU,)),
    "matrix_times_vector": matmul((9, 40), (40,), (9,)),
    "batched_const_b": matmul((2, 3, 7, 19), (19, 21), (2, 3, 7, 21)),
    "broadcast_batch_variable_b": matmul((2, 1, 11, 9), (3, 9, 17), (2, 3, 11, 17),
                                         const_b=False),
    "attention_scores_variable_b": matmul((1, 2, 10, 8), (1, 2, 8, 10), (1, 2, 10, 10),
                                          const_b=False,
                                          epilogue=(EpilogueStep("mul", operand=2),),
                                          extra=[()]),
    "residual_and_column_bias": matmul((2, 17, 35), (35, 41), (2, 17, 41), epilogue=(
        EpilogueStep("add", operand=2), EpilogueStep("add", operand=3), GELU),
        extra=[(41,), (2, 17, 41)]),
    # torch's seq-first attention projection: A (L, 1, E), one product of L rows
    "seq_first_projection_bias": matmul((13, 1, 24), (24, 40), (13, 1, 40), epilogue=(
        EpilogueStep("add", operand=2),), extra=[(40,)]),
    # an operand repeated over A's batch: not affine in the folded rows, batch by batch
    "operand_repeated_per_batch": matmul((3, 4, 10), (10, 12), (3, 4, 12), epilogue=(
        EpilogueStep("add", operand=2),), extra=[(4, 12)]),
    "row_scale": matmul((15, 20), (20, 18), (15, 18),
                        epilogue=(EpilogueStep("mul", operand=2),), extra=[(15, 1)]),
    "gemm_transposes_alpha_beta": gemm(19, 33, 27, 1, 1, alpha=0.5, beta=2.0, c=(27,)),
    "gemm_trans_b_row_c": gemm(9, 20, 30, 0, 1, beta=-1.5, c=(9, 1)),
    "gemm_trans_a_full_c_tanh": gemm(6, 50, 17, 1, 0, c=(6, 17),
                                     epilogue=(EpilogueStep("tanh"),)),
    "gemm_scalar_c_no_c": gemm(1, 64, 10, c=()),
    "gemm_classifier_clip": gemm(1, 90, 1000, 0, 1, c=(1000,), epilogue=(
        EpilogueStep("clip", (("min", 0.0), ("max", 6.0))),)),
}


def _random_configs(workload: Workload, isa: str, count: int, seed: int) -> list[dict]:
    space = GemmSpace(gemm_geometry(workload), (isa,))
    knobs = space.space()
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(400):
        config = {k: v[rng.integers(len(v))] for k, v in knobs.items()}
        config = {k: (v.item() if hasattr(v, "item") else v) for k, v in config.items()}
        if space.validate(config) is None and config not in found:
            found.append(config)
        if len(found) == count:
            break
    return found


def _check(workload: Workload, config: dict, rng) -> float:
    inputs = random_inputs(workload, rng)
    consts = {i: inputs[i] for i in workload.const_inputs}
    kernel = MICRO_GEMM.prepare(workload, consts, config)
    expected = reference(workload, inputs)[0]
    for _ in range(2):   # a second call: the packed B and the buffers are reused
        out = np.full(workload.outputs[0].shape, np.nan, np.float32)   # poisoned
        kernel(inputs, [out])
        assert np.isfinite(out).all(), f"{config}: elements left unwritten"
    return relative_l2(out, expected)


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_float64_reference(case, isa, rng):
    if isa not in USABLE:
        pytest.skip(f"this host cannot run {isa} code")
    workload = CASES[case]
    assert MICRO_GEMM.unsupported_reason(workload) is None
    geometry = gemm_geometry(workload)
    configs = [default_config(geometry, isa)] + _random_configs(workload, isa, 2, len(case))
    for config in configs:
        err = _check(workload, config, rng)
        assert err < 1e-5, f"{case} {config}: relative L2 {err:.2e}"


@pytest.mark.parametrize("case, m, batch", [
    ("seq_first_projection_bias", 13, 1),     # 13 products of one row: one of 13 rows
    ("batched_const_b", 42, 1),               # (2, 3, 7) rows of one constant B
    ("residual_and_column_bias", 34, 1),      # a full residual folds with the rows
    ("operand_repeated_per_batch", 4, 3),     # (4, 12) again for each of 3 batches
    ("broadcast_batch_variable_b", 11, 6),    # B has batches: nothing to fold
])
def test_a_batch_b_does_not_have_folds_into_the_rows(case, m, batch):
    """A's batch dims become rows of one product where B has no batch dims and every
    epilogue operand stays affine in the folded rows; otherwise products batch by batch."""
    geometry = gemm_geometry(CASES[case])
    assert (geometry.m, geometry.batch) == (m, batch)


def test_every_remainder_and_pass(rng):
    """M = 23 rows with every tile height, K = 100 in passes of 32 (a short last pass),
    N = 45 (a buffered last panel on every ISA), blocks of 1 and 2 tiles and panels."""
    workload = matmul((23, 100), (100, 45), (23, 45), epilogue=(GELU,))
    isa = USABLE[0]
    for mr in (1, 2, 3, 4, 5, 7):
        for mb, nb in ((1, 1), (2, 2)):
            config = {"isa": isa, "mr": mr, "nv": 1, "kc": 32, "mb": mb, "nb": nb,
                      "unroll": 2}
            assert _check(workload, config, rng) < 1e-5, config


def test_output_aliasing_a_residual_operand(rng):
    """The runtime may hand the residual's buffer as the output: the kernel still adds
    the residual's values, not the partial sums it parks there."""
    workload = matmul((8, 300), (300, 20), (8, 20), epilogue=(EpilogueStep("add", operand=2),),
                      extra=[(8, 20)])
    inputs = random_inputs(workload, rng)
    config = dict(default_config(gemm_geometry(workload)), kc=32)
    kernel = MICRO_GEMM.prepare(workload, {1: inputs[1]}, config)
    expected = reference(workload, inputs)[0]
    out = inputs[2]
    kernel(inputs, [out])
    assert relative_l2(out, expected) < 1e-5


def test_avx2_source_uses_eight_lanes():
    g = gemm_geometry(CASES["odd_k_and_n_gelu"])
    config = {"isa": "avx2", "mr": 6, "nv": 2, "kc": 64, "mb": 2, "nb": 1, "unroll": 4}
    source, _ = gemm_source(g, config)
    assert "vector_size(8 * 4)" in source and "#define NR 16" in source
    assert "erff(" in source   # the GELU epilogue, from the epilogue table


def test_config_space_rejects_what_does_not_fit():
    g = gemm_geometry(CASES["odd_k_and_n_gelu"])   # M 13, N 29
    fits = {"isa": "portable", "mr": 4, "nv": 2, "kc": 64, "mb": 1, "nb": 1, "unroll": 1}
    assert config_reason(g, fits) is None
    assert "registers" in config_reason(g, dict(fits, mr=7))    # 7 x 2 + 2 + 1 > 16
    assert "vectors" in config_reason(g, dict(fits, nv=9))     # 29 columns: 8 vectors of 4
    assert "rows" in config_reason(g, dict(fits, mr=14, nv=1))
    assert "knobs" in config_reason(g, {"isa": "portable", "mr": 1})
    assert "unknown" in config_reason(g, dict(fits, isa="sse9"))
    for workload in CASES.values():
        geometry = gemm_geometry(workload)
        for isa in USABLE:
            config = default_config(geometry, isa)
            assert config_reason(geometry, config) is None
            assert GemmSpace(geometry, (isa,)).space()["kc"].count(config["kc"]) == 1


@pytest.mark.parametrize("case", ["odd_k_and_n_gelu", "broadcast_batch_variable_b",
                                  "gemm_transposes_alpha_beta", "gemm_classifier_clip"])
def test_prefetch_knob_builds_correct_kernels(case, rng):
    """pf rows of B ahead (each cache line of the panel's row) compute what pf 0 does, on
    short passes too (the prefetch runs past the slice: a hint, never a fault)."""
    workload, isa = CASES[case], USABLE[0]
    geometry = gemm_geometry(workload)
    for pf in (4, 16):
        config = dict(default_config(geometry, isa), kc=32, pf=pf)
        assert _check(workload, config, rng) < 1e-5, config
        source, _ = gemm_source(geometry, config)
        nr = config["nv"] * ISAS[isa].lanes
        prefetches = source.count("__builtin_prefetch(p + (long)(k + PF) * NR")
        assert f"#define PF {pf}\n" in source and prefetches == -(-nr // 16) * (
            1 + bool(geometry.m % config["mr"]))   # one a line, in each tile function


def test_configs_without_the_prefetch_knob_build_the_kernel_they_built_before():
    g = gemm_geometry(CASES["odd_k_and_n_gelu"])
    config = default_config(g)
    assert "pf" not in config and config_reason(g, config) is None
    assert gemm_source(g, config) == gemm_source(g, dict(config, pf=0))
    assert "__builtin_prefetch" not in gemm_source(g, config)[0]
    assert GemmSpace(g).space()["pf"] == (0, 4, 8, 16)
    assert "pf" in config_reason(g, dict(config, pf=5))


def test_unsupported_workloads_say_why():
    double = Workload("MatMul", (T((4, 4), "float64"), T((4, 4), "float64")),
                      (T((4, 4), "float64"),), const_inputs=(1,))
    assert "float32" in MICRO_GEMM.unsupported_reason(double)
    # an operand broadcast along a batch dim but not the other: not rows x columns
    odd = matmul((2, 3, 4, 5), (5, 6), (2, 3, 4, 6), epilogue=(EpilogueStep("add", operand=2),),
                 extra=[(2, 1, 1, 6)])
    assert "broadcast" in MICRO_GEMM.unsupported_reason(odd)
    conv = Workload("Conv", (T((1, 3, 8, 8)), T((4, 3, 3, 3))), (T((1, 4, 6, 6)),))
    assert "MatMul" in MICRO_GEMM.unsupported_reason(conv)


def test_untuned_build_offers_the_default_next_to_the_libraries():
    workload = CASES["residual_and_column_bias"]
    found = {c.implementation.name: c.config for c in registry.candidates(workload, "cpu")}
    assert "numpy.matmul" in found and "ort" in found
    assert found["micro.gemm"] == default_config(gemm_geometry(workload))


def test_tuner_searches_the_space_and_every_proposal_is_correct(rng):
    """The GA proposes configs from the GEMM space; the valid ones build kernels that match
    the reference, and their compile jobs name this module's compile function."""
    workload = CASES["gemm_transposes_alpha_beta"]
    family = GemmKernels()
    assert family.supports(workload)
    space = SearchSpace.from_template(family.template(workload))
    tuner = make_tuner("ga", space, 0)
    batch = tuner.next_batch(4)
    assert batch and all(space.is_valid(space.indices(c)) for c in batch)
    for config in batch[:2]:
        assert _check(workload, family.config(config), rng) < 1e-5
    jobs = family.compile_jobs(workload, batch[:1])
    assert jobs[0].function.endswith("gemm:compile_gemm")


def test_math_epilogues_vectorize_through_libmvec_where_the_host_has_it():
    """A GELU epilogue calls erff: declared a SIMD function and linked with libmvec when
    this host's libmvec has every variant, never on the portable ISA; the kernels above
    check its results either way."""
    g = gemm_geometry(CASES["odd_k_and_n_gelu"])
    portable = {"isa": "portable", "mr": 4, "nv": 2, "kc": 64, "mb": 1, "nb": 1, "unroll": 1}
    source, libraries = gemm_source(g, portable)
    assert "simd(" not in source and libraries == ("-lm",)
    wide = dict(portable, isa=USABLE[0])
    source, libraries = gemm_source(g, wide)
    if USABLE[0] != "portable" and has_vector_variants("erff"):
        assert 'float erff(float) __attribute__((simd("notinbranch")))' in source
        assert "-lmvec" in libraries
    else:
        assert "-lmvec" not in libraries
    assert vector_math("v = v + 1.0f;", ISAS[USABLE[0]]) == ("", ("-lm",))


def test_small_bert_layer_builds_with_micro_gemm_measured_and_verified(tmp_path):
    """The suite's BERT layer at test size: every MatMul/Gemm workload has a verified
    micro.gemm candidate, and the plan matches onnxruntime."""
    import onnxruntime

    import wpk
    from tests import models

    model = models.bert_base_layer(seq_len=16, d_model=48, heads=4, ffn=96)
    assert model.graph.name == "bert_base_layer"
    feeds = models.random_inputs(model, seed=3)
    plan = wpk.build(model, target="cpu", search="none", warmup=0, repeats=1, min_time=0.0,
                     progress=False, partition=False)
    gemms = [w for w in plan.report["workloads"] if w["op"] in ("MatMul", "Gemm")]
    assert len(gemms) >= 3
    for entry in gemms:
        statuses = {c["impl"]: c["status"] for c in entry["candidates"]}
        assert statuses.get("micro.gemm") == "ok", entry["label"]
    path = tmp_path / "bert.wpk"
    plan.save(path)
    actual = next(iter(wpk.load(path).run(feeds).values()))
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    assert relative_l2(actual, session.run(None, feeds)[0]) < 1e-4


def test_benchmark_covers_the_bert_products_and_renders_its_table():
    """scripts/bench_micro_gemm.py: BERT-base's three weight products and its two attention
    products; the README table comes from a results JSON."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import bench_micro_gemm as bench
    finally:
        sys.path.pop(0)
    shapes = {(p.m, p.k, p.n, p.const_b) for p in bench.products("bert_base_layer")}
    assert {(128, 768, 768, True), (128, 768, 3072, True), (128, 3072, 768, True)} <= shapes
    assert {(128, 64, 128, False), (128, 128, 64, False)} <= shapes
    row = {"model": "m", "role": "r", "label": "2x3 @ 3x4", "threads": 1,
           "gflops": {"micro": 10.0, "ort": 5.0, "ort_no_spin": 8.0, "numpy": 4.0},
           "percent_of_peak": {"micro": 50.0}, "ratio_to_ort": 1.25}
    summary = {"1": {"median_ratio_to_ort": 1.25, "median_default_ratio_to_ort": 1.0,
                     "min_ratio_to_ort": 1.25, "median_ratio_to_numpy": 2.5}}
    table = bench.markdown_table({"threads": [1], "rows": [row], "summary": summary})
    assert "| m | r 2x3 @ 3x4 | 10 | 8 | 4 | 50% | 1.25 |" in table


def test_kc_sweep_verifies_and_times_the_default_tile_at_every_kc(rng):
    """scripts/bench_micro_gemm.py --kc-sweep (the evidence for the default's kc bound):
    one GFLOP/s figure per kc choice, each kernel verified first; and the default takes the
    largest kc whose panel slice fits PANEL_BYTES."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from wpk.kernels.cpu.microkernels.gemm_space import KC_CHOICES, PANEL_BYTES

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import bench_micro_gemm as bench
    finally:
        sys.path.pop(0)
    product = bench.Product("m", "r", (), 13, 70, 40, True)
    row = bench.kc_sweep(product, SimpleNamespace(isa=None, rounds=1, repeat=1), rng)
    assert sorted(row["gflops_per_kc"]) == sorted(KC_CHOICES)
    assert all(g > 0 for g in row["gflops_per_kc"].values())
    for workload in CASES.values():
        config = default_config(gemm_geometry(workload))
        nr = config["nv"] * ISAS[config["isa"]].lanes
        fits = [kc for kc in KC_CHOICES if kc * nr * 4 <= PANEL_BYTES]
        assert config["kc"] == max(fits)


def testbusy_share_follows_the_dynamic_schedule():
    """Units handed in order to whichever core is free: 9 equal units leave one of 2 cores
    idle a tenth of the time; 33 row tiles in blocks of 16 (two big blocks and one of a
    single tile per panel) keep both busy."""
    assert busy_share(1, 33, 64, 9, 1, cores=2) == pytest.approx(297 / 330)
    assert busy_share(1, 33, 16, 9, 1, cores=2) > 0.99
    assert busy_share(1, 33, 64, 9, 1, cores=1) == 1.0


def test_default_splits_rows_further_where_that_evens_out_the_cores(monkeypatch):
    """ViT's fused QKV projection (197 tokens, 192 -> 576) on 2 cores: one block of all 33
    row tiles made 9 units; the default takes blocks of 16. BERT's 12 even units stay."""
    import wpk.kernels.cpu.microkernels.gemm_space as space

    monkeypatch.setattr(space.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(space, "TARGET_UNITS", 8)
    qkv = default_config(gemm_geometry(matmul((197, 192), (192, 576), (197, 576))), "avx512")
    assert (qkv["mr"], qkv["nv"], qkv["mb"], qkv["nb"]) == (6, 4, 16, 1)
    bert = default_config(gemm_geometry(matmul((128, 768), (768, 768), (128, 768))), "avx512")
    assert (bert["mb"], bert["nb"]) == (32, 1)


def test_default_tile_leaves_no_panel_mostly_empty():
    """A row of 6 vectors (ConvNeXt's 96 outputs on AVX-512) in panels of 4 computes a
    third of the last panel for nothing: the default takes 3 vectors; widths that divide
    the row, or waste at most a tenth, keep the preferred 4 (2 with 16 registers)."""
    assert panel_vectors(6, 32) == 3
    assert panel_vectors(48, 32) == 4 and panel_vectors(41, 32) == 4   # 44/41: 7% waste
    assert panel_vectors(5, 32) == 3 and panel_vectors(2, 32) == 2 and panel_vectors(1, 32) == 1
    assert panel_vectors(12, 16) == 2 and panel_vectors(3, 16) == 1
    workload = Workload("MatMul", (TensorSpec((3136, 384)), TensorSpec((384, 96))),
                        (TensorSpec((3136, 96)),), (), (), "", (1,))
    config = default_config(gemm_geometry(workload), "avx512")
    assert (config["nv"], config["mr"]) == (3, 8)


@pytest.mark.skipif(not {"avx2", "avx512"} & set(USABLE),
                    reason="x86 FMA ISAs only (the AVX2 code is compiled, not run)")
def test_sixteen_register_tile_of_a_constant_b_is_four_rows_by_three_vectors(tmp_path):
    """With 16 registers a constant B (weights, packed once) takes a 4 x 3 tile (12
    accumulators, 3 + 4 loads per 12 FMAs) where 3 vectors leave no panel mostly empty, a
    variable B (attention's products) 6 x 2; the 4 x 3 tile fills all 16 registers and gcc
    spills none of them (BERT's FFN products)."""
    assert panel_vectors(96, 16, const_b=True) == 3 and panel_vectors(96, 16) == 2
    assert panel_vectors(8, 16, const_b=True) == 2    # 3 would leave a ninth empty
    for shapes in (((128, 768), (768, 3072), (128, 3072)), ((128, 3072), (3072, 768), (128, 768))):
        g = gemm_geometry(matmul(*shapes))
        config = default_config(g, "avx2")
        assert (config["mr"], config["nv"]) == (4, 3)
        found = stack_accesses(gemm_source(g, config)[0], compile_flags(ISAS["avx2"]), tmp_path,
                               ("wpk_gemm",))
        assert found and not any(found.values()), (shapes, found)
    scores = default_config(gemm_geometry(matmul((1, 12, 128, 64), (1, 12, 64, 128),
                                                 (1, 12, 128, 128), const_b=False)), "avx2")
    assert (scores["mr"], scores["nv"]) == (6, 2)
