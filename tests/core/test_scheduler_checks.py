"""The workbook checks what a scheduler and a prefix cache return (llmrs_core.workbook.scheduler_checks).

Each broken class below makes one mistake a learner's Exercise 7.6 scheduler or
Exercise 7.7 radix cache can make; the engine must stop it with a
SchedulerProtocolError that names the method and what was expected, before the
model runs the step (and before blocks are written that another sequence reads).
The engine's own classes pass the same checks. Each class runs in the wrapper that plugs a
learner's into the engine (``workbook.checked.checked_parts``).
"""

from __future__ import annotations

import pytest

import llmrs_core as llmrs
from llmrs_core.engine import Engine, RadixCache, RequestStatus, ScheduledChunk, Scheduler
from llmrs_core.testing import plant, write_tiny_llama
from llmrs_core.workbook.checked import checked_parts
from llmrs_core.workbook.scheduler_checks import SchedulerProtocolError

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 10], [11, 12, 13]]


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_llama(path, seed=4)
    return llmrs.load(path, backend="numpy").network


def engine(net, scheduler_class=Scheduler, prefix_cache_class=RadixCache, **kw):
    settings = dict(num_blocks=16, block_size=4, max_num_seqs=3, max_num_batched_tokens=16, prefix_caching=False)
    parts = checked_parts(scheduler=scheduler_class, prefix_cache=prefix_cache_class)
    return Engine(net, None, parts=parts, **{**settings, **kw})


class KeepsFinished(Scheduler):
    """finish() marks the request but leaves it running, blocks and all."""

    def finish(self, request, reason):
        request.status, request.finish_reason = RequestStatus.FINISHED, reason


class NoReserve(Scheduler):
    """Schedules without reserving: the sequence exists, its blocks do not."""

    def _reserve(self, request, n):
        if request.request_id not in self.cache.tables:
            self.cache.add_sequence(request.request_id)
        return True


class ZeroTokens(Scheduler):
    def schedule(self):
        return [ScheduledChunk(c.request, 0) for c in super().schedule()]


class OverBudget(Scheduler):
    """Computes whole prompts whatever max_num_batched_tokens says."""

    def schedule(self):
        budget, self.max_num_batched_tokens = self.max_num_batched_tokens, 10**6
        try:
            return super().schedule()
        finally:
            self.max_num_batched_tokens = budget


class Pairs(Scheduler):
    def schedule(self):
        return [(c.request, c.n_tokens) for c in super().schedule()]


class WrongLength(Scheduler):
    """Counts the tokens a chunk computes, but not in the request (num_computed one ahead)."""

    def schedule(self):
        chunks = super().schedule()
        for c in chunks:
            c.request.num_computed += 1
        return chunks


@pytest.mark.parametrize(
    "scheduler_class, message",
    [
        (KeepsFinished, "scheduled request 'req-0', whose status is finished"),
        (NoReserve, "its table holds 0 blocks, but 0 + 9 tokens in blocks of 4 take 3 — reserve them first"),
        (ZeroTokens, "scheduled request 'req-0' for n_tokens=0; expected an int from 1 to 9"),
        (OverBudget, "scheduled 21 tokens in one step; max_num_batched_tokens is 16"),
        (Pairs, "returned tuple at index 0; expected ScheduledChunk(request, n_tokens)"),
        (WrongLength, "with num_computed 1, but its KV cache sequence holds 0 tokens"),
    ],
    ids=["a finished request scheduled", "no blocks reserved", "zero tokens", "over the token budget",
         "pairs, not ScheduledChunk", "num_computed off by one"],
)
def test_a_broken_schedule_is_named_before_the_model_runs(net, scheduler_class, message):
    e = engine(net, scheduler_class=scheduler_class)
    with pytest.raises(SchedulerProtocolError) as err:
        e.generate(PROMPTS, max_tokens=3)
    assert message in str(err.value), str(err.value)
    assert str(err.value).startswith(f"{scheduler_class.__name__}.schedule (from {__name__})")


LIMIT = "limit = (len(tokens) - 1) // self.block_size * self.block_size"


def radix_with(**edits) -> type:
    return type("RadixCache", (RadixCache,), {n: plant(getattr(RadixCache, n), *e) for n, e in edits.items()})


class ExtraBlock(RadixCache):
    def match_prefix(self, tokens, count=True):
        n, blocks, node = super().match_prefix(tokens, count)
        return n, blocks + blocks[-1:], node


class FreedBlocks(RadixCache):
    def match_prefix(self, tokens, count=True):
        n, blocks, node = super().match_prefix(tokens, count)
        return n, [self.allocator.num_blocks - 1 - i for i in range(len(blocks))], node


@pytest.mark.parametrize(
    "prefix_cache_class, message",
    [
        (radix_with(match_prefix=[(LIMIT, "limit = len(tokens) // self.block_size * self.block_size")]),
         "matched 8 tokens of a 8-token prompt; expected a multiple of the block size 4 from 0 to 4 — never the whole"),
        (ExtraBlock, "matched 4 tokens with 2 blocks; 4 tokens in blocks of 4 take 1"),
        (FreedBlocks, "returned blocks [15] that are not blocks the tree holds"),
        (radix_with(insert=[("self.allocator.incref(b)", "pass")]), "that are not blocks the tree holds (ids 0..15, in use)"),
    ],
    ids=["the whole prompt matched", "a block too many", "free blocks", "insert without incref"],
)
def test_a_broken_prefix_match_is_named_before_it_is_used(net, prefix_cache_class, message):
    e = engine(net, prefix_caching=True, prefix_cache_class=prefix_cache_class, max_num_seqs=1)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    with pytest.raises(SchedulerProtocolError) as err:
        e.generate([prompt + [9], prompt], max_tokens=2)  # the second finds the first's first block
    assert message in str(err.value), str(err.value)


def test_the_engines_own_classes_pass(net):
    e = engine(net, prefix_caching=True)
    outs = e.generate(PROMPTS + PROMPTS, max_tokens=4)
    assert all(len(o.token_ids) == 4 for o in outs)
    assert e.prefix_cache.hit_tokens > 0, "the prompts share prefixes: the checked match path ran"
