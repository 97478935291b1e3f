"""Running the app with uvicorn (chapter 11): in the foreground (``llmrs serve``) or in a thread.

:func:`serve` is ``llmrs serve``'s loop. On SIGTERM (or Ctrl-C), with a
``drain`` (the app's engine loop, a :class:`Drainable`), it starts the drain at
once — ``/ready`` turns 503 and new requests get a 503 body, while the server
still listens (an orchestrator takes a moment to stop sending: those clients get
an answer, not a refused connection) — and lets the requests in flight finish,
for at most ``drain_timeout`` seconds, after which the engine loop aborts them
and their clients get an error (a 503 body, or an error event and ``[DONE]``).
Once the engine is idle it stops listening, gives the connections
``DRAIN_GRACE_S`` to finish writing, stops the engine loop and returns
normally, so the process exits 0 (uvicorn on its own re-raises the signal after
draining, and the process would die of it). A second signal stops waiting.

With a ``startup`` (the app's engine loop, a :class:`Startup`), a start-up that
fails — the KV pool cannot be allocated, warm-up raises — stops the server at
once and :func:`serve` raises :class:`EngineStartError` with the reason, so that
``llmrs serve`` exits non-zero with it on stderr instead of listening forever in
state ``failed``.

Both run with :class:`~.limits.ConnectionLimits` (header and body read
timeouts, concurrency, header size): a client that trickles its request is
cut off, never held open.

:class:`BackgroundServer` runs an app on a free port of 127.0.0.1 in a thread,
for tests and notebooks: ``with BackgroundServer(app) as url: ...``; it waits
until ``GET /ready`` answers 200 (an app without that route: until it listens),
and it is always stopped on leaving the block.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Protocol

import httpx
import uvicorn
from fastapi import FastAPI

from .limits import ConnectionLimits

#: seconds the connections get to finish writing once the engine has no request left
DRAIN_GRACE_S = 2.0


class Drainable(Protocol):
    """What :func:`serve` drains on SIGTERM (:class:`~.loop.EngineLoop`)."""

    def drain(self, timeout: float | None = None) -> None:
        """Refuse new requests from now on; cut those still running after ``timeout`` seconds."""

    @property
    def idle(self) -> bool:
        """No request is in flight or queued."""


class Startup(Protocol):
    """What :func:`serve` watches while the app starts (:class:`~.loop.EngineLoop`)."""

    #: set once the app serves
    ready: threading.Event

    @property
    def error(self) -> str | None:
        """Why it failed for good (``None`` while it has not)."""


class EngineStartError(RuntimeError):
    """The app's engine failed to start (``llmrs serve`` exits 1 with this message)."""


