"""Analytical cost model of CUDA kernels on a GPU preset (used when no GPU is present).

    flops, bytes_ = workload_work(workload)
    occ = occupancy(gpu, threads=256, registers=32, shared_bytes=0)
    t = predict_generated(workload, gpu, launches, usage)   # -> Prediction
    t = predict_vendor(workload, gpu, "cudnn")               # -> Prediction

The model is a roofline scaled by an efficiency:

    roofline = max(flops / fp32_peak, min_bytes / memory_bandwidth)
    time     = roofline / efficiency + launches * LAUNCH_OVERHEAD_S

`min_bytes` counts every input and output once (perfect on-chip reuse), so
the roofline is a lower bound no kernel beats. For a generated kernel

    efficiency = GENERATED_EFFICIENCY * occupancy_factor * wave_factor * spill_factor

* occupancy: resident warps per SM over the SM's maximum, where resident
  blocks per SM are limited by threads (max_threads_per_sm), registers
  (registers_per_sm, per-warp allocation rounded to 256), shared memory
  (shared_memory_per_sm) and MAX_BLOCKS_PER_SM; `occupancy_factor =
  min(1, occupancy / OCCUPANCY_SATURATION)` (about half occupancy hides
  memory latency, Volkov's result; more does not help).
* waves: blocks run in waves of `blocks_per_sm * sm_count`; the last wave
  may be partial: `wave_factor = blocks / (waves * blocks_per_sm * sm_count)`.
  A grid too small to fill the GPU thus gets a small factor.
* spills: a kernel with spill stores or loads gets SPILL_FACTOR.
* latency: with the loop IR's work, the time is at least the kernels' chains of
  dependent global loads on one thread (`traffic.latency_seconds`), which no
  occupancy hides: a row reduced serially by one thread.

Vendor kernels (cuDNN, cuBLAS) are predicted as the roofline at a fixed
efficiency, VENDOR_EFFICIENCY, plus one extra elementwise pass over the
output when the workload has an epilogue the library call does not fuse.

These constants are ASSUMPTIONS, not measurements: they only rank candidates
for an `--offline` build, which says so in its plan and report; `wpk tune
PLAN` on the GPU replaces every prediction by a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from wpk.core.workload import Workload
from wpk.kernels.cuda.irb_spec import is_irb_nchw, part_workloads
from wpk.kernels.cuda.traffic import latency_seconds, onchip_seconds

LAUNCH_OVERHEAD_S = 3e-6          # per kernel launch (assumption; CUDA graphs lower it)
OCCUPANCY_SATURATION = 0.5        # occupancy above which latency is hidden (assumption)
GENERATED_EFFICIENCY = 0.5        # best fraction of the roofline a generated kernel reaches
SPILL_FACTOR = 0.5                # efficiency multiplier of a kernel that spills registers
MAX_BLOCKS_PER_SM = {(7, 5): 16}  # CUDA guide; 32 for the other presets' architectures
DEFAULT_MAX_BLOCKS_PER_SM = 32
REGISTER_ALLOCATION_UNIT = 256    # registers are allocated per warp in units of 256
VENDOR_EFFICIENCY = {"cudnn": 0.6, "cublas": 0.75}   # assumption, see the docstring
# Epilogue steps cuDNN/cuBLAS calls fuse (bias and relu in cudnnConvolutionBiasActivation
# and cublasLt epilogues); anything else costs an extra elementwise kernel.
VENDOR_FUSED_EPILOGUE = frozenset({"relu"})
COPY_EFFICIENCY = 0.8             # fraction of the bandwidth a device copy reaches
HOST_LINK_GBS = 12.0              # host<->device copies of a host-run step (PCIe 3 x16)
HOST_SYNC_S = 20e-6               # synchronisation and copies' fixed cost per host step


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM, the resource that limits them, and the warp occupancy."""

    blocks_per_sm: int
    limited_by: str
    occupancy: float


@dataclass(frozen=True)
class Prediction:
    """A predicted time with the terms it came from (all stored in reports)."""

    seconds: float
    roofline_s: float
    efficiency: float
    flops: float
    bytes: float
    model: str
    occupancy: float | None = None
    blocks_per_sm: int | None = None
    limited_by: str | None = None
    waves: int | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _elements(shape: Iterable[int]) -> int:
    return math.prod(int(d) for d in shape)


