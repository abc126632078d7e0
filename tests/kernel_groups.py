"""Tests that compile the same kernels run one after another on one pytest-xdist worker.

The run's compile cache is shared (`tests/conftest.py`, `share_compiled_kernels`): a test
loads what an earlier test compiled. Two tests that compile the same kernels at the same
time on two workers both miss the cache and both compile them, and `--dist loadgroup`
hands consecutive tests (the parametrizations of one test function) to different
workers. So the tests named here carry an `xdist_group` (`kernel_group`) and run on one
worker in turn, the first compiling and the others loading:

- the corpus models of one architecture (`tests/integration/test_corpus.py`, parametrized
  by `name`, its architecture the part before the last `_`): `yolo_torchscript` and
  `yolo_dynamo` are one network exported two ways. Built on their own, one after the
  other, on the 2-core VM: yolo_torchscript 9.1 s with an empty cache, then yolo_dynamo
  0.7 s (not one kernel left to compile); in the test run they were handed out together
  and took 26 s and 27 s;
- the parametrizations of a test that differ only in `threads`: the same kernels, run on
  another OpenMP team size.

A group is only where tests run; every test still runs and checks what it did.
"""

from __future__ import annotations

import re

import pytest

CORPUS_TESTS = "tests/integration/test_corpus.py"


def kernel_group(item: pytest.Item) -> str | None:
    """The name of the group of tests that compile the same kernels as `item`, or None."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if item.nodeid.startswith(CORPUS_TESTS + "::") and isinstance(params.get("name"), str):
        return "corpus-" + params["name"].rsplit("_", 1)[0]   # the architecture
    if "threads" in params:
        others = "-".join(str(value) for key, value in sorted(params.items())
                          if key != "threads")
        return _safe(f"{item.originalname}-{others}")
    return None


def _safe(name: str) -> str:
    """A group name pytest-xdist reads back from the test's id (`id@group`): no `@`, `[`
    or `]`."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def group_tests_that_share_kernels(items: list[pytest.Item]) -> None:
    """Mark each test of a kernel group with its `xdist_group` (a test that has one keeps
    it)."""
    for item in items:
        group = kernel_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
