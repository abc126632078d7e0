"""Others' share of the cores over a build (`wpk.core.machine_load`) and its warning."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from wpk.commands.render import machine_load_lines, summary_lines
from wpk.core.machine_load import MIN_WINDOW_S, CpuUse, cpu_use, load_summary, others_share

linux_only = pytest.mark.skipif(not os.path.exists("/proc/stat") or
                                not hasattr(os, "sched_setaffinity"),
                                reason="reads Linux's /proc/stat and sets the CPU affinity")


def test_others_share_is_the_used_time_that_was_not_this_process():
    before = CpuUse(cores=2, used_s=100.0, total_s=400.0, own_s=10.0, wall_s=0.0)
    after = CpuUse(cores=2, used_s=103.0, total_s=404.0, own_s=11.0, wall_s=2.0)
    assert others_share(before, after) == pytest.approx(0.5)   # 3 s used, 1 s ours, of 4
    busy_self = CpuUse(cores=2, used_s=103.0, total_s=404.0, own_s=13.0, wall_s=2.0)
    assert others_share(before, busy_self) == 0.0
    assert load_summary(before, after) == {"others_share": 0.5, "cores": 2, "window_s": 2.0}


def test_no_share_without_two_readings_or_from_a_window_too_short_to_read():
    reading = CpuUse(cores=2, used_s=1.0, total_s=2.0, own_s=0.0, wall_s=0.0)
    assert others_share(None, reading) is None and others_share(reading, None) is None
    soon = CpuUse(cores=2, used_s=1.1, total_s=2.2, own_s=0.0, wall_s=0.05)
    assert others_share(reading, soon) is None and load_summary(reading, soon) is None


def test_a_reading_counts_only_the_cores_this_process_may_use(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    stat = tmp_path / "stat"
    lines = ["cpu  1 1 1 1 1 1 1 1 0 0"]
    lines += [f"cpu{core} 100 0 50 800 50 0 0 0 0 0" for core in cores]
    lines += [f"cpu{max(cores) + 1} 9999 0 0 1 0 0 0 0 0 0", "intr 12345", "ctxt 678"]
    stat.write_text("\n".join(lines) + "\n")
    reading = cpu_use(str(stat))
    tick = os.sysconf("SC_CLK_TCK")
    assert reading.cores == len(cores)
    assert reading.used_s == pytest.approx(150 * len(cores) / tick)   # iowait is not use
    assert reading.total_s == pytest.approx(1000 * len(cores) / tick)
    assert cpu_use(str(tmp_path / "missing")) is None


@linux_only
def test_a_busy_process_on_our_core_is_seen_and_our_own_children_are_not():
    """On one core (this process and its children pinned to it): a busy loop that is not
    waited for is others' use, a child that was waited for is this process's own."""
    affinity = os.sched_getaffinity(0)
    core = {min(affinity)}
    spin = "import time\nend = time.time() + {}\nwhile time.time() < end: pass"
    os.sched_setaffinity(0, core)
    try:
        before = cpu_use()
        subprocess.run([sys.executable, "-c", spin.format(1.0)], check=True)
        own = others_share(before, cpu_use())
        busy = subprocess.Popen([sys.executable, "-c", spin.format(30)])
        try:
            before = cpu_use()
            time.sleep(1.5)
            other = others_share(before, cpu_use())
        finally:
            busy.kill()
            busy.wait()
    finally:
        os.sched_setaffinity(0, affinity)
    assert other is not None and other > 0.5, other
    assert own is not None and own < other - 0.3, (own, other)


def test_a_busy_cpu_build_is_warned_about_and_a_quiet_one_is_not():
    report = {"target": "cpu", "machine_load": {"others_share": 0.46, "cores": 2,
                                                "window_s": 5.8}}
    lines = machine_load_lines(report)
    assert len(lines) == 1 and lines[0].startswith("warning: other processes used 46% of "
                                                   "the 2 cores")
    assert "hint:" in lines[0] and lines[0] in summary_lines(report)
    quiet = {**report, "machine_load": {"others_share": 0.1, "cores": 2, "window_s": 5.8}}
    assert machine_load_lines(quiet) == []
    assert machine_load_lines({**report, "target": "cuda"}) == []   # not the CPU's timings
    assert machine_load_lines({"target": "cpu"}) == []              # an older plan's report


def test_a_build_reports_its_cores_and_others_share(tmp_path):
    """A build that certainly outlasts `MIN_WINDOW_S` (every candidate timed for 0.1 s)."""
    from tests.models import tiny_conv_gemm
    from wpk.pipeline import build
    from wpk.plans.planfile import Plan

    plan = build(tiny_conv_gemm(), "cpu", tmp_path / "tiny.wpk", partition=False, warmup=0,
                 repeats=1, min_time=0.1, progress=False)
    load = plan.report["machine_load"]
    assert load["cores"] == len(os.sched_getaffinity(0))
    assert 0.0 <= load["others_share"] <= 1.0 and load["window_s"] >= MIN_WINDOW_S
    assert Plan.load(tmp_path / "tiny.wpk").report["machine_load"] == load   # kept in the file
