#!/usr/bin/env bash
# Everything of wpk that needs a GPU, in one command on the GPU machine (at most 9.5 minutes,
# so that it fits one 10-minute call of the device tool with its set-up):
#
#   scripts/gpu_check.sh            # results under $OUT (default ./out)
#   scripts/gpu_check.sh --no-install   # wpk already importable (a development machine)
#   scripts/gpu_check.sh --light-only   # only the nine light models (a minute or more each:
#                                         the first H200 run built SqueezeNet in about one)
#   scripts/gpu_check.sh --parts "gpu-runtime bench-gpu"   # only these parts (a rerun that
#       fits what is left of a lease); BENCH_ARGS="--models squeezenet resnet50" replaces
#       the benchmark's model and compile arguments (default: SqueezeNet against
#       torch.compile's reduce-overhead mode, CUDA graphs like wpk's runtime, which compiles
#       in a fraction of max-autotune's time), BENCH_LIMIT=S its time limit
#
# 1. installs the wheels carried in .whl/ (nvidia-cudnn-frontend, with --no-deps) into
#    /tmp/site, and wpk itself (editable, no deps; else a symlink tree mapping the top-level
#    folders onto wpk.* as setup.py does), with no network;
# 2. makes a CUDA compiler reachable for generated kernels when there is no nvcc: NVRTC from
#    the pip CUDA libraries and ptxas from triton, under the names wpk's toolchain looks for;
# 3. prints nvidia-smi and the versions of everything involved;
# 4. runs tests/gpu (runtime, vendors, generated kernels, fused kernels, sessions; online search and
#    --parallel-measure; then the two smallest light models), junit XML and logs to $OUT;
# 5. runs scripts/bench_gpu.py --quick (JSON to $OUT and benchmarks/results/).
# Every part has its own time limit and writes as it goes, so a part that runs out of time
# still leaves its partial results; the summary at the end gives each part's verdict.
set -u -o pipefail
INSTALL=1
LIGHT_ONLY=0
ONLY_PARTS=""
while [ $# -gt 0 ]; do
    case $1 in
        --no-install) INSTALL=0 ;;
        --light-only) LIGHT_ONLY=1 ;;
        --parts) ONLY_PARTS=${2:-}; shift ;;
        *) echo "usage: $0 [--no-install] [--light-only] [--parts \"NAME ...\"]"; exit 2 ;;
    esac
    shift
done

OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
START=$(date +%s)
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
section() { echo; echo "=== $* (t=$(( $(date +%s) - START )) s)"; }
declare -A RESULT

