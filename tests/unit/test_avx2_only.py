"""scripts/avx2_only.sh: every process of a command sees an AVX2-only CPU on an AVX-512
host (CPUID faulting), as the AVX2 checks and benchmarks need; run for real where this
host can do it, skipped (saying why) elsewhere."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "avx2_only.sh"

# What a process sees of the CPU: numpy's runtime check, wpk's flags and vector width,
# onnxruntime's NCHWc block (16 with AVX-512, 8 with AVX2), gcc's -march=native, and the
# same from a thread and from a child process started with subprocess.
PROBE = r"""
import json, subprocess, sys, threading
try:
    from numpy._core._multiarray_umath import __cpu_features__ as numpy_features
except ImportError:   # numpy < 2
    from numpy.core._multiarray_umath import __cpu_features__ as numpy_features
from wpk.core.devices import cpu_flags, cpuid_denied_flags, host_cpu
from wpk.kernels.nchwc_format import mlas_block_size

def seen():
    return {"numpy_avx512f": numpy_features["AVX512F"], "numpy_avx2": numpy_features["AVX2"],
            "numpy_fma": numpy_features["FMA3"],
            "wpk_avx512": sorted(f for f in cpu_flags() if f.startswith("avx512")),
            "wpk_vector_bits": host_cpu().vector_bits, "mlas_block": mlas_block_size(),
            "denied": cpuid_denied_flags()}

found = {"main": seen()}
worker = threading.Thread(target=lambda: found.update(thread=seen()))
worker.start()
worker.join()
gcc = subprocess.run(["gcc", "-march=native", "-Q", "--help=target"], capture_output=True,
                     text=True, check=True).stdout.split()
found["gcc_avx512f"] = gcc[gcc.index("-mavx512f") + 1]
found["gcc_avx2"] = gcc[gcc.index("-mavx2") + 1]
child = subprocess.run([sys.executable, "-c",
                        "from wpk.core.devices import cpu_flags;"
                        "print('avx512f' in cpu_flags())"], capture_output=True, text=True,
                       check=True)
found["child_numpy_avx512f"] = child.stdout.strip()
print(json.dumps(found))
"""


def _can_hide() -> str | None:
    """None when this host can run avx2_only.sh, else its reason why not."""
    done = subprocess.run(["bash", str(SCRIPT), "--check"], capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr.strip()


@pytest.fixture(scope="module")
def hiding_host():
    reason = _can_hide()
    if reason:
        pytest.skip(reason)


def _run(*command, **kwargs):
    return subprocess.run(["bash", str(SCRIPT), *command], capture_output=True, text=True,
                          timeout=300, **kwargs)


def test_every_process_of_the_command_sees_an_avx2_only_cpu(hiding_host):
    done = _run(sys.executable, "-c", PROBE)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    for seen in (found["main"], found["thread"]):
        assert seen["numpy_avx512f"] is False and seen["numpy_avx2"] and seen["numpy_fma"]
        assert seen["wpk_avx512"] == [] and seen["wpk_vector_bits"] == 256
        assert seen["mlas_block"] in (8, None)   # None: an onnxruntime without NCHWc kernels
        assert "avx512f" in seen["denied"] and "avx2" not in seen["denied"]
    assert (found["gcc_avx512f"], found["gcc_avx2"]) == ("[disabled]", "[enabled]")
    assert found["child_numpy_avx512f"] == "False"


def test_without_it_the_same_process_sees_avx512(hiding_host):
    """The control: the probe itself tells the two CPUs apart."""
    from wpk.core.devices import cpuid_denied_flags

    if cpuid_denied_flags():
        pytest.skip("these tests already run without AVX-512 (under avx2_only.sh)")
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=300, check=True)
    found = json.loads(done.stdout)
    assert found["main"]["numpy_avx512f"] is True and found["main"]["wpk_vector_bits"] == 512
    assert found["main"]["mlas_block"] in (16, None)
    assert found["main"]["denied"] == []
    assert found["gcc_avx512f"] == "[enabled]"


def test_a_real_segfault_still_kills_and_reaches_the_programs_handler(hiding_host):
    """Only CPUID is stepped over: a bad read dies of SIGSEGV, and Python's faulthandler
    (installed after the library's handler) still reports it."""
    crash = "import ctypes, faulthandler; faulthandler.enable(); ctypes.string_at(0)"
    done = _run(sys.executable, "-c", crash)
    assert done.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV), done
    assert "Segmentation fault" in done.stderr
    quiet = _run(sys.executable, "-c", "import ctypes; ctypes.string_at(0)")
    assert quiet.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV), quiet


def test_a_subprocess_does_not_take_the_programs_handler_away(hiding_host):
    """Python starts subprocesses by vfork: the child shares the parent's memory until it
    execs and resets its signal handlers on the way; the parent's faulthandler must still
    report a later crash (a measuring worker that ran gcc once lost its report so)."""
    crash = ("import ctypes, faulthandler, subprocess; faulthandler.enable();"
             "subprocess.run(['gcc', '--version'], capture_output=True, check=True);"
             "ctypes.string_at(0)")
    done = _run(sys.executable, "-c", crash)
    assert done.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV), done
    assert "Segmentation fault" in done.stderr and "line 1" in done.stderr


def test_a_sent_sigsegv_still_kills(hiding_host):
    done = _run(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV);"
                "print('survived')")
    assert done.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV), done
    assert "survived" not in done.stdout


def test_without_a_command_it_says_how_to_call_it(hiding_host):
    done = _run()
    assert done.returncode == 3
    assert "no command given" in done.stderr and "usage:" in done.stderr


def test_a_cache_it_cannot_write_is_a_reason_in_one_line(hiding_host, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")   # a file where the cache folder would go
    done = subprocess.run(["bash", str(SCRIPT), "--check"], capture_output=True, text=True,
                          env={**os.environ, "XDG_CACHE_HOME": str(blocked)}, timeout=300)
    assert done.returncode == 3
    assert done.stderr.startswith("avx2_only: cannot write the library into ")
    assert done.stderr.count("\n") == 1 and "XDG_CACHE_HOME" in done.stderr


def test_a_host_it_cannot_hide_on_gets_a_reason_not_a_wrong_cpu():
    """Where the check fails it says why in one line; where it passes the hiding is real
    (the tests above)."""
    reason = _can_hide()
    if reason is None:
        pytest.skip("this host can hide AVX-512")
    assert reason.startswith("avx2_only: ") and "\n" not in reason
