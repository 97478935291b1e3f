"""Exercise 6.7 — Parsing GGUF Files, against llama.cpp's own reader (gguf-py)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from llmrs_core.formats.gguf import GGUFField, GGUFValueType, write_gguf
from llmrs_core.testing import write_tiny_llama

gguf = pytest.importorskip("gguf")


def gstr(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def test_ex6_7_header(ex):
    data = b"GGUF" + struct.pack("<IQQ", 3, 272, 33)
    assert ex.read_header(data) == (3, 272, 33)
    for bad in (b"GGML" + data[4:], data[:20], b"GGUF" + struct.pack("<IQQ", 1, 0, 0)):
        with pytest.raises(ValueError):
            ex.read_header(bad)


def test_ex6_7_strings(ex):
    data = b"xx" + gstr("héllo") + gstr("")
    s, end = ex.read_string(data, 2)
    assert (s, end) == ("héllo", 2 + 8 + 6)
    assert ex.read_string(data, end) == ("", end + 8)
    with pytest.raises(ValueError):
        ex.read_string(struct.pack("<Q", 1000) + b"abc", 0)


@pytest.mark.parametrize(
    "vtype, payload, want",
    [
        (0, b"\xff", 255), (1, b"\xff", -1), (4, struct.pack("<I", 4_000_000_000), 4_000_000_000),
        (5, struct.pack("<i", -5), -5), (6, struct.pack("<f", 0.5), 0.5), (7, b"\x01", True),
        (8, gstr("abc"), "abc"), (10, struct.pack("<Q", 2**63), 2**63), (12, struct.pack("<d", 0.1), 0.1),
        (9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3), [1, -2, 3]),
        (9, struct.pack("<IQ", 8, 2) + gstr("a") + gstr("bc"), ["a", "bc"]),
        (9, struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 0, 1) + b"\x07" + struct.pack("<IQ", 0, 0), [[7], []]),
    ],
)
def test_ex6_7_values(ex, vtype, payload, want):
    value, end = ex.read_value(payload + b"tail", 0, vtype)
    assert value == want
    assert end == len(payload), "return the offset just after the value"


def test_ex6_7_bad_values(ex):
    with pytest.raises(ValueError):
        ex.read_value(b"\x00" * 8, 0, 77)  # unknown type
    with pytest.raises(ValueError):
        ex.read_value(struct.pack("<IQ", 4, 2**40), 0, 9)  # array far larger than the data


def check_against_gguf_py(ex, path):
    parsed = ex.parse_gguf(path)
    reader = gguf.GGUFReader(str(path))
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        want, got = field.contents(), parsed["metadata"][key]
        if isinstance(want, float):
            assert got == pytest.approx(want), key
        else:
            assert got == want, key
    assert len(parsed["metadata"]) == len([k for k in reader.fields if not k.startswith("GGUF.")])
    for t in reader.tensors:
        info = parsed["tensors"][t.name]
        assert tuple(info["shape"]) == tuple(int(n) for n in reversed(t.shape)), f"{t.name}: NumPy order"
        assert info["type"] == int(t.tensor_type)
        assert parsed["data_offset"] + info["offset"] == t.data_offset, f"{t.name}: data offset"
    return parsed


def test_ex6_7_parse_a_tiny_model(ex, tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    parsed = check_against_gguf_py(ex, path)
    assert parsed["version"] == 3 and parsed["alignment"] == 32 and parsed["data_offset"] % 32 == 0


def test_ex6_7_alignment(ex, tmp_path):
    path = tmp_path / "aligned.gguf"
    write_gguf(path, {"general.alignment": GGUFField(128, GGUFValueType.UINT32)},
               {"a": np.ones(3, np.float32), "b": np.ones((2, 2), np.float32)})
    parsed = check_against_gguf_py(ex, path)
    assert parsed["alignment"] == 128 and parsed["data_offset"] % 128 == 0
    assert parsed["tensors"]["b"]["offset"] == 128


@pytest.mark.model
def test_ex6_7_parse_smollm2(ex, model_path):
    parsed = check_against_gguf_py(ex, model_path)
    assert len(parsed["tensors"]) == 272
    assert parsed["tensors"]["token_embd.weight"]["shape"] == (49152, 576)
