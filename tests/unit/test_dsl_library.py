"""Every DSL library operator, evaluated by the compute-IR interpreter, against
independent numpy or onnxruntime computations on seeded random inputs."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from wpk.core.errors import DslError
from wpk.dsl.compute import evaluate
from wpk.kernels.dsl_library import list_operators, load_operator, operator_file


def run_onnx(op_type: str, inputs: list[np.ndarray], **attrs) -> np.ndarray:
    """Run a single ONNX node with onnxruntime (float32)."""
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, x.shape) for n, x in
         zip(names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {n: x.astype(np.float32) for n, x in zip(names, inputs)})[0]


def f32(rng, *shape) -> np.ndarray:
    """float32-representable random values (so float64 and ORT see the same inputs)."""
    return rng.standard_normal(shape).astype(np.float32).astype(np.float64)


def close(actual, expected, tol=1e-4):
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


CONV_CASES = [
    # N, C, H, W, K, R, S, strides, pads (t, l, b, r), dilations, groups
    (2, 4, 7, 6, 6, 3, 3, (2, 1), (1, 0, 2, 1), (1, 2), 2),
    (1, 3, 5, 5, 3, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),     # depthwise
    (1, 5, 4, 3, 2, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),     # 1x1
    (1, 2, 1, 1, 4, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),     # 1x1 image, all padding
    (1, 1, 9, 9, 1, 2, 2, (3, 3), (0, 0, 0, 0), (2, 2), 1),     # dilated and strided
]


def conv_scalars(strides, pads, dilations, groups) -> dict:
    return {"stride_h": strides[0], "stride_w": strides[1], "pad_t": pads[0],
            "pad_l": pads[1], "pad_b": pads[2], "pad_r": pads[3], "dil_h": dilations[0],
            "dil_w": dilations[1], "groups": groups}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_family_matches_onnxruntime(rng, case):
    n, c, h, w, k, r, s, strides, pads, dil, groups = case
    x, wt, b = f32(rng, n, c, h, w), f32(rng, k, c // groups, r, s), f32(rng, k)
    expected = run_onnx("Conv", [x, wt], strides=list(strides), dilations=list(dil),
                        pads=[pads[0], pads[1], pads[2], pads[3]], group=groups)
    scalars = conv_scalars(strides, pads, dil, groups)
    y = evaluate(load_operator("conv2d"), {"X": x, "Wt": wt}, scalars)["Y"]
    assert y.shape == expected.shape
    close(y, expected)
    y = evaluate(load_operator("conv2d_bias"), {"X": x, "Wt": wt, "B": b}, scalars)["Y"]
    close(y, expected + b[None, :, None, None])
    res = f32(rng, *expected.shape)
    y = evaluate(load_operator("conv2d_bias_relu_add"),
                 {"X": x, "Wt": wt, "B": b, "Res": res}, scalars)["Y"]
    close(y, np.maximum(expected + b[None, :, None, None] + res, 0))


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("n,c,h,w,k,pads", [(1, 3, 5, 7, 4, (1, 0, 2, 1)),
                                            (2, 2, 1, 1, 3, (1, 1, 1, 1)),
                                            (1, 5, 6, 9, 2, (0, 0, 0, 0))])
def test_winograd_operators_match_onnxruntime_conv(rng, m, n, c, h, w, k, pads):
    from wpk.kernels.cuda.winograd import winograd_constants

    x, wt, b = f32(rng, n, c, h, w), f32(rng, k, c, 3, 3), f32(rng, k)
    expected = run_onnx("Conv", [x, wt], pads=list(pads))
    arrays = {"X": x} | {name: v.astype(np.float64)
                         for name, v in winograd_constants(wt, m).items()}
    scalars = conv_scalars((1, 1), pads, (1, 1), 1)
    scalars = {p: scalars[p] for p in ("pad_t", "pad_l", "pad_b", "pad_r")}
    y = evaluate(load_operator("winograd_conv2d"), arrays, scalars)["Y"]
    assert y.shape == expected.shape
    close(y, expected)
    y = evaluate(load_operator("winograd_conv2d_bias"), arrays | {"B": b}, scalars)["Y"]
    close(y, expected + b[None, :, None, None])


def test_conv2d_checks_groups_and_shapes(rng):
    op = load_operator("conv2d")
    with pytest.raises(DslError, match="times groups"):
        evaluate(op, {"X": f32(rng, 1, 4, 5, 5), "Wt": f32(rng, 4, 3, 3, 3)}, {"groups": 2})
    with pytest.raises(DslError, match="rank 3, expected 4"):
        evaluate(op, {"X": f32(rng, 4, 5, 5), "Wt": f32(rng, 4, 4, 3, 3)})
    with pytest.raises(DslError, match="input 'Wt' is missing"):
        evaluate(op, {"X": f32(rng, 1, 4, 5, 5)})


@pytest.mark.parametrize("m,k,n", [(3, 5, 4), (1, 1, 1), (1, 7, 2), (6, 1, 3)])
def test_matrix_products_match_numpy(rng, m, k, n):
    a, b, c = f32(rng, m, k), f32(rng, k, n), f32(rng, m, n)
    close(evaluate(load_operator("matmul"), {"A": a, "B": b})["Y"], a @ b, 1e-12)
    scal = {"alpha": 0.75, "beta": -1.5}
    for name, aa, bb in [("gemm_nn", a, b), ("gemm_nt", a, b.T.copy()),
                         ("gemm_tn", a.T.copy(), b), ("gemm_tt", a.T.copy(), b.T.copy())]:
        y = evaluate(load_operator(name), {"A": aa, "B": bb, "C": c}, scal)["Y"]
        close(y, 0.75 * (a @ b) - 1.5 * c, 1e-12)
    y = evaluate(load_operator("gemm_nn"), {"A": a, "B": b, "C": c})["Y"]  # defaults 1, 1
    close(y, a @ b + c, 1e-12)
    bias = f32(rng, n)
    y = evaluate(load_operator("dense"), {"X": a, "Wt": b.T.copy(), "B": bias})["Y"]
    close(y, a @ b + bias, 1e-12)
    ba, bb = f32(rng, 3, m, k), f32(rng, 3, k, n)
    close(evaluate(load_operator("batched_matmul"), {"A": ba, "B": bb})["Y"], ba @ bb, 1e-12)


POOL_CASES = [
    # H, W, kernel, strides, pads (t, l, b, r), dilations
    (7, 6, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    (5, 5, (2, 3), (1, 2), (0, 1, 1, 0), (1, 1)),
    (4, 4, (4, 4), (1, 1), (0, 0, 0, 0), (1, 1)),
    (8, 7, (2, 2), (2, 1), (1, 0, 0, 1), (2, 2)),
]


@pytest.mark.parametrize("h,w,kernel,strides,pads,dil", POOL_CASES)
def test_pools_match_onnxruntime(rng, h, w, kernel, strides, pads, dil):
    x = f32(rng, 2, 3, h, w)
    scalars = {"KH": kernel[0], "KW": kernel[1], "stride_h": strides[0],
               "stride_w": strides[1], "pad_t": pads[0], "pad_l": pads[1], "pad_b": pads[2],
               "pad_r": pads[3]}
    expected = run_onnx("MaxPool", [x], kernel_shape=list(kernel), strides=list(strides),
                        pads=list(pads), dilations=list(dil))
    y = evaluate(load_operator("maxpool2d"), {"X": x},
                 {**scalars, "dil_h": dil[0], "dil_w": dil[1]})["Y"]
    close(y, expected)
    if dil == (1, 1):
        for include in (0, 1):
            expected = run_onnx("AveragePool", [x], kernel_shape=list(kernel),
                                strides=list(strides), pads=list(pads),
                                count_include_pad=include)
            y = evaluate(load_operator("avgpool2d"), {"X": x},
                         {**scalars, "count_include_pad": include})["Y"]
            close(y, expected)


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 1, 1, 1)])
def test_global_pools_match_onnxruntime(rng, shape):
    x = f32(rng, *shape)
    close(evaluate(load_operator("global_avgpool2d"), {"X": x})["Y"],
          run_onnx("GlobalAveragePool", [x]))
    close(evaluate(load_operator("global_maxpool2d"), {"X": x})["Y"],
          run_onnx("GlobalMaxPool", [x]))


@pytest.mark.parametrize("shape", [(4, 10), (1, 1), (3, 1)])
def test_softmax_family_matches_numpy(rng, shape):
    x = f32(rng, *shape) * 30 + 500  # large values: needs the max subtraction
    shifted = x - x.max(axis=1, keepdims=True)
    expected = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    y = evaluate(load_operator("softmax"), {"X": x})["Y"]
    assert np.all(np.isfinite(y))
    close(y, expected, 1e-12)
    close(evaluate(load_operator("log_softmax"), {"X": x})["Y"], np.log(expected), 1e-9)


@pytest.mark.parametrize("shape", [(3, 8), (1, 1), (2, 5)])
def test_layernorm_matches_onnxruntime(rng, shape):
    x, gamma, beta = f32(rng, *shape), f32(rng, shape[1]), f32(rng, shape[1])
    y = evaluate(load_operator("layernorm"), {"X": x, "Gamma": gamma, "Beta": beta},
                 {"eps": 1e-3})["Y"]
    mean = x.mean(axis=1, keepdims=True)
    expected = (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-3) * gamma + beta
    close(y, expected, 1e-12)
    node_out = run_onnx("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-3)
    close(y, node_out)


@pytest.mark.parametrize("shape,size", [((2, 7, 3, 4), 5), ((1, 6, 1, 1), 4), ((1, 1, 2, 3), 1),
                                        ((1, 3, 5), 6)])
def test_lrn_matches_onnxruntime(rng, shape, size):
    x = f32(rng, *shape) * 3
    attrs = {"size": size, "alpha": 0.02, "beta": 0.6, "bias": 1.5}
    flat = x.reshape(shape[0], shape[1], -1)
    y = evaluate(load_operator("lrn"), {"X": flat}, attrs)["Y"].reshape(shape)
    squares = np.zeros_like(x)
    for c in range(shape[1]):   # ONNX's window: c - floor((size-1)/2) .. c + ceil((size-1)/2)
        lo, hi = max(0, c - (size - 1) // 2), min(shape[1] - 1, c + math.ceil((size - 1) / 2))
        squares[:, c] = (x[:, lo:hi + 1] ** 2).sum(axis=1)
    close(y, x / (1.5 + 0.02 / size * squares) ** 0.6, 1e-12)
    if size % 2:   # onnxruntime refuses even windows, which the spec allows
        close(y, run_onnx("LRN", [x], **attrs))


@pytest.mark.parametrize("shape", [(2, 5, 3, 4), (1, 3, 1, 1), (3, 4)])
def test_batchnorm_matches_onnxruntime(rng, shape):
    x = f32(rng, *shape)
    c = shape[1]
    scale, bias, mean = f32(rng, c), f32(rng, c), f32(rng, c)
    var = np.abs(f32(rng, c)) + 0.1
    flat = x.reshape(shape[0], c, -1)
    y = evaluate(load_operator("batchnorm"), {"X": flat, "Scale": scale, "Bias": bias,
                                               "Mean": mean, "Var": var},
                 {"eps": 1e-3})["Y"].reshape(shape)
    cs = (slice(None), slice(None)) + (None,) * (len(shape) - 2)
    expected = (x - mean[cs[1:]]) / np.sqrt(var[cs[1:]] + 1e-3) * scale[cs[1:]] + bias[cs[1:]]
    close(y, expected, 1e-12)
    close(y, run_onnx("BatchNormalization", [x, scale, bias, mean, var], epsilon=1e-3))


@pytest.mark.parametrize("shape, groups", [((2, 6, 3, 4), 3), ((1, 4, 1, 1), 2), ((2, 5, 7), 5),
                                          ((1, 3, 2, 2, 3), 1)])
def test_groupnorm_matches_onnxruntime(rng, shape, groups):
    """As GroupNorm over [N, groups, C / groups, spatial], against the float64 formula and
    against onnxruntime's InstanceNormalization where each group is one channel."""
    x, c = f32(rng, *shape) * 2 + 1, shape[1]
    scale, bias = f32(rng, c), f32(rng, c)
    flat = x.reshape(shape[0], groups, c // groups, -1)
    y = evaluate(load_operator("groupnorm"), {"X": flat, "Scale": scale.reshape(groups, -1),
                                              "Bias": bias.reshape(groups, -1)},
                 {"eps": 1e-3})["Y"].reshape(shape)
    grouped = x.astype(np.float64).reshape(shape[0], groups, -1)
    normed = (grouped - grouped.mean(axis=2, keepdims=True)) / np.sqrt(
        grouped.var(axis=2, keepdims=True) + 1e-3)
    cs = (slice(None),) + (None,) * (len(shape) - 2)
    expected = normed.reshape(shape) * scale[cs] + bias[cs]
    close(y, expected, 1e-12)
    if groups == c:
        close(y, run_onnx("InstanceNormalization", [x, scale, bias], epsilon=1e-3))


def gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("length", [1, 37])
def test_elementwise_operators_match_numpy(rng, length):
    x, b = f32(rng, length) * 3, f32(rng, length)
    unary = {"copy": x, "sigmoid": sigmoid(x), "silu": x * sigmoid(x), "tanh": np.tanh(x),
             "gelu": gelu(x), "clip": np.clip(x, 0, 6)}
    for name, expected in unary.items():
        close(evaluate(load_operator(name), {"X": x})["Y"], expected, 1e-12)
    close(evaluate(load_operator("clip"), {"X": x}, {"lo": -0.5, "hi": 0.25})["Y"],
          np.clip(x, -0.5, 0.25), 1e-12)
    close(evaluate(load_operator("add"), {"A": x, "B": b})["Y"], x + b, 1e-12)
    close(evaluate(load_operator("mul"), {"A": x, "B": b})["Y"], x * b, 1e-12)


def test_channel_epilogue_operators_match_numpy(rng):
    x, scale, shift = f32(rng, 2, 3, 5) * 4, f32(rng, 3), f32(rng, 3)
    cs = (slice(None), None)
    y = evaluate(load_operator("scale_shift_relu"), {"X": x, "Scale": scale, "Shift": shift})
    close(y["Y"], np.maximum(x * scale[cs] + shift[cs], 0), 1e-12)
    y = evaluate(load_operator("bias_relu6"), {"X": x, "B": shift})["Y"]
    close(y, np.clip(x + shift[cs], 0, 6), 1e-12)
    y = evaluate(load_operator("bias_leaky_relu"), {"X": x, "B": shift}, {"alpha": 0.2})["Y"]
    z = x + shift[cs]
    close(y, np.where(z >= 0, z, 0.2 * z), 1e-12)
    m, bias, res = f32(rng, 4, 6), f32(rng, 6), f32(rng, 4, 6)
    y = evaluate(load_operator("bias_gelu_add"), {"X": m, "B": bias, "Res": res})["Y"]
    close(y, gelu(m + bias) + res, 1e-12)


TESTED = {"conv2d", "conv2d_bias", "conv2d_bias_relu_add", "matmul", "batched_matmul",
          "gemm_nn", "gemm_nt", "gemm_tn", "gemm_tt", "dense", "maxpool2d", "avgpool2d",
          "global_avgpool2d", "global_maxpool2d", "softmax", "log_softmax", "layernorm",
          "copy", "add", "mul", "scale_shift_relu", "bias_relu6", "bias_leaky_relu", "clip",
          "sigmoid", "silu", "tanh", "gelu", "bias_gelu_add", "winograd_conv2d",
          "winograd_conv2d_bias", "lrn", "batchnorm", "groupnorm"}


def test_every_library_operator_is_tested_here():
    assert set(list_operators()) == TESTED


def test_unknown_operator_is_a_clear_error():
    with pytest.raises(DslError, match="no DSL library operator named 'conv3d'") as info:
        load_operator("conv3d")
    assert "conv2d" in info.value.hint
    assert operator_file("softmax").name == "softmax.wpk"


def _clear_library_caches():
    from wpk.kernels import dsl_library

    for cached in (dsl_library._library, dsl_library._defining_files, dsl_library._parsed):
        cached.cache_clear()


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """The library module reading its files from `tmp_path`, its caches empty (and emptied
    again afterwards, for the real library)."""
    from wpk.kernels import dsl_library

    monkeypatch.setattr(dsl_library, "LIBRARY_DIR", tmp_path)
    _clear_library_caches()
    yield dsl_library
    _clear_library_caches()


def test_an_operator_loads_from_its_own_file_alone(fresh_library, tmp_path):
    """Only the defining file is parsed: a broken file elsewhere does not stop it, and the
    whole library's listing still reports that file."""
    (tmp_path / "a.wpk").write_text("op twice(X: f32[L]) -> Y: f32[L] { Y[i] = X[i] * 2.0 }\n")
    (tmp_path / "b.wpk").write_text("op broken(X: f32[L]) -> Y: f32[L] { Y[i] = \n")
    library = fresh_library
    assert library.load_operator("twice").name == "twice"
    with pytest.raises(DslError, match="b.wpk"):
        library.list_operators()


def test_an_operator_defined_in_two_files_is_still_refused(fresh_library, tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.wpk").write_text(
            "op same(X: f32[L]) -> Y: f32[L] { Y[i] = X[i] }\n")
    library = fresh_library
    with pytest.raises(DslError, match="also defined in"):
        library.load_operator("same")
