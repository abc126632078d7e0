"""Benchmark (not a test): NCHWc micro-kernels (`micro.nchwc`) vs onnxruntime's MLAS NCHWc convs.

Every distinct convolution of ResNet-50 (batch 1, 224x224, from the ONNX
wheel's light_resnet50.onnx: its 1x1 and 3x3 convs and the 7x7 stride-2 stem),
MobileNet-v2's 3x3 stride-2 stem and its 3x3 depthwise convolutions, the grouped 3x3
convs of ResNeXt-50 (32x4d) and RegNet-Y-400MF whose groups (4 and 8 channels) are
narrower than a block and the grouped 1x1 convs of ShuffleNet (v1) whose groups (6 to
136 channels) are not whole blocks (`--only grouped`; no goal of an issue: reported), as
`wpk.nchwc` Conv workloads with bias and ReLU fused (blocked input and output; a
stem reads its 3-channel NCHW input, as the NCHWc layout pass leaves it).
For each: the micro-kernel's default config (what an untuned build offers)
and the best of a small grid of register tiles (`--grid`, 0 to skip) are
verified against the float64 reference, then both timed against onnxruntime's
`com.microsoft.nchwc` Conv on the same blocked buffers (same thread count;
with and without its spinning thread pool, the better of the two is the
reference; for ShuffleNet's, which onnxruntime's own graph runs as NCHW grouped convs,
also that conv on NCHW buffers, its reorders not timed), alternating per round (a 0.2 s
pause before each contender, the first one rotating from round to round); medians per
round, the median over rounds (wpk's: the faster of the default and the grid's pick) reported as
GFLOP/s, % of the measured peak and the ratio to onnxruntime (> 1: wpk is faster).
`--clock cpu` (1 thread) times with the process's CPU time instead of wall time,
which leaves out the time other jobs on a loaded machine held the core; `--stat
min` reports each contender's fastest round instead of the median round.
Goals (issues 10 and 11): median >= 0.95x on the 1x1 stride-1 convs, >= 0.9x
on the 3x3 stride-1 convs, >= 80% of peak on the largest 1x1, depthwise median
>= 1.0x; >= 0.8x on each stride-2 conv and each stem (the grid tries the phase
split on and off, and units of one row or several).

    python scripts/bench_microkernels.py [--threads 2] [--rounds 7] [--grid 12]
        [--only 1x1|3x3|depthwise|grouped|stride2|stem|strided] [--limit N] [--clock wall|cpu]
        [--stat median|min] [--output FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # idle BLAS threads sleep (bench_dsl_cpu)
import numpy as np  # noqa: E402
from bench_dsl_cpu import (  # noqa: E402
    ConvShape,
    depthwise_convs,
    ort_session,
    resnet50_convs,
    timeit,
)
from cpu_peak import measure_peak  # noqa: E402

GOALS = {"1x1": 0.95, "3x3 s1": 0.9, "depthwise": 1.0, "1x1 s2": 0.8, "3x3 s2": 0.8,
         "stem": 0.8}
# Groups whose goal holds for each conv (the minimum), not for the median
EACH = ("1x1 s2", "3x3 s2", "stem")
GROUPS = ("1x1", "3x3 s1", "depthwise", "grouped", "1x1 s2", "3x3 s2", "stem")
# A stem's NCHW input has fewer channels than this (the smallest block)
STEM_CHANNELS = 8


def group_of(shape: ConvShape) -> str:
    """The goal group of a conv: stem, 1x1, 1x1 s2, 3x3 s1, 3x3 s2, depthwise, grouped or
    other."""
    if shape.groups > 1:
        return "depthwise" if shape.groups == shape.c else "grouped"
    if shape.c < STEM_CHANNELS:
        return "stem"
    if shape.r == shape.s == 1:
        return "1x1" if shape.stride == 1 else f"1x1 s{shape.stride}"
    if shape.r == shape.s == 3:
        return f"3x3 s{shape.stride}"
    return "other"


def stem_convs() -> list[ConvShape]:
    """MobileNet-v2's first conv (3x3 stride 2, 3 -> 32 channels); ResNet-50's 7x7 stem is
    one of `resnet50_convs`."""
    return [ConvShape(3, 224, 224, 32, 3, 3, 2, 1, 1, "mobilenet_v2")]


def grouped_convs() -> list[ConvShape]:
    """The grouped 3x3 convs of ResNeXt-50 32x4d's first two stages (4 and 8 channels a
    group) and of RegNet-Y-400MF (8 channels a group; each stage's first one strided),
    224x224 input: narrower groups than an AVX-512 block."""
    resnext = [(128, 56, 1, 32), (256, 56, 2, 32), (256, 28, 1, 32)]
    regnet = [(48, 112, 2, 6), (48, 56, 1, 6), (104, 56, 2, 13), (104, 28, 1, 13),
              (208, 28, 2, 26), (208, 14, 1, 26), (440, 14, 2, 55), (440, 7, 1, 55)]
    return [ConvShape(c, h, h, c, 3, 3, s, 1, g, "resnext50") for c, h, s, g in resnext] + \
        [ConvShape(c, h, h, c, 3, 3, s, 1, g, "regnet_y_400mf") for c, h, s, g in regnet]


def shufflenet_convs() -> list[ConvShape]:
    """The grouped 1x1 convs of the ONNX wheel's ShuffleNet (v1, 4 groups of 6 to 136
    channels; 224x224 input): groups that are not whole blocks, nor a block's divisor."""
    rows = [(24, 56, 112), (112, 28, 112), (136, 28, 136), (136, 14, 136), (272, 14, 272),
            (272, 7, 272), (544, 7, 544)]
    return [ConvShape(c, h, h, k, 1, 1, 1, 0, 4, "shufflenet_v1") for c, h, k in rows]


