"""The `wpk` command line (click).

Exit codes follow DESIGN.md: 0 on success; 2 on a user error (bad file, bad
flag, unsupported model, mismatched plan), reported as one `error: ...` line
and a `hint: ...` line on stderr with no traceback unless `--debug`; 1 on an
internal error.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import click
import numpy as np

from wpk.core.errors import InputError, OptionError, WpkError

SEARCHES = ("none", "ga", "rl", "random", "grid")
PARALLEL_STREAMS = 4   # --parallel-measure without N (wpk.search.parallel_measure)
DEVICE_HINT = "pass --cpu, or --gpu NAME with one of the presets listed by 'wpk devices'"


def parse_shape(text: str, flag: str = "--input-shape") -> tuple[int, ...]:
    """Parse `1x3x224x224` (or `1,3,224,224`) into a tuple of positive ints."""
    parts = text.replace(",", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise OptionError(f"{flag}: cannot read shape '{text}'",
                          hint="write dimensions as positive integers joined by 'x', "
                               "e.g. 1x3x224x224")
    return dims


def parse_input_shapes(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """Parse repeated `--input-shape NAME=1x3x224x224` options."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, shape = value.rpartition("=")
        if not sep or not name:
            raise OptionError(f"--input-shape: expected NAME=DIMS, got '{value}'",
                              hint="e.g. --input-shape input=1x3x224x224")
        shapes[name] = parse_shape(shape)
    return shapes


def _target(cpu: bool, gpu: str | None) -> tuple[str, str | None]:
    if cpu and gpu:
        raise OptionError("--cpu and --gpu are mutually exclusive", hint=DEVICE_HINT)
    if gpu:
        return "cuda", gpu
    return "cpu", None


def _stderr(message: str) -> None:
    click.echo(message, err=True)


# ----------------------------------------------------------------------------- commands

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wpk", prog_name="wpk")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """wpk: tune ONNX models for your hardware and run the verified plans."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Plan file to write (default: MODEL with suffix .wpk).")
@click.option("--cpu", is_flag=True, help="Build for the host CPU (the default without a GPU).")
@click.option("--gpu", metavar="NAME|auto", help="Build for a GPU preset (p100, v100, t4, a100, "
              "h100, h200) or the detected one.")
@click.option("--search", type=click.Choice(SEARCHES), default="none", show_default=True,
              help="Schedule search for generated kernels.")
@click.option("--trials", type=click.IntRange(min=1), help="Search trials per workload.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Time budget for the whole build.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path),
              help="Tuning records (JSON lines) to reuse and extend.")
@click.option("--jobs", type=click.IntRange(min=1), help="Parallel compile jobs.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=1x3x224x224",
              help="Fix the shape of an input with symbolic dimensions (repeatable).")
@click.option("--strict", is_flag=True,
              help="Fail if any node would fall back to onnxruntime.")
@click.option("--offline", is_flag=True,
              help="Build for a GPU that is not present (predicted, not measured).")
@click.option("--parallel-measure", "parallel_measure", type=click.IntRange(1, 64),
              is_flag=False, flag_value=PARALLEL_STREAMS, default=None, metavar="[N]",
              help="GPU: time each workload's candidates together on N CUDA streams "
                   f"(default {PARALLEL_STREAMS}), re-measure the fastest alone.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary table.")
def build(model: Path, output: Path | None, cpu: bool, gpu: str | None, search: str,
          trials: int | None, budget: float | None, db: Path | None, jobs: int | None,
          input_shapes: tuple[str, ...], strict: bool, offline: bool,
          parallel_measure: int | None, quiet: bool) -> None:
    """Optimize, tune and plan MODEL; write the plan and its benchmark report."""
    from wpk.pipeline import build as build_plan
    from wpk.plans.render import render_summary

    target, gpu_name = _target(cpu, gpu)
    output = output or model.with_suffix(".wpk")
    options = {"gpu": gpu_name, "search": search, "strict": strict, "offline": offline,
               "input_shapes": parse_input_shapes(input_shapes), "progress": not quiet}
    optional = {"trials": trials, "budget": budget, "db": None if db is None else str(db),
                "jobs": jobs, "parallel_measure": parallel_measure}
    options.update({k: v for k, v in optional.items() if v is not None})
    started = time.perf_counter()
    plan = build_plan(str(model), target=target, output=str(output), **options)
    elapsed = time.perf_counter() - started
    if not quiet:
        from rich.console import Console

        Console(stderr=True).print(render_summary(plan.report))
    _stderr(f"wrote {output} ({elapsed:.1f} s)")


@cli.command()
@click.argument("plan", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Inputs as .npz keyed by input name (default: deterministic random).")
@click.option("--output", "output_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every graph output to this .npz, keyed by output name.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Timed runs.")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="Untimed runs before the timed ones.")
@click.option("--spin-threads", is_flag=True,
              help="CPU plans: onnxruntime region threads spin while a run lasts (faster "
                   "on an otherwise idle machine, slower when other processes compete).")
