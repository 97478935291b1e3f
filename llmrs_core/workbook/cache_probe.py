"""A short run of a KV-cache class on a tiny config, to see whether it can stand in for the engine's (chapter 5).

The learner backend (``--impl learner``) plugs the learner's Exercise 5.6
``ContiguousKVCache`` into ``model.generate`` and Exercise 5.7's ``PagedKVCache``
into the batching engine only where they work: :func:`probe_kv_cache` and
:func:`probe_paged_kv_cache` drive one through the forward pass's protocol
(``positions``, ``write``, ``view``, ``advance``, each value through
:mod:`~llmrs_core.workbook.cache_checks`), compare every view with the keys and
values written, and for the pool also ``fork`` with copy-on-write, ``can_append``,
a ``reserve`` that cannot fit and ``free``, against the engine's own pool run
alongside. A stub's ``NotImplementedError`` passes through; any other failure
is a :class:`~llmrs_core.workbook.cache_checks.CacheProtocolError` (or the learner's
own exception) whose message the backend shows. Tiny: L = 2, Hkv = 2, D = 4.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..kv_cache.base import KVCache
from ..kv_cache.paged import OutOfBlocksError, PagedKVCache
from .cache_checks import CacheProtocolError, checked_advance, checked_positions, checked_view, method_name
from .checked import CheckedPagedSequence

#: the probe's model shape: 2 layers, 2 KV heads of 4
TINY = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, n_layers=2, n_heads=2, n_kv_heads=2,
                   head_dim=4, context_length=32, rope_theta=1e4, rms_norm_eps=1e-5, tie_embeddings=True)


def _steps(cache: KVCache, sizes: tuple[int, ...], written: list[list[np.ndarray]], seed: int) -> None:
    """Forward-pass steps of ``sizes`` new tokens on ``cache``; ``written[layer]`` collects each
    layer's keys so far (values are the keys + 1), and every view must return exactly them."""
    rng = np.random.default_rng(seed)
    c = TINY
    for n in sizes:
        length = int(cache.length)
        positions = checked_positions(cache, n, yours=True)
        if not np.array_equal(positions, np.arange(length, length + n)):
            raise CacheProtocolError(
                f"{method_name(cache, 'positions', str(n), yours=True)} returned {positions.tolist()}; expected "
                f"{list(range(length, length + n))}, the positions after the {length} cached tokens"
            )
        for layer in range(c.n_layers):
            k = rng.standard_normal((n, c.n_kv_heads, c.head_dim)).astype(np.float32)
            cache.write(layer, k, k + 1)
            keys, values = checked_view(cache, layer, n, length, c.n_kv_heads, c.head_dim, yours=True)
            want = np.concatenate([*written[layer], k])
            for name, got, expected in (("keys", keys, want), ("values", values, want + 1)):
                _same(cache, layer, n, name, np.asarray(got), expected)
            written[layer].append(k)
        checked_advance(cache, n, length, yours=True)


