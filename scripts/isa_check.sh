#!/usr/bin/env bash
# Checks the AVX2 code paths of wpk on any x86-64 host, in two parts (see tests/isa.py):
#
#  1. the unit tests with wpk restricted to AVX2 (`pytest --isa avx2`): AVX2 schedules,
#     8-lane templates and AVX2 kernels, run natively (AVX2 code runs on AVX-512 CPUs);
#     skipped on a host without AVX-512, whose normal test run already is this;
#  2. the NCHWc tests under qemu-user emulating a Haswell CPU, where onnxruntime's MLAS
#     itself picks the AVX2 block (8); skipped with a note when qemu-x86_64 is missing
#     (Debian: apt-get install qemu-user). Only these: qemu's AVX2 emulation miscomputes
#     some generated kernels that run correctly on a real CPU, so it cannot judge them.
#
#     bash scripts/isa_check.sh            # both parts
#     bash scripts/isa_check.sh --no-qemu  # part 1 only
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1
python=$(python -c 'import sys; print(sys.executable)')
if python -c 'import sys; from wpk.core.devices import host_cpu; sys.exit("avx512f" not in host_cpu().isa_flags)'; then
    echo "isa_check: unit tests with wpk restricted to AVX2"
    python -m pytest -q -p no:cacheprovider --isa avx2 tests/unit
else
    echo "isa_check: this host has no AVX-512; the normal test run covers AVX2"
fi
if [[ "${1:-}" == "--no-qemu" ]]; then
    exit 0
fi
if ! command -v qemu-x86_64 > /dev/null; then
    echo "isa_check: qemu-x86_64 not found; NCHWc tests on an emulated AVX2 CPU skipped"
    exit 0
fi
echo "isa_check: NCHWc tests on an emulated AVX2-only CPU (qemu-x86_64 -cpu Haswell-v4)"
qemu-x86_64 -cpu Haswell-v4 "$python" -c \
    'from wpk.kernels.nchwc_format import mlas_block_size as b; assert b() == 8, b(); print("MLAS block", b())' \
    2> >(grep -v "TCG doesn't support" >&2)
qemu-x86_64 -cpu Haswell-v4 "$python" -m pytest -q -p no:cacheprovider tests/unit/test_nchwc.py \
    tests/unit/test_nchwc_data.py tests/unit/test_nchwc_dirty.py tests/unit/test_nchwc_transpose.py \
    -k "not light_resnet50 and not light_densenet121 and not inception" \
    2> >(grep -v "TCG doesn't support" >&2)
