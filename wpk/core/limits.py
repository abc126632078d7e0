"""Resource limits: what a model may ask of this machine before wpk refuses it.

A model of a few hundred bytes can declare a 64 GiB tensor (a `ConstantOfShape`
of [2^20]^3, a `Pad` or an `Expand` to a huge shape), a `Loop` of 10^12
iterations, or an input dim of 10^11. The frontend checks every dim, constant
and tensor size, the model's estimated memory (the sum of the sizes of its
activations and weights) and `Loop` trip counts against `Limits` *before*
anything is allocated or evaluated, and raises `LimitError` naming the
tensor or node.

    limits = Limits.of("4G")          # --max-memory 4G; None: half the machine's RAM
    limits.check_tensor("x", (1, 3, 224, 224), "float32", "input 'x' of 'm.onnx'")
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from wpk.core.errors import ModelError, OptionError

DEFAULT_MEMORY_FRACTION = 0.5  # of the machine's RAM, when --max-memory is not given
FALLBACK_MACHINE_MEMORY = 8 << 30  # when the OS does not say
MAX_LOOP_TRIPS = 100_000
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
MEMORY_FORMS = "a size such as 4G, 512M, 1.5G or 1073741824 (bytes)"


class LimitError(ModelError):
    """The model asks for more than the limits allow (memory, dims, loop trips)."""


def machine_memory() -> int:
    """This machine's physical memory in bytes."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return FALLBACK_MACHINE_MEMORY


def default_max_memory() -> int:
    """The default `--max-memory`: a fraction (DEFAULT_MEMORY_FRACTION) of the RAM."""
    return int(machine_memory() * DEFAULT_MEMORY_FRACTION)


def parse_memory(value: int | str) -> int:
    """Bytes from `4G`, `512M`, `1.5g`, `2GiB`, `1048576` or an int; OptionError otherwise."""
    if isinstance(value, bool):
        raise OptionError(f"--max-memory must be {MEMORY_FORMS}, not {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _MEMORY.match(str(value))
        if match is None:
            raise OptionError(f"--max-memory: cannot read '{value}'",
                              hint=f"give {MEMORY_FORMS}")
        size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size <= 0:
        raise OptionError(f"--max-memory must be positive, not {value!r}",
                          hint=f"give {MEMORY_FORMS}")
    return size


def format_bytes(size: int) -> str:
    """`size` bytes for people: 512 B, 1.5 KiB, 64.0 GiB."""
    if size < 1024:
        return f"{size} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        size /= 1024
        if size < 1024 or unit == "EiB":
            return f"{size:.1f} {unit}"
    return f"{size:.1f} EiB"


def itemsize(dtype) -> int:
    """Bytes per element of a numpy dtype (or its name); 8 for strings and objects."""
    try:
        return max(np.dtype(dtype).itemsize, 1)
    except TypeError:
        return 8


def tensor_bytes(shape: Sequence[int], dtype) -> int:
    """Bytes of a tensor of `shape` and `dtype`, in Python ints (no overflow)."""
    return math.prod(int(d) for d in shape) * itemsize(dtype)


def shape_text(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) if len(shape) else "scalar"


@dataclass(frozen=True)
class Limits:
    """What one build or inspection may use: `max_memory` bytes for the model's tensors,
    `max_loop_trips` iterations for a `Loop`."""

    max_memory: int
    max_loop_trips: int = MAX_LOOP_TRIPS

    @classmethod
    def of(cls, max_memory: int | str | None = None) -> Limits:
        """Limits for `--max-memory` (None: `default_max_memory()`)."""
        if isinstance(max_memory, Limits):
            return max_memory
        return cls(default_max_memory() if max_memory is None else parse_memory(max_memory))

    def hint(self, needed: int | None = None) -> str:
        """What to do about a LimitError on memory (`needed`: the bytes asked for)."""
        above = "" if needed is None else f" above {format_bytes(needed)}"
        return (f"raise --max-memory{above} (max_memory= in the Python API; the default is "
                "half the machine's RAM) if the model really needs that much, or fix the "
                "model's shapes")

    def check_tensor(self, shape: Sequence[int], dtype, what: str) -> None:
        """Raise LimitError if one tensor (`what` names it) has a dim or a size over the limit."""
        for axis, dim in enumerate(shape):
            if int(dim) > self.max_memory:
                raise LimitError(f"{what} has dim {int(dim)} at axis {axis}, more elements "
                                 f"than --max-memory allows", hint=self.hint())
        size = tensor_bytes(shape, dtype)
        if size > self.max_memory:
            raise LimitError(f"{what} ({shape_text(shape)} {_dtype_name(dtype)}) takes "
                             f"{format_bytes(size)}, more than --max-memory "
                             f"{format_bytes(self.max_memory)}", hint=self.hint(size))

    def check_total(self, tensors: Iterable[tuple[str, Sequence[int], object]],
                    where: str, describe=None) -> None:
        """Raise LimitError if the sizes of `tensors` ((name, shape, dtype)) sum over the
        limit, naming the largest; `describe(name)` says what a tensor is (producer)."""
        total, largest, largest_size = 0, None, -1
        for name, shape, dtype in tensors:
            self.check_tensor(shape, dtype, _label(name, describe))
            size = tensor_bytes(shape, dtype)
            total += size
            if size > largest_size:
                largest, largest_size = (name, shape, dtype), size
        if total > self.max_memory and largest is not None:
            name, shape, dtype = largest
            raise LimitError(
                f"{where} needs about {format_bytes(total)} for its tensors (activations and "
                f"weights), more than --max-memory {format_bytes(self.max_memory)}; the "
                f"largest is {_label(name, describe)} ({shape_text(shape)}, "
                f"{format_bytes(largest_size)})", hint=self.hint(total))

    def check_trips(self, trips: int, what: str) -> None:
        """Raise LimitError if a `Loop` (`what` names it) runs more than `max_loop_trips`."""
        if trips > self.max_loop_trips:
            raise LimitError(f"{what} has a trip count of {trips}, more than the "
                             f"{self.max_loop_trips:,} iterations wpk evaluates or runs",
                             hint="shorten the loop (or give its trip count as an input)")


def _dtype_name(dtype) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def _label(name: str, describe) -> str:
    text = describe(name) if describe is not None else None
    return text or f"tensor '{name}'"
