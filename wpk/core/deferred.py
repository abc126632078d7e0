"""Modules imported on their first use rather than when the importing module loads.

    from wpk.core.deferred import helper, numpy_helper, onnx
    helper.make_node(...)        # onnx.helper is imported here, once

onnx takes about a second to import on the 2-core VMs (ml_dtypes, which it loads, most
of it), and a plan whose steps never build an ONNX model, VGG-19's or ResNet-50's, paid
it at every load although only the build and onnxruntime's steps use onnx. The kernels
modules that build ONNX forms read onnx through these stand-ins, so `wpk.load` imports it
only when a step needs it.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class DeferredModule:
    """Stands for the module `name`: the first attribute read imports it, every read
    after that is the module's own attribute."""

    def __init__(self, name: str):
        self.__dict__["_name"] = name
        self.__dict__["_module"] = None

    def _load(self) -> ModuleType:
        module = importlib.import_module(self.__dict__["_name"])
        self.__dict__["_module"] = module
        return module

    def __getattr__(self, attr: str):
        return getattr(self.__dict__["_module"] or self._load(), attr)

    def __setattr__(self, attr: str, value) -> None:
        raise AttributeError(f"{self.__dict__['_name']} is read through a stand-in; "
                             "set attributes on the module itself")

    def __repr__(self) -> str:
        state = "imported" if self.__dict__["_module"] is not None else "not imported yet"
        return f"<deferred module {self.__dict__['_name']} ({state})>"


onnx = DeferredModule("onnx")
defs = DeferredModule("onnx.defs")
helper = DeferredModule("onnx.helper")
numpy_helper = DeferredModule("onnx.numpy_helper")
onnx_reference = DeferredModule("onnx.reference")
version_converter = DeferredModule("onnx.version_converter")
