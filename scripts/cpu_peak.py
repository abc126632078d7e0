"""This machine's fp32 FMA peak (GFLOP/s) and memory bandwidth (GB/s), measured.

Peak: a generated C kernel (OpenMP, one team of `--threads`) runs on every
thread independent chains of vector FMAs (`acc[k] = acc[k] * m + c` on GCC
vector extensions of the host ISA's width, `chains(isa)` accumulators: more than
FMA latency x FMA ports, so the FMA units never wait, and with m and c few enough
for the ISA's vector registers: 16 accumulators on AVX2's 16 registers spilled to the
stack and read an AVX2 core's peak at 51 GFLOP/s instead of 91), compiled with the
micro-kernels' flags for the host ISA (`wpk.kernels.cpu.microkernels.isa`).
The best of `--repeat` short runs counts: 2 flops per lane per FMA. Every run
is a lower bound of the peak (other load only slows it down), and on a shared
machine a moment when all `--threads` cores are idle together is rare, so the
peak is the larger of the team's best and `threads` x one thread's best (one
thread per core: the FMA units are per core; on a host with SMT siblings pass
`--no-scale`).

Bandwidth: STREAM-style copy (a = b) and triad (a = b + s * c) over arrays of
`--mib` MiB each (far beyond the caches), OpenMP static split, the best of
`--repeat` runs; bytes counted as STREAM counts them (read + written arrays).

    python scripts/cpu_peak.py [--threads 2] [--repeat 30] [--no-scale] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

from wpk.dsl.build import openmp_defaults

# OpenMP waits as in wpk's runtime, for this probe and for every benchmark importing it
# (before any kernel loads libgomp): passive alone charged each timed call a wake-up
openmp_defaults()

MAX_CHAINS = 16      # independent accumulators per thread (> 4-cycle latency x 2 FMA ports)
# Vector registers a chain may not take: m, c and two to spare for the compiler
RESERVED_REGISTERS = 4
ITERATIONS = 500_000   # a few ms a run: short runs, many of them, catch the machine idle

_PEAK_SOURCE = r"""
#include <omp.h>
typedef float vf __attribute__((vector_size(%(lanes)d * 4)));
/* `threads` threads, each `iters` rounds of %(chains)d independent FMAs on named registers a0,
   a1, ...; their sum goes to out[thread]. The team size is a clause, never the caller's
   omp_set_num_threads: that would stay set for every kernel the process runs afterwards */
void wpk_fma_peak(int threads, long iters, float *out) {
    #pragma omp parallel num_threads(threads)
    {
        vf m = (vf){0} + 0.999999f, c = (vf){0} + 1e-7f;
%(declare)s
        for (long i = 0; i < iters; ++i) {
%(body)s
        }
        vf t = %(total)s;
        float s = 0;
        for (int l = 0; l < %(lanes)d; ++l) s += t[l];
        out[omp_get_thread_num()] = s;
    }
}

void wpk_copy(int threads, long n, float *a, const float *b) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long i = 0; i < n; ++i) a[i] = b[i];
}

