"""Schedule templates: named knobs per operator, a knob space per workload and target.

The bases of schedule templates and the generic one; the operators' own
templates (convolution, tiled GEMM) live in `wpk.kernels.templates`, whose
`template_for(op, target, hw)` picks the template of a specialised operator.
`GenericTemplate` schedules any operator (elementwise, pooling, reductions,
matmul with a 2-D register tile on the CPU).

Every template offers
* `space() -> KnobSpace` (ordered knob name -> choices, derived from the
  workload's extents and the hardware spec),
* `validate(config) -> reason | None` (knob values, schedule legality and
  resources: threads per block, shared memory, registers, vector registers,
  local memory; done by lowering to loop IR, never by compiling),
* `apply(config) -> Schedule`, `default_config()`, `configs(limit)`.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass

from wpk.core.devices import host_cpu
from wpk.core.errors import ScheduleError
from wpk.dsl import compute as C
from wpk.dsl import loopir as L
from wpk.dsl.lower import fused_epilogue, lower
from wpk.dsl.rfactor import rfactor
from wpk.dsl.schedule import Schedule, StageSchedule


class KnobSpace(OrderedDict):
    """Knob name -> list of choices (in a fixed order, so points are enumerable)."""

    def size(self) -> int:
        return math.prod(len(v) for v in self.values())

    def points(self):
        """Every point of the space as a dict, in lexicographic order."""
        names = list(self)
        for values in itertools.product(*self.values()):
            yield dict(zip(names, values))


@dataclass(frozen=True)
class Limits:
    """The hardware limits the templates check (read from a `wpk.core.devices` HardwareSpec)."""

    name: str = "cpu"
    vector_lanes: int = 16            # float32 lanes of the widest SIMD register
    vector_registers: int = 32
    cores: int = 1
    local_bytes: int = 256 * 1024     # stack budget for local caches per thread (CPU)
    max_threads_per_block: int = 1024
    shared_bytes_per_block: int = 48 * 1024
    registers_per_thread: int = 255
    registers_per_block: int = 65536
    warp_size: int = 32


def limits_from(hw, target: str) -> Limits:
    """Translate a HardwareSpec (any object with the usual attribute names) into `Limits`."""
    if hw is None:
        if target != "cpu":
            return Limits(name="gpu")
        hw = _host_cpu()
    if isinstance(hw, Limits):
        return hw
    get = lambda *names, default: next((getattr(hw, n) for n in names if hasattr(hw, n)),  # noqa: E731
                                       default)
    lanes = get("vector_lanes", "simd_lanes", default=None)
    if lanes is None:
        bits = get("vector_bits", "simd_width_bits", default=512)
        lanes = int(bits) // 32
    return Limits(
        name=str(get("name", default=target)),
        vector_lanes=int(lanes),
        vector_registers=int(get("vector_registers", default=32 if lanes >= 16 else 16)),
        cores=int(get("cores", "num_cores", default=1)),
        max_threads_per_block=int(get("max_threads_per_block", default=1024)),
        shared_bytes_per_block=int(get("shared_memory_per_block", "max_shared_memory_per_block",
                                       "shared_mem_per_block", default=48 * 1024)),
        registers_per_thread=int(get("max_registers_per_thread", "registers_per_thread",
                                     default=255)),
        registers_per_block=int(get("registers_per_block", "max_registers_per_block",
                                    default=65536)),
        warp_size=int(get("warp_size", default=32)),
    )


@functools.cache
def _host_cpu():
    return host_cpu()


def _choices(candidates, limit: int) -> list[int]:
    """Candidates below `limit`, plus the smallest one covering the whole axis."""
    out = [c for c in candidates if c < limit]
    covering = [c for c in candidates if c >= limit]
    return out + covering[:1] or [1]


class Template:
    """Base class: subclasses define `space` and `_apply`; validation is shared."""

    name = "template"

    def __init__(self, op, target: str, hw=None):
        self.op = op
        self.target = target
        self.limits = limits_from(hw, target)
        self.target_name = f"{target}:{self.limits.name}"

    @property
    def main_stage(self):
        """The stage the knobs are about: the last reduction stage, else the last stage."""
        reduces = [s for s in self.op.stages if s.reduce is not None]
        return (reduces or list(self.op.stages))[-1]

    def space(self) -> KnobSpace:
        raise NotImplementedError

    def _apply(self, sched: Schedule, config: dict) -> None:
        raise NotImplementedError

    def knob_defaults(self) -> dict:
        """Values of the knobs a config may leave out: knobs added after configs were
        recorded, whose default gives the schedule such a config always meant."""
        return {}

    def complete(self, config: dict) -> dict:
        """`config` with the knobs it leaves out at their defaults."""
        return {**self.knob_defaults(), **config}

    def transformed(self, config: dict):
        """The operator the schedule of `config` is built on: `self.op`, or a rewrite of it
        (e.g. `wpk.dsl.rfactor` for split reductions). Its params and outputs are `self.op`'s."""
        return self.op

    def check_knobs(self, config: dict) -> str | None:
        """None, or why a combination of knob values makes no sense (checked before lowering)."""
        return None

    def apply(self, config: dict) -> Schedule:
        """The schedule of this config (not validated: call `validate` first); its `op` is
        the operator to lower with it."""
        config = self.complete(config)
        sched = Schedule(self.transformed(config), self.target)
        self._apply(sched, config)
        return sched

    def validate(self, config: dict) -> str | None:
        """None if the config is legal and fits the target, else the reason it does not."""
        space = self.space()
        config = self.complete(config)
        for knob, choices in space.items():
            if knob not in config:
                return f"missing knob {knob}"
            if config[knob] not in choices:
                return f"knob {knob}={config[knob]!r} is not one of {choices}"
        extra = set(config) - set(space)
        if extra:
            return f"unknown knobs {sorted(extra)}"
        reason = self.check_knobs(config)
        if reason is not None:
            return reason

        try:
            sched = self.apply(config)
            func = lower(sched.op, sched, self.target)
        except ScheduleError as exc:
            return str(exc)
        return self.check_resources(func)

    def check_resources(self, func: L.PrimFunc) -> str | None:
        lim = self.limits
        for kernel in func.kernels:
            copies = max_unrolled_copies(kernel.body)
            if copies > MAX_UNROLLED_COPIES:
                return (f"unrolled loops would repeat a statement {copies} times (limit "
                        f"{MAX_UNROLLED_COPIES}): the compiler would take minutes")
            local = sum(b.size * _bytes(b.dtype) for b in loop_allocations(kernel.body)
                        if b.scope == "local")
            if self.target == "cpu":
                tile = max((n.buffer.size for n in L.walk(kernel.body)
                            if isinstance(n, L.Allocate) and n.buffer.name.endswith("_acc")),
                           default=0)
                vregs = math.ceil(tile / max(1, lim.vector_lanes))
                if lim.vector_registers and vregs > lim.vector_registers:
                    return (f"the register tile of {tile} floats needs {vregs} vector "
                            f"registers, {lim.name} has {lim.vector_registers}")
                if local > lim.local_bytes:
                    return (f"local buffers need {local} bytes per thread, "
                            f"over the {lim.local_bytes}-byte budget")
                continue
            launch = launch_of(kernel)
            threads = math.prod(launch.block)
            if threads > lim.max_threads_per_block:
                return (f"{threads} threads per block exceed the {lim.name} limit of "
                        f"{lim.max_threads_per_block}")
            shared = launch.shared_bytes
            if shared > lim.shared_bytes_per_block:
                return (f"{shared} bytes of shared memory per block exceed the {lim.name} "
                        f"limit of {lim.shared_bytes_per_block}")
            regs = estimate_registers(kernel)
            if regs > lim.registers_per_thread:
                return (f"about {regs} registers per thread exceed the {lim.name} limit of "
                        f"{lim.registers_per_thread}")
            if regs * threads > lim.registers_per_block:
                return (f"about {regs} registers x {threads} threads exceed the {lim.name} "
                        f"register file of {lim.registers_per_block} per block")
        return None

    def default_config(self) -> dict:
        """A reasonable valid config (the first valid point of a preferred ordering)."""
        for point in self.preferred_points():
            if self.validate(point) is None:
                return point
        raise ScheduleError(f"no valid schedule of {self.op.name} for {self.target_name}",
                            hint="the workload exceeds every configuration of the template")

    def preferred_points(self):
        return self.space().points()

    def sample(self, rng, count: int, tries: int = 200) -> list[dict]:
        """Up to `count` distinct valid points drawn at random with numpy generator `rng`."""
        space = self.space()
        out: list[dict] = []
        for _ in range(tries):
            point = {k: v[int(rng.integers(len(v)))] for k, v in space.items()}
            if point not in out and self.validate(point) is None:
                out.append(point)
                if len(out) >= count:
                    break
        return out

    def configs(self, limit: int | None = None) -> list[dict]:
        """Valid points of the space, in order (at most `limit`)."""
        out = []
        for point in self.space().points():
            if self.validate(point) is None:
                out.append(point)
                if limit is not None and len(out) >= limit:
                    break
        return out


