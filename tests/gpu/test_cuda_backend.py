"""The cuda backend end to end on a tiny quantised model: the NumPy backend's logits and
greedy tokens, for one sequence and a batch of three (chapter 9).

In the simulator a forward step takes about a second, so the model is tiny (width 32,
two layers) and the runs are a few tokens long; they still pass through every kernel:
the fused matvec (steps of up to ``FUSED_MAX_TOKENS`` tokens), the dequantise-and-GEMM
path (longer steps), both attention kernels, RMSNorm, RoPE, SwiGLU and the device argmax.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.backends.cuda_backend import FUSED_MAX_TOKENS
from llmrs_core.kernels.gpu import runtime
from llmrs_core.kernels.gpu.arrays import to_host
from llmrs_core.kv_cache.paged import PagedKVCache
from llmrs_core.testing import float32_tolerance, normalised_error, tiny_llama_config, write_tiny_llama

TINY = dict(hidden_size=32, intermediate_size=64, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64)
# float32 sums in another order through two layers of width <= 64: 6.7e-6, inside the 1e-5
LOGITS_TOLERANCE = float32_tolerance(tiny_llama_config(**TINY))
assert LOGITS_TOLERANCE <= 1e-5


@pytest.fixture(scope="module", params=["q4_1", "q8_0"])
def models(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("cuda") / f"tiny_{request.param}.gguf"
    write_tiny_llama(path, weight_type=request.param, **TINY)
    return request.param, llmrs.load(path, backend="cuda"), llmrs.load(path, backend="numpy")


def test_logits_of_a_prompt_match_numpy(models):
    kind, cuda, numpy = models
    ids = np.random.default_rng().integers(0, 64, FUSED_MAX_TOKENS + 2)  # the prefill (GEMM) path
    got, want = to_host(cuda.logits(ids)), numpy.logits(ids)
    assert normalised_error(got, want) <= LOGITS_TOLERANCE, f"{kind}: {normalised_error(got, want):.2e}"


def test_greedy_tokens_match_numpy(models):
    kind, cuda, numpy = models
    prompt = [int(i) for i in np.random.default_rng().integers(0, 64, 3)]
    got = cuda.generate(prompt, max_tokens=3).token_ids
    assert got == numpy.generate(prompt, max_tokens=3).token_ids, kind


def test_a_batch_of_three_over_the_paged_cache(models):
    """Three sequences in one step over the engine's paged KV cache, then one decode step of all three."""
    kind, cuda, numpy = models
    rng = np.random.default_rng()
    prompts = [rng.integers(0, 64, n) for n in (3, 1, 2)]
    logits = {}
    for name, model in (("cuda", cuda), ("numpy", numpy)):
        net = model.network
        cache = PagedKVCache(net.config, num_blocks=8, block_size=2, xp=net.backend.xp)
        seqs = [cache.sequence(i) for i in range(3)]
        first = net.forward_batch(list(zip(prompts, seqs)), last_only=True)
        nxt = [np.array([int(np.argmax(to_host(x)))]) for x in first]
        second = net.forward_batch(list(zip(nxt, seqs)), last_only=True)
        logits[name] = [to_host(x) for x in first + second]
    for j, (got, want) in enumerate(zip(logits["cuda"], logits["numpy"])):
        assert normalised_error(got, want) <= LOGITS_TOLERANCE, f"{kind}: sequence {j % 3}, step {j // 3}"


def test_batched_generation_gives_numpy_tokens(models):
    kind, cuda, numpy = models
    prompts = [[5, 9], [1], [30, 2, 7]]
    got = [c.token_ids for c in cuda.generate(prompts, max_tokens=2)]
    assert got == [c.token_ids for c in numpy.generate(prompts, max_tokens=2)], kind


@pytest.mark.skipif(runtime.driver_gpu_count() > 0, reason="this machine has a GPU: the cuda backend works")
def test_without_gpu_or_simulator_the_cli_says_what_to_do(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, **TINY)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run(
        [sys.executable, "-m", "llmrs_core", "generate", "--model", str(path), "--backend", "cuda", "1 2"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 1, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs an NVIDIA GPU" in lines[0] and "NUMBA_ENABLE_CUDASIM=1" in lines[0], run.stderr


def test_a_family_the_kernels_do_not_run_is_refused_in_one_sentence():
    """The cuda backend's kernels are Llama's (chapter 9); Qwen2's biases, Gemma's soft-caps and
    the other families' extras are refused by name before any weight reaches the device."""
    from pathlib import Path

    from llmrs_core.config import ConfigError

    root = Path(__file__).resolve().parents[1] / "golden" / "families"
    for name, feature in (("qwen2", "q/k/v biases"), ("gemma2", "attention soft-cap 50")):
        with pytest.raises(ConfigError, match=f"cuda backend runs the llama family without extras.*{feature}"):
            _ = llmrs.load(root / name / "model.gguf", backend="cuda").network
