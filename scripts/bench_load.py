#!/usr/bin/env python
"""Time to a ready session and to the first result in a fresh process: `wpk.load(plan)`
against onnxruntime's `InferenceSession(model)` at its defaults, then each one's first and
second run on the same random inputs.

For each model the plan is built once (untuned, default options) into `--dir`, next to
the ONNX model onnxruntime loads; then `--rounds` pairs of fresh Python processes, the
two engines alternating, each timing its imports plus the load (interpreter start-up
is left out of both), its first run (what a server's first request waits for on top of
the load) and its second, and reporting its peak resident memory and page faults.

Both engines import from compiled bytecode, as an installed package does: the probes run
with `PYTHONPYCACHEPREFIX` set to a folder of this run (and PYTHONDONTWRITEBYTECODE
cleared), after one untimed probe of each engine fills it. A checkout run with
PYTHONDONTWRITEBYTECODE set (as some sandboxes do) otherwise compiles every one of wpk's
modules from source in each fresh process while onnxruntime's wheel brings its bytecode.

    python scripts/bench_load.py --models light_vgg19,light_resnet50 --rounds 5
    python scripts/bench_load.py --models light_vgg19 --dir /tmp/plans --json out.json

Writes benchmarks/results/load-<date>-<host>.json unless `--no-save`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import onnx  # noqa: E402
from bench_e2e import load_benchmark_model, machine_description, model_names, write_results  # noqa: E402

import wpk  # noqa: E402

# One fresh process: imports and load timed together, then the first and the second run
# on the same seeded inputs (`argv[3]`: the plan's inputs as JSON [name, shape, dtype]),
# then peak memory and page faults.
_PROBE = """
import json, resource, sys, time
start = time.perf_counter()
if sys.argv[1] == "wpk":
    import wpk
    session = wpk.load(sys.argv[2])
    run = session.run
else:
    import onnxruntime
    session = onnxruntime.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
    run = lambda feeds: session.run(None, feeds)
seconds = time.perf_counter() - start
import numpy
rng = numpy.random.default_rng(0)
feeds = {name: rng.standard_normal(shape).astype(dtype)
         for name, shape, dtype in json.loads(sys.argv[3])}
runs = []
for _ in range(2):
    began = time.perf_counter()
    run(feeds)
    runs.append(time.perf_counter() - began)
usage = resource.getrusage(resource.RUSAGE_SELF)
with open("/proc/self/status") as status:   # ru_maxrss would count the parent's at fork
    peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "first_run_s": runs[0], "second_run_s": runs[1],
                  "peak_mb": peak_kb / 1024, "minor_faults": usage.ru_minflt,
                  "system_s": usage.ru_stime, "onnx_imported": "onnx" in sys.modules,
                  "bytecode_cached": bool(sys.pycache_prefix) and not sys.dont_write_bytecode}))
"""


def bytecode_env(prefix: Path) -> dict[str, str]:
    """The probes' environment: bytecode read from and written to `prefix` (module
    docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(prefix)
    return env


def _probe(engine: str, path: Path, inputs: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, engine, str(path), inputs],
                          check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def plan_inputs(plan_path: Path) -> str:
    """The plan's inputs as the probe reads them: JSON [[name, shape, dtype], ...]."""
    from wpk.plans.planfile import read_plan

    plan = read_plan(plan_path)
    return json.dumps([[e["name"], list(e["shape"]), e["dtype"]] for e in plan.inputs])


def prepared_files(name: str, folder: Path) -> tuple[Path, Path, float | None]:
    """(plan, ONNX model, build seconds or None when the plan was there already)."""
    plan_path, model_path = folder / f"{name}.wpk", folder / f"{name}.onnx"
    build_s = None
    if not plan_path.exists() or not model_path.exists():
        model, _, shapes = load_benchmark_model(name)
        onnx.save(model, model_path)
        options = {"input_shapes": shapes} if shapes else {}
        started = time.perf_counter()
        plan = wpk.build(model, target="cpu", progress=False, **options)
        build_s = time.perf_counter() - started
        plan.save(plan_path)
    return plan_path, model_path, build_s


def summary(samples: list[dict]) -> dict:
    """Medians of a list of probe results (numbers; other fields as the first has them)."""
    return {key: statistics.median(s[key] for s in samples)
            if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            for key, value in samples[0].items()}


def _ms(medians: dict) -> str:
    return f"{1e3 * medians['first_run_s']:.1f} / {1e3 * medians['second_run_s']:.1f}"


def bench_load(name: str, folder: Path, rounds: int, env: dict[str, str]) -> dict:
    plan_path, model_path, build_s = prepared_files(name, folder)
    inputs = plan_inputs(plan_path)
    _probe("wpk", plan_path, inputs, env)   # untimed: bytecode written, caches filled
    _probe("ort", model_path, inputs, env)
    wpk_runs, ort_runs = [], []
    for _ in range(rounds):
        wpk_runs.append(_probe("wpk", plan_path, inputs, env))
        ort_runs.append(_probe("ort", model_path, inputs, env))
    ratios = [w["seconds"] / o["seconds"] for w, o in zip(wpk_runs, ort_runs)]
    result = {"model": name, "plan_mb": plan_path.stat().st_size / 2**20, "build_s": build_s,
              "wpk": summary(wpk_runs), "ort": summary(ort_runs),
              "ratio_median": statistics.median(ratios), "ratios": ratios,
              "wpk_runs": wpk_runs, "ort_runs": ort_runs}
    print(f"| {name} | {result['plan_mb']:.0f} | {result['wpk']['seconds']:.2f} "
          f"({min(r['seconds'] for r in wpk_runs):.2f}-{max(r['seconds'] for r in wpk_runs):.2f})"
          f" | {result['ort']['seconds']:.2f} "
          f"({min(r['seconds'] for r in ort_runs):.2f}-{max(r['seconds'] for r in ort_runs):.2f})"
          f" | {result['ratio_median']:.2f} | {_ms(result['wpk'])} | {_ms(result['ort'])} "
          f"| {result['wpk']['peak_mb']:.0f} / {result['ort']['peak_mb']:.0f} |", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="light_vgg19,light_resnet50")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", help="where plans and models are built and kept "
                                      "(default: a temporary folder)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    names = model_names(parser, args.models)
    print("| model | plan MB | wpk.load s (range) | onnxruntime session s (range) | "
          "wpk/ort | wpk first / second run ms | onnxruntime first / second run ms | "
          "peak MB wpk / ort |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.dir or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        env = bytecode_env(Path(scratch) / "bytecode")
        results = [bench_load(name, folder, args.rounds, env) for name in names]
    report = {"machine": machine_description(), "rounds": args.rounds, "results": results,
              "bytecode": "both engines import from bytecode compiled by an untimed probe "
                          "(PYTHONPYCACHEPREFIX of the run)"}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if not args.no_save:
        write_results(report, "load", REPO / "benchmarks" / "results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
