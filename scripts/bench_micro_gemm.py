"""Benchmark (not a test): GEMM micro-kernels (`micro.gemm`) vs onnxruntime's MatMul and BLAS.

The MatMul shapes of three transformers, batch 1: `transformer_encoder` of the
suite (seq 64, d_model 256, FFN 1024, 4 heads), the BERT-base layer
(`bert_base_layer`: seq 128, d_model 768, FFN 3072, 12 heads) and a ViT-tiny
(197 tokens, d_model 192, MLP 768, 3 heads): the projections and FFN layers
(constant B, the weights) and the two attention products per layer (batched
over heads, B a variable: packed at every call). For each: the micro-kernel's
default config (what an untuned build offers) and the best of a small grid
of tiles (`--grid`, 0 to skip) are verified against the float64 reference,
then timed against onnxruntime's MatMul node (weights as an initializer, so
MLAS prepacks them; output bound in place; spinning and passive thread pools,
the better one counts) and numpy's matmul (its BLAS), with the same thread
count, alternating per round (a 0.2 s pause before each contender, the first
one rotating); medians per round, the median over rounds reported as GFLOP/s,
% of the measured peak (`scripts/cpu_peak.py`) and the ratio to onnxruntime
(> 1: micro.gemm is faster).

    python scripts/bench_micro_gemm.py [--threads 1,2] [--rounds 5] [--grid 8]
        [--models transformer_encoder,bert_base_layer,vit_tiny] [--output FILE.json]
    python scripts/bench_micro_gemm.py --table FILE.json    # its README table (markdown)
    python scripts/bench_micro_gemm.py --kc-sweep [--isa avx2]  # the default tile per k pass

`--kc-sweep` times the default register tile (or `--isa`'s) at every k-pass length
`kc` on the constant-B products, the lengths interleaved in back-to-back calls
(no pause: what a plan's consecutive steps see), the fastest call of
rounds x repeat counted: the evidence for `PANEL_BYTES`, the default's bound on
kc, in `wpk.kernels.cpu.microkernels.gemm_space`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_dsl_cpu import ort_session, timeit  # noqa: E402
from cpu_peak import measure_peak  # noqa: E402

# model -> (seq, d_model, ffn, heads)
MODELS = {"transformer_encoder": (64, 256, 1024, 4), "bert_base_layer": (128, 768, 3072, 12),
          "vit_tiny": (197, 192, 768, 3),
          # ConvNeXt-tiny's pointwise MLPs at 224x224 (stages 1 and 2; no attention)
          "convnext_stage1": (3136, 96, 384, 0), "convnext_stage2": (784, 192, 768, 0),
          # torch's nn.MultiheadAttention: the packed QKV projection of a seq-first (128, 1,
          # 256) input, A's batch dims folded into the rows (gemm_space.gemm_geometry)
          "torch_seq_first": (128, 256, 768, -1)}


@dataclass(frozen=True)
class Product:
    """One MatMul of a model: A [*batch, m, k] @ B [*batch, k, n]; B constant (weights) or
    not (attention)."""

    model: str
    role: str
    batch: tuple[int, ...]
    m: int
    k: int
    n: int
    const_b: bool

    @property
    def flops(self) -> int:
        return 2 * int(np.prod(self.batch, dtype=np.int64)) * self.m * self.k * self.n

    @property
    def label(self) -> str:
        heads = f"{self.batch[-1]}x" if self.batch else ""
        return f"{heads}{self.m}x{self.k} @ {self.k}x{self.n}"


def products(model: str) -> list[Product]:
    """The distinct MatMuls of one encoder layer of `model` (a ConvNeXt block: its MLP's
    two; torch's seq-first attention: its QKV projection)."""
    seq, d, ffn, heads = MODELS[model]
    if heads < 0:
        return [Product(model, "QKV projection, seq-first", (seq,), 1, d, ffn, True)]
    mlp = [Product(model, "ffn up", (), seq, d, ffn, True),
           Product(model, "ffn down", (), seq, ffn, d, True)]
    if not heads:
        return mlp
    hd = d // heads
    return [Product(model, "projection", (), seq, d, d, True), *mlp,
            Product(model, "scores QK^T", (1, heads), seq, hd, seq, False),
            Product(model, "context PV", (1, heads), seq, seq, hd, False)]


def workload(p: Product):
    from wpk.core.workload import TensorSpec, Workload

    a = TensorSpec((*p.batch, p.m, p.k))
    b = TensorSpec((*p.batch, p.k, p.n) if not p.const_b else (p.k, p.n))
    return Workload("MatMul", (a, b), (TensorSpec((*p.batch, p.m, p.n)),), (), (), "",
                    (1,) if p.const_b else ())


def ort_matmul(a: np.ndarray, b: np.ndarray, const_b: bool, threads: int, spinning: bool):
    """onnxruntime's MatMul node (B an initializer when constant) writing into `out`."""
    from onnx import TensorProto, helper, numpy_helper

    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape)]
    inits = [numpy_helper.from_array(b, "b")] if const_b else []
    if not const_b:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape))
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "matmul", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort_session(model, threads, spinning, optimize=True)

    def run(out: np.ndarray) -> None:
        binding = session.io_binding()
        binding.bind_cpu_input("a", a)
        if not const_b:
            binding.bind_cpu_input("b", b)
        binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        session.run_with_iobinding(binding)

    return run