MAX_UNROLLED_COPIES = 512


def max_unrolled_copies(stmt, factor: int = 1) -> int:
    """The largest number of copies of one statement that nested unroll loops create."""
    if isinstance(stmt, L.For):
        return max_unrolled_copies(stmt.body, factor * (stmt.extent if stmt.kind == "unroll"
                                                        else 1))
    if isinstance(stmt, L.Seq):
        return max((max_unrolled_copies(s, factor) for s in stmt.stmts), default=factor)
    if isinstance(stmt, L.IfThenElse):
        branches = [stmt.then] + ([stmt.orelse] if stmt.orelse is not None else [])
        return max(max_unrolled_copies(s, factor) for s in branches)
    return factor


def loop_allocations(stmt, inside: bool = False):
    """Buffers declared inside some loop (those outside every loop live on the heap on CPUs,
    in the kernel's frame on GPUs)."""
    if isinstance(stmt, L.Allocate):
        if inside:
            yield stmt.buffer
    elif isinstance(stmt, L.For):
        yield from loop_allocations(stmt.body, True)
    elif isinstance(stmt, L.Seq):
        for s in stmt.stmts:
            yield from loop_allocations(s, inside)
    elif isinstance(stmt, L.IfThenElse):
        yield from loop_allocations(stmt.then, inside)
        if stmt.orelse is not None:
            yield from loop_allocations(stmt.orelse, inside)


