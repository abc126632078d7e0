"""The operator library written in the wpk DSL (`*.wpk` files; see dsl/LANGUAGE.md).

Load operators with `wpk.kernels.dsl_library.load_operator(name)`.
"""
