"""Plans whose choices are predicted: what the manifest and the report say about it.

    mark_predicted(plan, gpu, choices)       # after an --offline build
    predicted_statement("h100")              # the sentence plan and report carry

An `--offline` CUDA plan is built without its GPU: the analytical model chose
every step. Plan and report say so per step and per candidate
(`"predicted": true`, with the model's terms, the arch, ptxas usage and the
emulator check), and carry a statement that `wpk tune PLAN` on that GPU
measures them (`wpk.plans.retune`).
"""

from __future__ import annotations

from wpk.kernels.cuda.target import device_of


def predicted_statement(gpu_name: str) -> str:
    """The statement a predicted plan carries."""
    return (f"choices predicted by the analytical model, not measured: run `wpk tune PLAN` "
            f"on a {gpu_name} to measure")


def mark_predicted(plan, gpu, choices=None) -> None:
    """Record in the plan's manifest and report which choices are predicted; with the
    planner's `choices`, each report candidate also gets the model's terms (roofline,
    efficiency, occupancy, waves), the arch, ptxas usage and the emulator check."""
    details = {}
    for choice in choices or ():
        for m in choice.measurements:
            details[(choice.workload.key, m.label)] = {
                k: m.extra[k] for k in ("model", "arch", "cubin_arch", "usage", "verified")
                if k in m.extra}
    predicted_keys = set()
    for entry in plan.report.get("workloads", []):
        entry["predicted"] = True
        predicted_keys.add(entry["key"])
        for cand in entry["candidates"]:
            cand["predicted"] = True
            cand.update(details.get((entry["key"], cand["label"]), {}))
    for step in plan.manifest["steps"]:
        step["predicted"] = step["workload_key"] in predicted_keys
    summary = {"by": "analytical model", "gpu": gpu.name, "arch": gpu.arch,
               "workloads": len(predicted_keys), "statement": predicted_statement(gpu.name)}
    plan.manifest["predicted"] = summary
    plan.report["predicted"] = summary
    plan.report["device"] = device_of(gpu)
