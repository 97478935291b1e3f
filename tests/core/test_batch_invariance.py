"""Batch invariance on the default path (the numba backend's int8 kernels): a greedy request's
tokens depend on nothing but the request.

Not on whether its prefix came from the prefix cache, what it was batched with, the
chunked-prefill size, or a preemption and recompute. The backend holds this by design (see
``backends.numba_backend``): every kernel of the int8 path computes each row, and each query,
alone, so the numbers of a token are the same bits in any step. That is a bitwise property, so
these tests compare tokens and log-probabilities for equality, with no tolerance.

One machine: a token's bits may differ on another CPU (AVX2 against AVX-512 reductions); the
tests compare runs in one process.

The SmolLM2 cases (issue 26) are marked ``slow``: ``make test-slow`` runs them (365 s of the file's
395 s, measured on 2 busy cores); ``make test`` keeps the tiny model's property test, which
draws the same cases (shared prefixes, chunk budgets, batches, tight pools, prompts past
``INT8_ROWS``) and compares tokens and log-probabilities as exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmrs_core as llmrs
from llmrs_core.engine.engine import Engine
from llmrs_core.kernels.cpu import int8
from llmrs_core.kernels.cpu import matmul as kmatmul
from llmrs_core.kernels.cpu.packing import pack_affine_q4, pack_q8
from llmrs_core.kv_cache.paged import blocks_for

pytestmark = pytest.mark.core

NO_INT8 = int8.int8_unavailable()
needs_int8 = pytest.mark.skipif(NO_INT8 is not None, reason=f"the int8 path is not compiled here: {NO_INT8}")


def run(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """Each prompt's greedy tokens and their log-probabilities, all requests in ``engine`` at once."""
    ids = [engine.add_request(p, max_tokens=max_tokens, ignore_eos=True, logprobs=0) for p in prompts]
    logprobs: dict[str, list[float]] = {rid: [] for rid in ids}
    for out in engine.run():
        if out.request_id in logprobs:
            logprobs[out.request_id] += [lp.logprob for lp in out.logprobs]
    return [(engine.completion(rid).token_ids, logprobs[rid]) for rid in ids]


def first_difference(got: tuple[list[int], list[float]], want: tuple[list[int], list[float]]) -> str:
    step = next((i for i, (a, b) in enumerate(zip(got[0], want[0])) if a != b), None)
    if step is None:
        step = next((i for i, (a, b) in enumerate(zip(got[1], want[1])) if a != b), len(got[0]))
        return f"the same tokens, but log-probabilities differ from step {step} (the arithmetic changed)"
    return f"tokens differ from step {step}: {got[0][step:step + 4]} against {want[0][step:step + 4]}"


# -- the kernel that keeps a matrix without an int8 copy row by row ------------------------------


@pytest.mark.parametrize("kind", ["q4", "q8_block16"])
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 70), start=st.integers(0, 69), seed=st.integers(0, 2**16))
def test_matmul_rowwise_computes_each_row_alone(kind, rows, start, seed):
    """A row's product is the same bits whatever rows share the call (Q6_K-like 16-weight blocks
    too): the int8 path's kernel for matrices without an int8 copy."""
    rng = np.random.default_rng(seed)
    cols, n = 64, 70
    if kind == "q4":
        w = pack_affine_q4(rng.integers(0, 16, (40, cols), dtype=np.uint8),
                           rng.uniform(0.01, 0.1, (40, 2)).astype(np.float32),
                           rng.uniform(-0.5, 0.5, (40, 2)).astype(np.float32), "Q4_1")
    else:
        w = pack_q8(rng.integers(-128, 128, (40, cols)).astype(np.int8),
                    rng.uniform(0.01, 0.1, (40, 4)).astype(np.float32), "Q6_K", block=16)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    whole = kmatmul.matmul_rowwise(x, w)
    stop = min(n, start + rows)
    np.testing.assert_array_equal(kmatmul.matmul_rowwise(x[start:stop], w), whole[start:stop],
                                  f"rows {start}..{stop} alone differ from the same rows in a call of {n}")


# -- property: a tiny model in random batch compositions ----------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from llmrs_core.testing import write_tiny_llama

    path = tmp_path_factory.mktemp("invariance") / "tiny.gguf"
    write_tiny_llama(path, weight_type="q4_1", byte_tokenizer=True, seed=11, context_length=512)
    return llmrs.load(path, backend="numba")


