"""Match and rewrite of GELU spelled with several ops (rules `gelu_erf` and `gelu_tanh` in
`wpk.passes.fusion_rules`).

    erf form:  0.5 * x * (1 + Erf(x / sqrt(2)))                      -> Elementwise[gelu]
    tanh form: 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) -> Elementwise[gelu_tanh]
               or factored, Tanh((x * sqrt(2/pi)) * (1 + 0.044715 * x * x)) (FastGELU)

    quick form: x * Sigmoid(alpha * x), alpha a scalar (CLIP's 1.702) -> Elementwise[quick_gelu]

The outer product is accepted in the orders exporters write it:
(x * (1 + a)) * 0.5, (0.5 * (1 + a)) * x and (0.5 * x) * (1 + a); the cube as Pow(x, 3)
or written out as two products, x * (x * x) or (x * x) * x (the TorchScript exporter's
`F.gelu(x, approximate="tanh")` below opset 20).
"""

from __future__ import annotations

import math

from wpk.core.graph import Node
from wpk.core.workload import EpilogueStep
from wpk.passes.base import FLOAT_DTYPES
from wpk.passes.elementwise import make_elementwise
from wpk.passes.fusion import FusionContext

SQRT_2_PI = math.sqrt(2 / math.pi)
GELU_CUBIC = 0.044715


def _is_scalar(ctx: FusionContext, name: str | None, expected: float) -> bool:
    value = ctx.const(name) if name else None
    return (value is not None and value.size == 1
            and math.isclose(float(value.reshape(-1)[0]), expected, rel_tol=1e-3))


def _split(node: Node | None, op: str) -> list[str] | None:
    return list(node.inputs) if node is not None and node.op == op and len(
        node.inputs) == 2 else None


def _by_scalar(ctx: FusionContext, node: Node | None, op: str, factor: float) -> str | None:
    """The tensor operand of `op(t, factor)` (either order for Mul), or None."""
    inputs = _split(node, op)
    if inputs is None:
        return None
    if _is_scalar(ctx, inputs[1], factor):
        return inputs[0]
    if op == "Mul" and _is_scalar(ctx, inputs[0], factor):
        return inputs[1]
    return None


def _other(node: Node | None, name: str) -> str | None:
    if node is None or len(node.inputs) != 2 or node.inputs.count(name) != 1:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _consumer(ctx: FusionContext, node: Node, op: str) -> Node | None:
    user = ctx.single_consumer(node)
    return user if user is not None and user.op == op else None


def _producer(ctx: FusionContext, name: str, user: Node) -> Node | None:
    node = ctx.producers.get(name)
    return node if node is not None and ctx.single_consumer(node) is user else None


def _tail(ctx: FusionContext, act: Node, x: str) -> list[Node] | None:
    """The nodes of 0.5 * x * (1 + act) after `act`, or None."""
    add = _consumer(ctx, act, "Add")
    if add is None or not _is_scalar(ctx, _other(add, act.outputs[0]), 1.0):
        return None
    mul1 = _consumer(ctx, add, "Mul")
    other = _other(mul1, add.outputs[0])
    if other is None:
        return None
    if other == x or _is_scalar(ctx, other, 0.5):
        last = _consumer(ctx, mul1, "Mul")
        rest = _other(last, mul1.outputs[0])
        ok = _is_scalar(ctx, rest, 0.5) if other == x else rest == x
        return [add, mul1, last] if ok else None
    half = _producer(ctx, other, mul1)
    if half is None or _by_scalar(ctx, half, "Mul", 0.5) != x:
        return None
    return [add, mul1, half]


def match_gelu_erf(ctx: FusionContext, erf: Node):
    """x and the pattern's nodes when `erf` is the heart of an erf-GELU, else None."""
    scale = _producer(ctx, erf.inputs[0], erf)
    x = _by_scalar(ctx, scale, "Div", math.sqrt(2)) or _by_scalar(
        ctx, scale, "Mul", 1 / math.sqrt(2))
    if x is None or ctx.graph.tensors[x].dtype not in FLOAT_DTYPES:
        return None
    tail = _tail(ctx, erf, x)
    return None if tail is None else (EpilogueStep("gelu"), x, [scale, *tail])


def _square(ctx: FusionContext, name: str, user: Node) -> Node | None:
    """The node computing `name` as x * x, read by `user` alone, else None."""
    node = _producer(ctx, name, user)
    inputs = _split(node, "Mul")
    return node if inputs is not None and inputs[0] == inputs[1] else None


def _cube_of(ctx: FusionContext, cube: Node | None) -> tuple[str, list[Node]] | None:
    """(x, the cube's nodes) when `cube` computes x^3: Pow(x, 3), x * (x * x) or
    (x * x) * x, the square read by the cube alone; else None."""
    x = _by_scalar(ctx, cube, "Pow", 3.0)
    if x is not None:
        return x, [cube]
    inputs = _split(cube, "Mul")
    if inputs is None:
        return None
    for x, square_name in (inputs, inputs[::-1]):
        square = _square(ctx, square_name, cube)
        if square is not None and square.inputs[0] == x:
            return x, [cube, square]
    return None


