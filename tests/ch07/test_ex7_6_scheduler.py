"""Exercise 7.6 — Implementing a Scheduler, on deterministic scenarios (no model needed),
then serving real requests on a tiny model with your scheduler inside the engine."""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.engine import Engine
from llmrs_core.kv_cache.paged import PagedKVCache
from llmrs_core.testing import tiny_llama_config, write_tiny_llama

CONFIG = tiny_llama_config()


def make(ex, num_blocks=16, block_size=4, **kw):
    return ex.Scheduler(PagedKVCache(CONFIG, num_blocks=num_blocks, block_size=block_size), **kw)


def req(ex, rid, prompt_len, max_tokens=4, priority=0):
    return ex.Request(rid, list(range(1, prompt_len + 1)), max_tokens, priority)


def run_step(sched):
    """What the engine does with a schedule: compute the tokens, sample one at the end."""
    chunks = sched.schedule()
    for c in chunks:
        r = c.request
        sched.cache.advance(r.request_id, c.n_tokens)
        r.num_computed += c.n_tokens
        if r.num_computed == r.num_tokens:
            r.output_ids.append(7)
            if len(r.output_ids) >= r.max_tokens:
                sched.finish(r, "length")
    return [(c.request.request_id, c.n_tokens) for c in chunks]


def test_ex7_6_admission_and_decode(ex):
    s = make(ex, max_num_seqs=2, max_num_batched_tokens=64)
    for rid, n in (("a", 5), ("b", 3), ("c", 4)):
        s.add(req(ex, rid, n))
    assert run_step(s) == [("a", 5), ("b", 3)], "FCFS, at most max_num_seqs=2 running"
    assert run_step(s) == [("a", 1), ("b", 1)], "then one decode token each"
    assert [r.request_id for r in s.waiting] == ["c"]
    assert s.has_work


def test_ex7_6_chunked_prefill_under_the_token_budget(ex):
    s = make(ex, num_blocks=64, max_num_batched_tokens=16)
    s.add(req(ex, "long", 40))
    s.add(req(ex, "short", 3))
    assert run_step(s) == [("long", 16)], "a 40-token prompt is computed in chunks of the budget"
    assert run_step(s) == [("long", 16)]
    assert run_step(s) == [("long", 8), ("short", 3)], "the leftover budget admits the next request"
    assert run_step(s) == [("long", 1), ("short", 1)]


def test_ex7_6_preemption_when_blocks_run_out(ex):
    s = make(ex, num_blocks=4, block_size=4, max_num_batched_tokens=64)
    s.add(req(ex, "old", 7, max_tokens=8))   # 2 blocks for the prompt
    s.add(req(ex, "new", 7, max_tokens=8))   # 2 blocks: the pool is full
    run_step(s)
    assert [r.request_id for r in s.running] == ["old", "new"]
    run_step(s)  # both reach 8 tokens: still 2 blocks each
    run_step(s)  # 9 tokens: "old" needs a 3rd block -> the newest running request is preempted
    assert s.num_preemptions == 1
    new = next(r for r in s.waiting if r.request_id == "new")
    assert new.num_computed == 0 and new.num_preemptions == 1 and s.waiting[0] is new
    assert "new" not in s.cache.tables, "a preempted request gives back all its blocks"
    while s.has_work:
        run_step(s)
    assert s.cache.allocator.num_free == 4, "every block returns in the end"


def test_ex7_6_impossible_requests_are_rejected(ex):
    s = make(ex, num_blocks=2, block_size=4)
    r = req(ex, "huge", 10, max_tokens=10)
    with pytest.raises(ex.RequestRejected):
        s.add(r)
    assert r.status is ex.RequestStatus.REJECTED and not s.has_work


def test_ex7_6_priority(ex):
    s = make(ex, max_num_seqs=1, policy="priority")
    s.add(req(ex, "low", 3, priority=5))
    s.add(req(ex, "high", 3, priority=1))
    s.add(req(ex, "high-later", 3, priority=1))
    assert run_step(s) == [("high", 3)]
    with pytest.raises(ValueError):
        make(ex, policy="shortest-first")


def test_ex7_6_abort_frees_blocks(ex):
    s = make(ex, num_blocks=8)
    a, b = req(ex, "a", 9, max_tokens=20), req(ex, "b", 2)
    s.add(a)
    s.add(b)
    run_step(s)
    s.abort(a)
    s.abort(b)
    assert a.status is ex.RequestStatus.ABORTED and a.finish_reason == "abort"
    assert s.cache.allocator.num_free == 8 and not s.has_work


def test_ex7_6_your_scheduler_serves_a_model(ex, tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, seed=4)
    model = llmrs.load(path)

    # no tokenizer: the prompts are token ids, and nothing ends a request but max_tokens
    engine = Engine(model.network, None, num_blocks=10, block_size=4, max_num_seqs=3,
                    max_num_batched_tokens=16, prefix_caching=False, scheduler_class=ex.Scheduler)
    prompts = [[1 + i, 2, 3, 4, 5 + i, 6] * (1 + i % 3) for i in range(5)]
    outs = engine.generate(prompts, max_tokens=5)
    for p, out in zip(prompts, outs):
        cache = model.network.new_cache(len(p) + 5)
        logits = model.network.forward(p, cache, last_only=True)[0]
        want = []
        for _ in range(5):
            want.append(int(np.argmax(logits)))
            logits = model.network.forward([want[-1]], cache, last_only=True)[0]
        assert out.token_ids == want
    assert engine.cache.allocator.num_free == 10
