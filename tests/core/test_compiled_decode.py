"""The compiled decode step (``kernels.cpu.decode``, the numba backend's default) computes the layer loop's bits.

``LlamaModel.forward_batch`` runs a step whose sequences each add one token through the
backend's compiled program, and its own layer loop otherwise (prompts, mixed steps, and every step
with ``LLMRS_COMPILED_DECODE=0``). Both call the same kernels in the same order, and none of them
is compiled with ``fastmath``, so the compiled step's copies round as the loop's do: the logits are
equal, bit for bit. That is what the int8 path's batch invariance needs (a decode step through
the program, a prompt through the loop); ``test_batch_invariance`` checks the engine's side.
Checked on every family the program takes (biases, q/k norms, scaled, partial and longrope
RoPE, fused matrices) and every int8 copy form, in a contiguous cache and the engine's paged
pool; the families it does not take keep the loop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.engine.engine import Engine
from llmrs_core.kernels.cpu import int8
from llmrs_core.kv_cache.contiguous import CacheFullError
from llmrs_core.kv_cache.paged import PagedKVCache
from llmrs_core.quant.requantize import requantize_gguf
from llmrs_core.testing import write_tiny_llama

pytestmark = [pytest.mark.core, pytest.mark.skipif(int8.int8_unavailable() is not None,
                                                   reason=f"no int8 path here: {int8.int8_unavailable()}")]

FAMILIES = Path(__file__).resolve().parents[1] / "golden" / "families"
COMPILED = ["llama3", "llama2-linear", "mistral", "qwen2", "qwen3", "phi3"]
STEPS = 10
FOLLOW = [7, 30, 2, 51, 19, 44, 8, 60, 13, 25]  # the decode steps' tokens, below every fixture's vocabulary


def load_compiled(path) -> llmrs.Model:
    """``path`` on the numba backend as a user loads it (the compiled step is on unless switched off)."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv("LLMRS_COMPILED_DECODE", raising=False)
        return llmrs.load(path, backend="numba")


class Spy:
    """Counts the steps the compiled program took (a test must not pass by never running it)."""

    def __init__(self, net):
        self.net, self.taken, self.run = net, 0, net.decode.run

    def __call__(self, x, step):
        out = self.run(x, step)
        self.taken += out is not None
        return out


def decode(net, ids: list[int], compiled: bool, cache) -> tuple[np.ndarray, list[int]]:
    """The prompt's last logits and those of decode steps feeding :data:`FOLLOW`, stacked; and their argmaxes."""
    program = net.decode
    net.decode = program if compiled else None
    try:
        logits = [net.forward(ids, cache, last_only=True)[0]]
        for token in FOLLOW:  # the same tokens for both: a near tie must not send them apart
            logits.append(net.forward([token], cache, last_only=True)[0])
    finally:
        net.decode = program
    return np.concatenate(logits), [int(np.argmax(row)) for row in logits]


def assert_agrees(net, ids: list[int], what: str) -> None:
    def fresh(paged: bool):
        if not paged:
            return net.new_cache(len(ids) + STEPS)
        pool = PagedKVCache(net.config, num_blocks=2 * (len(ids) + STEPS) // 4 + 2, block_size=4)
        pool.add_sequence(0)
        return pool.sequence(0)

    for paged in (False, True):
        spy = Spy(net)
        net.decode.run = spy
        try:
            got, _ = decode(net, ids, True, fresh(paged))
        finally:
            net.decode.run = spy.run
        want, _ = decode(net, ids, False, fresh(paged))
        where = f"{what}, {'paged pool' if paged else 'contiguous cache'}"
        assert spy.taken == STEPS, f"{where}: the compiled step ran {spy.taken} of {STEPS} decode steps"
        differ = np.flatnonzero((got != want).any(axis=-1))
        assert differ.size == 0, (
            f"{where}: compiled decode's logits are not the layer loop's bits from step {differ[0]} on (step 0 "
            f"is the prompt's; largest difference {float(np.abs(got - want).max()):.2g}): an operation of "
            "kernels/cpu/decode.py is not the loop's (another kernel, another order, a missing term), or a "
            "kernel it calls was compiled with fastmath (its copy there rounds otherwise)")


@pytest.fixture(scope="module")
def requantized(tmp_path_factory):
    def make(family: str, target: str) -> llmrs.Model:
        path = tmp_path_factory.mktemp(family) / f"{target}.gguf"
        requantize_gguf(FAMILIES / family / "model.gguf", path, target)
        return load_compiled(path)

    return make


@pytest.mark.parametrize("family", COMPILED)
@pytest.mark.parametrize("target", ["q8_0", "q4_1"])
def test_every_family_decodes_compiled_like_the_loop(requantized, family, target):
    model = requantized(family, target)
    assert model.network.decode is not None, f"{family} in {target}: the numba backend built no compiled step"
    assert_agrees(model.network, list(range(3, 40)), f"{family} in {target}")


@pytest.mark.parametrize("weight_type", ["q4_0", "q5_0", "q4_k", "q6_k", "q3_k", "q5_1", "q2_k"])
def test_every_int8_copy_form_decodes_compiled_like_the_loop(tmp_path, weight_type):
    """Q4 (Q4_0), Q5_0's planes, Q4_K's scales, Q6_K's and Q3_K's planes, and the unsigned "q8a" form
    (Q5_1's 32-weight blocks, Q2_K's 16): each form's branch of the one int8 driver."""
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, weight_type=weight_type, hidden_size=256, intermediate_size=512, n_heads=4,
                     n_kv_heads=2, vocab_size=96, seed=3)
    model = load_compiled(path)
    assert model.network.decode is not None, f"{weight_type}: the numba backend built no compiled step"
    assert_agrees(model.network, list(range(1, 30)), weight_type)


