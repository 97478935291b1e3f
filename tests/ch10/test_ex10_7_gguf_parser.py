"""Exercise 10.7 — GGUF Parser: tensors as arrays, and writing GGUF back.

References: llama.cpp's gguf-py (its dequantisation, its reader) and byte
identity with files the engine wrote. The audit, one test per likely mistake:
shapes in GGUF's order; a quantised type decoded wrongly (located by row and
column); metadata written with the wrong value type (a bool as an int, a
negative int as unsigned); data not padded to the alignment.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmrs_core.formats.gguf import GGUFField, GGUFValueType, read_gguf
from llmrs_core.formats.gguf_writer import TensorToWrite
from llmrs_core.formats.gguf_writer import write_gguf as engine_write_gguf
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import TINY_LLAMA, assert_matches, tiny_llama_tensors, write_tiny_llama

gguf = pytest.importorskip("gguf")


def test_ex10_7_tiny_model_tensors(ex, tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, seed=6)
    got = ex.gguf_tensors_as_arrays(path)
    want = tiny_llama_tensors(**TINY_LLAMA, seed=6)
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name].shape == value.shape, f"{name}: shape {got[name].shape}, want {value.shape} (NumPy order)"
        np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize("weight_type", ["q8_0", "q4_0", "q4_1"])
def test_ex10_7_quantised_tensors_match_gguf_py(ex, tmp_path, weight_type):
    path = tmp_path / f"tiny-{weight_type}.gguf"
    write_tiny_llama(path, seed=6, weight_type=weight_type)
    got = ex.gguf_tensors_as_arrays(path)
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        assert got[t.name].dtype == np.float32, f"{t.name}: dequantise to float32, got {got[t.name].dtype}"
        assert_matches(got[t.name], want, what=f"your {t.name} ({t.tensor_type.name})", axes=("row", "column")[: len(shape)],
                       tol=0.0, note=f" — decode each {t.tensor_type.name} block as Exercise 6.6 does")


@pytest.mark.model
def test_ex10_7_smollm2_tensors_match_gguf_py(ex, model_path):
    got = ex.gguf_tensors_as_arrays(model_path)
    reader = gguf.GGUFReader(str(model_path))
    assert len(got) == len(reader.tensors) == 272
    for t in reader.tensors[:10]:  # Q8_0 embedding, F32 norms, Q4_1 matrices
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(int(n) for n in reversed(t.shape)))
        assert got[t.name].dtype == np.float32
        np.testing.assert_array_equal(got[t.name], want, err_msg=t.name)


def test_ex10_7_write_then_read(ex, tmp_path):
    path = tmp_path / "mine.gguf"
    metadata = {
        "general.architecture": "llama",
        "general.alignment": GGUFField(64, GGUFValueType.UINT32),
        "my.count": 7,
        "my.negative": -3,
        "my.ratio": 0.5,
        "my.flag": True,
        "my.names": ["a", "bb", ""],
        "my.big": GGUFField(2**40, GGUFValueType.UINT64),
    }
    tensors = {
        "w": np.arange(96, dtype=np.float32).reshape(3, 32),
        "h": np.ones(5, dtype=np.float16),
        "q": TensorToWrite((1, 32), GGMLType.Q8_0, bytes(range(34))),
    }
    ex.write_gguf(path, metadata, tensors)
    reader = gguf.GGUFReader(str(path))  # llama.cpp's reader must accept it
    assert {t.name for t in reader.tensors} == {"w", "h", "q"}
    with read_gguf(path) as g:
        assert g.alignment == 64, f"general.alignment was written as {g.alignment}; it is 64"
        assert g.data_offset % 64 == 0, f"the data section starts at {g.data_offset}: pad it to a multiple of 64"
        assert all(t.offset % 64 == 0 for t in g.tensors.values()), "tensor data must be aligned"
        for key, value in [("my.names", ["a", "bb", ""]), ("my.big", 2**40), ("my.negative", -3), ("my.flag", True),
                           ("my.count", 7), ("my.ratio", 0.5)]:
            assert g.metadata[key] == value and type(g.metadata[key]) is type(value), (
                f"{key} reads back as {g.metadata[key]!r} ({g.fields[key].type.name}); it was {value!r} — pick the "
                "value type from the Python type: bool before int (a bool is an int), a negative int signed"
            )
        np.testing.assert_array_equal(g.tensor_array("w"), tensors["w"])
        assert g.tensors["q"].ggml_type is GGMLType.Q8_0


def test_ex10_7_round_trip_is_byte_identical(ex, tmp_path):
    src, dst = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_tiny_llama(src, seed=8)
    with read_gguf(src) as g:
        raw = [(n, TensorToWrite(i.shape, i.ggml_type, g.tensor_bytes(n).tobytes())) for n, i in g.tensors.items()]
        ex.write_gguf(dst, g.fields, raw)
    assert dst.read_bytes() == src.read_bytes(), "read + write back must reproduce the file byte for byte"
    # and what the engine writes from the same input is the same file
    engine_write_gguf(tmp_path / "c.gguf", {"k": 1}, {"t": np.zeros(32, np.float32)})
    ex.write_gguf(tmp_path / "d.gguf", {"k": 1}, {"t": np.zeros(32, np.float32)})
    assert (tmp_path / "c.gguf").read_bytes() == (tmp_path / "d.gguf").read_bytes()
