"""numpy library kernels for elementwise chains, data movement, softmax and normalizations.

- `numpy.elementwise`: wpk's `Elementwise` op (a fused chain of epilogue steps)
  and the ONNX unary/binary elementwise ops, written with ufuncs into the
  output (`out=`), no temporaries for most steps.
- `numpy.copy`: Reshape/Flatten/Squeeze/Unsqueeze/Identity/Dropout/Transpose/Concat/
  Slice/Split/Gather/Resize(nearest)/DepthToSpace/SpaceToDepth/Expand/Tile as views or
  `np.copyto`/`np.take(out=)` into the outputs, of any dtype numpy holds.
- `numpy.sum`: Sum, Mean and variadic Max/Min, one ufunc pass per input.
- `numpy.softmax`, `numpy.layernorm`, `numpy.batchnorm`: in-place formulations
  (BatchNormalization folded to one scale and shift per channel in `prepare`).
- `numpy.formula`: every other supported op through its numpy formulation
  (`tensor_formulas`, `nn_formulas`) in the native dtype, copied into the output.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from wpk.core.epilogue import ONNX_BINARY_STEPS
from wpk.core.workload import EpilogueStep, Workload
from wpk.kernels.cpu.library import NumpyImplementation, finish_epilogue
from wpk.kernels.cpu.native_moves import native_form, same_bytes
from wpk.kernels.cpu.nn_formulas import NN_FORMULAS
from wpk.kernels.cpu.resize import is_index_copy, nearest_indices, static_resize_spec
from wpk.kernels.cpu.tensor_formulas import (
    BINARY_UFUNCS,
    TENSOR_FORMULAS,
    UNARY_AS_STEP,
    axis_bounds,
    slice_index,
    split_bounds,
    static_clip_step,
    unary_step,
)
from wpk.kernels.epilogue import apply_epilogue, apply_epilogue_into
from wpk.kernels.registry import Kernel, register
from wpk.kernels.support import NUMPY_DTYPES


def elementwise_steps(workload: Workload) -> tuple[EpilogueStep, ...]:
    """The whole computation of an elementwise workload as epilogue steps on input 0."""
    if workload.op in UNARY_AS_STEP:
        return (unary_step(workload),) + workload.epilogue
    clip = static_clip_step(workload)
    if clip is not None:
        return (clip,) + workload.epilogue
    if workload.op in BINARY_UFUNCS:
        return (EpilogueStep(ONNX_BINARY_STEPS[workload.op], operand=1),) + workload.epilogue
    return workload.epilogue


class NumpyElementwise(NumpyImplementation):
    """output = steps(input 0), the first step written straight into the output (`out=`).

    Serves wpk's `Elementwise` and the plain ONNX unary and binary elementwise ops (a Clip
    whose bounds are fixed too).
    """

    name = "numpy.elementwise"
    uses_blas = False
    ops = ("Elementwise", "Clip") + tuple(sorted(UNARY_AS_STEP)) + tuple(sorted(BINARY_UFUNCS))

    def extra_reason(self, workload: Workload) -> str | None:
        if workload.op in BINARY_UFUNCS and self.core_inputs(workload) != 2:
            return f"{workload.op} with more than two inputs goes through numpy.formula"
        if workload.op == "Clip" and static_clip_step(workload) is None:
            return "a Clip with bounds computed at run time goes through numpy.formula"
        return None

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        steps = elementwise_steps(workload)

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            apply_epilogue_into(outputs[0], inputs[0], steps, inputs)

        return kernel


_RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")


def _single_index(workload: Workload, consts: Mapping[int, np.ndarray]) -> tuple | None:
    """The basic index of a Gather of one constant index (the class token of a ViT): a
    view of the input, or None for any other Gather."""
    if workload.op != "Gather":
        return None
    value = workload.static_value(1)
    value = consts.get(1) if value is None else value
    if value is None or np.size(value) != 1:
        return None
    axis = int(workload.attr("axis", 0)) % len(workload.inputs[0].shape)
    k = int(np.asarray(value).reshape(-1)[0]) % workload.inputs[0].shape[axis]
    return (slice(None),) * axis + ((k,) if np.ndim(value) == 0 else (slice(k, k + 1),))


def _tile_blocks(workload: Workload) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Tile as a broadcast: the input's shape as (1, d_0, 1, d_1, ...) and the output's as
    (repeats_0, d_0, repeats_1, d_1, ...)."""
    dims = workload.inputs[0].shape
    repeats = [int(r) for r in np.asarray(workload.static_value(1)).reshape(-1)]
    source = tuple(x for d in dims for x in (1, d))
    blocks = tuple(x for r, d in zip(repeats, dims) for x in (r, d))
    return source, blocks


