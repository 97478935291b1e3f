"""What one connection may take from the server: time to send its request, header size, concurrency (chapter 12).

Why: uvicorn alone waits forever on a client that trickles its headers or body,
and accepts any header size (what was measured: README, "Limits"). The server we ship
(:func:`~.serve.serve`, :class:`~.serve.BackgroundServer`) runs with :class:`ConnectionLimits`:

=====================  ===========  ==================================================================
limit                  default      past it
=====================  ===========  ==================================================================
``header_timeout``     10 s         the request line and headers must arrive within this, from the
                                    connection (or, between requests, from its next first byte):
                                    else ``408`` and the connection is closed (``--header-timeout``)
``body_timeout``       30 s         the whole body must arrive within this once the headers are in:
                                    else ``408`` (if nothing was answered yet) and closed
                                    (``--body-timeout``)
``keep_alive_timeout`` 5 s          an idle connection between requests is closed (uvicorn's)
``limit_concurrency``  512          connections or requests in progress; past it a new request gets
                                    uvicorn's ``503`` (``--limit-concurrency``; below the usual 1024
                                    file descriptors of a process)
``max_header_bytes``   16 KiB       the headers' names and values together: ``431`` (and more than
                                    that plus 8 KiB still incomplete, uvicorn's h11 answers ``400``)
``max_headers``        100          header lines: ``431``
=====================  ===========  ==================================================================

The body's size is the app's to bound (``max_body_bytes``, 413). The
timeouts live in :class:`LimitedH11Protocol`, a subclass of uvicorn's h11
protocol (no ASGI event exists before the headers are complete); the header
limits in :class:`HeaderLimits`, an ASGI middleware that ``create_app`` adds,
so they hold under any ASGI server.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .protocol import error_body

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 5
DEFAULT_LIMIT_CONCURRENCY = 512
#: bytes of header names and values a request may carry, all together
MAX_HEADER_BYTES = 16 * 2**10
#: header lines a request may carry
MAX_HEADERS = 100
#: bytes of request line (the URL) an incomplete request may buffer beyond the headers
_REQUEST_LINE_BYTES = 8 * 2**10


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits above, checked when made (``ValueError`` naming the field)."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    keep_alive_timeout: int = DEFAULT_KEEP_ALIVE_TIMEOUT
    limit_concurrency: int | None = DEFAULT_LIMIT_CONCURRENCY
    max_header_bytes: int = MAX_HEADER_BYTES

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout", "max_header_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.limit_concurrency is not None and self.limit_concurrency < 1:
            raise ValueError(f"limit_concurrency must be >= 1 (or None), got {self.limit_concurrency}")

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments of ``uvicorn.Config`` that apply these limits."""
        protocol = type("LimitedH11Protocol", (LimitedH11Protocol,), {"limits": self})
        return {"http": protocol, "limit_concurrency": self.limit_concurrency,
                "timeout_keep_alive": self.keep_alive_timeout,
                "h11_max_incomplete_event_size": self.max_header_bytes + _REQUEST_LINE_BYTES}


def _error_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps(error_body(message, "timeout_error" if status == 408 else "invalid_request_error",
                                 code=status)).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines: a request's headers must arrive within
    ``limits.header_timeout`` seconds and its body within ``limits.body_timeout`` more, else the
    client gets a 408 (when nothing was answered yet) and the connection is closed. Nothing is
    timed once the request is in: a long answer, streamed or not, is never cut."""

    limits: ConnectionLimits = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._reading: str | None = None  # "headers", "body", or None: not waiting for the client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self._expect("headers", self.limits.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self._reading is None and self.conn.their_state is h11.IDLE:  # the first byte of the next request
            self._expect("headers", self.limits.header_timeout)
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._reading == "headers":
                self._expect("body", self.limits.body_timeout)
        elif state is not h11.IDLE:  # the request is in (or the connection is over)
            self._expect(None, 0)

    def connection_lost(self, exc: Exception | None) -> None:
        self._expect(None, 0)
        super().connection_lost(exc)

    def _expect(self, what: str | None, timeout: float) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        self._reading = what
        if what is not None:
            self._read_timer = self.loop.call_later(timeout, self._expired)

    def _expired(self) -> None:
        what, self._read_timer = self._reading, None
        self._reading = None
        if self.transport.is_closing():
            return
        timeout = self.limits.header_timeout if what == "headers" else self.limits.body_timeout
        cycle = self.cycle  # headers: the previous request's (if any); body: this request's
        if cycle is None or (not cycle.response_started if what == "body" else cycle.response_complete):
            self.transport.write(_error_response(
                408, "Request Timeout", f"the request's {what} did not arrive within {timeout:g} s"))
        self.transport.close()


class HeaderLimits:
    """ASGI middleware: a request with more than ``max_headers`` header lines, or more than
    ``max_header_bytes`` bytes of names and values, gets a 431 (OpenAI's error shape) and the
    connection is closed; the app never sees it."""

    def __init__(self, app: Any, max_headers: int = MAX_HEADERS, max_header_bytes: int = MAX_HEADER_BYTES):
        self.app = app
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            size = sum(len(k) + len(v) for k, v in headers)
            if len(headers) > self.max_headers or size > self.max_header_bytes:
                message = (f"the request has {len(headers)} headers of {size:,} bytes; the limits are "
                           f"{self.max_headers} headers and {self.max_header_bytes:,} bytes")
                body = json.dumps(error_body(message, "invalid_request_error", code=431)).encode()
                await send({"type": "http.response.start", "status": 431,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_KEEP_ALIVE_TIMEOUT",
    "DEFAULT_LIMIT_CONCURRENCY",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "ConnectionLimits",
    "HeaderLimits",
    "LimitedH11Protocol",
]
