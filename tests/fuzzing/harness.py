"""Run `wpk.cli.main` in a child process with a timeout and check the CLI contract.

The contract (DESIGN.md, issue 13.7), whatever the input: exit code 0 or 2 (never
1, never a signal), no traceback, an `error:` line when it fails, no hang (the
child is killed after `timeout` seconds), and no partial file: on failure the
output folder holds only what was there before (no plan, no temp file), on
success the output exists and no temp file is left.

Children are forked from a forkserver that imported wpk once, so one run costs
tens of milliseconds, not a Python start-up, and no thread pool of the test
process is inherited.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

TIMEOUT_S = 120.0
CHILD_MEMORY = 4 << 30  # address space of a child: a runaway allocation fails fast
MAX_MEMORY = "1G"  # --max-memory given to build and inspect
PRELOAD = ["wpk.cli", "wpk.commands.build", "wpk.commands.inspect", "wpk.commands.run",
           "wpk.commands.report", "wpk.pipeline", "wpk.runtime", "onnxruntime"]

_context = None


def _ctx():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(args: list[str], out: str, err: str, cwd: str) -> None:
    """In the child: redirect stdout/stderr to files, run the CLI, exit with its code."""
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(handle, fd)
        os.close(handle)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
    import sys

    from wpk.cli import main

    code = 1
    try:
        code = main(args)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@dataclass
class Outcome:
    """What one run of the CLI did."""

    args: list[str]
    code: int | None  # None: killed after the timeout
    stdout: str
    stderr: str
    violations: list[str] = field(default_factory=list)


def run_cli(args: list[str], cwd: str | Path, timeout: float = TIMEOUT_S) -> Outcome:
    """Run `wpk ARGS` in a child process in `cwd`; kill it after `timeout` seconds."""
    with tempfile.TemporaryDirectory(prefix="wpk-fuzz-io-") as io_dir:
        out, err = os.path.join(io_dir, "out"), os.path.join(io_dir, "err")
        process = _ctx().Process(target=_child, args=(list(args), out, err, str(cwd)))
        process.start()
        process.join(timeout)
        code = process.exitcode
        if process.is_alive():
            process.kill()
            process.join()
            code = None
        def read(p):
            return (Path(p).read_text(errors="replace") if os.path.exists(p) else "")
        return Outcome(list(args), code, read(out), read(err))


def check_contract(outcome: Outcome, folder: Path, before: set[str], output: str | None
                   ) -> list[str]:
    """The contract violations of `outcome`; `folder` is the output folder, `before` the
    names it held before the run, `output` the file the command should write (or None)."""
    problems = []
    lines = outcome.stderr.splitlines()
    if outcome.code is None:
        problems.append("hang (killed after the timeout)")
    elif outcome.code not in (0, 2):
        problems.append(f"exit code {outcome.code}")
    if "Traceback (most recent call last)" in outcome.stderr:
        problems.append("traceback on stderr")
    if outcome.code == 2 and not any(line.startswith("error: ") for line in lines):
        problems.append("exit 2 without an 'error:' line")
    after = {p.name for p in folder.iterdir()}
    temps = sorted(n for n in after - before if n.endswith(".tmp") or n.startswith(".")
                   or (output is not None and n != output))
    if temps:
        problems.append(f"files left behind: {', '.join(temps)}")
    if output is not None:
        if outcome.code == 0 and output not in after:
            problems.append(f"exit 0 but no {output}")
        if outcome.code != 0 and output in after - before:
            problems.append(f"partial output {output} left after exit {outcome.code}")
    if problems:
        tail = " | ".join(lines[-3:])
        problems = [f"{p} [wpk {' '.join(outcome.args)}; stderr: {tail}]" for p in problems]
    outcome.violations = problems
    return problems


def contract_run(args: list[str], folder: Path, output: str | None = None,
                 timeout: float = TIMEOUT_S) -> Outcome:
    """Run `wpk ARGS` in `folder` and check the contract (`outcome.violations`)."""
    before = {p.name for p in folder.iterdir()}
    outcome = run_cli(args, folder, timeout)
    check_contract(outcome, folder, before, output)
    return outcome