def _bytes(dtype: str) -> int:
    return {"f16": 2, "f32": 4, "f64": 8, "i32": 4, "i64": 8, "bool": 1}[dtype]


@dataclass(frozen=True)
class LaunchConfig:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int


def launch_of(kernel: L.Kernel) -> LaunchConfig:
    """Grid and block sizes from the bound loops of a CUDA kernel, and its shared memory."""
    dims = {tag: 1 for tag in L.GPU_BINDINGS}
    shared = 0
    for node in L.walk(kernel.body):
        if isinstance(node, L.For) and node.kind in dims:
            dims[node.kind] = node.extent
        elif isinstance(node, L.Allocate) and node.buffer.scope == "shared":
            shared += node.buffer.size * _bytes(node.buffer.dtype)
    grid = (dims["blockIdx.x"], dims["blockIdx.y"], dims["blockIdx.z"])
    block = (dims["threadIdx.x"], dims["threadIdx.y"], dims["threadIdx.z"])
    return LaunchConfig(grid, block, shared)


def estimate_registers(kernel: L.Kernel) -> int:
    """Registers per thread: local (register) arrays plus a fixed allowance for addressing."""
    local = sum(n.buffer.size for n in L.walk(kernel.body)
                if isinstance(n, L.Allocate) and n.buffer.scope == "local")
    return local + 24