def run(plan: Path, inputs_path: Path | None, output_path: Path | None, repeat: int,
        warmup: int, spin_threads: bool) -> None:
    """Execute PLAN on inputs and print latency (and write outputs)."""
    import wpk

    session = wpk.load(str(plan), spin_threads=spin_threads)
    feeds = (read_inputs(inputs_path, session) if inputs_path
             else random_inputs(session, seed=0))
    for _ in range(warmup):
        session.run(feeds)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        outputs = session.run(feeds)
        times.append(time.perf_counter() - started)
    if output_path:
        write_outputs(output_path, outputs)
    for name, value in outputs.items():
        click.echo(f"{name}: shape {tuple(value.shape)} {value.dtype}  "
                   f"mean {float(np.mean(value)):.6g}  std {float(np.std(value)):.6g}")
    median = float(np.median(times)) * 1e3
    spread = (f" (min {min(times) * 1e3:.3f}, max {max(times) * 1e3:.3f})"
              if repeat > 1 else "")
    click.echo(f"latency: median {median:.3f} ms over {repeat} run(s){spread}")
    if output_path:
        click.echo(f"wrote {output_path}")


@cli.command()
@click.argument("plan", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json", "html"]), default="table",
              show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to FILE instead of standard output.")
def report(plan: Path, fmt: str, output: Path | None) -> None:
    """Show the per-operator benchmark report stored in PLAN."""
    from wpk.plans.planfile import read_plan
    from wpk.plans.render import render_html, render_json, render_table

    data = read_plan(str(plan)).report
    if fmt == "table":
        from rich.console import Console

        if output:
            with open(output, "w", encoding="utf-8") as handle:
                Console(file=handle, width=160).print(render_table(data))
        else:
            Console().print(render_table(data))
        return
    text = render_json(data) if fmt == "json" else render_html(data)
    _write_text(text, output)


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=1x3x224x224",
              help="Fix the shape of an input with symbolic dimensions (repeatable).")
@click.option("--cpu/--gpu", "cpu_target", default=True, help="Target whose passes to run.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect(model: Path, input_shapes: tuple[str, ...], cpu_target: bool, as_json: bool) -> None:
    """Show MODEL's graph before/after the passes, each rule's hits and the workloads."""
    from wpk.inspection import inspect_model, render_inspection

    info = inspect_model(str(model), parse_input_shapes(input_shapes),
                         target="cpu" if cpu_target else "cuda")
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        from rich.console import Console

        Console().print(render_inspection(info))


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--gpu", "gpu_name", default="h100", show_default=True,
              help="GPU preset whose limits apply with --target cuda.")
@click.option("--config", "config_json", metavar="JSON", help="Schedule knobs as JSON.")
@click.option("--emit", type=click.Choice(["c", "cuda", "ir"]), help="What to print.")
@click.option("--check", is_flag=True,
              help="Compile and run (C) or emulate (CUDA) and compare with the reference.")
def dsl(file: Path, target: str, gpu_name: str, config_json: str | None, emit: str | None,
        check: bool) -> None:
    """Compile a DSL operator FILE.wpk: print generated code or check it."""
    from wpk.dsl.command import dsl_command

    click.echo(dsl_command(str(file), target=target, gpu=gpu_name, config_json=config_json,
                           emit=emit, check=check))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def devices(as_json: bool) -> None:
    """List the GPU presets, the detected GPUs and the host CPU."""
    from wpk.device_listing import device_listing, render_devices

    info = device_listing()
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        from rich.console import Console

        Console().print(render_devices(info))


@cli.command("op")
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
def op(op_type: str, shapes: tuple[str, ...], attrs: tuple[str, ...], cpu: bool,
       gpu: str | None, search: str, trials: int | None, budget: float | None,
       db: Path | None, as_json: bool) -> None:
    """Tune one operator workload and print its per-operator benchmark report."""
    from wpk.op_command import op_command, parse_attr

    target, _ = _target(cpu, gpu)
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
    _print(op_command(op_type, named_shapes, named_attrs, target=target, search=search,
                      trials=trials, as_json=as_json, budget=budget,
                      db=None if db is None else str(db)))


