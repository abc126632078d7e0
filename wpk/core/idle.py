"""Waiting until this process's threads are idle, before timing something.

onnxruntime at its default options spins its intra-op threads after a run returns (45-65 ms
after a small attention model's run, onnxruntime 1.32 on the project's 2-core VM), OpenBLAS
spins its workers for about 0.1 s after a call. A kernel timed while such a thread still
burns a core shares the machine with it: on 2 cores a fused attention kernel read 0.8x
onnxruntime's speed in blocks that followed onnxruntime's after a fixed 50 ms pause, 1.3x
with nothing spinning. A fixed pause is a guess about another library's spin time; this
waits for the evidence instead:

    wait_until_idle()   # returns once a short slice shows the process using no core

The process's CPU time (`time.process_time`: every thread's) is read over slices of
`slice_s` while the calling thread sleeps; the first slice in which the process used under
`busy_share` of one core ends the wait, or `limit_s` does.
"""

from __future__ import annotations

import time

SLICE_S = 0.005       # one observation: the calling thread sleeps this long
BUSY_SHARE = 0.2      # a slice with less of one core's time used counts as idle
LIMIT_S = 1.0         # no library spins longer than this (onnxruntime's longest seen: 65 ms)


def wait_until_idle(limit_s: float = LIMIT_S, slice_s: float = SLICE_S,
                    busy_share: float = BUSY_SHARE) -> float:
    """Sleep until the process's other threads use (almost) no CPU, at most `limit_s`
    seconds; returns the seconds waited."""
    start = time.perf_counter()
    while True:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(slice_s)
        used, elapsed = time.process_time() - cpu, time.perf_counter() - wall
        waited = time.perf_counter() - start
        if used < busy_share * elapsed or waited >= limit_s:
            return waited
