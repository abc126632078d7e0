"""The wpk DSL (see DESIGN.md).

Parser, compute IR, schedules, loop IR, C and CUDA code generation, GPU
emulator and toolchains.
"""
