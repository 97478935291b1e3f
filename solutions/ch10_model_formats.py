"""Chapter 10 solutions: thin layers over the engine's readers and writers (llmrs_core.formats)."""

from __future__ import annotations

import os

import numpy as np

from llmrs_core.formats.gguf import GGUFField, read_gguf
from llmrs_core.formats.gguf_writer import TensorToWrite, write_gguf
from llmrs_core.formats.hf import HFWeights, hf_to_gguf_name
from llmrs_core.formats.safetensors import read_safetensors
from llmrs_core.quant import dequantize_all

__all__ = [
    "GGUFField",
    "TensorToWrite",
    "gguf_tensors_as_arrays",
    "hf_to_gguf_name",
    "load_hf_weights",
    "load_safetensors",
    "read_safetensors_header",
    "write_gguf",
]


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict, int]:
    with read_safetensors(path) as f:
        header: dict = {
            name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [t.begin, t.end]}
            for name, t in f.tensors.items()
        }
        if f.metadata:
            header["__metadata__"] = dict(f.metadata)
        return header, f.data_offset


def load_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    with read_safetensors(path) as f:
        return {
            name: f.to_float32(name) if t.dtype == "BF16" else f.tensor(name).copy()
            for name, t in f.tensors.items()
        }


def load_hf_weights(directory: str | os.PathLike[str], permute_qk: bool = True) -> dict[str, np.ndarray]:
    weights = HFWeights(directory, permute_qk=permute_qk)
    try:
        return {name: weights.float32(name) for name in weights.tensors}
    finally:
        weights.close()


def gguf_tensors_as_arrays(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    with read_gguf(path) as g:
        return dequantize_all(g)
