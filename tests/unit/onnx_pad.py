"""A Pad node in either spelling, for the tests of the passes that read Pads."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper


def pad_node(data: str, out: str, widths, opset: int, mode=None, value=None, axes=None,
             prefix: str = "pad"):
    """(the Pad node, its initializers): widths and value as attributes before opset 11,
    as inputs from opset 11 (with opset 18's `axes` input when given)."""
    attrs = {} if mode is None else {"mode": mode}
    inputs, inits = [data], []
    if opset < 11:
        attrs["pads"] = list(widths)
        if value is not None:
            attrs["value"] = value
        return helper.make_node("Pad", inputs, [out], **attrs), inits
    inits.append(numpy_helper.from_array(np.array(widths, np.int64), f"{prefix}_widths"))
    inputs.append(f"{prefix}_widths")
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), f"{prefix}_value"))
        inputs.append(f"{prefix}_value")
    if axes is not None:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), f"{prefix}_axes"))
        inputs += [""] * (3 - len(inputs)) + [f"{prefix}_axes"]
    return helper.make_node("Pad", inputs, [out], **attrs), inits
