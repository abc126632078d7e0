"""Wall time of `wpk.build` on evaluation models, with an empty and then a warm compile cache.

    python scripts/time_builds.py [--models light_densenet121,light_vgg19] [--jobs 1 2]
                                  [--fast] [--json FILE]

For each model and each `--jobs` value (compile threads; 1 compiles each generated kernel
inside its measurement, one at a time, as builds did before `search/precompile.py`), the
build runs twice: first with a new, empty compile cache (`WPK_CACHE_DIR` in a temporary
folder), then again on that cache. `--fast` uses the options of the tests' shared builds
(`tests/built_plans.py`: no search, one repeat, no partition measurement); without it,
the defaults of `wpk build`. Prints a table; `--json` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)   # tests.models, tests.built_plans


def time_build(model, options: dict) -> float:
    import wpk

    started = time.perf_counter()
    wpk.build(model, **options)
    return time.perf_counter() - started


def cold_and_warm(model, options: dict, cache: str) -> tuple[float, float]:
    """Build times with the empty compile cache `cache`, then with it filled."""
    before = os.environ.get("WPK_CACHE_DIR")
    os.environ["WPK_CACHE_DIR"] = cache
    try:
        return time_build(model, options), time_build(model, options)
    finally:
        if before is None:
            os.environ.pop("WPK_CACHE_DIR", None)
        else:
            os.environ["WPK_CACHE_DIR"] = before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="light_densenet121",
                        help="comma-separated names of tests/models.py")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--fast", action="store_true", help="the tests' build options")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    from tests import models
    from tests.built_plans import FAST_BUILD

    base = dict(FAST_BUILD) if args.fast else {"progress": False}
    rows = []
    print(f"{'model':<22} {'jobs':>4} {'empty cache s':>14} {'warm cache s':>13}")
    for name in args.models.split(","):
        model = models.load_model(name)
        for jobs in args.jobs:
            with tempfile.TemporaryDirectory(prefix="wpk-cache-") as cache:
                cold, warm = cold_and_warm(model, {**base, "jobs": jobs}, cache)
            rows.append({"model": name, "jobs": jobs, "empty_cache_s": round(cold, 2),
                         "warm_cache_s": round(warm, 2)})
            print(f"{name:<22} {jobs:>4} {cold:>14.1f} {warm:>13.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"benchmark": "time_builds", "fast": args.fast,
                       "date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
                       "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
