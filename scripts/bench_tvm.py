#!/usr/bin/env python
"""End-to-end benchmark: wpk plans against Apache TVM and onnxruntime on whole models (CPU).

For each model: wpk's plan (`wpk.build`, `--search` as given, untuned by default), TVM's
module (its Relax ONNX importer, MetaSchedule tuning of `--tvm-trials` trials over the
model's tasks, `tvm.compile` for this CPU: LLVM with the host's `-mcpu` and `--threads`
cores) and onnxruntime's session (ORT_ENABLE_ALL, its default threading, spinning on).
Each engine's outputs are checked against onnxruntime's; then the three are timed in
swapping blocks as `bench_e2e.py --ort-spinning --block 10` times two (each engine's block
after a pause, its first run untimed, the order reversed every round), and the table gives
each engine's median with wpk/TVM and wpk/onnxruntime and their 95% intervals (rounds
resampled). The build and tuning time of wpk and of TVM are in the table too: TVM's
MetaSchedule compiles and runs every trial with LLVM, so its trials cost seconds each on
a small machine.

    python scripts/bench_tvm.py                                     # 2 models, 8 trials/task
    python scripts/bench_tvm.py --models mobilenet_v2_like --tvm-trials-per-task 32
    python scripts/bench_tvm.py --models light_resnet50 --search ga --budget 600
    python scripts/bench_tvm.py --tvm-trials 0                      # TVM untuned
    python scripts/bench_tvm.py --models corpus --coverage --corpus-size ci   # which run
    python scripts/bench_tvm.py --table benchmarks/results/tvm-....json   # an earlier run

`--tvm-trials 0` is TVM without tuning: its default CPU pipeline leaves the operators
unscheduled (no threads, no tiling), which is not how TVM is meant to be deployed; the
tuned figures are the comparison. `--tvm-db-dir` keeps TVM's tuning records so that a
rerun applies them without tuning again (as `--db-dir` does for wpk's). TVM runs on
`TVM_NUM_THREADS` = `--threads` threads. Needs the `bench` extra (`pip install -e
".[bench]"`: apache-tvm, its FFI and MetaSchedule's xgboost cost model). Writes
benchmarks/results/tvm-<date>-<host>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bench_e2e as e2e  # noqa: E402
import numpy as np  # noqa: E402

import wpk  # noqa: E402
from wpk.core.numerics import relative_l2  # noqa: E402

DEFAULT_MODELS = ("mobilenet_v2_like", "transformer_encoder")
ENGINES = ("wpk", "tvm", "onnxruntime")
MATCH_L2 = 1e-4   # relative L2 distance to onnxruntime's outputs that counts as a match


def tvm_module(model, feeds: dict, trials: int, trials_per_task: int, threads: int,
               work_dir: str, on_stage=lambda stage: None):
    """A call that runs `model` with TVM on `feeds`, and the seconds its import and tuning
    and its compile took, with the count of tuning records in `work_dir`: the Relax ONNX
    importer (weights bound as constants), MetaSchedule over the model's tasks (`trials`
    in all, at most `trials_per_task` each; none with 0, then the records already in
    `work_dir` only) and `tvm.compile` for this CPU; `on_stage` hears "compile" when the
    import and tuning are done."""
    os.environ["TVM_NUM_THREADS"] = str(threads)   # read when TVM's thread pool starts
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.target import codegen

    target = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(),
                                "num-cores": threads})
    started = time.perf_counter()
    module = from_onnx(model, shape_dict={name: value.shape for name, value in feeds.items()},
                       keep_params_in_input=False)
    module = relax.pipeline.static_shape_tuning_pipeline(
        total_trials=trials, target=target, work_dir=work_dir,
        max_trials_per_task=trials_per_task)(module)
    tuned_s = time.perf_counter() - started
    on_stage("compile")
    machine = relax.VirtualMachine(tvm.compile(module, target=target), tvm.cpu())
    inputs = [tvm.runtime.tensor(feeds[i.name]) for i in model.graph.input if i.name in feeds]
    main = machine["main"]
    records = Path(work_dir) / "database_tuning_record.json"
    return (lambda: main(*inputs)), {
        "tune_s": tuned_s, "compile_s": time.perf_counter() - started - tuned_s,
        "tuning_records": len(records.read_text().splitlines()) if records.exists() else 0,
        "tvm_version": tvm.__version__}


def tvm_coverage(name: str, corpus_size: str, threads: int, work_dir: str) -> dict:
    """Whether TVM takes model `name`: its importer, an untuned compile and one run whose
    outputs are compared with onnxruntime's. {"model", "stage" (how far it got: "import",
    "compile", "run", "ran"), "relative_l2_vs_ort" when it ran, "error" when not}."""
    model, feeds, _ = e2e.load_benchmark_model(name, corpus_size)
    row = {"model": name, "stage": "import"}
    try:
        run_tvm, _ = tvm_module(model, feeds, 0, 0, threads, work_dir,
                                on_stage=lambda stage: row.update(stage=stage))
        row["stage"] = "run"
        outputs = tvm_outputs(run_tvm())
    except Exception as exc:   # what a user of TVM would see for this model
        return {**row, "error": _error_text(exc)}
    reference = e2e.ort_session(model, threads, spinning=False).run(None, feeds)
    return {**row, "stage": "ran",
            "relative_l2_vs_ort": max(relative_l2(o, r) for o, r in zip(outputs, reference))}


def _error_text(exc: Exception) -> str:
    """An exception's type and the first line of its message, at most 300 characters."""
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def tvm_outputs(result) -> list[np.ndarray]:
    """The numpy arrays of what TVM's `main` returned (one tensor or a tuple of them)."""
    return [result.numpy()] if hasattr(result, "numpy") else [item.numpy() for item in result]