def sparse_groups(shape: ConvShape, block: int) -> bool:
    """Whether the layout pass makes `shape` one dense conv of sparse groups."""
    from wpk.passes.nchwc_rules import block_groups, sparse_groups_fit

    return group_of(shape) == "grouped" and not block_groups(shape.c, shape.k, shape.groups,
                                                             block) \
        and sparse_groups_fit(shape.c, shape.k, shape.groups, block)


def nchwc_workload(shape: ConvShape, block: int):
    """The blocked Conv workload of `shape` (bias and ReLU fused); a grouped conv of groups
    narrower than the block as the layout pass leaves it: one group per block, the filter
    zero between its narrow groups, whose width `group_width` gives; one of groups that are
    not whole blocks as one dense group, zero outside them, their count `sparse_groups`."""
    from wpk.core.workload import EpilogueStep, TensorSpec, Workload
    from wpk.kernels.nchwc_format import GROUP_WIDTH, SPARSE_GROUPS

    oh, ow = shape.out_hw
    x = TensorSpec((1, -(-shape.c // block), shape.h, shape.w, block))
    if group_of(shape) == "stem":
        x = TensorSpec((1, shape.c, shape.h, shape.w))
    y = TensorSpec((1, -(-shape.k // block), oh, ow, block))
    k, per_group, groups, extra = shape.k, shape.c // shape.groups, shape.groups, {}
    if sparse_groups(shape, block):
        per_group, groups, extra = shape.c, 1, {SPARSE_GROUPS: shape.groups}
    elif group_of(shape) == "grouped" and per_group < block:
        k, groups = y.shape[1] * block, y.shape[1]
        extra = {GROUP_WIDTH: per_group}
        per_group = block
    wt = TensorSpec((k, per_group, shape.r, shape.s))
    attrs = {"kernel_shape": (shape.r, shape.s), "strides": (shape.stride,) * 2,
             "pads": (shape.pad,) * 4, "dilations": (1, 1), "group": groups,
             "block": block, "channels": k, **extra}
    return Workload("Conv", (x, wt, TensorSpec((k,))), (y,), tuple(sorted(attrs.items())),
                    (EpilogueStep("relu"),), "wpk.nchwc", (1, 2))


def ort_kernel(workload, consts, threads: int, spinning: bool):
    """onnxruntime's NCHWc Conv on the blocked buffers (IOBinding, no copies)."""
    from wpk.kernels.cpu.nchwc import build_ort_model

    model, _ = build_ort_model(workload, consts)
    session = ort_session(model, threads, spinning, optimize=False)

    def run(x, out):
        binding = session.io_binding()
        binding.bind_cpu_input("x", x.reshape(x.shape[0], -1, *x.shape[2:4]))
        binding.bind_output("y", "cpu", 0, np.float32, [out.shape[0], out.shape[1] * out.shape[4],
                                                       *out.shape[2:4]], out.ctypes.data)
        session.run_with_iobinding(binding)

    return run


def ort_grouped_kernel(shape: ConvShape, consts, threads: int, spinning: bool):
    """onnxruntime's own grouped NCHW Conv (+ ReLU) of a conv of sparse groups, what it
    runs in its graph (the reorders it adds around it not timed): (run(x_nchw, y_nchw),
    the NCHW input and output buffers)."""
    from bench_dsl_cpu import helper, numpy_helper

    from wpk.kernels.nchwc_format import unblock

    dense, bias = consts[1], consts[2]
    out_group, in_group = shape.k // shape.groups, shape.c // shape.groups
    weight = np.concatenate([dense[g * out_group:(g + 1) * out_group,
                                   g * in_group:(g + 1) * in_group]
                             for g in range(shape.groups)])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=shape.groups),
             helper.make_node("Relu", ["c"], ["y"])]
    oh, ow = shape.out_hw
    graph = helper.make_graph(
        nodes, "grouped", [helper.make_tensor_value_info("x", 1, [1, shape.c, shape.h, shape.w])],
        [helper.make_tensor_value_info("y", 1, [1, shape.k, oh, ow])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session = ort_session(model, threads, spinning, optimize=True)

    def run(x, out):
        binding = session.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        session.run_with_iobinding(binding)

    return run, unblock


def blocked_input(workload, rng) -> np.ndarray:
    from wpk.kernels.random_inputs import random_inputs

    return random_inputs(workload, rng)


def mlas_config(space) -> dict | None:
    """The MLAS tile (`space.mlas_tile`) as a config of the space, where it is not the
    default: the baseline the strided defaults were chosen against."""
    from wpk.kernels.cpu.microkernels.isa import ISAS
    from wpk.kernels.cpu.microkernels.space import mlas_tile, with_passes

    if space.geometry.within_vector:
        return None
    default = space.default_config()
    isa = ISAS[default["isa"]]
    config = with_passes(space.geometry, isa, mlas_tile(space.geometry, isa))
    return None if config == default else config


def grid_configs(space, size: int) -> list[dict]:
    """The default config and up to `size` valid others (host ISA, full unroll): first the
    MLAS tile (where it is not the default), the default with the phase split toggled and
    with units of several rows, then other tiles, each with the split off and on where it
    applies and one row or several per unit."""
    default = space.default_config()
    knobs = space.space()
    found = [default]

    def add(config):
        if config not in found and space.validate(config) is None:
            found.append(config)

    if mlas_config(space):
        add(mlas_config(space))
    rows = (1, min(7, space.geometry.oh))
    for split in knobs["split"]:
        for many in rows:
            add(dict(default, split=split, rows=many))
    for kv in [k for k in knobs["kv"] if k > 1] or knobs["kv"]:
        for px in (4, 5, 6, 7, 8, 10, 12, 14):
            for split in knobs["split"]:
                for many in rows:
                    add(dict(default, kv=kv, px=px, split=split, rows=many))
    return found[:1 + size]


def verified(workload, inputs, kernel, reference) -> float:
    out = np.full(workload.outputs[0].shape, np.nan, np.float32)
    kernel(inputs, [out])
    return float(np.linalg.norm(out - reference) / np.linalg.norm(reference))


def bench_shape(shape: ConvShape, args, rng) -> dict:
    from wpk.kernels.cpu.microkernels.kernel import MICRO_NCHWC, MicroKernels
    from wpk.kernels.nchwc_format import host_block_size
    from wpk.kernels.nchwc_reference import nchwc_reference

    workload = nchwc_workload(shape, host_block_size())
    inputs = blocked_input(workload, rng)
    consts = {1: inputs[1], 2: inputs[2]}
    reference = nchwc_reference(workload, inputs)[0]
    out = np.empty(workload.outputs[0].shape, np.float32)
    space = MicroKernels().template(workload)
    configs = grid_configs(space, args.grid)
    baseline = mlas_config(space)
    if baseline is not None and baseline not in configs:
        configs.append(baseline)
    best, tried, kernels = None, [], []
    for config in configs:
        kernel = MICRO_NCHWC.prepare(workload, consts, config)
        err = verified(workload, inputs, kernel, reference)
        if err > 1e-4:
            raise SystemExit(f"{shape.label()} {config}: wrong answer (relative L2 {err:.2e})")
        # the fastest of 9 calls: other load on the machine only ever slows a call down
        t = timeit(lambda k=kernel: k(inputs, [out]), 9, min, args.clock)
        tried.append({"config": config, "fastest_of_9_s": t})
        kernels.append(kernel)
        if best is None or t < best[0]:
            best = (t, config, kernel)
        if config is configs[0]:
            default = (config, kernel)
    x = inputs[0]
    ort_spin = ort_kernel(workload, consts, args.threads, True)
    ort_passive = ort_kernel(workload, consts, args.threads, False)
    runs = {"micro": lambda: best[2](inputs, [out]),
            "micro_default": lambda: default[1](inputs, [out]),
            "ort_no_spin": lambda: ort_passive(x, out),
            "ort": lambda: ort_spin(x, out)}
    if baseline is not None:   # timed in the rounds too: the defaults' evidence
        mlas_kernel = kernels[configs.index(baseline)]
        runs["micro_mlas"] = lambda: mlas_kernel(inputs, [out])
    if sparse_groups(shape, host_block_size()):   # and onnxruntime's own grouped conv
        grouped, unblock = ort_grouped_kernel(shape, consts, args.threads, True)
        x_nchw = np.ascontiguousarray(unblock(x, shape.c))
        y_nchw = np.empty((1, shape.k, *shape.out_hw), np.float32)
        runs["ort_grouped"] = lambda: grouped(x_nchw, y_nchw)
        runs["ort_grouped"]()
        err = float(np.linalg.norm(y_nchw - unblock(reference, shape.k))
                    / np.linalg.norm(reference))
        if err > 1e-4:
            raise SystemExit(f"{shape.label()}: onnxruntime's grouped conv differs ({err:.2e})")
    runs["ort"]()
    err_ort = float(np.linalg.norm(out - reference) / np.linalg.norm(reference))
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for round_ in range(args.rounds):
        # alternate, and rotate who goes first: load changes and the pause before a round
        # hit every contender alike
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            time.sleep(0.2)        # let a spinning pool go idle before the next contender
            times[name].append(timeit(runs[name], args.repeat, clock=args.clock))
    over_rounds = min if args.stat == "min" else statistics.median
    med = {k: over_rounds(v) for k, v in times.items()}
    if med["micro_default"] < med["micro"]:   # the grid's pick (fastest of 9 calls) was wrong
        best = (med["micro_default"], *default)
        med["micro"] = med["micro_default"]
    ort_s = min(med[k] for k in ("ort", "ort_no_spin", "ort_grouped") if k in med)
    gflops = {k: shape.flops / v / 1e9 for k, v in med.items()}
    return {"workload": {"c": shape.c, "h": shape.h, "w": shape.w, "k": shape.k, "r": shape.r,
                         "s": shape.s, "stride": shape.stride, "pad": shape.pad,
                         "groups": shape.groups, "source": shape.source},
            "label": shape.label(), "group": group_of(shape), "flops": shape.flops,
            "best_config": best[1], "default_config": default[0], "configs_tried": len(configs),
            "grid": tried,
            "seconds": med, "gflops": gflops,
            "percent_of_peak": {k: 100 * v / args.peak for k, v in gflops.items()},
            "ratio_to_ort": ort_s / med["micro"],
            "default_ratio_to_ort": ort_s / med["micro_default"],
            "mlas_config": baseline,
            "mlas_ratio_to_ort": ort_s / med["micro_mlas"] if baseline is not None else None,
            "ort_relative_l2": err_ort}


def summarize(rows: list[dict]) -> dict:
    """Median ratio per goal group, and the largest 1x1 conv's % of peak."""
    summary = {}
    for group in GROUPS:
        ratios = [r["ratio_to_ort"] for r in rows if r["group"] == group]
        if ratios and group not in GOALS:
            summary[group] = {"median_ratio_to_ort": statistics.median(ratios),
                              "min": min(ratios), "max": max(ratios), "count": len(ratios),
                              "goal": None, "goal_on": "median", "met": None}
        elif ratios:
            med = statistics.median(ratios)
            judged = min(ratios) if group in EACH else med
            summary[group] = {"median_ratio_to_ort": med, "min": min(ratios),
                              "max": max(ratios), "count": len(ratios),
                              "goal": GOALS[group], "goal_on": "each" if group in EACH
                              else "median", "met": judged >= GOALS[group]}
    ones = [r for r in rows if r["group"] == "1x1"]
    if ones:
        largest = max(ones, key=lambda r: r["flops"])
        pct = largest["percent_of_peak"]["micro"]
        summary["largest_1x1"] = {"label": largest["label"], "percent_of_peak": pct,
                                  "goal": 80.0, "met": pct >= 80.0}
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5, help="calls timed per round")
    parser.add_argument("--grid", type=int, default=12, help="tiles tried besides the default")
    parser.add_argument("--only", choices=["1x1", "3x3", "depthwise", "grouped", "stride2",
                                           "stem", "strided"], default=None,
                        help="strided: the stride-2 convs and the stems")
    parser.add_argument("--limit", type=int, default=None, help="first N workloads (smoke run)")
    parser.add_argument("--peak", type=float, default=None,
                        help="fp32 GFLOP/s peak (default: measured by scripts/cpu_peak.py)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: the process's CPU time, not wall time (1 thread only: on a "
                             "loaded machine it leaves out the time other jobs held the core)")
    parser.add_argument("--stat", choices=["median", "min"], default="median",
                        help="over the rounds: min keeps each contender's fastest round (on "
                             "a loaded machine other jobs only ever slow a round down)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu needs --threads 1 (CPU time sums the threads)")
    clock_name = args.clock
    args.clock = time.process_time if args.clock == "cpu" else time.perf_counter
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    peak = None
    if args.peak is None:
        peak = measure_peak(args.threads)
        args.peak = peak["gflops"]
    print(f"fp32 FMA peak: {args.peak:.1f} GFLOP/s on {args.threads} threads")
    shapes = [*resnet50_convs(), *stem_convs(), *depthwise_convs(), *grouped_convs(),
              *shufflenet_convs()]
    shapes = [s for s in shapes if group_of(s) != "other"]
    if args.only in ("stride2", "strided"):
        keep = ("1x1 s2", "3x3 s2", *(("stem",) if args.only == "strided" else ()))
        shapes = [s for s in shapes if group_of(s) in keep]
    elif args.only:
        shapes = [s for s in shapes if group_of(s).startswith(args.only)]
    shapes = shapes[:args.limit]
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'workload':36s} {'config':29s} {'micro':>7s} {'ort':>7s} {'%peak':>6s} "
          f"{'ratio':>6s} {'dflt':>6s} {'mlas':>6s}  (GFLOP/s; ratio > 1: faster than onnxruntime; "
          f"dflt: the default tile's, mlas: MLAS's tile's)")
    for shape in shapes:
        row = bench_shape(shape, args, rng)
        rows.append(row)
        c = row["best_config"]
        ort_g = max(v for k, v in row["gflops"].items() if k.startswith("ort"))
        mlas = "  -" if row["mlas_ratio_to_ort"] is None else f"{row['mlas_ratio_to_ort']:6.2f}"
        print(f"{row['label']:36s} {c['isa']} kv{c['kv']} px{c['px']} split{c['split']} "
              f"rows{c['rows']:<3d}"
              f"{row['gflops']['micro']:7.1f} {ort_g:7.1f} "
              f"{row['percent_of_peak']['micro']:6.1f} {row['ratio_to_ort']:6.2f} "
              f"{row['default_ratio_to_ort']:6.2f} {mlas}", flush=True)
    summary = summarize(rows)
    for group, s in summary.items():
        if group == "largest_1x1":
            print(f"largest 1x1 ({s['label']}): {s['percent_of_peak']:.1f}% of peak "
                  f"(goal >= 80%: {'met' if s['met'] else 'not met'})")
        else:
            on = "each conv" if s["goal_on"] == "each" else "the median"
            goal = "" if s["goal"] is None else f" (goal >= {s['goal']} on {on}: " \
                f"{'met' if s['met'] else 'not met'})"
            print(f"{group}: median micro/ort {s['median_ratio_to_ort']:.2f} "
                  f"(min {s['min']:.2f}, max {s['max']:.2f}, n={s['count']}){goal}")
    if args.output:
        import onnxruntime

        from wpk.kernels.cpu.microkernels.isa import host_isa

        result = {"benchmark": "bench_microkernels", "threads": args.threads,
                  "rounds": args.rounds, "clock": clock_name, "stat": args.stat,
                  "peak": peak or {"gflops": args.peak},
                  "machine": {"platform": platform.platform(), "processor": platform.processor(),
                              "cpu_count": os.cpu_count(), "isa": host_isa().name,
                              "load_average": os.getloadavg()},
                  "versions": {"numpy": np.__version__, "onnxruntime": onnxruntime.__version__},
                  "rows": rows, "summary": summary}
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
