"""The operator library (see DESIGN.md).

Workloads, float64 references, DSL definitions, vendor and library
implementations.
"""
