"""Benchmark (not a test): generated C convolutions vs onnxruntime and numpy im2col + BLAS.

For every distinct convolution of ResNet-50 at batch 1 (read from the ONNX
wheel's light_resnet50.onnx) and a set of MobileNet-v2 depthwise
convolutions, the DSL's `conv2d` operator is compiled for each config of a
fixed grid (at most --max-configs, <= 100) of the CPU conv template; the
fastest verified config is then timed against onnxruntime's single-node Conv
(same thread count; with and without its spinning thread pool, the better of
the two is the reference) and numpy im2col + matmul, alternating A B C per
round, and medians are reported as GFLOP/s, % of the machine's fp32 FMA peak
(measured by scripts/cpu_peak.py for the same threads, or given with --peak)
and the ratio to onnxruntime.

    python scripts/bench_dsl_cpu.py [--threads 2] [--max-configs 100] [--peak GFLOPS]
        [--output FILE.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

# OpenBLAS threads spin ~2^28 cycles (~0.1 s) after each call by default, starving whatever
# runs next on a 2-core machine; let them sleep at once (read when numpy loads OpenBLAS).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper, shape_inference  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_peak import measure_peak  # noqa: E402


@dataclass(frozen=True)
class ConvShape:
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: int
    pad: int
    groups: int = 1
    source: str = "resnet50"

    @property
    def out_hw(self) -> tuple[int, int]:
        return ((self.h + 2 * self.pad - self.r) // self.stride + 1,
                (self.w + 2 * self.pad - self.s) // self.stride + 1)

    @property
    def flops(self) -> int:
        oh, ow = self.out_hw
        return 2 * self.k * (self.c // self.groups) * self.r * self.s * oh * ow

    def label(self) -> str:
        kind = "dw" if self.groups == self.c and self.groups > 1 else "conv"
        return (f"{kind} {self.c}x{self.h}x{self.w}->{self.k} {self.r}x{self.s}"
                f"/s{self.stride}p{self.pad}")


def resnet50_convs() -> list[ConvShape]:
    """Distinct Conv workloads of the ONNX wheel's ResNet-50 (batch 1, 224x224)."""
    path = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    model = shape_inference.infer_shapes(onnx.load(str(path)))
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(model.graph.value_info) + list(model.graph.input)}
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    shapes.update(inits)
    found: list[ConvShape] = []
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        x, wt = shapes[node.input[0]], shapes[node.input[1]]
        pads = list(attrs.get("pads", [0, 0, 0, 0]))
        assert len(set(pads)) == 1, "asymmetric padding"
        shape = ConvShape(x[1], x[2], x[3], wt[0], wt[2], wt[3], attrs.get("strides", [1])[0],
                          pads[0], attrs.get("group", 1))
        if shape not in found:
            found.append(shape)
    return found


def depthwise_convs() -> list[ConvShape]:
    """3x3 depthwise convolutions of MobileNet-v2 (224x224 input)."""
    rows = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
            (192, 28, 2), (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]
    return [ConvShape(c, h, h, c, 3, 3, s, 1, c, "mobilenet_v2") for c, h, s in rows]


