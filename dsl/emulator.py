"""GPU emulator: runs CUDA-scheduled loop IR on the CPU, checking what a GPU would not.

Every (block, thread) pair is one *lane*; a kernel is translated once into a
Python function whose statements run for all lanes at once with numpy (thread
and block indices are lane arrays, serial loops are Python loops, `if`s are
lane masks). Shared memory is one array per block, local memory one per lane.
Blocks are processed in chunks so big grids stay within memory.

Because lanes run in lock step, a missing `__syncthreads()` would go unnoticed,
so barriers are *phase boundaries*: per shared element the emulator records the
thread that wrote it and the threads that read it since the last barrier, and
reports a data race when another thread touches it in the same phase. It also
reports out-of-bounds accesses, two threads storing to one global element, and
barriers reached by only part of a block.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.errors import WpkError
from wpk.dsl import loopir as L
from wpk.dsl.templates import launch_of

MAX_LANES = 1 << 16
_NP = {"f32": np.float32, "f64": np.float64, "i32": np.int64, "i64": np.int64, "bool": np.bool_,
       "f16": np.float16}
_FUNCS = {"exp": "np.exp", "log": "np.log", "sqrt": "np.sqrt", "tanh": "np.tanh",
          "abs": "np.abs", "floor": "np.floor", "ceil": "np.ceil", "round": "np.rint",
          "erf": "_erf"}


class EmulatorError(WpkError):
    """The emulated kernel did something invalid on a GPU (race, out of bounds, ...)."""


class _PyPrinter:
    """Loop IR -> Python source over lane arrays (`m` is the current lane mask)."""

    def __init__(self, scopes: dict[str, str]):
        self.scopes = scopes
        self.lines: list[str] = []
        self.indent = 1
        self.tmp = 0

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def fresh(self, prefix: str) -> str:
        self.tmp += 1
        return f"_{prefix}{self.tmp}"

    def expr(self, e: L.Expr, m: str) -> str:
        if isinstance(e, L.Var):
            return e.name
        if isinstance(e, L.Imm):
            if e.dtype == "bool":
                return "True" if e.value else "False"
            if e.dtype in ("i32", "i64"):
                return str(int(e.value))
            return f"_f{e.dtype}({str(float(e.value))!r})"
        if isinstance(e, L.Load):
            return f"_ld({e.buffer!r}, {self.expr(e.index, m)}, {m})"
        if isinstance(e, L.Select):
            c = self.fresh("c")
            a = self.expr(e.a, f"_and({m}, {c})")
            b = self.expr(e.b, f"_and({m}, ~{c})")
            return f"np.where(({c} := _bool({self.expr(e.cond, m)})), {a}, {b})"
        if isinstance(e, L.Cast):
            return f"_cast({self.expr(e.value, m)}, {e.dtype!r})"
        if isinstance(e, L.Call):
            x = self.expr(e.args[0], m)
            special = {"sigmoid": f"(1 / (1 + np.exp(-({x}))))", "rsqrt": f"(1 / np.sqrt({x}))",
                       "neg": f"(-({x}))", "not": f"(~_bool({x}))"}
            if e.func in special:
                return f"_cast({special[e.func]}, {e.dtype!r})"
            return f"_cast({_FUNCS[e.func]}({x}), {e.dtype!r})"
        if isinstance(e, L.Bin):
            a, b = self.expr(e.a, m), self.expr(e.b, m)
            if e.op in ("and", "or"):
                return f"(_bool({a}) {'&' if e.op == 'and' else '|'} _bool({b}))"
            if e.op in ("min", "max"):
                return f"np.{'minimum' if e.op == 'min' else 'maximum'}({a}, {b})"
            if e.op == "pow":
                return f"np.power({a}, {b})"
            if e.op == "/" :
                return f"_cast(({a}) / ({b}), {e.dtype!r})"
            return f"({a} {e.op} {b})"
        raise TypeError(e)

    def stmt(self, s: L.Stmt, m: str) -> None:
        if isinstance(s, L.Seq):
            for child in s.stmts:
                self.stmt(child, m)
        elif isinstance(s, L.For):
            if s.kind in L.GPU_BINDINGS:
                self.emit(f"{s.var.name} = _dims[{s.kind!r}]")
                self.stmt(s.body, m)
            else:
                self.emit(f"for {s.var.name} in range({s.extent}):")
                self.indent += 1
                self.stmt(s.body, m)
                self.emit("pass")
                self.indent -= 1
        elif isinstance(s, L.Allocate):
            self.emit(f"_alloc({s.buffer.name!r})")
        elif isinstance(s, L.Store):
            self.emit(f"_st({s.buffer!r}, {self.expr(s.index, m)}, "
                      f"{self.expr(s.value, m)}, {m})")
        elif isinstance(s, L.IfThenElse):
            c = self.fresh("m")
            self.emit(f"{c} = _and({m}, {self.expr(s.cond, m)})")
            self.emit(f"if _any({c}):")
            self.indent += 1
            self.stmt(s.then, c)
            self.emit("pass")
            self.indent -= 1
            if s.orelse is not None:
                e = self.fresh("m")
                self.emit(f"{e} = _and({m}, ~{c})")
                self.emit(f"if _any({e}):")
                self.indent += 1
                self.stmt(s.orelse, e)
                self.emit("pass")
                self.indent -= 1
        elif isinstance(s, L.Barrier):
            self.emit(f"_barrier({m})")
        elif isinstance(s, L.Comment):
            pass
        else:
            raise TypeError(s)


def kernel_source(kernel: L.Kernel, scopes: dict[str, str]) -> str:
    """The Python source the emulator runs for one kernel (for debugging)."""
    printer = _PyPrinter(scopes)
    printer.stmt(kernel.body, "None")
    return "def _kernel():\n" + "\n".join(printer.lines) + "\n    pass\n"


class _Chunk:
    """State of one chunk of blocks: lane indices, shared/local arrays and race trackers."""

    def __init__(self, func: L.PrimFunc, launch, globals_: dict, block0: int, nblocks: int):
        self.func, self.globals = func, globals_
        gx, gy, _ = launch.grid
        tx, ty, _ = launch.block
        self.threads = math.prod(launch.block)
        lane = np.arange(nblocks * self.threads)
        self.lanes = lane.size
        self.block = lane // self.threads          # block index within the chunk
        block = block0 + self.block
        self.tid = lane % self.threads
        self.dims = {"blockIdx.x": block % gx, "blockIdx.y": (block // gx) % gy,
                     "blockIdx.z": block // (gx * gy), "threadIdx.x": self.tid % tx,
                     "threadIdx.y": (self.tid // tx) % ty, "threadIdx.z": self.tid // (tx * ty)}
        self.block0, self.nblocks = block0, nblocks
        self.arrays: dict[str, np.ndarray] = {}
        self.writer: dict[str, np.ndarray] = {}
        self.reader: dict[str, np.ndarray] = {}
        self.buffers: dict[str, L.Buffer] = {}
        self.scratch: dict[str, np.ndarray] = {}   # duplicate detection, per array
        self.block_offsets: dict[int, np.ndarray] = {}
        self.local_offsets: dict[int, np.ndarray] = {}

    def where(self, lane: int) -> str:
        return (f"block {self.block0 + int(self.block[lane])} thread {int(self.tid[lane])} "
                f"(kernel {self.func.name})")

    def active(self, m) -> np.ndarray:
        if m is None:
            return np.ones(self.lanes, bool)
        return np.broadcast_to(np.asarray(m, bool), (self.lanes,))

    def alloc(self, name: str) -> None:
        buf = self.buffers[name]
        rows = self.nblocks if buf.scope == "shared" else self.lanes
        fill = np.nan if buf.dtype.startswith("f") else 0
        self.arrays[name] = np.full((rows, buf.size), fill, _NP[buf.dtype])
        if buf.scope == "shared":
            self.writer[name] = np.full((rows, buf.size), -1, np.int64)
            self.reader[name] = np.full((rows, buf.size), -1, np.int64)

    def _check_bounds(self, name, idx, act, size, what):
        bad = act & ((idx < 0) | (idx >= size))
        if bad.any():
            lane = int(np.argmax(bad))
            raise EmulatorError(f"out-of-bounds {what} of {name}[{int(idx[lane])}] (size {size}) "
                                f"by {self.where(lane)}",
                                hint="the schedule or the code generator produced a bad index")

    def _safe_index(self, name, idx, m, size, what) -> tuple[np.ndarray, np.ndarray | None]:
        """(per-lane index with inactive lanes at 0, the active mask or None when every
        lane is active), after checking the active lanes' indices are inside `size`."""
        idx = np.broadcast_to(np.asarray(idx, np.int64), (self.lanes,))
        act = None if m is None else np.broadcast_to(np.asarray(m, bool), (self.lanes,))
        safe = idx if act is None else np.where(act, idx, 0)
        if safe.size and (safe.min() < 0 or safe.max() >= size):
            self._check_bounds(name, idx, self.active(act), size, what)
        return safe, act

    def _offsets(self, size: int) -> np.ndarray:
        """Each lane's block row start in a flattened per-block array of `size` columns."""
        offsets = self.block_offsets.get(size)
        if offsets is None:
            offsets = self.block_offsets[size] = self.block * size
        return offsets

    def load(self, name: str, idx, m):
        if name in self.globals:
            arr = self.globals[name]
            if np.ndim(idx) == 0 and (m is None or np.ndim(m) == 0):
                if m is None or bool(m):
                    self._check_bounds(name, np.full(1, idx), np.ones(1, bool), arr.size, "read")
                    return arr[int(idx)]
                return arr.dtype.type(0)
            safe, _ = self._safe_index(name, idx, m, arr.size, "read")
            return arr[safe]
        arr = self.arrays[name]
        size = arr.shape[1]
        safe, act = self._safe_index(name, idx, m, size, "read")
        if self.buffers[name].scope == "local":
            return arr.reshape(-1)[self.lane_offsets(size) + safe]
        keys = self._offsets(size) + safe
        writer = self.writer[name].reshape(-1)[keys]
        race = (writer >= 0) & (writer != self.tid)
        if act is not None:
            race &= act
        if race.any():
            lane = int(np.argmax(race))
            raise EmulatorError(f"data race: {self.where(lane)} reads {name}[{int(safe[lane])}] "
                                f"written by thread {int(writer[lane])} since the last barrier",
                                hint="a __syncthreads() is missing between the write and the read")
        self._mark_readers(name, keys, act)
        return arr.reshape(-1)[keys]

    def lane_offsets(self, size: int) -> np.ndarray:
        """Each lane's row start in a flattened per-lane (local) array of `size` columns."""
        offsets = self.local_offsets.get(size)
        if offsets is None:
            offsets = self.local_offsets[size] = np.arange(self.lanes) * size
        return offsets

    def _mark_readers(self, name, keys, act):
        """Record the reading thread of every element (-2: read by several threads since
        the last barrier), without sorting: after a scattered write of the thread ids, an
        element read by two threads in this statement holds only one of them."""
        tids = self.tid
        if act is not None:
            keys, tids = keys[act], tids[act]
        if keys.size == 0:
            return
        reader = self.reader[name].reshape(-1)
        old = reader[keys]
        if ((old == -2) | (old == tids)).all():   # read again by the same readers: no change
            return
        reader[keys] = tids
        shared_read = (reader[keys] != tids) | ((old != -1) & (old != tids))
        if shared_read.any():
            reader[keys[shared_read]] = -2

    def _has_duplicates(self, name: str, keys: np.ndarray, size: int) -> bool:
        """Whether `keys` (< size) repeat, in linear time: scatter each key's position into a
        scratch array and see whether every position reads itself back."""
        scratch = self.scratch.get(name)
        if scratch is None or scratch.size < size:
            scratch = self.scratch[name] = np.empty(size, np.int64)
        order = np.arange(keys.size)
        scratch[keys] = order
        return bool((scratch[keys] != order).any())

    def store(self, name: str, idx, value, m) -> None:
        arr = self.globals.get(name)
        size = arr.size if arr is not None else self.arrays[name].shape[1]
        safe, act = self._safe_index(name, idx, m, size, "write")
        value = np.broadcast_to(np.asarray(value), (self.lanes,))
        if arr is not None:
            targets = safe if act is None else safe[act]
            if self._has_duplicates(name, targets, arr.size):
                raise EmulatorError(f"data race: several threads of kernel {self.func.name} "
                                    f"store to the same element of {name} in one statement",
                                    hint="each output element must have exactly one writer")
            arr[targets] = value if act is None else value[act]
            return
        flat = self.arrays[name].reshape(-1)
        if self.buffers[name].scope == "local":
            keys = self.lane_offsets(size) + safe
            flat[keys if act is None else keys[act]] = value if act is None else value[act]
            return
        keys, tids = self._offsets(size) + safe, self.tid
        if act is not None:
            keys, tids, value = keys[act], tids[act], value[act]
        writer = self.writer[name].reshape(-1)
        reader = self.reader[name].reshape(-1)[keys]
        old = writer[keys]
        clash = ((old >= 0) & (old != tids)) | ((reader != -1) & (reader != tids))
        if clash.any() or self._has_duplicates(name, keys, flat.size):
            raise EmulatorError(f"data race on shared {name} in kernel {self.func.name}: an "
                                "element is written by one thread and touched by another "
                                "in the same phase",
                                hint="a __syncthreads() is missing before this write")
        writer[keys] = tids
        flat[keys] = value

    def barrier(self, m) -> None:
        if m is not None and not np.all(m):
            raise EmulatorError(f"__syncthreads() reached by only part of a block in kernel "
                                f"{self.func.name}", hint="barriers must not be inside "
                                "thread-dependent conditions")
        for name in self.writer:
            self.writer[name].fill(-1)
            self.reader[name].fill(-1)