void wpk_triad(int threads, long n, float *a, const float *b, const float *c, float s) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (long i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}
"""


def chains(isa) -> int:
    """Independent FMA chains per thread on `isa`: `MAX_CHAINS`, fewer where its vector
    registers would not hold them next to the two constants (AVX2: 12)."""
    return min(MAX_CHAINS, isa.registers - RESERVED_REGISTERS)


def _library(isa, flags) -> ctypes.CDLL:
    from wpk.dsl.toolchain import compile_c

    names = [f"a{k}" for k in range(chains(isa))]
    source = _PEAK_SOURCE % {
        "lanes": isa.lanes, "chains": len(names),
        "declare": "\n".join(f"        vf {a} = (vf){{0}} + {k}.0f;" for k, a in enumerate(names)),
        "body": "\n".join(f"            {a} = {a} * m + c;" for a in names),
        "total": " + ".join(names)}
    return ctypes.CDLL(str(compile_c(source, flags).path))


def _host():
    from wpk.kernels.cpu.microkernels.isa import compile_flags, host_isa

    isa = host_isa()
    return isa, compile_flags(isa)


def _fma_gflops(lib, threads: int, repeat: int, isa) -> float:
    """Best GFLOP/s of `repeat` runs of the FMA kernel on `threads` OpenMP threads."""
    import numpy as np

    out = np.zeros(max(threads, 1) * 4, np.float32)
    lib.wpk_fma_peak(threads, 1000, out.ctypes.data)  # start the team
    flops = 2.0 * isa.lanes * chains(isa) * ITERATIONS * threads
    best = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        lib.wpk_fma_peak(threads, ITERATIONS, out.ctypes.data)
        best = max(best, flops / (time.perf_counter() - start) / 1e9)
    return best


def measure_peak(threads: int, repeat: int = 30, scale: bool = True) -> dict:
    """fp32 FMA peak of `threads` threads (see the module docstring): {'gflops',
    'team_gflops', 'one_thread_gflops', 'isa', 'lanes', 'threads'}."""
    isa, flags = _host()
    lib = _library(isa, flags)
    lib.wpk_fma_peak.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    team = _fma_gflops(lib, threads, repeat, isa)
    one = _fma_gflops(lib, 1, repeat, isa) if scale and threads > 1 else team / threads
    return {"gflops": max(team, one * threads if scale else 0.0), "team_gflops": team,
            "one_thread_gflops": one, "isa": isa.name, "lanes": isa.lanes, "threads": threads,
            "chains": chains(isa), "scaled_from_one_thread": scale and one * threads > team}


def measure_bandwidth(threads: int, mib: int = 256, repeat: int = 5) -> dict:
    """STREAM copy and triad bandwidth of `threads` threads in GB/s."""
    import numpy as np

    isa, flags = _host()
    lib = _library(isa, flags)
    lib.wpk_copy.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    lib.wpk_triad.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_float]
    n = mib * (1 << 20) // 4
    a, b, c = (np.full(n, v, np.float32) for v in (0.0, 1.0, 2.0))
    runs = {"copy": (lambda: lib.wpk_copy(threads, n, a.ctypes.data, b.ctypes.data), 2),
            "triad": (lambda: lib.wpk_triad(threads, n, a.ctypes.data, b.ctypes.data,
                                            c.ctypes.data, 3.0), 3)}
    result = {"threads": threads, "array_mib": mib}
    for name, (fn, arrays) in runs.items():
        fn()
        best = 0.0
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            best = max(best, arrays * n * 4 / (time.perf_counter() - start) / 1e9)
        result[f"{name}_gbs"] = best
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeat", type=int, default=30, help="runs; the best counts")
    parser.add_argument("--mib", type=int, default=256, help="MiB per bandwidth array")
    parser.add_argument("--no-scale", action="store_true",
                        help="the peak is the team's best only (hosts with SMT siblings)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeat < 1 or args.mib < 1:
        parser.error("--threads, --repeat and --mib must be positive")
    peak = measure_peak(args.threads, args.repeat, scale=not args.no_scale)
    bandwidth = measure_bandwidth(args.threads, args.mib, args.repeat)
    if args.json:
        print(json.dumps({"peak": peak, "bandwidth": bandwidth}, indent=1))
    else:
        print(f"fp32 FMA peak: {peak['gflops']:.1f} GFLOP/s ({args.threads} threads, "
              f"{peak['isa']}, {peak['lanes']} lanes; team {peak['team_gflops']:.1f}, "
              f"one thread {peak['one_thread_gflops']:.1f})")
        print(f"memory bandwidth: copy {bandwidth['copy_gbs']:.1f} GB/s, "
              f"triad {bandwidth['triad_gbs']:.1f} GB/s ({args.mib} MiB arrays)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
