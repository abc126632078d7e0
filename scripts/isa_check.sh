#!/usr/bin/env bash
# Checks the AVX2 code paths of wpk on an x86-64 host with AVX-512 (see tests/isa.py): the
# unit tests marked `isa` (pyproject.toml: micro-kernels, C code generation, schedules,
# NCHWc, compile cache, records fingerprint), on every core with pytest-xdist when it is
# installed, in one of two ways:
#
#  1. where the CPU offers CPUID faulting (`scripts/avx2_only.sh --check`), every test
#     process is shown an AVX2-only CPU (scripts/avx2_only.sh): wpk, numpy and
#     onnxruntime's MLAS pick their AVX2 code natively, MLAS its NCHWc block 8
#     (`--mlas-block 8` checks each worker), as on a machine without AVX-512;
#  2. elsewhere, the same tests with only wpk restricted to AVX2 (`pytest --isa avx2`:
#     AVX2 schedules, 8-lane templates and AVX2 kernels, run natively; onnxruntime keeps
#     its AVX-512 kernels), then the NCHWc tests under qemu-user emulating a Haswell CPU,
#     where MLAS itself picks the AVX2 block (8); skipped with a note when qemu-x86_64 is
#     missing (Debian: apt-get install qemu-user). Only what the emulated CPU can show: the
#     cases that run onnxruntime's NCHWc kernels or wpk's layout at the host's block; left
#     out: the numpy.nchwc cases (numpy's code is the same on any CPU, and block 8 is
#     tested natively), so also the whole-model layout test at the other block (16,
#     numpy.nchwc under qemu); the whole-model pipeline test, which under qemu computes
#     what the layout test at block 8 computes (the same passes at the host's block 8,
#     the same kernels, the same inputs; its assertions follow from that test's); and
#     the largest CNNs. Only these: qemu's AVX2 emulation miscomputes some generated
#     kernels that run correctly on a real CPU, so it cannot judge them. One emulated
#     pytest-xdist worker per core when xdist is installed.
#
# A test that does not consult the ISA computes the same either way. On a host without
# AVX-512 nothing runs: its normal test run already is this.
#
#     bash scripts/isa_check.sh            # 1, or 2 with its qemu part
#     bash scripts/isa_check.sh --no-qemu  # 1, or 2 without its qemu part
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1
python=$(python -c 'import sys; print(sys.executable)')
if ! python -c 'import sys; from wpk.core.devices import host_cpu; sys.exit("avx512f" not in host_cpu().isa_flags)'; then
    echo "isa_check: this host has no AVX-512; the normal test run covers AVX2"
    exit 0
fi
parallel=()
if python -c 'import xdist' 2> /dev/null; then
    parallel=(-n auto)
fi
if bash scripts/avx2_only.sh --check; then
    echo "isa_check: the unit tests marked isa, every process shown an AVX2-only CPU (scripts/avx2_only.sh)"
    bash scripts/avx2_only.sh python -m pytest -q -p no:cacheprovider "${parallel[@]}" \
        --isa avx2 --mlas-block 8 -m isa tests/unit
    exit 0
fi
echo "isa_check: the unit tests marked isa, with wpk restricted to AVX2"
python -m pytest -q -p no:cacheprovider "${parallel[@]}" --isa avx2 -m isa tests/unit
if [[ "${1:-}" == "--no-qemu" ]]; then
    exit 0
fi
if ! command -v qemu-x86_64 > /dev/null; then
    echo "isa_check: qemu-x86_64 not found; NCHWc tests on an emulated AVX2 CPU skipped"
    exit 0
fi
echo "isa_check: NCHWc tests on an emulated AVX2-only CPU (qemu-x86_64 -cpu Haswell-v4)"
emulated=(qemu-x86_64 -cpu Haswell-v4 "$python")
"${emulated[@]}" -c \
    'from wpk.kernels.nchwc_format import mlas_block_size as b; assert b() == 8, b(); print("MLAS block", b())' \
    2> >(grep -v "TCG doesn't support" >&2)
left_out="not numpy.nchwc and not light_resnet50 and not light_densenet121 and not inception"
left_out+=" and not full_cpu_pipeline_on_depthwise_and_silu_models"
left_out+=" and not (layout_of_both_isas and 16)"
nchwc_tests=(tests/unit/test_nchwc.py tests/unit/test_nchwc_data.py tests/unit/test_nchwc_dirty.py
             tests/unit/test_nchwc_transpose.py -k "$left_out")
# One emulated pytest-xdist worker per core (qemu runs one thread at a time); the
# controller runs natively and only hands out tests. `--mlas-block 8` stops any process
# that runs tests without seeing the emulated CPU.
if python -c 'import xdist' 2> /dev/null; then
    python -m pytest -q -p no:cacheprovider --mlas-block 8 --dist load \
        --tx "$(nproc)*popen//python=${emulated[*]}" "${nchwc_tests[@]}" \
        2> >(grep -v "TCG doesn't support" >&2)
else
    "${emulated[@]}" -m pytest -q -p no:cacheprovider --mlas-block 8 "${nchwc_tests[@]}" \
        2> >(grep -v "TCG doesn't support" >&2)
fi