def workload_work(workload: Workload) -> tuple[float, float]:
    """(floating-point operations, minimum bytes moved) of a workload.

    Conv: 2*N*K*OH*OW*(C/groups)*R*S; Gemm/MatMul: 2*M*N*K (batched: times the
    batch); pooling: one operation per window element; other ops: one per
    output element and epilogue step; wpk's Attention: both GEMMs and a softmax over
    the scores; the NCHW inverted-residual block: its three convs. Bytes: every input
    and output once.
    """
    out = workload.outputs[0].shape
    out_elems = _elements(out)
    specs = [s for s in workload.inputs if s is not None] + list(workload.outputs)
    nbytes = float(sum(_elements(s.shape) * _itemsize(s.dtype) for s in specs))
    op = workload.op
    if op == "Conv" and len(workload.inputs) > 1 and workload.inputs[1] is not None:
        weight = workload.inputs[1].shape          # K, C/groups, R, S
        flops = 2.0 * out_elems * _elements(weight[1:])
    elif op in ("Gemm", "MatMul") and len(workload.inputs) > 1:
        a = workload.inputs[0].shape
        k = a[0] if op == "Gemm" and int(workload.attr("transA", 0)) else a[-1]
        flops = 2.0 * out_elems * int(k)
    elif op in ("MaxPool", "AveragePool"):
        flops = float(out_elems * _elements(workload.attr("kernel_shape", (1,))))
    elif op in ("GlobalAveragePool", "GlobalMaxPool"):
        flops = float(_elements(workload.inputs[0].shape))
    elif op in ("Softmax", "LogSoftmax", "LayerNormalization"):
        flops = 5.0 * out_elems
    elif op == "Attention" and workload.domain == "wpk":   # Q K^T, softmax, P V
        q, v = workload.inputs[0].shape, workload.inputs[2].shape
        scores = _elements(q[:-1]) * int(v[-2])
        flops = 2.0 * scores * (int(q[-1]) + int(v[-1])) + 5.0 * scores
    elif is_irb_nchw(workload):   # its three convs
        return sum(workload_work(p)[0] for p in part_workloads(workload)), nbytes
    else:
        flops = float(out_elems)
    flops += float(out_elems * len(workload.epilogue))
    return flops, nbytes


def winograd_work(workload: Workload, m: int) -> tuple[float, float]:
    """(flops, minimum bytes) of a Winograd F(m x m, 3x3) Conv in three stages, T = m + 2,
    P output tiles, C input and K output channels:

    * input transform B^T d B as two T x T products per tile and channel: 4 T^3 C P;
    * batched GEMM over the T^2 positions: 2 T^2 K C P;
    * output transform A^T M A: 2 (m T^2 + m^2 T) K P, plus the epilogue per output;
    * bytes: the workload's inputs and outputs, the transformed filter (T^2 / 9 times
      the filter) instead of the filter, and the two workspaces V (T^2 C P) and M
      (T^2 K P), each written once and read once."""
    n, c, _, _ = (int(d) for d in workload.inputs[0].shape)
    k = int(workload.inputs[1].shape[0])
    oh, ow = (int(d) for d in workload.outputs[0].shape[2:])
    t = m + 2
    tiles = n * math.ceil(oh / m) * math.ceil(ow / m)
    out_elems = _elements(workload.outputs[0].shape)
    flops = (4.0 * t ** 3 * c * tiles + 2.0 * t * t * k * c * tiles
             + 2.0 * (m * t * t + m * m * t) * k * tiles
             + out_elems * (len(workload.epilogue) + (len(workload.inputs) > 2)))
    _, nbytes = workload_work(workload)
    filter_bytes = _elements(workload.inputs[1].shape) * 4
    nbytes += filter_bytes * (t * t / 9 - 1) + 2 * 4.0 * t * t * (c + k) * tiles
    return flops, nbytes


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "bool": 1,
            "int8": 1, "uint8": 1}.get(dtype, 4)


def roofline_seconds(flops: float, nbytes: float, gpu) -> float:
    """max(compute time at the fp32 peak, memory time at the peak bandwidth)."""
    return max(flops / (gpu.fp32_tflops * 1e12), nbytes / (gpu.memory_bandwidth_gbs * 1e9))


def occupancy(gpu, threads: int, registers: int, shared_bytes: int) -> Occupancy:
    """Resident blocks per SM and warp occupancy of a kernel on `gpu` (CUDA occupancy
    calculator rules, simplified: register allocation per warp rounded up to 256)."""
    warps = math.ceil(threads / gpu.warp_size)
    max_warps = gpu.max_threads_per_sm // gpu.warp_size
    limits = {"threads": gpu.max_threads_per_sm // max(1, warps * gpu.warp_size),
              "blocks": MAX_BLOCKS_PER_SM.get(gpu.compute_capability,
                                              DEFAULT_MAX_BLOCKS_PER_SM)}
    if registers > 0:
        per_warp = math.ceil(registers * gpu.warp_size / REGISTER_ALLOCATION_UNIT) \
            * REGISTER_ALLOCATION_UNIT
        limits["registers"] = gpu.registers_per_sm // (per_warp * warps)
    if shared_bytes > 0:
        limits["shared memory"] = gpu.shared_memory_per_sm // shared_bytes
    limited_by = min(limits, key=lambda k: limits[k])
    blocks = max(0, limits[limited_by])
    return Occupancy(blocks, limited_by, min(1.0, blocks * warps / max_warps))