def bench_model(name: str, args, workdir: str) -> dict:
    """Build, import and tune model `name` for wpk and TVM, check both against onnxruntime
    and time the three engines in swapping blocks."""
    model, feeds, input_shapes = e2e.load_benchmark_model(name)
    build_options = {"search": args.search,
                     **({"budget": args.budget} if args.budget else {}),
                     **({"input_shapes": input_shapes} if input_shapes else {}),
                     **({"db": str(Path(args.db_dir) / f"{name}.jsonl")} if args.db_dir else {})}
    started = time.perf_counter()
    plan = wpk.build(model, target="cpu", progress=False, **build_options)
    build_s = time.perf_counter() - started
    plan_path = os.path.join(workdir, f"{name}.wpk")
    plan.save(plan_path)
    session = wpk.load(plan_path)
    ort = e2e.ort_session(model, args.threads, spinning=True)
    names = [o.name for o in ort.get_outputs()]
    reference = ort.run(names, feeds)
    result = {"model": name, "wpk_build_s": build_s, "steps": len(plan.steps),
              "relative_l2_vs_ort": {
                  "wpk": max(relative_l2(session.run(feeds)[n], r)
                             for n, r in zip(names, reference))}}
    calls = {"wpk": lambda: session.run(feeds), "onnxruntime": lambda: ort.run(names, feeds)}
    db_dir = Path(args.tvm_db_dir) if args.tvm_db_dir else Path(workdir)
    try:
        run_tvm, tvm_facts = tvm_module(model, feeds, args.tvm_trials, args.tvm_trials_per_task,
                                        args.threads, str(db_dir / f"tvm-{name}"))
        outputs = tvm_outputs(run_tvm())
        result["tvm"] = tvm_facts
        result["relative_l2_vs_ort"]["tvm"] = max(relative_l2(o, r)
                                                  for o, r in zip(outputs, reference))
        calls["tvm"] = run_tvm
    except Exception as exc:   # TVM's importer or tuner failed on this model: say so, go on
        result["tvm"] = {"error": _error_text(exc),
                         "traceback_tail": traceback.format_exc().splitlines()[-3:]}
    timed = [engine for engine in ENGINES if engine in calls]
    for _ in range(args.warmup):
        for engine in timed:
            calls[engine]()
    times = dict(zip(timed, e2e.time_swapping([calls[e] for e in timed], args.rounds,
                                              args.block)))
    result["timings"] = {engine: e2e.summarize(t) for engine, t in times.items()}
    for peer in ("tvm", "onnxruntime"):
        if peer in times:
            result[f"wpk_over_{peer}"] = compared(times["wpk"], times[peer], args.rounds)
    return result


