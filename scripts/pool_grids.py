"""Pools against onnxruntime: the two grids the README cites.

    python scripts/pool_grids.py --builds       # 216 single 2-D ceil_mode pools built by wpk
    python scripts/pool_grids.py --builds --random 300   # the random pools, built by wpk
    python scripts/pool_grids.py --reference    # random pools in onnx.reference
    python scripts/pool_grids.py --reference --without-wpk-pools   # onnx.reference alone

`--builds`: MaxPool and AveragePool with `ceil_mode` (sizes 5/7/8, kernels 2/3/5, strides
1-3, pads 0-2, count_include_pad 0/1) each built with wpk (`search none`) and run; a case
is right when the output's shape and values match onnxruntime's (skipped where
onnxruntime refuses it); with `--random N`, the first N random pools of `--reference`
instead. `--reference`: seeded random MaxPools, AveragePools and LpPools
of rank 1-3 (strides 1-3, dilations 1-2, uneven pads or auto_pad, ceil_mode and
count_include_pad 0/1; no window larger than its padded input: onnxruntime sizes those by
C's truncating division, not the spec's floor; no dilated SAME pools: onnxruntime leaves
the dilations out of their pads, the spec does not) evaluated by onnx.reference with
the ops wpk gives it (`wpk.core.onnx_quantize.REFERENCE_OPS`: shape evaluation, constant
folding, the node reference), or without wpk's pools. Prints the counts and each wrong
case; exit code 1 when any case is wrong.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

ort.set_default_logger_severity(4)   # refused cases are skipped, not news


def pool_model(op: str, size: list[int], ceil_mode: int = 1, **attributes):
    """One pool over (1, C, *size) float32, its output's dims named, not given."""
    node = helper.make_node(op, ["x"], ["y"], ceil_mode=ceil_mode, **attributes)
    dims = [f"d{i}" for i in range(len(size) + 2)]
    graph = helper.make_graph(
        [node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, *size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def onnxruntime_output(model, x: np.ndarray) -> np.ndarray | None:
    """The pool's output in onnxruntime, or None where it refuses the case."""
    try:
        return ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    except Exception:  # noqa: BLE001 - onnxruntime raises its own untyped errors
        return None


def build_cases():
    for op, size, k, s, p, cip in itertools.product(
            ("AveragePool", "MaxPool"), (5, 7, 8), (2, 3, 5), (1, 2, 3), (0, 1, 2), (0, 1)):
        if p < k and not (op == "MaxPool" and cip):
            extra = {"count_include_pad": cip} if op == "AveragePool" else {}
            yield op, [size, size], dict(kernel_shape=[k, k], pads=[p] * 4, strides=[s, s],
                                         **extra)


def reference_cases(count: int = 600, seed: int = 0):
    rng = np.random.default_rng(seed)
    drawn = 0
    while drawn < count:
        op = ("MaxPool", "AveragePool", "LpPool")[drawn % 3]
        rank = int(rng.integers(1, 4))
        size = [int(v) for v in rng.integers(3, 9, rank)]
        kernel = [int(v) for v in rng.integers(1, 5, rank)]
        strides = [int(v) for v in rng.integers(1, 4, rank)]
        dilations = [int(v) for v in rng.integers(1, 3, rank)] if op != "LpPool" else [1] * rank
        pads = [int(rng.integers(0, kernel[i % rank])) for i in range(2 * rank)]
        flags = {"ceil_mode": int(rng.integers(0, 2))}
        if op == "AveragePool":
            flags["count_include_pad"] = int(rng.integers(0, 2))
        auto_pad = ("NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")[
            int(rng.integers(0, 5))]
        if auto_pad != "NOTSET":
            flags["auto_pad"], pads = auto_pad, [0] * (2 * rank)
            if auto_pad.startswith("SAME"):
                dilations = [1] * rank   # onnxruntime leaves them out of SAME's pads
        if any(size[a] + pads[a] + pads[a + rank] < d * (k - 1) + 1
               for a, (k, d) in enumerate(zip(kernel, dilations))) and auto_pad[:4] != "SAME":
            continue   # a window larger than its padded input
        drawn += 1
        yield op, size, dict(kernel_shape=kernel, strides=strides, dilations=dilations,
                             **({"pads": pads} if auto_pad == "NOTSET" else {}), **flags)


def wpk_output(model, x: np.ndarray) -> np.ndarray:
    import wpk
    from wpk.runtime import Session

    plan = wpk.build(model, target="cpu", search="none", warmup=0, repeats=1, min_time=0.0,
                     progress=False, partition=False)
    return Session(plan).run({"x": x})["y"]


def reference_output(ops):
    from onnx.reference import ReferenceEvaluator

    return lambda model, x: ReferenceEvaluator(model, new_ops=ops).run(None, {"x": x})[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--builds", action="store_true", help="the 216 builds by wpk")
    mode.add_argument("--reference", action="store_true", help="pools in onnx.reference")
    parser.add_argument("--without-wpk-pools", action="store_true",
                        help="with --reference: onnx.reference's own pools")
    parser.add_argument("--count", type=int, default=600,
                        help="with --reference: how many random pools to draw")
    parser.add_argument("--random", type=int, default=0, metavar="N",
                        help="with --builds: build N random pools instead of the grid")
    args = parser.parse_args(argv)
    if args.builds:
        cases = reference_cases(args.random) if args.random else build_cases()
        compute = wpk_output
    else:
        from wpk.core.onnx_quantize import REFERENCE_OPS

        ops = [op for op in REFERENCE_OPS if not (args.without_wpk_pools and
                                                  op.__module__ == "wpk.core.onnx_pool")]
        cases, compute = reference_cases(args.count), reference_output(ops)
    rng, checked, wrong = np.random.default_rng(1), 0, 0
    for op, size, attributes in cases:
        model = pool_model(op, size, **attributes)
        x = rng.random((1, 2, *size)).astype(np.float32)
        expected = onnxruntime_output(model, x)
        if expected is None:
            continue
        checked += 1
        try:
            actual = compute(model, x)
            right = actual.shape == expected.shape and np.allclose(actual, expected, atol=1e-5)
            problem = "" if right else f"shape {actual.shape} vs {expected.shape}" \
                if actual.shape != expected.shape else "values differ"
        except Exception as exc:  # noqa: BLE001 - counted and shown
            problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        if problem:
            wrong += 1
            print(f"wrong: {op} over {size} {attributes}: {problem}")
    print(f"{checked} pools that onnxruntime runs, {checked - wrong} right, {wrong} wrong")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
