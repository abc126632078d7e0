"""`wpk run PLAN.wpk`: execute a plan on given or random inputs; print the latency like
`trtexec` (warm-up runs, then N timed runs: min, mean, percentiles, max, throughput) and
the outputs; optionally write them, and a Perfetto / Chrome trace of one run."""

from __future__ import annotations

import json
import math
import statistics
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import click
import numpy as np

from wpk.commands.common import write_text
from wpk.core.errors import InputError
from wpk.core.safe_write import atomic_output, check_output
from wpk.runtime import Session, example_feeds
from wpk.trace import slowest_steps, trace_document

WARMUP = 10
REPEAT = 100
PERCENTILES = (50, 90, 95, 99)


def percentile(sorted_times: Sequence[float], percent: float) -> float:
    """The nearest-rank percentile: the smallest time that `percent`% of runs did not
    exceed (always one of the measured times)."""
    rank = max(1, math.ceil(percent / 100 * len(sorted_times)))
    return sorted_times[rank - 1]


def value_summary(value: np.ndarray) -> str:
    """'mean M  std S' of an output, 'empty' for one without elements (numpy's mean of
    nothing is NaN and a warning)."""
    if value.size == 0:
        return "empty"
    return f"mean {float(np.mean(value)):.6g}  std {float(np.std(value)):.6g}"


def latency_summary(times: Sequence[float]) -> dict:
    """min, mean, median, the PERCENTILES, max (seconds) and throughput (runs/s)."""
    ordered = sorted(times)
    summary = {"runs": len(ordered), "min": ordered[0], "mean": statistics.fmean(ordered),
               "median": statistics.median(ordered), "max": ordered[-1]}
    summary.update({f"p{p}": percentile(ordered, p) for p in PERCENTILES})
    summary["throughput"] = len(ordered) / sum(ordered) if sum(ordered) > 0 else math.inf
    return summary


def latency_lines(summary: dict, warmup: int) -> list[str]:
    """The printed latency: the runs, then the statistics in milliseconds."""
    ms = {k: v * 1e3 for k, v in summary.items() if k not in ("runs", "throughput")}
    return [f"latency over {summary['runs']} run(s) after {warmup} warm-up run(s), in ms:",
            f"  min {ms['min']:.3f}  mean {ms['mean']:.3f}  median {ms['median']:.3f}  "
            f"max {ms['max']:.3f}",
            "  " + "  ".join(f"p{p} {ms[f'p{p}']:.3f}" for p in PERCENTILES),
            f"throughput {summary['throughput']:.1f} runs/s (one run at a time)"]


def timed_runs(session: Session, feeds: dict, warmup: int, repeat: int):
    """(the last run's outputs, the timed runs' seconds) after `warmup` untimed runs."""
    for _ in range(warmup):
        session.run(feeds)
    times, outputs = [], {}
    for _ in range(repeat):
        started = time.perf_counter()
        outputs = session.run(feeds)
        times.append(time.perf_counter() - started)
    return outputs, times


@click.command("run")
@click.argument("plan", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--inputs", "inputs_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Inputs as .npz keyed by input name (default: deterministic random).")
@click.option("--output", "output_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every graph output to this .npz, keyed by output name.")
@click.option("--repeat", type=click.IntRange(min=1), default=REPEAT, show_default=True,
              help="Timed runs, summarized as min, mean, median, p50/p90/p95/p99 and max.")
@click.option("--warmup", type=click.IntRange(min=0), default=WARMUP, show_default=True,
              help="Untimed runs before the timed ones.")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also time every step of one more run and write it as a Perfetto / Chrome "
                   "trace (JSON; open it in ui.perfetto.dev or chrome://tracing).")
@click.option("--spin-threads", is_flag=True,
              help="CPU plans: onnxruntime region threads spin while a run lasts (faster "
                   "on an otherwise idle machine, slower when other processes compete).")
