"""Planner, plan file format and reports (see DESIGN.md)."""
