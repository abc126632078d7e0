"""The xdist groups of tests that compile the same kernels (tests/kernel_groups.py)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.kernel_groups import CORPUS_TESTS, kernel_group


def item(nodeid: str, originalname: str, **params) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, originalname=originalname,
                           callspec=SimpleNamespace(params=params))


def test_a_corpus_models_exports_share_the_group_of_their_architecture():
    test = f"{CORPUS_TESTS}::test_corpus_plan_matches_onnxruntime"
    groups = {kernel_group(item(f"{test}[{name}]", "test_corpus_plan_matches_onnxruntime",
                                name=name))
              for name in ("yolo_torchscript", "yolo_dynamo", "yolo_tf")}
    assert groups == {"corpus-yolo"}
    other = kernel_group(item(f"{test}[yolopost_dynamo]", "test_corpus_plan_matches_onnxruntime",
                              name="yolopost_dynamo"))
    assert other == "corpus-yolopost"


def test_only_the_thread_count_is_left_out_of_a_group():
    def group(**params):
        return kernel_group(item("tests/unit/test_x.py::test_y[...]", "test_y", **params))

    assert group(case="a b[1]", isa="avx2", threads=1) == group(case="a b[1]", isa="avx2",
                                                                threads=3)
    assert group(case="a b[1]", isa="avx2", threads=1) != group(case="a b[1]", isa="avx512",
                                                                threads=1)
    # pytest-xdist reads the group back from the test's id `id@group`
    assert not set("@[] ") & set(group(case="a b[1]", isa="avx2", threads=1))


def test_other_tests_have_no_group():
    assert kernel_group(item("tests/unit/test_x.py::test_y[3]", "test_y", size=3)) is None
    assert kernel_group(SimpleNamespace(nodeid="tests/unit/test_x.py::test_z",
                                        originalname="test_z")) is None
    # a `name` outside the corpus tests is not a corpus model
    assert kernel_group(item("tests/unit/test_x.py::test_y[yolo_tf]", "test_y",
                             name="yolo_tf")) is None
