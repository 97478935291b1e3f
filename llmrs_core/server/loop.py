"""The engine loop (chapters 11, 12): one thread owns the engine; HTTP handlers talk to it through queues.

The continuous-batching :class:`~llmrs_core.engine.Engine` is not thread-safe,
and a forward pass must never run on the event loop (every other client would
wait for it). So one thread, and only that thread, touches the engine:

* :meth:`EngineLoop.submit` (from the event loop) queues one HTTP call's
  requests and returns a :class:`ResponseStream` once the engine has accepted
  them, or raises the ``RequestRejected`` (a ``ValueError``, so a 400) before
  any byte is sent. :meth:`EngineLoop.abort` is applied before the next step.
* Each iteration: admit, apply aborts, one ``engine.step()``, hand outputs to
  their streams with ``loop.call_soon_threadsafe``, ``on_step(outputs, stats)``
  (:class:`~llmrs_core.engine.StepStats` only, never the engine), and
  ``engine.release`` for finished requests. The thread sleeps when idle.

Fault tolerance (chapter 12.3; :mod:`.supervisor`, :mod:`.faults`): the loop's
:attr:`~EngineLoop.state` (:class:`~.faults.LoopState`) is what ``/ready`` and
``/health`` report. A request's own failure fails that request alone; an engine
failure (an escaped exception, or a wholly failed step whose ``Engine.probe``
fails too) restarts a fresh engine, up to the crash-loop guard
(``max_restarts`` within ``restart_window``, then ``failed``). Deadlines raise
:class:`RequestTimeoutError` (504); slow consumers past ``max_buffered``
:class:`SlowConsumerError`; a step past ``step_timeout`` makes the loop
``stalled``; :meth:`EngineLoop.drain` on SIGTERM; a dead loop raises
:class:`EngineDeadError`. Clients see only :data:`REQUEST_FAILED`,
:data:`ENGINE_RESTARTED`, :data:`ENGINE_FAILED`; details go to the log.
The states' table and each rule's reasons: chapter 12.3 ("The engine loop's
rules, in full"). Fairness: the k-th sequence of one HTTP call gets priority k,
so calls are admitted round-robin, one sequence each per round.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine import Engine, RequestOutput, StepStats
from ..sampling import SamplingParams
from .faults import (
    ENGINE_FAILED,
    READY_STATES,
    REQUEST_FAILED,
    WEDGED_STATES,
    EngineDeadError,
    LoopState,
    QueueFullError,
    RequestTimeoutError,
    SlowConsumerError,
    StepFailed,
    StepStalled,
    StreamError,
)
from .supervisor import Supervisor, batch_of


@dataclass(frozen=True)
class EngineRequest:
    """One engine request, as a handler prepares it: the prompt is already token ids.

    ``ignore_eos`` generates exactly ``max_tokens`` (benchmarks); ``logprobs``: see
    ``Engine.add_request``. ``priority``: the engine's admission order (lower first, then
    arrival); the server gives the k-th sequence of an HTTP call priority k (see Fairness
    in the module docstring).
    """

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    priority: int = 0


_WAKE = object()  # wakes a reader after fail(); carries nothing


class ResponseStream:
    """The outputs of the engine requests of one HTTP call, in the order the engine made them.

    An async iterator of :class:`~llmrs_core.engine.RequestOutput` (each names its
    ``request_id``); it ends once every request has finished, and raises a
    :class:`StreamError` if they cannot: :class:`EngineDeadError` (the loop died or
    shut down), :class:`RequestTimeoutError` (``timeout`` seconds after it was made),
    :class:`SlowConsumerError` (more than ``max_buffered`` outputs per request waited
    for the reader). The last two also call ``abort(unfinished request ids)``. Lives on the
    event loop: the engine thread only reaches it through ``loop.call_soon_threadsafe``.
    """

    def __init__(self, request_ids: Sequence[str], loop: asyncio.AbstractEventLoop, *,
                 max_buffered: int | None = None, timeout: float | None = None,
                 abort: Callable[[list[str]], None] | None = None):
        self.request_ids = list(request_ids)
        self.loop = loop
        #: the most outputs waiting for the reader: ``max_buffered`` per request
        self.limit = None if max_buffered is None else max_buffered * len(self.request_ids)
        self._abort = abort
        self._queue: asyncio.Queue = asyncio.Queue()
        self._open = set(self.request_ids)
        self._error: StreamError | None = None
        self._timer = None if timeout is None else loop.call_later(timeout, self._expire, timeout)

    def put(self, item: RequestOutput | StreamError) -> None:
        """Called on the event loop (via ``call_soon_threadsafe``). A :class:`StreamError` is
        raised to the reader after the outputs before it."""
        if self._error is not None:
            return  # the stream has failed; nobody will read the rest
        if self.limit is not None and isinstance(item, RequestOutput) and self._queue.qsize() >= self.limit:
            self.fail(SlowConsumerError(
                f"the client did not read its stream: {self._queue.qsize()} outputs were waiting for it (the "
                f"limit is {self.limit}), so its requests were aborted"), abort=True)
            return
        self._queue.put_nowait(item)

    def fail(self, error: StreamError, abort: bool = False) -> None:
        """End the stream now with ``error`` (its reader gets it next, before anything buffered);
        with ``abort``, the unfinished requests are aborted in the engine. On the event loop."""
        if self._error is not None or not self._open:
            return
        if abort and self._abort is not None:
            self._abort(self.unfinished)
        self._error = error
        self.close()
        self._queue.put_nowait(_WAKE)

    def close(self) -> None:
        """Cancel the deadline (the response is over); idempotent."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, timeout: float) -> None:
        self._timer = None
        self.fail(RequestTimeoutError(f"the request did not finish within its deadline of {timeout:g} s "
                                      "(--request-timeout); it was aborted"), abort=True)

    @property
    def unfinished(self) -> list[str]:
        """The requests that have not finished yet (those to abort if the client leaves)."""
        return [rid for rid in self.request_ids if rid in self._open]

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if not self._open:
            self.close()
            raise StopAsyncIteration
        if self._error is None:
            item = await self._queue.get()  # no suspension when an item is waiting
        if self._error is not None:
            self._open.clear()
            raise self._error
        if isinstance(item, StreamError):
            self._open.clear()
            self.close()
            raise item
        if item.finished:
            self._open.discard(item.request_id)
        return item


