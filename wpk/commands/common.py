"""What several subcommands share: parsing shapes and the target flags, printing, writing.

Exit codes follow DESIGN.md: a user error raises a `WpkError` (reported by
`wpk.cli.main` as one `error:` line and a `hint:` line, exit code 2).
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from wpk.core import safe_write
from wpk.core.errors import OptionError
from wpk.core.limits import parse_memory

SEARCHES = ("none", "ga", "rl", "random", "grid")
PARALLEL_STREAMS = 4   # --parallel-measure without N (wpk.search.parallel_measure)
MAX_DIM = 2**63 - 1  # ONNX dims are int64
DEVICE_HINT = "pass --cpu, or --gpu NAME with one of the presets listed by 'wpk devices'"


def parse_shape(text: str, flag: str = "--input-shape") -> tuple[int, ...]:
    """Parse `1x3x224x224` (or `1,3,224,224`) into a tuple of positive ints."""
    parts = text.replace(",", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 or d > MAX_DIM for d in dims):
        raise OptionError(f"{flag}: cannot read shape '{text}'",
                          hint=f"write dimensions as positive integers (at most {MAX_DIM}) "
                               "joined by 'x', e.g. 1x3x224x224")
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


def target_of(cpu: bool, gpu: str | None) -> tuple[str, str | None]:
    """('cpu', None) or ('cuda', preset name) from the --cpu / --gpu flags."""
    if cpu and gpu:
        raise OptionError("--cpu and --gpu are mutually exclusive", hint=DEVICE_HINT)
    if gpu:
        return "cuda", gpu
    return "cpu", None


def parallel_measure_option(help_text: str):
    """The `--parallel-measure [N]` option of `wpk build` and `wpk tune`."""
    return click.option("--parallel-measure", "parallel_measure", type=click.IntRange(1, 64),
                        is_flag=False, flag_value=PARALLEL_STREAMS, default=None,
                        metavar="[N]", help=f"{help_text} (default {PARALLEL_STREAMS}), "
                                            "re-measure the fastest alone.")


def cluster_option(what: str):
    """The `--cluster ADDRESS` option of `wpk build`, `wpk tune` and `wpk op`."""
    return click.option("--cluster", metavar="ADDRESS",
                        help=f"{what} on the nodes of a Ray cluster: ray://HOST:PORT, auto, "
                             "HOST:PORT (the head's GCS address) or local:N (a test cluster "
                             "of N nodes on this machine); needs pip install 'wpk[cluster]'.")


def stderr(message: str) -> None:
    """One line on standard error."""
    click.echo(message, err=True)


def echo(renderable) -> None:
    """Print text, or a rich renderable through a rich Console."""
    if isinstance(renderable, str):
        click.echo(renderable)
    else:
        Console().print(renderable)


def write_text(text: str, output: Path | None, flag: str = "-o") -> None:
    """`text` to standard output, or atomically to `output` (`wpk.core.safe_write`)."""
    if output is None:
        click.echo(text)
        return
    safe_write.write_text(output, text, flag)
    stderr(f"wrote {output}")


def max_memory_option():
    """The `--max-memory SIZE` option of `wpk build` and `wpk inspect` (`wpk.core.limits`)."""
    return click.option("--max-memory", "max_memory", metavar="SIZE",
                        callback=lambda ctx, param, value: (None if value is None
                                                            else parse_memory(value)),
                        help="Refuse a model whose tensors (activations and weights) would "
                             "take more than SIZE, e.g. 4G or 512M (default: half the RAM).")
