"""A searched CPU build tunes every generated family: `dsl.cpu`, `micro.nchwc` and (3x3
stride-1 convs) `micro.winograd`.

The build of a two-conv model (both convs run blocked, as `wpk.nchwc` Convs)
measures real compiled kernels in the isolated worker; the records file it
writes holds both families, each record under its own implementation, and a
rebuild from it measures nothing new.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import wpk
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.microkernels.kernel import MICRO_NCHWC, MicroKernels
from wpk.kernels.cpu.microkernels.space import config_reason, conv_geometry, default_config
from wpk.kernels.generated import DSL_CPU
from wpk.kernels.target import create_target
from wpk.search import recorded
from wpk.search.budget import split_trials
from wpk.search.driver import (
    Search,
    TuneOptions,
    TuningDisplay,
    _tune_job,
    family_candidates,
    search_order,
)
from wpk.search.records import SEARCH, RecordStore, config_key, read_records

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

CPU = create_target("cpu")
MICRO = MicroKernels()


def two_convs() -> onnx.ModelProto:
    """Conv 3x3 + Relu then Conv 1x1 on 16 channels: a chain the NCHWc pass blocks."""
    rng = np.random.default_rng(0)

    def const(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"])]
    graph = helper.make_graph(
        nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                           [1, 16, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 10, 10])],
        [const("w1", (16, 16, 3, 3)), const("b1", (16,)), const("w2", (16, 16, 1, 1)),
         const("b2", (16,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


SEARCHED = {"search": "random", "trials": 6, "warmup": 1, "repeats": 3, "min_time": 0.0,
            "progress": False, "partition": False, "seed": 1}


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """(plan, records path, model path) of a searched build of `two_convs`."""
    folder = tmp_path_factory.mktemp("families")
    model, db = folder / "convs.onnx", folder / "records.jsonl"
    onnx.save(two_convs(), str(model))
    with pytest.MonkeyPatch.context() as patch:   # as records_never_contended (conftest)
        patch.setattr(recorded, "CONTENDED", float("inf"))
        plan = wpk.build(str(model), target="cpu", db=str(db), **SEARCHED)
    return plan, db, model


def test_cpu_target_offers_every_family():
    assert [f.impl for f in CPU.families] == ["dsl.cpu", "micro.nchwc", "micro.winograd",
                                              "micro.inverted_residual", "micro.gemm"]
    assert CPU.family("micro.nchwc").impl == "micro.nchwc" and CPU.family("x") is None


def test_searched_build_measures_micro_configs_beyond_the_default(searched):
    plan, db, _ = searched
    tuned = plan.report["search"]["tuned"]
    convs = {t["key"] for t in tuned if t["impl"] == "micro.nchwc"}
    assert len(convs) == 2, tuned                          # both blocked convs
    assert convs <= {t["key"] for t in tuned if t["impl"] == "dsl.cpu"}   # both families
    trials: dict = {}
    for t in tuned:     # --trials is each workload's total, split between its families
        trials[t["key"]] = trials.get(t["key"], 0) + t["trials"]
    assert set(trials.values()) == {6}, tuned
    for key in convs:   # the 3x3 conv has three families (Winograd too), the 1x1 conv two
        families = [t for t in tuned if t["key"] == key]
        assert len(families) in (2, 3), families
        assert all(t["trials"] == 6 // len(families) for t in families), families
    records = list(read_records(db))
    for key in convs:
        micro = [r for r in records if r.workload_key == key and r.impl == "micro.nchwc"
                 and r.phase == SEARCH and r.ok]
        workload = micro[0].to_workload()
        default = config_key(default_config(conv_geometry(workload, nchw_input=True)))
        searched_configs = {config_key(r.config) for r in micro} - {default}
        assert searched_configs, f"only the default config of {workload.label} was measured"
        g = conv_geometry(workload, nchw_input=True)
        assert all(config_reason(g, r.config) is None for r in micro)
    # The planner's second pass saw the tuned micro-kernel next to the other candidates.
    by_key = {w["key"]: w for w in plan.report["workloads"]}
    for key in convs:
        impls = {c["impl"] for c in by_key[key]["candidates"]}
        assert {"micro.nchwc", "dsl.cpu"} <= impls, impls


def test_records_of_both_families_reload_each_to_its_own_implementation(searched):
    _, db, model = searched
    store = RecordStore(db)
    fingerprint = CPU.fingerprint()
    families = {r.impl for r in store}
    assert {"micro.nchwc", "dsl.cpu"} <= families
    for record in store:
        if record.impl not in ("micro.nchwc", "dsl.cpu"):
            continue
        workload = record.to_workload()
        assert registry.get(record.impl).unsupported_reason(workload) is None
        other = "dsl.cpu" if record.impl == "micro.nchwc" else "micro.nchwc"
        assert store.lookup(record.workload_key, fingerprint, other, record.config) is None
        assert store.lookup(record.workload_key, fingerprint, record.impl, record.config,
                            record.phase) is not None
        if record.impl == "micro.nchwc":   # a micro config is never a DSL schedule
            assert config_reason(conv_geometry(workload, nchw_input=True), record.config) is None
    # A rebuild from the records reuses every measurement of both families.
    again = wpk.build(str(model), target="cpu", db=str(db), **SEARCHED)
    assert again.report["search"]["measured"] == 0
    assert again.report["search"]["reused"] > 0
    assert {t["impl"] for t in again.report["search"]["tuned"]} == {
        "dsl.cpu", "micro.nchwc", "micro.winograd"}   # Winograd tunes the 3x3 conv


def test_family_candidates_give_each_family_its_own_implementation(searched):
    plan, db, _ = searched
    tuned = plan.report["search"]["tuned"]

    class Found:   # what family_candidates reads of a TuneResult
        def __init__(self, config):
            self.best_config = config

    results: dict = {"dsl.cpu": {}, "micro.nchwc": {}, "micro.winograd": {}}
    for t in tuned:
        results[t["impl"]][t["key"]] = Found(t["best_config"])
    provide = family_candidates(results, CPU.families)
    key = next(k for k in results["micro.nchwc"])
    workload = next(r.to_workload() for r in read_records(db) if r.workload_key == key)
    found = {c.implementation.name: c for c in provide(workload)}
    assert found["micro.nchwc"].implementation is MICRO_NCHWC
    assert found["dsl.cpu"].implementation is DSL_CPU
    assert found["micro.nchwc"].config == results["micro.nchwc"][key].best_config


def t(*shape: int) -> TensorSpec:
    return TensorSpec(tuple(shape))


class Item:
    def __init__(self, workload: Workload):
        self.workload = workload


def test_a_workload_both_families_tune_splits_its_share():
    block = 16
    conv = Workload("Conv", (t(1, 1, 6, 6, block), t(block, block, 3, 3), t(block)),
                    (t(1, 1, 6, 6, block),),
                    tuple(sorted({"kernel_shape": (3, 3), "strides": (1, 1),
                                  "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1,
                                  "block": block, "channels": block}.items())),
                    (), "wpk.nchwc", (1, 2))
    softmax = Workload("Softmax", (t(4, 32),), (t(4, 32),), (("axis", -1),))
    if not MICRO.supports(conv):
        pytest.skip(f"micro.nchwc: {MICRO_NCHWC.unsupported_reason(conv)}")
    assert not MICRO.supports(softmax) and CPU.generated.supports(softmax)
    jobs = search_order([Item(softmax), Item(conv)], CPU.families,
                        {softmax.key: 1.0, conv.key: 3.0})
    assert [(j.family.impl, j.workload.key) for j in jobs] == [
        ("dsl.cpu", conv.key), ("micro.nchwc", conv.key), ("micro.winograd", conv.key),
        ("dsl.cpu", softmax.key)]   # a 3x3 stride-1 conv: Winograd tunes it too
    assert [j.share for j in jobs] == [0.25, 0.25, 0.25, 0.25]
    assert math.isclose(sum(j.share for j in jobs), 1.0)
    assert [j.trials(5) for j in jobs] == [2, 2, 1, 5]    # the workload's trials, split too
    assert [j.trials(1) for j in jobs] == [1, 0, 0, 1]


def test_split_trials():
    assert split_trials(16, 2) == [8, 8] and split_trials(5, 2) == [3, 2]
    assert split_trials(7, 1) == [7] and split_trials(1, 3) == [1, 0, 0]
    assert split_trials(4, 0) == []


def test_a_family_whose_share_of_the_trials_is_zero_is_not_searched():
    """`--trials 1` on a workload two families tune: the second gets none and says so."""
    class OneSlot:          # what _tune_job reads of a runner before it searches
        slots = 1

    softmax = Workload("Softmax", (t(4, 32),), (t(4, 32),), (("axis", -1),))
    job = Search(CPU.generated, softmax, 1e-5, 0.5, part=1, parts=2)
    with TuningDisplay(False) as display:
        result = _tune_job(job, TuneOptions("random", trials=1), OneSlot(), None, None, display)
    assert (result.trials, result.stopped, result.impl) == (0, "trials", "dsl.cpu")
    assert result.stopped_text == "reached its trial limit (0)"
