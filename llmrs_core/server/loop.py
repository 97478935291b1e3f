"""The engine loop (chapter 11): one thread owns the engine; HTTP handlers talk to it through queues.

The continuous-batching :class:`~llmrs_core.engine.Engine` is not thread-safe,
and a forward pass must never run on the event loop (every other client would
wait for it). So one thread, and only that thread, touches the engine:

* HTTP handlers (on the asyncio event loop) call :meth:`EngineLoop.submit`
  with the requests of one HTTP call. The submission goes into a queue under a
  condition variable; the handler awaits the answer: a :class:`ResponseStream`
  once the engine has accepted the requests, or the ``RequestRejected`` (a
  ``ValueError``) that ``Engine.add_request`` raised — before any byte of the
  response is sent, so it can still become a 400.
* The loop thread sleeps on the condition while there is nothing to do (no
  spinning). Otherwise, every iteration: admit the new submissions, apply the
  aborts (a request cancelled while still queued is never added, so it is
  never prefilled), run one ``engine.step()``, and hand each output to its
  stream with ``loop.call_soon_threadsafe`` — the only way another thread may
  touch asyncio objects. Then ``on_step(engine, outputs)`` (the metrics) and
  ``engine.release`` for the requests that are over: the engine keeps no state
  for finished requests.
* A client that goes away calls :meth:`EngineLoop.abort`; the abort is applied
  before the next step, so the request computes at most the step in progress.
* If an exception escapes the loop (a bug, not a failing request: those finish
  alone with reason ``"error"``), the loop is dead: :attr:`EngineLoop.error`
  says why, every open stream raises :class:`EngineDeadError`, and so does
  every later ``submit``. ``/health`` turns 503.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..engine import Engine, RequestOutput
from ..sampling import SamplingParams


class EngineDeadError(RuntimeError):
    """The engine loop stopped (it failed, or the server is shutting down); no request can run."""


class QueueFullError(RuntimeError):
    """More requests are waiting than the server's ``max_queue`` allows (an HTTP 429)."""


@dataclass(frozen=True)
class EngineRequest:
    """One engine request, as a handler prepares it: the prompt is already token ids.

    ``ignore_eos`` generates exactly ``max_tokens`` (benchmarks); ``logprobs``: see
    ``Engine.add_request``.
    """

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None


class ResponseStream:
    """The outputs of the engine requests of one HTTP call, in the order the engine made them.

    An async iterator of :class:`~llmrs_core.engine.RequestOutput` (each names its
    ``request_id``); it ends once every request has finished, and raises
    :class:`EngineDeadError` if the engine loop died first. Lives on the event loop:
    the engine thread only reaches it through ``loop.call_soon_threadsafe``.
    """

    def __init__(self, request_ids: Sequence[str], loop: asyncio.AbstractEventLoop):
        self.request_ids = list(request_ids)
        self.loop = loop
        self._queue: asyncio.Queue[RequestOutput | EngineDeadError] = asyncio.Queue()
        self._open = set(self.request_ids)

    def put(self, item: RequestOutput | EngineDeadError) -> None:
        """Called on the event loop (via ``call_soon_threadsafe``)."""
        self._queue.put_nowait(item)

    @property
    def unfinished(self) -> list[str]:
        """The requests that have not finished yet (those to abort if the client leaves)."""
        return [rid for rid in self.request_ids if rid in self._open]

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if not self._open:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, EngineDeadError):
            self._open.clear()
            raise item
        if item.finished:
            self._open.discard(item.request_id)
        return item


@dataclass
class _Submission:
    requests: list[EngineRequest]
    stream: ResponseStream
    accepted: asyncio.Future  # resolves to None, or to the exception add_request raised


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    """Resolve ``future`` on its event loop (the handler may have gone away: then nothing)."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable, *args: object) -> None:
    """``loop.call_soon_threadsafe``, except that a closed event loop (its server is gone)
    is no error of the engine loop's: there is no one left to tell."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise


