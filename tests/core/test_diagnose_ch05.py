"""Chapter 5's tests name each known mistake: proven by planting it.

As for chapter 3 (test_diagnose_ch03.py): each mistake is planted in a copy of
the solution — a subclass of the engine's cache with one method recompiled from
its source with one edit (:func:`llmrs_core.testing.plant`), or the engine's
``paged_attention`` so recompiled — and the chapter 5 test named after the
mistake must fail with its own message. A planted edit that no longer applies
(the engine changed) fails loudly.
"""

from __future__ import annotations

import pytest

from llmrs_core.kv_cache import paged
from llmrs_core.kv_cache.contiguous import ContiguousKVCache
from llmrs_core.kv_cache.paged import PagedKVCache
from llmrs_core.testing import chapter_tests, plant, solution_with, with_methods, write_tiny_llama
from llmrs_core.testing import failure_message as failure

T56 = chapter_tests(5, "test_ex5_6_contiguous_cache.py")
T57 = chapter_tests(5, "test_ex5_7_paged_attention.py")


@pytest.fixture(scope="module")
def tiny_net(tmp_path_factory):
    import llmrs_core as llmrs

    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_llama(path, seed=3)
    return llmrs.load(path, backend="numpy").network


STORE_K = "self.k[layer, :, self.length : self.length + t] = k.transpose(1, 0, 2)"
STORE_V = "self.v[layer, :, self.length : self.length + t] = v.transpose(1, 0, 2)"
CONTIGUOUS_MISTAKES = {
    "write advances length": ({"write": [(STORE_V, STORE_V + "\n    self.length += t")]},
                              T56.test_ex5_6_write_does_not_advance, "write must not advance"),
    "view without n_new": ({"view": [("end = self.length + n_new", "end = self.length")]},
                           T56.test_ex5_6_view_includes_the_new_tokens, "right after writing 3 tokens returned 0 positions"),
    "view in the storage layout": ({"view": [(".transpose(1, 0, 2), self.v", ", self.v"), (".transpose(1, 0, 2)\n", "\n")]},
                                   T56.test_ex5_6_view_includes_the_new_tokens, "the storage layout [Hkv, Tk, D]"),
    "write ignores layer": ({"write": [(STORE_K, STORE_K.replace("self.k[layer, ", "self.k[:, ")),
                                       (STORE_V, STORE_V.replace("self.v[layer, ", "self.v[:, "))]},
                            T56.test_ex5_6_view_returns_what_was_written, "equals the reference computed of the other layer"),
    "write at position 0": ({"write": [(STORE_K, "self.k[layer, :, :t] = k.transpose(1, 0, 2)"),
                                       (STORE_V, "self.v[layer, :, :t] = v.transpose(1, 0, 2)")]},
                            T56.test_ex5_6_write_goes_after_the_cached_tokens,
                            "with the new token written at position 0 instead of at length"),
    "capacity off by one": ({"write": [("if self.length + t > self.max_tokens:", "if self.length + t >= self.max_tokens:")]},
                            T56.test_ex5_6_fills_exactly_to_max_tokens, "the capacity check is off by one"),
    "nbytes of k alone": ({"nbytes": [("return self.k.nbytes + self.v.nbytes", "return self.k.nbytes")]},
                          T56.test_ex5_6_nbytes_counts_keys_and_values, "the bytes of k alone"),
}


@pytest.mark.parametrize("mistake", CONTIGUOUS_MISTAKES)
def test_each_contiguous_cache_mistake_gets_its_own_message(mistake):
    edits, test, message = CONTIGUOUS_MISTAKES[mistake]
    if "nbytes" in edits:  # a property: plant its getter
        planted = type("ContiguousKVCache", (ContiguousKVCache,),
                       {"nbytes": plant(ContiguousKVCache.nbytes.fget, *edits["nbytes"])})  # @property kept
    else:
        planted = with_methods(ContiguousKVCache, **edits)
    text = failure(test, solution_with(5, ContiguousKVCache=planted))
    assert message in text, text