def grid_configs(space, size: int) -> list[dict]:
    """The default config and up to `size` valid register tiles and k passes around it."""
    default = space.default_config()
    found = [default]
    for nv, mr in ((4, 6), (2, 12), (3, 8), (2, 8), (1, 14), (4, 5), (2, 6), (1, 8)):
        for kc in (default["kc"], 256, 512):
            config = dict(default, nv=nv, mr=mr, kc=kc)
            if config not in found and space.validate(config) is None:
                found.append(config)
    return found[:1 + size]


def relative_error(out: np.ndarray, reference: np.ndarray) -> float:
    return float(np.linalg.norm(out - reference) / np.linalg.norm(reference))


def bench_product(p: Product, threads: int, args, rng) -> dict:
    from wpk.kernels.cpu.microkernels.gemm import MICRO_GEMM, GemmKernels
    from wpk.kernels.random_inputs import random_inputs
    from wpk.kernels.reference import reference

    w = workload(p)
    inputs = random_inputs(w, rng)
    a, b = inputs
    expected = reference(w, inputs)[0]
    out = np.empty(w.outputs[0].shape, np.float32)
    best = default = None
    configs = grid_configs(GemmKernels().template(w), args.grid)
    for config in configs:
        kernel = MICRO_GEMM.prepare(w, {1: b} if p.const_b else {}, config)
        out.fill(np.nan)
        kernel(inputs, [out])
        err = relative_error(out, expected)
        if not err < 1e-4:
            raise SystemExit(f"{p.label} {config}: wrong answer (relative L2 {err:.2e})")
        # the fastest of 7 calls: other load on the machine only ever slows a call down
        t = timeit(lambda k=kernel: k(inputs, [out]), 7, min)
        if best is None or t < best[0]:
            best = (t, config, kernel)
        if default is None:
            default = (config, kernel)
    ort_spin = ort_matmul(a, b, p.const_b, threads, True)
    ort_passive = ort_matmul(a, b, p.const_b, threads, False)
    runs = {"micro": lambda: best[2](inputs, [out]),
            "micro_default": lambda: default[1](inputs, [out]),
            "ort": lambda: ort_spin(out), "ort_no_spin": lambda: ort_passive(out),
            "numpy": lambda: np.matmul(a, b, out=out)}
    runs["ort"]()
    err_ort = relative_error(out, expected)
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            time.sleep(0.2)        # let a spinning pool go idle before the next contender
            times[name].append(timeit(runs[name], args.repeat))
    med = {k: statistics.median(v) for k, v in times.items()}
    ort_s = min(med["ort"], med["ort_no_spin"])
    gflops = {k: p.flops / v / 1e9 for k, v in med.items()}
    return {"model": p.model, "role": p.role, "label": p.label, "batch": list(p.batch),
            "m": p.m, "k": p.k, "n": p.n, "const_b": p.const_b, "threads": threads,
            "flops": p.flops, "best_config": best[1], "default_config": default[0],
            "configs_tried": len(configs), "seconds": med, "gflops": gflops,
            "percent_of_peak": {k: 100 * v / args.peaks[threads] for k, v in gflops.items()},
            "ratio_to_ort": ort_s / med["micro"],
            "default_ratio_to_ort": ort_s / med["micro_default"],
            "ratio_to_numpy": med["numpy"] / med["micro"], "ort_relative_l2": err_ort}


