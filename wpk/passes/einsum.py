"""Einsum -> Transpose, Reshape, MatMul, Mul, ReduceSum and Slice.

Exporters write Einsum where the source model did: torch's `einsum` (MaxViT's and
many attention implementations' `"b h i d, b h j d -> b h i j"`), Keras' EinsumDense
and MultiHeadAttention through tf2onnx (`"abc,cde->abde"`). wpk has no Einsum kernel,
and onnxruntime's runs the equation generically; the same contraction as a batched
MatMul runs on wpk's GEMM micro-kernels, and a q.k^T / softmax / .v written with
Einsum becomes the pattern the attention fusion takes.

Each equation is lowered operand pair by operand pair, left to right:

* a label repeated within one operand (a diagonal, `"bii->bi"`) is taken by moving its
  axes last, flattening them and slicing every (n^(r-1) + ... + 1)-th element;
* a label in one operand only and not needed later is summed out (ReduceSum);
* the labels of two operands split into batch (both, kept), contracted (both, not kept),
  and the rows and columns (one operand each; the operand whose labels the output
  has first gives the rows); the operands are transposed to
  [batch, rows, contracted] and [batch, contracted, columns], flattened to one MatMul,
  and the product reshaped to [batch, rows, columns]; without a contracted label the
  pair is an outer or elementwise product (Mul, broadcast);
* the result is transposed to the output's order.

Transposes and Reshapes that would not change anything are not written, those of a
constant operand (a weight) are done here, once. Ellipsis
dimensions are aligned from the right and broadcast like numpy's; an implicit output
(no `->`) is the ellipsis, then the labels that occur once, sorted. The pass leaves an
Einsum whose equation it cannot read, whose shapes disagree with it, or whose type
MatMul does not take (onnxruntime runs those as before).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from wpk.core.graph import Graph, Node, TensorInfo
from wpk.passes.base import GraphPass, add_constant

# The element types ONNX's MatMul (and ReduceSum) take
MATMUL_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16", "int32", "int64",
                           "uint32", "uint64"})
ELLIPSIS = "..."
# Labels of ellipsis dimensions: characters no equation uses (the equation's are letters)
_ELLIPSIS_LABELS = "".join(chr(0x3B1 + i) for i in range(24))


@dataclass(frozen=True)
class Equation:
    """An Einsum equation with its ellipses written out: each operand's labels, one per
    axis, and the output's labels."""

    operands: tuple[str, ...]
    output: str


def parse_equation(text: str, ranks: list[int]) -> Equation | None:
    """The equation `text` for operands of the given ranks, or None when it is malformed
    (a character other than a letter, an ellipsis where the rank leaves no room, a term
    count that does not match, an output label no operand has or one written twice)."""
    text = "".join(text.split())
    left, arrow, right = text.partition("->")
    terms = left.split(",")
    if len(terms) != len(ranks) or any(not _valid_term(t) for t in [*terms, right]):
        return None
    widths = []
    for term, rank in zip(terms, ranks):
        explicit = len(term.replace(ELLIPSIS, ""))
        width = rank - explicit
        if width < 0 or (width and ELLIPSIS not in term):
            return None
        widths.append(width)
    dots = _ELLIPSIS_LABELS[:max(widths, default=0)]
    if len(dots) < max(widths, default=0):
        return None
    operands = tuple(term.replace(ELLIPSIS, dots[len(dots) - width:])
                     for term, width in zip(terms, widths))
    if arrow:
        output = right.replace(ELLIPSIS, dots)
    else:
        letters = "".join(operands).translate({ord(d): None for d in dots})
        output = dots + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    used = set("".join(operands))
    if len(set(output)) != len(output) or not set(output) <= used:
        return None
    return Equation(operands, output)


def _valid_term(term: str) -> bool:
    """Letters, and at most one ellipsis."""
    rest = term.replace(ELLIPSIS, "", 1)
    return all(c.isascii() and c.isalpha() for c in rest)


@dataclass(frozen=True)
class _Value:
    """An intermediate tensor of the lowering: its name, one label per axis, its shape."""

    name: str
    labels: str
    shape: tuple[int, ...]


class EinsumLowering(GraphPass):
    """Rewrite every Einsum the pass can read as MatMul, Mul, ReduceSum and data movement."""

    name = "einsum_lowering"

    def run(self, graph: Graph) -> Graph:
        nodes: list[Node] = []
        for node in graph.nodes:
            lowered = None
            if node.op == "Einsum" and node.domain in ("", "ai.onnx"):
                lowered = _Lowering(graph, node).nodes()
            if lowered is None:
                nodes.append(node)
            else:
                nodes += lowered
                self.hit()
        graph.nodes = nodes
        return graph


