"""A float64 NCHW convolution by its definition, independent of wpk (for kernel tests)."""

from __future__ import annotations

import numpy as np


def conv_nchw(x, w, b, stride=1, pad=0, groups=1):
    """float64 convolution of `x` [N, C, H, W] by `w` [O, C/groups, K, K] (+ bias `b`),
    symmetric padding `pad`, the plain loop of the definition."""
    n, c, h, wd = x.shape
    o, cg, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        for r in range(k):
            for s in range(k):
                patch = xp[:, g * cg:(g + 1) * cg, r:r + stride * oh:stride,
                           s:s + stride * ow:stride]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch,
                                                       w[g * og:(g + 1) * og, :, r, s])
    return y + (0 if b is None else b.reshape(1, -1, 1, 1))