def command(plan: Path, inputs_path: Path | None, output_path: Path | None, repeat: int,
            warmup: int, profile_path: Path | None, spin_threads: bool) -> None:
    """Execute PLAN on inputs: WARMUP untimed runs, then REPEAT timed ones; print their
    latency statistics and the outputs."""
    for path, flag in ((output_path, "--output"), (profile_path, "--profile")):
        if path is not None:  # before the runs, not after them
            check_output(path, flag, inputs=[plan] + ([inputs_path] if inputs_path else []))
    session = Session.load(str(plan), spin_threads=spin_threads)
    feeds = (read_inputs(inputs_path, session) if inputs_path
             else example_feeds(session, seed=0))
    outputs, times = timed_runs(session, feeds, warmup, repeat)
    if output_path:
        write_outputs(output_path, outputs)
    for name, value in outputs.items():
        click.echo(f"{name}: shape {tuple(value.shape)} {value.dtype}  {value_summary(value)}")
    for line in latency_lines(latency_summary(times), warmup):
        click.echo(line)
    if output_path:
        click.echo(f"wrote {output_path}")
    if profile_path:
        timings = session.timeline(feeds)
        tail = getattr(session, "last_tail_span", None)   # a value-dependent tail's call
        document = trace_document(session.plan, timings, name=plan.name, tail=tail)
        total = (tail[1] if tail else timings[-1].end_s) - timings[0].start_s
        click.echo(f"slowest steps of the profiled run ({total * 1e3:.3f} ms):")
        for what, seconds in slowest_steps(timings):
            click.echo(f"  {seconds * 1e3:8.3f} ms {seconds / total:6.1%}  {what}")
        if tail is not None:
            click.echo(f"then the onnxruntime tail: {(tail[1] - tail[0]) * 1e3:.3f} ms")
        write_text(json.dumps(document, indent=1, allow_nan=False), profile_path, "--profile")


def _load_npz(path: Path) -> dict[str, np.ndarray] | np.ndarray:
    """The arrays of an .npz (or the one array of an .npy); InputError saying why not."""
    hint = "write the inputs with numpy.savez(path, **{input_name: array})"
    try:
        loaded = np.load(path, allow_pickle=False)
    except IsADirectoryError:
        raise InputError(f"inputs file '{path}' is a folder", hint=hint) from None
    except OSError as exc:
        raise InputError(f"cannot read inputs file '{path}': {exc.strerror or 'not a numpy file'}",
                         hint=hint) from None
    except (ValueError, EOFError, zipfile.BadZipFile, NotImplementedError):  # pickles, other bytes
        raise InputError(f"inputs file '{path}' is not a numpy .npz or .npy file "
                         "(or holds pickled Python objects, which wpk does not load)",
                         hint=hint) from None
    if isinstance(loaded, np.ndarray):
        return loaded
    try:
        with loaded:
            return {key: loaded[key] for key in loaded.files}
    except Exception:  # noqa: BLE001 - numpy and zipfile raise many types for a damaged member
        raise InputError(f"inputs file '{path}' is damaged or holds pickled Python objects",
                         hint=hint) from None


def read_inputs(path: Path, session) -> dict[str, np.ndarray]:
    """Read `--inputs`: an .npz keyed by input name (np.savez's arr_N accepted in order), or
    an .npy for a plan of one input."""
    if not path.exists():
        raise InputError(f"inputs file '{path}' not found",
                         hint="write one with numpy.savez(path, **{input_name: array})")
    names = [meta.name for meta in session.get_inputs()]
    arrays = _load_npz(path)
    if isinstance(arrays, np.ndarray):
        if len(names) != 1:
            raise InputError(f"inputs file '{path}' holds one array (.npy) but the plan has "
                             f"{len(names)} inputs: {', '.join(names)}",
                             hint="write them to an .npz with numpy.savez(path, "
                                  "**{input_name: array})")
        return {names[0]: arrays}
    positional = [f"arr_{i}" for i in range(len(names))]
    if sorted(arrays) == sorted(positional) and not set(names) & set(arrays):
        arrays = {name: arrays[key] for name, key in zip(names, positional)}
    return arrays


def write_outputs(path: Path, outputs: dict[str, np.ndarray]) -> None:
    """Write outputs to an .npz keyed by output name, atomically (`wpk.core.safe_write`).

    The archive is written member by member, as numpy.savez does, rather than through
    `np.savez(**outputs)`: an output may be named like one of savez's own parameters
    (`file`, `allow_pickle`)."""
    with (atomic_output(path, "--output") as handle,
          zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive):
        for name, value in outputs.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