def _broadcast_views(workload: Workload):
    """`views(inputs, outputs)` of Expand and Tile: the input broadcast (zero strides) into
    the output; a Tile's output seen as blocks (the blocked shape only splits its axes, so
    it is a view of any output)."""
    if workload.op == "Expand":
        out_shape = workload.outputs[0].shape
        return lambda inputs, outputs: [(np.broadcast_to(inputs[0], out_shape), outputs[0])]
    source, blocks = _tile_blocks(workload)
    return lambda inputs, outputs: [(np.broadcast_to(inputs[0].reshape(source), blocks),
                                     outputs[0].reshape(blocks))]


class NumpyCopy(NumpyImplementation):
    """Data movement straight into the output buffers."""

    name = "numpy.copy"
    uses_blas = False
    ops = _RESHAPES + ("Transpose", "Concat", "Slice", "Gather", "Resize", "Split",
                       "DepthToSpace", "SpaceToDepth", "Expand", "Tile")
    dtypes = NUMPY_DTYPES   # bytes are bytes (`kernels.support` says which ops take which)

    def native_chain(self, workload: Workload) -> bool:
        """Moves described by views (all but Resize and a Gather of several or variable
        indices; Expand and Tile broadcast their input with zero strides) without an
        epilogue are one native copy (`native_moves`)."""
        if workload.op == "Gather":
            return 1 in workload.const_inputs and workload.inputs[1].shape in ((), (1,)) \
                and not workload.epilogue
        return workload.op != "Resize" and not workload.epilogue

    def algorithm(self, workload: Workload, config: Mapping) -> str:
        """'view (no copy)' for a step a CPU plan runs on its input's buffer, 'in place (no
        copy)' for a concat whose pieces a CPU plan may have written into its output
        (`places_inputs`; a piece the buffer plan cannot place is still copied), else
        'copy'."""
        if self.views_input(workload) or self.slices_input(workload) is not None:
            return "view (no copy)"
        return "in place (no copy)" if self.places_inputs(workload) else "copy"

    def views_input(self, workload: Workload) -> bool:
        """Whether the output is the first input reinterpreted (a Reshape-like without an
        epilogue, one output): the buffer plan may give both one buffer, and the copy of
        a buffer onto itself is skipped."""
        return workload.op in _RESHAPES and not workload.epilogue and \
            len(workload.outputs) == 1

    def places_inputs(self, workload: Workload) -> tuple[int, ...] | None:
        """Byte offsets of the inputs inside the output where each input is one contiguous
        piece of it (a Concat without an epilogue whose axis has only dims of 1 before it,
        as a batch-1 channel concat has), else None: the buffer plan may then have each
        producer write its input in place, and the copy of a piece onto itself is skipped."""
        if workload.op != "Concat" or workload.epilogue or len(workload.outputs) != 1:
            return None
        out = workload.outputs[0]
        inputs = workload.inputs[:self.core_inputs(workload)]
        axis = workload.attr("axis") % len(out.shape)
        if math.prod(out.shape[:axis]) != 1 or any(
                spec is None or spec.dtype != out.dtype for spec in inputs):
            return None
        item = np.dtype(out.dtype).itemsize
        return tuple(itertools.accumulate((math.prod(s.shape) * item for s in inputs[:-1]),
                                          initial=0))

    def slices_input(self, workload: Workload) -> int | None:
        """The byte offset of the output inside the first input where a Slice, or a Gather
        of one constant index, takes one contiguous run of its bytes (the inner axes whole,
        the outer ones 1 in the output: a packed QKV's third, a ViT's class token, a batch-1
        tensor's leading rows), else None: the buffer plan may then keep the output there,
        and the copy onto itself is skipped (`wpk.plans.buffers`)."""
        if workload.op not in ("Slice", "Gather") or workload.epilogue \
                or len(workload.outputs) != 1:
            return None
        source, out = workload.inputs[0], workload.outputs[0]
        if out.dtype != source.dtype or np.dtype(source.dtype).hasobject \
                or math.prod(out.shape) == 0:
            return None
        index = self._static_index(workload)
        if index is None:
            return None
        # indexing a stand-in with the source's strides over one element reads nothing:
        # where the part lands tells the offset, its strides whether it is one run
        item = np.dtype(source.dtype).itemsize
        base = np.zeros(1, source.dtype)
        strides = tuple(item * math.prod(source.shape[a + 1:]) for a in range(len(source.shape)))
        part = np.lib.stride_tricks.as_strided(base, source.shape, strides)[index]
        if part.size != math.prod(out.shape) or not part.flags.c_contiguous:
            return None
        return part.__array_interface__["data"][0] - base.__array_interface__["data"][0]

    @staticmethod
    def _static_index(workload: Workload) -> tuple | None:
        """The numpy index of a Slice of static starts and ends or a Gather of one constant
        index, else None."""
        if workload.op == "Gather":
            return _single_index(workload, {})
        values = [workload.static_value(i) for i in range(len(workload.inputs))]
        if workload.opset >= 10 and (len(values) < 3 or values[1] is None or values[2] is None
                                     or any(v is None and spec is not None for v, spec in
                                            zip(values[3:], workload.inputs[3:]))):
            return None
        return slice_index(workload, values, workload.inputs[0].shape)

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        op, steps = workload.op, workload.epilogue
        views = None
        if op == "Resize":
            spec = static_resize_spec(workload)
            index = np.ix_(*(nearest_indices(spec, a) for a in range(len(spec.in_shape))))

            def move(inputs, outputs):
                np.copyto(outputs[0], inputs[0][index])
        elif op == "Gather" and _single_index(workload, consts) is None:
            axis = workload.attr("axis", 0)

            def move(inputs, outputs):
                np.take(inputs[0], inputs[1], axis=axis, out=outputs[0])
        else:
            views = self._views(workload, consts)

            def move(inputs, outputs):
                for src, dst in views(inputs, outputs):
                    if not same_bytes(src, dst):
                        np.copyto(dst, src)

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            move(inputs, outputs)
            finish_epilogue(outputs[0], steps, inputs)

        if views is not None and not steps:
            kernel.native = native_form(kernel, views, per_input=op == "Concat")
        return kernel

    def _views(self, workload: Workload, consts: Mapping[int, np.ndarray]):
        """`views(inputs, outputs)`: the (source view, destination view) pairs the step
        copies (Reshape-likes, Transpose, Slice, Concat, Split, a Gather of one constant
        index, the broadcasts of Expand and Tile), for its numpy copy and its native form."""
        op, out_shape = workload.op, workload.outputs[0].shape
        if op in ("Expand", "Tile"):
            return _broadcast_views(workload)
        if op == "Gather":
            index = _single_index(workload, consts)
            return lambda inputs, outputs: [(inputs[0][index].reshape(out_shape), outputs[0])]
        if op in _RESHAPES:
            return lambda inputs, outputs: [(inputs[0].reshape(out_shape), outputs[0])]
        if op == "Transpose":
            perm = workload.attr("perm") or tuple(reversed(range(len(workload.inputs[0].shape))))
            return lambda inputs, outputs: [(inputs[0].transpose(perm), outputs[0])]
        if op in ("DepthToSpace", "SpaceToDepth"):
            return pixel_shuffle_views(workload)
        if op == "Slice":
            index = slice_index(workload, [workload.static_value(i)
                                           for i in range(len(workload.inputs))],
                                workload.inputs[0].shape)
            return lambda inputs, outputs: [(inputs[0][index], outputs[0])]
        if op == "Split":
            axis, bounds = split_bounds(workload)
            lead = (slice(None),) * axis
            return lambda inputs, outputs: [(inputs[0][lead + (slice(lo, hi),)], out)
                                            for (lo, hi), out in zip(bounds, outputs)]
        axis = workload.attr("axis") % len(out_shape)   # Concat
        lead = (slice(None),) * axis
        bounds = axis_bounds(workload.inputs[:self.core_inputs(workload)], axis)
        return lambda inputs, outputs: [(inputs[i], outputs[0][lead + (slice(lo, hi),)])
                                        for i, (lo, hi) in enumerate(bounds)]

    def extra_reason(self, workload: Workload) -> str | None:
        if workload.op == "Slice" and workload.opset >= 10 and any(
                workload.static_value(i) is None for i in (1, 2)):
            return "Slice starts/ends must be static inputs"
        if workload.op == "Split" and workload.epilogue:
            return "a Split carries no epilogue"
        if workload.op == "Resize" and not is_index_copy(static_resize_spec(workload)):
            return "an interpolating or extrapolating Resize goes through numpy.formula"
        if workload.op in ("DepthToSpace", "SpaceToDepth") \
                and workload.text_attr("mode", "DCR") not in ("DCR", "CRD"):
            return f"{workload.op} mode must be DCR or CRD"
        return None


