#!/usr/bin/env python
"""End-to-end benchmark: wpk plans against onnxruntime on whole models (CPU).

For each model: build the wpk plan once (timed), load it, check its outputs
against onnxruntime, then time both engines alternately (A B A B ...) after a
warm-up and report medians, spread (p25..p75) and the ratio wpk/ort with its 95%
bootstrap interval (rounds resampled with their paired blocks): "faster" or
"slower" only when the interval excludes 1, else "tie within noise". The interval
covers the noise from round to round, not a lasting difference between two
sessions of one process: on the 2-core VM two onnxruntime sessions of the same
model differed by 3-11% for a whole run, either way. So a plan that is
onnxruntime's whole model (the build's end-to-end check chose it) gets the
verdict "plan is onnxruntime's model", whatever its interval.
onnxruntime runs with ORT_ENABLE_ALL and intra-op threads = cores.

    python scripts/bench_e2e.py                              # default models
    python scripts/bench_e2e.py --models light_vgg19,mobilenet_v2_like --rounds 30
    python scripts/bench_e2e.py --breakdown                  # + time of every plan step
    python scripts/bench_e2e.py --models corpus --ort-spinning --block 10 --breakdown
    python scripts/bench_e2e.py --table benchmarks/results/e2e-....json   # an earlier run
    python scripts/bench_e2e.py --models mobilenet_v2_like --busy-build 1   # built beside
                                                  # a busy process, timed on the idle machine

Writes benchmarks/results/e2e-<date>-<host>.json (machine, versions, all
timings) and prints a markdown table and a summary line (the geometric mean of wpk/ort
over the models, the verdicts' counts); `--table FILE.json` prints those of an earlier
run. Models: `light_<arch>` from the onnx
wheel (weights made random, see tests/models.py), the hand-built
mobilenet_v2_like, efficientnet_like, transformer_encoder, bert_base_layer,
dcgan_generator, espcn_like, deeplab_like, and the
real-exporter corpus (tests/corpus) as `corpus_<architecture>_<exporter>`
(`--models corpus` for all of them) at its benchmark size (`--corpus-size`), or your
own model files (`--models path/to/model.onnx`: seeded random inputs, an open batch
dimension at `--batch N` or 1).
With `--breakdown`, corpus runs also show onnxruntime's own time per
operator type (its profiler, after its fusions) beside wpk's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import onnx  # noqa: E402
import onnxruntime  # noqa: E402

import wpk  # noqa: E402
from tests import corpus, models  # noqa: E402
from wpk.core.numerics import relative_l2  # noqa: E402

DEFAULT_MODELS = ("light_resnet50", "light_squeezenet", "transformer_encoder")
CORPUS_PREFIX = "corpus_"
CORPUS_MODELS = tuple(CORPUS_PREFIX + name for name in corpus.CORPUS)
KNOWN_MODELS = models.ALL_MODELS + CORPUS_MODELS
# The verdict of a model whose build kept onnxruntime's whole model (the same engine twice)
WHOLE_MODEL = "plan is onnxruntime's model"


def machine_description() -> dict:
    """CPU model, cores, ISA flags and the versions of everything measured."""
    from wpk.core.devices import cpu_fingerprint, cpuid_denied_flags

    cpu_model = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu_model = next((line.split(":", 1)[1].strip() for line in handle
                              if line.startswith("model name")), cpu_model)
    except OSError:
        pass
    from wpk.kernels.cpu.ort_node import cpu_threads

    fingerprint = cpu_fingerprint()
    return {"host": socket.gethostname(), "cpu_model": cpu_model, "cores": os.cpu_count(),
            "machine": fingerprint.get("machine"), "isa": fingerprint.get("isa"),
            "cpuid_denied": cpuid_denied_flags(), "wpk_threads": cpu_threads(),
            "os": platform.platform(),
            "python": platform.python_version(),
            "versions": {"wpk": wpk.__version__, "onnxruntime": onnxruntime.__version__,
                         "onnx": onnx.__version__, "numpy": np.__version__}}


def ort_session(model: onnx.ModelProto, threads: int,
                spinning: bool) -> onnxruntime.InferenceSession:
    """The peer: ORT_ENABLE_ALL, `threads` intra-op threads, spin-waiting as asked.

    Spinning threads keep burning a core after each run, which would slow the wpk
    run that follows in an alternating benchmark; wpk's own onnxruntime sessions
    do not spin by default, so by default the peer does not either (`--ort-spinning`
    to allow, with `--block` so that the next engine's timed runs start after it has
    calmed down, and `--wpk-spin` for wpk's opt-in equivalent, `spin_threads`).
    """
    options = onnxruntime.SessionOptions()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])


def summarize(times: list[float]) -> dict:
    """Median, quartiles, min and max in milliseconds."""
    ms = sorted(t * 1e3 for t in times)
    q1, _, q3 = statistics.quantiles(ms, n=4) if len(ms) > 1 else (ms[0], ms[0], ms[0])
    return {"median_ms": statistics.median(ms), "p25_ms": q1, "p75_ms": q3,
            "min_ms": ms[0], "max_ms": ms[-1], "runs": len(ms)}


def ratio_interval(wpk_times: list[float], ort_times: list[float], rounds: int,
                   confidence: float = 0.95, resamples: int = 2000, seed: int = 0
                   ) -> tuple[float, float]:
    """The `confidence` percentile-bootstrap interval of median(wpk) / median(ort): the
    `rounds` rounds (each engine's block of that round, timed side by side) resampled with
    replacement, so a slow stretch of the machine moves both engines' blocks together."""
    wpk_blocks = np.array_split(np.asarray(wpk_times), rounds)
    ort_blocks = np.array_split(np.asarray(ort_times), rounds)
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(resamples):
        picked = rng.integers(0, rounds, rounds)
        ours = np.concatenate([wpk_blocks[i] for i in picked])
        theirs = np.concatenate([ort_blocks[i] for i in picked])
        ratios.append(np.median(ours) / np.median(theirs))
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def verdict(interval: tuple[float, float]) -> str:
    """'faster' or 'slower' when the interval of wpk/ort excludes 1, else a tie."""
    low, high = interval
    return "faster" if high < 1 else "slower" if low > 1 else "tie within noise"


def step_breakdown(session, feeds: dict, repeats: int) -> list[dict]:
    """Median time of every plan step, each called on its own (`Session.profile`)."""
    return [{**row, "median_ms": row["median_s"] * 1e3}
            for row in session.profile(feeds, repeats=repeats)]


class BatchError(ValueError):
    """--batch asked of a model whose batch dimension is not open."""


def load_benchmark_model(name: str, corpus_size: str = "bench", batch: int | None = None
                         ) -> tuple[onnx.ModelProto, dict, dict]:
    """(model, seeded feeds, input shapes for wpk.build) of a model of `KNOWN_MODELS`;
    with `batch`, a corpus model's open batch dimension set to it (a BatchError where the
    model has no such dimension)."""
    if name.startswith(CORPUS_PREFIX):
        entry = name[len(CORPUS_PREFIX):]
        model = corpus.build_model(entry, corpus_size)
        shapes = corpus.input_shapes(entry, corpus_size)
        if batch is None:
            return model, corpus.random_feeds(entry, corpus_size, seed=0), shapes
        if not _batch_is_open(model):
            raise BatchError(f"{name}: the exporter fixed the batch dimension, --batch needs "
                             "an open one")
        shapes = {key: (batch, *shape[1:]) for key, shape in shapes.items()}
        rng = np.random.default_rng(0)
        return model, {key: rng.standard_normal(shape).astype(np.float32)
                       for key, shape in shapes.items()}, shapes
    if name.endswith(".onnx"):
        return _model_file(name, batch)
    if batch is not None:
        raise BatchError(f"{name}: --batch applies to the corpus_* models and model files "
                         "(open batch dimension) only")
    model = models.load_model(name)
    return model, models.random_inputs(model, seed=0), {}


def _model_file(path: str, batch: int | None) -> tuple[onnx.ModelProto, dict, dict]:
    """A user's model file: its open leading dims at `batch` (default 1), seeded feeds
    (floats standard normal, integers 0-3); a BatchError for any other open dim."""
    model = onnx.load(path)
    rng, feeds, shapes = np.random.default_rng(0), {}, {}
    for value in models.model_inputs(model):
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in tensor.shape.dim]
        if None in dims[1:]:
            raise BatchError(f"{path}: input {value.name!r} has an open dimension past the "
                             "batch; export the model with fixed sizes")
        if dims and dims[0] is None:
            dims[0] = batch or 1
            shapes[value.name] = tuple(dims)
        elif batch is not None and dims and dims[0] != batch:
            raise BatchError(f"{path}: the exporter fixed the batch dimension, --batch "
                             "needs an open one")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[value.name] = (rng.standard_normal(dims).astype(dtype)
                             if np.issubdtype(dtype, np.floating)
                             else rng.integers(0, 4, dims).astype(dtype))
    return model, feeds, shapes


def _batch_is_open(model: onnx.ModelProto) -> bool:
    """Whether every input's first dimension is open: symbolic, unset or paddle's -1."""
    for value in models.model_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if not dims or dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            return False
    return True


@contextmanager
def busy_processes(count: int):
    """`count` processes that each keep a core busy (a Python loop) while the block runs:
    a build on a machine where something else is running."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def bench_model(name: str, rounds: int, warmup: int, threads: int, build_options: dict,
                breakdown: bool, workdir: str, ort_spinning: bool = False,
                block: int = 1, wpk_spin: bool = False, corpus_size: str = "bench",
                fresh_process: bool = False, busy_build: int = 0,
                batch: int | None = None) -> dict:
    """Build model `name` (beside `busy_build` busy processes), check its plan against
    onnxruntime and time both engines in this process (nothing else running); with
    `fresh_process`, time them again in a new process that loads only the saved plan and
    the model (`time_in_fresh_process`); with `batch`, at that batch size."""
    load_before = list(os.getloadavg())  # others' work on a shared machine shows here
    model, feeds, input_shapes = load_benchmark_model(name, corpus_size, batch)
    if input_shapes:
        build_options = {**build_options, "input_shapes": input_shapes}
    started = time.perf_counter()
    with busy_processes(busy_build):
        plan = wpk.build(model, target="cpu", progress=False, **build_options)
    build_s = time.perf_counter() - started
    path = os.path.join(workdir, f"{Path(name).stem}.wpk")
    plan.save(path)
    timing = {"threads": threads, "ort_spinning": ort_spinning, "block": block,
              "rounds": rounds, "warmup": warmup, "wpk_spin": wpk_spin}
    times = time_engines(path, model, feeds, **timing)
    wpk_times, ort_times, error = times["wpk"], times["onnxruntime"], times["relative_l2"]
    fresh = time_in_fresh_process(path, model, feeds, workdir, timing) if fresh_process else None

    steps = plan.steps
    result = {"model": name, "input_shapes": {k: list(v) for k, v in input_shapes.items()},
              "build_s": build_s, "steps": len(steps),
              "fallback_steps": sum(1 for s in steps if s.kind == "fallback"),
              "impl_kinds": _count(s.kind for s in steps),
              "relative_l2_vs_ort": error,
              "wpk": summarize(wpk_times), "onnxruntime": summarize(ort_times),
              "load_average_before_after": [load_before, list(os.getloadavg())],
              "busy_build": busy_build, "machine_load": plan.report.get("machine_load"),
              # what the build's end-to-end check measured and chose (wpk.partition)
              "partition": {k: v for k, v in plan.report.get("partition", {}).items()
                            if k in ("winner", "plan", "ratio", "medians_s", "reason",
                                     "rounds_won", "rounds", "selection_ratio", "confirmed",
                                     "confirmations", "unsteady", "paired")}}
    result.update(compare(wpk_times, ort_times, rounds))
    if fresh is not None:
        result["fresh_process"] = {**compare(fresh["wpk"], fresh["onnxruntime"], rounds),
                                   "wpk": summarize(fresh["wpk"]),
                                   "onnxruntime": summarize(fresh["onnxruntime"]),
                                   "relative_l2_vs_ort": fresh["relative_l2"],
                                   "pid": fresh["pid"]}
    if result["partition"].get("winner") == "onnxruntime":   # the same engine twice
        for timed in [result, *([result["fresh_process"]] if fresh is not None else [])]:
            timed["verdict"] = WHOLE_MODEL
    if breakdown:
        result["breakdown"] = step_breakdown(wpk.load(path, spin_threads=wpk_spin), feeds,
                                             repeats=max(5, rounds // 2))
        if name.startswith(CORPUS_PREFIX):
            result["ort_breakdown"] = ort_op_breakdown(model, feeds, threads, ort_spinning,
                                                       max(5, rounds // 2), workdir)
    return result


def compare(wpk_times: list[float], ort_times: list[float], rounds: int) -> dict:
    """The ratio of medians wpk/ort, its 95% interval and the verdict."""
    interval = ratio_interval(wpk_times, ort_times, rounds)
    return {"ratio_wpk_over_ort": statistics.median(wpk_times) / statistics.median(ort_times),
            "ratio_interval_95": interval, "verdict": verdict(interval)}


def time_engines(plan_path: str, model: onnx.ModelProto, feeds: dict, threads: int,
                 ort_spinning: bool, block: int, rounds: int, warmup: int,
                 wpk_spin: bool = False) -> dict:
    """Load the plan at `plan_path` and onnxruntime's session of `model`, check the plan's
    outputs against it, warm both up and time them in swapping blocks (`time_swapping`):
    {"wpk": seconds, "onnxruntime": seconds, "relative_l2": worst output's error}."""
    session = wpk.load(plan_path, spin_threads=wpk_spin)
    ort = ort_session(model, threads, ort_spinning)
    names = [o.name for o in ort.get_outputs()]
    ours = session.run(feeds)
    theirs = dict(zip(names, ort.run(names, feeds)))
    error = max(relative_l2(ours[n], theirs[n]) for n in names)
    for _ in range(warmup):
        session.run(feeds)
        ort.run(names, feeds)
    wpk_times, ort_times = time_swapping(
        [lambda: session.run(feeds), lambda: ort.run(names, feeds)], rounds, block)
    return {"wpk": wpk_times, "onnxruntime": ort_times, "relative_l2": error}


def _time_saved_engines(plan_path: str, model_path: str, feeds_path: str, timing_path: str,
                        out_path: str) -> None:
    """`time_engines` on a plan, model, feeds and settings read from files, the times
    written to `out_path` as JSON (a fresh process's job)."""
    with np.load(feeds_path) as saved:
        feeds = {name: saved[name] for name in saved.files}
    timing = json.loads(Path(timing_path).read_text())
    times = time_engines(plan_path, onnx.load(model_path), feeds, **timing)
    Path(out_path).write_text(json.dumps({**times, "pid": os.getpid()}))


def time_in_fresh_process(plan_path: str, model: onnx.ModelProto, feeds: dict,
                          workdir: str, timing: dict) -> dict:
    """`time_engines` in a new Python process that loads only the saved plan, the model and
    the feeds: what a user's program that deploys the plan sees, without what the build
    left in this process (its tuning's compiled kernels, sessions and heap)."""
    files = {kind: os.path.join(workdir, f"fresh-process-{kind}")
             for kind in ("model.onnx", "feeds.npz", "timing.json", "times.json")}
    onnx.save(model, files["model.onnx"])
    np.savez(files["feeds.npz"], **feeds)
    Path(files["timing.json"]).write_text(json.dumps(timing))
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; import bench_e2e; "
            "bench_e2e._time_saved_engines(*sys.argv[3:])")
    subprocess.run([sys.executable, "-c", code, str(REPO), str(Path(__file__).parent),
                    plan_path, *files.values()], check=True)
    return json.loads(Path(files["times.json"]).read_text())


def ort_op_breakdown(model: onnx.ModelProto, feeds: dict, threads: int, spinning: bool,
                     runs: int, workdir: str) -> list[dict]:
    """onnxruntime's kernel time per operator type, in ms per run, largest first: the sum
    over its nodes of each node's median time in `runs` runs (its profiler, in a separate
    session with the benchmark's settings; profiling adds a little to every node)."""
    options = onnxruntime.SessionOptions()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(workdir, "ort-profile")
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    for _ in range(runs + 1):
        session.run(None, feeds)
    with open(session.end_profiling()) as handle:
        events = json.load(handle)
    run_starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    steady_from = run_starts[1] if len(run_starts) > 1 else 0  # the first run warms up
    per_node: dict[tuple[str, str], list[float]] = {}
    for event in events:
        if (event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time")
                and event["ts"] >= steady_from):
            key = (event["args"]["op_name"], event["name"])
            per_node.setdefault(key, []).append(event["dur"])
    by_op: dict[str, list[float]] = {}
    for (op, _), durations in per_node.items():  # a node's median: preemptions drop out
        by_op.setdefault(op, []).append(statistics.median(durations) / 1e3)
    rows = [{"op": op, "nodes": len(medians), "ms_per_run": sum(medians)}
            for op, medians in by_op.items()]
    return sorted(rows, key=lambda r: -r["ms_per_run"])


BLOCK_PAUSE_S = 0.3   # onnxruntime's threads were seen spinning for about 3 runs after one


def timed_block(call, block: int) -> list[float]:
    """Seconds of `block` consecutive calls; with `block` > 1, after a pause of
    BLOCK_PAUSE_S, and the first call untimed, so what the other engine left running
    (onnxruntime's spinning threads) does not land on them."""
    times = []
    if block > 1:
        time.sleep(BLOCK_PAUSE_S)  # the other engine's spinning threads go back to sleep
    for index in range(block):
        start = time.perf_counter()
        call()
        if block == 1 or index > 0:
            times.append(time.perf_counter() - start)
    return times


def time_swapping(calls, rounds: int, block: int) -> list[list[float]]:
    """Each call's `timed_block` times over `rounds` rounds, the order of the calls
    reversed every other round, so no engine always goes first."""
    times: list[list[float]] = [[] for _ in calls]
    order = list(range(len(calls)))
    for index in range(rounds):
        for which in order if index % 2 == 0 else order[::-1]:
            times[which] += timed_block(calls[which], block)
    return times


def _count(values) -> dict:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def markdown_table(results: list[dict], threads: int) -> str:
    lines = [f"| model | wpk build (s) | wpk median ms (p25-p75) | onnxruntime median ms "
             f"(p25-p75), {threads} threads | wpk/ort | 95% interval | verdict "
             "| wpk/ort of the fastest runs | fallback steps | rel. L2 vs ort |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in results:
        lines.append(_table_row(r, r["model"], f"{r['build_s']:.1f}", r))
        if "fresh_process" in r:
            lines.append(_table_row(r["fresh_process"], f"{r['model']} (fresh process)", "-",
                                    r))
    return "\n".join(lines)


def summary_text(results: list[dict]) -> str:
    """The run in one line: the geometric mean of wpk/ort over every model, and how many of
    wpk's own plans were faster, tied or slower (their 95% intervals), how many builds kept
    onnxruntime's whole model, and the fallback steps of all plans."""
    if not results:
        return "no models"
    ratios = [r["ratio_wpk_over_ort"] for r in results]
    geomean = statistics.geometric_mean(ratios)
    verdicts = [r.get("verdict", "-") for r in results]
    own = [v for v in verdicts if v != WHOLE_MODEL]
    fallback = sum(r["fallback_steps"] for r in results)
    return (f"{len(results)} models: geometric mean wpk/ort {geomean:.2f}x; of {len(own)} wpk "
            f"plans {own.count('faster')} faster, {own.count('tie within noise')} ties, "
            f"{own.count('slower')} slower (95% intervals); {len(verdicts) - len(own)} builds "
            f"kept onnxruntime's whole model; {fallback} fallback steps")


def print_table(path: str | Path) -> None:
    """The markdown table and the summary line of an earlier run's results JSON."""
    report = json.loads(Path(path).read_text())
    print(markdown_table(report["results"], report["threads"]))
    print()
    print(summary_text(report["results"]))


def _table_row(timed: dict, label: str, build: str, result: dict) -> str:
    """One row of `markdown_table`: the timings in `timed`, the plan's facts in `result`."""
    w, o = timed["wpk"], timed["onnxruntime"]
    return (f"| {label} | {build} | {w['median_ms']:.2f} "
            f"({w['p25_ms']:.2f}-{w['p75_ms']:.2f}) | {o['median_ms']:.2f} "
            f"({o['p25_ms']:.2f}-{o['p75_ms']:.2f}) | {timed['ratio_wpk_over_ort']:.2f} "
            f"| {_interval_text(timed)} | {timed.get('verdict', '-')} "
            f"| {w['min_ms'] / o['min_ms']:.2f} "
            f"| {result['fallback_steps']}/{result['steps']} "
            f"| {timed['relative_l2_vs_ort']:.1e} |")


def _interval_text(result: dict) -> str:
    interval = result.get("ratio_interval_95")   # absent in results of older runs
    return "-" if interval is None else f"{interval[0]:.2f}-{interval[1]:.2f}"


def breakdown_text(result: dict, top: int) -> str:
    rows = result["breakdown"]
    total = sum(r["median_ms"] for r in rows) or 1.0
    by_op: dict[str, list[float]] = {}
    for r in rows:
        by_op.setdefault(f"{r['op']} [{r['kind']}]", []).append(r["median_ms"])
    lines = [f"\n### {result['model']}: where the time goes (sum of steps {total:.2f} ms, "
             f"end to end {result['wpk']['median_ms']:.2f} ms)", "",
             "| op [kind] | steps | total ms | share |", "| --- | ---: | ---: | ---: |"]
    for op, times in sorted(by_op.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"| {op} | {len(times)} | {sum(times):.3f} | {sum(times) / total:.1%} |")
    by_impl: dict[str, list[float]] = {}
    for r in rows:
        by_impl.setdefault(r["impl"], []).append(r["median_ms"])
    lines += ["", "| implementation | steps | total ms | share |", "| --- | ---: | ---: | ---: |"]
    for impl, times in sorted(by_impl.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"| {impl} | {len(times)} | {sum(times):.3f} | {sum(times) / total:.1%} |")
    if result.get("ort_breakdown"):
        ort_rows = result["ort_breakdown"]
        ort_total = sum(r["ms_per_run"] for r in ort_rows) or 1.0
        lines += ["", f"onnxruntime per operator type (profiler, after its fusions; kernels "
                  f"{ort_total:.2f} ms, end to end {result['onnxruntime']['median_ms']:.2f} ms)",
                  "", "| onnxruntime op | nodes | ms per run | share |",
                  "| --- | ---: | ---: | ---: |"]
        for r in ort_rows[:top]:
            lines.append(f"| {r['op']} | {r['nodes']} | {r['ms_per_run']:.3f} | "
                         f"{r['ms_per_run'] / ort_total:.1%} |")
    lines += ["", "| step | op | implementation | ms |", "| --- | --- | --- | ---: |"]
    for r in sorted(rows, key=lambda r: -r["median_ms"])[:top]:
        lines.append(f"| {r['node']} | {r['op']} | {r['impl']} | {r['median_ms']:.3f} |")
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def model_names(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The comma-separated model names of `--models` ("corpus" stands for every
    `corpus_<architecture>_<exporter>`, a name ending in .onnx for that file); a parser
    error for unknown ones."""
    names = []
    for name in (n.strip() for n in text.split(",")):
        if name:
            names += list(CORPUS_MODELS) if name == "corpus" else [name]
    unknown = [n for n in names if n not in KNOWN_MODELS
               and not (n.endswith(".onnx") and os.path.isfile(n))]
    if unknown:
        parser.error(f"unknown model(s) or missing file(s) {', '.join(unknown)}; "
                     f"known: {', '.join(KNOWN_MODELS)}, corpus (all corpus_*), "
                     "or PATH.onnx")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated; known: {', '.join(KNOWN_MODELS)}; "
                             "corpus: every corpus_* model; PATH.onnx: a model file (open "
                             "batch dimension at --batch or 1)")
    parser.add_argument("--corpus-size", choices=corpus.SIZES, default="bench",
                        help="size of the corpus_* models (default bench; ci: the tests' size)")
    parser.add_argument("--batch", type=_positive, default=None, metavar="N",
                        help="corpus_* models and model files at batch N (their batch "
                             "dimension open; default 1)")
    parser.add_argument("--rounds", type=int, default=20, help="timed A/B rounds per model")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="onnxruntime intra-op threads (default: cores)")
    parser.add_argument("--search", default="none", help="wpk build --search (default none)")
    parser.add_argument("--ort-spinning", action="store_true",
                        help="let onnxruntime's threads spin-wait (its default; off here)")
    parser.add_argument("--block", type=int, default=1,
                        help="consecutive runs per engine per round; when > 1, after a "
                             f"{BLOCK_PAUSE_S} s pause and the first untimed (default 1: "
                             "strict alternation)")
    parser.add_argument("--wpk-spin", action="store_true",
                        help="load plans with spin_threads=True (wpk's opt-in spinning)")
    parser.add_argument("--fresh-process", action="store_true",
                        help="also time both engines in a new process that loads only the "
                             "saved plan and the model, as a deployment would")
    parser.add_argument("--busy-build", type=int, default=0, metavar="N",
                        help="build each plan beside N processes that keep a core busy each "
                             "(then time it with nothing else running): a build on a busy "
                             "machine")
    parser.add_argument("--breakdown", action="store_true", help="time every plan step")
    parser.add_argument("--top", type=int, default=12, help="rows in the breakdown tables")
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--no-save", action="store_true", help="print only, write no JSON")
    parser.add_argument("--table", metavar="FILE.json",
                        help="print the table and summary of an earlier run's JSON and stop")
    args = parser.parse_args(argv)
    if args.table:
        try:
            print_table(args.table)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: --table {args.table}: {exc} (hint: pass a results JSON this script "
                  "wrote)", file=sys.stderr)
            return 2
        return 0

    names = model_names(parser, args.models)
    build_options = {"search": args.search}
    results = []
    load_at_start = list(os.getloadavg())  # others' work on a shared machine shows here
    with tempfile.TemporaryDirectory(prefix="wpk-bench-") as workdir:
        for name in names:
            print(f"{name}: building and timing ...", file=sys.stderr, flush=True)
            try:
                results.append(bench_model(name, args.rounds, args.warmup, args.threads,
                                           build_options, args.breakdown, workdir,
                                           args.ort_spinning, max(1, args.block),
                                           args.wpk_spin, args.corpus_size,
                                           args.fresh_process, args.busy_build, args.batch))
            except BatchError as exc:
                print(f"error: {exc} (hint: leave it out of --models, or drop --batch)",
                      file=sys.stderr)
                return 2

    report = {"benchmark": "e2e", "date": datetime.datetime.now(datetime.UTC).isoformat(),
              "method": f"{args.warmup} warm-up rounds, then {args.rounds} rounds alternating "
                        "wpk and onnxruntime in one process (the order swapping every round), "
                        f"{args.block} run(s) of each per "
                        f"round (when more than one: a {BLOCK_PAUSE_S} s pause before a block "
                        "and its first run untimed); medians and quartiles"
                        + ("; then the same in a fresh process that loads only the saved plan "
                           "and the model" if args.fresh_process else ""),
              "block": args.block, "fresh_process": args.fresh_process,
              "busy_build": args.busy_build,
              "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
              "threads": args.threads, "ort_spinning": args.ort_spinning,
              "wpk_spin_threads": args.wpk_spin,
              "build_options": build_options,
              "corpus_size": args.corpus_size, "batch": args.batch,
              "machine": {**machine_description(), "load_average_at_start": load_at_start},
              "results": results}
    report["machine"]["load_average_at_end"] = list(os.getloadavg())
    report["summary"] = summary_text(results)
    print(markdown_table(results, args.threads))
    print()
    print(report["summary"])
    if args.breakdown:
        for result in results:
            print(breakdown_text(result, args.top))
    if not args.no_save:
        prefix = ("e2e" + ("-corpus" if any(n in CORPUS_MODELS for n in names) else "")
                  + ("-ort-spinning" if args.ort_spinning else "")
                  + ("-wpk-spin" if args.wpk_spin else "")
                  + (f"-busy-build-{args.busy_build}" if args.busy_build else "")
                  + (f"-batch-{args.batch}" if args.batch else ""))
        write_results(report, prefix, args.results_dir)
    return 0


def write_results(report: dict, prefix: str, results_dir: str | Path) -> Path:
    """Write a benchmark report to RESULTS_DIR/PREFIX-<date>-<host>.json, or, when a run of
    that day is there already, to PREFIX-<date>-<host>-2.json, -3, ...: an earlier result
    is never overwritten (the README cites them by name)."""
    out_dir = Path(results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{prefix}-{datetime.date.today().isoformat()}-{report['machine']['host']}"
    path, number = out_dir / f"{stem}.json", 1
    while path.exists():
        number += 1
        path = out_dir / f"{stem}-{number}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}", file=sys.stderr)
    return path


if __name__ == "__main__":
    sys.exit(main())
