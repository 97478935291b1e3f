"""Malformed GGUF files give a GGUFError naming the problem — never a crash, hang or huge allocation."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from llmrs_core.formats.gguf import GGUFError, GGUFField, GGUFValueType, read_gguf
from llmrs_core.formats.gguf_writer import TensorToWrite, write_gguf
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import write_tiny_llama


def small_gguf_bytes(tmp_path) -> bytes:
    """A ~700-byte file with every kind of metadata value and three tensors."""
    path = tmp_path / "small.gguf"
    metadata = {
        "general.architecture": "llama",
        "a.u8": GGUFField(7, GGUFValueType.UINT8),
        "a.f64": GGUFField(0.25, GGUFValueType.FLOAT64),
        "a.bool": False,
        "a.strs": ["x", "yy"],
        "a.ints": [1, 2, 3],
        "a.nested": GGUFField([[1.0], [2.0, 3.0]], GGUFValueType.ARRAY, GGUFValueType.ARRAY),
    }
    tensors = {
        "w": np.arange(8, dtype=np.float32).reshape(2, 4),
        "q": TensorToWrite((1, 32), GGMLType.Q8_0, bytes(range(34))),
        "h": np.ones(3, np.float16),
    }
    write_gguf(path, metadata, tensors)
    return path.read_bytes()


def parse_bytes(tmp_path, data: bytes, name: str = "case.gguf"):
    path = tmp_path / name
    path.write_bytes(data)
    with read_gguf(path) as g:
        # touch every tensor so lazy errors would surface too
        for t in g.tensors:
            g.tensor_bytes(t)
        return g.metadata


def test_truncation_at_every_offset(tmp_path):
    data = small_gguf_bytes(tmp_path)
    parse_bytes(tmp_path, data)  # the whole file is fine
    with read_gguf(tmp_path / "small.gguf") as g:  # padding after the last tensor is optional
        end = max(g.data_offset + t.offset + t.n_bytes for t in g.tensors.values())
    assert len(data) - end < 32
    for cut in range(end):
        with pytest.raises(GGUFError) as e:
            parse_bytes(tmp_path, data[:cut])
        assert str(tmp_path) in str(e.value), "the message names the file"


def test_truncated_real_sized_model(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    data = path.read_bytes()
    rng = random.Random(0)
    for cut in [0, 3, 4, 23, 24, 100] + rng.sample(range(len(data)), 300):
        with pytest.raises(GGUFError, match=r"truncated|only \d+ bytes|needs bytes"):
            parse_bytes(tmp_path, data[:cut])


def test_random_byte_flips_never_crash(tmp_path):
    data = small_gguf_bytes(tmp_path)
    rng = random.Random(1234)
    outcomes = {"parsed": 0, "rejected": 0}
    for _ in range(3000):
        mutated = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 4])):
            i = rng.randrange(len(mutated))
            mutated[i] = rng.randrange(256)
        try:
            parse_bytes(tmp_path, bytes(mutated))
            outcomes["parsed"] += 1
        except GGUFError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 500 and outcomes["parsed"] > 100, outcomes


def header(n_tensors: int = 0, n_kv: int = 0, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def gstr(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def tensor_info(name: str, ne: list[int], gtype: int, offset: int) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, gtype, offset)


def padded(head: bytes, data: bytes = b"", alignment: int = 32) -> bytes:
    return head + b"\0" * (-len(head) % alignment) + data


CASES = [
    ("not a GGUF", b"GGML" + bytes(40), r"not a GGUF file: magic"),
    ("version 1", header(version=1) + bytes(16), r"version 1"),
    ("big-endian", b"GGUF" + struct.pack(">IQQ", 3, 0, 0), r"big-endian"),
    ("version 99", header(version=99), r"unsupported GGUF version 99"),
    ("absurd counts", header(n_tensors=2**60, n_kv=2**60), r"cannot fit"),
    (
        "string longer than file",
        header(n_kv=1) + struct.pack("<Q", 2**62) + b"abc" + bytes(20),
        r"string length .* runs past the end",
    ),
    ("unknown value type", header(n_kv=1) + kv("k", 77, b"\0" * 8), r"unknown metadata value type 77"),
    (
        "array larger than file",
        header(n_kv=1) + kv("k", 9, struct.pack("<IQ", 5, 2**40)),
        r"array of 1099511627776 INT32 elements cannot fit",
    ),
    (
        "arrays nested too deep",
        header(n_kv=1) + kv("k", 9, struct.pack("<IQ", 9, 1) * 20 + bytes(40)),
        r"nested more than",
    ),
    ("bad bool", header(n_kv=1) + kv("k", 7, b"\x02") + bytes(20), r"boolean byte is 2"),
    (
        "invalid utf-8",
        header(n_kv=1) + kv("k", 8, struct.pack("<Q", 2) + b"\xff\xfe") + bytes(20),
        r"not valid UTF-8",
    ),
    (
        "duplicate key",
        header(n_kv=2) + kv("k", 4, b"\1\0\0\0") + kv("k", 4, b"\2\0\0\0") + bytes(20),
        r"'k' appears twice",
    ),
    (
        "alignment not a power of two",
        padded(header(n_kv=1) + kv("general.alignment", 4, struct.pack("<I", 24))),
        r"power of two",
    ),
    (
        "too many dimensions",
        padded(header(n_tensors=1) + tensor_info("t", [1, 1, 1, 1, 1], 0, 0), bytes(64)),
        r"5 dimensions",
    ),
    (
        "zero dimension",
        padded(header(n_tensors=1) + tensor_info("t", [4, 0], 0, 0), bytes(64)),
        r"zero dimension",
    ),
    (
        "unknown tensor type",
        padded(header(n_tensors=1) + tensor_info("t", [4], 99, 0), bytes(64)),
        r"unknown ggml tensor type id 99",
    ),
    (
        "row not a multiple of the block",
        padded(header(n_tensors=1) + tensor_info("t", [33], int(GGMLType.Q8_0), 0), bytes(128)),
        r"not a multiple of the Q8_0 block size 32",
    ),
    (
        "data past the end",
        padded(header(n_tensors=1) + tensor_info("t", [1024], 0, 0), bytes(64)),
        r"needs bytes .* but the file has",
    ),
    (
        "huge dimensions",
        padded(header(n_tensors=1) + tensor_info("t", [2**40, 2**40], 0, 0), bytes(64)),
        r"needs bytes",
    ),
    (
        "misaligned offset",
        padded(header(n_tensors=1) + tensor_info("t", [4], 0, 8), bytes(64)),
        r"not a multiple of the alignment 32",
    ),
    (
        "overlapping tensors",
        padded(
            header(n_tensors=2) + tensor_info("a", [16], 0, 0) + tensor_info("b", [16], 0, 32),
            bytes(128),
        ),
        r"'a' and 'b' overlap",
    ),
    (
        "duplicate tensor",
        padded(
            header(n_tensors=2) + tensor_info("a", [8], 0, 0) + tensor_info("a", [8], 0, 32),
            bytes(128),
        ),
        r"tensor name 'a' appears twice",
    ),
    ("empty file", b"", r"only 0 bytes"),
]


@pytest.mark.parametrize("data, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_corrupt_file_is_named(tmp_path, data, pattern):
    with pytest.raises(GGUFError, match=pattern) as e:
        parse_bytes(tmp_path, data)
    assert "case.gguf" in str(e.value)


def test_error_names_the_offset(tmp_path):
    # 24-byte header, then the key "k" as an 8-byte length and 1 byte: the type is at 33
    data = header(n_kv=1) + kv("k", 77, b"\0" * 8)
    with pytest.raises(GGUFError, match=r"at byte offset 33\)"):
        parse_bytes(tmp_path, data)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        read_gguf(tmp_path / "nope.gguf")


def test_gguf_error_is_a_value_error():
    assert issubclass(GGUFError, ValueError)
