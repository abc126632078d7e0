"""`wpk run PLAN.wpk`: execute a plan on given or random inputs, print latency and outputs."""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np

from wpk.core.errors import InputError
from wpk.runtime import Session, example_feeds


@click.command("run")
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
def command(plan: Path, inputs_path: Path | None, output_path: Path | None, repeat: int,
            warmup: int, spin_threads: bool) -> None:
    """Execute PLAN on inputs and print latency (and write outputs)."""
    session = Session.load(str(plan), spin_threads=spin_threads)
    feeds = (read_inputs(inputs_path, session) if inputs_path
             else example_feeds(session, seed=0))
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