class EngineLoop:
    """The thread that owns the engine; see the module docstring for the protocol.

    Args:
        make_engine: builds the engine, *in the loop thread* (loading weights and
            compiling kernels happen there, while ``/health`` says 503).
        max_queue: the most requests waiting for the engine (submitted and not yet
            running) before :meth:`submit` raises :class:`QueueFullError`; ``None``: no limit.
        on_step: called in the loop thread after every iteration with the engine and
            that iteration's outputs — its aborts (finish reason ``"abort"``) first, then
            the step's — before finished requests are released: the metrics, logs and
            traces read the engine here.
    """

    def __init__(
        self,
        make_engine: Callable[[], Engine],
        max_queue: int | None = None,
        on_step: Callable[[Engine, list[RequestOutput]], None] | None = None,
    ):
        self._make_engine = make_engine
        self.max_queue = max_queue
        self._on_step = on_step
        self._cond = threading.Condition()
        self._submissions: deque[_Submission] = deque()
        self._aborts: set[str] = set()
        self._pending = 0  # requests in self._submissions
        self._engine_waiting = 0  # the engine's waiting queue after the last iteration
        self._streams: dict[str, ResponseStream] = {}  # loop thread only
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: set once the engine is built and warm: requests run from then on
        self.ready = threading.Event()
        #: why the loop died (``None`` while it is alive)
        self.error: str | None = None
        #: engine steps taken (read from other threads for statistics only)
        self.steps = 0
        #: the engine, once built — only the loop thread uses it; others may *read* it while
        #: the loop is idle (tests check that it holds no request state)
        self.engine: Engine | None = None

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine loop is already started")
        self._thread = threading.Thread(target=self._run, name="llmrs-engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop: requests still in flight are aborted and their streams end with
        :class:`EngineDeadError`. Waits up to ``timeout`` seconds for the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # -- the handlers' side (event loop) ------------------------------------------------

    async def submit(self, requests: Sequence[EngineRequest]) -> ResponseStream:
        """Queue the requests of one HTTP call; returns their stream once the engine accepted all.

        Raises :class:`QueueFullError` (nothing queued), ``RequestRejected`` /
        ``ValueError`` from ``Engine.add_request`` (nothing left in the engine), or
        :class:`EngineDeadError`. If the caller is cancelled while waiting, the
        requests are aborted.
        """
        loop = asyncio.get_running_loop()
        stream = ResponseStream([r.request_id for r in requests], loop)
        submission = _Submission(list(requests), stream, loop.create_future())
        with self._cond:
            if self.error is not None or self._stopping:
                raise EngineDeadError(self.error or "the server is shutting down")
            if self.max_queue is not None and self._pending + self._engine_waiting + len(requests) > self.max_queue:
                raise QueueFullError(
                    f"too many requests waiting ({self._pending + self._engine_waiting}; the limit is "
                    f"{self.max_queue}): retry later"
                )
            self._submissions.append(submission)
            self._pending += len(requests)
            self._cond.notify()
        try:
            await submission.accepted
        except asyncio.CancelledError:
            self.abort(stream.request_ids)
            raise
        return stream

    def abort(self, request_ids: Sequence[str]) -> None:
        """Cancel requests (thread-safe; unknown or finished ids are ignored). Applied before
        the next engine step; a request not yet admitted is never added to the engine."""
        with self._cond:
            self._aborts.update(request_ids)
            self._cond.notify()

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet running (an estimate from another thread)."""
        return self._pending + self._engine_waiting

    # -- the loop thread --------------------------------------------------------------

    def _run(self) -> None:
        engine = None
        try:
            engine = self.engine = self._make_engine()
            self.ready.set()
            while True:
                with self._cond:
                    while not (self._stopping or self._submissions or self._aborts or engine.has_unfinished()):
                        self._cond.wait()
                    if self._stopping:
                        break
                    submissions, self._submissions = list(self._submissions), deque()
                    aborts, self._aborts = self._aborts, set()
                    self._pending -= sum(len(s.requests) for s in submissions)
                self._iterate(engine, submissions, aborts)
                del submissions  # while the loop sleeps it holds no request's stream
            self._shut_down(engine, EngineDeadError("the server is shutting down"))
        except BaseException as e:  # the loop is dead: say why to everyone waiting on it
            self.error = f"the engine loop failed: {type(e).__name__}: {e}"
            self._shut_down(engine, EngineDeadError(self.error))

    def _iterate(self, engine: Engine, submissions: list[_Submission], aborts: set[str]) -> None:
        """One iteration: admit, apply aborts, step, deliver, observe, release."""
        for s in submissions:
            self._admit(engine, s, aborts)
        finished = [rid for rid in aborts if rid in self._streams]
        aborted = [RequestOutput(rid, [], "", True, "abort") for rid in finished]
        for rid, out in zip(finished, aborted):
            engine.abort(rid)
            self._deliver(out)
        outputs: list[RequestOutput] = []
        if engine.has_unfinished():
            outputs = engine.step()
            self.steps = engine.steps
            engine.check_progress(outputs)
        for out in outputs:
            self._deliver(out)
        if self._on_step is not None:
            self._on_step(engine, aborted + outputs)
        for rid in finished + [o.request_id for o in outputs if o.finished]:
            engine.release(rid)
        self._engine_waiting = len(engine.scheduler.waiting)

    def _admit(self, engine: Engine, s: _Submission, aborts: set[str]) -> None:
        """Add one submission's requests (all or none); settle its future."""
        loop = s.stream.loop
        if all(r.request_id in aborts for r in s.requests):  # the client left before admission
            _call_soon(loop, _settle, s.accepted, None)
            return
        added: list[str] = []
        try:
            for r in s.requests:
                added.append(engine.add_request(
                    r.prompt_ids, r.max_tokens, r.sampling, r.stop, request_id=r.request_id,
                    ignore_eos=r.ignore_eos, logprobs=r.logprobs,
                ))
        except ValueError as e:  # RequestRejected and the other refusals of add_request
            for rid in added:
                engine.abort(rid)
                engine.release(rid)
            _call_soon(loop, _settle, s.accepted, e)
            return
        for rid in added:
            self._streams[rid] = s.stream
        _call_soon(loop, _settle, s.accepted, None)

    def _deliver(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return
        if out.finished:
            del self._streams[out.request_id]
        _call_soon(stream.loop, stream.put, out)

    def _shut_down(self, engine: Engine | None, error: EngineDeadError) -> None:
        """End every stream and pending submission with ``error``; free what the engine holds."""
        with self._cond:
            self._stopping = True
            submissions, self._submissions = list(self._submissions), deque()
            self._pending = 0
        for s in submissions:
            _call_soon(s.stream.loop, _settle, s.accepted, error)
        streams, self._streams = self._streams, {}
        for rid in streams:
            if engine is not None:
                try:
                    engine.abort(rid)
                except Exception:  # the engine may be what broke; the streams must still end
                    pass
        for stream in {id(s): s for s in streams.values()}.values():
            _call_soon(stream.loop, stream.put, error)


__all__ = ["EngineDeadError", "EngineLoop", "EngineRequest", "QueueFullError", "ResponseStream"]
