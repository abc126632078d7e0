"""GPU tests: run only where an NVIDIA GPU and cupy are present, else skipped with the reason.

Every test in this folder is marked `gpu`. The folder is skipped as a whole (not failed)
when `wpk.core.devices.detect_gpus()` finds no GPU or cupy cannot use one, so `pytest tests/gpu`
is safe anywhere; `scripts/gpu_check.sh` runs it on the GPU machine.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def gpu_skip_reason() -> str | None:
    """Why the GPU tests cannot run here (None when they can)."""
    from wpk.core.devices import detect_gpus
    from wpk.kernels.cuda.cupy_support import missing_reason

    if not detect_gpus():
        return "no NVIDIA GPU detected (nvidia-smi / cupy): GPU tests need one"
    why = missing_reason()
    return None if why is None else f"no NVIDIA GPU usable through cupy: {why}"


def pytest_collection_modifyitems(config, items):
    reason = gpu_skip_reason()
    for item in items:
        if "tests/gpu/" not in str(item.fspath).replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def cupy():
    """The cupy module (the tests are skipped before this runs without a GPU)."""
    import cupy as module

    return module


@pytest.fixture(scope="session")
def present_gpu():
    """The preset describing the GPU present."""
    from wpk.core.devices import GPU_PRESETS, detect_gpus

    for gpu in detect_gpus():
        if gpu.preset is not None:
            return GPU_PRESETS[gpu.preset]
    pytest.skip("the GPU present matches no wpk preset")