def pixel_shuffle_views(workload: Workload):
    """`views(inputs, outputs)` of a DepthToSpace or SpaceToDepth (4-d, blocksize r): the
    depth side split into (channel, phase row i, phase column j) in the mode's order,
    transposed onto the space side's split view.

    DepthToSpace: channel (i*r + j)*C + c (mode DCR, the default) or (c*r + i)*r + j (CRD)
    becomes pixel (h*r + i, w*r + j) of output channel c; SpaceToDepth the inverse, in
    either mode (a `mode` from opset 24 on)."""
    r = int(workload.attr("blocksize"))
    crd = workload.text_attr("mode", "DCR") == "CRD"
    if workload.op == "SpaceToDepth":
        n, c, h, w = workload.inputs[0].shape
        space = (n, c, h // r, r, w // r, r)
        depth = (n, c, r, r, h // r, w // r) if crd else (n, r, r, c, h // r, w // r)
        perm = (0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4)
        return lambda inputs, outputs: [(inputs[0].reshape(space).transpose(perm),
                                         outputs[0].reshape(depth))]
    n, c, h, w = workload.outputs[0].shape
    depth = (n, c, r, r, h // r, w // r) if crd else (n, r, r, c, h // r, w // r)
    perm = (0, 1, 4, 2, 5, 3) if crd else (0, 3, 4, 1, 5, 2)
    return lambda inputs, outputs: [(inputs[0].reshape(depth).transpose(perm),
                                     outputs[0].reshape(n, c, h // r, r, w // r, r))]


class NumpySum(NumpyImplementation):
    """Sum, Mean and variadic Max/Min: one ufunc pass per input into the output."""

    name = "numpy.sum"
    uses_blas = False   # ufuncs and reductions on the calling thread
    ops = ("Sum", "Mean", "Max", "Min")

    def extra_reason(self, workload: Workload) -> str | None:
        if workload.op in ("Max", "Min") and self.core_inputs(workload) == 2:
            return f"two-input {workload.op} goes through numpy.elementwise"
        return None

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        ufunc = {"Sum": np.add, "Mean": np.add, "Max": np.maximum, "Min": np.minimum}[workload.op]
        count, steps = self.core_inputs(workload), workload.epilogue
        scale = 1.0 / count if workload.op == "Mean" else None

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            if count == 1:
                np.copyto(out, inputs[0])
            else:
                ufunc(inputs[0], inputs[1], out=out)
                for i in range(2, count):
                    ufunc(out, inputs[i], out=out)
            if scale is not None:
                out *= out.dtype.type(scale)
            finish_epilogue(out, steps, inputs)

        return kernel


class NumpySoftmax(NumpyImplementation):
    """Softmax over one axis, in the output buffer (opset >= 13 semantics)."""

    name = "numpy.softmax"
    uses_blas = False   # ufuncs and reductions on the calling thread
    ops = ("Softmax",)

    def extra_reason(self, workload: Workload) -> str | None:
        return "Softmax before opset 13 goes through numpy.formula" if workload.opset < 13 else None

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        axis, steps = workload.attr("axis", -1), workload.epilogue

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            np.subtract(inputs[0], inputs[0].max(axis=axis, keepdims=True), out=out)
            np.exp(out, out=out)
            out /= out.sum(axis=axis, keepdims=True)
            finish_epilogue(out, steps, inputs)

        return kernel


class NumpyLayerNorm(NumpyImplementation):
    """LayerNormalization over the trailing axes (with the optional Mean/InvStdDev outputs)."""

    name = "numpy.layernorm"
    uses_blas = False   # ufuncs and reductions on the calling thread
    ops = ("LayerNormalization",)

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        rank = len(workload.inputs[0].shape)
        axes = tuple(range(workload.attr("axis", -1) % rank, rank))
        eps = workload.attr("epsilon", 1e-5)
        has_bias = self.core_inputs(workload) > 2 and workload.inputs[2] is not None
        steps = workload.epilogue

        extra = len(workload.outputs) > 1

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            out = outputs[0]
            mean = inputs[0].mean(axis=axes, keepdims=True)
            np.subtract(inputs[0], mean, out=out)
            var = np.mean(np.square(out), axis=axes, keepdims=True)
            var += eps
            np.sqrt(var, out=var)
            out /= var
            out *= inputs[1]
            if has_bias:
                out += inputs[2]
            finish_epilogue(out, steps, inputs)
            if extra:  # Mean and InvStdDev, shaped like the kept-dims statistics
                np.copyto(outputs[1], mean.reshape(outputs[1].shape))
                if len(outputs) > 2:
                    np.reciprocal(var, out=var)
                    np.copyto(outputs[2], var.reshape(outputs[2].shape))

        return kernel


class NumpyBatchNorm(NumpyImplementation):
    """Inference BatchNormalization as one multiply-add per channel (folded when constant)."""

    name = "numpy.batchnorm"
    uses_blas = False   # ufuncs and reductions on the calling thread
    ops = ("BatchNormalization",)

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        rank = len(workload.inputs[0].shape)
        eps = workload.attr("epsilon", 1e-5)
        shape = (1, -1) + (1,) * (rank - 2)
        steps = workload.epilogue
        dtype = np.dtype(workload.outputs[0].dtype)

        def fold(scale, bias, mean, var):
            inv = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
            shift = bias - mean * inv
            return inv.astype(dtype).reshape(shape), shift.astype(dtype).reshape(shape)

        folded = fold(*(consts[i] for i in range(1, 5))) if all(
            i in consts for i in range(1, 5)) else None

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            mul, add = folded if folded is not None else fold(*inputs[1:5])
            np.multiply(inputs[0], mul, out=outputs[0])
            outputs[0] += add
            finish_epilogue(outputs[0], steps, inputs)

        return kernel


class NumpyFormula(NumpyImplementation):
    """Any other supported op: its numpy formulation in the native dtype, copied out."""

    name = "numpy.formula"
    ops = tuple(sorted((set(TENSOR_FORMULAS) | set(NN_FORMULAS)) - set(_RESHAPES)
                       - set(NumpyCopy.ops) | {"Resize"}))

    def extra_reason(self, workload: Workload) -> str | None:
        if workload.op == "Resize" and is_index_copy(static_resize_spec(workload)):
            return "a nearest Resize is an index copy (numpy.copy)"
        if workload.op in ("LayerNormalization", "BatchNormalization") or (
                workload.op == "Softmax" and workload.opset >= 13) or (
                workload.op in UNARY_AS_STEP) or (
                workload.op in BINARY_UFUNCS and self.core_inputs(workload) == 2) or (
                workload.op in NumpySum.ops):
            return f"{workload.op} has a dedicated numpy kernel"
        return None

    def prepare(self, workload: Workload, consts: Mapping[int, np.ndarray],
                config: Mapping) -> Kernel:
        formula = {**TENSOR_FORMULAS, **NN_FORMULAS}[workload.op]
        count, steps = self.core_inputs(workload), workload.epilogue
        out_shape = workload.outputs[0].shape

        def kernel(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            y = formula(workload, inputs[:count])[0]
            y = apply_epilogue(np.array(y, dtype=outputs[0].dtype), steps, inputs)
            np.copyto(outputs[0], y.reshape(out_shape), casting="unsafe")

        return kernel


for _impl in (NumpyElementwise(), NumpyCopy(), NumpySum(), NumpySoftmax(), NumpyLayerNorm(),
              NumpyBatchNorm(), NumpyFormula()):
    register(_impl)
