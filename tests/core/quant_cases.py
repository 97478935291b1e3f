"""Seeded inputs for the bit-exactness tests of the quantisers (test_kquants.py, test_quant_types.py).

A module of its own so that ``scripts/make_quant_mixes.py`` can build the
same inputs when it records ggml's output for them (it loads this file by
path: it needs NumPy only).
"""

from __future__ import annotations

import numpy as np

N_BLOCKS = 200  # super-blocks per random case: enough to hit the rare branches, fast

#: the cases, in the order that seeds them (case i draws from default_rng(i + 2024))
CASE_NAMES = (
    "normal", "uniform", "outliers", "heavy_tailed", "positive", "negative", "mixed_scales",
    "zero_sub_blocks", "sparse", "integers", "tiny", "underflow", "all_zero", "constant",
)


def make_case(name: str) -> np.ndarray:
    """The seeded input of one case: float32 ``[rows, 512]`` (two super-blocks a row).

    Built from the generator's uniform and normal draws with plain
    arithmetic only, so the floats (and so the digests) don't depend on
    the platform's math library.
    """
    rng = np.random.default_rng(CASE_NAMES.index(name) + 2024)
    shape = (N_BLOCKS // 2, 512)
    normal = rng.standard_normal(shape)
    uniform = rng.random(shape)
    if name == "normal":
        x = normal * 0.02
    elif name == "uniform":
        x = uniform * 2 - 1
    elif name == "outliers":  # 1% of the weights 50x larger, as in real LLM layers
        x = normal * np.where(rng.random(shape) < 0.01, 50.0, 1.0)
    elif name == "heavy_tailed":  # |x| ~ 1/u: a Pareto-like tail reaching 100x the median
        x = np.where(normal < 0, -1.0, 1.0) / (uniform + 0.01)
    elif name == "positive":  # every sub-block above zero: the min is clamped to 0
        x = normal + 4.0
    elif name == "negative":
        x = -(uniform + 0.5)
    elif name == "mixed_scales":  # each 16-value group at its own scale, 2**-14 .. 2**5
        scales = np.ldexp(1.0 + rng.random((shape[0], 32)), rng.integers(-14, 5, (shape[0], 32)))
        x = normal * np.repeat(scales, 16, axis=1)
    elif name == "zero_sub_blocks":  # about half the 32-value sub-blocks all zero
        x = normal * np.repeat(rng.random((shape[0], 16)) < 0.5, 32, axis=1)
    elif name == "sparse":
        x = normal * (uniform < 0.05)
    elif name == "integers":  # exact halves: rounding ties everywhere
        x = np.floor(uniform * 17 - 8) * 0.5
    elif name == "tiny":
        x = normal * 1e-6
    elif name == "underflow":  # x*x underflows float32: Q6_K's weighted sums vanish
        x = normal * 1e-20
    elif name == "all_zero":
        x = np.zeros((4, 512))
    elif name == "constant":  # a constant per super-block
        x = np.repeat(np.array([0.37, -1.5, 1e-3, 0.0, 65.0, -2e-7]), 256).reshape(3, 512)
    else:
        raise KeyError(name)
    return x.astype(np.float32)


# -- the model scripts/make_quant_mixes.py quantises with llama.cpp ------------------

#: rows of 256 and 512, so every K-quant and IQ4_XS applies (no fallback types); three layers,
#: so llama.cpp's "more bits" rule (the last layer of three) treats the layers differently
MIX_MODEL = dict(vocab_size=257, hidden_size=256, intermediate_size=512, n_layers=3, n_heads=4, n_kv_heads=2,
                 context_length=512, rope_theta=10000.0, rms_norm_eps=1e-5)
MIX_SEED = 28


def write_mix_source(path) -> None:
    """Write the F32 model the mixes are made from (random weights of seed :data:`MIX_SEED`, the
    byte-level tokenizer of ``llmrs_core.testing``)."""
    from llmrs_core.formats.gguf import GGUFField, GGUFValueType
    from llmrs_core.formats.gguf_writer import write_gguf
    from llmrs_core.testing import byte_level_tokenizer_metadata, tiny_llama_metadata, tiny_llama_tensors

    metadata = tiny_llama_metadata(**MIX_MODEL) | byte_level_tokenizer_metadata()
    # llama.cpp reads the merges only as an array of strings and the token types only as int32;
    # the writer would infer other types (an empty list, non-negative ints), so they are given
    metadata["tokenizer.ggml.merges"] = GGUFField([], GGUFValueType.ARRAY, GGUFValueType.STRING)
    metadata["tokenizer.ggml.token_type"] = GGUFField(metadata["tokenizer.ggml.token_type"], GGUFValueType.ARRAY,
                                                      GGUFValueType.INT32)
    write_gguf(path, metadata, tiny_llama_tensors(**MIX_MODEL, seed=MIX_SEED))
