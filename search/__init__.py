"""Schedule search (see DESIGN.md).

Spaces, tuners, cost model, measurement, tuning records, budgets.
"""