class _DrainingServer(uvicorn.Server):
    """uvicorn's server with our own signal handling: drain, then exit normally (0).

    With a ``drain``, the first signal starts it and a thread sets ``should_exit`` once it is
    idle (or ``drain_timeout`` plus the grace has passed); uvicorn goes on serving until then.
    With a ``startup``, a start-up that fails (before ``startup.ready``) sets ``should_exit``
    and :attr:`startup_error`."""

    def __init__(self, config: uvicorn.Config, drain: Drainable | None = None, drain_timeout: float = 30.0,
                 startup: Startup | None = None):
        super().__init__(config)
        self.drain, self.drain_timeout = drain, drain_timeout
        self._draining = False
        self._watched: Startup | None = startup  # (not ``startup``: uvicorn.Server has a method of that name)
        #: why the app's start-up failed, once it has
        self.startup_error: str | None = None

    async def on_tick(self, counter: int) -> bool:
        """uvicorn asks ten times a second whether to stop; also when the start-up has failed."""
        watched = self._watched
        if watched is not None and not watched.ready.is_set():
            error = watched.error
            if error is not None:
                self.startup_error = error
                self._watched = None
                return True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals can only be handled on the main thread
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for the requests in flight
        self.terminate()

    def terminate(self) -> None:
        """What SIGTERM does: start the drain (the first time), else stop waiting for it."""
        if self.drain is not None and not self._draining:
            self._draining = True
            self.drain.drain(self.drain_timeout)
            threading.Thread(target=self._exit_when_drained, name="llmrs-drain", daemon=True).start()
            return
        self.should_exit = True

    def _exit_when_drained(self) -> None:
        deadline = time.monotonic() + self.drain_timeout + DRAIN_GRACE_S
        while not self.should_exit and not self.drain.idle and time.monotonic() < deadline:
            time.sleep(0.05)
        self.should_exit = True


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout: float = 30.0,
          log_level: str = "info", access_log: bool = True, drain: Drainable | None = None,
          startup: Startup | None = None, limits: ConnectionLimits | None = None) -> None:
    """Serve ``app`` until SIGTERM or Ctrl-C; in-flight requests get ``drain_timeout`` seconds to finish.
    ``access_log=False`` leaves out uvicorn's line per HTTP request (the app's JSON lines replace it).
    ``drain``: what to drain first (our app's ``app.state.engine_loop``); without one, uvicorn's own
    graceful shutdown (stop listening, wait up to ``drain_timeout`` for the connections).
    ``startup``: what must start for the server to serve (the engine loop again); if it fails
    instead, the server stops and :class:`EngineStartError` says why. ``limits``: the connections'
    (default :class:`~.limits.ConnectionLimits`)."""
    graceful = DRAIN_GRACE_S if drain is not None else drain_timeout
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=graceful, access_log=access_log,
                            **(limits or ConnectionLimits()).uvicorn_options())
    server = _DrainingServer(config, drain, drain_timeout, startup)
    server.run()
    if server.startup_error is not None:
        raise EngineStartError(f"the engine could not start: {server.startup_error}")
    if not server.started:
        raise OSError(f"the server could not start on {host}:{port} (see the log above)")


class BackgroundServer:
    """``app`` served on 127.0.0.1 and a free port, in a daemon thread; the context value is its URL.

    Entering waits (at most ``start_timeout`` seconds) until the app listens and, with
    ``wait_ready``, until ``GET /ready`` is 200 (a 404: the app has no readiness route).
    With ``drain`` (``app.state.engine_loop``), :meth:`terminate` drains as ``llmrs serve``
    does on SIGTERM, within ``drain_timeout`` seconds.
    """

    def __init__(self, app: FastAPI, start_timeout: float = 60.0, drain_timeout: float = 5.0,
                 wait_ready: bool = True, drain: Drainable | None = None, limits: ConnectionLimits | None = None):
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=DRAIN_GRACE_S if drain is not None else drain_timeout,
                                **(limits or ConnectionLimits()).uvicorn_options())
        self.server = _DrainingServer(config, drain, drain_timeout)
        self.start_timeout = start_timeout
        self.wait_ready = wait_ready
        self.thread = threading.Thread(target=self.server.run, name="llmrs-http", daemon=True)
        self.url = ""

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            self.stop()
            raise RuntimeError(f"the server did not start within {self.start_timeout:g} s")
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        if self.wait_ready:
            self._wait_ready(deadline)
        return self.url

    def _wait_ready(self, deadline: float) -> None:
        last = "no answer"
        while time.monotonic() < deadline and self.thread.is_alive():
            try:
                r = httpx.get(self.url + "/ready", timeout=2.0, trust_env=False)
                if r.status_code in (200, 404):
                    return
                last = f"{r.status_code} {r.text[:300]}"
                if r.json().get("status") in ("failed", "stopped"):
                    break  # it will never be ready
            except (httpx.HTTPError, ValueError) as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the server was not ready within {self.start_timeout:g} s: GET /ready said {last}")

    def terminate(self) -> None:
        """Do what SIGTERM does to ``llmrs serve`` (with ``drain``: drain, then stop by itself)."""
        self.server.terminate()

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["DRAIN_GRACE_S", "BackgroundServer", "Drainable", "EngineStartError", "Startup", "serve"]
