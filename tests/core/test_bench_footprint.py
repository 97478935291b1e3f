"""bench/footprint.py: the bytes a decode step reads, and an engine's memory measured in a fresh process."""

from __future__ import annotations

import pytest

import llmrs_core as llmrs
from llmrs_core.bench.footprint import decode_bytes, footprint, roofline
from llmrs_core.testing import write_tiny_llama

SHAPE = dict(hidden_size=64, intermediate_size=96, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=80)


@pytest.mark.parametrize("tie", [True, False])
def test_decode_bytes_counts_every_matrix_once_and_the_head(tmp_path, tie):
    """On the NumPy backend every matrix is float32: a step reads 4 bytes of each weight of the
    layers' seven matrices and of the output head (the tied embedding once; an untied embedding
    only gives its one row, so it is not counted)."""
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, tie_embeddings=tie, **SHAPE)
    model = llmrs.load(path, backend="numpy")
    c = model.config
    kv = c.n_kv_heads * c.head_dim
    per_layer = c.hidden_size * (c.hidden_size + 2 * kv) + c.hidden_size * c.hidden_size \
        + 3 * c.hidden_size * c.intermediate_size
    want = 4 * (c.n_layers * per_layer + c.vocab_size * c.hidden_size)
    assert decode_bytes(model.network) == want
    r = roofline(model.network, tg_tokens_per_s=10.0, stream_gb_s=2.0)
    assert r["roof_tokens_per_s"] == pytest.approx(2e9 / want) and r["fraction"] == pytest.approx(10.0 * want / 2e9)


def test_footprint_measures_a_fresh_process_and_reports_a_failure(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, weight_type="q4_k", **{**SHAPE, "hidden_size": 256, "intermediate_size": 256})
    got = footprint(path, "numba", threads=1)
    assert "error" not in got, got
    assert got["rss_mib"] >= got["anon_mib"] > 0 and got["load_s"] > 0
    bad = footprint(tmp_path / "missing.gguf", "numba", threads=1)
    assert "missing.gguf" in bad["error"], bad
    with pytest.raises(ValueError, match="unknown engine"):
        footprint(path, "vllm", threads=1)
