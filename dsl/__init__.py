"""The wpk DSL: parser, compute IR, schedules, loop IR, C and CUDA code generation, GPU emulator, toolchains (see DESIGN.md)."""
