"""A CPU plan carries the shared libraries of its generated kernels.

    plan = bundle_native_libraries(plan)   # at the end of a build: members kernels/native/*.so
    install_native_libraries(plan)         # before a load prepares its steps

A CPU plan's steps load C kernels that gcc compiled into the compile cache while the
plan was built. Without the libraries in the plan, a plan copied to another machine (a
deployment host, a container, a CI runner) compiled every kernel again while it loaded
(ResNet-50's: 10-20 s) and could not load at all where no C compiler is installed. The
build loads its plan once more, in a new process, with `compile_c` recording what it
hands out, and stores each library under `kernels/native/<bundle key>.so`
(`wpk.dsl.toolchain.bundle_key`: the source, flags and codegen version); the load
installs them, so `compile_c` returns them without a compiler. A kernel whose source
differs on the loading host (a host ISA the plan did not need) still compiles there. The
libraries are native code, checksummed like every member and bound to the machine type in
the manifest's `requires`: load only plans you trust.

    python -m wpk.native_bundle PLAN.wpk   # prints {bundle key: library} its load uses
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from wpk.core.errors import PlanError
from wpk.core.shared_object import shared_object_problem
from wpk.dsl.toolchain import recording_libraries, use_bundled_libraries
from wpk.plans.planfile import KERNELS, Plan, read_plan

NATIVE_PREFIX = "native/"
SUFFIX = ".so"
RECORD_TIMEOUT_S = 1800   # a load compiles nothing here (the build filled the cache)


def bundle_native_libraries(plan: Plan) -> Plan:
    """`plan` (a CPU plan) with the libraries a fresh process loading it compiles or takes
    from the cache, as `kernels/native/` members; the manifest then requires the build host's
    machine type. Recorded in a new process (`recorded_libraries`): in the building one,
    libraries loaded once stay cached above `compile_c` (the chain driver's, a measured
    kernel's) and a load there would not ask for them. Where that fails, the plan is
    returned without libraries and its report says why."""
    kernels = {name: data for name, data in plan.kernels.items()
               if not name.startswith(NATIVE_PREFIX)}
    bare = Plan(plan.manifest, plan.weights, plan.report, kernels)
    try:
        found = recorded_libraries(bare)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        report = {**plan.report, "native_libraries": {"error": str(exc).strip()[-2000:]}}
        return Plan(plan.manifest, plan.weights, report, kernels)
    for key, path in sorted(found.items()):
        kernels[f"{NATIVE_PREFIX}{key}{SUFFIX}"] = Path(path).read_bytes()
    manifest = dict(plan.manifest)
    if found:
        requires = dict(manifest.get("requires") or {})
        requires["machine"] = manifest.get("device", {}).get("machine")
        manifest["requires"] = requires
    report = {**plan.report, "native_libraries": {"count": len(found)}}
    return Plan(manifest, plan.weights, report, kernels)


def recorded_libraries(plan: Plan) -> dict[str, str]:
    """{bundle key: library path} that a new process loading `plan` gets from `compile_c`
    (the plan written to a temporary file, loaded by `python -m wpk.native_bundle`)."""
    with tempfile.TemporaryDirectory(prefix="wpk-bundle-") as folder:
        path = os.path.join(folder, "plan.wpk")
        plan.save(path)
        done = subprocess.run([sys.executable, "-m", "wpk.native_bundle", path],
                              capture_output=True, text=True, timeout=RECORD_TIMEOUT_S)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ValueError(f"loading the plan in a new process failed: {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def _record(path: str) -> None:
    """Load the plan at `path` and print {bundle key: library path} of what it compiled or
    took from the cache (the child of `recorded_libraries`)."""
    from wpk.runtime import Session  # the runtime imports this module

    with recording_libraries() as found:
        Session(read_plan(path, check_device=False), path)
    print(json.dumps({key: str(value) for key, value in found.items()}))


def native_libraries(plan: Plan) -> dict[str, bytes]:
    """{bundle key: library bytes} of the libraries `plan` carries."""
    return {name[len(NATIVE_PREFIX):-len(SUFFIX)]: data for name, data in plan.kernels.items()
            if name.startswith(NATIVE_PREFIX) and name.endswith(SUFFIX)}


def install_native_libraries(plan: Plan, path: str = "<plan>") -> None:
    """Make the libraries `plan` (read from `path`) carries what `compile_c` returns for
    their sources; a library that is not a whole shared object for this host is a
    PlanError naming its member (the loader would have ended the process: SIGBUS on a
    library cut short, `wpk.core.shared_object`)."""
    libraries = native_libraries(plan)
    for key, data in libraries.items():
        problem = shared_object_problem(data)
        if problem:
            raise PlanError(f"plan '{path}': {KERNELS}{NATIVE_PREFIX}{key}{SUFFIX} is not a "
                            f"loadable kernel library: {problem}",
                            hint="its checksums match it, so it was altered after `wpk "
                                 "build` wrote it: rebuild the plan")
    if libraries:
        use_bundled_libraries(libraries)


if __name__ == "__main__":
    _record(sys.argv[1])
