"""A small load of users through the A/B router (section 12.4), to fill its request log for the report.

``users`` distinct users (``user-0`` ... ) send ``requests`` streamed chat
requests in turn, the prompts of :data:`llmrs_core.bench.prompts.PROMPTS`,
``concurrency`` at a time, each asking for ``max_tokens`` tokens
(``ignore_eos``: every answer has the same length, so the variants' TPOT
compare like with like). Returns how many answers came back per variant.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from ..bench.prompts import PROMPTS


async def _one(client, url: str, i: int, users: int, max_tokens: int) -> str:
    body = {"model": None, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "user": f"user-{i % users}",
            "ignore_eos": True}
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        variant = r.headers.get("x-llmrs-variant", "?")
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            raise RuntimeError(f"request {i} (variant {variant}): HTTP {r.status_code}: {text[:200]}")
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"error"' in line:
                raise RuntimeError(f"request {i} (variant {variant}): {json.loads(line[6:])['error']['message']}")
    return variant


def send_load(url: str, requests: int = 40, users: int = 20, concurrency: int = 1, max_tokens: int = 32,
              timeout: float = 300.0) -> dict[str, int]:
    """``requests`` streamed chats from ``users`` users to the router at ``url``; answers per variant."""
    import httpx

    for name, value in (("requests", requests), ("users", users), ("concurrency", concurrency),
                        ("max_tokens", max_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")

    async def main() -> Counter:
        counts: Counter = Counter()
        queue = iter(range(requests))
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            async def worker() -> None:
                for i in queue:
                    counts[await _one(client, url.rstrip("/"), i, users, max_tokens)] += 1

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return counts

    try:
        return dict(sorted(asyncio.run(main()).items()))
    except httpx.HTTPError as e:
        raise OSError(f"the router at {url} did not answer: {type(e).__name__}: {e}".rstrip(": ")) from None


__all__ = ["send_load"]