# ----------------------------------------------------------------------------- peers
def ort_conv(shape: ConvShape, x, wt, threads: int, spinning: bool):
    node = helper.make_node("Conv", ["X", "W"], ["Y"], strides=[shape.stride] * 2,
                            pads=[shape.pad] * 4, group=shape.groups)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info(
        "X", TensorProto.FLOAT, x.shape)], [helper.make_tensor_value_info(
            "Y", TensorProto.FLOAT, None)], [numpy_helper.from_array(wt, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session = ort_session(model, threads, spinning, optimize=True)
    return lambda: session.run(None, {"X": x})[0]


def ort_session(model, threads: int, spinning: bool, optimize: bool):
    """An onnxruntime CPU session of `model` with `threads` intra-op threads (spinning or
    passive) and its graph optimizations on (`optimize`) or off."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def numpy_im2col(shape: ConvShape, x, wt):
    """Convolution as im2col (sliding windows) + one matmul per group (numpy's BLAS)."""
    from numpy.lib.stride_tricks import sliding_window_view

    p, st, g = shape.pad, shape.stride, shape.groups
    oh, ow = shape.out_hw
    cg, kg = shape.c // g, shape.k // g
    weights = wt.reshape(g, kg, cg * shape.r * shape.s)

    def run():
        xp = np.pad(x[0], ((0, 0), (p, p), (p, p))) if p else x[0]
        win = sliding_window_view(xp, (shape.r, shape.s), axis=(1, 2))[:, ::st, ::st]
        cols = np.ascontiguousarray(  # a strided view would make matmul skip BLAS
            win[:, :oh, :ow].transpose(0, 3, 4, 1, 2).reshape(g, cg * shape.r * shape.s,
                                                               oh * ow))
        return np.matmul(weights, cols).reshape(1, shape.k, oh, ow)

    return run


# ----------------------------------------------------------------------------- wpk
def wpk_setup(shape: ConvShape, x, wt):
    from wpk.dsl import compute as C
    from wpk.kernels.dsl_library import load_operator

    op = load_operator("conv2d")
    scalars = {"stride_h": shape.stride, "stride_w": shape.stride, "groups": shape.groups,
               **{k: shape.pad for k in ("pad_t", "pad_l", "pad_b", "pad_r")}}
    bindings = C.infer_bindings(op, {"X": x, "Wt": wt}, scalars)
    return op, bindings


def grid(template, shape: ConvShape, max_configs: int) -> list[dict]:
    """The fixed grid: a reduced choice list per knob, validated, at most `max_configs`.

    Padded convolutions always read a zero-padded copy of the input (cache_input=2) with
    the output-channel tiles inside the pixel tiles (k_inner=1): the in-loop padding test
    (cache_input=0) stops gcc from vectorising and k tiles outside sweep the whole input
    once per tile (both measured at 2-10 GFLOP/s here). Unpadded ones try both orders and
    both reads: the copy also serves pixel tiles that overrun a 14x14 or 7x7 image, whose
    direct read needs an in-loop bounds test (2 GFLOP/s)."""
    space = template.space()
    lanes = template.limits.vector_lanes
    pick = {
        "tile_k": [v for v in space["tile_k"] if v in (4, 8, 16)] or space["tile_k"][-1:],
        "fuse_yx": space["fuse_yx"],
        "tile_x": [v for v in space["tile_x"] if v in (lanes, 2 * lanes)] or space["tile_x"],
        "tile_y": [v for v in space["tile_y"] if v in (1, 2)],
        "tile_c": space["tile_c"][:1],
        "cache_input": [2] if shape.pad else [0, 2],
        "unroll_window": [1, 0],
        "k_inner": [1] if shape.pad else [1, 0],
    }
    out: list[dict] = []
    for values in itertools.product(*pick.values()):
        config = dict(zip(pick, values))
        if config["fuse_yx"] and config["tile_y"] != pick["tile_y"][0]:
            continue  # tile_y has no effect on a fused pixel axis
        if not config["unroll_window"] and template.validate(dict(config, unroll_window=1)) \
                is None:
            continue  # only when the unrolled window is too big
        if template.validate(config) is None:
            out.append(config)
    return out[:max_configs]


def timeit(fn, repeat: int, pick=statistics.median, clock=time.perf_counter) -> float:
    """Median (or `pick`) seconds of `repeat` calls after one warm-up call, read on `clock`
    (wall time; `time.process_time` counts only the CPU time the process got)."""
    fn()
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return pick(times)


def tune(shape, x, wt, max_configs, threads, jobs):
    from wpk.dsl import compute as C
    from wpk.kernels.templates import build_cpu, template_for

    op, bindings = wpk_setup(shape, x, wt)
    template = template_for(C.specialize(op, bindings), "cpu")
    configs = grid(template, shape, max_configs)
    with ThreadPoolExecutor(jobs) as pool:  # gcc runs in subprocesses
        kernels = list(pool.map(lambda c: build_cpu(op, bindings, c), configs))
    out = np.empty(kernels[0].func.buffer("Y").shape, np.float32)
    best = None
    for config, kernel in zip(configs, kernels):
        t = timeit(lambda k=kernel: k(X=x, Wt=wt, out={"Y": out}), 3)
        if best is None or t < best[0]:
            best = (t, config, kernel)
    return best[1], best[2], len(configs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--max-configs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=2, help="parallel compilations")
    parser.add_argument("--only", choices=["resnet50", "depthwise"], default=None)
    parser.add_argument("--limit", type=int, default=None, help="first N workloads (smoke run)")
    parser.add_argument("--peak", type=float, default=None,
                        help="fp32 GFLOP/s peak (default: measured by scripts/cpu_peak.py)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.max_configs > 100:
        parser.error("--max-configs is at most 100")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    peak = {"gflops": args.peak} if args.peak else measure_peak(args.threads)
    print(f"fp32 FMA peak: {peak['gflops']:.1f} GFLOP/s on {args.threads} threads")
    shapes = []
    if args.only in (None, "resnet50"):
        shapes += resnet50_convs()
    if args.only in (None, "depthwise"):
        shapes += depthwise_convs()
    shapes = shapes[:args.limit]
    rng = np.random.default_rng(0)
    rows = []
    header = (f"{'workload':40s} {'configs':>7s} {'wpk':>8s} {'%peak':>6s} {'ort':>8s} "
              f"{'%peak':>6s} {'numpy':>8s} {'wpk/ort':>7s}  (GFLOP/s)")
    print(header)
    for shape in shapes:
        x = rng.standard_normal((1, shape.c, shape.h, shape.w)).astype(np.float32)
        wt = (rng.standard_normal((shape.k, shape.c // shape.groups, shape.r, shape.s))
              .astype(np.float32) * 0.1)
        config, kernel, tried = tune(shape, x, wt, args.max_configs, args.threads, args.jobs)
        ort = ort_conv(shape, x, wt, args.threads, spinning=True)
        ort_passive = ort_conv(shape, x, wt, args.threads, spinning=False)
        im2col = numpy_im2col(shape, x, wt)
        ref = ort()
        got = kernel(X=x, Wt=wt)["Y"]
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        if err > 1e-4:
            print(f"{shape.label()}: wrong answer (relative L2 {err:.2e})", file=sys.stderr)
            return 1
        out = np.empty_like(ref)
        runs = {"wpk": lambda k=kernel, x=x, wt=wt, out=out: k(X=x, Wt=wt, out={"Y": out}),
                "ort": ort,
                "ort_no_spin": ort_passive, "numpy": im2col}
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.rounds):  # alternate A B C so load changes hit all alike
            for name, fn in runs.items():
                time.sleep(0.15)  # let the previous contender's spinning threads go idle
                times[name].append(timeit(fn, 3))
        med = {k: statistics.median(v) for k, v in times.items()}
        gflops = {k: shape.flops / v / 1e9 for k, v in med.items()}
        best_ort = min(med["ort"], med["ort_no_spin"])  # the peer at its better setting
        row = {"workload": asdict(shape), "label": shape.label(), "configs_tried": tried,
               "best_config": config, "seconds": med, "gflops": gflops,
               "percent_of_peak": {k: 100 * v / peak["gflops"] for k, v in gflops.items()},
               "ratio_to_ort": best_ort / med["wpk"], "relative_l2_vs_ort": err}
        rows.append(row)
        ort_gflops = shape.flops / best_ort / 1e9
        print(f"{shape.label():40s} {tried:7d} {gflops['wpk']:8.1f} "
              f"{row['percent_of_peak']['wpk']:6.1f} {ort_gflops:8.1f} "
              f"{100 * ort_gflops / peak['gflops']:6.1f} "
              f"{gflops['numpy']:8.1f} {row['ratio_to_ort']:7.2f}", flush=True)
    summary = {}
    for group, name in (("resnet50", "ResNet-50 convolutions"),
                        ("mobilenet_v2", "depthwise convolutions")):
        ratios = [r["ratio_to_ort"] for r in rows if r["workload"]["source"] == group]
        if ratios:
            summary[group] = {"median_ratio_to_ort": statistics.median(ratios),
                              "min": min(ratios), "max": max(ratios), "count": len(ratios)}
            print(f"{name}: median wpk/ort {statistics.median(ratios):.2f} "
                  f"(min {min(ratios):.2f}, max {max(ratios):.2f}, n={len(ratios)})")
    if args.output:
        import onnxruntime

        result = {"benchmark": "bench_dsl_cpu", "threads": args.threads, "peak": peak,
                  "machine": {"platform": platform.platform(), "processor": platform.processor(),
                              "cpu_count": os.cpu_count(),
                              "load_average": os.getloadavg()},
                  "versions": {"numpy": np.__version__, "onnxruntime": onnxruntime.__version__},
                  "max_configs": args.max_configs, "rows": rows, "summary": summary}
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
