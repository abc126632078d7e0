"""Shared fixtures: seeded generators and a temporary cache directory per test; the
`--isa` option (see tests/isa.py) and `--mlas-block`, which scripts/isa_check.sh passes
to the pytest-xdist workers it starts under qemu."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from wpk.dsl.build import openmp_defaults

# libgomp reads its wait policy once per process, and a session picks it for its plan when
# it loads a process's first kernels (`wpk.runtime.openmp_spin_count`): pinned here to the
# default, so that the first plan a worker happens to load does not decide it for the
# worker's other tests (tests/unit/test_openmp_policy.py checks the choice itself).
openmp_defaults()


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded random generator, so every test is reproducible."""
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def cache_dir(request, tmp_path_factory, monkeypatch, run_folder) -> str:
    """Point wpk's compile/tuning caches at a temporary folder (never the working tree).
    Its precompiled headers (`pch/`, no kernel in them) are the run's, shared by every test
    (`share_precompiled_headers`), and so are its compiled kernels (`compile/`,
    `share_compiled_kernels`) unless the test is marked `private_compile_cache`."""
    path = tmp_path_factory.mktemp("wpk-cache")
    share_precompiled_headers(path, run_folder)
    if request.node.get_closest_marker("private_compile_cache") is None:
        share_compiled_kernels(path, run_folder)
    monkeypatch.setenv("WPK_CACHE_DIR", str(path))
    return str(path)


def share_precompiled_headers(cache, run_folder) -> None:
    """Link the compile cache `cache`'s `pch/` to one folder of the test run: gcc builds the
    precompiled <immintrin.h> of a flag set (0.7 s, `wpk.dsl.toolchain.immintrin_flags`)
    once per run instead of once per test. Tests of the header itself use a cache of
    their own."""
    _link_folder(cache / "pch", run_folder / "shared-pch")


def share_compiled_kernels(cache, run_folder) -> None:
    """Link the compile cache `cache`'s `compile/` to the run's (the folder the whole-model
    tests' `shared_compile_cache` compiles into): a kernel's cache key is its source, flags
    (the ISA level) and compiler, and writes are atomic, so a test loads what any earlier
    test of the run compiled instead of compiling it again (gcc is most of the suite's
    time). Tests of the compile cache itself (what it compiles, what it finds cached) are
    marked `private_compile_cache` and start from an empty one."""
    _link_folder(cache / "compile", run_folder / "shared-wpk-cache" / "compile")


def _link_folder(link, shared) -> None:
    """`link` as a symlink to the folder `shared` (made if missing), once."""
    shared.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        with contextlib.suppress(FileExistsError):   # another worker linked it first
            link.symlink_to(shared, target_is_directory=True)


def pytest_addoption(parser):
    parser.addoption("--isa", default="host", choices=("host", "avx2"),
                     help="the CPU ISA wpk sees in this process: the host's, or AVX2 only "
                          "(checks the AVX2 code paths on an AVX-512 machine)")
    parser.addoption("--onnx-fallback-runs", action="store_true",
                     help="ONNX backend suite: also run the cases wpk makes no claim on "
                          "through its fallbacks and count them (skips whatever the outcome)")
    parser.addoption("--mlas-block", type=int, default=None,
                     help="stop unless onnxruntime's MLAS uses this NCHWc block in the process "
                          "that runs the tests (scripts/isa_check.sh: 8, so a worker that is "
                          "not under the emulated AVX2 CPU cannot pass for one)")


def pytest_configure(config):
    from tests.isa import force_isa

    force_isa(config.getoption("--isa"))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Tests that compile the same kernels run in turn on one pytest-xdist worker
    (tests/kernel_groups.py). `--mlas-block`: checked where the tests are collected and run
    (each pytest-xdist worker, or the one process), not in an xdist controller that only
    hands them out."""
    from tests.kernel_groups import group_tests_that_share_kernels

    group_tests_that_share_kernels(items)
    expected = config.getoption("--mlas-block")
    if expected is None:
        return
    from wpk.kernels.nchwc_format import mlas_block_size

    found = mlas_block_size()
    if found != expected:
        raise pytest.UsageError(f"onnxruntime's MLAS uses NCHWc block {found} in this process, "
                                f"not {expected} (--mlas-block): is it running under qemu?")


@pytest.fixture
def records_never_contended(monkeypatch):
    """A build's last pass keeps its records however slow the machine reads next to the
    search (wpk.search.recorded marks records measured `CONTENDED` times slower than the
    search measured them, and a rebuild measures those again): for tests that count what a
    rebuild measures on a machine busy with the rest of the suite. The tests of the check
    itself do not use it."""
    from wpk.search import recorded

    monkeypatch.setattr(recorded, "CONTENDED", float("inf"))


@pytest.fixture(scope="session")
def corpus_model_path(run_folder):
    """`corpus_model_path(name) -> Path` of a corpus model (tests/corpus) at its CI size,
    exported on first use into a folder the pytest-xdist workers of this run share (a lock
    file makes a second worker wait for the first one's export instead of repeating it;
    the exports are deterministic, `test_corpus_builds_are_deterministic`)."""
    import fcntl

    import onnx

    from tests.corpus import build_model

    folder = run_folder / "corpus"
    folder.mkdir(exist_ok=True)

    def path_of(name: str):
        path = folder / f"{name}.onnx"
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                partial = path.with_suffix(".partial")
                onnx.save(build_model(name, "ci"), str(partial))
                partial.rename(path)
        return path

    return path_of


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory):
    """A temporary folder of this test run, the same for all its pytest-xdist workers."""
    import os

    folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's folder sits in the run's folder
        folder = folder.parent
    return folder


@pytest.fixture(scope="session")
def built_plan(run_folder):
    """`built_plan(name, **options) -> Plan` of an evaluation model (tests/models.py), built
    once per test run and shared by the pytest-xdist workers (tests/built_plans.py)."""
    from tests.built_plans import PlanCache

    return PlanCache(run_folder / "built-plans").get


@pytest.fixture
def shared_compile_cache(cache_dir, run_folder, monkeypatch) -> str:
    """Instead of `cache_dir`'s empty folder, one compile cache for every test of the run
    that asks for it (the whole-model builds: the same convolution shapes in the accuracy
    test, the ONNX backend's light models, the CLI build of ResNet-50). A kernel's cache key
    is its source, flags (the ISA level) and compiler, never the weights, so a later build
    loads what an earlier one compiled; it still verifies every candidate. Writes are atomic,
    so concurrent workers are safe. Not for tests of the cache itself."""
    path = run_folder / "shared-wpk-cache"
    path.mkdir(exist_ok=True)
    share_precompiled_headers(path, run_folder)
    monkeypatch.setenv("WPK_CACHE_DIR", str(path))
    return str(path)


@pytest.fixture
def char_device(tmp_path) -> str:
    """A character device to aim outputs at (tests that wpk refuses to replace one): as root,
    a private node of /dev/full's kind in `tmp_path`, so that a regression replaces that
    node and not the system's; otherwise /dev/full itself, whose folder only root can write."""
    import os
    import stat

    if os.geteuid() != 0:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full on this system")
        return "/dev/full"
    path = tmp_path / "full"
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except OSError as exc:
        pytest.skip(f"cannot make a device node here ({exc.strerror})")
    return str(path)
