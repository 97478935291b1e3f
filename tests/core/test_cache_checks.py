"""The workbook checks what a KV cache returns to the forward pass (llmrs_core.workbook.cache_checks).

Each broken cache below makes one mistake a learner's Exercise 5.6 / 5.7 cache
can make; the model must stop it with a CacheProtocolError that names the
method and what was expected, before attention (a compiled kernel on the Numba
backend) sees it. The engine's own caches pass the same checks.
"""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.kv_cache import ContiguousKVCache, PagedKVCache, SinkCache, SlidingWindowCache
from llmrs_core.testing import write_tiny_llama
from llmrs_core.workbook.cache_checks import CacheProtocolError
from llmrs_core.workbook.checked import CheckedKVCache, CheckedPagedKVCache

IDS = [3, 9, 27, 17, 51]


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_llama(path, seed=3)
    return llmrs.load(path, backend="numpy").network


class ForgetsNNew(ContiguousKVCache):
    def view(self, layer, n_new):
        return super().view(layer, 0)  # positions 0 .. length - 1: the new tokens left out


class AdvancesOnWrite(ContiguousKVCache):
    def write(self, layer, k, v):
        super().write(layer, k, v)
        if layer == 0:
            self.length += k.shape[0]


class WrongLayout(ContiguousKVCache):
    def view(self, layer, n_new):
        k, v = super().view(layer, n_new)
        return k.transpose(1, 0, 2), v.transpose(1, 0, 2)  # [Hkv, Tk, D]: the storage layout


class NeverAdvances(ContiguousKVCache):
    def advance(self, n_new):
        pass


class OnePosition(ContiguousKVCache):
    def positions(self, n_new):
        return np.int64(self.length)


class OneArray(ContiguousKVCache):
    def view(self, layer, n_new):
        return super().view(layer, n_new)[0]


@pytest.mark.parametrize(
    "cache_class, message",
    [
        (ForgetsNNew, "ForgetsNNew.view(layer 0, n_new=5) returned keys of shape (0, 2, 8)"),
        (AdvancesOnWrite, "AdvancesOnWrite.write changed length from 0 to 5: every layer writes the same positions"),
        (WrongLayout, "returned keys of shape (2, 5, 8) (float32); expected floats [5, 2, 8] (length 0 + n_new 5)"),
        (NeverAdvances, "after NeverAdvances.advance(5) length is 0; expected 0 + 5 = 5"),
        (OnePosition, "OnePosition.positions(5) returned int64 of shape (); expected [5] integers"),
        (OneArray, "OneArray.view must return two arrays, (keys, values)"),
    ],
    ids=["view forgets n_new", "write advances", "view in storage layout", "advance does nothing",
         "one position", "one array"],
)
def test_a_broken_cache_is_named_before_attention(net, cache_class, message):
    cache = CheckedKVCache(cache_class(net.config, max_tokens=16))
    with pytest.raises(CacheProtocolError) as e:
        net.forward(IDS, cache)
    assert message in str(e.value)


def test_a_paged_pool_is_named_by_its_own_method(net):
    class ShortGather(PagedKVCache):
        def gather(self, layer, seq, n_new=0):
            k, v = super().gather(layer, seq, n_new)
            return k[:-1], v[:-1]

    pool = CheckedPagedKVCache(ShortGather(net.config, num_blocks=8, block_size=4))
    with pytest.raises(CacheProtocolError, match=r"ShortGather\.gather\(layer 0, n_new=5\) \(through PagedSequence\.view\)"):
        net.forward(IDS, pool.sequence("a"))


@pytest.mark.parametrize("make", [
    lambda c: ContiguousKVCache(c, max_tokens=16),
    lambda c: PagedKVCache(c, num_blocks=8, block_size=4).sequence("a"),
    lambda c: SlidingWindowCache(c, window=4),
    lambda c: SinkCache(c, n_sink=2, window=4),
], ids=["contiguous", "paged", "sliding window", "sinks"])
def test_the_engines_caches_pass_the_checks(net, make):
    cache = CheckedKVCache(make(net.config))
    net.forward(IDS, cache)
    for t in (7, 8, 9):
        net.forward([t], cache)
    assert cache.length == len(IDS) + 3