# ----------------------------------------------------------------------------- generic
# Below this many iterations of its main stage (spatial x reduction) an operator's default
# CPU schedule is serial: its parallel regions, one per stage, cost more to wake than they
# save (a 64x256 LayerNormalization: 21 us serial, 245 us parallel in the transformer
# encoder's tuning records on the 2-core VM). The search still tries both.
SERIAL_DEFAULT_WORK = 32768


# CUDA reductions cut into parts (`GenericTemplate.split_stages`): a reduction stage with
# fewer outputs than this and a first reduction axis at least MIN_SPLIT_EXTENT long. One
# thread reducing 1000 elements serially is latency-bound: a generated Softmax over
# 1x1000 took 122 us on an H200 (2026-11-27), the slowest step of AlexNet's plan.
SPLIT_OUTPUTS_BELOW = 4096
MIN_SPLIT_EXTENT = 64
REDUCE_PARTS = (1, 16, 64, 256)
PREFERRED_REDUCE_PARTS = (64, 1, 256, 16)


class GenericTemplate(Template):
    """Any operator. CPU: parallel outer loops, vectorised innermost spatial loop and, for
    reductions with two or more spatial axes, a (rows x vector) register tile (matmul).
    CUDA: spatial loops fused and split over blocks and threads, one output per thread
    (or `per_thread` consecutive ones), reduction serial in a register."""

    name = "generic"
    splits_reductions = True    # CUDA `reduce_parts` (see `split_stages`)

    def space(self) -> KnobSpace:
        stage = self.main_stage
        extents = [int(a.extent.value) for a in stage.axes]
        last = extents[-1] if extents else 1
        if self.target == "cpu":
            lanes = self.limits.vector_lanes
            space = KnobSpace(vector=_choices([1, 4, 8, lanes, 2 * lanes], max(last, 1)),
                              parallel=[1, 0])
            if stage.reduce is not None and len(extents) >= 2:
                space["rows"] = _choices([1, 2, 4, 8], extents[-2])
            return space
        total = math.prod(extents) if extents else 1
        threads = [t for t in (32, 64, 128, 256, 512, 1024)
                   if t <= self.limits.max_threads_per_block]
        space = KnobSpace(threads=[t for t in threads if t <= max(32, total)] or [32],
                          per_thread=[1, 2, 4])
        if self.split_stages():
            space["reduce_parts"] = list(REDUCE_PARTS)
        return space

    def knob_defaults(self) -> dict:
        # configs recorded before the knob existed meant one thread per reduction
        return {"reduce_parts": 1} if self.target != "cpu" and self.split_stages() else {}

    def split_stages(self) -> list:
        """CUDA: the reduction stages whose outputs are too few to fill the GPU with one
        serial reduction per thread, and whose first reduction axis is long enough to cut
        into parts (`reduce_parts`, `wpk.dsl.rfactor`): a softmax or a layer norm over a
        few long rows. Empty on the CPU and in subclasses that schedule reductions their
        own way."""
        if self.target == "cpu" or not self.splits_reductions:
            return []
        out = []
        for stage in self.op.stages:
            red = stage.reduce
            if red is None or not red.axes or not isinstance(red.axes[0].extent, C.Const):
                continue
            outputs = math.prod(int(a.extent.value) for a in stage.axes
                                if isinstance(a.extent, C.Const))
            if int(red.axes[0].extent.value) >= MIN_SPLIT_EXTENT \
                    and outputs < SPLIT_OUTPUTS_BELOW:
                out.append(stage)
        return out

    def transformed(self, config: dict):
        """With `reduce_parts` > 1, each stage of `split_stages` cut into partial
        reductions on its first reduction axis: as many parts as the largest divisor of
        its extent up to `reduce_parts` (a stage whose extent has none keeps one thread)."""
        parts = config.get("reduce_parts", 1)
        op = self.op
        if parts <= 1:
            return op
        for stage in self.split_stages():
            axis = stage.reduce.axes[0]
            divisor = max(d for d in range(1, parts + 1) if int(axis.extent.value) % d == 0)
            if divisor > 1:
                op = rfactor(op, stage.name, axis.name, divisor)
        return op

    def preferred_points(self):
        points = list(self.space().points())
        if self.target == "cpu":
            lanes = self.limits.vector_lanes
            parallel = int(self.main_work() >= SERIAL_DEFAULT_WORK)
            points.sort(key=lambda p: (p["parallel"] != parallel, abs(p["vector"] - lanes),
                                       -p.get("rows", 1)))
        else:
            # a split reduction first where there are reductions to split, one thread per
            # reduction second, so that the predictions (or measurements) compare both
            rank = {parts: i for i, parts in enumerate(PREFERRED_REDUCE_PARTS)}
            points.sort(key=lambda p: (rank.get(p.get("reduce_parts", 1), len(rank)),
                                       p["threads"] != 256, p["per_thread"]))
        return points

    def main_work(self) -> int:
        """Iterations of the main stage: its spatial extents times its reduction's."""
        stage = self.main_stage
        axes = [*stage.axes, *(stage.reduce.axes if stage.reduce is not None else ())]
        return math.prod(int(a.extent.value) for a in axes)

    def _apply(self, sched: Schedule, config: dict) -> None:
        self.apply_generic(sched, config)

    def apply_generic(self, sched: Schedule, config: dict, done=frozenset()) -> None:
        """The generic schedule of every stage not inlined, fused or in `done`."""
        for stage in sched.op.stages:
            s = sched[stage.name]
            if s.placement == "inline" or _is_fused_epilogue(sched.op, stage) \
                    or stage.name in done:
                continue
            if self.target == "cpu":
                _generic_cpu(s, config)
            else:
                _generic_gpu(s, config)


