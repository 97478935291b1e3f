"""The forward pass and generation loop on a tiny random model, against a naive loop written here."""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.testing import (
    TINY_LLAMA,
    ByteTokenizer,
    float32_tolerance,
    naive_llama,
    normalised_error,
    tiny_llama_tensors,
    write_tiny_llama,
)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    params = write_tiny_llama(path, tie_embeddings=request.param, seed=5)
    weights = tiny_llama_tensors(**TINY_LLAMA, tie_embeddings=request.param, seed=5)
    return path, params, weights


def test_forward_matches_the_naive_loop(tiny):
    path, params, weights = tiny
    model = llmrs.load(path)
    ids = [3, 17, 5, 60, 0, 9, 9, 41]
    ours = model.logits(ids)
    want, _ = naive_llama(weights, params, ids)
    assert ours.shape == (len(ids), params["vocab_size"]) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4)


def test_cached_decoding_equals_the_full_forward(tiny):
    path, _, _ = tiny
    net = llmrs.load(path).network
    ids = [1, 2, 3, 4, 5, 6, 7]
    full = net.forward(ids)
    cache = net.new_cache(len(ids))
    steps = [net.forward(ids[:3], cache)] + [net.forward([t], cache) for t in ids[3:]]
    assert normalised_error(np.concatenate(steps), full) <= float32_tolerance(net.config)
    assert cache.length == len(ids)


def test_forward_rejects_bad_ids(tiny):
    net = llmrs.load(tiny[0]).network
    with pytest.raises(ValueError, match="token id 64 is outside"):
        net.forward([1, 64])
    with pytest.raises(ValueError, match="at least one"):
        net.forward([])
    cache = net.new_cache(2)
    net.forward([1, 2], cache)
    with pytest.raises(RuntimeError, match="KV cache holds 2 tokens"):
        net.forward([3], cache)


def test_missing_tensor_is_named(tmp_path):
    from llmrs_core.formats.gguf_writer import write_gguf
    from llmrs_core.testing import tiny_llama_metadata

    tensors = tiny_llama_tensors(**TINY_LLAMA)
    del tensors["blk.1.ffn_up.weight"]
    path = tmp_path / "broken.gguf"
    write_gguf(path, tiny_llama_metadata(**TINY_LLAMA), tensors)
    with pytest.raises(ValueError, match="blk.1.ffn_up.weight"):
        llmrs.load(path).logits([1])




def scripted(tokens):
    """A sampler that plays back a fixed list of tokens."""
    it = iter(tokens)
    return lambda logits, history: next(it)


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    """A tiny model with 256 token ids, one per byte."""
    path = tmp_path_factory.mktemp("bytes") / "bytes.gguf"
    write_tiny_llama(path, vocab_size=256)
    return llmrs.load(path).network


def run(net, tokens, **kw):
    from llmrs_core.generate import generate_ids

    pieces = []
    c = generate_ids(net, ByteTokenizer(), [5, 6], sampler=scripted(tokens), on_text=pieces.append, **kw)
    assert "".join(pieces) == c.text, "streamed text must equal the final text"
    return c


def test_generation_stops(byte_model):
    c = run(byte_model, [ord(ch) for ch in "hello"] + [0, 33], max_tokens=10)
    assert (c.text, c.finish_reason, c.stop_reason) == ("hello", "stop", 0)
    assert c.token_ids == [ord(ch) for ch in "hello"], "the end-of-sequence token is not part of the output"
    c = run(byte_model, [ord(ch) for ch in "abcdef"], max_tokens=4)
    assert (c.text, c.finish_reason) == ("abcd", "length")
    c = run(byte_model, [ord(ch) for ch in "one. two"], max_tokens=8, stop=[". "])
    assert (c.text, c.finish_reason, c.stop_reason) == ("one", "stop", ". ")
    c = run(byte_model, [ord(ch) for ch in "a.b.c"], max_tokens=5, stop=[". "])
    assert c.text == "a.b.c", "text held back as a possible stop string must come out in the end"


def test_generation_bad_requests(byte_model):
    from llmrs_core.generate import generate_ids

    net = byte_model
    with pytest.raises(ValueError, match="prompt is empty"):
        generate_ids(net, ByteTokenizer(), [], max_tokens=3)
    with pytest.raises(ValueError, match="exceeds the model's context length 128"):
        generate_ids(net, ByteTokenizer(), [1] * 100, max_tokens=50)


def test_seeded_sampling_reproduces(byte_model):
    from llmrs_core.generate import generate_ids
    from llmrs_core.sampling import SamplingParams

    net = byte_model
    params = SamplingParams(temperature=1.0, seed=7)
    a = generate_ids(net, ByteTokenizer(), [5, 6], max_tokens=12, sampling=params, stop_token_ids=[])
    b = generate_ids(net, ByteTokenizer(), [5, 6], max_tokens=12, sampling=params, stop_token_ids=[])
    assert a.token_ids == b.token_ids
