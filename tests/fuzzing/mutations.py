"""Differential fuzzing of wpk's graph passes: the exporters' corpus models, mutated.

The fusion rules match the patterns exporters write (`tests/corpus`). A rule that fires
where it must not (a constant that differs, an operand swapped, an inner tensor read
elsewhere) gives a plan that computes something else, or a build that fails inside wpk.
`mutate` edits a corpus model the way a user's model may differ from the corpus: a small
constant's value, an elementwise op for another, two operands swapped, an axis, an
intermediate asked for as a graph output, an input rewired to another tensor of the same
shape, an integer constant (a Slice's bounds, a Reshape's shape), a Transpose's
permutation, an attribute (keepdims, transB, epsilon, axes), a unary op put on one edge,
a conv's or pool's window (strides, dilations, pads, auto_pad, a pool's kernel).
`check_mutant` keeps a mutant only when onnxruntime runs it to finite outputs, then builds
it with wpk (the tests' fast options) and compares the plan's outputs with
onnxruntime's.

Outcomes: "ok"; "skip" (no mutation applied, or onnxruntime refuses the mutant);
"refused" (wpk's own error, within the contract); "near" (a float output off by more
than 1e-4 but under `WRONG`, an integer output differing, a float output whose rows are
onnxruntime's in another order: ill-conditioned mutants, such as a division by a computed
value whose rounding the verification tolerates per step, or a sort or top-k over
near-ties); "wrong" (an output off by more than `WRONG`, or missing) and
"internal" (an exception that is not a `WpkError`): the violations.

    python scripts/fuzz_passes.py --minutes 30    # a long run (see there)
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper as h
from onnx import numpy_helper as nh

from tests import corpus
from tests.built_plans import FAST_BUILD
from wpk.core.errors import WpkError
from wpk.core.numerics import relative_l2

SPECIAL_VALUES = [0.0, 1.0, -1.0, 0.5, 2.0, 3.0, 6.0, 1.702, 1.4142135, 0.7978846, 0.044715,
                  1e-5, 1e-6, 0.125, 8.0, -np.inf, 1e4]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min"]
UNARY = ["Sigmoid", "Tanh", "Relu", "Erf", "Neg", "Abs", "Softplus", "Exp", "HardSwish",
         "HardSigmoid", "Identity"]
SWAPPABLE = ("Sub", "Div", "Pow", "MatMul", "Add", "Mul", "Concat", "Max")
CLOSE = 1e-4   # relative L2 of a plan on an unmutated corpus model (test_corpus)
WRONG = 1e-2   # far beyond rounding: a pattern computed as something else
VIOLATIONS = ("wrong", "internal")
# The corpus models the mutations start from: the float ones (the quantized models'
# QDQ pairs make most mutations meaningless)
MODELS = [name for name, entry in corpus.CORPUS.items() if not entry.quantized]


@dataclass
class Outcome:
    """What one mutant did: its kind (see the module), the model and the mutations."""

    kind: str
    model: str
    mutations: list[str] = field(default_factory=list)
    detail: str = ""


def _typed_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int | None, ...]]]:
    """Tensor name -> (element type, shape: None for a dim not known) where ONNX's shape
    inference knows the type and the rank."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a mutant ONNX cannot type
        inferred = model
    found = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if tensor.elem_type and tensor.HasField("shape"):
            found[value.name] = (tensor.elem_type, tuple(
                d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in tensor.shape.dim))
    for init in inferred.graph.initializer:
        found[init.name] = (init.data_type, tuple(init.dims))
    return found


