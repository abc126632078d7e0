"""Random workloads of the DSL operator library for the back-end tests (hypothesis).

`draw_workload(data, op)` draws shape symbols and scalars that satisfy the
operator's `require`s, including the edge cases the lowering must handle
(1x1 images, odd sizes, stride 2, dilation 2, grouped and depthwise
convolutions), and returns the bindings and seeded random input arrays.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from wpk.core.errors import DslError
from wpk.dsl import compute as C

CONV_OPS = ("conv2d", "conv2d_bias", "conv2d_bias_relu_add")
POOL_OPS = ("avgpool2d", "maxpool2d")
WINOGRAD_OPS = ("winograd_conv2d", "winograd_conv2d_bias")


def _conv_symbols(data) -> dict:
    kind = data.draw(st.sampled_from(["dense", "depthwise", "grouped"]), label="conv kind")
    if kind == "depthwise":
        groups = data.draw(st.integers(1, 6), label="channels")
        cg, kg = 1, data.draw(st.integers(1, 2), label="multiplier")
    else:
        groups = 1 if kind == "dense" else 2
        cg = data.draw(st.integers(1, 5), label="CG")
        kg = data.draw(st.integers(1, 7), label="KG")
    r = data.draw(st.integers(1, 3), label="R")
    s = data.draw(st.integers(1, 3), label="S")
    scalars = {"groups": groups,
               "stride_h": data.draw(st.integers(1, 2)), "stride_w": data.draw(st.integers(1, 2)),
               "dil_h": data.draw(st.integers(1, 2)), "dil_w": data.draw(st.integers(1, 2))}
    for pad in ("pad_t", "pad_l", "pad_b", "pad_r"):
        scalars[pad] = data.draw(st.integers(0, 2), label=pad)
    symbols = {"N": data.draw(st.integers(1, 2), label="N"), "C": cg * groups, "CG": cg,
               "K": kg * groups, "H": data.draw(st.integers(1, 9), label="H"),
               "W": data.draw(st.integers(1, 11), label="W"), "R": r, "S": s}
    return {**symbols, **scalars}


def _winograd_symbols(data) -> dict:
    """Winograd F(m, 3) operators: transforms of size T = m + 2 (m 1, 2 or 4), odd sizes,
    1-pixel images, asymmetric padding."""
    values = {"N": data.draw(st.integers(1, 2), label="N"),
              "C": data.draw(st.integers(1, 5), label="C"),
              "K": data.draw(st.integers(1, 6), label="K"),
              "H": data.draw(st.integers(1, 8), label="H"),
              "W": data.draw(st.integers(1, 9), label="W"),
              "T": data.draw(st.sampled_from([3, 4, 6]), label="T")}
    for pad in ("pad_t", "pad_l", "pad_b", "pad_r"):
        values[pad] = data.draw(st.integers(0, 2), label=pad)
    return values


def _pool_symbols(data, op) -> dict:
    kh, kw = data.draw(st.integers(1, 3), label="KH"), data.draw(st.integers(1, 3), label="KW")
    values = {"N": data.draw(st.integers(1, 2)), "C": data.draw(st.integers(1, 5)),
              "H": data.draw(st.integers(1, 9)), "W": data.draw(st.integers(1, 10)),
              "KH": kh, "KW": kw, "stride_h": data.draw(st.integers(1, 2)),
              "stride_w": data.draw(st.integers(1, 2))}
    for pad, k in (("pad_t", kh), ("pad_b", kh), ("pad_l", kw), ("pad_r", kw)):
        values[pad] = data.draw(st.integers(0, k - 1), label=pad)
    if any(s.name == "dil_h" for s in op.scalars):
        values["dil_h"] = data.draw(st.integers(1, 2))
        values["dil_w"] = data.draw(st.integers(1, 2))
    if any(s.name == "count_include_pad" for s in op.scalars):
        values["count_include_pad"] = data.draw(st.integers(0, 1))
    return values


def draw_workload(data, op: C.Operator, seed: int = 0):
    """(bindings, input arrays) of a random valid workload of library operator `op`."""
    if op.name in CONV_OPS:
        values = _conv_symbols(data)
    elif op.name in POOL_OPS:
        values = _pool_symbols(data, op)
    elif op.name in WINOGRAD_OPS:
        values = _winograd_symbols(data)
    else:
        values = {}
        for name in op.shape_symbols:
            values[name] = data.draw(st.integers(1, 24 if name in ("L", "D", "HW") else 9),
                                     label=name)
        for s in op.scalars:   # a window size without a default (LRN's)
            if s.default is None:
                values[s.name] = data.draw(st.integers(1, 6), label=s.name)
    scalars = {s.name: values[s.name] for s in op.scalars if s.name in values}
    bindings = dict(values)
    for s in op.scalars:
        bindings.setdefault(s.name, s.default)
    try:
        for name, expr in op.derived:
            bindings[name] = C.bind_dim(expr, bindings)
    except DslError:
        assume(False)
    assume(all(bindings.get(n, 1) >= 1 for n in ("OH", "OW")))
    rng = np.random.default_rng(seed)
    arrays = {}
    for p in op.params:
        shape = tuple(C.bind_dim(d, bindings) for d in p.shape)
        arrays[p.name] = rng.standard_normal(shape).astype(np.float32)
    try:
        full = C.infer_bindings(op, arrays, scalars)
    except DslError:
        assume(False)
    return full, arrays


def draw_config(data, template) -> dict:
    """A random valid point of the template's knob space (a few tries, else the default)."""
    space = template.space()
    for _ in range(6):
        config = {k: data.draw(st.sampled_from(v), label=k) for k, v in space.items()}
        reason = template.validate(config)
        if reason is None:
            return config
        assert isinstance(reason, str) and reason
    return template.default_config()


FIXED_CONV = {"N": 1, "C": 6, "CG": 3, "K": 8, "H": 9, "W": 10, "R": 3, "S": 3, "groups": 2,
              "stride_h": 2, "stride_w": 1, "pad_t": 1, "pad_l": 1, "pad_b": 1, "pad_r": 0,
              "dil_h": 1, "dil_w": 2}
FIXED_POOL = {"N": 1, "C": 3, "H": 9, "W": 8, "KH": 3, "KW": 2, "stride_h": 2, "stride_w": 1,
              "pad_t": 1, "pad_l": 1, "pad_b": 0, "pad_r": 1}


def fixed_workload(op: C.Operator, seed: int = 0):
    """A deterministic small workload of `op` (odd sizes, grouped conv): (bindings, arrays)."""
    if op.name in CONV_OPS:
        values = dict(FIXED_CONV)
    elif op.name in POOL_OPS:
        values = dict(FIXED_POOL)
    else:
        values = {n: (37 if n in ("L", "D", "HW") else 5) for n in op.shape_symbols}
        values |= {s.name: 4 for s in op.scalars if s.default is None}   # LRN's even window
    bindings = dict(values)
    for s in op.scalars:
        bindings.setdefault(s.name, s.default)
    for name, expr in op.derived:
        bindings[name] = C.bind_dim(expr, bindings)
    rng = np.random.default_rng(seed)
    arrays = {p.name: rng.standard_normal(tuple(C.bind_dim(d, bindings) for d in p.shape))
              .astype(np.float32) for p in op.params}
    scalars = {s.name: bindings[s.name] for s in op.scalars if bindings[s.name] is not None}
    return C.infer_bindings(op, arrays, scalars), arrays
