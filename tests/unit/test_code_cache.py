"""wpk.core.code_cache: generated Python kept compiled between processes, never a damaged
file run."""

import os

import pytest

from wpk.core.code_cache import cached_code

SOURCE = "def validate(x):\n    return x * 2\n"


def _run(code):
    namespace = {}
    exec(code, namespace)
    return namespace["validate"](21)


def _counting_source(calls):
    def make():
        calls.append(1)
        return SOURCE
    return make


def test_the_second_process_reads_the_compiled_code_instead_of_making_it(tmp_path):
    calls = []
    first = cached_code(tmp_path, "v", "k1", _counting_source(calls))
    second = cached_code(tmp_path, "v", "k1", _counting_source(calls))
    assert calls == [1]                       # made once, read back the second time
    assert _run(first) == _run(second) == 42
    assert len(list(tmp_path.glob("v-k1.*.marshal"))) == 1


def test_another_key_is_another_file(tmp_path):
    calls = []
    cached_code(tmp_path, "v", "k1", _counting_source(calls))
    cached_code(tmp_path, "v", "k2", _counting_source(calls))
    assert calls == [1, 1]


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_damaged_file_is_made_again_and_rewritten(tmp_path, damage):
    cached_code(tmp_path, "v", "k", lambda: SOURCE)
    path = next(tmp_path.glob("v-k.*.marshal"))
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[:len(data) // 2]
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    calls = []
    assert _run(cached_code(tmp_path, "v", "k", _counting_source(calls))) == 42
    assert calls == [1]
    calls.clear()
    cached_code(tmp_path, "v", "k", _counting_source(calls))
    assert calls == []                        # the rewritten file is whole again


def test_a_folder_that_cannot_be_made_costs_only_the_time(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    calls = []
    for _ in range(2):
        assert _run(cached_code(blocker / "sub", "v", "k", _counting_source(calls))) == 42
    assert calls == [1, 1]
    assert os.listdir(tmp_path) == ["file"]
