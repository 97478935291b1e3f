"""Chapter 7's tests name each known mistake: proven by planting it.

As for chapters 3 and 4 (test_diagnose_ch03.py): each mistake is planted in a
copy of the solution — a subclass of the engine's Scheduler or RadixCache with
one method recompiled from its source with one edit
(:func:`llmrs_core.testing.plant`) — and the chapter 7 test named after the
mistake must fail with its own message. A planted edit that no longer applies
(the engine changed) fails loudly.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings

from llmrs_core.engine.radix_cache import RadixCache
from llmrs_core.engine.scheduler import Scheduler
from llmrs_core.testing import chapter_tests, solution_with, with_methods
from llmrs_core.testing import failure_message as failure

T76 = chapter_tests(7, "test_ex7_6_scheduler.py")
T77 = chapter_tests(7, "test_ex7_7_radix_cache.py")


def scheduler_ex(**edits):
    return solution_with(7, Scheduler=with_methods(Scheduler, **edits))


SCHEDULER_MISTAKES = {
    "preempted request at the back": (
        {"preempt": [("self.waiting.insert(0, request)", "self.waiting.append(request)")]},
        T76.test_ex7_6_preempt_puts_the_request_at_the_front, "preempt put 'new' at the back of waiting",
    ),
    "the oldest running request preempted": (
        {"schedule": [("victim = self.running[-1]", "victim = self.running[0]")]},
        T76.test_ex7_6_preempts_the_newest_running_request, "and yours preempted 'old' itself",
    ),
    "preempt keeps the blocks": (
        {"preempt": [("self._release(request, remember=False)", "pass")]},
        T76.test_ex7_6_preempt_frees_the_blocks, "preempt must give back all of the request's blocks",
    ),
    "preempt keeps num_computed": (
        {"preempt": [("request.num_computed = 0", "pass")]},
        T76.test_ex7_6_preempt_resets_the_request, "it is recomputed from token 0",
    ),
    "failed admission leaks its sequence": (
        {"schedule": [("self._release(request, remember=False)\n            request.num_computed = 0\n", "")]},
        T76.test_ex7_6_failed_admission_leaves_nothing_behind, "free what you added for it",
    ),
    "abort frees unconditionally": (
        {"abort": [("self._release(request, remember=False)", "self.cache.free(request.request_id)")]},
        T76.test_ex7_6_abort_a_waiting_request, "aborting a waiting request raised KeyError",
    ),
    "block count off by one": (
        {"add": [("if needed > total:", "if needed >= total:")]},
        T76.test_ex7_6_a_request_that_exactly_fills_the_pool_is_accepted, "the block count is off by one",
    ),
}


@pytest.mark.parametrize("mistake", SCHEDULER_MISTAKES)
def test_each_scheduler_mistake_gets_its_own_message(mistake):
    edits, test, message = SCHEDULER_MISTAKES[mistake]
    text = failure(test, scheduler_ex(**edits))
    assert message in text, text


@pytest.mark.parametrize("mistake", ["preempt keeps the blocks", "failed admission leaks its sequence"])
def test_random_workloads_catch_a_leak(mistake):
    """The hypothesis test finds the leaks on its own, and says what is wrong with the pool."""
    edits, _, _ = SCHEDULER_MISTAKES[mistake]
    ex = scheduler_ex(**edits)

    @settings(phases=[Phase.generate], database=None, max_examples=100, deadline=None, derandomize=True)  # fixed, unshrunk
    @given(T76.WORKLOAD, T76.POLICIES)
    def random_workloads(workload, policy):
        T76.run_workload(ex, workload, policy)

    text = failure(random_workloads)
    assert "holds a sequence in the cache" in text or "reference count must equal" in text, text


def test_the_solution_passes_the_diagnosing_tests():
    ex = solution_with(7)
    for name in dir(T76):
        if name.startswith("test_ex7_6_") and name not in ("test_ex7_6_your_scheduler_serves_a_model",):
            getattr(T76, name)(ex)


# -- Exercise 7.7 ---------------------------------------------------------------------------

LIMIT = "limit = (len(tokens) - 1) // self.block_size * self.block_size"
RADIX_MISTAKES = {
    "the whole prompt matched": (
        {"match_prefix": [(LIMIT, "limit = len(tokens) // self.block_size * self.block_size")]},
        T77.test_ex7_7_match_leaves_the_last_token_out, "yours matched all 6 tokens of a 6-token prompt",
    ),
    "one block too few": (
        {"match_prefix": [(LIMIT, "limit = (len(tokens) // self.block_size - 1) * self.block_size")]},
        T77.test_ex7_7_match_leaves_the_last_token_out, "yours matched 4, one block too few",
    ),
    "no split inside an edge": (
        {"match_prefix": [("child = self._split(child, n_blocks)", "pass")]},
        T77.test_ex7_7_a_match_inside_an_edge_splits_it, "a match ending inside an edge splits it",
    ),
    "insert without incref": (
        {"insert": [("self.allocator.incref(b)", "pass")]},
        T77.test_ex7_7_insert_takes_its_own_references, "the tree must take its own (allocator.incref)",
    ),
    "insert's walk counted as a lookup": (
        {"match_prefix": [("    if count:\n", "    if True:\n")]},
        T77.test_ex7_7_hit_rate, "count only match_prefix calls with count=True",
    ),
    "most recently used evicted first": (
        {"evict": [("victim = min(leaves", "victim = max(leaves")]},
        T77.test_ex7_7_locks_and_lru_eviction, "pick the leaf with the smallest last_access",
    ),
    "blocks still held counted as freed": (
        {"evict": [("if self.allocator.ref_counts[b] == 1:", "if True:")]},
        T77.test_ex7_7_blocks_in_use_survive_eviction, "only a block whose reference count was 1",
    ),
}


@pytest.mark.parametrize("mistake", RADIX_MISTAKES)
def test_each_radix_cache_mistake_gets_its_own_message(mistake):
    edits, test, message = RADIX_MISTAKES[mistake]
    text = failure(test, solution_with(7, RadixCache=with_methods(RadixCache, **edits)))
    assert message in text, text


def test_the_solution_passes_the_radix_tests():
    ex = solution_with(7)
    for name in dir(T77):
        if name.startswith("test_ex7_7_"):
            getattr(T77, name)(ex)
