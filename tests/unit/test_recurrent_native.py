"""`recurrent.c` (kernels/cpu/recurrent_native): ONNX LSTM and GRU in C against the float64
reference (onnx.reference in float64) on odd sizes: hidden sizes that are not a multiple of
the vector chunk, batches above one, every direction, GRU with and without
`linear_before_reset`, absent initial states and outputs, variable weights; the native
chain; what it refuses; and the random inputs that verification draws for recurrent ops."""

from __future__ import annotations

import numpy as np
import pytest

from wpk.core.numerics import relative_l2
from wpk.core.workload import TensorSpec, Workload
from wpk.kernels import registry
from wpk.kernels.cpu.native_chain import chain_kernel, native_call
from wpk.kernels.cpu.ort_node import ORT_FALLBACK
from wpk.kernels.cpu.recurrent_native import RECURRENT_C, recurrent_reason
from wpk.kernels.random_inputs import random_inputs
from wpk.kernels.reference import reference

# ISA-dependent code: scripts/isa_check.sh runs these again with wpk restricted to AVX2.
pytestmark = pytest.mark.isa

T = TensorSpec


def recurrent(op, seq, batch, inputs, hidden, direction="forward", lbr=1, outputs=3,
              h0=True, c0=True, bias=True, consts=(1, 2, 3), attrs=()) -> Workload:
    """An LSTM or GRU workload as torch exports it (layout 0, no sequence_lens)."""
    dirs = 2 if direction == "bidirectional" else 1
    gates = 4 if op == "LSTM" else 3
    specs = [T((seq, batch, inputs)), T((dirs, gates * hidden, inputs)),
             T((dirs, gates * hidden, hidden)), T((dirs, 2 * gates * hidden)) if bias else None,
             None, T((dirs, batch, hidden)) if h0 else None]
    if op == "LSTM":
        specs.append(T((dirs, batch, hidden)) if c0 else None)
    while specs[-1] is None:
        specs.pop()
    outs = [T((seq, dirs, batch, hidden)), T((dirs, batch, hidden)), T((dirs, batch, hidden))]
    outs = outs[:min(outputs, 3 if op == "LSTM" else 2)]
    attributes = [("hidden_size", hidden), ("direction", direction), *attrs]
    if op == "GRU":
        attributes.append(("linear_before_reset", lbr))
    return Workload(op, tuple(specs), tuple(outs), tuple(attributes), (), "",
                    tuple(i for i in consts if i < len(specs) and specs[i] is not None))


def run(w: Workload, arrays, par: int) -> list[np.ndarray]:
    outputs = [np.full(s.shape, np.nan, np.float32) for s in w.outputs]   # poisoned
    consts = {i: arrays[i] for i in w.const_inputs}
    RECURRENT_C.prepare(w, consts, {"par": par})(arrays, outputs)
    return outputs


