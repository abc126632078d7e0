"""How much of this process's cores other processes used over a window (a build, `wpk op`).

A build chooses each operator's implementation by timing the candidates on this machine.
When something else holds the cores meanwhile, the timings are not those of an idle
machine, and generated kernels (an OpenMP team that waits for its slowest thread) suffer
more than onnxruntime's pool (which does not wait for a thread that never started):
with one busy process beside it on a 2-core VM, an untuned build of a MobileNetV3 timed
fused blocks of 27-90 us at 1.6-3.9 ms and kept onnxruntime's whole model, 1.15x
onnxruntime's latency, where the same build on the idle machine wrote a plan at 0.86x
(2026-12-07). The build cannot tell a slow kernel from a busy machine by its timings, but
the operating system's accounting can:

    before = cpu_use()
    ...                                  # the build
    share = others_share(before, cpu_use())   # 0.48: others used 48% of our cores

The cores are those this process may run on (its affinity), their time from the per-CPU
lines of `/proc/stat` (the hypervisor's steal counted as used: a neighbour's VM takes the
core as much as a process does); this process's own time, with its threads and the
children it has waited for (compilers, measurement workers), is taken out. None where
there is no `/proc/stat` (not Linux) or the window is too short to read.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# /proc/stat's per-CPU fields, in clock ticks: user nice system idle iowait irq softirq steal
_IDLE_FIELDS = (3, 4)        # idle, iowait
_COUNTED_FIELDS = 8          # guest time is inside user already
# A window shorter than this holds too few clock ticks (10 ms each) to read a share from:
# 0.1 s of 2 cores is 20 ticks, a share to within about 5% (the warning is at 25%)
MIN_WINDOW_S = 0.1
# Others' share of the cores from which a build's timings are reported as unreliable
BUSY_SHARE = 0.25


@dataclass(frozen=True)
class CpuUse:
    """One reading: the cores' used and total seconds, this process's seconds, the time."""

    cores: int
    used_s: float
    total_s: float
    own_s: float
    wall_s: float


def cpu_use(stat_path: str = "/proc/stat") -> CpuUse | None:
    """The reading now, or None when `stat_path` cannot be read or parsed."""
    try:
        cores = os.sched_getaffinity(0)
        with open(stat_path) as stat:
            lines = stat.read().splitlines()
    except (OSError, AttributeError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    used = total = 0
    counted = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        if int(name[3:]) not in cores or len(fields) < _COUNTED_FIELDS:
            continue
        values = [int(v) for v in fields[:_COUNTED_FIELDS]]
        total += sum(values)
        used += sum(v for i, v in enumerate(values) if i not in _IDLE_FIELDS)
        counted += 1
    if not counted:
        return None
    own = os.times()
    return CpuUse(counted, used / tick, total / tick,
                  own.user + own.system + own.children_user + own.children_system,
                  time.perf_counter())


def others_share(before: CpuUse | None, after: CpuUse | None) -> float | None:
    """The share (0-1) of the cores' time between the two readings that went to other
    processes (or to other VMs), or None when either is missing or the window is shorter
    than `MIN_WINDOW_S`."""
    if before is None or after is None or after.wall_s - before.wall_s < MIN_WINDOW_S:
        return None
    total = after.total_s - before.total_s
    if total <= 0:
        return None
    others = (after.used_s - before.used_s) - (after.own_s - before.own_s)
    return min(1.0, max(0.0, others / total))


def load_summary(before: CpuUse | None, after: CpuUse | None) -> dict | None:
    """The report's `machine_load` entry for a window: others' share of the cores, the
    cores and the window's seconds (None when `others_share` is)."""
    share = others_share(before, after)
    if share is None:
        return None
    return {"others_share": round(share, 3), "cores": after.cores,
            "window_s": round(after.wall_s - before.wall_s, 2)}
