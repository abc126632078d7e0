"""The operator library: workloads, references, DSL definitions, vendor and library implementations (see DESIGN.md)."""
