"""What a scheduler and a prefix cache hand the engine, checked before the model runs (chapter 7).

Both can be the learner's: Exercise 7.6's scheduler and Exercise 7.7's radix cache reach
the engine wrapped in :class:`~llmrs_core.workbook.checked.CheckedScheduler` and
:class:`~llmrs_core.workbook.checked.CheckedPrefixCache`, which take every schedule through
:func:`checked_schedule` and every prefix match through :func:`checked_match`. A schedule or a
match that breaks its contract gets a :class:`SchedulerProtocolError` that names
the method and what was expected — not a ``RuntimeError`` from the block pool, a
shape error from a compiled attention kernel three calls later, or blocks
written while another sequence still reads them. The checks read lengths and
counters only: a few comparisons per scheduled request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.radix_cache import RadixNode
from ..engine.scheduler import Request, RequestStatus, ScheduledChunk
from ..kv_cache.paged import PagedKVCache, blocks_for
from .cache_checks import method_name


class SchedulerProtocolError(ValueError):
    """A scheduler or prefix cache returned something the engine cannot run; the message says what."""


def _method(obj: Any, method: str) -> str:
    """``Scheduler.schedule (from module)``: the class checked, and where it comes from."""
    cls = type(obj)
    return f"{cls.__name__}.{method} (from {cls.__module__})"


def checked_schedule(
    scheduler: Any, chunks: Any, requests: Mapping[str, Request], cache: PagedKVCache, pool_yours: bool = False
) -> list[ScheduledChunk]:
    """``scheduler.schedule()``'s result ``chunks``, checked against what one engine step needs.

    A list of :class:`ScheduledChunk`, one per request at most, each of a request the
    engine queued (``requests``: id -> request) that is RUNNING and computes
    ``1 <= n_tokens <= num_tokens - num_computed`` tokens; in all at most
    ``max_num_batched_tokens`` tokens and ``max_num_seqs`` requests. In the pool
    ``cache``, the request's sequence holds ``num_computed`` tokens and exactly the
    blocks that ``num_computed + n_tokens`` tokens need, each of them in use. ``pool_yours``: the
    pool is the learner's (Exercise 5.7), a suspect too when a table is wrong.
    """
    where = _method(scheduler, "schedule")
    if not isinstance(chunks, (list, tuple)):
        raise SchedulerProtocolError(
            f"{where} returned {type(chunks).__name__}; expected a list of ScheduledChunk(request, n_tokens)"
        )
    if not chunks and scheduler.running:
        raise SchedulerProtocolError(
            f"{where} returned no chunks while {len(scheduler.running)} request(s) are running: each step must "
            "run at least one of them, or the engine would step forever without progress"
        )
    seen: set[str] = set()
    total = 0
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, ScheduledChunk):
            raise SchedulerProtocolError(
                f"{where} returned {type(chunk).__name__} at index {i}; expected ScheduledChunk(request, n_tokens)"
            )
        r, n = chunk.request, chunk.n_tokens
        if not isinstance(r, Request) or requests.get(r.request_id) is not r:
            raise SchedulerProtocolError(
                f"{where} scheduled {r.request_id if isinstance(r, Request) else r!r:.60}, which is not a request "
                "the engine queued"
            )
        rid = r.request_id
        if rid in seen:
            raise SchedulerProtocolError(f"{where} scheduled request {rid!r} twice in one step")
        seen.add(rid)
        if r.status is not RequestStatus.RUNNING:
            raise SchedulerProtocolError(
                f"{where} scheduled request {rid!r}, whose status is {r.status.value}; a scheduled request is "
                "RUNNING (admitted from waiting, or running already) — finished, aborted and waiting ones never run"
            )
        if rid not in cache.tables:
            raise SchedulerProtocolError(
                f"{where} scheduled request {rid!r}, which has no sequence in the KV cache: add_sequence and "
                "reserve its blocks before scheduling it"
            )
        length, table = cache.lengths[rid], cache.tables[rid]
        if length != r.num_computed:
            raise SchedulerProtocolError(
                f"{where} scheduled request {rid!r} with num_computed {r.num_computed}, but its KV cache sequence "
                f"holds {length} tokens; they must agree"
            )
        left = r.num_tokens - r.num_computed
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= left:
            raise SchedulerProtocolError(
                f"{where} scheduled request {rid!r} for n_tokens={n!r}; expected an int from 1 to {left} "
                f"(num_tokens {r.num_tokens} - num_computed {r.num_computed})"
            )
        total += n
        want = blocks_for(length + n, cache.block_size)
        if len(table) != want:
            few = len(table) < want
            pool = (f"; or {method_name(cache, 'reserve', yours=True)}, your pool's, took too "
                    f"{'few' if few else 'many'} blocks" if pool_yours else "")  # the learner's pool may be at fault
            raise SchedulerProtocolError(
                f"{where} scheduled request {rid!r} for {n} tokens after {length}: its table holds {len(table)} "
                f"blocks, but {length} + {n} tokens in blocks of {cache.block_size} take {want} — "
                + ("reserve them first (cache.reserve)" if few else "the extra blocks leak") + pool
            )
        free = [b for b in table if cache.allocator.ref_counts[b] <= 0]
        if free:
            raise SchedulerProtocolError(
                f"{where} scheduled request {rid!r}, whose table holds free block(s) {free}: freed blocks "
                "can be handed to another sequence and overwritten"
            )
    if total > scheduler.max_num_batched_tokens:
        raise SchedulerProtocolError(
            f"{where} scheduled {total} tokens in one step; max_num_batched_tokens is {scheduler.max_num_batched_tokens}"
        )
    if len(chunks) > scheduler.max_num_seqs:
        raise SchedulerProtocolError(
            f"{where} scheduled {len(chunks)} requests in one step; max_num_seqs is {scheduler.max_num_seqs}"
        )
    return list(chunks)


def checked_match(
    prefix_cache: Any, tokens: Sequence[int], result: Any, block_size: int, ref_counts: Sequence[int]
) -> tuple[int, list[int], RadixNode]:
    """``prefix_cache.match_prefix(tokens)``'s ``result``, checked: ``(n_tokens, blocks, node)``
    with ``n_tokens`` a multiple of the block size below ``len(tokens)`` (the last token is
    always computed), one block in use (``ref_counts``, the pool's) per ``block_size`` tokens, and a
    :class:`RadixNode`."""
    where = _method(prefix_cache, "match_prefix")
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        raise SchedulerProtocolError(f"{where} must return a tuple (n_tokens, blocks, node); got {result!r:.80}")
    n, blocks, node = result
    bs = block_size
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(tokens) or n % bs:
        raise SchedulerProtocolError(
            f"{where} matched {n!r} tokens of a {len(tokens)}-token prompt; expected a multiple of the block size "
            f"{bs} from 0 to {(len(tokens) - 1) // bs * bs} — never the whole prompt: its last token must be "
            "computed for its logits"
        )
    blocks = list(blocks)
    if len(blocks) != n // bs:
        raise SchedulerProtocolError(
            f"{where} matched {n} tokens with {len(blocks)} blocks; {n} tokens in blocks of {bs} take {n // bs}"
        )
    counts = ref_counts
    bad = [b for b in blocks if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < len(counts)
           or counts[b] <= 0]
    if bad:
        raise SchedulerProtocolError(
            f"{where} returned blocks {bad} that are not blocks the tree holds (ids 0..{len(counts) - 1}, in use)"
        )
    if not isinstance(node, RadixNode):
        raise SchedulerProtocolError(f"{where} returned a {type(node).__name__} as its node; expected a RadixNode")
    return n, blocks, node


__all__ = ["SchedulerProtocolError", "checked_match", "checked_schedule"]
