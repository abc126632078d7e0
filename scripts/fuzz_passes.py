"""Differential fuzzing of the graph passes for N minutes (tests/fuzzing/mutations.py):
corpus models mutated (constants, ops, operands, axes, extra outputs, rewired inputs,
integer constants, permutations, attributes, a unary op on an edge, a conv's or pool's
window), built with wpk and compared with onnxruntime. Counts each outcome; every
violation ("wrong": an output off by more than 1e-2 or missing, "internal": an exception
inside wpk) is printed and its model saved to --out.

    python scripts/fuzz_passes.py --minutes 30 --seed 1 --out fuzz-passes
    python scripts/fuzz_passes.py --minutes 5 --models vit_tf,convnext_tf --json f.json
    python scripts/fuzz_passes.py --mutations change_permutation,insert_unary

Exit code 0 when no violation was found, 1 otherwise. Before each mutant the draw is kept
in `--out/last-draw.json`: when the process dies of a signal (onnxruntime itself has
crashed on a mutant), `replay_draw` makes that mutant again.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import onnx  # noqa: E402

from tests import corpus  # noqa: E402
from tests.fuzzing.mutations import MODELS, MUTATIONS, VIOLATIONS, check_mutant  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", default="", help="comma-separated corpus names "
                        "(default: every float corpus model)")
    parser.add_argument("--out", type=Path, default=Path("fuzz-passes"),
                        help="folder for the violating mutants (ONNX files)")
    parser.add_argument("--json", type=Path, help="write the counts and every non-ok "
                        "outcome here")
    parser.add_argument("--mutations", default="", help="comma-separated mutation "
                        "functions of tests/fuzzing/mutations.py (default: all of MUTATIONS)")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else MODELS
    known = {m.__name__: m for m in MUTATIONS}
    unknown = [m for m in args.mutations.split(",") if m and m not in known]
    if unknown:
        parser.error(f"unknown mutation(s) {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = [known[m] for m in args.mutations.split(",") if m] or MUTATIONS
    rng = random.Random(args.seed)
    originals: dict[str, onnx.ModelProto] = {}
    counts: collections.Counter = collections.Counter()
    notes = []
    end = time.monotonic() + 60 * args.minutes
    while time.monotonic() < end:
        name = rng.choice(names)
        if name not in originals:
            originals[name] = corpus.build_model(name, "ci")
        model = onnx.ModelProto()
        model.CopyFrom(originals[name])
        _keep_draw(args.out, name, rng)
        outcome = check_mutant(name, model, rng, chosen)
        counts[outcome.kind] += 1
        if outcome.kind not in ("ok", "skip"):
            notes.append(vars(outcome))
        if outcome.kind in VIOLATIONS:
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / f"{outcome.kind}-{name}-{sum(counts.values())}.onnx"
            onnx.save(model, str(path))
            print(f"{outcome.kind}: {name} {outcome.mutations} -> {path}\n{outcome.detail}",
                  flush=True)
    print(f"{sum(counts.values())} mutants: " + ", ".join(f"{k} {v}" for k, v in
                                                          sorted(counts.items())))
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "minutes": args.minutes,
                                         "mutations": [m.__name__ for m in chosen],
                                         "counts": counts, "outcomes": notes}, indent=1))
    return 1 if any(counts[k] for k in VIOLATIONS) else 0


def _keep_draw(out: Path, name: str, rng: random.Random) -> None:
    """The next draw (the model and the generator's state) in `out/last-draw.json`, so a
    crash of this process (onnxruntime or a kernel dying of a signal, which no `except`
    sees) leaves the mutant that caused it: `replay_draw` makes it again."""
    out.mkdir(parents=True, exist_ok=True)
    version, state, gauss = rng.getstate()
    (out / "last-draw.json").write_text(json.dumps({"model": name, "state": [
        version, list(state), gauss]}))


def replay_draw(path: Path, mutations=MUTATIONS) -> tuple[str, onnx.ModelProto, list[str]]:
    """The mutant of a draw kept by `_keep_draw`: its corpus model's name, the mutated
    model and what was mutated (the same `mutations` as the run's)."""
    from tests.fuzzing.mutations import mutate

    kept = json.loads(Path(path).read_text())
    rng = random.Random()
    version, state, gauss = kept["state"]
    rng.setstate((version, tuple(state), gauss))
    model = corpus.build_model(kept["model"], "ci")
    return kept["model"], model, mutate(model, rng, mutations)


if __name__ == "__main__":
    sys.exit(main())
