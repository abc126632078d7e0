"""Plans of the evaluation models (tests/models.py) built once per test run and shared.

Several modules build the same model with the same options (the accuracy test and the
NCHWc tests build `light_squeezenet`; the accuracy test and the onnxruntime-region tests
build `transformer_encoder`). `PlanCache.get(name, **options)` builds it the first time,
into a plan file in a folder the pytest-xdist workers of this run share (a lock file makes
a second worker wait for the first one's build instead of repeating it), and reads that
file back on every call, so each test gets its own `Plan` to change. The key holds the
model's name, the options and the ISA wpk sees (`--isa`, tests/isa.py); a new test run
starts with an empty folder.

`FAST_BUILD`: the options that keep CI fast (library and vendor kernels, no schedule
search; each candidate verified against the float64 reference and timed once; no end-to-end
check against onnxruntime's model; the plans loaded on this machine only, so without their
compiled libraries).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

FAST_BUILD = {"search": "none", "warmup": 0, "repeats": 1, "min_time": 0.0, "progress": False,
              "partition": False, "native_libraries": False}


class PlanCache:
    """Plans keyed by (model name, build options, ISA), kept as plan files in `folder`."""

    def __init__(self, folder: Path):
        self.folder = folder

    def path(self, name: str, options: dict) -> Path:
        """The plan file of `name` built with `options` for the ISA this process sees."""
        from tests.isa import current_isa

        key = json.dumps([name, options, current_isa()], sort_keys=True)
        return self.folder / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.wpk"

    def get(self, name: str, **options):
        """`wpk.build(tests.models.load_model(name), target="cpu", **options)`, built once
        per run; a fresh `Plan` read from its file on every call."""
        import wpk
        from tests import models
        from wpk.plans.planfile import read_plan

        path = self.path(name, options)
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker building it: wait for it
            if not path.exists():
                wpk.build(models.load_model(name), target="cpu", output=str(path), **options)
        return read_plan(path)