@dataclass
class _Submission:
    requests: list[EngineRequest]
    stream: ResponseStream
    accepted: asyncio.Future  # resolves to None, or to the exception add_request raised
    handled: bool = False  # the loop thread has admitted or refused it


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
            compiling kernels happen there, while ``/ready`` says 503); called again
            for a fresh engine after a failure.
        max_queue: the most requests waiting for the engine (submitted and not yet
            running) before :meth:`submit` raises :class:`QueueFullError`; ``None``: no limit.
        on_step: called in the loop thread after every iteration with that iteration's
            outputs — its aborts (finish reason ``"abort"``) first, then the step's — and the
            engine's :class:`~llmrs_core.engine.StepStats` after it (with those outputs'
            requests): the metrics, logs and traces read only these.
        max_buffered: the most outputs a stream holds per request for a client that does
            not read them (:class:`SlowConsumerError` past it); ``None``: no limit.
        step_timeout: seconds one engine step may take before the watchdog declares the
            loop stalled; ``None``: no watchdog.
        max_restarts, restart_window: the crash-loop guard: at most ``max_restarts``
            fresh engines within ``restart_window`` seconds; the next failure is final.
        on_failure: called (in the loop or watchdog thread) with one record per engine
            failure: ``{"event": "engine_failure", "error", "where", "action": "restart" |
            "unready", "restarts_in_window", "batch": [{"request_id", "prompt_tokens",
            "computed_tokens", "completion_tokens"}], "failed", "retried"}``.
    """

    def __init__(
        self,
        make_engine: Callable[[], Engine],
        max_queue: int | None = None,
        on_step: Callable[[list[RequestOutput], StepStats], None] | None = None,
        *,
        max_buffered: int | None = None,
        step_timeout: float | None = None,
        max_restarts: int = 3,
        restart_window: float = 60.0,
        on_failure: Callable[[dict], None] | None = None,
    ):
        if step_timeout is not None and not step_timeout > 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {step_timeout}")
        if max_buffered is not None and max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {max_buffered}")
        self._make_engine = make_engine
        self.max_queue = max_queue
        self.max_buffered = max_buffered
        self.step_timeout = step_timeout
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self._supervisor = Supervisor(self, max_restarts, restart_window)
        self._on_step = on_step
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._submissions: deque[_Submission] = deque()
        self._aborts: set[str] = set()
        self._pending = 0  # requests in self._submissions
        self._engine_waiting = 0  # the engine's waiting queue after the last iteration
        self._streams: dict[str, ResponseStream] = {}  # loop thread (the watchdog only while a step is stuck)
        self._requests: dict[str, EngineRequest] = {}  # admitted and unfinished: what a retry re-adds
        self._stopping = False
        self._draining = False
        self._cut_off: str | None = None  # the drain timeout passed: fail what is in flight with this
        self._step_started: float | None = None  # monotonic time of the step in progress (under _cond)
        self._stalled = False
        self._stall_ids: list[str] = []  # the requests in flight when the watchdog gave the step up
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        #: set once the engine is first built and warm: requests run from then on
        self.ready = threading.Event()
        #: ``loading``, ``ready``, ``restarting``, ``draining``, ``stalled``, ``failed`` or ``stopped``
        self.state = LoopState.LOADING
        #: why the loop failed for good (``None`` until it has)
        self.error: str | None = None
        #: why the engine last failed (kept after a restart, for ``/ready`` and ``/health``)
        self.last_failure: str | None = None
        #: fresh engines built after failures
        self.restarts = 0
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
        if self.step_timeout is not None:
            self._watchdog = threading.Thread(target=self._supervisor.watch, name="llmrs-engine-watchdog",
                                              daemon=True)
            self._watchdog.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop: requests still in flight are aborted and their streams end with
        :class:`EngineDeadError`. Waits up to ``timeout`` seconds for the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._watchdog is not None:
            self._watchdog.join(timeout)

    def drain(self, timeout: float | None = None) -> None:
        """Stop taking requests (``/ready`` 503, :meth:`submit` raises :class:`EngineDeadError`);
        those in flight go on, and after ``timeout`` seconds those still unfinished are aborted
        and get an error. Thread-safe; a second call changes nothing."""
        with self._cond:
            if self._draining:
                return
            self._draining = True
            if self.state == LoopState.READY:
                self.state = LoopState.DRAINING
        if timeout is not None:
            message = (f"the server is shutting down and this request did not finish within the drain timeout "
                       f"({timeout:g} s)")
            timer = threading.Timer(timeout, self._cut, (message,))
            timer.daemon = True
            timer.start()

    def _cut(self, message: str) -> None:
        with self._cond:
            self._cut_off = message
            self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    @property
    def idle(self) -> bool:
        """No request is in flight or queued (read from another thread: an estimate, for the drain)."""
        engine = self.engine
        return (not self._streams and not self._submissions
                and (engine is None or not self.alive or not engine.has_unfinished()))

    @property
    def accepting(self) -> bool:
        """Whether requests are taken now (``/ready``)."""
        return self.state in READY_STATES and not self._draining and self.alive

    @property
    def wedged(self) -> bool:
        """Whether the process cannot serve without outside help (``/health`` 503)."""
        return self.state in WEDGED_STATES or (self.ready.is_set() and not self.alive)

    # -- the handlers' side (event loop) ------------------------------------------------

    async def submit(self, requests: Sequence[EngineRequest], timeout: float | None = None,
                     bounded: bool = True) -> ResponseStream:
        """Queue the requests of one HTTP call; returns their stream once the engine accepted all.

        ``timeout``: the requests' deadline in seconds from now (the stream raises
        :class:`RequestTimeoutError` then). ``bounded``: whether the stream holds at most
        ``max_buffered`` outputs per request; a handler that reads the stream itself (a
        non-streamed response, at most ``max_tokens`` outputs per request) passes ``False``,
        since outputs wait there only while the event loop is busy, not for a slow client. Raises :class:`QueueFullError` (nothing queued),
        ``RequestRejected`` / ``ValueError`` from ``Engine.add_request`` (nothing left in the
        engine), :class:`EngineDeadError`, or :class:`RequestTimeoutError` (the deadline passed
        before the engine took them). If the caller is cancelled while waiting, the requests
        are aborted.
        """
        loop = asyncio.get_running_loop()
        stream = ResponseStream([r.request_id for r in requests], loop,
                                max_buffered=self.max_buffered if bounded else None,
                                timeout=timeout, abort=self.abort)
        submission = _Submission(list(requests), stream, loop.create_future())
        with self._cond:
            refusal = self._refusal()
            if refusal is not None:
                stream.close()
                raise EngineDeadError(refusal)
            if self.max_queue is not None and self._pending + self._engine_waiting + len(requests) > self.max_queue:
                stream.close()
                raise QueueFullError(
                    f"too many requests waiting ({self._pending + self._engine_waiting}; the limit is "
                    f"{self.max_queue}): retry later"
                )
            self._submissions.append(submission)
            self._pending += len(requests)
            self._cond.notify_all()
        try:
            if timeout is None:
                await submission.accepted
            else:
                await asyncio.wait_for(asyncio.shield(submission.accepted), timeout)
        except TimeoutError:
            self.abort(stream.request_ids)
            stream.close()
            raise RequestTimeoutError(f"the engine did not take the request within its deadline of {timeout:g} s "
                                      "(--request-timeout)") from None
        except asyncio.CancelledError:
            self.abort(stream.request_ids)
            stream.close()
            raise
        except BaseException:
            stream.close()
            raise
        return stream

    def _refusal(self) -> str | None:
        """Why a submission is refused now (under ``_cond``), or ``None``."""
        if self.error is not None:
            return ENGINE_FAILED
        if self._stopping:
            return "the server is shutting down"
        if self._draining:
            return "the server is draining (shutting down): send the request to another replica"
        if self._stalled:
            return f"the server is unready: an engine step has run for more than {self.step_timeout:g} s"
        return None

    def abort(self, request_ids: Sequence[str]) -> None:
        """Cancel requests (thread-safe; unknown or finished ids are ignored). Applied before
        the next engine step; a request not yet admitted is never added to the engine."""
        with self._cond:
            self._aborts.update(request_ids)
            self._cond.notify_all()

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet running (an estimate from another thread)."""
        return self._pending + self._engine_waiting

    # -- the loop thread --------------------------------------------------------------

    def _run(self) -> None:
        engine = None
        try:
            engine = self.engine = self._make_engine()
            with self._cond:
                self.state = LoopState.DRAINING if self._draining else LoopState.READY
            self.ready.set()
            while True:
                with self._cond:
                    while not (self._stopping or self._cut_off or self._submissions or self._aborts
                               or engine.has_unfinished()):
                        self._cond.wait()
                    if self._stopping:
                        break
                    cut_off, self._cut_off = self._cut_off, None
                    submissions = self._take_submissions()
                    aborts, self._aborts = self._aborts, set()
                if cut_off is not None:
                    self._fail_streams(engine, EngineDeadError(cut_off))
                try:
                    self._iterate(engine, submissions, aborts)
                except Exception as e:  # the engine failed: restart it, or give up
                    engine = self._supervisor.recover(engine, e, submissions)
                    if engine is None:
                        return
                del submissions  # while the loop sleeps it holds no request's stream
            self._shut_down(engine, EngineDeadError("the server is shutting down"), LoopState.STOPPED)
        except BaseException as e:  # the loop is dead: say why in the log, and ENGINE_FAILED to everyone waiting
            self.error = f"the engine loop failed: {type(e).__name__}: {e}"
            self._report({"event": "engine_failure", "time": round(time.time(), 3), "error": self.error,
                          "where": "loop" if self.ready.is_set() else "start", "action": "unready",
                          "failed": sorted(self._streams)})
            self._shut_down(engine, EngineDeadError(ENGINE_FAILED), LoopState.FAILED)

    def _iterate(self, engine: Engine, submissions: list[_Submission], aborts: set[str]) -> None:
        """One iteration: admit, apply aborts, step, observe, deliver, release."""
        for s in submissions:
            self._admit(engine, s, aborts)
        finished = [rid for rid in aborts if rid in self._streams]
        aborted = self._abort_all(engine, finished)
        for out in aborted:
            self._deliver(out)
        outputs: list[RequestOutput] = []
        if engine.has_unfinished():
            outputs = self._step(engine)
            self.steps = engine.steps
            engine.check_progress(outputs)
        stats = engine.step_stats([o.request_id for o in aborted + outputs])
        failed = None
        if outputs and not stats.running and all(o.finish_reason == "error" for o in outputs):
            # the batch failed, and each sequence again alone: the engine's fault only if a known-good
            # probe fails too (else the requests failed alone). Its error outputs then reach their
            # clients from the supervisor, after the failure is logged.
            probe_error = self._probe(engine)
            if probe_error is not None:
                failed = StepFailed(outputs, batch_of(stats, [o.request_id for o in outputs]), probe_error)
        if self._on_step is not None:  # metrics and log lines first: a client holding its answer finds them
            self._on_step(aborted + outputs, stats)
        if failed is None:
            for out in outputs:
                self._deliver(out)
        for rid in finished + [o.request_id for o in outputs if o.finished]:
            engine.release(rid)
        self._engine_waiting = stats.num_waiting
        if failed is not None:
            raise failed

    def _step(self, engine: Engine) -> list[RequestOutput]:
        """``engine.step()``, timed for the watchdog; :class:`StepStalled` if it gave the step up."""
        return self._timed(engine.step)

    def _probe(self, engine: Engine) -> str | None:
        """``engine.probe()``, timed for the watchdog: ``None`` if the model computes, else why not."""
        try:
            self._timed(engine.probe)
        except StepStalled:
            raise
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return None

    def _timed(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` (a step or a probe) under the watchdog's eye; :class:`StepStalled` if it
        gave it up meanwhile."""
        with self._cond:
            self._step_started = time.monotonic()
        error = result = None
        try:
            result = work()
        except Exception as e:
            error = e
        with self._cond:
            self._step_started = None
            stalled = self._stalled
        if stalled:
            raise StepStalled(f"an engine step ran for more than {self.step_timeout:g} s (--step-timeout)")
        if error is not None:
            raise error
        return result

    def _admit(self, engine: Engine, s: _Submission, aborts: set[str]) -> None:
        """Add one submission's requests (all or none); settle its future."""
        loop = s.stream.loop
        s.handled = True
        if all(r.request_id in aborts for r in s.requests):  # the client left before admission
            _call_soon(loop, _settle, s.accepted, None)
            return
        added: list[str] = []
        try:
            for r in s.requests:
                added.append(self._add(engine, r))
        except Exception as e:  # RequestRejected (a ValueError: a 400); anything else fails this call only
            for rid in added:
                engine.abort(rid)
                engine.release(rid)
            if not isinstance(e, ValueError):
                self._report({"event": "admission_error", "time": round(time.time(), 3),
                              "error": f"{type(e).__name__}: {e}", "where": "admission", "action": "refused",
                              "failed": [r.request_id for r in s.requests]})
                e = StreamError("the engine could not take the request (the server's log has the details)")
            _call_soon(loop, _settle, s.accepted, e)
            return
        for r in s.requests:
            self._streams[r.request_id] = s.stream
            self._requests[r.request_id] = r
        _call_soon(loop, _settle, s.accepted, None)

    @staticmethod
    def _add(engine: Engine, r: EngineRequest) -> str:
        return engine.add_request(r.prompt_ids, r.max_tokens, r.sampling, r.stop, request_id=r.request_id,
                                  ignore_eos=r.ignore_eos, logprobs=r.logprobs, priority=r.priority)

    def _deliver(self, out: RequestOutput, error: str = REQUEST_FAILED) -> None:
        """Hand ``out`` to its stream; an error output carries ``error`` (a stable text, formatted
        with the request's id) instead of the engine's message, which only the log sees."""
        stream = self._streams.get(out.request_id)
        if stream is None:
            return
        if out.finish_reason == "error":
            out = dataclasses.replace(out, error=error.format(id=out.request_id))
        if out.finished:
            del self._streams[out.request_id]
            self._requests.pop(out.request_id, None)
        _call_soon(stream.loop, stream.put, out)

    # -- failures (the supervisor's tools) and fan-out ------------------------------------

    def _observe_quietly(self, engine: Engine | None, outputs: list[RequestOutput]) -> None:
        """``on_step`` for requests failed outside a normal step (the engine may be broken)."""
        if self._on_step is None or engine is None or not outputs:
            return
        try:
            self._on_step(outputs, engine.step_stats([o.request_id for o in outputs]))
        except Exception:
            pass

    def _report(self, record: dict) -> None:
        if self._on_failure is not None:
            try:
                self._on_failure(record)
            except Exception:
                pass

    def _fail_streams(self, engine: Engine, error: StreamError) -> None:
        """Abort every request in flight and end its stream with ``error`` (the drain timeout)."""
        streams = self._take_streams()
        outputs = self._abort_all(engine, streams)
        self._end_streams(streams.values(), error)
        self._observe_quietly(engine, outputs)
        for rid in streams:
            engine.release(rid)

    def _shut_down(self, engine: Engine | None, error: EngineDeadError, state: LoopState) -> None:
        """End every stream and pending submission with ``error``; free what the engine holds."""
        with self._cond:
            self._stopping = True
            self.state = state
            submissions = self._take_submissions()
            self._cond.notify_all()
        self._refuse(submissions, error)
        streams = self._take_streams()
        if engine is not None:  # the engine may be what broke; the streams must still end
            self._abort_quietly(engine, streams)
        self._end_streams(streams.values(), error)

    def _take_submissions(self) -> list[_Submission]:
        """Every pending submission, out of the queue (under ``_cond``)."""
        submissions, self._submissions = list(self._submissions), deque()
        self._pending -= sum(len(s.requests) for s in submissions)
        return submissions

    def _requeue(self, submissions: list[_Submission]) -> None:
        """Put submissions taken by :meth:`_take_submissions` back at the front (under ``_cond``)."""
        self._submissions.extendleft(reversed(submissions))
        self._pending += sum(len(s.requests) for s in submissions)

    def _take_streams(self) -> dict[str, ResponseStream]:
        """Every stream in flight by request id; the loop then tracks none."""
        streams, self._streams, self._requests = self._streams, {}, {}
        return streams

    @staticmethod
    def _refuse(submissions: Iterable[_Submission], error: StreamError) -> None:
        """Answer each submission's handler with ``error`` (on its event loop)."""
        for s in submissions:
            _call_soon(s.stream.loop, _settle, s.accepted, error)

    @staticmethod
    def _end_streams(streams: Iterable[ResponseStream], error: StreamError, fail: bool = False) -> None:
        """Hand ``error`` to each stream once (a stream serves several requests): after what it holds,
        or with ``fail`` before it."""
        for stream in {id(s): s for s in streams}.values():
            _call_soon(stream.loop, stream.fail if fail else stream.put, error)

    @staticmethod
    def _abort_all(engine: Engine, request_ids: Iterable[str]) -> list[RequestOutput]:
        """Abort each request; their ``"abort"`` outputs, in order (for ``on_step`` and the streams)."""
        outputs = []
        for rid in request_ids:
            engine.abort(rid)
            outputs.append(RequestOutput(rid, [], "", True, "abort"))
        return outputs

    @staticmethod
    def _abort_quietly(engine: Engine, request_ids: Iterable[str]) -> None:
        """Abort each request, whatever the (possibly broken) engine raises."""
        for rid in request_ids:
            try:
                engine.abort(rid)
            except Exception:
                pass


__all__ = ["ENGINE_FAILED", "REQUEST_FAILED", "EngineDeadError", "EngineLoop", "EngineRequest", "LoopState",
           "QueueFullError", "RequestTimeoutError", "ResponseStream", "SlowConsumerError", "StreamError"]