def _cubic_form(ctx: FusionContext, arg: Node | None) -> tuple[str, list[Node]] | None:
    """(x, nodes) when `arg` is sqrt(2/pi) * (x + 0.044715 * x^3), else None."""
    inner_name = _by_scalar(ctx, arg, "Mul", SQRT_2_PI)
    inner = _producer(ctx, inner_name, arg) if inner_name else None
    if _split(inner, "Add") is None:
        return None
    for x, cubic_name in (inner.inputs, inner.inputs[::-1]):
        cubic = _producer(ctx, cubic_name, inner)
        cube_name = _by_scalar(ctx, cubic, "Mul", GELU_CUBIC)
        cube = _producer(ctx, cube_name, cubic) if cube_name else None
        found = _cube_of(ctx, cube)
        if found is not None and found[0] == x:
            return x, [inner, cubic, *found[1]]
    return None


def _scaled_square(ctx: FusionContext, node: Node | None) -> tuple[str, list[Node]] | None:
    """(x, nodes) when `node` is 0.044715 * x * x in any grouping: c * (x * x),
    (x * x) * c, (c * x) * x or x * (c * x); else None."""
    inputs = _split(node, "Mul")
    if inputs is None:
        return None
    rest = _by_scalar(ctx, node, "Mul", GELU_CUBIC)
    if rest is not None:
        square = _square(ctx, rest, node)
        return None if square is None else (square.inputs[0], [node, square])
    for scaled_name, x in (inputs, inputs[::-1]):
        scaled = _producer(ctx, scaled_name, node)
        if scaled is not None and _by_scalar(ctx, scaled, "Mul", GELU_CUBIC) == x:
            return x, [node, scaled]
    return None


def _fast_form(ctx: FusionContext, arg: Node | None) -> tuple[str, list[Node]] | None:
    """(x, nodes) when `arg` is (x * sqrt(2/pi)) * (1 + 0.044715 * x * x), the same
    value factored (Hugging Face's FastGELU), else None."""
    inputs = _split(arg, "Mul")
    if inputs is None:
        return None
    for scaled_name, poly_name in (inputs, inputs[::-1]):
        scaled = _producer(ctx, scaled_name, arg)
        x = _by_scalar(ctx, scaled, "Mul", SQRT_2_PI)
        poly = _producer(ctx, poly_name, arg)
        if x is None or _split(poly, "Add") is None:
            continue
        for one, term_name in (poly.inputs, poly.inputs[::-1]):
            if not _is_scalar(ctx, one, 1.0):
                continue
            found = _scaled_square(ctx, _producer(ctx, term_name, poly))
            if found is not None and found[0] == x:
                return x, [scaled, poly, *found[1]]
    return None


def match_gelu_tanh(ctx: FusionContext, tanh: Node):
    """x and the pattern's nodes when `tanh` is the heart of a tanh-GELU, else None."""
    arg = _producer(ctx, tanh.inputs[0], tanh)
    found = _cubic_form(ctx, arg) or _fast_form(ctx, arg)
    if found is None or ctx.graph.tensors[found[0]].dtype not in FLOAT_DTYPES:
        return None
    x, nodes = found
    tail = _tail(ctx, tanh, x)
    return None if tail is None else (EpilogueStep("gelu_tanh"), x, [arg, *nodes, *tail])


def match_quick_gelu(ctx: FusionContext, sigmoid: Node):
    """x and the pattern's nodes when `sigmoid` is the gate of x * Sigmoid(alpha * x) (each
    product in either order; alpha a finite scalar constant; silu when it is 1), else None.
    Without the scale, x * Sigmoid(x) is the `silu` rule's."""
    scale = _producer(ctx, sigmoid.inputs[0], sigmoid)
    inputs = _split(scale, "Mul")
    mul = _consumer(ctx, sigmoid, "Mul")
    if inputs is None or mul is None:
        return None
    for x, factor in (inputs, inputs[::-1]):
        alpha = ctx.const(factor)
        if alpha is None or alpha.size != 1 or ctx.const(x) is not None:
            continue
        alpha = float(alpha.reshape(-1)[0])
        if (math.isfinite(alpha) and _other(mul, sigmoid.outputs[0]) == x
                and ctx.graph.tensors[x].dtype in FLOAT_DTYPES):
            step = EpilogueStep("silu") if alpha == 1.0 else EpilogueStep(
                "quick_gelu", (("alpha", alpha),))
            return step, x, [scale, mul]
    return None


def rewrite_activation(ctx: FusionContext, act: Node, found) -> None:
    """Turn the activation node into Elementwise[step] over x; the other nodes go (`found`:
    (step, x, nodes) as the matchers here and `fusion_rules`' Mish return it)."""
    step, x, nodes = found
    last = max(nodes, key=ctx.position)
    new = make_elementwise(act.name, x, [(step, None)], [])
    act.op, act.domain, act.inputs, act.attrs, act.epilogue = (
        new.op, new.domain, new.inputs, {}, new.epilogue)
    ctx.absorb(act, last, remove=[n for n in nodes if n is not last])
