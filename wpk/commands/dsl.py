"""`wpk dsl FILE.wpk`: print the IR or generated code of DSL operators, or check them.

    wpk dsl kernels/dsl/gemm.wpk --emit ir
    wpk dsl kernels/dsl/conv2d.wpk --target cuda --gpu t4 --emit cuda \
        --config '{"op": "conv2d", "bindings": {"N": 1, "C": 16, "H": 14, "W": 14,
                   "K": 32, "CG": 16, "R": 3, "S": 3, "pad_t": 1, "pad_b": 1}}'
    wpk dsl kernels/dsl/softmax.wpk --check

`--config` is a JSON object: `op` selects one operator of the file (default:
every operator), `bindings` gives shape symbols and scalars (shape symbols
default to 8, scalars to their declared defaults), and every other key is a
schedule knob of the operator's template (default: the template's default
config). `--check` builds the kernel (gcc for `cpu`; for `cuda` the GPU
emulator runs the CUDA-scheduled loop IR, and the source is compiled for the
preset's arch when a CUDA compiler is present), runs it on seeded random
inputs and compares with the float64 reference interpreter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import click
import numpy as np

from wpk.core.devices import gpu_preset
from wpk.core.errors import DslError, OptionError, ToolchainError
from wpk.core.numerics import relative_l2
from wpk.dsl import compute as ir
from wpk.dsl import loopir
from wpk.dsl.codegen_c import generate_c
from wpk.dsl.parser import parse_file
from wpk.kernels import templates

DEFAULT_DIM = 8
CHECK_TOLERANCE = 1e-4
RESERVED_KEYS = ("op", "bindings")


def parse_config(config_json: str | None) -> tuple[str | None, dict, dict]:
    """(operator name, bindings, schedule knobs) from the --config JSON."""
    if not config_json:
        return None, {}, {}
    try:
        config = json.loads(config_json)
    except json.JSONDecodeError as exc:
        raise OptionError(f"--config is not valid JSON: {exc.msg} at column {exc.colno}",
                          hint='pass an object, e.g. --config \'{"op": "matmul", '
                               '"bindings": {"M": 64}}\'') from None
    if not isinstance(config, dict):
        raise OptionError("--config must be a JSON object", hint='e.g. {"op": "matmul"}')
    bindings = config.get("bindings", {})
    if not isinstance(bindings, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in bindings.values()):
        raise OptionError("--config: 'bindings' must map names to numbers",
                          hint='e.g. "bindings": {"N": 1, "C": 16, "groups": 2}')
    knobs = {k: v for k, v in config.items() if k not in RESERVED_KEYS}
    return config.get("op"), bindings, knobs


def example_arrays(op: ir.Operator, bindings: Mapping[str, int | float],
                   seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, int | float]]:
    """Seeded random inputs for `op` (unbound shape symbols get DEFAULT_DIM) and all bindings."""
    given = dict(bindings)
    unknown = set(given) - set(op.shape_symbols) - {s.name for s in op.scalars}
    if unknown:
        raise OptionError(f"--config bindings name {', '.join(sorted(unknown))}, which "
                          f"operator {op.name} does not have",
                          hint=f"its shape symbols are {', '.join(op.shape_symbols)} and its "
                               f"scalars {', '.join(s.name for s in op.scalars) or 'none'}")
    symbols = {name: int(given.get(name, DEFAULT_DIM)) for name in op.shape_symbols}
    scalars = {s.name: given[s.name] for s in op.scalars if s.name in given}
    missing = [s.name for s in op.scalars if s.default is None and s.name not in scalars]
    if missing:
        raise OptionError(f"operator {op.name} needs values for {', '.join(missing)}",
                          hint=f'pass --config \'{{"op": "{op.name}", "bindings": '
                               f'{{"{missing[0]}": ...}}}}\'')
    partial = {**symbols, **{s.name: scalars.get(s.name, s.default) for s in op.scalars}}
    rng = np.random.default_rng(seed)
    arrays = {}
    for p in op.params:
        shape = tuple(_dim_value(d, partial, op) for d in p.shape)
        data = rng.standard_normal(shape)
        if p.dtype in ir.INT_TYPES:
            data = rng.integers(0, 4, shape)
        arrays[p.name] = data.astype(ir.NUMPY_DTYPES[p.dtype])
    return arrays, ir.infer_bindings(op, arrays, scalars)


def _dim_value(dim: ir.Expr, partial: dict, op: ir.Operator) -> int:
    values = dict(partial)
    for name, expr in op.derived:  # derived dims may size inputs (e.g. a residual)
        try:
            values[name] = ir.bind_dim(expr, values)
        except DslError:
            break
    return ir.bind_dim(dim, values)


def dsl_command(path: str, target: str = "cpu", gpu: str = "h100", config_json: str | None = None,
                emit: str | None = None, check: bool = False) -> str:
    """Text for `wpk dsl`: the emitted IR/code and/or the check report of each operator."""
    if target not in ("cpu", "cuda"):
        raise OptionError(f"unknown target '{target}'", hint="use --target cpu or cuda")
    if emit == "cuda" and target != "cuda":
        target = "cuda"
    if emit == "c" and target != "cpu":
        raise OptionError("--emit c needs --target cpu", hint="use --emit cuda for --target cuda")
    name, bindings, knobs = parse_config(config_json)
    operators = parse_file(path)
    if name is not None:
        operators = [op for op in operators if op.name == name]
        if not operators:
            raise OptionError(f"{path} defines no operator '{name}'",
                              hint=f"it defines {', '.join(o.name for o in parse_file(path))}")
    if not operators:
        raise DslError(f"{path}: the file defines no operator", hint="add an `op` definition")
    if knobs and len(operators) > 1:
        raise OptionError("schedule knobs in --config need one operator",
                          hint='select it with "op": "NAME" in --config')
    if emit is None and not check:
        emit = "ir"
    hw = None
    if target == "cuda":
        hw = gpu_preset(gpu)
    sections = []
    for op in operators:
        arrays, full = example_arrays(op, bindings)
        header = f"// {op.name}: " + ", ".join(f"{k}={v}" for k, v in full.items())
        parts = [header]
        if emit is not None:
            parts.append(emit_operator(op, full, knobs or None, target, emit, hw))
        if check:
            parts.append(check_operator(op, arrays, full, knobs or None, target, hw))
        sections.append("\n".join(parts))
    return "\n\n".join(sections)


def emit_operator(op: ir.Operator, bindings, config, target: str, emit: str, hw) -> str:
    """The compute IR (and loop IR when printable), C or CUDA source of `op`."""

    if emit == "ir":
        text = ir.operator_text(op) + "\n// specialised:\n" + \
            ir.operator_text(ir.specialize(op, bindings))

        printer = getattr(loopir, "to_text", None) or getattr(loopir, "format_func", None)
        if printer is not None:
            func = templates.lower_for(op, bindings, config, target, hw)
            text += "\n// loop IR:\n" + printer(func)
        return text
    if emit == "c":
        return generate_c(templates.lower_for(op, bindings, config, "cpu"))
    kernel = templates.build_cuda(op, bindings, config, gpu=hw, compile=False)
    return kernel.source


def check_operator(op: ir.Operator, arrays, bindings, config, target: str, hw) -> str:
    """Build/emulate `op`, compare every output with the reference; a report line per output."""

    reference = ir.evaluate(op, arrays, bindings)
    lines = []
    if target == "cpu":
        kernel = templates.build_cpu(op, bindings, config)
        outputs = kernel(**arrays)
        how = "C (gcc)"
    else:
        outputs = templates.emulate_cuda(op, bindings, config, arrays, gpu=hw)
        how = f"CUDA emulated for {hw.name}"
        lines.append(_compile_report(op, bindings, config, hw))
    failures = []
    for name in op.outputs:
        err = relative_l2(outputs[name], reference[name])
        ok = err <= CHECK_TOLERANCE
        lines.append(f"check {op.name}.{name} [{how}]: relative L2 error {err:.2e} "
                     f"{'ok' if ok else 'FAILED'}")
        if not ok:
            failures.append(name)
    if failures:
        raise DslError(f"check failed for {op.name}: {', '.join(failures)} differ from the "
                       f"reference\n" + "\n".join(lines),
                       hint="this is a code generation bug for this config; report the file "
                            "and --config")
    return "\n".join(line for line in lines if line)


def _compile_report(op: ir.Operator, bindings, config, hw) -> str:

    try:
        kernel = templates.build_cuda(op, bindings, config, gpu=hw, arch=hw.arch)
    except ToolchainError as exc:
        if "not found" in exc.message or "not installed" in exc.message or \
                "are needed" in exc.message:
            return f"compile {op.name} for {hw.arch}: skipped ({exc.message})"
        raise
    usage = ", ".join(f"{k}: {u.registers} registers, {u.shared_bytes} B shared, "
                      f"{u.spill_stores + u.spill_loads} B spilled"
                      for k, u in kernel.usage.items())
    return f"compile {op.name} for {hw.arch}: ok ({usage})"


@click.command("dsl")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--gpu", "gpu_name", default="h100", show_default=True,
              help="GPU preset whose limits apply with --target cuda.")
@click.option("--config", "config_json", metavar="JSON", help="Schedule knobs as JSON.")
@click.option("--emit", type=click.Choice(["c", "cuda", "ir"]), help="What to print.")
@click.option("--check", is_flag=True,
              help="Compile and run (C) or emulate (CUDA) and compare with the reference.")
def command(file: Path, target: str, gpu_name: str, config_json: str | None, emit: str | None,
            check: bool) -> None:
    """Compile a DSL operator FILE.wpk: print generated code or check it."""
    click.echo(dsl_command(str(file), target=target, gpu=gpu_name, config_json=config_json,
                           emit=emit, check=check))
