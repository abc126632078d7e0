"""Fuzz the wpk CLI for N minutes with the strategies of tests/fuzzing and count
contract violations (exit code other than 0 or 2, traceback, hang, partial file).

    python scripts/fuzz.py --minutes 30                  # all properties, round robin
    python scripts/fuzz.py --minutes 5 --only build --json fuzz.json

Each round runs `--batch` fresh examples of one property (hypothesis, generate phase
only, a new seed each round, no shrinking, no example database); every violation is
recorded with the command and the last lines of stderr. Exit code 0 when none was
found, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzzing.conftest import build_small_plan  # noqa: E402
from tests.fuzzing.properties import check_model, check_plan  # noqa: E402
from tests.fuzzing.strategies import model_bytes, models, plan_mutations  # noqa: E402


def properties(plan: bytes) -> dict:
    """name -> (strategy of input bytes, check(bytes) -> Outcome, file suffix)."""
    serialized = models().map(lambda m: m.SerializeToString())
    return {
        "inspect": (serialized, lambda d: check_model(d, "inspect"), ".onnx"),
        "inspect-bytes": (model_bytes(), lambda d: check_model(d, "inspect"), ".onnx"),
        "build": (serialized, lambda d: check_model(d, "build"), ".onnx"),
        "run": (plan_mutations(plan), lambda d: check_plan(d, "run"), ".wpk"),
        "report": (plan_mutations(plan), lambda d: check_plan(d, "report"), ".wpk"),
    }


def run_batch(strategy, check, count: int, round_seed: int, record) -> None:
    """`count` fresh examples of `strategy`, each checked and passed to `record`."""

    @seed(round_seed)
    @settings(max_examples=count, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def batch(data):
        example = data.draw(strategy)
        record(example, check(example))

    batch()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=20, help="examples per round")
    parser.add_argument("--only", action="append", help="property to run (repeatable)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--top", type=int, default=25, help="most common errors to show")
    parser.add_argument("--save", type=Path, help="keep every violating input in this folder")
    args = parser.parse_args(argv)
    # A strategy bug must not take the (shared) machine's memory: 4 GiB for this process.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="wpk-fuzz-plan-") as folder:
        plan = build_small_plan(Path(folder))
    props = properties(plan)
    names = args.only or list(props)
    examples, codes = collections.Counter(), collections.defaultdict(collections.Counter)
    violations: list[dict] = []
    errors = collections.Counter()  # error lines, names and numbers blanked
    harness_errors: list[str] = []  # the strategies' or harness's own failures
    end = time.monotonic() + 60 * args.minutes
    started = time.monotonic()
    index = 0
    while time.monotonic() < end:
        name = names[index % len(names)]
        index += 1
        strategy, check, suffix = props[name]

        def record(example, outcome, name=name, suffix=suffix):
            examples[name] += 1
            codes[name][str(outcome.code)] += 1
            first = next((line for line in outcome.stderr.splitlines()
                          if line.startswith("error: ")), None)
            if first is not None:
                errors[re.sub(r"'[^']*'|\d+", "_", first)[:90]] += 1
            saved = None
            if outcome.violations and args.save is not None:
                args.save.mkdir(parents=True, exist_ok=True)
                saved = args.save / f"{name}-{len(violations)}{suffix}"
                saved.write_bytes(example)
            for problem in outcome.violations:
                violations.append({"property": name, "problem": problem,
                                   "input": None if saved is None else str(saved)})
                print(f"VIOLATION [{name}] {problem}", flush=True)

        try:
            run_batch(strategy, check, args.batch, rng.randrange(2**32), record)
        except Exception as exc:  # noqa: BLE001 - a harness bug: report it, keep fuzzing
            harness_errors.append(f"[{name}] {type(exc).__name__}: {exc}"[:300])
            print(f"HARNESS ERROR {harness_errors[-1]}", flush=True)
    summary = {"minutes": round((time.monotonic() - started) / 60, 1),
               "examples": sum(examples.values()), "per_property": dict(examples),
               "exit_codes": {k: dict(v) for k, v in codes.items()},
               "violations": len(violations), "harness_errors": harness_errors,
               "common_errors": dict(errors.most_common(args.top)), "details": violations}
    print(json.dumps({k: v for k, v in summary.items() if k != "details"}, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
