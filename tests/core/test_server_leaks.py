"""`llmrs serve` under sustained load (chapter 11): 500 short requests, a tenth of them dropped by
their client mid-stream, leave nothing behind (vLLM #22736 is the failure this guards against).

Checked afterwards, exactly: the KV pool is back to free blocks plus the prefix cache's evictable
ones; the engine, its scheduler and the engine loop hold no request; no ``ResponseStream``,
``Request`` or ``OutputStream`` object is alive (that catches a leak of any size in the request
path), whatever the number of requests. And, loosely, the process's resident memory: its growth
over the second half of the requests stays under 16 KB a request (4 MB for 250), which a leak of
16 KB or more per request (a buffer kept, not an object) crosses; growth measured without a leak
(the arenas still warming up): 1.2-1.4 MB over the second 250 of 500 requests, 0.8-0.9 MB over the
second 500 of 1,000.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import time
import weakref

import httpx
import pytest

pytest.importorskip("fastapi")

import llmrs_core as llmrs  # noqa: E402
from llmrs_core.engine.scheduler import Request  # noqa: E402
from llmrs_core.output import OutputStream  # noqa: E402
from llmrs_core.server import BackgroundServer, ResponseStream, create_app  # noqa: E402
from llmrs_core.testing import write_tiny_llama  # noqa: E402

N_REQUESTS = 500
LEAK_PER_REQUEST = 16 * 2**10  # bytes: the smallest buffer leak the memory check must see
DROPPED_EVERY = 10  # every 10th client reads one chunk and disconnects
CONCURRENCY = 16
WAIT = 120.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


TRACKED = (ResponseStream, Request, OutputStream)


def tracked() -> list:
    """Every tracked object alive now. ``type(o)``, not ``isinstance``: the heap holds weak proxies
    too, and asking a dead proxy for its class raises ``ReferenceError``."""
    gc.collect()
    return [o for o in gc.get_objects() if type(o) in TRACKED]


def live_objects() -> weakref.WeakSet:
    """The tracked objects alive now (other tests' servers and engines may still hold theirs)."""
    return weakref.WeakSet(tracked())


def new_since(before: weakref.WeakSet) -> list[str]:
    """The tracked objects alive now that were not alive at ``before``: what this test left behind."""
    return [type(o).__name__ for o in tracked() if o not in before]


async def load(url: str, ids: range) -> tuple[int, int]:
    """Send requests ``ids`` with CONCURRENCY clients; returns (finished, dropped)."""
    finished = dropped = 0
    queue = list(ids)
    async with httpx.AsyncClient(base_url=url, timeout=WAIT) as http:

        async def client() -> None:
            nonlocal finished, dropped
            while queue:
                i = queue.pop()
                body = {"model": "tiny", "prompt": f"request {i}: " + "xyz"[: i % 3], "max_tokens": 6,
                        "temperature": 0.7, "seed": i, "stream": True, "ignore_eos": True}
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200, await r.aread()
                    async for line in r.aiter_lines():
                        if i % DROPPED_EVERY == 0 and line.startswith("data: {"):
                            dropped += 1
                            break  # leaving the block closes the connection mid-stream
                        if line == "data: [DONE]":
                            finished += 1

        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    return finished, dropped


@pytest.mark.skipif(not hasattr(resource, "getpagesize") or not __import__("os").path.exists("/proc/self/statm"),
                    reason="reads resident memory from /proc (Linux)")
def test_five_hundred_requests_with_disconnects_leave_nothing_behind(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    model = llmrs.load(path, backend="numpy")
    app = create_app(model, served_model_name="tiny", warm_up=False, num_blocks=64, block_size=4)
    loop = app.state.engine_loop
    before = live_objects()
    with BackgroundServer(app) as url:
        assert loop.ready.wait(WAIT)
        half = N_REQUESTS // 2
        finished, dropped = asyncio.run(load(url, range(half)))
        rss_half = rss_bytes()
        more = asyncio.run(load(url, range(half, N_REQUESTS)))
        finished, dropped = finished + more[0], dropped + more[1]
        rss_end = rss_bytes()
        assert finished + dropped == N_REQUESTS and dropped == N_REQUESTS // DROPPED_EVERY

        deadline = time.monotonic() + WAIT  # the last aborts are applied before the loop goes idle
        while loop._streams or loop.engine.requests or loop.engine.has_unfinished():
            assert time.monotonic() < deadline, "the engine did not let go of its requests"
            time.sleep(0.01)
        engine = loop.engine
        pool = engine.cache.allocator
        cached = engine.prefix_cache.num_blocks if engine.prefix_cache else 0
        assert pool.num_free + cached == pool.num_blocks, (
            f"{pool.num_blocks - pool.num_free - cached} KV blocks are neither free nor in the prefix cache")
        assert not engine.cache.tables and not engine._states and not engine.scheduler.waiting
        assert not engine.scheduler.running
        left = new_since(before)
        assert not left, f"objects of finished requests are still alive: {sorted(left)}"
    # the allocator's arenas and the HTTP stack's buffers account for the growth measured without a
    # leak (1.2-1.4 MB over the second 250 requests)
    growth, limit = rss_end - rss_half, LEAK_PER_REQUEST * (N_REQUESTS - half)
    assert growth < limit, (f"resident memory grew {growth / 2**20:.1f} MB over the second {N_REQUESTS - half} "
                            f"requests (at most {limit / 2**20:.0f} MB)")
