"""Timing helpers shared by the per-kernel benchmarks (`bench_attention.py`,
`bench_inverted_residual.py`, `bench_recurrent.py`): the mean time of a call over a number
of repeats, how many repeats fill a target time, the machine fields of their JSON, and
their `--combine` of several runs' JSON files."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def machine_fields() -> dict:
    """What a result file says of the machine: its ISA fingerprint, the CPU model by name
    (VMs of different vendors share a fingerprint) and the flags hidden from it
    (`scripts/avx2_only.sh`)."""
    from wpk.core.devices import cpu_fingerprint, cpuid_denied_flags, host_cpu

    return {"machine": cpu_fingerprint(), "cpu_model": host_cpu().description,
            "cpuid_denied": cpuid_denied_flags()}


def per_call(call: Callable[[], object], repeat: int) -> float:
    """Seconds per call, the mean of `repeat` calls in a row."""
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) / repeat


def repeat_for(call: Callable[[], object], target_s: float = 0.05) -> int:
    """Repeats (at least 3) whose calls take about `target_s`, from three calls' time."""
    return max(3, int(target_s / max(per_call(call, 3), 1e-7)))


def alternate_with_onnxruntime(ort_run: Callable[[], object],
                               own: dict[str, Callable[[], object]],
                               rounds: int) -> dict[str, list[float]]:
    """Seconds per call of onnxruntime's run and of each of `own`, in `rounds` blocks of as
    many calls as fill 50 ms of onnxruntime's, each block after a wait until the process's
    threads are idle (`wait_until_idle`: onnxruntime's spin for 45-65 ms after its runs on
    the 2-core VM; a fixed 50 ms pause left the block after it sharing the cores)."""
    from wpk.core.idle import wait_until_idle

    repeat = repeat_for(ort_run)
    times: dict[str, list[float]] = {"onnxruntime": [], **{name: [] for name in own}}
    for _ in range(rounds):
        wait_until_idle()
        times["onnxruntime"].append(per_call(ort_run, repeat))
        for name, call in own.items():
            wait_until_idle()
            times[name].append(per_call(call, repeat))
    return times


def speedups_by(runs: Sequence[dict], key: Callable[[dict], tuple]) -> dict[tuple, list[float]]:
    """Each row's speedup over `runs` (results of a benchmark's `--json`), grouped by
    `key(row)` in the order the keys first appear."""
    found: dict[tuple, list[float]] = {}
    for run in runs:
        for row in run["rows"]:
            found.setdefault(key(row), []).append(row["speedup"])
    return found


def print_combined(paths: Sequence[str], summary: Callable[[list[dict]], str]) -> int:
    """`--combine`: prints `summary` of the runs in the JSON files at `paths`; 0, or 2 with an
    `error:` line where a file cannot be read or is not such a run."""
    try:
        print(summary([json.loads(Path(path).read_text()) for path in paths]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: --combine: {exc} (hint: pass files written by --json)", file=sys.stderr)
        return 2
    return 0