section "carried wheels"
if compgen -G ".whl/*.whl" > /dev/null; then
    # the cuDNN frontend always; the others (wpk's pure-Python dependencies, pytest,
    # hypothesis) only where this machine lacks them, so nothing of its own is shadowed
    mapfile -t WHEELS < <(python3 - <<'EOF'
import glob, importlib.util
modules = {"nvidia_cudnn_frontend": None, "markdown_it_py": "markdown_it", "attrs": "attr",
           "scikit_learn": "sklearn"}
for path in sorted(glob.glob(".whl/*.whl")):
    dist = path.rsplit("/", 1)[-1].split("-")[0].lower()
    module = modules.get(dist, dist)
    if module is None or importlib.util.find_spec(module) is None:
        print(path)
EOF
)
    if [ "${#WHEELS[@]}" -gt 0 ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${WHEELS[@]}" \
            && echo "installed into /tmp/site: ${WHEELS[*]}"
    fi
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "no .whl/ folder: the cuDNN frontend is absent, cuDNN candidates will say so"
fi

section "wpk"
if [ "$INSTALL" = 0 ]; then
    echo "not installing wpk (--no-install)"
elif ! python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip-wpk.log" 2>&1; then
    echo "editable install failed (see pip-wpk.log); mapping the folders by symlinks"
    rm -rf /tmp/wpkroot && mkdir -p /tmp/wpkroot/wpk
    for entry in wpk/*; do ln -s "$PWD/$entry" "/tmp/wpkroot/wpk/$(basename "$entry")"; done
    for folder in dsl kernels search plans; do ln -s "$PWD/$folder" "/tmp/wpkroot/wpk/$folder"; done
    export PYTHONPATH="/tmp/wpkroot${PYTHONPATH:+:$PYTHONPATH}"
    export PYTEST_ADDOPTS="--import-mode=append"   # the repo's wpk/ must not shadow the tree
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"   # tests/ imports (tests.unit helpers)
python3 -c "import wpk.dsl, wpk.kernels.cuda.vendor_cudnn, wpk.runtime_cuda; print('wpk imports from', wpk.__file__)" \
    || { echo "FATAL: wpk does not import"; exit 2; }

section "CUDA compiler for generated kernels"
python3 - <<'EOF'
import glob, os, site, sys
from wpk.dsl.toolchain_cuda import find_nvcc, nvrtc_available
if find_nvcc() or nvrtc_available():
    print("compiler:", find_nvcc() or "NVRTC 12 + ptxas wheels")
    sys.exit(0)
roots = site.getsitepackages() + [site.getusersitepackages()]
libs = sorted(p for r in roots for p in glob.glob(f"{r}/nvidia/**/libnvrtc.so.1[23]", recursive=True))
ptxas = sorted(p for r in roots for p in glob.glob(f"{r}/triton/**/bin/ptxas", recursive=True))
print("libnvrtc:", libs, "ptxas:", ptxas)
if libs and ptxas:
    shim = "/tmp/cudashim/nvidia"
    os.makedirs(f"{shim}/cuda_nvrtc/lib", exist_ok=True)
    os.makedirs(f"{shim}/cuda_nvcc/bin", exist_ok=True)
    lib_dir = os.path.dirname(libs[-1])
    for name in os.listdir(lib_dir):
        target = f"{shim}/cuda_nvrtc/lib/{name}"
        if not os.path.exists(target):
            os.symlink(f"{lib_dir}/{name}", target)
    if not os.path.exists(f"{shim}/cuda_nvrtc/lib/libnvrtc.so.12"):
        os.symlink(libs[-1], f"{shim}/cuda_nvrtc/lib/libnvrtc.so.12")
    if not os.path.exists(f"{shim}/cuda_nvcc/bin/ptxas"):
        os.symlink(ptxas[-1], f"{shim}/cuda_nvcc/bin/ptxas")
    print("shim written under /tmp/cudashim (NVRTC", libs[-1], "+ ptxas", ptxas[-1], ")")
else:
    print("no CUDA compiler: generated kernels will be compile errors, vendor kernels remain")
EOF
if [ -d /tmp/cudashim/nvidia ]; then
    export PYTHONPATH="/tmp/cudashim:$PYTHONPATH"
    export LD_LIBRARY_PATH="/tmp/cudashim/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    python3 -c "from wpk.dsl.toolchain_cuda import nvrtc_available, nvrtc_version; print('NVRTC usable:', nvrtc_available(), nvrtc_version() if nvrtc_available() else '')" || true
fi

section "device and versions"
nvidia-smi || echo "nvidia-smi failed"
python3 - <<'EOF'
import importlib, platform
print("python", platform.python_version())
for name in ("numpy", "cupy", "torch", "onnx", "onnxruntime", "cudnn"):
    try:
        module = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" cuda={module.version.cuda} cudnn={module.backends.cudnn.version()}"
        if name == "cudnn":
            extra = f" backend={module.backend_version_string()}"
        print(f"{name} {getattr(module, '__version__', '?')}{extra}")
    except Exception as exc:
        print(f"{name}: not importable ({type(exc).__name__}: {exc})")
from wpk.core.devices import detect_gpus
print("wpk detects:", detect_gpus())
from wpk.kernels.cuda.cupy_support import device_description
try:
    print("device:", device_description())
except Exception as exc:
    print("device: cupy cannot use a GPU here:", exc)
EOF

run_part() {   # name, limit in seconds, command...
    local name=$1 limit=$2; shift 2
    if [ -n "$ONLY_PARTS" ] && [[ " $ONLY_PARTS " != *" $name "* ]]; then
        RESULT[$name]=skipped
        return
    fi
    section "$name (limit ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    RESULT[$name]=${PIPESTATUS[0]}
}

export WPK_CACHE_DIR=/tmp/wpk-cache
if [ "$LIGHT_ONLY" = 1 ]; then
    PARTS="gpu-light-models"
    run_part gpu-light-models 470 python3 -m pytest -q -rA -p no:cacheprovider \
        tests/gpu/test_light_models_gpu.py --junitxml="$OUT/junit-gpu-light.xml"
else
    PARTS="unit-logic gpu-runtime gpu-quantized gpu-fused gpu-search gpu-light-models bench-gpu"
    run_part unit-logic 30 python3 -m pytest -q -p no:cacheprovider \
        tests/unit/test_cuda_runtime_logic.py --junitxml="$OUT/junit-unit-logic.xml"
    run_part gpu-runtime 90 python3 -m pytest -q -rA -p no:cacheprovider \
        tests/gpu/test_cuda_runtime.py tests/gpu/test_winograd_cuda_gpu.py \
        tests/gpu/test_value_tail_gpu.py --junitxml="$OUT/junit-gpu-runtime.xml"
    # QDQ-quantized models' CUDA plans (fake_quant in generated kernels and after cuDNN)
    run_part gpu-quantized 120 python3 -m pytest -q -rA -p no:cacheprovider \
        tests/gpu/test_quantized_gpu.py --junitxml="$OUT/junit-gpu-quantized.xml"
    # the fused attention and inverted-residual kernels against the reference and peers
    run_part gpu-fused 60 python3 -m pytest -q -rA -p no:cacheprovider \
        tests/gpu/test_cuda_fused_gpu.py --junitxml="$OUT/junit-gpu-fused.xml"
    # online --search and --parallel-measure (build, records, tune)
    run_part gpu-search 90 python3 -m pytest -q -rA -p no:cacheprovider \
        tests/gpu/test_gpu_search.py --junitxml="$OUT/junit-gpu-search.xml"
    # the two smallest light models (each built with --gpu auto: about a minute); all nine:
    # --light-only
    run_part gpu-light-models 150 python3 -m pytest -q -rA -p no:cacheprovider \
        tests/gpu/test_light_models_gpu.py -k "squeezenet or shufflenet" \
        --junitxml="$OUT/junit-gpu-light.xml"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
    run_part bench-gpu "${BENCH_LIMIT:-120}" python3 scripts/bench_gpu.py --quick --out "$OUT" \
        --trials 3 --rounds 3 --tune-budget 15 \
        ${BENCH_ARGS:---models squeezenet --compile-mode reduce-overhead}
    mkdir -p benchmarks/results && cp "$OUT"/gpu-*.json benchmarks/results/ 2>/dev/null
fi

section "summary"
status=0
for name in $PARTS; do
    rc=${RESULT[$name]:-missing}
    case $rc in
        0) verdict=passed ;;
        skipped) verdict="not run (--parts)" ;;
        124|137) verdict="TIMED OUT (partial results in $name.log)"; status=1 ;;
        *) verdict="FAILED (exit $rc)"; status=1 ;;
    esac
    echo "$name: $verdict"
done
python3 - "$OUT" <<'EOF' || status=1
import glob, sys, xml.etree.ElementTree as ET
skipped_all = False
for path in sorted(glob.glob(f"{sys.argv[1]}/junit-*.xml")):
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    print(f"{path.rsplit('/', 1)[-1]}: {counts}")
    if "gpu" in path and counts["tests"] and counts["skipped"] == counts["tests"]:
        skipped_all = True
if skipped_all:
    print("GPU tests were all SKIPPED: no GPU verdict (see the reasons in the logs)")
    sys.exit(1)
EOF
echo "total $(( $(date +%s) - START )) s; results in $OUT"
exit $status
