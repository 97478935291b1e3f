"""Exercise 4.6 — Building a Complete Inference Loop.

References: a naive token-by-token float64 forward pass (llmrs_core.testing.naive_llama,
sharing no code with the engine) on a tiny random model, and Hugging Face
transformers on SmolLM2 (tests/golden/): log-probabilities and the greedy
continuation must match.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from llmrs_core.config import ModelConfig
from llmrs_core.formats.gguf import read_gguf
from llmrs_core.quant import dequantize_all
from llmrs_core.testing import TINY_LLAMA, naive_llama, tiny_llama_tensors, write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    params = write_tiny_llama(path, seed=11)
    with read_gguf(path) as g:
        config = ModelConfig.from_gguf(g)
    return config, params, tiny_llama_tensors(**TINY_LLAMA, seed=11)


@pytest.fixture(scope="module")
def smollm2_weights(smollm2_gguf):
    return ModelConfig.from_gguf(smollm2_gguf), dequantize_all(smollm2_gguf)


def log_softmax(x):
    x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_ex4_6_linear(ex):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    got = ex.linear(x, w)
    assert got.shape == (3, 4), f"linear([3, 5], [4, 5]) should be [3, 4] (x @ W.T), got {got.shape}"
    want = [[sum(x[t, i] * w[o, i] for i in range(5)) for o in range(4)] for t in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_ex4_6_rms_norm(ex):
    x = np.array([[3.0, 4.0], [0.0, 0.0], [1e3, -1e3]], dtype=np.float32)
    g = np.array([1.0, 2.0], dtype=np.float32)
    got = ex.rms_norm(x, g, 1e-5)
    assert got.dtype == np.float32
    rms = np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, x / rms * g, rtol=1e-5, atol=1e-6)
    assert np.all(got[1] == 0), "a zero vector stays zero: eps keeps the division finite"


def test_ex4_6_silu_and_swiglu(ex):
    x = np.linspace(-8, 8, 33, dtype=np.float32)
    np.testing.assert_allclose(ex.silu(x), x / (1 + np.exp(-x.astype(np.float64))), rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        extremes = ex.silu(np.array([-1000.0, 1000.0], dtype=np.float32))
    assert abs(extremes[0]) < 1e-6 and extremes[1] == pytest.approx(1000.0), (
        f"silu(-1000) should be ~0 and silu(1000) ~1000, got {extremes}"
    )
    gate, up = np.array([[1.0, -2.0]], dtype=np.float32), np.array([[3.0, 0.5]], dtype=np.float32)
    np.testing.assert_allclose(ex.swiglu(gate, up), ex.silu(gate) * up, rtol=1e-6)


def test_ex4_6_decoder_block_on_a_tiny_model(ex, tiny):
    config, params, weights = tiny
    ids = [4, 8, 15, 16, 23, 42]
    _, hidden = naive_llama(weights, params, ids)
    x = weights["token_embd.weight"][ids].astype(np.float32)
    positions = np.arange(len(ids))
    for layer in range(config.n_layers):
        x = ex.decoder_block(x, weights, layer, config, positions)
        assert x.shape == (len(ids), config.hidden_size), f"block {layer} returned shape {x.shape}"
        err = np.abs(x - hidden[layer]).max()
        assert err < 1e-4, (
            f"after block {layer} the residual stream is off by {err:.3g}; check the order "
            "norm -> q/k/v -> RoPE -> attention -> o-proj -> residual add -> norm -> MLP -> add"
        )


def test_ex4_6_forward_on_a_tiny_model(ex, tiny, tmp_path):
    config, params, weights = tiny
    ids = [1, 2, 3, 60, 61]
    want, _ = naive_llama(weights, params, ids)
    got = ex.forward(ids, weights, config)
    assert got.shape == (len(ids), config.vocab_size)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    untied = tmp_path / "untied.gguf"
    write_tiny_llama(untied, tie_embeddings=False, seed=2)
    w2 = tiny_llama_tensors(**TINY_LLAMA, tie_embeddings=False, seed=2)
    with read_gguf(untied) as g:
        c2 = ModelConfig.from_gguf(g)
    want2, _ = naive_llama(w2, {**params, "tie_embeddings": False}, ids)
    np.testing.assert_allclose(ex.forward(ids, w2, c2), want2, rtol=1e-4, atol=1e-4,
                               err_msg="an untied model has its own output.weight")


@pytest.mark.model
def test_ex4_6_forward_matches_transformers_on_smollm2(ex, smollm2_weights, hf_golden):
    config, weights = smollm2_weights
    for i in (0, 2):
        lp = log_softmax(ex.forward(hf_golden[f"ids_{i}"].tolist(), weights, config))
        err = np.abs(lp[-1, hf_golden[f"last_ids_{i}"]] - hf_golden[f"last_logprobs_{i}"]).max()
        assert err < 1e-3, f"prompt {i}: your next-token log-probabilities differ from transformers' by {err:.3g}"
        np.testing.assert_array_equal(lp.argmax(-1), hf_golden[f"argmax_{i}"])


def test_ex4_6_greedy_generate_loop(ex):
    script = {(): 5, (5,): 7, (5, 7): 9, (5, 7, 9): 2}
    calls = []

    def logits_fn(seq):
        calls.append(list(seq))
        nxt = script.get(tuple(seq[2:]), 0)
        out = np.zeros((len(seq), 10), dtype=np.float32)
        out[-1, nxt] = 1.0
        return out

    assert ex.greedy_generate(logits_fn, [1, 1], max_tokens=10, eos_token_id=2) == [5, 7, 9], (
        "stop at the end-of-sequence token, without including it"
    )
    assert calls[1] == [1, 1, 5], "each step runs the model on the whole sequence so far"
    assert ex.greedy_generate(logits_fn, [1, 1], max_tokens=2) == [5, 7]
    assert ex.greedy_generate(logits_fn, [1, 1], max_tokens=0) == []


@pytest.mark.model
def test_ex4_6_greedy_generation_matches_transformers(ex, smollm2_weights, hf_golden):
    config, weights = smollm2_weights
    want = hf_golden["greedy_0"].tolist()
    eos = 2  # <|im_end|>, where transformers stopped
    got = ex.greedy_generate(lambda s: ex.forward(s, weights, config), hf_golden["ids_0"].tolist(), 32, eos)
    assert got == [t for t in want if t != eos], "your greedy continuation differs from transformers'"