@needs_int8
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_tiny_models_greedy_requests_do_not_depend_on_their_batch(tiny, data):
    """Random prompts (some sharing prefixes, some longer than kmatmul.INT8_ROWS), random step
    budgets and pool sizes: every request's tokens and log-probabilities equal its run alone."""
    net, vocab = tiny.network, tiny.config.vocab_size
    base = data.draw(st.lists(st.integers(0, vocab - 1), min_size=200, max_size=200), label="base")
    prompts = []
    for _ in range(data.draw(st.integers(2, 6), label="requests")):
        shared = data.draw(st.sampled_from([0, 17, 40, 150]), label="shared prefix")
        own = data.draw(st.integers(1, 160), label="own tokens")
        prompts.append(base[:shared] + data.draw(st.lists(st.integers(0, vocab - 1), min_size=own, max_size=own)))
    budget = data.draw(st.sampled_from([7, 64, 512]), label="max_num_batched_tokens")
    max_tokens = 5
    # a pool that fits the longest request and little more forces preemptions
    tight = data.draw(st.booleans(), label="tight pool")
    blocks = max(blocks_for(len(p) + max_tokens, 8) for p in prompts) + 2 if tight else 512
    alone = [run(Engine(net, tiny.tokenizer, prefix_caching=False), [p], max_tokens)[0] for p in prompts]
    engine = Engine(net, tiny.tokenizer, num_blocks=blocks, block_size=8, max_num_batched_tokens=budget)
    warm = run(engine, prompts[:1], max_tokens)  # the others may find its blocks cached
    together = warm + run(engine, prompts[1:], max_tokens)
    for i, (got, want) in enumerate(zip(together, alone)):
        assert got == want, f"request {i} ({len(prompts[i])} tokens) batched: {first_difference(got, want)}"


# -- SmolLM2: the cases of issue 26 ------------------------------------------------------------

TOKENS = 48
LENGTHS = (40, 200, 600)


@pytest.fixture(scope="module")
def smollm2(model_path):
    return llmrs.load(model_path)


@pytest.fixture(scope="module")
def text_ids(smollm2):
    text = " ".join(f"Note {i}: the river {['rises', 'falls', 'bends', 'widens'][i % 4]} near town {i * 7 % 13},"
                    f" and the ferry runs {i % 5 + 1} times a day." for i in range(120))
    ids = smollm2.tokenizer.encode(text)
    assert len(ids) >= 1400
    return ids


@pytest.fixture(scope="module")
def cold(smollm2, text_ids):
    """Each prompt alone in a fresh engine with no prefix cache: the reference."""
    return {n: run(Engine(smollm2.network, smollm2.tokenizer, prefix_caching=False), [text_ids[:n]], TOKENS)[0]
            for n in LENGTHS}


@needs_int8
@pytest.mark.model
@pytest.mark.slow
def test_smollm2_warm_prefix_cache_gives_the_cold_tokens(smollm2, text_ids, cold):
    engine = Engine(smollm2.network, smollm2.tokenizer)
    run(engine, [text_ids[: n // 2 + 5] for n in LENGTHS], 4)  # caches the first half of each prompt
    warm = run(engine, [text_ids[:n] for n in LENGTHS], TOKENS)
    assert engine.prefix_cache.hit_tokens >= sum(n // 2 - 16 for n in LENGTHS), "the prefixes were not reused"
    for n, got in zip(LENGTHS, warm):
        assert got == cold[n], f"{n}-token prompt through the prefix cache: {first_difference(got, cold[n])}"


@needs_int8
@pytest.mark.model
@pytest.mark.slow
def test_smollm2_chunked_prefill_gives_the_cold_tokens(smollm2, text_ids, cold):
    for n in LENGTHS:
        engine = Engine(smollm2.network, smollm2.tokenizer, max_num_batched_tokens=64, prefix_caching=False)
        got = run(engine, [text_ids[:n]], TOKENS)[0]
        assert got == cold[n], f"{n}-token prompt in chunks of 64: {first_difference(got, cold[n])}"


@needs_int8
@pytest.mark.model
@pytest.mark.slow
def test_smollm2_batched_with_others_gives_the_cold_tokens(smollm2, text_ids, cold):
    """The three prompts together with 7 others of mixed lengths (short and past INT8_ROWS)."""
    others = [text_ids[700 + 37 * i: 700 + 37 * i + n] for i, n in enumerate((30, 90, 150, 260, 8, 400, 55))]
    mine = [text_ids[:n] for n in LENGTHS]
    engine = Engine(smollm2.network, smollm2.tokenizer, prefix_caching=False)
    outs = run(engine, [*others[:4], *mine, *others[4:]], TOKENS)
    for n, got in zip(LENGTHS, outs[4:7]):
        assert got == cold[n], f"{n}-token prompt batched with 9 others: {first_difference(got, cold[n])}"


@needs_int8
@pytest.mark.model
@pytest.mark.slow
def test_smollm2_preempted_and_recomputed_gives_the_cold_tokens(smollm2, text_ids, cold):
    """A pool of exactly the request's own needs: admitted beside an older, short request, it is
    preempted (the newest running request is the victim) when the older one grows, waits for
    the older one to finish, and is recomputed."""
    for n in LENGTHS:
        need = blocks_for(n + TOKENS, 16)
        # the whole prompt in one step: recomputed once, after the older request finishes
        engine = Engine(smollm2.network, smollm2.tokenizer, num_blocks=need, prefix_caching=False,
                        max_num_batched_tokens=1024)
        older = engine.add_request(text_ids[900:948], max_tokens=16, ignore_eos=True)
        got = run(engine, [text_ids[:n]], TOKENS)[0]
        mine = [r for rid, r in engine.requests.items() if rid != older][0]
        assert mine.num_preemptions >= 1, f"{n}-token prompt: the pool of {need} blocks forced no preemption"
        assert got == cold[n], f"{n}-token prompt after a preemption: {first_difference(got, cold[n])}"