def _erf(x):
    from scipy.special import erf

    return erf(x)


def _cast(x, dtype):
    return np.asarray(x).astype(_NP[dtype]) if np.ndim(x) else _NP[dtype](x)


def run_kernel(func: L.PrimFunc, kernel: L.Kernel, launch, globals_: dict,
               blocks: Sequence[int] | None = None) -> None:
    """Execute one kernel over its whole grid (in chunks of blocks), or only over the given
    linear block ids (one vectorised chunk), as sampled verification does."""
    buffers = {n.buffer.name: n.buffer for n in L.walk(kernel.body) if isinstance(n, L.Allocate)}
    source = kernel_source(kernel, {name: b.scope for name, b in buffers.items()})
    if blocks is not None:
        chunk = _Chunk(func, launch, globals_, 0, len(blocks))
        chunk.buffers = buffers
        ids = np.asarray(blocks, np.int64)[chunk.block]
        gx, gy, _ = launch.grid
        chunk.dims.update({"blockIdx.x": ids % gx, "blockIdx.y": (ids // gx) % gy,
                           "blockIdx.z": ids // (gx * gy)})
        _execute(kernel, source, chunk)
        return
    count = math.prod(launch.grid)
    per_chunk = max(1, MAX_LANES // math.prod(launch.block))
    for block0 in range(0, count, per_chunk):
        chunk = _Chunk(func, launch, globals_, block0, min(per_chunk, count - block0))
        chunk.buffers = buffers
        _execute(kernel, source, chunk)


def _execute(kernel: L.Kernel, source: str, chunk: _Chunk) -> None:
    namespace = {
        "np": np, "_dims": chunk.dims, "_ld": chunk.load, "_st": chunk.store,
        "_alloc": chunk.alloc, "_barrier": chunk.barrier, "_erf": _erf, "_cast": _cast,
        "_and": lambda m, c: np.asarray(c, bool) if m is None else (m & np.asarray(c, bool)),
        "_any": lambda m: m is None or bool(np.any(m)),
        "_bool": lambda c: np.asarray(c, bool),
        "_ff32": np.float32, "_ff64": np.float64, "_ff16": np.float16,
    }
    exec(compile(source, f"<emulated {kernel.name}>", "exec"), namespace)  # noqa: S102
    with np.errstate(all="ignore"):
        namespace["_kernel"]()


def global_memory(func: L.PrimFunc, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The emulated global memory of `func`: flat copies of the inputs (checked against the
    parameter sizes), outputs and workspaces poisoned with NaN."""
    outputs = func.meta["outputs"]
    globals_: dict[str, np.ndarray] = {}
    for b in func.params + func.workspaces:
        if b.name in outputs or b in func.workspaces:
            globals_[b.name] = np.full(b.size, np.nan, _NP[b.dtype])
        else:
            arr = np.asarray(arrays[b.name], _NP[b.dtype])
            if arr.size != b.size:
                raise EmulatorError(f"{b.name} has shape {arr.shape}, expected {b.shape}")
            globals_[b.name] = arr.reshape(-1).copy()
    return globals_


def emulate(func: L.PrimFunc, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a CUDA-target `PrimFunc` on the CPU; returns its outputs (poisoned with NaN first,
    so an element no thread writes shows up)."""
    if func.target != "cuda":
        raise EmulatorError(f"{func.name} was lowered for {func.target}, not cuda")
    outputs = func.meta["outputs"]
    for b in func.params:
        if b.name not in outputs and np.shape(arrays[b.name]) != b.shape:
            raise EmulatorError(f"{b.name} has shape {np.shape(arrays[b.name])}, "
                                f"expected {b.shape}")
    globals_ = global_memory(func, arrays)
    for kernel in func.kernels:
        run_kernel(func, kernel, launch_of(kernel), globals_)
    return {name: globals_[name].reshape(func.buffer(name).shape) for name in outputs}
