"""The continuous-batching engine: invariants on the tiny model (hypothesis) and on SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmrs_core as llmrs
from llmrs_core.engine import Engine, RadixCache, RequestRejected, RequestStatus
from llmrs_core.kv_cache.paged import BlockAllocator
from llmrs_core.testing import ByteTokenizer, float32_tolerance, longest_cached_prefix, write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "bytes.gguf"
    write_tiny_llama(path, vocab_size=256, context_length=512, seed=12)
    return llmrs.load(path).network


def alone(net, prompt, max_tokens):
    """Greedy tokens for one prompt on its own, with a contiguous cache (no engine)."""
    cache = net.new_cache(len(prompt) + max_tokens)
    logits = net.forward(prompt, cache, last_only=True)[0]
    out = []
    for _ in range(max_tokens):
        t = int(np.argmax(logits))
        if t == 0:
            break
        out.append(t)
        logits = net.forward([t], cache, last_only=True)[0]
    return out


PROMPTS = [[(7 * i + j) % 250 + 3 for j in range(5 + 3 * i)] for i in range(16)]  # lengths 5..50


def test_batched_equals_alone_and_blocks_come_back(tiny):
    engine = Engine(tiny, ByteTokenizer(), num_blocks=128, block_size=4, max_num_batched_tokens=64)
    outs = engine.generate(PROMPTS, max_tokens=8)
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == alone(tiny, prompt, 8)
    assert engine.steps < sum(len(p) for p in PROMPTS), "requests must share steps"
    free, cached = engine.cache.allocator.num_free, engine.prefix_cache.num_blocks
    assert free + cached == 128, "every block is free or held by the prefix cache"
    engine.prefix_cache.clear()
    assert engine.cache.allocator.num_free == 128 and not engine.cache.tables


def test_preemption_recomputes_to_the_same_tokens(tiny):
    engine = Engine(tiny, ByteTokenizer(), num_blocks=12, block_size=4, max_num_seqs=8, prefix_caching=False)
    outs = engine.generate(PROMPTS[:8], max_tokens=10)
    assert engine.scheduler.num_preemptions > 0, "a 12-block pool must preempt"
    for prompt, out in zip(PROMPTS[:8], outs):
        assert out.token_ids == alone(tiny, prompt, 10)
    assert engine.cache.allocator.num_free == 12


def test_prefix_cache_hit_gives_the_same_tokens(tiny):
    shared = list(range(10, 42))
    prompts = [shared + [50 + i, 60 + i] for i in range(4)]
    engine = Engine(tiny, ByteTokenizer(), num_blocks=64, block_size=4)
    first = engine.generate(prompts[:1], max_tokens=6)
    rest = engine.generate(prompts[1:], max_tokens=6)
    assert engine.prefix_cache.hit_tokens >= 3 * 32, "the shared 32-token prefix is reused"
    for prompt, out in zip(prompts, first + rest):
        assert out.token_ids == alone(tiny, prompt, 6)


def test_abort_frees_blocks_at_once(tiny):
    engine = Engine(tiny, ByteTokenizer(), num_blocks=32, block_size=4, prefix_caching=False)
    a = engine.add_request(PROMPTS[10], max_tokens=50)
    b = engine.add_request(PROMPTS[3], max_tokens=50)
    engine.step()
    engine.step()
    assert engine.cache.allocator.num_free < 32
    engine.abort(a)
    engine.abort(b)
    assert engine.cache.allocator.num_free == 32
    assert engine.requests[a].status is RequestStatus.ABORTED and not engine.has_unfinished()


def test_impossible_requests_are_rejected_at_once(tiny):
    engine = Engine(tiny, ByteTokenizer(), num_blocks=4, block_size=4)
    with pytest.raises(RequestRejected, match="whole pool has 4"):
        engine.add_request(list(range(1, 20)), max_tokens=10)
    with pytest.raises(RequestRejected, match="context length"):
        engine.add_request([1] * 500, max_tokens=100)
    with pytest.raises(RequestRejected, match="empty"):
        engine.add_request([], max_tokens=4)
    assert not engine.has_unfinished()


def test_priority_policy(tiny):
    engine = Engine(tiny, ByteTokenizer(), num_blocks=64, block_size=4, max_num_seqs=1, policy="priority")
    low = engine.add_request([5, 6, 7], max_tokens=2, priority=5)
    high = engine.add_request([8, 9, 10], max_tokens=2, priority=0)
    engine.step()
    assert engine.requests[high].status is RequestStatus.RUNNING
    assert engine.requests[low].status is RequestStatus.WAITING
    with pytest.raises(ValueError):
        Engine(tiny, ByteTokenizer(), policy="random")


EVENTS = st.lists(
    st.tuples(st.sampled_from(["add", "add", "step", "step", "abort"]), st.integers(1, 30), st.integers(1, 12)),
    min_size=1, max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(EVENTS, st.integers(4, 24), st.booleans())
def test_random_arrivals_and_aborts_never_deadlock_or_leak(tiny, events, num_blocks, prefix):
    engine = Engine(tiny, ByteTokenizer(), num_blocks=num_blocks, block_size=4, max_num_seqs=4,
                    max_num_batched_tokens=16, prefix_caching=prefix)
    ids = []
    for kind, a, b in events:
        if kind == "add":
            try:
                ids.append(engine.add_request([(a * k) % 200 + 1 for k in range(a)], max_tokens=b))
            except RequestRejected:
                pass
        elif kind == "step":
            engine.step()
        elif ids:
            engine.abort(ids[a % len(ids)])
    for _ in engine.run():  # drains; raises if no progress is possible
        pass
    for rid in ids:
        assert engine.requests[rid].finished
    cached = engine.prefix_cache.num_blocks if engine.prefix_cache else 0
    assert engine.cache.allocator.num_free + cached == num_blocks, "leaked blocks"


# -- the radix tree against a naive model ---------------------------------------------

SEQS = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=24), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(SEQS, st.lists(st.integers(0, 3), min_size=1, max_size=24))
def test_radix_match_is_the_longest_cached_block_prefix(seqs, query):
    bs = 4
    alloc = BlockAllocator(1000)
    tree = RadixCache(alloc, bs)
    stored: list[tuple[int, ...]] = []
    for s in seqs:
        blocks = [alloc.allocate() for _ in range(len(s) // bs)]
        tree.insert(s, blocks)
        stored.append(tuple(s[: len(blocks) * bs]))
        for b in blocks:
            alloc.decref(b)  # the "request" lets go; the tree keeps what it took
    matched, blocks, _ = tree.match_prefix(query)
    best = longest_cached_prefix(stored, query, bs)
    assert matched == best and len(blocks) == matched // bs
    assert all(alloc.ref_counts[b] >= 1 for b in blocks), "matched blocks are alive"
    tree.clear()
    assert alloc.num_free == 1000, "clearing an unlocked tree returns every block"


def test_radix_locks_protect_and_lru_evicts():
    alloc = BlockAllocator(8)
    tree = RadixCache(alloc, 2)
    for seq in ([1, 2, 3, 4], [1, 2, 5, 6], [7, 8]):
        blocks = [alloc.allocate() for _ in range(len(seq) // 2)]
        tree.insert(seq, blocks)
        for b in blocks:
            alloc.decref(b)
    assert alloc.num_used == 4  # [1,2] shared, [3,4], [5,6], [7,8]
    n, _, node = tree.match_prefix([1, 2, 5, 6, 9])
    assert n == 4
    tree.lock(node)
    freed = tree.evict(10)
    assert freed == 2 and alloc.num_used == 2, "only the unlocked leaves [3,4] and [7,8] go"
    tree.unlock(node)
    assert tree.evict(10) == 2 and alloc.num_used == 0
    with pytest.raises(RuntimeError):
        tree.unlock(node)


# -- on SmolLM2 ---------------------------------------------------------------------------


@pytest.mark.model
def test_smollm2_sixteen_requests_batched_equal_alone(model_path):
    """Batched and alone compute the same sums in other orders, so their logits differ by float
    rounding (``float32_tolerance``) and greedy tokens agree, except where two logits are closer
    than that: there the two runs may pick either, and must agree up to that step. On the float
    kernels (exact), which choose BLAS or Numba by the step's size; the int8 path is bitwise
    batch-invariant (test_batch_invariance.py). Four of the sixteen are run alone: the first, the
    last, and one of each prompt length (every row of a batch against its run alone, on a tiny
    model: test_batched_equals_alone_and_blocks_come_back)."""
    model = llmrs.load(model_path, exact=True)
    prompts = [f"Question {i}: what is {i} plus {i * 3}? Answer:" + " Let me think." * (i % 4) for i in range(16)]
    batched = model.generate(prompts, max_tokens=6)
    # two runs' logits may each be off by the tolerance (normalised to max |logit|)
    tie = 2 * float32_tolerance(model.config)
    for i in (0, 5, 10, 15):  # i % 4 = 0, 1, 2, 3: each length of prompt
        p, out = prompts[i], batched[i]
        solo = model.generate(p, max_tokens=6)
        if out.token_ids == solo.token_ids:
            continue
        # each run's tokens, with the end-of-text token that stopped it (stop_reason) as its last
        runs = [c.token_ids + ([c.stop_reason] if isinstance(c.stop_reason, int) else []) for c in (out, solo)]
        step = next((j for j, (a, b) in enumerate(zip(*runs)) if a != b), None)
        assert step is not None, f"{p!r}: batched {runs[0]} and alone {runs[1]} differ only in length"
        logits = model.logits(model.tokenizer.encode(p) + runs[1][:step])[-1].astype(np.float64)
        gap = abs(logits[runs[1][step]] - logits[runs[0][step]]) / np.abs(logits).max()
        assert gap <= tie, (
            f"{p!r}: batched {runs[0]} and alone {runs[1]} first differ at step {step}, where the two "
            f"tokens' logits are {gap:.2e} of max |logit| apart: more than float rounding ({tie:.2e})"
        )


@pytest.mark.model
def test_smollm2_prefix_hit_and_preemption_do_not_change_outputs(model_path):
    model = llmrs.load(model_path)
    net, tok = model.network, model.tokenizer
    system = "<|im_start|>system\nYou are a concise assistant who answers in one sentence.<|im_end|>\n"
    prompts = [tok.encode(system + f"<|im_start|>user\nName a colour, number {i}.<|im_end|>\n<|im_start|>assistant\n")
               for i in range(4)]
    want = [alone(net, p, 6) for p in prompts]
    engine = Engine(net, tok, num_blocks=64, block_size=8)
    first = engine.generate(prompts[:1], max_tokens=6)
    rest = engine.generate(prompts[1:], max_tokens=6)
    assert engine.prefix_cache.hit_tokens > 0
    assert [c.token_ids for c in first + rest] == [w[: len(c.token_ids)] for w, c in zip(want, first + rest)]
    # 33-token prompts fill 9 blocks of 4; two fit in 18 blocks, then both need a 10th: preemption
    small = Engine(net, tok, num_blocks=18, block_size=4, prefix_caching=False)
    outs = small.generate(prompts, max_tokens=6)
    assert small.scheduler.num_preemptions > 0
    assert [c.token_ids for c in outs] == [w[: len(c.token_ids)] for w, c in zip(want, outs)]


def test_release_forgets_finished_requests_only(tiny):
    engine = Engine(tiny, ByteTokenizer(), num_blocks=16, block_size=4)
    done = engine.add_request([1, 2, 3], max_tokens=2)
    list(engine.run())
    running = engine.add_request([4, 5, 6], max_tokens=4)
    with pytest.raises(ValueError, match="still in flight"):
        engine.release(running)
    engine.release(done)
    engine.release("never-seen")  # unknown ids are ignored
    assert done not in engine.requests and running in engine.requests
    with pytest.raises(KeyError):
        engine.request_metrics(done)
    engine.abort(running)
    engine.release(running)
    assert not engine.requests
