"""A QDQ-quantized model's CUDA plan on a real GPU (skipped without one): the
QuantizeLinear/DequantizeLinear pairs as fake_quant steps in the generated kernels and
after cuDNN's convs, against onnxruntime running the model's nodes as written."""

from __future__ import annotations

import onnxruntime as ort
import pytest

import wpk
from tests import corpus
from wpk.core.numerics import relative_l2

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["mobilenetv3_qdq", "resnext_qdq"])
def test_a_quantized_cuda_plan_computes_the_models_nodes(present_gpu, tmp_path, name):
    pytest.importorskip("torch")
    model = corpus.build_model(name, "ci")
    path = tmp_path / f"{name}.wpk"
    wpk.build(model, target="cuda", gpu="auto", output=str(path), progress=False)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    literal = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    session = wpk.load(path)
    for seed in (1, 2):
        feeds = corpus.random_feeds(name, "ci", seed=seed)
        expected = literal.run(None, feeds)[0]
        actual = session.run(None, feeds)[0]
        # float32 on the GPU, the nodes as written: rounding flips only
        assert relative_l2(actual, expected) < 1e-3, (name, seed)