CASES = {
    "crnn_bilstm": dict(op="LSTM", seq=40, batch=1, inputs=96, hidden=64,
                        direction="bidirectional"),
    "lstm_odd": dict(op="LSTM", seq=7, batch=3, inputs=13, hidden=37),
    "lstm_reverse": dict(op="LSTM", seq=5, batch=2, inputs=9, hidden=40, direction="reverse"),
    "lstm_one_step_no_state": dict(op="LSTM", seq=1, batch=1, inputs=3, hidden=5, h0=False,
                                   c0=False, bias=False, outputs=1),
    "lstm_variable_weights": dict(op="LSTM", seq=6, batch=2, inputs=10, hidden=17,
                                  direction="bidirectional", consts=()),
    "gru_bidirectional": dict(op="GRU", seq=30, batch=1, inputs=64, hidden=48,
                              direction="bidirectional"),
    "gru_reset_first": dict(op="GRU", seq=6, batch=2, inputs=11, hidden=19, lbr=0),
    "gru_reset_first_bidirectional": dict(op="GRU", seq=9, batch=1, inputs=5, hidden=33,
                                          direction="bidirectional", lbr=0),
    "gru_reverse_y_only": dict(op="GRU", seq=4, batch=3, inputs=7, hidden=21,
                               direction="reverse", outputs=1, h0=False),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("par", [1, 0])
def test_matches_the_reference(rng, case, par):
    w = recurrent(**CASES[case])
    assert recurrent_reason(w) is None
    arrays = random_inputs(w, rng)
    for actual, expected in zip(run(w, arrays, par), reference(w, arrays)):
        assert relative_l2(actual, expected) < 1e-6


def test_the_native_form_computes_the_same_in_a_chain(rng):
    w = recurrent("LSTM", 12, 2, 24, 40, direction="bidirectional")
    arrays = random_inputs(w, rng)
    kernel = RECURRENT_C.prepare(w, {i: arrays[i] for i in w.const_inputs}, {"par": 1})
    outputs = [np.full(s.shape, np.nan, np.float32) for s in w.outputs]
    call = native_call(kernel, arrays, outputs)
    assert call is not None
    chain_kernel([call])([], [])
    for actual, expected in zip(outputs, reference(w, arrays)):
        assert relative_l2(actual, expected) < 1e-6
    strided = np.asfortranarray(arrays[0])   # not passed as it is: no native form
    assert kernel.native([strided, *arrays[1:]], outputs) is None


def test_constant_full_sequence_lengths_are_no_lengths(rng):
    """tf2onnx gives an unmasked Keras layer a constant sequence_lens equal to the length."""
    w = recurrent("GRU", 6, 2, 11, 19, lbr=0)
    specs = (*w.inputs[:4], T((2,), "int32"), *w.inputs[5:])
    full = Workload("GRU", specs, w.outputs, w.attrs, (), "", w.const_inputs,
                    ((4, np.array([6, 6], np.int32)),))
    assert recurrent_reason(full) is None
    arrays = random_inputs(full, rng)
    for actual, expected in zip(run(full, arrays, 1), reference(full, arrays)):
        assert relative_l2(actual, expected) < 1e-6
    short = Workload("GRU", specs, w.outputs, w.attrs, (), "", w.const_inputs,
                     ((4, np.array([6, 5], np.int32)),))
    assert "sequence_lens" in recurrent_reason(short)


def test_the_planner_offers_it_next_to_onnxruntime():
    names = {c.implementation.name for c in registry.candidates(recurrent("GRU", 4, 1, 8, 16))}
    assert {"recurrent.c", "ort.fallback"} <= names


@pytest.mark.parametrize("w, words", [
    (recurrent("LSTM", 4, 1, 8, 16, attrs=(("clip", 3.0),)), "clip"),
    (recurrent("LSTM", 20000, 16, 8, 1024), "1 GiB"),
    (recurrent("LSTM", 4, 1, 8, 16, attrs=(("layout", 1),)), "layout 0"),
    (recurrent("LSTM", 4, 1, 8, 16, attrs=(("input_forget", 1),)), "input and forget"),
    (recurrent("GRU", 4, 1, 8, 16, attrs=(("activations", ("Relu", "Tanh")),)),
     "default activations"),
    (Workload("LSTM", (T((4, 1, 8)), T((1, 64, 8)), T((1, 64, 16)), None, T((1,), "int32")),
              (T((4, 1, 1, 16)),), (("hidden_size", 16),)), "sequence_lens"),
    (Workload("LSTM", (T((4, 1, 8)), T((1, 64, 8)), T((1, 64, 16)), None, None, None, None,
                       T((1, 48))), (T((4, 1, 1, 16)),), (("hidden_size", 16),)), "peepholes"),
    (Workload("GRU", (T((4, 1, 8)), T((1, 48, 8)), T((1, 48, 16))), (T((1, 1, 16)),),
              (("hidden_size", 16),)), "Y first"),
    (Workload("GRU", (T((4, 1, 8), "float64"), T((1, 48, 8), "float64"),
                      T((1, 48, 16), "float64")), (T((4, 1, 1, 16), "float64"),),
              (("hidden_size", 16),)), "float32"),
    (Workload("RNN", (T((4, 1, 8)), T((1, 16, 8)), T((1, 16, 16))), (T((4, 1, 1, 16)),),
              (("hidden_size", 16),)), "LSTM and GRU only"),
])
def test_what_it_refuses(w, words):
    assert words in recurrent_reason(w)
    with pytest.raises(ValueError):
        RECURRENT_C.prepare(w, {}, {"par": 1})


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_verification_inputs_keep_a_wide_recurrence_comparable(rng, op):
    """Weights drawn as U(-1, 1) made a 256-wide recurrence chaotic: onnxruntime's float32
    kernel and the float64 reference parted ways (relative error ~1) and a CRNN's LSTMs had
    no verified candidate. Drawn at torch's scale, 1/sqrt(hidden), they agree."""
    w = recurrent(op, 80, 1, 256, 256, direction="bidirectional")
    arrays = random_inputs(w, rng)
    assert np.abs(arrays[2]).max() <= 1 / 16
    kernel = ORT_FALLBACK.prepare(w, {}, {})
    outputs = [np.empty(s.shape, np.float32) for s in w.outputs]
    kernel(arrays, outputs)
    for actual, expected in zip(outputs, reference(w, arrays)):
        assert relative_l2(actual, expected) < 1e-5