def compared(wpk_times: list[float], peer_times: list[float], rounds: int) -> dict:
    """{"ratio": median(wpk) / median(peer), "ratio_interval_95", "verdict"}
    (`bench_e2e.compare` for any peer)."""
    result = e2e.compare(wpk_times, peer_times, rounds)
    return {"ratio": result.pop("ratio_wpk_over_ort"), **result}


def markdown_table(results: list[dict], threads: int) -> str:
    """One row per model: build and tuning times, each engine's median, the two ratios."""
    lines = [f"| model | wpk build (s) | TVM tune + compile (s) | wpk ms | TVM ms | "
             f"onnxruntime ms, {threads} threads | wpk/TVM (95% interval) | "
             "wpk/onnxruntime (95% interval) | rel. L2 vs ort: wpk, TVM |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        t = r["timings"]
        tvm = r["tvm"]
        tvm_time = ("failed: " + tvm["error"][:80] if "error" in tvm
                    else f"{tvm['tune_s']:.0f} + {tvm['compile_s']:.0f}")
        errors = r["relative_l2_vs_ort"]
        lines.append("| " + " | ".join([
            r["model"], f"{r['wpk_build_s']:.1f}", tvm_time,
            f"{t['wpk']['median_ms']:.2f}",
            f"{t['tvm']['median_ms']:.2f}" if "tvm" in t else "-",
            f"{t['onnxruntime']['median_ms']:.2f}",
            _ratio_text(r.get("wpk_over_tvm")), _ratio_text(r.get("wpk_over_onnxruntime")),
            ", ".join(f"{errors[e]:.1e}" for e in ("wpk", "tvm") if e in errors)]) + " |")
    return "\n".join(lines)


def _ratio_text(ratio: dict | None) -> str:
    if ratio is None:
        return "-"
    low, high = ratio["ratio_interval_95"]
    return f"{ratio['ratio']:.2f} ({low:.2f}-{high:.2f})"


def summary_text(results: list[dict]) -> str:
    """The geometric means of wpk/TVM and wpk/onnxruntime over the models TVM ran."""
    ran = [r for r in results if "wpk_over_tvm" in r]
    if not ran:
        return f"{len(results)} models; TVM ran none of them"
    mean = {peer: statistics.geometric_mean(r[f"wpk_over_{peer}"]["ratio"]
                                            for r in ran) for peer in ("tvm", "onnxruntime")}
    return (f"{len(results)} models, TVM ran {len(ran)}: geometric mean wpk/TVM "
            f"{mean['tvm']:.2f}x, wpk/onnxruntime {mean['onnxruntime']:.2f}x")


def coverage_table(rows: list[dict]) -> str:
    """One row per model: how far TVM got with it, its error or its outputs' error."""
    lines = ["| model | TVM runs it | rel. L2 vs ort, or TVM's error |", "| --- | --- | --- |"]
    for r in rows:
        outcome = (f"{r['relative_l2_vs_ort']:.1e}" if r["stage"] == "ran"
                   else f"at {r['stage']}: " + r["error"].replace("|", "/"))
        lines.append(f"| {r['model']} | {'yes' if r['stage'] == 'ran' else 'no'} | {outcome} |")
    ran = [r for r in rows if r["stage"] == "ran"]
    matched = sum(r["relative_l2_vs_ort"] < MATCH_L2 for r in ran)
    return "\n".join(lines) + (f"\n\nTVM ran {len(ran)} of {len(rows)} models, {matched} "
                               f"of them within {MATCH_L2:g} of onnxruntime's outputs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated; known: {', '.join(e2e.KNOWN_MODELS)}")
    parser.add_argument("--search", default="none", help="wpk build --search (default none)")
    parser.add_argument("--budget", type=float, default=None,
                        help="wpk build --budget in seconds (with --search)")
    parser.add_argument("--db-dir", help="wpk's tuning records, one file per model")
    parser.add_argument("--tvm-trials-per-task", type=int, default=8,
                        help="MetaSchedule trials per task (default 8)")
    parser.add_argument("--tvm-trials", type=int, default=None,
                        help="MetaSchedule trials in all (default: trials per task x the "
                             "model's tasks, at most 64 tasks; 0: no tuning)")
    parser.add_argument("--tvm-db-dir", help="TVM's tuning records, one folder per model "
                                             "(reused by later runs)")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per model")
    parser.add_argument("--block", type=int, default=10,
                        help="consecutive runs per engine per round (as bench_e2e.py --block)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="threads of every engine (default: cores)")
    parser.add_argument("--coverage", action="store_true",
                        help="only check which models TVM imports, compiles (untuned) and "
                             "runs to onnxruntime's outputs (no wpk build, no timing)")
    parser.add_argument("--corpus-size", choices=e2e.corpus.SIZES, default="bench",
                        help="size of the corpus_* models (as bench_e2e.py)")
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--no-save", action="store_true", help="print only, write no JSON")
    parser.add_argument("--table", metavar="FILE.json",
                        help="print the table of an earlier run's JSON and stop")
    args = parser.parse_args(argv)
    if args.table:
        report = json.loads(Path(args.table).read_text())
        if report["benchmark"] == "tvm-coverage":
            print(coverage_table(report["results"]))
            return 0
        print(markdown_table(report["results"], report["threads"]))
        print()
        print(summary_text(report["results"]))
        return 0
    names = e2e.model_names(parser, args.models)
    if args.coverage:
        return coverage(names, args, argv)
    if args.tvm_trials is None:
        args.tvm_trials = args.tvm_trials_per_task * 64
    results = []
    with tempfile.TemporaryDirectory(prefix="wpk-bench-tvm-") as workdir:
        for name in names:
            print(f"{name}: building, tuning TVM and timing ...", file=sys.stderr, flush=True)
            results.append(bench_model(name, args, workdir))
    report = {**_report_head("tvm", argv),
              "method": f"{args.warmup} warm-up rounds, then {args.rounds} rounds timing wpk, "
                        f"TVM and onnxruntime in turn in one process (the order reversed every "
                        f"round), {args.block} runs of each per round after a "
                        f"{e2e.BLOCK_PAUSE_S} s pause, the first untimed; medians, quartiles, "
                        "ratios with 95% bootstrap intervals (rounds resampled)",
              "threads": args.threads, "search": args.search, "budget": args.budget,
              "tvm_trials": args.tvm_trials, "tvm_trials_per_task": args.tvm_trials_per_task,
              "results": results}
    report["summary"] = summary_text(results)
    print(markdown_table(results, args.threads))
    print()
    print(report["summary"])
    if not args.no_save:
        e2e.write_results(report, "tvm", args.results_dir)
    return 0


def _report_head(benchmark: str, argv: list[str] | None) -> dict:
    """The fields every report of this script starts with: its kind, date, command line
    and the machine's description."""
    return {"benchmark": benchmark, "date": datetime.datetime.now(datetime.UTC).isoformat(),
            "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
            "machine": e2e.machine_description()}


def coverage(names: list[str], args, argv: list[str] | None) -> int:
    """`--coverage`: `tvm_coverage` of each model, a table and a JSON of the outcomes."""
    with tempfile.TemporaryDirectory(prefix="wpk-bench-tvm-") as workdir:
        rows = []
        for name in names:
            print(f"{name}: importing, compiling and running with TVM ...", file=sys.stderr,
                  flush=True)
            rows.append(tvm_coverage(name, args.corpus_size, args.threads,
                                     os.path.join(workdir, name)))
    import tvm

    report = {**_report_head("tvm-coverage", argv), "corpus_size": args.corpus_size,
              "tvm_version": tvm.__version__, "results": rows}
    print(coverage_table(rows))
    if not args.no_save:
        e2e.write_results(report, "tvm-coverage", args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