def summarize(rows: list[dict]) -> dict:
    """Per thread count: median ratios to onnxruntime (best and default config) and to
    numpy over every product."""
    summary = {}
    for threads in sorted({r["threads"] for r in rows}):
        mine = [r for r in rows if r["threads"] == threads]
        summary[str(threads)] = {
            "median_ratio_to_ort": statistics.median(r["ratio_to_ort"] for r in mine),
            "median_default_ratio_to_ort": statistics.median(r["default_ratio_to_ort"]
                                                             for r in mine),
            "median_ratio_to_numpy": statistics.median(r["ratio_to_numpy"] for r in mine),
            "min_ratio_to_ort": min(r["ratio_to_ort"] for r in mine), "count": len(mine)}
    return summary


def markdown_table(result: dict) -> str:
    """The README's table of a results JSON: one row per product, GFLOP/s per thread count
    (micro.gemm's fastest verified config, onnxruntime's better pool, numpy), then the
    summary lines."""
    counts = result["threads"]
    rows = {}
    for r in result["rows"]:
        rows.setdefault((r["model"], r["role"], r["label"]), {})[r["threads"]] = r
    head = "| model | product |" + "".join(
        f" {t} thr: micro | ort | numpy | micro % of peak | micro/ort |" for t in counts)
    lines = [head, "| --- | --- |" + " ---: |" * 5 * len(counts)]
    for (model, role, label), by_threads in rows.items():
        cells = ""
        for t in counts:
            r = by_threads[t]
            g = r["gflops"]
            cells += (f" {g['micro']:.0f} | {max(g['ort'], g['ort_no_spin']):.0f} | "
                      f"{g['numpy']:.0f} | {r['percent_of_peak']['micro']:.0f}% | "
                      f"{r['ratio_to_ort']:.2f} |")
        lines.append(f"| {model} | {role} {label} |{cells}")
    for t, s in result["summary"].items():
        lines.append(f"\n{t} thread(s): median micro.gemm/onnxruntime speed "
                     f"{s['median_ratio_to_ort']:.2f} (default config "
                     f"{s['median_default_ratio_to_ort']:.2f}, min {s['min_ratio_to_ort']:.2f}), "
                     f"micro.gemm/numpy {s['median_ratio_to_numpy']:.2f}")
    return "\n".join(lines)


def kc_sweep(p: Product, args, rng) -> dict:
    """GFLOP/s of the default tile (at `args.isa`'s widest tile when given) per kc choice
    on product `p`, each verified, the fastest call of rounds x repeat interleaved."""
    from wpk.kernels.cpu.microkernels.gemm import MICRO_GEMM, GemmKernels
    from wpk.kernels.cpu.microkernels.gemm_space import KC_CHOICES
    from wpk.kernels.cpu.microkernels.gemm_space import default_config as gemm_default
    from wpk.kernels.random_inputs import random_inputs
    from wpk.kernels.reference import reference

    w = workload(p)
    inputs = random_inputs(w, rng)
    expected = reference(w, inputs)[0]
    space = GemmKernels().template(w)
    default = gemm_default(space.geometry, args.isa) if args.isa else space.default_config()
    out = np.empty(w.outputs[0].shape, np.float32)
    kernels = {}
    for kc in KC_CHOICES:
        kernel = MICRO_GEMM.prepare(w, {1: inputs[1]}, dict(default, kc=kc))
        out.fill(np.nan)
        kernel(inputs, [out])
        if not relative_error(out, expected) < 1e-4:
            raise SystemExit(f"{p.label} kc {kc}: wrong answer")
        kernels[kc] = kernel
    fastest = dict.fromkeys(kernels, float("inf"))
    for _ in range(args.rounds):
        for kc, kernel in kernels.items():
            for _ in range(args.repeat):
                start = time.perf_counter()
                kernel(inputs, [out])
                fastest[kc] = min(fastest[kc], time.perf_counter() - start)
    return {"model": p.model, "label": p.label, "default": default,
            "gflops_per_kc": {kc: p.flops / t / 1e9 for kc, t in fastest.items()}}