def predict_generated(workload: Workload, gpu, launches: Iterable, usage: Mapping,
                      work: Mapping | None = None,
                      algorithm_work: tuple[float, float] | None = None) -> Prediction:
    """Predicted time of a generated kernel: `launches` are `KernelLaunch`es (name, launch
    with grid/block/shared_bytes), `usage` maps kernel name -> ptxas `ResourceUsage`.
    With `work` (kernel name -> `traffic.KernelWork` counted from the loop IR), the
    roofline is raised to the kernels' on-chip bound (executed flops, load/store
    wavefronts), which is what tells a register-tiled schedule from a naive one.
    `algorithm_work` (flops, bytes) replaces the workload's own for a kernel computing it
    with another algorithm (Winograd: `winograd_work`)."""
    launches = list(launches)
    flops, nbytes = algorithm_work or workload_work(workload)
    roof = roofline_seconds(flops, nbytes, gpu)
    chain = 0.0
    if work:
        roof = max(roof, sum(onchip_seconds(work[item.name], gpu) for item in launches
                             if item.name in work))
        chain = sum(latency_seconds(work[item.name], gpu) for item in launches
                    if item.name in work)
    weights, factors, details = [], [], None
    for item in launches:
        launch = item.launch
        threads = math.prod(launch.block)
        blocks = math.prod(launch.grid)
        used = usage.get(item.name)
        registers = used.registers if used is not None else 32
        shared = max(launch.shared_bytes, used.shared_bytes if used is not None else 0)
        occ = occupancy(gpu, threads, registers, shared)
        if occ.blocks_per_sm == 0:
            return Prediction(math.inf, roof, 0.0, flops, nbytes, "generated", 0.0, 0,
                              occ.limited_by, None)
        per_wave = occ.blocks_per_sm * gpu.sm_count
        waves = math.ceil(blocks / per_wave)
        factor = (min(1.0, occ.occupancy / OCCUPANCY_SATURATION) * blocks / (waves * per_wave))
        if used is not None and used.spills:
            factor *= SPILL_FACTOR
        weights.append(blocks * threads)
        factors.append(factor)
        if details is None or blocks * threads >= max(weights):
            details = (occ, waves)
    # The kernels of one module share the work in proportion to their threads.
    total = sum(weights)
    efficiency = GENERATED_EFFICIENCY * sum(w * f for w, f in zip(weights, factors)) / total
    occ, waves = details
    seconds = max(roof / efficiency, chain) + len(launches) * LAUNCH_OVERHEAD_S
    return Prediction(seconds, roof, efficiency, flops, nbytes, "generated", occ.occupancy,
                      occ.blocks_per_sm, occ.limited_by, waves)


def predict_vendor(workload: Workload, gpu, library: str) -> Prediction:
    """Predicted time of a cuDNN/cuBLAS call: roofline at VENDOR_EFFICIENCY[library], one
    launch, plus an elementwise pass (read + write of the output) for unfused epilogues."""
    flops, nbytes = workload_work(workload)
    roof = roofline_seconds(flops, nbytes, gpu)
    efficiency = VENDOR_EFFICIENCY[library]
    seconds = roof / efficiency + LAUNCH_OVERHEAD_S
    if any(step.op not in VENDOR_FUSED_EPILOGUE for step in workload.epilogue):
        out_bytes = 2.0 * _elements(workload.outputs[0].shape) * 4
        seconds += out_bytes / (gpu.memory_bandwidth_gbs * 1e9) + LAUNCH_OVERHEAD_S
    return Prediction(seconds, roof, efficiency, flops, nbytes, library)


def predict_copy(workload: Workload, gpu) -> Prediction:
    """Predicted time of a device copy (data movement): its bytes at COPY_EFFICIENCY of the
    bandwidth plus one launch."""
    _, nbytes = workload_work(workload)
    roof = nbytes / (gpu.memory_bandwidth_gbs * 1e9)
    return Prediction(roof / COPY_EFFICIENCY + LAUNCH_OVERHEAD_S, roof, COPY_EFFICIENCY,
                      0.0, nbytes, "copy")


def predict_host(workload: Workload) -> Prediction:
    """Predicted cost of a step run on the host: copying its inputs and outputs over the
    host link (HOST_LINK_GBS) plus HOST_SYNC_S; the CPU time itself is not modelled."""
    _, nbytes = workload_work(workload)
    seconds = nbytes / (HOST_LINK_GBS * 1e9) + HOST_SYNC_S
    return Prediction(seconds, 0.0, 1.0, 0.0, nbytes, "host")
