"""Chapter 10's tests name each known mistake: proven by planting it.

As for chapter 3 (test_diagnose_ch03.py): each mistake is planted in a copy of
the solution — a solution function, or the engine's Hugging Face reader behind
it, recompiled from its source with one edit (:func:`llmrs_core.testing.plant`),
or a few lines written the wrong way here — and the chapter 10 test named after
the mistake must fail with its own message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmrs_core.formats.hf import HFWeights
from llmrs_core.testing import chapter_tests, plant, solution_with
from llmrs_core.testing import failure_message as failure

pytest.importorskip("safetensors")


T106 = chapter_tests(10, "test_ex10_6_model_loader.py")
SOLUTION = solution_with(10)


def loader(bf16, from_file_start=False):
    """A learner's load_safetensors: NumPy dtypes by name, BF16 widened by ``bf16(bits)``."""
    dtypes = {"F32": "<f4", "F16": "<f2", "I64": "<i8", "BF16": "<u2"}

    def load_safetensors(path):
        header, data_offset = SOLUTION.read_safetensors_header(path)
        raw = Path(path).read_bytes()
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            start = 0 if from_file_start else data_offset
            a = np.frombuffer(raw[start + begin : start + end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
            out[name] = bf16(a) if info["dtype"] == "BF16" else a.copy()
        return out

    return load_safetensors


def right_bf16(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def reference_file(tmp_path):
    path = tmp_path / "ref.safetensors"
    T106.st.save_file(T106.TENSORS, str(path), metadata={"format": "pt"})
    return path


K_PERMUTE = "w = permute_for_interleaved(w, self.config.n_kv_heads)"
W_K_WITH_N_HEADS = type("HFWeights", (HFWeights,), {"float32": plant(
    HFWeights.float32, (K_PERMUTE, "w = permute_for_interleaved(w, self.config.n_heads)"))})

MISTAKES = {
    "data offset without the 8-byte length": (
        {"read_safetensors_header": plant(SOLUTION.read_safetensors_header,
                                          ("return header, f.data_offset", "return header, f.data_offset - 8"))},
        T106.test_ex10_6_read_header, "reference", "the data starts right after the 8-byte length",
    ),
    "offsets from the start of the file": (
        {"load_safetensors": loader(right_bf16, from_file_start=True)},
        T106.test_ex10_6_load_safetensors_matches_the_reference, "reference",
        "read at data_offsets counted from the start of the file",
    ),
    "BF16 in the low half": (
        {"load_safetensors": loader(lambda bits: bits.astype(np.uint32).view(np.float32))},
        T106.test_ex10_6_bf16_becomes_float32, "tmp", "with the 16 bits as the low half of a float32",
    ),
    "BF16 read as float16": (
        {"load_safetensors": loader(lambda bits: bits.view(np.float16).astype(np.float32))},
        T106.test_ex10_6_bf16_becomes_float32, "tmp", "read as float16: bfloat16 is not IEEE half precision",
    ),
    "W_q and W_k not permuted": (
        {"load_hf_weights": plant(SOLUTION.load_hf_weights, ("HFWeights(directory, permute_qk=permute_qk)",
                                                             "HFWeights(directory, permute_qk=False)"))},
        T106.test_ex10_6_hf_directory_loads_back_to_the_gguf_weights, "tied",
        "blk.0.attn_q.weight equals the reference computed without the permutation",
    ),
    "W_k permuted with the query heads": (
        {"load_hf_weights": plant(SOLUTION.load_hf_weights, HFWeights=W_K_WITH_N_HEADS)},
        T106.test_ex10_6_hf_directory_loads_back_to_the_gguf_weights, "tied",
        "permuted for num_attention_heads heads: W_k has num_key_value_heads of them",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_loader_mistake_gets_its_own_message(mistake, tmp_path):
    planted, test, arg, message = MISTAKES[mistake]
    ex = solution_with(10, **planted)
    args = {"reference": (reference_file(tmp_path),), "tmp": (tmp_path,), "tied": (tmp_path, True)}[arg]
    text = failure(test, ex, *args)
    assert message in text, text


def test_the_learner_style_loader_passes(tmp_path):
    """The loader the mistakes are planted in is right without them."""
    ex = solution_with(10, load_safetensors=loader(right_bf16))
    T106.test_ex10_6_load_safetensors_matches_the_reference(ex, reference_file(tmp_path))
    T106.test_ex10_6_bf16_becomes_float32(ex, tmp_path)


def test_metadata_of_the_wrong_type_is_named(tmp_path):
    """A writer that stores a bool as an int reads back 1, not True: the test says which key and why."""
    from llmrs_core.formats.gguf import GGUFField, GGUFValueType

    T107 = chapter_tests(10, "test_ex10_7_gguf_parser.py")

    def bool_as_int(path, metadata, tensors, *, version=3):
        fixed = {k: GGUFField(int(v), GGUFValueType.INT32) if isinstance(v, bool) else v for k, v in metadata.items()}
        SOLUTION.write_gguf(path, fixed, tensors, version=version)

    text = failure(T107.test_ex10_7_write_then_read, solution_with(10, write_gguf=bool_as_int), tmp_path)
    assert "my.flag reads back as 1 (INT32); it was True" in text, text
