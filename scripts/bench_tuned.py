#!/usr/bin/env python
"""End-to-end plan latency after tuning (`--search ga|rl|random`) against onnxruntime.

For each model: build with the schedule search (tuning records in --db-dir, so
a rerun reuses them), check the outputs against onnxruntime, then time both
engines alternately in blocks (10 runs of one, then 10 of the other, as
`bench_e2e.py --ort-spinning --block 10` does; onnxruntime at its default
threading, spinning on) and report medians and the ratio wpk/ort. The
per-operator picture: for every tuned workload the best generated time, the
best vendor time and their ratio, and which workloads the planner gave to a generated kernel.

    python scripts/bench_tuned.py                                  # 3 models, ga, 300 s each
    python scripts/bench_tuned.py --budget 600 --models light_resnet50,mobilenet_v2_like
    python scripts/bench_tuned.py --models transformer_encoder --search rl --budget 120

Writes benchmarks/results/tuned-<date>-<host>.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bench_e2e as e2e  # noqa: E402

from tests import models  # noqa: E402

DEFAULT_MODELS = ("light_resnet50", "light_squeezenet", "transformer_encoder")


def per_operator(report: dict) -> list[dict]:
    """Per workload that has a generated candidate: generated vs vendor time and the choice."""
    rows = []
    for w in report["workloads"]:
        ok = [c for c in w["candidates"] if c["status"] == "ok" and c["median_s"]]
        generated = [c["median_s"] for c in ok if c["kind"] == "generated"]
        if not generated:
            continue
        vendor = [c["median_s"] for c in ok if c["kind"] == "vendor"]
        others = [c["median_s"] for c in ok if c["kind"] != "generated"]
        rows.append({"workload": w["label"], "count": w["count"], "chosen": w["chosen"],
                     "chosen_kind": w["chosen_kind"], "share": w["share"],
                     "generated_s": min(generated), "vendor_s": min(vendor) if vendor else None,
                     "best_other_s": min(others) if others else None,
                     "speedup_vs_vendor": (min(vendor) / min(generated)) if vendor else None})
    return rows


def bench(name: str, args, workdir: str) -> dict:
    db = Path(args.db_dir) / f"{name}.jsonl"
    db.parent.mkdir(parents=True, exist_ok=True)
    options = {"search": args.search, "budget": args.budget, "db": str(db)}
    if args.trials:
        options["trials"] = args.trials
    result = e2e.bench_model(name, args.rounds, args.warmup, args.threads, options,
                             args.breakdown, workdir, ort_spinning=not args.ort_no_spinning,
                             block=max(1, args.block), fresh_process=args.fresh_process)
    plan = e2e.wpk.load(os.path.join(workdir, f"{name}.wpk")).plan
    report = plan.report
    result["search"] = {k: v for k, v in report.get("search", {}).items() if k != "tuned"}
    result["tuned"] = report.get("search", {}).get("tuned", [])
    result["per_operator"] = per_operator(report)
    result["generated_steps"] = result["impl_kinds"].get("generated", 0)
    return result


def operator_table(result: dict) -> str:
    lines = [f"\n### {result['model']}: generated kernels per workload "
             f"({result['generated_steps']} of {result['steps']} steps generated)", "",
             "| workload | n | generated | vendor | vendor/generated | chosen |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in sorted(result["per_operator"], key=lambda r: -r["share"]):
        vendor = f"{r['vendor_s'] * 1e6:.1f} us" if r["vendor_s"] else "-"
        ratio = f"{r['speedup_vs_vendor']:.2f}x" if r["speedup_vs_vendor"] else "-"
        lines.append(f"| {r['workload'][:70]} | {r['count']} | {r['generated_s'] * 1e6:.1f} us"
                     f" | {vendor} | {ratio} | {r['chosen'][:40]} ({r['chosen_kind']}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated; known: {', '.join(models.ALL_MODELS)}")
    parser.add_argument("--search", default="ga", choices=("ga", "rl", "random", "grid"))
    parser.add_argument("--budget", type=float, default=300.0, help="build budget per model (s)")
    parser.add_argument("--trials", type=int, default=None, help="trials per workload")
    parser.add_argument("--db-dir", default=os.path.join(tempfile.gettempdir(), "wpk-tuned"),
                        help="tuning records, one file per model (reused by later runs)")
    parser.add_argument("--rounds", type=int, default=10, help="timed A/B rounds per model")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="onnxruntime intra-op threads (default: cores)")
    parser.add_argument("--block", type=int, default=10,
                        help="runs of one engine in a row per round (as bench_e2e.py --block)")
    parser.add_argument("--ort-no-spinning", action="store_true",
                        help="turn onnxruntime's thread spinning off (default: its default, on)")
    parser.add_argument("--fresh-process", action="store_true",
                        help="also time both engines in a new process that loads only the "
                             "saved plan and the model, as a deployment would")
    parser.add_argument("--breakdown", action="store_true", help="time every plan step")
    parser.add_argument("--results-dir", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--no-save", action="store_true", help="print only, write no JSON")
    args = parser.parse_args(argv)

    names = e2e.model_names(parser, args.models)
    results = []
    with tempfile.TemporaryDirectory(prefix="wpk-tuned-") as workdir:
        for name in names:
            print(f"{name}: tuning ({args.search}, {args.budget:g} s), building and timing ...",
                  file=sys.stderr, flush=True)
            results.append(bench(name, args, workdir))

    report = {"benchmark": "tuned", "date": datetime.datetime.now(datetime.UTC).isoformat(),
              "method": f"wpk build --search {args.search} --budget {args.budget:g} per model, "
                        f"then {args.warmup} warm-up rounds and {args.rounds} rounds alternating "
                        "wpk and onnxruntime in one process (the order swapping every round), "
                        f"{args.block} run(s) of each per "
                        f"round (when more than one: a {e2e.BLOCK_PAUSE_S} s pause before a "
                        "block and its first run untimed); medians and quartiles"
                        + ("; then the same in a fresh process that loads only the saved plan "
                           "and the model" if args.fresh_process else ""),
              "block": args.block, "ort_spinning": not args.ort_no_spinning,
              "fresh_process": args.fresh_process,
              "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
              "threads": args.threads, "machine": e2e.machine_description(),
              "results": results}
    print(e2e.markdown_table(results, args.threads))
    for result in results:
        print(operator_table(result))
    if not args.no_save:
        e2e.write_results(report, "tuned", args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
