"""``Engine.step_stats()``: the snapshot the server reads the engine through (issue 31)."""

from __future__ import annotations

import math

import pytest

import llmrs_core as llmrs
from llmrs_core.engine import Engine, StepStats
from llmrs_core.testing import ByteTokenizer, write_tiny_llama

BLOCK = 4
PROMPTS = {"a": [5, 6, 7, 8, 9], "b": [20, 21, 22, 23, 24, 25, 26, 27, 28], "c": [40, 41, 42, 43, 44, 45]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "bytes.gguf"
    write_tiny_llama(path, vocab_size=256, context_length=512, seed=12)
    return llmrs.load(path).network


def stepped_once(tiny) -> Engine:
    """Three requests, room for two: after one step two run (prompts computed, a token each), one waits."""
    engine = Engine(tiny, ByteTokenizer(), num_blocks=16, block_size=BLOCK, max_num_seqs=2)
    for rid, prompt in PROMPTS.items():
        engine.add_request(prompt, max_tokens=5, request_id=rid, ignore_eos=True)
    engine.step()
    return engine


def test_a_snapshot_counts_the_queues_and_the_blocks(tiny):
    engine = stepped_once(tiny)
    stats = engine.step_stats()
    assert isinstance(stats, StepStats)
    assert stats.running == ("a", "b") and stats.num_running == 2 and stats.num_waiting == 1
    # each running request holds the blocks of its computed prompt; the waiting one holds none
    used = math.ceil(len(PROMPTS["a"]) / BLOCK) + math.ceil(len(PROMPTS["b"]) / BLOCK)
    assert stats.kv_blocks_used == used and stats.kv_blocks_total == 16
    assert stats.kv_cache_usage == used / 16
    assert stats.num_preemptions == 0 and stats.prefix_cache_hits == 0  # no prompt shares a prefix
    assert stats.requests == {}, "no request was named"


def test_a_snapshot_has_the_named_requests_it_knows(tiny):
    engine = stepped_once(tiny)
    stats = engine.step_stats(["a", "c", "nobody"])
    assert set(stats.requests) == {"a", "c"}, "an unknown id is left out, not an error"
    a, c = stats.requests["a"], stats.requests["c"]
    assert a.prompt_tokens == 5 and a.computed_tokens == 5 and len(a.output_token_ids) == 1
    assert a.timing.first_token_time is not None and len(a.timing.token_times) == 1
    assert c.prompt_tokens == 6 and c.computed_tokens == 0 and c.output_token_ids == () and c.text == ""


def test_a_snapshot_stays_as_it_was_and_names_its_engine(tiny):
    engine = stepped_once(tiny)
    before = engine.step_stats(["a"])
    for _ in engine.run():
        pass
    after = engine.step_stats(["a"])
    assert len(before.requests["a"].output_token_ids) == 1 and len(after.requests["a"].output_token_ids) == 5
    assert after.requests["a"].text == engine.completion("a").text
    assert before.running == ("a", "b") and after.running == () and after.num_waiting == 0
    assert after.engine_id == before.engine_id != stepped_once(tiny).step_stats().engine_id
