"""Benchmark (not a test): the C copy behind data-movement steps (`wpk_moves`) in its forms.

The copies of real plans, each as `numpy.copyto` and as three forms of `wpk_moves`
(`wpk.kernels.cpu.native_moves`): on the calling thread with a libc `memcpy` per row
(the kernel before 2026-11-29), on the calling thread with short rows copied inline,
and the default (inline rows, moves of `PAR_BYTES` or more shared out to the OpenMP
threads). Cases: DeepLabV3's phase transposes (256 channels at 64x64 in the blocked
layout, dilation 2 and 4: rows of one 64-byte block), a ViT-B's and an SVTR's attention
head transposes, and a YOLO-style Concat of two blocked tensors. Contenders alternate
per round; the median over rounds of each round's best of `--repeat` calls, in
microseconds, and GB/s (bytes read and written).

    python scripts/bench_moves.py [--threads 2] [--rounds 5] [--repeat 20]
        [--output benchmarks/results/moves.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_winograd import set_omp_threads  # noqa: E402

from wpk.kernels.cpu.native_chain import chain_kernel, function_address  # noqa: E402
from wpk.kernels.cpu.native_moves import PAR_BYTES, moves_call, moves_function  # noqa: E402

FORMS = {"one thread, memcpy per row": {"par_bytes": 1 << 62, "inline_runs": False},
         "one thread, inline rows": {"par_bytes": 1 << 62, "inline_runs": True},
         "default (threads)": {"par_bytes": PAR_BYTES, "inline_runs": True}}


def _phases(d: int, blocks: int = 16, side: int = 64, inverse: bool = False):
    """DeepLab's blocked (1, Cb, H, W, 16) to its d x d phase batch, or back."""
    grid = (1, blocks, side // d, d, side // d, d, 16)
    if inverse:
        x = np.random.default_rng(0).random((d, d, 1, blocks, side // d, side // d, 16),
                                           np.float32)
        return [x.transpose(2, 3, 4, 0, 5, 1, 6)]
    x = np.random.default_rng(0).random(grid, np.float32)
    return [x.transpose(3, 5, 0, 1, 2, 4, 6)]


def _heads(tokens: int, heads: int, width: int):
    x = np.random.default_rng(0).random((1, tokens, heads, width), np.float32)
    return [x.transpose(0, 2, 1, 3)]


CASES = {   # id: (what it is, the sources and the Concat's output shape or None)
    "deeplab-to-d2": ("DeepLab to phases, d=2 (4 MB)", lambda: (_phases(2), None)),
    "deeplab-from-d2": ("DeepLab from phases, d=2 (4 MB)",
                        lambda: (_phases(2, inverse=True), None)),
    "deeplab-to-d4": ("DeepLab to phases, d=4 (4 MB)", lambda: (_phases(4), None)),
    "vit-heads": ("ViT-B heads, 197 x 12 x 64", lambda: (_heads(197, 12, 64), None)),
    "svtr-heads": ("SVTR heads, 576 x 4 x 32", lambda: (_heads(576, 4, 32), None)),
    "yolo-concat": ("YOLO Concat, 2 x (1, 4, 40, 40, 16)", lambda: (
        [np.random.default_rng(k).random((1, 4, 40, 40, 16), np.float32) for k in (0, 1)],
        (1, 8, 40, 40, 16))),
}


def _pairs(sources, out_shape):
    """(source, destination view) pairs and the destination: one transposed copy, or a
    Concat of the sources along axis 1."""
    if out_shape is None:
        out = np.empty(sources[0].shape, np.float32)
        return [(sources[0], out)], out
    out = np.empty(out_shape, np.float32)
    pairs, at = [], 0
    for src in sources:
        pairs.append((src, out[:, at:at + src.shape[1]]))
        at += src.shape[1]
    return pairs, out


def _best(call, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_case(name: str, rounds: int, repeat: int) -> dict:
    label, make = CASES[name]
    sources, out_shape = make()
    pairs, out = _pairs(sources, out_shape)
    _, table = moves_call(pairs)
    calls = {"numpy.copyto": lambda: [np.copyto(dst, src) for src, dst in pairs]}
    for form, options in FORMS.items():
        address = function_address(moves_function(**options))
        calls[form] = chain_kernel([(address, (table.ctypes.data,))], keep=[table])
    expected = np.concatenate(sources, axis=1) if out_shape else np.ascontiguousarray(sources[0])
    per_form: dict[str, list[float]] = {form: [] for form in calls}
    for form, call in calls.items():   # each verified once
        out.fill(np.nan)
        call() if form == "numpy.copyto" else call([], [])
        np.testing.assert_array_equal(out, expected, err_msg=f"{name}: {form}")
    for _ in range(rounds):
        for form, call in calls.items():
            time.sleep(0.05)
            run = call if form == "numpy.copyto" else (lambda c=call: c([], []))
            per_form[form].append(_best(run, repeat))
    moved = 2 * out.nbytes
    return {"case": name, "label": label, "bytes": out.nbytes,
            "us": {form: statistics.median(t) * 1e6 for form, t in per_form.items()},
            "gb_s": {form: moved / statistics.median(t) / 1e9 for form, t in per_form.items()}}


def markdown(rows: list[dict]) -> str:
    forms = list(rows[0]["us"])
    lines = ["| copy | " + " | ".join(f"{f} us" for f in forms) + " |",
             "| --- |" + " ---: |" * len(forms)]
    for row in rows:
        lines.append(f"| {row['label']} | "
                     + " | ".join(f"{row['us'][f]:.1f} ({row['gb_s'][f]:.0f} GB/s)"
                                  for f in forms) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated case ids (default: all of {', '.join(CASES)})")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    set_omp_threads(args.threads)
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {list(CASES)}")
    rows = [bench_case(name, args.rounds, args.repeat) for name in names]
    report = {"benchmark": "moves", "date": time.strftime("%Y-%m-%d %H:%M"),
              "machine": platform.processor() or platform.machine(), "threads": args.threads,
              "command": "python scripts/bench_moves.py " + " ".join(argv or sys.argv[1:]),
              "par_bytes": PAR_BYTES, "rows": rows}
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1))
    print(markdown(rows) if args.markdown else json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
