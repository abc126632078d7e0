"""`wpk op`: tune and benchmark a single operator workload.

    wpk op Conv --shape X=1x64x56x56 --shape W=64x64x3x3 --attr pads=1,1,1,1 --search ga
    op_command("Conv", {"X": (1, 64, 56, 56), "W": (64, 64, 3, 3)}, {"pads": "1,1,1,1"},
               target="cpu", search="ga", trials=32, as_json=False)  -> rich renderable

The shapes name the node's inputs in order: the first is the data input, the
others are constants (weights, bias) with seeded random values, so they are
what an implementation may pre-pack. Attributes are parsed from text: comma
lists of ints or floats, numbers, or strings. The output shapes come from ONNX
shape inference. The vendor and library candidates are measured, the
generated kernel is tuned (`--search`, `--trials`), and the per-operator
report lists every candidate with its time and its speed-up over the vendor one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from wpk.commands.common import SEARCHES, cluster_option, echo, parse_shape, target_of
from wpk.commands.render import format_gflops, format_time, plural, render_json, summary_lines
from wpk.core.errors import ModelError, OptionError
from wpk.core.machine_load import cpu_use, load_summary
from wpk.frontend import load_model
from wpk.kernels.flops import gflops_per_s
from wpk.kernels.target import create_target
from wpk.pipeline import BuildOptions, plan_workloads
from wpk.plans.report import make_report
from wpk.workloads import extract_workloads

OPSET = 17


def parse_attr(text: str) -> Any:
    """'1,1' -> [1, 1]; '0.5' -> 0.5; '2' -> 2; anything else stays a string."""
    parts = [p.strip() for p in str(text).split(",")]
    for kind in (int, float):
        try:
            values = [kind(p) for p in parts]
        except ValueError:
            continue
        return values if len(values) > 1 or "," in str(text) else values[0]
    return str(text)


def operator_model(op: str, shapes: Mapping[str, Sequence[int]], attrs: Mapping[str, Any],
                   seed: int = 0) -> onnx.ModelProto:
    """A one-node ONNX model: input 0 a graph input, the others seeded random initializers."""
    if not shapes:
        raise OptionError(f"wpk op {op}: give the input shapes",
                          hint="e.g. --shape X=1x64x56x56 --shape W=64x64x3x3")
    _check_input_count(op, list(shapes))
    rng = np.random.default_rng(seed)
    names = list(shapes)
    initializers = []
    for name in names[1:]:
        shape = tuple(int(d) for d in shapes[name])
        fan_in = max(1, int(np.prod(shape[1:], dtype=np.int64)))
        value = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
        initializers.append(numpy_helper.from_array(value, name))
    parsed = {k: parse_attr(v) if isinstance(v, str) else v for k, v in attrs.items()}
    node = helper.make_node(op, names, ["Y"], name=op.lower(), **parsed)
    first = helper.make_tensor_value_info(names[0], TensorProto.FLOAT, list(shapes[names[0]]))
    out = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], f"op_{op}", [first], [out], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=8)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as exc:  # onnx raises InferenceError, a private type
        raise OptionError(f"wpk op {op}: ONNX rejects these shapes or attributes: "
                          f"{str(exc).strip().splitlines()[-1]}",
                          hint="check --shape (node inputs in order) and --attr") from None
    if not inferred.graph.output[0].type.tensor_type.HasField("shape"):
        raise OptionError(f"wpk op {op}: the output shape does not follow from the given "
                          f"shapes ({', '.join(names)}) and attributes",
                          hint=f"{op}'s inputs are {_formal_inputs(op)}: give a --shape for "
                               "each input that decides the output shape")
    return inferred


def _schema(op: str) -> onnx.defs.OpSchema:
    try:
        return onnx.defs.get_schema(op, OPSET)
    except onnx.defs.SchemaError:
        raise OptionError(f"wpk op: '{op}' is not an ONNX operator (opset {OPSET})",
                          hint="give an operator's ONNX name, e.g. Conv, MatMul, Relu"
                          ) from None


def _formal_inputs(op: str) -> str:
    return ", ".join(i.name + ("" if i.option == onnx.defs.OpSchema.FormalParameterOption.Single
                               else "?" if i.option == onnx.defs.OpSchema.FormalParameterOption
                               .Optional else "...") for i in _schema(op).inputs)


def _check_input_count(op: str, names: list[str]) -> None:
    """OptionError naming the missing inputs when fewer shapes than `op` needs are given."""
    schema = _schema(op)
    if len(names) < schema.min_input:
        missing = [i.name for i in schema.inputs[len(names):schema.min_input]]
        raise OptionError(f"wpk op {op}: no --shape for input(s) {', '.join(missing)}; "
                          f"{op} needs at least {schema.min_input} and got "
                          f"{len(names)} ({', '.join(names)})",
                          hint=f"give one --shape NAME=DIMS per input, in node order: "
                               f"{_formal_inputs(op)}")


def op_report(op: str, shapes: Mapping[str, Sequence[int]], attrs: Mapping[str, Any], *,
              target: str = "cpu", search: str = "ga", trials: int | None = None,
              budget: float | None = None, db: str | None = None,
              progress: bool = False, cluster: str | None = None) -> dict:
    """The benchmark report of one operator (the build report's shape, plus 'search');
    `cluster`: measured on the nodes of that Ray cluster."""
    options = BuildOptions(target=target, search=search, trials=trials, budget=budget, db=db,
                           progress=progress, cluster=cluster)
    try:
        graph = load_model(operator_model(op, shapes, attrs))
    except ModelError as exc:  # the one-node model is made of --shape and --attr
        message = exc.message.replace(" in '<ModelProto>'", "").replace(
            "'<ModelProto>' ", "the node ")
        raise OptionError(f"wpk op {op}: {message}",
                          hint="check --shape (node inputs in order) and --attr") from None
    before = cpu_use()
    choices, summary, _ = plan_workloads(extract_workloads(graph), create_target(target),
                                         options, records=True)
    report = make_report(choices, target=target, model=f"op {op}", options=options.to_json())
    report["search"] = summary
    load = None if cluster is not None else load_summary(before, cpu_use())
    if load is not None:   # its timings are the busy machine's (`wpk.core.machine_load`)
        report["machine_load"] = load
    return report


def wrappable(label: str) -> str:
    """A candidate label that wraps between its config entries: 'a[x=1, y=2]'."""
    return label.replace(",", ", ")


def candidates_table(report: Mapping):
    """Per workload, a table of every candidate with its speed-up over the fastest vendor
    kernel (the chosen one marked with *); long names wrap, none is cut."""
    return Group(*(workload_table(workload) for workload in report["workloads"]))


def workload_table(workload: Mapping):
    """One workload's candidates, fastest first, under the workload's label; each names its
    algorithm when that says more than its name, and GFLOP/s for an op with a FLOP count."""
    table = Table(title=workload["label"], title_justify="left", box=box.SIMPLE_HEAD,
                  header_style="bold")
    flops = workload.get("flops")
    columns = (("candidate", "left"), ("kind", "left"), ("status", "left"), ("median", "right"),
               *((("GFLOP/s", "right"),) if flops else ()), ("vs vendor", "right"))
    for column, justify in columns:
        table.add_column(column, justify=justify, overflow="fold",
                         ratio=4 if column == "candidate" else None)
    vendor = [c["median_s"] for c in workload["candidates"]
              if c["kind"] == "vendor" and c["median_s"]]
    best_vendor = min(vendor) if vendor else None
    rows = sorted(workload["candidates"],
                  key=lambda c: (c["median_s"] is None, c["median_s"] or 0.0))
    for c in rows:
        speedup = (f"{best_vendor / c['median_s']:.2f}x"
                   if best_vendor and c["median_s"] else "-")
        mark = " *" if c["label"] == workload["chosen"] else ""
        algorithm = c.get("algorithm")
        named = f" ({algorithm})" if algorithm and algorithm != c["impl"] else ""
        rate = (format_gflops(gflops_per_s(flops, c["median_s"])),) if flops else ()
        table.add_row(Text(wrappable(c["label"]) + named + mark), c["kind"], c["status"],
                      format_time(c["median_s"]), *rate, speedup)
    return table


def op_command(op: str, shapes: Mapping[str, Sequence[int]], attrs: Mapping[str, Any],
               target: str = "cpu", search: str = "ga", trials: int | None = None,
               as_json: bool = False, budget: float | None = None, db: str | None = None,
               progress: bool = True, cluster: str | None = None):
    """`wpk op`: the report as JSON text (`as_json`) or a rich renderable (summary,
    then every candidate side by side; the chosen one marked with *)."""
    report = op_report(op, shapes, attrs, target=target, search=search, trials=trials,
                       budget=budget, db=db, progress=progress and not as_json,
                       cluster=cluster)
    if as_json:
        return render_json(report)
    lines = summary_lines(report) + tuning_lines(report["search"])
    return Group(Text("\n".join(lines)), candidates_table(report))


def tuning_lines(search: Mapping) -> list[str]:
    """Per tuned workload: its trials, best time and why its search ended."""
    tuned = search.get("tuned", [])
    if not tuned:
        return [f"search {search['search']}: nothing to tune"]
    return [f"tuned {t['label']} ({t['tuner']}): {plural(t['trials'], 'trial')}, best "
            f"{format_time(t.get('best_s'))}"
            + (f", re-measured {format_time(t['final_s'])}" if t.get("final_s") else "")
            + f"; {t.get('stopped_text') or t['stopped']}" for t in tuned]


@click.command("op")
@click.argument("op_type", metavar="OP")
@click.option("--shape", "shapes", multiple=True, required=True, metavar="NAME=1x64x56x56",
              help="Input shapes in node-input order: data first, then weights (repeatable).")
@click.option("--attr", "attrs", multiple=True, metavar="NAME=VALUE",
              help="Node attribute, e.g. strides=2,2 or alpha=0.1 (repeatable).")
@click.option("--cpu", is_flag=True, help="Measure on the host CPU (the default).")
@click.option("--gpu", metavar="NAME", help="Measure on a GPU preset.")
@click.option("--search", type=click.Choice(SEARCHES), default="ga", show_default=True,
              help="Schedule search for the generated kernel.")
@click.option("--trials", type=click.IntRange(min=1), help="Search trials.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Time budget for the search.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path),
              help="Tuning records (JSON lines) to reuse and extend.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@cluster_option("Measure")
def command(op_type: str, shapes: tuple[str, ...], attrs: tuple[str, ...], cpu: bool,
            gpu: str | None, search: str, trials: int | None, budget: float | None,
            db: Path | None, as_json: bool, cluster: str | None) -> None:
    """Tune one operator workload and print its per-operator benchmark report."""
    target, _ = target_of(cpu, gpu)
    named_shapes = {}
    for value in shapes:
        name, sep, dims = value.rpartition("=")
        if not sep or not name:
            raise OptionError(f"--shape: expected NAME=DIMS, got '{value}'",
                              hint="e.g. --shape X=1x64x56x56 --shape W=64x64x3x3")
        named_shapes[name] = parse_shape(dims, "--shape")
    named_attrs = {}
    for value in attrs:
        name, sep, text = value.partition("=")
        if not sep or not name:
            raise OptionError(f"--attr: expected NAME=VALUE, got '{value}'",
                              hint="e.g. --attr strides=2,2")
        named_attrs[name] = parse_attr(text)
    echo(op_command(op_type, named_shapes, named_attrs, target=target, search=search,
                    trials=trials, as_json=as_json, budget=budget,
                    db=None if db is None else str(db), cluster=cluster))