def _label(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


def change_constant(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """A float constant of at most 4 values (a pattern's 0.5, 3, eps, scale) scaled or set
    to a special value."""
    tensors = [t for t in model.graph.initializer
               if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) <= 4]
    tensors += [a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute
                if a.name == "value" and a.t.data_type == onnx.TensorProto.FLOAT
                and np.prod(a.t.dims) <= 4]
    if not tensors:
        return None
    tensor = rng.choice(tensors)
    value = nh.to_array(tensor).astype(np.float32)
    if rng.random() < 0.4:
        value = value * np.float32(rng.choice([1.1, 0.9, -1.0, 2.0, 0.5, 1.0001]))
    else:
        value = np.full_like(value, rng.choice(SPECIAL_VALUES))
    tensor.CopyFrom(nh.from_array(value.astype(np.float32), tensor.name))
    return f"constant {tensor.name or '(Constant node)'} -> {value.ravel()[:4].tolist()}"


def _change_op(rng: random.Random, ops: list[str], nodes: list[onnx.NodeProto]) -> str | None:
    """One of `nodes` given another op of `ops`."""
    if not nodes:
        return None
    node = rng.choice(nodes)
    old, node.op_type = node.op_type, rng.choice([o for o in ops if o != node.op_type])
    return f"{_label(node)}: {old} -> {node.op_type}"


def change_binary_op(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """An elementwise binary op for another (Add -> Div, ...)."""
    return _change_op(rng, BINARY, [n for n in model.graph.node if n.op_type in BINARY])


def change_unary_op(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """An attribute-free elementwise unary op for another (Erf -> Tanh, ...)."""
    return _change_op(rng, UNARY, [n for n in model.graph.node
                                   if n.op_type in UNARY and not n.attribute])


def swap_inputs(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """Two operands of a binary op, a MatMul or a Concat swapped."""
    nodes = [n for n in model.graph.node if n.op_type in SWAPPABLE and len(n.input) >= 2]
    if not nodes:
        return None
    node = rng.choice(nodes)
    inputs = list(node.input)
    i, j = rng.sample(range(len(inputs)), 2)
    inputs[i], inputs[j] = inputs[j], inputs[i]
    node.ClearField("input")
    node.input.extend(inputs)
    return f"{_label(node)} ({node.op_type}): inputs {i} <-> {j}"


def change_axis(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """An `axis` attribute (Softmax, Concat, LayerNormalization, ...) set to another axis."""
    shapes = _typed_shapes(model)
    found = [(n, a) for n in model.graph.node for a in n.attribute
             if a.name == "axis" and a.type == onnx.AttributeProto.INT]
    if not found:
        return None
    node, attribute = rng.choice(found)
    rank = len(shapes[node.input[0]][1]) if node.input[0] in shapes else 4
    others = [v for v in range(-rank, rank) if v % rank != attribute.i % max(rank, 1)]
    if not others:
        return None
    old, attribute.i = attribute.i, rng.choice(others)
    return f"{_label(node)} ({node.op_type}): axis {old} -> {attribute.i}"


def add_output(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """An intermediate float tensor asked for as a graph output too."""
    shapes = _typed_shapes(model)
    outputs = {o.name for o in model.graph.output}
    names = [o for n in model.graph.node if n.op_type != "Constant" for o in n.output
             if o and o not in outputs and shapes.get(o, (0,))[0] == onnx.TensorProto.FLOAT]
    if not names:
        return None
    name = rng.choice(names)
    element_type, shape = shapes[name]
    ask_for_output(model, name, element_type, len(shape))
    return f"output {name} (rank {len(shape)})"


def ask_for_output(model: onnx.ModelProto, name: str, element_type: int, rank: int) -> None:
    """Make tensor `name` a graph output of `model` too, its dims by name only: ONNX's
    inference of a model whose input declares -1 (paddle2onnx, tf2onnx) can give dims
    that the real input shape contradicts."""
    model.graph.output.append(h.make_tensor_value_info(
        name, element_type, [f"{name}_{i}" for i in range(rank)]))


def rewire(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """One input of a node read from another earlier tensor of the same type and shape."""
    shapes = _typed_shapes(model)
    made = {x.name: -1 for x in model.graph.input}
    for index, node in enumerate(model.graph.node):
        made.update({o: index for o in node.output})
    candidates = [(i, n) for i, n in enumerate(model.graph.node) if n.op_type != "Constant"]
    rng.shuffle(candidates)
    for index, node in candidates[:20]:
        for k, name in enumerate(node.input):
            if name not in shapes or name not in made or None in shapes[name][1]:
                continue
            same = [o for o, j in made.items() if j < index and o != name
                    and shapes.get(o) == shapes[name]]
            if same:
                node.input[k] = other = rng.choice(same)
                return f"{_label(node)} ({node.op_type}): input {k} {name} -> {other}"
    return None


INTEGER_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def change_int_constant(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """One value of an integer constant of at most 4 values (a Slice's starts or ends, a
    Reshape's shape, a Gather's index, an Unsqueeze's axes) moved by one, negated, set to
    0, -1 or the int64 maximum (a Slice's "to the end")."""
    tensors = [t for t in model.graph.initializer
               if t.data_type in INTEGER_TYPES and 0 < np.prod(t.dims) <= 4]
    tensors += [a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute
                if a.name == "value" and a.t.data_type in INTEGER_TYPES
                and 0 < np.prod(a.t.dims) <= 4]
    if not tensors:
        return None
    tensor = rng.choice(tensors)
    value = nh.to_array(tensor).copy()
    flat = value.reshape(-1)
    k = rng.randrange(flat.size)
    old = int(flat[k])
    limits = np.iinfo(value.dtype)
    new = rng.choice([old + 1, old - 1, -old, 0, -1, int(limits.max)])
    new = min(max(new, int(limits.min)), int(limits.max))
    if new == old:
        return None
    flat[k] = new
    tensor.CopyFrom(nh.from_array(value, tensor.name))
    return f"int constant {tensor.name or '(Constant node)'}[{k}]: {old} -> {new}"


def change_permutation(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """A Transpose's `perm` shuffled to another permutation of the same rank (the head
    splits and merges of attention, NCHW <-> NHWC of tf2onnx)."""
    found = [(n, a) for n in model.graph.node if n.op_type == "Transpose"
             for a in n.attribute if a.name == "perm" and len(a.ints) >= 2]
    if not found:
        return None
    node, attribute = rng.choice(found)
    old = list(attribute.ints)
    new = old[:]
    while new == old:
        rng.shuffle(new)
    attribute.ClearField("ints")
    attribute.ints.extend(new)
    return f"{_label(node)} (Transpose): perm {old} -> {new}"


FLIPPABLE = ("keepdims", "transA", "transB", "noop_with_empty_axes", "ceil_mode",
             "count_include_pad", "select_last_index", "largest", "sorted")
SCALABLE = ("alpha", "beta", "epsilon", "gamma", "min", "max")


def change_attribute(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """A 0/1 attribute flipped (keepdims, transA, transB, ...), a float attribute (Gemm's
    alpha and beta, a norm's epsilon, LeakyRelu's alpha, an old Clip's bounds) scaled or
    set to a special value, or one of an `axes` list set to another axis."""
    found = [(n, a) for n in model.graph.node for a in n.attribute
             if (a.type == onnx.AttributeProto.INT and a.name in FLIPPABLE and a.i in (0, 1))
             or (a.type == onnx.AttributeProto.FLOAT and a.name in SCALABLE)
             or (a.type == onnx.AttributeProto.INTS and a.name == "axes" and a.ints)]
    if not found:
        return None
    node, attribute = rng.choice(found)
    if attribute.type == onnx.AttributeProto.INT:
        old, attribute.i = attribute.i, 1 - attribute.i
        return f"{_label(node)} ({node.op_type}): {attribute.name} {old} -> {attribute.i}"
    if attribute.type == onnx.AttributeProto.FLOAT:
        old = attribute.f
        attribute.f = (old * rng.choice([1.1, 0.5, -1.0, 2.0]) if rng.random() < 0.5
                       else float(rng.choice(SPECIAL_VALUES)))
        return f"{_label(node)} ({node.op_type}): {attribute.name} {old:g} -> {attribute.f:g}"
    shapes = _typed_shapes(model)
    rank = len(shapes[node.input[0]][1]) if node.input[0] in shapes else 4
    axes = list(attribute.ints)
    k = rng.randrange(len(axes))
    choices = [v for v in range(-rank, rank) if v % rank not in {a % rank for a in axes}]
    if not choices:
        return None
    old, axes[k] = list(attribute.ints), rng.choice(choices)
    attribute.ClearField("ints")
    attribute.ints.extend(axes)
    return f"{_label(node)} ({node.op_type}): axes {old} -> {axes}"


WINDOW_OPS = ("Conv", "MaxPool", "AveragePool", "LpPool")


def change_window(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """A conv's or pool's window changed: one stride or dilation to another value, one pad
    made uneven, `auto_pad` set to SAME_UPPER, SAME_LOWER or VALID (its pads dropped), or a
    pool's kernel size along one axis; the exporters' models have few of these forms."""
    windows = [n for n in model.graph.node if n.op_type in WINDOW_OPS
               and any(a.name == "kernel_shape" for a in n.attribute)]
    if not windows:
        return None
    node = rng.choice(windows)
    attributes = {a.name: a for a in node.attribute}
    rank = len(attributes["kernel_shape"].ints)
    kinds = ["strides", "dilations", "pads", "auto_pad"] + \
        (["kernel_shape"] if node.op_type != "Conv" else [])
    kind = rng.choice(kinds)
    if kind == "auto_pad":
        value = rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
        kept = [a for a in node.attribute if a.name not in ("auto_pad", "pads")]
        node.ClearField("attribute")
        node.attribute.extend([*kept, h.make_attribute("auto_pad", value)])
        return f"{_label(node)} ({node.op_type}): auto_pad -> {value}"
    if "auto_pad" in attributes and kind == "pads" and \
            attributes["auto_pad"].s.decode() not in ("", "NOTSET"):
        return None
    size = 2 * rank if kind == "pads" else rank
    default = 0 if kind == "pads" else 1
    values = list(attributes[kind].ints) if kind in attributes else [default] * size
    k = rng.randrange(size)
    old = list(values)
    values[k] = rng.choice([v for v in {0: (0, 1, 2, 3), 1: (1, 2, 3)}[default]
                            if v != values[k]] or [default])
    if kind in attributes:
        attributes[kind].ClearField("ints")
        attributes[kind].ints.extend(values)
    else:
        node.attribute.append(h.make_attribute(kind, values))
    return f"{_label(node)} ({node.op_type}): {kind} {old} -> {values}"


def insert_unary(model: onnx.ModelProto, rng: random.Random) -> str | None:
    """A unary op (Neg, Relu, Sigmoid, Identity) put between a float tensor and one of
    its readers, the others still reading the tensor itself: a pattern's inner edge made
    longer, a tensor that several rules read split between them."""
    shapes = _typed_shapes(model)
    readers = [(index, node, k) for index, node in enumerate(model.graph.node)
               if node.op_type != "Constant" for k, name in enumerate(node.input)
               if shapes.get(name, (0,))[0] == onnx.TensorProto.FLOAT]
    if not readers:
        return None
    index, node, k = rng.choice(readers)
    tensor = node.input[k]
    op = rng.choice(["Neg", "Relu", "Sigmoid", "Identity"])
    made = f"{tensor}_fuzz_{op.lower()}"
    node.input[k] = made
    model.graph.node.insert(index, h.make_node(op, [tensor], [made], name=f"fuzz_{op}_{index}"))
    return f"{_label(node)} ({node.op_type}): input {k} {tensor} through {op}"


MUTATIONS = [change_constant, change_constant, change_binary_op, change_unary_op,
             swap_inputs, change_axis, add_output, add_output, rewire, rewire,
             change_int_constant, change_permutation, change_attribute, insert_unary,
             change_window]


def mutate(model: onnx.ModelProto, rng: random.Random,
           mutations: Sequence[Callable] = MUTATIONS) -> list[str]:
    """Apply one or two of `mutations` to `model` in place; what they did."""
    applied = []
    for _ in range(rng.choice([1, 1, 2])):
        for _attempt in range(5):
            what = rng.choice(mutations)(model, rng)
            if what:
                applied.append(what)
                break
    if applied:   # the exporter's shapes of the model before the mutation
        del model.graph.value_info[:]
    return applied


def check_mutant(name: str, model: onnx.ModelProto, rng: random.Random,
                 mutations: Sequence[Callable] = MUTATIONS) -> Outcome:
    """Mutate corpus model `name` (its ModelProto `model`, edited in place) with one or two
    of `mutations`, then compare wpk's plan of it with onnxruntime."""
    mutations = mutate(model, rng, mutations)
    if not mutations:
        return Outcome("skip", name)
    return compare_plan(name, model, rng.randrange(1000), mutations)


def compare_plan(name: str, model: onnx.ModelProto, seed: int,
                 mutations: list[str]) -> Outcome:
    """Build `model` (a mutant of corpus model `name`) and compare its plan's outputs with
    onnxruntime's on the corpus' random input of `seed`."""
    outcome = Outcome("skip", name, mutations)
    feeds = corpus.random_feeds(name, seed=seed)
    try:
        onnx.checker.check_model(model)
        expected, plain = onnxruntime_in_a_child(model, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime refuses the mutant: not a case
        outcome.detail = f"onnxruntime: {str(exc)[:120]}"
        return outcome
    floats = [k for k, v in expected.items() if v.dtype.kind == "f"]
    if not all(np.isfinite(expected[k]).all() and np.isfinite(plain[k]).all() for k in floats):
        outcome.detail = "onnxruntime: outputs not finite"
        return outcome
    try:
        actual = _plan_outputs(name, model, feeds)
    except WpkError as exc:
        outcome.kind, outcome.detail = "refused", f"{type(exc).__name__}: {str(exc)[:300]}"
        return outcome
    except Exception as exc:  # noqa: BLE001 - exactly what the fuzzer looks for
        outcome.kind = "internal"
        outcome.detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
        return outcome
    outcome.kind, outcome.detail = _compare(expected, plain, actual)
    return outcome


class OnnxruntimeCrashed(RuntimeError):
    """onnxruntime died of a signal on the mutant (a SIGFPE on a size-0 pool window)."""


def onnxruntime_in_a_child(model: onnx.ModelProto, feeds: dict) -> tuple[dict, dict]:
    """onnxruntime's outputs with its optimizations and without, computed in a forked
    child: onnxruntime itself dies of a signal on some mutants (a MaxPool whose uneven pads
    leave a size-0 window: SIGFPE), which took a whole campaign down; here that child's
    death raises `OnnxruntimeCrashed` (the mutant is skipped)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "outputs.npz")
        pid = os.fork()
        if pid == 0:   # the child: its answer in a file (outputs can be large), then gone
            code = 1
            try:
                expected = corpus.onnxruntime_outputs(model, feeds)
                plain = corpus.onnxruntime_outputs(model, feeds, optimized=False)
                np.savez(path, **{f"e/{k}": v for k, v in expected.items()},
                         **{f"p/{k}": v for k, v in plain.items()})
                code = 0
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                with open(path + ".error", "w") as handle:
                    handle.write(str(exc)[:500])
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            name = signal.Signals(os.WTERMSIG(status)).name
            raise OnnxruntimeCrashed(f"onnxruntime crashed ({name})")
        if os.WEXITSTATUS(status) != 0:
            with open(path + ".error") as handle:
                raise RuntimeError(handle.read())
        with np.load(path, allow_pickle=False) as data:
            expected = {k[2:]: data[k] for k in data.files if k.startswith("e/")}
            plain = {k[2:]: data[k] for k in data.files if k.startswith("p/")}
    return expected, plain


def _plan_outputs(name: str, model: onnx.ModelProto, feeds: dict) -> dict:
    import wpk

    plan = wpk.build(model, target="cpu", input_shapes=corpus.input_shapes(name), **FAST_BUILD)
    with tempfile.TemporaryDirectory(prefix="wpk-mutant-") as folder:
        path = Path(folder) / "mutant.wpk"
        plan.save(path)
        return wpk.load(path).run(feeds)


def _sorted_rows(array: np.ndarray) -> np.ndarray:
    """`array`'s rows (along axis 0) in lexicographic order: a detector's boxes after a
    sort whose keys tie to within rounding (two scores 1e-7 apart) come out in either
    order, in onnxruntime as in a plan."""
    if array.ndim == 0 or array.shape[0] < 2:
        return array
    rows = array.reshape(array.shape[0], -1)
    return rows[np.lexsort(rows.T[::-1])]


def _compare(expected: dict, plain: dict, actual: dict) -> tuple[str, str]:
    """(kind, detail) of the plan's outputs against onnxruntime's at both levels."""
    spread = max((relative_l2(plain[k], v) for k, v in expected.items()
                  if v.dtype.kind == "f" and v.size), default=0.0)
    kind, details = "ok", []
    for output, reference in expected.items():
        got = actual.get(output)
        if got is None or got.shape != reference.shape:
            return "wrong", f"{output}: {'missing' if got is None else got.shape}"
        if reference.dtype.kind != "f":
            if not np.array_equal(got, reference):
                kind = "near"
                details.append(f"{output} ({reference.dtype}) differs")
            continue
        error = min(relative_l2(got, reference), relative_l2(got, plain[output]))
        if error > max(WRONG, 100 * spread):
            if relative_l2(_sorted_rows(got), _sorted_rows(reference)) > CLOSE:
                return "wrong", f"{output}: relative L2 {error:.2e}"
            kind = "near"   # the same rows in another order: a sort over near-tied keys
            details.append(f"{output}: the same rows in another order")
            continue
        if error > max(CLOSE, 10 * spread):
            kind = "near"
            details.append(f"{output}: relative L2 {error:.2e}")
    return kind, "; ".join(details)
