"""numpy formulations of neural-network ops (pooling, ConvTranspose, normalizations --
batch, layer, instance --, softmax, LRN).

Same contract as `tensor_formulas`: `f(workload, inputs) -> list of outputs`
computed in the inputs' dtype, epilogue not applied; shared by the float64
references and the numpy library kernels.
"""

from __future__ import annotations

import numpy as np

from wpk.kernels.cpu.tensor_formulas import Formula
from wpk.kernels.cpu.window import conv_transpose_begin_pads, pad_spatial, window_geometry, windows


def _max_pool(workload, inputs):
    x = inputs[0]
    geom = window_geometry(workload, tuple(workload.attr("kernel_shape")))
    xp = pad_spatial(x, geom, -np.inf)
    view = windows(xp, geom)
    rank = len(geom.kernel)
    return [view.max(axis=tuple(range(-rank, 0)))]


def _average_pool(workload, inputs):
    x = inputs[0]
    geom = window_geometry(workload, tuple(workload.attr("kernel_shape")))
    rank = len(geom.kernel)
    axes = tuple(range(-rank, 0))
    sums = windows(pad_spatial(x, geom, 0.0), geom).sum(axis=axes)
    # Count the window elements that are real input, plus declared pads with count_include_pad
    # (the extra end region that ceil_mode adds is never counted).
    mask = np.ones(geom.in_size, dtype=x.dtype)
    if workload.attr("count_include_pad", 0):
        mask = np.pad(mask, list(zip(geom.pads_begin, geom.pads_end)), constant_values=1)
        shifted = type(geom)(geom.kernel, geom.strides, geom.dilations, (0,) * rank,
                             (0,) * rank,
                             tuple(c - e for c, e in zip(geom.cover_end, geom.pads_end)),
                             mask.shape, geom.out_size)
        counts = windows(pad_spatial(mask, shifted, 0.0), shifted).sum(axis=axes)
    else:
        counts = windows(pad_spatial(mask, geom, 0.0), geom).sum(axis=axes)
    return [sums / counts]


def _conv_transpose(workload, inputs):
    """Each input pixel's products with the filter (one matrix product per group) added
    into the output at stride x pixel + dilation x tap, cropped by the begin pads
    (`conv_transpose_begin_pads`); the end pads and `output_padding` are in the output
    shape."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    n, channels, *spatial = x.shape
    group, kernel = int(workload.attr("group", 1)), w.shape[2:]
    rank, per_group, out_per_group = len(spatial), channels // group, w.shape[1]
    strides = tuple(workload.attr("strides") or (1,) * rank)
    dilations = tuple(workload.attr("dilations") or (1,) * rank)
    begin = conv_transpose_begin_pads(workload)
    out = workload.outputs[0].shape[2:]
    size = [max((s - 1) * st + (k - 1) * d + 1, b + o) for s, st, k, d, b, o in
            zip(spatial, strides, kernel, dilations, begin, out)]
    acc = np.zeros((n, out_per_group * group, *size), dtype=x.dtype)
    for g in range(group):
        xg = x[:, g * per_group:(g + 1) * per_group].reshape(n, per_group, -1)
        wg = w[g * per_group:(g + 1) * per_group].reshape(per_group, -1)
        cols = np.matmul(wg.T, xg).reshape(n, out_per_group, *kernel, *spatial)
        for tap in np.ndindex(*kernel):
            at = tuple(slice(t * d, t * d + (s - 1) * st + 1, st) for t, d, s, st in
                       zip(tap, dilations, spatial, strides))
            acc[(slice(None), slice(g * out_per_group, (g + 1) * out_per_group)) + at] += \
                cols[(slice(None), slice(None)) + tap]
    y = acc[(slice(None), slice(None)) + tuple(slice(b, b + o) for b, o in zip(begin, out))]
    if bias is not None:
        y = y + bias.reshape(1, -1, *([1] * rank))
    return [y]


def _global_pool(reduce):
    def formula(workload, inputs):
        x = inputs[0]
        axes = tuple(range(2, x.ndim))
        return [reduce(x, axis=axes, keepdims=True)]
    return formula


def softmax(x: np.ndarray, axis: int, log: bool = False) -> np.ndarray:
    """Softmax (or log-softmax) of `x` along one axis, numerically stable."""
    shifted = x - x.max(axis=axis, keepdims=True)
    if log:
        return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    e = np.exp(shifted)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def _softmax_formula(log: bool):
    def formula(workload, inputs):
        x = inputs[0]
        if workload.opset >= 13:
            return [softmax(x, workload.attr("axis", -1), log)]
        axis = workload.attr("axis", 1) % x.ndim  # old semantics: coerce to 2-D at axis
        flat = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
        return [softmax(flat, 1, log).reshape(x.shape)]
    return formula


def _layer_norm(workload, inputs):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = workload.attr("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(var + workload.attr("epsilon", 1e-5))
    y = centered * inv_std * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inv_std][:len(workload.outputs)]  # optional Mean and InvStdDev outputs


def _batch_norm(workload, inputs):
    x, scale, bias, mean, var = inputs[:5]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + workload.attr("epsilon", 1e-5))
    return [(x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)]


def _instance_norm(workload, inputs):
    """Each (batch, channel) slice over the spatial axes to zero mean and unit variance, then
    the channel's scale and bias."""
    x, scale, bias = inputs[:3]
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv_std = 1.0 / np.sqrt(var + workload.attr("epsilon", 1e-5))
    return [centered * inv_std * scale.reshape(shape) + bias.reshape(shape)]


def _lrn(workload, inputs):
    x = inputs[0]
    size = int(workload.attr("size"))
    alpha, beta = workload.attr("alpha", 1e-4), workload.attr("beta", 0.75)
    bias = workload.attr("bias", 1.0)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = np.pad(x * x, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    csum = np.cumsum(sq, axis=1)
    csum = np.concatenate([np.zeros_like(csum[:, :1]), csum], axis=1)
    channels = x.shape[1]
    window = csum[:, size:size + channels] - csum[:, :channels]
    return [x / (bias + alpha / size * window) ** beta]


NN_FORMULAS: dict[str, Formula] = {
    "MaxPool": _max_pool, "AveragePool": _average_pool, "ConvTranspose": _conv_transpose,
    "GlobalAveragePool": _global_pool(np.mean), "GlobalMaxPool": _global_pool(np.max),
    "Softmax": _softmax_formula(False), "LogSoftmax": _softmax_formula(True),
    "LayerNormalization": _layer_norm, "BatchNormalization": _batch_norm, "LRN": _lrn,
    "InstanceNormalization": _instance_norm,
}
