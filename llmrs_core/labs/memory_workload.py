"""A synthetic decode workload for the memory pool: what an engine asks an allocator for (chapter 9, §9.4, §9.9).

``slots`` sequences decode side by side; when one finishes (its length drawn between
``min_tokens`` and ``max_tokens``) a new one takes its slot. Each step of the batch:

- every sequence whose KV cache is full gets a **bigger one**: a contiguous cache grown by
  ``chunk_tokens`` at a time, allocated anew and the old one freed (copying is not
  modelled; a paged cache, chapter 5, avoids exactly this pattern);
- the step's **temporaries** are allocated and freed: hidden states ``[B, dim]``, attention
  scores ``[B, heads, context]`` (as long as the longest sequence) and logits ``[B, vocab]``.

Sizes default to SmolLM2-135M with a float16 KV cache: 2 (K and V) × 30 layers × 3 KV
heads × 64 dims × 2 bytes = 23,040 bytes per token. The trace is a list of
``("malloc", handle, nbytes)``, ``("free", handle, 0)`` and ``("step", step, 0)`` events;
:func:`replay` plays it on any allocator with ``malloc(nbytes) -> ptr`` and ``free(ptr)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Allocator(Protocol):
    """What :func:`replay` needs of a pool."""

    def malloc(self, nbytes: int) -> int: ...

    def free(self, ptr: int) -> None: ...


@dataclass(frozen=True)
class DecodeWorkload:
    """The workload's knobs (SmolLM2-135M's sizes by default)."""

    steps: int = 400
    slots: int = 8
    min_tokens: int = 32
    max_tokens: int = 1024
    chunk_tokens: int = 32
    kv_bytes_per_token: int = 2 * 30 * 3 * 64 * 2
    dim: int = 576
    heads: int = 9
    vocab: int = 49152
    seed: int = 0


def decode_trace(w: DecodeWorkload = DecodeWorkload()) -> list[tuple[str, int, int]]:
    """The allocation events of ``w`` (deterministic for a given seed)."""
    if w.steps < 1 or w.slots < 1 or not 1 <= w.min_tokens <= w.max_tokens or w.chunk_tokens < 1:
        raise ValueError(f"a workload needs steps, slots, chunk_tokens >= 1 and 1 <= min <= max tokens: {w}")
    rng = random.Random(w.seed)
    events: list[tuple[str, int, int]] = []
    handles = iter(range(1 << 62))
    length = [0] * w.slots  # tokens so far
    target = [rng.randint(w.min_tokens, w.max_tokens) for _ in range(w.slots)]
    cache: list[tuple[int, int] | None] = [None] * w.slots  # (handle, capacity in tokens)
    for step in range(w.steps):
        events.append(("step", step, 0))
        for s in range(w.slots):
            if length[s] == target[s]:  # finished: the slot's cache goes, a new sequence comes
                if cache[s] is not None:
                    events.append(("free", cache[s][0], 0))
                length[s], target[s], cache[s] = 0, rng.randint(w.min_tokens, w.max_tokens), None
            if cache[s] is None or cache[s][1] == length[s]:
                capacity = length[s] + w.chunk_tokens
                handle = next(handles)
                events.append(("malloc", handle, capacity * w.kv_bytes_per_token))
                if cache[s] is not None:
                    events.append(("free", cache[s][0], 0))
                cache[s] = (handle, capacity)
            length[s] += 1
        context = max(length)
        temporaries = [w.slots * w.dim * 4, w.slots * w.heads * context * 4, w.slots * w.vocab * 4]
        step_handles = [next(handles) for _ in temporaries]
        events += [("malloc", h, n) for h, n in zip(step_handles, temporaries, strict=True)]
        events += [("free", h, 0) for h in reversed(step_handles)]
    return events


def replay(
    pool: Allocator, events: list[tuple[str, int, int]], on_step: Callable[[int], None] | None = None
) -> dict:
    """Play ``events`` on ``pool``; calls ``on_step(step)`` before each step. Returns handle -> ptr of what is live."""
    live: dict[int, int] = {}
    for kind, handle, nbytes in events:
        if kind == "step":
            if on_step is not None:
                on_step(handle)
        elif kind == "malloc":
            live[handle] = pool.malloc(nbytes)
        else:
            pool.free(live.pop(handle))
    return live


__all__ = ["Allocator", "DecodeWorkload", "decode_trace", "replay"]
