"""Random input sets and their float64 references, drawn once per workload and generator
state and shared by every candidate measured on them.

    first = draw(workload, rng)          # first.inputs: a copy; first.expected(): float64
    second = draw(workload, rng, first, kept=workload.const_inputs)   # fresh data inputs

Every candidate of a workload is measured with the same seed (`runner.measurement_seed`),
so the generator reaches `draw` in the same state for each: the inputs are generated and
the float64 reference (`wpk.kernels.reference`) computed once, not once per candidate
(on VGG-19, 40% of an untuned build went to references and 10% to random inputs). Each
caller gets its own copy of the inputs (a kernel that writes into one is caught by the
measurement and must not spoil the next candidate's), and the generator is left in the
state a real draw leaves it in. The cache is per process and bounded (`MAX_BYTES`,
least recently used first out).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from wpk.core.workload import Workload
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference

MAX_BYTES = 1 << 30


class _Entry:
    def __init__(self, inputs: list, state: dict):
        self.inputs = inputs          # the cached originals, never handed out
        self.state = state            # the generator's state after the draw
        self.expected: list | None = None
        self.nbytes = sum(x.nbytes for x in inputs if x is not None)


_CACHE: OrderedDict[tuple, _Entry] = OrderedDict()
_cached_bytes = 0


def _key(workload: Workload, rng: np.random.Generator, first: InputSet | None,
         kept: tuple[int, ...]) -> tuple:
    state = json.dumps(rng.bit_generator.state, sort_keys=True, default=str)
    return workload.key, state, None if first is None else first.key, kept


def _copy_except(arrays: Sequence, skipped: tuple[int, ...] = ()) -> list:
    """Copies of `arrays`, None at the indices `skipped`."""
    return [None if x is None or i in skipped else np.array(x, copy=True)
            for i, x in enumerate(arrays)]


class InputSet:
    """One drawn input set: `inputs` (the caller's copy), `expected()` (float64 reference
    outputs of those values, computed once per cached set)."""

    def __init__(self, workload: Workload, key: tuple, entry: _Entry,
                 first: InputSet | None = None, kept: tuple[int, ...] = ()):
        self.key = key
        self._workload = workload
        self._entry = entry
        self.inputs = _copy_except(entry.inputs, kept)
        for index in kept:      # the first set's copies, not copied again
            self.inputs[index] = first.inputs[index]

    def original(self, index: int):
        """The cached value of input `index` (read it, never write it)."""
        return self._entry.inputs[index]

    def expected(self) -> list:
        entry = self._entry
        if entry.expected is None:
            entry.expected = reference(self._workload, entry.inputs)
        return entry.expected


def draw(workload: Workload, rng: np.random.Generator, first: InputSet | None = None,
         kept: Sequence[int] = ()) -> InputSet:
    """The workload's random inputs drawn from `rng`; with `first`, its inputs at the
    indices `kept` (the constants a kernel was prepared with) replace the fresh ones:
    the same arrays as `first.inputs` there, not copies."""
    kept = tuple(sorted(kept))
    key = _key(workload, rng, first, kept)
    entry = _CACHE.get(key)
    if entry is None:
        drawn = list(random_inputs(workload, rng))
        for index in kept:
            drawn[index] = first.original(index)
        entry = _Entry(_copy_except(drawn), rng.bit_generator.state)
        _remember(key, entry)
    else:
        _CACHE.move_to_end(key)
        rng.bit_generator.state = entry.state
    return InputSet(workload, key, entry, first, kept)


def _remember(key: tuple, entry: _Entry) -> None:
    global _cached_bytes
    if entry.nbytes > MAX_BYTES:
        return
    _CACHE[key] = entry
    _cached_bytes += entry.nbytes
    while _cached_bytes > MAX_BYTES:
        _cached_bytes -= _CACHE.popitem(last=False)[1].nbytes


def clear() -> None:
    """Forget every cached input set (a build does when planning is done)."""
    global _cached_bytes
    _CACHE.clear()
    _cached_bytes = 0