def _same(cache: KVCache, layer: int, n_new: int, name: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.shape != want.shape:
        raise CacheProtocolError(
            f"{method_name(cache, 'view', f'layer {layer}, n_new={n_new}', yours=True)} returned {name} of shape {got.shape}; "
            f"expected {want.shape}, every position written so far"
        )
    if not np.array_equal(got, want):
        pos, head, dim = (int(i) for i in np.argwhere(got != want)[0])
        raise CacheProtocolError(
            f"{method_name(cache, 'view', f'layer {layer}, n_new={n_new}', yours=True)} returned {name} that differ from those "
            f"written, first at position {pos}, head {head}, dim {dim}: position p's {name} of layer "
            f"{layer} must be the ones write(layer {layer}, ...) stored for p"
        )


def _on_the_probe(probe: Callable[[type], None]) -> Callable[[type], None]:
    """``probe``, its errors saying that the shapes in them are the probe's, not the real model's."""

    @functools.wraps(probe)
    def run(cls: type) -> None:
        try:
            probe(cls)
        except CacheProtocolError as e:
            raise CacheProtocolError(
                f"{e} [on the probe: {TINY.n_layers} layers, {TINY.n_kv_heads} KV heads of {TINY.head_dim}]"
            ) from None

    return run


@_on_the_probe
def probe_kv_cache(cls: type) -> None:
    """Run ``cls(TINY, 8)`` (Exercise 5.6's interface) through a 3-token prefill and two decode steps."""
    _steps(cls(TINY, 8, xp=np), (3, 1, 1), [[] for _ in range(TINY.n_layers)], seed=0)


@_on_the_probe
def probe_paged_kv_cache(cls: type) -> None:
    """Run ``cls(TINY, num_blocks=8, block_size=2)`` (Exercise 5.7's interface) as the engine does.

    Sequence ``a``: 3 + 1 + 1 tokens (three blocks); ``fork`` to ``b``, one token on ``b``
    (copy-on-write of the shared, partly filled block: ``a``'s keys must not change);
    ``can_append`` and a ``reserve`` too big for the free blocks, as the engine's pool answers
    them; then ``free`` of both must give every block back.
    """
    pool, ref = cls(TINY, num_blocks=8, block_size=2, xp=np), PagedKVCache(TINY, num_blocks=8, block_size=2)
    _allocator(pool, 8, "a new pool")
    a_keys: list[list[np.ndarray]] = [[] for _ in range(TINY.n_layers)]
    _steps(CheckedPagedSequence(pool, "a", yours=True), (3, 1, 1), a_keys, seed=1)
    _steps(ref.sequence("a"), (3, 1, 1), [[] for _ in range(TINY.n_layers)], seed=1)
    pool.fork("a", "b")
    ref.fork("a", "b")
    b_keys = [list(ks) for ks in a_keys]
    _steps(CheckedPagedSequence(pool, "b", yours=True), (1,), b_keys, seed=2)
    _steps(ref.sequence("b"), (1,), [list(ks) for ks in a_keys], seed=2)
    a = pool.sequence("a")
    for layer in range(TINY.n_layers):  # a's view after b wrote: copy-on-write kept a's keys
        _same(a, layer, 0, "keys", np.asarray(a.view(layer, 0)[0]), np.concatenate(a_keys[layer]))
    for n in (1, 9, 11):
        got, want = pool.can_append("a", n), ref.can_append("a", n)
        if bool(got) != want:
            call = method_name(pool, "can_append", f"'a', {n}", yours=True)
            raise CacheProtocolError(
                f"{call} returned {got!r} with "
                f"{ref.allocator.num_free} free blocks of 2 and 5 tokens in 3 blocks; expected {want}"
            )
    before, call = list(pool.tables["a"]), method_name(pool, "reserve", "'a', 11", yours=True)
    try:
        pool.reserve("a", 11)
    except OutOfBlocksError:
        if list(pool.tables["a"]) != before:
            raise CacheProtocolError(
                f"{call} raised OutOfBlocksError but changed the block table from {before} to "
                f"{list(pool.tables['a'])}: all or nothing — check the free blocks before taking any"
            ) from None
    else:
        raise CacheProtocolError(
            f"{call} returned with only {ref.allocator.num_free} free blocks of 2 for 5 more blocks; expected "
            "OutOfBlocksError(needed, free), which the engine's scheduler catches to preempt"
        )
    pool.free("a")
    pool.free("b")
    _allocator(pool, 8, "free of every sequence")


def _allocator(pool: Any, num_blocks: int, after: str) -> None:
    """What the engine reads of ``pool.allocator``: ``num_blocks``, ``num_free``, ``ref_counts``."""
    alloc, where = pool.allocator, method_name(pool, "allocator", yours=True)
    try:
        counts = (alloc.num_blocks, alloc.num_free, len(alloc.ref_counts))
    except AttributeError as e:
        raise CacheProtocolError(
            f"{where}: {e}; the engine reads allocator.num_blocks (the pool size), num_free and "
            "ref_counts"
        ) from None
    if counts != (num_blocks, num_blocks, num_blocks):
        raise CacheProtocolError(
            f"after {after}, {where} has num_blocks {counts[0]}, num_free {counts[1]} and "
            f"{counts[2]} ref_counts; expected {num_blocks} of each (every block free)"
        )


__all__ = ["TINY", "probe_kv_cache", "probe_paged_kv_cache"]
