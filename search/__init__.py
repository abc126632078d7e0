"""Schedule search: spaces, tuners, cost model, measurement, tuning records, budgets (see DESIGN.md)."""
