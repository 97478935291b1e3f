"""Running the app with uvicorn (chapter 11): in the foreground (``llmrs serve``) or in a thread.

:func:`serve` is ``llmrs serve``'s loop. On SIGTERM (or Ctrl-C) it calls
``on_drain(drain_timeout)`` at once (the app's engine loop: ``/ready`` turns
503, new requests get 503), stops accepting connections, lets the requests in
flight finish — for at most ``drain_timeout`` seconds, after which the engine
loop aborts them and their clients get an error (a 503 body, or an error event
and ``[DONE]``); uvicorn closes what is still open a second later — stops the
engine loop and returns normally, so the process exits 0 (uvicorn on its own
re-raises the signal after draining, and the process would die of it).

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
from collections.abc import Callable, Iterator
from types import FrameType

import httpx
import uvicorn
from fastapi import FastAPI


class _DrainingServer(uvicorn.Server):
    """uvicorn's server with our own signal handling: drain, then exit normally (0).

    ``on_drain`` is called once, on the first signal, before uvicorn stops listening."""

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], None] | None = None):
        super().__init__(config)
        self.on_drain = on_drain

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
        if not self.should_exit and self.on_drain is not None:
            self.on_drain()
        self.should_exit = True


#: seconds uvicorn waits after the drain timeout, for the errors of the requests cut off to be sent
DRAIN_GRACE_S = 1.0


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout: float = 30.0,
          log_level: str = "info", access_log: bool = True,
          on_drain: Callable[[float], None] | None = None) -> None:
    """Serve ``app`` until SIGTERM or Ctrl-C; in-flight requests get ``drain_timeout`` seconds to finish.
    ``access_log=False`` leaves out uvicorn's line per HTTP request (the app's JSON lines replace it).
    ``on_drain(drain_timeout)`` runs on the first signal (``EngineLoop.drain`` for our app)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=drain_timeout + DRAIN_GRACE_S, access_log=access_log)
    server = _DrainingServer(config, None if on_drain is None else (lambda: on_drain(drain_timeout)))
    server.run()
    if not server.started:
        raise OSError(f"the server could not start on {host}:{port} (see the log above)")


class BackgroundServer:
    """``app`` served on 127.0.0.1 and a free port, in a daemon thread; the context value is its URL.

    Entering waits (at most ``start_timeout`` seconds) until the app listens and, with
    ``wait_ready``, until ``GET /ready`` is 200 (a 404: the app has no readiness route).
    """

    def __init__(self, app: FastAPI, start_timeout: float = 60.0, drain_timeout: float = 5.0,
                 wait_ready: bool = True):
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=drain_timeout)
        self.server = _DrainingServer(config)
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

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["BackgroundServer", "serve"]
