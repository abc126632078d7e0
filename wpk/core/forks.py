"""Running kernels in a process forked from one that already ran them.

    result = fork_safe_call(function, *args)   # function(*args); in a fork's child on
                                               # the runner thread (`on_runner_thread`)

libgomp keeps the pool of OpenMP threads that a thread's parallel regions use with that
thread, and a fork copies the thread but not its pool's threads: the forking thread's
next parallel region waits for workers that do not exist, forever (a process that ran a
plan, forked by gunicorn's `--preload`, multiprocessing or a job queue, hung on its first
run). A thread created after the fork starts a pool of its own, so in a forked child the
runtime calls its kernels on such a thread (`on_runner_thread`, one for the process,
started on first use); the cost is a hand-over between two threads per run. Loading a
plan (a `Session`'s kernels prepare themselves: micro.gemm packs its weight in OpenMP)
and `wpk.build` (it measures the same kernels) go there too in a forked child.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_forked = False
_runner: ThreadPoolExecutor | None = None


def forked() -> bool:
    """Whether this process was forked from another (`os.fork`, multiprocessing's fork)."""
    return _forked


def fork_safe_call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`function(*args, **kwargs)` where its OpenMP kernels can run: here, or in a forked
    child on the runner thread."""
    if not _forked:
        return function(*args, **kwargs)
    return on_runner_thread(function, *args, **kwargs)


def on_runner_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`function(*args, **kwargs)` on this process's runner thread (started after the
    fork), its result or its exception; called there directly when already on it (a build
    that runs its plan: waiting for the one runner from the runner would never end)."""
    global _runner
    if getattr(_on_runner, "active", False):
        return function(*args, **kwargs)
    if _runner is None:
        _runner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wpk-runner",
                                     initializer=_mark_runner)
    return _runner.submit(function, *args, **kwargs).result()


_on_runner = threading.local()


def _mark_runner() -> None:
    _on_runner.active = True


def _after_fork_in_child() -> None:
    global _forked, _runner
    _forked = True
    _runner = None   # the parent's runner thread, if any, was not copied


os.register_at_fork(after_in_child=_after_fork_in_child)
