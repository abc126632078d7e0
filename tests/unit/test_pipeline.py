"""Build options: every flag validated with a clear OptionError; cuda without a GPU."""

from __future__ import annotations

import pytest

from wpk.core.errors import DeviceError, OptionError
from wpk.pipeline import BuildOptions, build


def test_defaults_and_json():
    options = BuildOptions(input_shapes={"x": [1, 3, 8, 8]})
    assert options.target == "cpu" and options.search == "none" and options.progress
    assert options.input_shapes == {"x": (1, 3, 8, 8)}
    assert options.to_json()["input_shapes"] == {"x": [1, 3, 8, 8]}
    with pytest.raises(dataclasses_frozen_error()):
        options.strict = True


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize(("options", "message"), [
    ({"target": "tpu"}, "unknown target 'tpu'"),
    ({"search": "magic"}, "unknown search 'magic'"),
    ({"trials": 0}, "--trials must be a positive integer"),
    ({"jobs": 2.5}, "--jobs must be a positive integer"),
    ({"budget": -1.0}, "--budget must be a positive number"),
    ({"gpu": "t4"}, "--gpu t4 needs target 'cuda'"),
    ({"input_shapes": {"x": "abc"}}, "input shape of 'x' must be a sequence of integers"),
])
def test_bad_options_raise_option_errors(options, message):
    with pytest.raises(OptionError, match=message):
        BuildOptions(**options)


def test_unknown_keyword_is_named():
    with pytest.raises(OptionError, match="unknown build option\\(s\\): colour") as info:
        BuildOptions.from_kwargs(colour="red")
    assert "strict" in info.value.hint


def test_cuda_target_is_a_device_error_here():
    with pytest.raises(DeviceError, match="cuda") as info:
        build("does-not-matter.onnx", target="cuda")
    assert "--cpu" in info.value.hint
