"""Exercise 6.7 — Parsing GGUF Files, against llama.cpp's own reader (gguf-py).

The audit, one test per likely mistake: no version check, or a struct.error for a
short header; a string length read as uint32, or the end counted in characters
instead of bytes; an array's count read before its element type; shapes in GGUF's
order; a data offset that ignores the alignment.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from llmrs_core.formats.gguf import GGUFField, GGUFValueType
from llmrs_core.formats.gguf_writer import write_gguf
from llmrs_core.testing import write_tiny_llama

gguf = pytest.importorskip("gguf")


def gstr(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def test_ex6_7_header(ex):
    data = b"GGUF" + struct.pack("<IQQ", 3, 272, 33)
    assert ex.read_header(data) == (3, 272, 33)
    bad = {
        "the magic is GGML, not GGUF": b"GGML" + data[4:],
        "20 bytes, fewer than a header's 24": data[:20],
        "version 1 (only versions 2 and 3 are read)": b"GGUF" + struct.pack("<IQQ", 1, 0, 0),
    }
    for why, header in bad.items():
        try:
            ex.read_header(header)
        except ValueError:
            continue
        except struct.error as e:
            pytest.fail(f"read_header of {why} raised struct.error ({e}); check the length first and raise ValueError",
                        pytrace=False)
        pytest.fail(f"read_header must raise ValueError for {why}", pytrace=False)


def test_ex6_7_strings(ex):
    data = b"xx" + gstr("héllo") + gstr("")
    try:
        got = ex.read_string(data, 2)
    except (UnicodeDecodeError, ValueError, struct.error) as e:
        pytest.fail(f"read_string(data, 2) raised {type(e).__name__}: {e} — a GGUF string is a uint64 length "
                    "(8 bytes, little-endian), then that many UTF-8 bytes", pytrace=False)
    s, end = got
    assert s == "héllo", f"read_string(data, 2) read {s!r}; expected 'héllo'"
    assert end != 2 + 8 + 5, (
        "read_string returned end 15, counting characters: 'héllo' is 5 characters but 6 UTF-8 bytes (é takes 2); "
        "the end is the offset + 8 + the byte length"
    )
    assert end == 2 + 8 + 6, f"the end of 'héllo' at 2 is 2 + 8 (length) + 6 (bytes) = 16; yours {end}"
    assert ex.read_string(data, end) == ("", end + 8)
    with pytest.raises(ValueError):
        ex.read_string(struct.pack("<Q", 1000) + b"abc", 0)


VALUES = [
    (0, b"\xff", 255), (1, b"\xff", -1), (4, struct.pack("<I", 4_000_000_000), 4_000_000_000),
    (5, struct.pack("<i", -5), -5), (6, struct.pack("<f", 0.5), 0.5), (7, b"\x01", True),
    (8, gstr("abc"), "abc"), (10, struct.pack("<Q", 2**63), 2**63), (12, struct.pack("<d", 0.1), 0.1),
    (9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3), [1, -2, 3]),
    (9, struct.pack("<IQ", 8, 2) + gstr("a") + gstr("bc"), ["a", "bc"]),
    (9, struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 0, 1) + b"\x07" + struct.pack("<IQ", 0, 0), [[7], []]),
]


@pytest.mark.parametrize("vtype, payload, want", VALUES)
def test_ex6_7_values(ex, vtype, payload, want):
    hint = " (an array is a uint32 element type, a uint64 count, then the elements)" if vtype == 9 else ""
    try:
        value, end = ex.read_value(payload + b"tail", 0, vtype)
    except (ValueError, struct.error, IndexError) as e:
        pytest.fail(f"read_value(type {vtype}) of {payload!r} raised {type(e).__name__}: {e}{hint}", pytrace=False)
    assert value == want, f"read_value(type {vtype}) read {value!r}; expected {want!r}{hint}"
    if vtype == 7:
        assert isinstance(value, bool), f"type 7 is a bool: return True or False, not {value!r}"
    assert end == len(payload), f"return the offset just after the value: {len(payload)}, not {end}{hint}"


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
        want = tuple(int(n) for n in reversed(t.shape))
        assert tuple(info["shape"]) == want, (
            f"{t.name}: shape {tuple(info['shape'])}, expected {want}: GGUF lists dimensions innermost first, "
            "so reverse them for NumPy's order"
        )
        assert info["type"] == int(t.tensor_type), f"{t.name}: ggml type {info['type']}, expected {int(t.tensor_type)}"
        assert parsed["data_offset"] + info["offset"] == t.data_offset, (
            f"{t.name}: data_offset {parsed['data_offset']} + offset {info['offset']} should be byte "
            f"{t.data_offset}: the data starts at the first multiple of general.alignment (default 32) after the "
            "tensor infos, and each tensor's offset counts from there"
        )
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
    assert parsed["alignment"] == 128, f"general.alignment is 128 in this file; yours {parsed['alignment']}"
    assert parsed["data_offset"] % 128 == 0, f"data_offset {parsed['data_offset']} must be a multiple of the alignment, 128"
    assert parsed["tensors"]["b"]["offset"] == 128


@pytest.mark.model
def test_ex6_7_parse_smollm2(ex, model_path):
    parsed = check_against_gguf_py(ex, model_path)
    assert len(parsed["tensors"]) == 272
    assert parsed["tensors"]["token_embd.weight"]["shape"] == (49152, 576)
