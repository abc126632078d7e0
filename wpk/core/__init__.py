"""The bottom layer: what every other part of wpk shares and that imports nothing else of wpk.

errors (the WpkError hierarchy), devices (hardware specs: the host CPU, GPU presets),
graph (the graph IR), workload (Workload, TensorSpec, EpilogueStep: what is measured and
stored), numerics (error metrics), epilogue (the epilogue table: each epilogue step's
formula, written once for every backend, and its ONNX form).
"""