@cli.command()
@click.argument("plan", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--trials", type=click.IntRange(min=1), help="Configs to measure per workload.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Time budget for the whole tuning.")
@click.option("--parallel-measure", "parallel_measure", type=click.IntRange(1, 64),
              is_flag=False, flag_value=PARALLEL_STREAMS, default=None, metavar="[N]",
              help="Time each workload's candidates together on N CUDA streams "
                   f"(default {PARALLEL_STREAMS}), re-measure the fastest alone.")
def tune(plan: Path, trials: int | None, budget: float | None,
         parallel_measure: int | None) -> None:
    """Measure on the present GPU what an --offline build predicted, and rewrite PLAN."""
    from wpk.tune_command import tune_plan

    summary = tune_plan(str(plan), trials=trials, budget=budget, parallel=parallel_measure)
    _stderr(f"tuned {summary['path']} on {summary['gpu']}: {summary['measured']} measured, "
            f"{summary['changed']} choices changed, {summary['left_predicted']} still predicted")
    if summary.get("parallel_measure"):
        from wpk.search.parallel_measure import summary_line

        _stderr(summary_line(summary["parallel_measure"]))


@cli.group()
def records() -> None:
    """Inspect and merge tuning records (JSON lines written by `wpk build --db`)."""


def _print(renderable) -> None:
    if isinstance(renderable, str):
        click.echo(renderable)
    else:
        from rich.console import Console

        Console().print(renderable)


def _record_query(command):
    """The arguments of `wpk records list` and `best`: DB, --workload, --json."""
    command = click.option("--json", "as_json", is_flag=True,
                           help="Records as JSON lines.")(command)
    command = click.option("--workload", metavar="KEY",
                           help="Only this workload (a unique key prefix).")(command)
    return click.argument("db", type=click.Path(dir_okay=False, path_type=Path))(command)


@records.command("list")
@_record_query
def records_list(db: Path, workload: str | None, as_json: bool) -> None:
    """Every measurement in DB."""
    from wpk.search.records_cli import records_list as listing

    _print(listing(db, workload=workload, as_json=as_json))


@records.command("best")
@_record_query
def records_best(db: Path, workload: str | None, as_json: bool) -> None:
    """The fastest verified measurement of each workload and target in DB."""
    from wpk.search.records_cli import records_best as best

    _print(best(db, workload=workload, as_json=as_json))


@records.command("merge")
@click.argument("dbs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Merged record file to write.")
def records_merge(dbs: tuple[Path, ...], output: Path) -> None:
    """Merge record files into one (identical lines dropped, repeats kept)."""
    from wpk.search.records_cli import records_merge as merge

    click.echo(merge(list(dbs), output))


# ----------------------------------------------------------------------------- helpers

def read_inputs(path: Path, session) -> dict[str, np.ndarray]:
    """Read `--inputs`: an .npz keyed by input name (np.savez's arr_N accepted in order)."""
    if not path.exists():
        raise InputError(f"inputs file '{path}' not found",
                         hint="write one with numpy.savez(path, **{input_name: array})")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except Exception as exc:  # numpy raises several types for a bad file
        raise InputError(f"cannot read inputs file '{path}': {exc}",
                         hint="inputs must be an .npz written by numpy.savez") from None
    names = [meta.name for meta in session.get_inputs()]
    positional = [f"arr_{i}" for i in range(len(names))]
    if sorted(arrays) == sorted(positional) and not set(names) & set(arrays):
        arrays = {name: arrays[key] for name, key in zip(names, positional)}
    return arrays


def random_inputs(session, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random inputs for every plan input (U(0,1) floats, small ints)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for meta in session.get_inputs():
        dtype = np.dtype(meta.dtype)
        if dtype.kind == "f":
            feeds[meta.name] = rng.random(meta.shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[meta.name] = rng.random(meta.shape) < 0.5
        else:
            feeds[meta.name] = rng.integers(0, 2, size=meta.shape).astype(dtype)
    return feeds


def write_outputs(path: Path, outputs: dict[str, np.ndarray]) -> None:
    """Write outputs to an .npz atomically (temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as handle:
            np.savez(handle, **outputs)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_text(text: str, output: Path | None) -> None:
    if output is None:
        click.echo(text)
        return
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(output)
    _stderr(f"wrote {output}")


def _report_error(exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    if isinstance(exc, WpkError):
        _stderr(f"error: {exc.message}")
        if exc.hint:
            _stderr(f"hint: {exc.hint}")
        return exc.exit_code
    if isinstance(exc, click.UsageError):
        _stderr(f"error: {exc.format_message()}")
        command = exc.ctx.command_path if exc.ctx else "wpk"
        _stderr(f"hint: see '{command} --help'")
        return 2
    _stderr(f"internal error: {type(exc).__name__}: {exc}")
    _stderr("hint: this is a bug in wpk; rerun with --debug for the traceback and report it")
    return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `wpk` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        cli.main(args=args, prog_name="wpk", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        _stderr("error: interrupted")
        return 130
    except KeyboardInterrupt:
        _stderr("error: interrupted; no partial plan was written")
        return 130
    except BaseException as exc:  # noqa: BLE001 - the CLI boundary reports everything
        if isinstance(exc, SystemExit):
            return int(exc.code or 0)
        return _report_error(exc, debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