def main_kc_sweep(args, counts: list[int]) -> int:
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    shapes = [p for m in args.models.split(",") for p in products(m) if p.const_b]
    rows = []
    for threads in counts:
        with threadpool_limits(limits=threads):
            for p in shapes[:args.limit]:
                row = dict(kc_sweep(p, args, rng), threads=threads)
                rows.append(row)
                cells = " ".join(f"{kc}:{g:.0f}" for kc, g in row["gflops_per_kc"].items())
                print(f"{threads} thr {p.model:20s} {p.label:22s} default kc "
                      f"{row['default']['kc']:4d} ({row['default']['isa']})  GFLOP/s per "
                      f"kc {cells}", flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"benchmark": "bench_micro_gemm --kc-sweep",
                                           "machine": platform.processor(),
                                           "rows": rows}, indent=1))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5, help="calls timed per round")
    parser.add_argument("--grid", type=int, default=8, help="configs tried besides the default")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--limit", type=int, default=None, help="first N products (smoke run)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--table", type=Path, default=None,
                        help="print the markdown table of this results JSON and stop")
    parser.add_argument("--kc-sweep", action="store_true",
                        help="time the default tile at every k-pass length kc instead")
    parser.add_argument("--isa", default=None, help="--kc-sweep: this ISA's default tile")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(args.table.read_text())))
        return 0
    from threadpoolctl import threadpool_limits

    counts = [int(t) for t in args.threads.split(",")]
    if args.kc_sweep:
        args.rounds, args.repeat = max(args.rounds, 15), max(args.repeat, 3)
        return main_kc_sweep(args, counts)
    args.peaks = {t: measure_peak(t)["gflops"] for t in counts}
    shapes = [p for m in args.models.split(",") for p in products(m)][:args.limit]
    rng = np.random.default_rng(0)
    rows = []
    for threads in counts:
        print(f"--- {threads} thread(s), fp32 FMA peak {args.peaks[threads]:.1f} GFLOP/s")
        print(f"{'model':20s} {'product':24s} {'micro':>7s} {'ort':>7s} {'numpy':>7s} "
              f"{'%peak':>6s} {'/ort':>5s} {'dflt':>5s}  (GFLOP/s; /ort > 1: faster)")
        with threadpool_limits(limits=threads):   # OpenMP (micro.gemm) and BLAS (numpy)
            for p in shapes:
                row = bench_product(p, threads, args, rng)
                rows.append(row)
                g = row["gflops"]
                print(f"{p.model:20s} {p.label:24s} {g['micro']:7.1f} "
                      f"{max(g['ort'], g['ort_no_spin']):7.1f} {g['numpy']:7.1f} "
                      f"{row['percent_of_peak']['micro']:6.1f} {row['ratio_to_ort']:5.2f} "
                      f"{row['default_ratio_to_ort']:5.2f}", flush=True)
    summary = summarize(rows)
    for threads, s in summary.items():
        print(f"{threads} thread(s): median micro/ort {s['median_ratio_to_ort']:.2f} "
              f"(default config {s['median_default_ratio_to_ort']:.2f}, min "
              f"{s['min_ratio_to_ort']:.2f}), micro/numpy {s['median_ratio_to_numpy']:.2f}")
    if args.output:
        import onnxruntime

        from wpk.kernels.cpu.microkernels.isa import host_isa

        result = {"benchmark": "bench_micro_gemm", "threads": counts, "rounds": args.rounds,
                  "peaks_gflops": args.peaks,
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
