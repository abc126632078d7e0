"""The `wpk` command line (click): the group, its global options, and error reporting.

Exit codes follow DESIGN.md: 0 on success; 2 on a user error (bad file, bad
flag, unsupported model, mismatched plan), reported as one `error: ...` line
and a `hint: ...` line on stderr with no traceback unless `--debug`; 1 on an
internal error. The subcommands live in `wpk.commands`, one module each,
imported when used.
"""

from __future__ import annotations

import importlib
import sys
import traceback
import warnings

import click

from wpk.commands import COMMANDS
from wpk.commands.common import stderr
from wpk.core.errors import WpkError


class LazyGroup(click.Group):
    """A click group whose subcommands are `command` objects of modules imported on use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = COMMANDS.get(name)
        return None if module is None else importlib.import_module(module).command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wpk", prog_name="wpk")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """wpk: tune ONNX models for your hardware and run the verified plans."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def report_error(exc: BaseException, debug: bool) -> int:
    """Print `exc` as the CLI contract says; returns the exit code."""
    if debug:
        traceback.print_exc()
    if isinstance(exc, WpkError):
        stderr(f"error: {exc.message}")
        if exc.hint:
            stderr(f"hint: {exc.hint}")
        return exc.exit_code
    if isinstance(exc, click.UsageError):
        stderr(f"error: {exc.format_message()}")
        command = exc.ctx.command_path if exc.ctx else "wpk"
        stderr(f"hint: see '{command} --help'")
        return 2
    stderr(f"internal error: {type(exc).__name__}: {exc}")
    stderr("hint: this is a bug in wpk; rerun with --debug for the traceback and report it")
    return 1


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """`warnings.showwarning` of the CLI: one `warning: ...` line on stderr (a skipped
    record line, say), not Python's two lines of file, line number and source."""
    text = " ".join(str(message).split())
    stderr(f"warning: {text}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `wpk` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = show_warning
        return _run(args, debug)


def _run(args: list[str], debug: bool) -> int:
    try:
        cli.main(args=args, prog_name="wpk", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        stderr("error: interrupted")
        return 130
    except KeyboardInterrupt:
        stderr("error: interrupted; no partial plan was written")
        return 130
    except BaseException as exc:  # noqa: BLE001 - the CLI boundary reports everything
        if isinstance(exc, SystemExit):
            return int(exc.code or 0)
        return report_error(exc, debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
