"""Our safetensors reader and writer against the `safetensors` package, and malformed files."""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest

from llmrs_core.formats.safetensors import SafetensorsError, read_safetensors, write_safetensors

st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is the test-time reference")

TENSORS = {
    "weight": np.arange(24, dtype=np.float32).reshape(4, 6),
    "half": np.linspace(-1, 1, 10).astype(np.float16),
    "ids": np.array([3, 1, 4, 1, 5], dtype=np.int64),
    "flags": np.array([True, False, True]),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "scalar": np.array(2.5, dtype=np.float64),
}


def test_we_read_what_the_reference_writes(tmp_path):
    path = tmp_path / "ref.safetensors"
    st.save_file(TENSORS, str(path), metadata={"format": "np", "note": "é ✓"})
    with read_safetensors(path) as f:
        assert f.metadata == {"format": "np", "note": "é ✓"}
        assert set(f.tensors) == set(TENSORS)
        for name, want in TENSORS.items():
            got = f.tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want)


def test_the_reference_reads_what_we_write(tmp_path):
    path = tmp_path / "ours.safetensors"
    write_safetensors(path, TENSORS, {"format": "pt"})
    back = st.load_file(str(path))
    for name, want in TENSORS.items():
        np.testing.assert_array_equal(back[name], want)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0, "the data section starts 8-byte aligned"


def test_bf16_is_widened_to_float32(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([1.0, -2.5, 3.140625, 1e-20], dtype=np.float32)
    bits = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    path = tmp_path / "bf16.safetensors"
    header = json.dumps({"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bits.tobytes())
    with read_safetensors(path) as f:
        np.testing.assert_array_equal(f.to_float32("x"), values.astype(ml_dtypes.bfloat16).astype(np.float32))


def small_file(tmp_path) -> bytes:
    path = tmp_path / "small.safetensors"
    write_safetensors(path, {"a": np.ones((2, 3), np.float32), "b": np.arange(4, dtype=np.int16)}, {"k": "v"})
    return path.read_bytes()


def parse(tmp_path, data: bytes):
    path = tmp_path / "case.safetensors"
    path.write_bytes(data)
    with read_safetensors(path) as f:
        return {n: f.tensor(n).copy() for n in f.tensors}


def test_truncation_at_every_offset(tmp_path):
    data = small_file(tmp_path)
    parse(tmp_path, data)
    for cut in range(len(data)):
        with pytest.raises(SafetensorsError):
            parse(tmp_path, data[:cut])


def test_random_byte_flips_never_crash(tmp_path):
    data = small_file(tmp_path)
    rng = random.Random(7)
    rejected = 0
    for _ in range(2000):
        mutated = bytearray(data)
        for _ in range(rng.choice([1, 2, 3])):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        try:
            parse(tmp_path, bytes(mutated))
        except SafetensorsError:
            rejected += 1
    assert rejected > 300


def with_header(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


CASES = [
    ("empty file", b"", r"only 0 bytes"),
    ("absurd header length", struct.pack("<Q", 2**60) + b"{}", r"header length .* exceeds"),
    ("not json", struct.pack("<Q", 5) + b"{nope", r"not valid UTF-8 JSON"),
    ("not an object", with_header([1, 2]), r"must be a JSON object"),  # type: ignore[arg-type]
    ("unknown dtype", with_header({"x": {"dtype": "F7", "shape": [1], "data_offsets": [0, 4]}}, bytes(4)), r"unknown dtype 'F7'"),
    ("negative shape", with_header({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4)), r"non-negative"),
    ("offsets past the end", with_header({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)), r"outside"),
    ("size mismatch", with_header({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)), r"needs 12"),
    (
        "overlap",
        with_header({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),
        r"overlaps",
    ),
    ("hole", with_header({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)), r"unindexed bytes"),
    ("trailing bytes", with_header({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(8)), r"index 4"),
    ("bad metadata", with_header({"__metadata__": {"a": 1}}), r"__metadata__ must map strings"),
    ("huge shape", with_header({"x": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 4]}}, bytes(4)), r"needs"),
    # 200,000 nested arrays: Python's JSON parser recurses, so this was a RecursionError
    ("nested too deeply", struct.pack("<Q", 200_000) + b"[" * 200_000, r"nested too deeply"),
]


@pytest.mark.parametrize("data, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_files_are_named(tmp_path, data, pattern):
    with pytest.raises(SafetensorsError, match=pattern) as e:
        parse(tmp_path, data)
    assert "case.safetensors" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_safetensors(tmp_path / "nope.safetensors")
