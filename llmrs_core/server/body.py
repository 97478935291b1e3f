"""Reading a request's body, bounded (chapters 11, 12): the server's and the A/B router's.

``read_json`` reads at most ``max_bytes`` (413 past them, read no further) and parses JSON
(400 if it is not); ``read_json_object`` also requires an object with only the keys a route
knows (400 naming the first other one). Every refusal is an :class:`~.protocol.APIError`.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from starlette.requests import ClientDisconnect, Request

from .protocol import APIError

#: the default bound on a request body (``create_app(max_body_bytes=)``)
MAX_BODY_BYTES = 8 * 2**20


async def read_json(request: Request, max_bytes: int) -> Any:
    """The body as JSON; 413 past ``max_bytes`` (read no further), 400 if it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(413, f"the request body is {int(declared):,} bytes; the limit is {max_bytes:,}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise APIError(413, f"the request body is over the limit of {max_bytes:,} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # gone before its body was in (or cut off by the body timeout): no traceback
        raise APIError(400, f"the client disconnected after {size:,} bytes of its body") from None
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and bad UTF-8 are ValueErrors
        raise APIError(400, f"the request body is not valid JSON: {e}") from None


async def read_json_object(request: Request, allowed_keys: Collection[str] | None,
                           max_bytes: int = MAX_BODY_BYTES) -> dict:
    """The body (:func:`read_json`) as a JSON object; 400 if it is not one, or if it has a key
    outside ``allowed_keys`` (``None``: any key), naming the first such key and the route's path."""
    body = await read_json(request, max_bytes)
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    unknown = set() if allowed_keys is None else set(body) - set(allowed_keys)
    if unknown:
        raise APIError(400, f"{sorted(unknown)[0]!r} is not supported by {request.url.path}",
                       param=sorted(unknown)[0])
    return body


async def wait_disconnect(request: Request) -> None:
    """Return when the client has gone away (for a request whose body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


__all__ = ["MAX_BODY_BYTES", "read_json", "read_json_object", "wait_disconnect"]
