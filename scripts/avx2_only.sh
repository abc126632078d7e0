#!/usr/bin/env bash
# Runs a command as on an AVX2-only CPU, on an x86-64 Linux host with AVX-512: every
# process of the command (onnxruntime's MLAS, numpy, gcc's -march=native, wpk, the
# pytest-xdist and search workers) is shown a CPU without AVX-512, AMX or AVX-VNNI and
# picks its AVX2 code, natively and at full speed (scripts/avx2_only.c: CPUID faulting,
# which the CPU must offer: `cpuid_fault` in /proc/cpuinfo). The cores, caches and clock
# stay the host's: a ratio measured so is onnxruntime's and wpk's AVX2 code on this
# micro-architecture, not on an AVX2-only one.
#
#     bash scripts/avx2_only.sh python scripts/bench_attention.py --json F
#     bash scripts/avx2_only.sh --check    # exit 0 when this host can do it, else 3
#
# Exits 3, saying why, where it cannot (no AVX-512 to hide, no CPUID faulting, no gcc).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cannot() { echo "avx2_only: $1" >&2; exit 3; }
[[ "$(uname -sm)" == "Linux x86_64" ]] || cannot "needs Linux on x86-64"
grep -q -w avx512f /proc/cpuinfo || cannot "this CPU has no AVX-512 to hide (it runs AVX2 code already)"
grep -q -w cpuid_fault /proc/cpuinfo || cannot "this CPU or hypervisor offers no CPUID faulting"
command -v gcc > /dev/null || cannot "gcc not found"
source_file="$here/avx2_only.c"
cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/wpk/avx2_only"
library="$cache/avx2_only-$(sha256sum "$source_file" | cut -c1-16).so"
if [[ ! -f "$library" ]]; then
    partial="$(mkdir -p "$cache" 2> /dev/null && mktemp "$cache/build.XXXXXX" 2> /dev/null)" \
        || cannot "cannot write the library into $cache (set XDG_CACHE_HOME to a writable folder)"
    gcc -O2 -shared -fPIC -o "$partial" "$source_file" -ldl || cannot "gcc could not build $source_file"
    mv -f "$partial" "$library"
fi
preload="$library${LD_PRELOAD:+:$LD_PRELOAD}"
# The host's own AVX-512 check, through the library: CPUID must no longer report it.
probe='import sys; from wpk.core.devices import cpu_flags; sys.exit("avx512f" in cpu_flags())'
LD_PRELOAD="$preload" python -c "$probe" 2> /dev/null \
    || cannot "AVX-512 still visible through $library (is wpk installed in this python?)"
if [[ "${1:-}" == "--check" ]]; then
    exit 0
fi
[[ $# -gt 0 ]] || cannot "no command given (usage: bash scripts/avx2_only.sh COMMAND ...)"
LD_PRELOAD="$preload" exec "$@"