def test_a_wrong_cache_is_located_in_the_model_test(tiny_net):
    """A cache that ignores `layer` runs (the model accepts its shapes) but gives wrong logits: said where."""
    edits, _, _ = CONTIGUOUS_MISTAKES["write ignores layer"]
    ex = solution_with(5, ContiguousKVCache=with_methods(ContiguousKVCache, **edits))
    text = failure(T56.test_ex5_6_the_model_runs_on_your_cache, ex, tiny_net)
    assert "the logits decoded on your cache" in text and "first at token" in text, text


PAGED_MISTAKES = {
    "a block before the boundary": (
        {"_blocks_needed": [("new = max(0, blocks_for(length + n - capacity, self.block_size))",
                             "new = max(0, (length + n - capacity) // self.block_size + 1)")]},
        T57.test_ex5_7_blocks_are_taken_on_block_boundaries, "the table should hold 1 blocks",
    ),
    "reserve not all or nothing": (
        {"reserve": [("    if new + cow > self.allocator.num_free:\n        raise OutOfBlocksError(new + cow, self.allocator.num_free)\n", "")]},
        T57.test_ex5_7_running_out_is_a_clean_typed_error, "a failed reserve must leave the cache unchanged",
    ),
    "no copy-on-write": (
        {"_blocks_needed": [("cow = n > 0 and partial and", "cow = False and")],
         "write": [("if self.allocator.ref_counts[b] != 1:", "if False:")]},
        T57.test_ex5_7_a_shared_partial_block_is_copied_on_write, "reserve must first copy it",
    ),
    "copy-on-write without the copy": (
        {"reserve": [("        self.k[:, fresh] = self.k[:, old]\n        self.v[:, fresh] = self.v[:, old]\n", "")]},
        T57.test_ex5_7_copy_on_write_copies_the_keys, "copy the old block's K and V",
    ),
    "gather without n_new": (
        {"gather": [("self.lengths[seq] + n_new", "self.lengths[seq]")]},
        T57.test_ex5_7_gather_includes_the_new_tokens, "returned the 5 stored positions only",
    ),
    "free keeps the length": (
        {"free": [("    del self.lengths[seq]\n", "")]},
        T57.test_ex5_7_free_drops_only_its_own_references, "free forgets the table and the length",
    ),
    "shared blocks counted twice": (
        {"memory": [("                distinct.discard(b)\n", "")]},
        T57.test_ex5_7_memory_accounting, "shared blocks counted once",
    ),
}


@pytest.mark.parametrize("mistake", PAGED_MISTAKES)
def test_each_paged_cache_mistake_gets_its_own_message(mistake):
    edits, test, message = PAGED_MISTAKES[mistake]
    text = failure(test, solution_with(5, PagedKVCache=with_methods(PagedKVCache, **edits)))
    assert message in text, text


ATTENTION_MISTAKES = {
    "the table ignored": (("blocks = np.asarray(block_table, dtype=np.int64)[positions // block_size]",
                           "blocks = positions // block_size"), "instead of the table's"),
    "one position short": (("positions = np.arange(seq_len)", "positions = np.arange(seq_len - 1)"),
                           "over seq_len - 1 positions"),
    "no causal mask": (("causal=True)", "causal=False)"), "without the causal mask"),
}


@pytest.mark.parametrize("mistake", ATTENTION_MISTAKES)
def test_each_paged_attention_mistake_gets_its_own_message(mistake):
    edit, message = ATTENTION_MISTAKES[mistake]
    ex = solution_with(5, paged_attention=plant(paged.paged_attention, edit))
    text = failure(T57.test_ex5_7_paged_attention_equals_contiguous, ex)
    assert message in text, text


def test_the_solution_passes_the_diagnosing_tests(tiny_net):
    ex = solution_with(5)
    for module in (T56, T57):
        for name in dir(module):
            test = getattr(module, name)
            if not name.startswith("test_ex5_") or "smollm2" in name:
                continue
            test(ex, tiny_net) if "model_runs" in name else test(ex)