def _is_fused_epilogue(op, stage) -> bool:
    return any(fused_epilogue(op, s) is stage for s in op.stages)


def _generic_cpu(s: StageSchedule, config: dict) -> None:
    spatial = [a.name for a in s.roots if a.kind == "spatial"]
    reduce = [a.name for a in s.roots if a.kind == "reduce"]
    if not spatial:
        return
    vec = min(config["vector"], s.axes[spatial[-1]].extent)
    last_o, last_i = s.split(spatial[-1], vec)
    rows = config.get("rows", 1) if reduce and len(spatial) >= 2 else 1
    outer = spatial[:-1]
    tile = [last_i]
    if rows > 1:
        row_o, row_i = s.split(spatial[-2], min(rows, s.axes[spatial[-2]].extent))
        outer = spatial[:-2] + [row_o]
        tile = [row_i, last_i]
        s.unroll(row_i)
    s.reorder(*outer, last_o, *reduce, *tile)
    if reduce:
        s.cache_write(last_o)
    if vec > 1:
        s.vectorize(last_i)
    if config["parallel"]:
        loops = outer + [last_o]
        fused = loops[0]
        for nxt in loops[1:-1] if len(loops) > 1 else []:
            fused = s.fuse(fused, nxt)
        s.parallel(fused)


def _generic_gpu(s: StageSchedule, config: dict) -> None:
    spatial = [a.name for a in s.roots if a.kind == "spatial"]
    if not spatial:
        raise ScheduleError(f"stage {s.stage} has no spatial loop to map onto threads")
    fused = spatial[0]
    for nxt in spatial[1:]:
        fused = s.fuse(fused, nxt)
    per = config["per_thread"]
    threads = config["threads"]
    reduce = [a.name for a in s.roots if a.kind == "reduce"]
    inner = None
    if per > 1:
        fused, inner = s.split(fused, per)
        s.unroll(inner)
    block, thread = s.split(fused, threads)
    s.bind(block, "blockIdx.x")
    s.bind(thread, "threadIdx.x")
    if inner is not None:
        s.reorder(block, thread, *reduce, inner)
        if reduce:
            s.cache_write(thread)