def test_batched_decode_in_the_engine_takes_the_compiled_step(requantized):
    """Several sequences decoding together in the engine's pool, one row each: the compiled step
    takes those steps, and each sequence's greedy tokens and their log-probabilities are the loop's."""
    model = requantized("qwen2", "q8_0")
    net = model.network
    prompts = [list(range(5, 5 + n)) for n in (3, 17, 30)]

    def run() -> list:
        engine = Engine(net, model.tokenizer, num_blocks=64, block_size=4)
        ids = [engine.add_request(p, max_tokens=8, ignore_eos=True, logprobs=0) for p in prompts]
        logprobs = {rid: [] for rid in ids}
        for out in engine.run():
            logprobs[out.request_id] += [lp.logprob for lp in out.logprobs]
        return [(engine.completion(rid).token_ids, logprobs[rid]) for rid in ids]

    spy = Spy(net)
    net.decode.run = spy
    try:
        compiled = run()
    finally:
        net.decode.run = spy.run
    program, net.decode = net.decode, None
    try:
        loop = run()
    finally:
        net.decode = program
    assert spy.taken > 0, "batched decode: the compiled step took no step"
    for n, ((tokens, lps), (want_tokens, want_lps)) in enumerate(zip(compiled, loop)):
        assert tokens == want_tokens, f"batched decode, sequence {n}: greedy tokens {tokens}, the loop's {want_tokens}"
        assert lps == want_lps, f"batched decode, sequence {n}: log-probabilities not the loop's bits"


def test_families_it_does_not_take_keep_the_loop(requantized):
    """GeGLU (Gemma) has no compiled step: every step runs the loop, and still decodes."""
    model = requantized("gemma2", "q8_0")
    assert model.network.decode is None
    assert model.generate(list(range(3, 12)), max_tokens=4).token_ids


def test_a_full_contiguous_cache_still_raises_in_the_loop(tmp_path):
    """The compiled step refuses a step that does not fit (it writes nothing), so the loop raises
    CacheFullError as before, and the cache is as it was."""
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, weight_type="q8_0")
    net = load_compiled(path).network
    assert net.decode is not None
    cache = net.new_cache(4)
    net.forward([1, 2, 3, 4], cache)
    with pytest.raises(CacheFullError):
        net.forward([5], cache)
    assert cache.length == 4


def test_on_by_default_and_switched_off_by_the_environment(tmp_path, monkeypatch):
    """The numba backend builds the compiled step unless ``LLMRS_COMPILED_DECODE=0`` (or
    ``NumbaBackend(compiled_decode=False)``) asks for the layer loop on every step."""
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, weight_type="q8_0")
    monkeypatch.delenv("LLMRS_COMPILED_DECODE", raising=False)
    assert llmrs.load(path, backend="numba").network.decode is not None, "the compiled step is not on by default"
    monkeypatch.setenv("LLMRS_COMPILED_DECODE", "0")
    assert llmrs.load(path, backend="numba").network.decode is None, "LLMRS_COMPILED_DECODE=0 did not keep the loop"


def test_no_kernel_the_step_shares_with_the_loop_uses_fastmath():
    """The bit equality above rests on this: a fastmath kernel's copy inside ``decode_layers`` may be
    contracted or reordered otherwise than the loop's (it happened with RoPE), in some processes only."""
    from llmrs_core.kernels.cpu import activations, decode, ops

    shared = [ops.rms_norm, ops.rope, ops.rope_tables, ops.swiglu, ops.attention, ops.paged_decode_attention,
              ops._scores_in_place, ops._scores_transposed, ops._weigh, activations.quantized, int8.int8_matmul,
              decode.decode_layers]
    fast = [f.py_func.__qualname__ for f in shared if f.targetoptions.get("fastmath")]
    assert not fast, f"compiled with fastmath: {fast}; the compiled decode step would no longer be the loop's bits"
