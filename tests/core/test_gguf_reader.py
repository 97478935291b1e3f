"""The GGUF reader and writer, checked against the `gguf` package (llama.cpp's own Python reader)."""

from __future__ import annotations

import numpy as np
import pytest

from llmrs_core.formats.gguf import GGUFField, GGUFValueType, read_gguf
from llmrs_core.formats.gguf_writer import TensorToWrite, write_gguf
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import write_tiny_llama

gguf = pytest.importorskip("gguf", reason="the gguf package is the test-time reference")


def reference_fields(path) -> dict:
    reader = gguf.GGUFReader(str(path))
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = field.contents()
    return out, reader


def assert_same_as_reference(path) -> None:
    ref_fields, reader = reference_fields(path)
    with read_gguf(path) as ours:
        assert set(ours.metadata) == set(ref_fields)
        for key, want in ref_fields.items():
            got = ours.metadata[key]
            if isinstance(want, float):
                assert got == pytest.approx(want, rel=1e-7), key
            elif isinstance(want, list) and want and isinstance(want[0], float):
                np.testing.assert_allclose(got, want, rtol=1e-7, err_msg=key)
            else:
                assert got == want, key
        assert list(ours.tensors) == [t.name for t in reader.tensors]
        for t in reader.tensors:
            info = ours.tensors[t.name]
            assert info.shape == tuple(int(n) for n in reversed(t.shape)), t.name
            assert info.ggml_type.value == int(t.tensor_type), t.name
            assert ours.data_offset + info.offset == t.data_offset, t.name
            assert info.n_bytes == t.n_bytes, t.name
            assert info.n_elements == t.n_elements, t.name
            np.testing.assert_array_equal(
                ours.tensor_bytes(t.name), np.asarray(t.data).reshape(-1).view(np.uint8), err_msg=t.name
            )


@pytest.mark.model
def test_reads_smollm2_like_the_reference(model_path):
    assert_same_as_reference(model_path)


@pytest.mark.model
def test_smollm2_facts(smollm2_gguf):
    g = smollm2_gguf
    assert g.version == 3
    assert g.alignment == 32, "no general.alignment key: the default 32 applies"
    assert len(g.tensors) == 272
    emb = g.tensors["token_embd.weight"]
    assert emb.shape == (49152, 576) and emb.ggml_type is GGMLType.Q8_0
    assert g.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
    norm = g.tensor_array("blk.0.attn_norm.weight")
    assert norm.shape == (576,) and norm.dtype == np.float32
    with pytest.raises(TypeError, match="block format"):
        g.tensor_array("blk.0.attn_q.weight")
    with pytest.raises(KeyError, match="no tensor named"):
        g.tensor_bytes("blk.99.attn_q.weight")


def test_tiny_model_round_trip(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, tie_embeddings=False, seed=3)
    assert_same_as_reference(path)
    from llmrs_core.testing import TINY_LLAMA, tiny_llama_tensors

    want = tiny_llama_tensors(**TINY_LLAMA, tie_embeddings=False, seed=3)
    with read_gguf(path) as g:
        assert set(g.tensors) == set(want)
        for name, arr in want.items():
            np.testing.assert_array_equal(g.tensor_array(name), arr, err_msg=name)


ALL_TYPES = {
    "t.u8": GGUFField(200, GGUFValueType.UINT8),
    "t.i8": GGUFField(-100, GGUFValueType.INT8),
    "t.u16": GGUFField(60000, GGUFValueType.UINT16),
    "t.i16": GGUFField(-30000, GGUFValueType.INT16),
    "t.u32": GGUFField(4_000_000_000, GGUFValueType.UINT32),
    "t.i32": GGUFField(-2_000_000_000, GGUFValueType.INT32),
    "t.f32": GGUFField(1.5, GGUFValueType.FLOAT32),
    "t.bool": True,
    "t.str": "héllo ✓ 世界",
    "t.u64": GGUFField(2**63 + 5, GGUFValueType.UINT64),
    "t.i64": GGUFField(-(2**62), GGUFValueType.INT64),
    "t.f64": GGUFField(2.0**-40, GGUFValueType.FLOAT64),
    "t.arr_i32": GGUFField([1, -2, 3], GGUFValueType.ARRAY, GGUFValueType.INT32),
    "t.arr_str": ["a", "", "ccc"],
    "t.arr_bool": [True, False, True],
    "t.arr_empty": GGUFField([], GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
    "t.nested": GGUFField([[1, 2], [3], []], GGUFValueType.ARRAY, GGUFValueType.ARRAY),
}


def test_every_value_type_round_trips(tmp_path):
    path = tmp_path / "types.gguf"
    write_gguf(path, ALL_TYPES, {"w": np.arange(64, dtype=np.float32).reshape(2, 32)})
    with read_gguf(path) as g:
        for key, value in ALL_TYPES.items():
            want = value.value if isinstance(value, GGUFField) else value
            assert g.metadata[key] == want, key
            if isinstance(value, GGUFField):
                assert g.fields[key].type is value.type, key
        assert g.fields["t.arr_i32"].element_type is GGUFValueType.INT32
    ref, _ = reference_fields(path)
    for key in ("t.u64", "t.i64", "t.str", "t.arr_str", "t.arr_i32"):
        assert ref[key] == (ALL_TYPES[key].value if isinstance(ALL_TYPES[key], GGUFField) else ALL_TYPES[key])


def test_custom_alignment(tmp_path):
    path = tmp_path / "aligned.gguf"
    tensors = {
        "a": np.ones((3, 5), np.float32),
        "b": TensorToWrite((2, 32), GGMLType.Q8_0, bytes(2 * 34)),
        "c": np.zeros(7, np.float16),
    }
    write_gguf(path, {"general.alignment": GGUFField(64, GGUFValueType.UINT32)}, tensors)
    with read_gguf(path) as g:
        assert g.alignment == 64 and g.data_offset % 64 == 0
        assert all(t.offset % 64 == 0 for t in g.tensors.values())
        assert g.tensors["b"].n_bytes == 68
        np.testing.assert_array_equal(g.tensor_array("a"), np.ones((3, 5), np.float32))
        assert g.tensor_array("c").dtype == np.float16
    assert_same_as_reference(path)


def test_writer_rejects_wrong_sized_block_data(tmp_path):
    with pytest.raises(ValueError, match="needs 68"):
        write_gguf(tmp_path / "x.gguf", {}, {"b": TensorToWrite((2, 32), GGMLType.Q8_0, bytes(10))})
    assert not list(tmp_path.iterdir()), "a failed write must leave no file behind"