class _Lowering:
    """The nodes that compute one Einsum node."""

    def __init__(self, graph: Graph, node: Node) -> None:
        self.graph, self.node = graph, node
        self.written: list[Node] = []
        self.added: list[str] = []
        self.dtype = graph.tensors[node.outputs[0]].dtype if node.outputs[0] in graph.tensors \
            else ""

    def nodes(self) -> list[Node] | None:
        """The replacement nodes, the last writing the Einsum's output; None to keep it."""
        graph, node = self.graph, self.node
        inputs = list(node.inputs)
        if (not inputs or any(not name or name not in graph.tensors for name in inputs)
                or self.dtype not in MATMUL_DTYPES
                or any(graph.tensors[name].dtype != self.dtype for name in inputs)):
            return None
        shapes = [tuple(graph.tensors[name].shape) for name in inputs]
        equation = parse_equation(node.text_attr("equation", ""), [len(s) for s in shapes])
        if equation is None or not _sizes_agree(equation, shapes):
            return None
        values = [self._diagonals(_Value(name, labels, shape))
                  for name, labels, shape in zip(inputs, equation.operands, shapes)]
        while len(values) > 1:
            later = set(equation.output).union(*(v.labels for v in values[2:]))
            target = equation.output if len(values) == 2 else None
            values = [self._pair(values[0], values[1], later, target), *values[2:]]
        result = self._sum_out(values[0], set(equation.output))
        result = self._transpose(result, equation.output)
        if result.shape != tuple(graph.tensors[node.outputs[0]].shape):
            self._abandon()
            return None
        return self._finish(result)

    # -- the steps -------------------------------------------------------------------

    def _diagonals(self, value: _Value) -> _Value:
        """Take the diagonal of each label the operand repeats."""
        for label in dict.fromkeys(value.labels):
            count = value.labels.count(label)
            if count < 2:
                continue
            size = value.shape[value.labels.index(label)]
            others = "".join(c for c in value.labels if c != label)
            moved = self._transpose_axes(value, [value.labels.index(c) for c in others]
                                         + [i for i, c in enumerate(value.labels)
                                            if c == label])
            flat = self._reshape(moved, others + label, moved.shape[:len(others)]
                                 + (size ** count,))
            step = sum(size ** j for j in range(count))
            value = self._slice_last(flat, size ** count, step, size)
        return value

    def _sum_out(self, value: _Value, keep: set[str], *, also: str = "") -> _Value:
        """Sum out the axes whose label is not in `keep`, or is in `also`."""
        axes = [i for i, c in enumerate(value.labels) if c not in keep or c in also]
        if not axes:
            return value
        labels = "".join(c for i, c in enumerate(value.labels) if i not in axes)
        shape = tuple(s for i, s in enumerate(value.shape) if i not in axes)
        opset = self.graph.opset
        if opset >= 13:
            axes_name = self._constant("sum_axes", np.array(axes, np.int64))
            return self._emit("ReduceSum", [value.name, axes_name], labels, shape,
                              {"keepdims": 0})
        return self._emit("ReduceSum", [value.name], labels, shape,
                          {"axes": tuple(axes), "keepdims": 0})

    def _pair(self, a: _Value, b: _Value, later: set[str], target: str | None) -> _Value:
        """The product of two operands, summed over their shared labels not in `later`."""
        # a label in one operand only and not needed later is summed out there; a shared
        # one of size 1 on one side is constant along it there: summed on each side
        uneven = "".join(c for c in a.labels if c in b.labels and c not in later
                         and _size(a, c) != _size(b, c))
        a, b = self._sum_out(a, later | set(b.labels), also=uneven), \
            self._sum_out(b, later | set(a.labels), also=uneven)
        order = target or (a.labels + b.labels)
        rank = {c: order.index(c) if c in order else len(order) for c in a.labels + b.labels}
        batch = sorted((c for c in a.labels if c in b.labels and c in later), key=rank.get)
        rows = sorted((c for c in a.labels if c not in b.labels), key=rank.get)
        cols = sorted((c for c in b.labels if c not in a.labels), key=rank.get)
        if rows and cols and rank[cols[0]] < rank[rows[0]]:
            # the output wants the second operand's labels first (Keras' attention scores,
            # "aecd,abcd->acbe": key, query): B x A needs no transposition of the product
            a, b, rows, cols = b, a, cols, rows
        inner = [c for c in a.labels if c in b.labels and c not in later]
        if not inner:
            return self._product(a, b, batch, rows, cols)
        return self._matmul(a, b, batch, rows, cols, inner)

    def _product(self, a: _Value, b: _Value, batch, rows, cols) -> _Value:
        """An outer or elementwise product: both operands in [batch, rows, cols] order with
        ones where a side lacks the label, then Mul."""
        labels = "".join(batch + rows + cols)
        sides = []
        for value in (a, b):
            moved = self._transpose(value, "".join(c for c in labels if c in value.labels))
            shape = tuple(_size(value, c) if c in value.labels else 1 for c in labels)
            sides.append(self._reshape(moved, labels, shape))
        shape = tuple(max(x, y) for x, y in zip(sides[0].shape, sides[1].shape))
        return self._emit("Mul", [sides[0].name, sides[1].name], labels, shape)

    def _matmul(self, a: _Value, b: _Value, batch, rows, cols, inner) -> _Value:
        """[batch, rows, inner] x [batch, inner, cols] as one (batched) MatMul."""
        row_sizes = tuple(_size(a, c) for c in rows)
        col_sizes = tuple(_size(b, c) for c in cols)
        size_k = math.prod(_size(a, c) for c in inner)
        a = self._transpose(a, "".join(batch + rows + inner))
        b = self._transpose(b, "".join(batch + inner + cols))
        # without batch labels the rows stay MatMul's leading dims, as a Linear layer's
        rows_shape = (math.prod(row_sizes),) if batch or not rows else row_sizes
        a = self._reshape(a, "", a.shape[:len(batch)] + rows_shape + (size_k,))
        b = self._reshape(b, "", b.shape[:len(batch)] + (size_k, math.prod(col_sizes)))
        batch_shape = tuple(max(x, y) for x, y in zip(a.shape[:len(batch)],
                                                      b.shape[:len(batch)]))
        product = self._emit("MatMul", [a.name, b.name], "",
                             batch_shape + rows_shape + (b.shape[-1],))
        return self._reshape(product, "".join(batch + rows + cols),
                             batch_shape + row_sizes + col_sizes)

    # -- data movement ---------------------------------------------------------------

    def _transpose(self, value: _Value, labels: str) -> _Value:
        return self._transpose_axes(value, [value.labels.index(c) for c in labels])

    def _transpose_axes(self, value: _Value, perm: list[int]) -> _Value:
        if perm == list(range(len(value.shape))):
            return value
        labels = "".join(value.labels[i] for i in perm)
        if value.name in self.graph.constants:   # a weight: transposed once, here
            return self._constant_value(np.transpose(self.graph.constants[value.name], perm),
                                        labels)
        return self._emit("Transpose", [value.name], labels,
                          tuple(value.shape[i] for i in perm), {"perm": tuple(perm)})

    def _reshape(self, value: _Value, labels: str, shape: tuple[int, ...]) -> _Value:
        """`value` reshaped to `shape`, its axes then carrying `labels`."""
        if tuple(shape) == value.shape:
            return _Value(value.name, labels, value.shape)
        if value.name in self.graph.constants:
            return self._constant_value(self.graph.constants[value.name].reshape(shape), labels)
        shape_name = self._constant("shape", np.array(shape, np.int64))
        return self._emit("Reshape", [value.name, shape_name], labels, tuple(shape))

    def _slice_last(self, value: _Value, end: int, step: int, length: int) -> _Value:
        """Every `step`-th element of the last axis, up to `end`."""
        params = [self._constant(f"slice_{what}", np.array([v], np.int64))
                  for what, v in (("starts", 0), ("ends", end), ("axes", -1), ("steps", step))]
        return self._emit("Slice", [value.name, *params], value.labels,
                          value.shape[:-1] + (length,))

    # -- bookkeeping -----------------------------------------------------------------

    def _constant(self, what: str, value: np.ndarray) -> str:
        name = add_constant(self.graph, f"{self.node.outputs[0]}_{what}", value)
        self.added.append(name)
        return name

    def _constant_value(self, array: np.ndarray, labels: str) -> _Value:
        array = np.ascontiguousarray(array)
        return _Value(self._constant("operand", array), labels, tuple(array.shape))

    def _emit(self, op: str, inputs: list[str], labels: str, shape: tuple[int, ...],
              attrs: dict | None = None) -> _Value:
        graph = self.graph
        out = graph.unique_name(f"{self.node.outputs[0]}_{op.lower()}")
        graph.tensors[out] = TensorInfo(tuple(shape), self.dtype)
        self.added.append(out)
        # named as its output, a fresh tensor name, so no node has the name yet
        self.written.append(Node(op, inputs, [out], out, dict(attrs or {})))
        return _Value(out, labels, tuple(shape))

    def _finish(self, result: _Value) -> list[Node]:
        """Write the last node's result into the Einsum's own output."""
        out = self.node.outputs[0]
        if not self.written or self.written[-1].outputs[0] != result.name:
            return [*self.written, Node("Identity", [result.name], [out], self.node.name)]
        last = self.written[-1]
        del self.graph.tensors[last.outputs[0]]
        last.outputs = [out]
        last.name = self.node.name
        return self.written

    def _abandon(self) -> None:
        """Take back the tensors and constants of a lowering that is not used."""
        for name in self.added:
            self.graph.tensors.pop(name, None)
            self.graph.constants.pop(name, None)


def _size(value: _Value, label: str) -> int:
    return value.shape[value.labels.index(label)]


def _sizes_agree(equation: Equation, shapes: list[tuple[int, ...]]) -> bool:
    """Every label has one size, or 1 where it broadcasts (as numpy's einsum allows)."""
    sizes: dict[str, set[int]] = {}
    for labels, shape in zip(equation.operands, shapes):
        for label, size in zip(labels, shape):
            sizes.setdefault(label, set()).add(int(size))
    return all(len(s - {1}) <= 1 for s in sizes.values())
