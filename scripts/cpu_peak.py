"""This machine's fp32 FMA peak (GFLOP/s) and memory bandwidth (GB/s), measured.

Peak: a generated C kernel (OpenMP, one team of `--threads`) runs on every
thread independent chains of vector FMAs (`acc[k] = acc[k] * m + c` on GCC
vector extensions of the host ISA's width, `CHAINS` accumulators, more than
FMA latency x FMA ports, so the FMA units never wait), compiled with the
micro-kernels' flags for the host ISA (`wpk.kernels.cpu.microkernels.isa`).
The best of `--repeat` runs counts: 2 flops per lane per FMA.

Bandwidth: STREAM-style copy (a = b) and triad (a = b + s * c) over arrays of
`--mib` MiB each (far beyond the caches), OpenMP static split, the best of
`--repeat` runs; bytes counted as STREAM counts them (read + written arrays).

    python scripts/cpu_peak.py [--threads 2] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

CHAINS = 16          # independent accumulators per thread (> 4-cycle latency x 2 FMA ports)
ITERATIONS = 2_000_000

_PEAK_SOURCE = r"""
#include <omp.h>
typedef float vf __attribute__((vector_size(%(lanes)d * 4)));
/* every thread: `iters` rounds of CHAINS independent FMAs on named registers a0, a1, ...;
   their sum goes to out[thread] */
void wpk_fma_peak(long iters, float *out) {
    #pragma omp parallel
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

void wpk_copy(long n, float *a, const float *b) {
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) a[i] = b[i];
}

void wpk_triad(long n, float *a, const float *b, const float *c, float s) {
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}
"""


def _library(lanes: int, flags) -> ctypes.CDLL:
    from wpk.dsl.toolchain import compile_c

    names = [f"a{k}" for k in range(CHAINS)]
    source = _PEAK_SOURCE % {
        "lanes": lanes,
        "declare": "\n".join(f"        vf {a} = (vf){{0}} + {k}.0f;" for k, a in enumerate(names)),
        "body": "\n".join(f"            {a} = {a} * m + c;" for a in names),
        "total": " + ".join(names)}
    return ctypes.CDLL(str(compile_c(source, flags).path))


def _host():
    from wpk.kernels.cpu.microkernels.isa import compile_flags, host_isa

    isa = host_isa()
    return isa, compile_flags(isa)


def measure_peak(threads: int, repeat: int = 5) -> dict:
    """fp32 FMA peak of `threads` OpenMP threads: {'gflops', 'isa', 'lanes', 'threads'}."""
    import numpy as np

    os.environ["OMP_NUM_THREADS"] = str(threads)
    isa, flags = _host()
    lib = _library(isa.lanes, flags)
    lib.wpk_fma_peak.argtypes = [ctypes.c_long, ctypes.c_void_p]
    out = np.zeros(max(threads, 1) * 4, np.float32)
    lib.wpk_fma_peak(1000, out.ctypes.data)  # start the team
    best = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        lib.wpk_fma_peak(ITERATIONS, out.ctypes.data)
        seconds = time.perf_counter() - start
        flops = 2.0 * isa.lanes * CHAINS * ITERATIONS * threads
        best = max(best, flops / seconds / 1e9)
    return {"gflops": best, "isa": isa.name, "lanes": isa.lanes, "threads": threads,
            "chains": CHAINS}


def measure_bandwidth(threads: int, mib: int = 256, repeat: int = 5) -> dict:
    """STREAM copy and triad bandwidth of `threads` threads in GB/s."""
    import numpy as np

    os.environ["OMP_NUM_THREADS"] = str(threads)
    isa, flags = _host()
    lib = _library(isa.lanes, flags)
    lib.wpk_copy.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    lib.wpk_triad.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_float]
    n = mib * (1 << 20) // 4
    a, b, c = (np.full(n, v, np.float32) for v in (0.0, 1.0, 2.0))
    runs = {"copy": (lambda: lib.wpk_copy(n, a.ctypes.data, b.ctypes.data), 2),
            "triad": (lambda: lib.wpk_triad(n, a.ctypes.data, b.ctypes.data, c.ctypes.data,
                                            3.0), 3)}
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
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mib", type=int, default=256, help="MiB per bandwidth array")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeat < 1 or args.mib < 1:
        parser.error("--threads, --repeat and --mib must be positive")
    peak = measure_peak(args.threads, args.repeat)
    bandwidth = measure_bandwidth(args.threads, args.mib, args.repeat)
    if args.json:
        print(json.dumps({"peak": peak, "bandwidth": bandwidth}, indent=1))
    else:
        print(f"fp32 FMA peak: {peak['gflops']:.1f} GFLOP/s ({args.threads} threads, "
              f"{peak['isa']}, {peak['lanes']} lanes)")
        print(f"memory bandwidth: copy {bandwidth['copy_gbs']:.1f} GB/s, "
              f"triad {bandwidth['triad_gbs']:.1f} GB/s ({args.mib} MiB arrays)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
