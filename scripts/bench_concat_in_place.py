"""Benchmark (not a test): Concats in place against the same plan with every piece copied.

For each model: `wpk build` (CPU, untuned, wpk's per-operator plan: no end-to-end choice of
onnxruntime's whole model), then a copy of the plan whose buffer plan places no Concat
piece and keeps no channel slice inside its input (the same steps and kernels; only the
buffers differ, so each concat and slice copies as before 2026-12-02). Both are checked
against onnxruntime on the model's seeded inputs, then alternate in rounds (the first of
each pair swapping from round to round; per round a warm-up run and the median of
`--runs` runs of each); the median over rounds of in-place / copied and the rounds the
in-place plan won.

    python scripts/bench_concat_in_place.py [--models light_densenet121,corpus_yolo_torchscript]
        [--rounds 30] [--runs 7] [--output FILE.json]

Model names as `bench_e2e.py --models` takes them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnxruntime  # noqa: E402
from bench_e2e import load_benchmark_model  # noqa: E402

import wpk  # noqa: E402
from wpk.core.devices import cpu_fingerprint  # noqa: E402
from wpk.core.numerics import relative_l2  # noqa: E402
from wpk.kernels import registry  # noqa: E402
from wpk.plans.buffers import plan_graph_buffers  # noqa: E402
from wpk.plans.planfile import Plan  # noqa: E402

DEFAULT_MODELS = ("light_densenet121", "light_squeezenet", "light_inception_v1",
                  "corpus_yolo_torchscript", "corpus_unet_torchscript")


def _nbytes(spec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


def without_placements(plan: Plan) -> Plan:
    """`plan` with its buffer plan made again from its steps with views but no placed
    Concat pieces or slices (what `assemble` wrote before pieces were placed)."""
    workloads, constants = plan.workloads, set(plan.weights)
    views, step_io, sizes = [], [], {}
    for step in plan.steps:
        workload = workloads[step.workload_key]
        is_view = getattr(registry.get(step.impl), "views_input", None)
        if is_view and is_view(workload):
            views.append((step.outputs[0], step.inputs[0]))
        step_io.append(([i for i in step.inputs if i and i not in constants],
                        list(step.outputs)))
        for name, spec in [*zip(step.inputs, workload.inputs),
                           *zip(step.outputs, workload.outputs)]:
            if name and spec is not None and name not in constants:
                sizes[name] = _nbytes(spec)
    for entry in (*plan.inputs, *plan.outputs):
        sizes.setdefault(entry["name"], int(np.prod(entry["shape"], dtype=np.int64))
                         * np.dtype(entry["dtype"]).itemsize)
    buffers = plan_graph_buffers(step_io, sizes, [e["name"] for e in plan.inputs],
                                 [e["name"] for e in plan.outputs], constants, views)
    return Plan({**plan.manifest, "buffers": buffers.to_json()}, plan.weights, plan.report,
                plan.kernels)


def _median_run(session, feeds: dict, runs: int) -> float:
    session.run(feeds)   # warm-up: the other plan ran last
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(feeds)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench(name: str, rounds: int, runs: int, workdir: Path) -> dict:
    model, feeds, shapes = load_benchmark_model(name)
    plan = wpk.build(model, target="cpu", progress=False, partition=False,  # wpk's own plan
                     **({"input_shapes": shapes} if shapes else {}))
    placed = len(plan.buffer_plan.tensor_offsets)
    plan.save(workdir / f"{name}.wpk")
    without_placements(plan).save(workdir / f"{name}-copied.wpk")
    sessions = {"in place": wpk.load(workdir / f"{name}.wpk"),
                "copied": wpk.load(workdir / f"{name}-copied.wpk")}
    reference = onnxruntime.InferenceSession(model.SerializeToString(),
                                             providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    expected = dict(zip(names, reference.run(names, feeds)))
    errors = {}
    for label, session in sessions.items():
        got = session.run(feeds)
        errors[label] = max(relative_l2(got[n], expected[n]) for n in names)
    del reference   # its threads take no part in the timing
    ratios, medians = [], {label: [] for label in sessions}
    for index in range(rounds):
        order = list(sessions) if index % 2 else list(reversed(sessions))
        seconds = {label: _median_run(sessions[label], feeds, runs) for label in order}
        for label, value in seconds.items():
            medians[label].append(value)
        ratios.append(seconds["in place"] / seconds["copied"])
    concats = sum(1 for step in plan.steps if step.op == "Concat")
    return {"model": name, "concat_steps": concats, "pieces_at_nonzero_offsets": placed,
            "relative_l2_vs_ort": errors,
            "median_ms": {k: statistics.median(v) * 1e3 for k, v in medians.items()},
            "ratio_in_place_over_copied": statistics.median(ratios),
            "ratio_quartiles": statistics.quantiles(ratios, n=4)[::2] if rounds > 1 else
            [ratios[0]] * 2,
            "rounds_in_place_won": sum(r < 1 for r in ratios), "rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=7, help="timed runs per plan and round")
    parser.add_argument("--output", help="write the rows and the machine here (JSON)")
    args = parser.parse_args(argv)
    if min(args.rounds, args.runs) < 1:
        print("error: --rounds and --runs must be at least 1 (hint: --rounds 30 --runs 7)",
              file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="wpk-concat-") as workdir:
        for name in args.models.split(","):
            row = bench(name, args.rounds, args.runs, Path(workdir))
            rows.append(row)
            q = row["ratio_quartiles"]
            print(f"{name}: {row['concat_steps']} concats; in place "
                  f"{row['median_ms']['in place']:.2f} ms, copied "
                  f"{row['median_ms']['copied']:.2f} ms; in place / copied "
                  f"{row['ratio_in_place_over_copied']:.3f} (quartiles {q[0]:.3f}-{q[1]:.3f}),"
                  f" won {row['rounds_in_place_won']}/{row['rounds']} rounds", flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(
            {"benchmark": "concat-in-place", "date": datetime.datetime.now(
                datetime.UTC).isoformat(), "machine": cpu_fingerprint(),
             "command": "python scripts/bench_concat_in_place.py " + " ".join(argv or sys.argv[1:]),
             "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
