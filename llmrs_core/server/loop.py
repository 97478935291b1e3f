"""The engine loop (chapters 11, 12): one thread owns the engine; HTTP handlers talk to it through queues.

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

Fault tolerance (chapter 12.3). The loop's :attr:`~EngineLoop.state` is what
``/ready`` and ``/health`` report:

==============  ==========  ===========  ====================================================================
state           ``/ready``  ``/health``  meaning
==============  ==========  ===========  ====================================================================
``loading``     503         200          building the engine (weights, kernels)
``ready``       200         200          taking traffic
``restarting``  503         200          an engine step failed; a fresh engine is being built
``draining``    503         200          SIGTERM: finishing the requests in flight, refusing new ones
``stalled``     503         503          a step has run past ``step_timeout`` (the process is wedged)
``failed``      503         503          the engine failed for good (crash-loop guard, or it cannot be built)
``stopped``     503         503          the loop has shut down
==============  ==========  ===========  ====================================================================

* **A request's failure is that request's failure.** The engine fails *one*
  request alone when its own forward pass or sampler raises (finish reason
  ``"error"``): that client gets its error (HTTP 500, or an error event) and
  nothing else happens — no restart, nothing counted toward the crash-loop
  guard, whatever the request's parameters or prompt. Sampling errors are
  always a request's own (the sampler cannot make NaN from finite logits, and
  the parameters that could break it are refused with a 400 up front).
* **An engine failure** is one of two things:

  1. an exception that escapes an iteration (a bug in the scheduler, the pool,
     a callback: nothing a request's parameters reach);
  2. a step in which *every* request it ran failed (the batch failed, and each
     sequence again alone) **and a known-good probe then fails too**
     (``Engine.probe``: one token through the same model and backend, on a
     KV cache of its own). If the probe passes, the model computes: those
     requests failed alone, each gets its error, and the engine goes on. So
     no request, nor any number of them, can drive the crash-loop guard: only
     a model or device that fails on an input every request could have sent.

  Then every request in that step's batch
  — and any preempted request that already streamed tokens — gets an error
  (HTTP 500, or an error event), the failure is reported to ``on_failure`` as
  one record (the app writes it as a JSON log line and counts
  ``llmrs:engine_restarts_total``), and the loop **restarts with a fresh
  engine** (a new KV pool: whatever corrupted the old state is gone). Requests
  still waiting in the engine's queue that have produced nothing are
  **retried** in the fresh engine: nothing of theirs reached a client, so the
  retry is invisible to them (their queue time starts again), and the request
  that triggered the failure is never among them, so a poisonous request is
  not replayed. Restarting rather than only going unready because most
  failures of a step are transient or state corruption (an out-of-memory, a
  bug hit by one batch), which a fresh pool cures in milliseconds, while a
  pod replacement takes the model's load time and drops every queued request.
  **Crash-loop guard:** after ``max_restarts`` restarts within
  ``restart_window`` seconds the next failure is final: the loop goes
  ``failed`` (``/ready`` and ``/health`` 503), fails everything in flight, and
  the orchestrator replaces the pod (a broken device does not heal by
  restarting the loop).
* **Deadlines** (``submit(..., timeout=)``): a timer on the event loop, not in
  the engine thread, so it fires even while a step is stuck; the requests are
  aborted (their blocks are free before the next step) and the stream raises
  :class:`RequestTimeoutError` (HTTP 504).
* **Slow consumers**: a stream buffers at most ``max_buffered`` outputs per
  request that its client has not taken (the socket's buffers come first); past
  that the requests are aborted and the stream raises :class:`SlowConsumerError`.
  The other requests never wait for it. Only streamed responses are bounded
  (``submit(..., bounded=False)`` for the others: their handler reads the
  outputs itself, and a busy event loop is no slow client).
* **A stalled step** (``step_timeout``): a watchdog thread sees a step running
  too long, marks the loop ``stalled`` and fails every request in flight and
  every pending submission at once (HTTP 503, or an error event): the HTTP
  side never hangs on the stuck thread. If the step finally returns, its
  outputs are discarded (their clients were answered), the engine is dropped,
  and the loop restarts with a fresh one as after a failed step (it counts
  toward the crash-loop guard). If it never returns, ``/health`` stays 503
  and the orchestrator's liveness probe restarts the process.
* **Drain** (:meth:`EngineLoop.drain`, on SIGTERM): ``/ready`` turns 503 and
  new submissions are refused (503) at once; requests in flight go on, and
  those still running after the drain timeout are aborted with an error.
* If a ``BaseException`` escapes the loop, or a fresh engine cannot be built,
  the loop is ``failed``: :attr:`EngineLoop.error` says why (for the operator:
  it goes to ``on_failure``, the log), every open stream raises
  :class:`EngineDeadError`, and so does every later ``submit``.
* **What clients are told.** Error messages that reach a client are stable
  texts that name only that client's own request: :data:`REQUEST_FAILED`,
  :data:`ENGINE_RESTARTED`, :data:`ENGINE_FAILED` — never an exception's class
  or text, nor another request's id. The details (exception, batch, request
  ids) go to the log only: each request's JSON line (its ``error``) and the
  ``engine_failure`` records.

Fairness. Requests are queued in the engine in the order of their
``priority`` (lower first, then arrival: the engine's ``"priority"`` policy);
the server gives the k-th sequence of one HTTP call priority k, so a call
with many sequences (prompts × ``n``) cannot starve a call that arrives after
it: calls are admitted round-robin, one sequence each per round.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine import Engine, RequestOutput
from ..sampling import SamplingParams


class StreamError(RuntimeError):
    """A response stream ended before its requests finished; :attr:`status` is the HTTP status
    to answer with (also the ``code`` of a stream's error event)."""

    status = 500


class EngineDeadError(StreamError):
    """The engine loop takes no requests: it is draining, stalled, failed or shutting down (HTTP 503)."""

    status = 503


class RequestTimeoutError(StreamError):
    """The request ran past its deadline (``--request-timeout``) and was aborted (HTTP 504)."""

    status = 504


class SlowConsumerError(StreamError):
    """The client did not read its stream: too many outputs waited for it, so it was aborted (HTTP 408)."""

    status = 408


class QueueFullError(RuntimeError):
    """More requests are waiting than the server's ``max_queue`` allows (an HTTP 429)."""


#: what the client of a request that failed in the engine is told (the error itself goes to the log)
REQUEST_FAILED = "request {id!r} failed: the server could not compute it (the server's log has the details)"
#: ... of a request failed with the engine, which was then rebuilt
ENGINE_RESTARTED = ("request {id!r} failed: the server's engine failed during its step and was restarted "
                    "(the server's log has the details)")
#: ... and once the engine has failed for good (every later request, and ``/ready``)
ENGINE_FAILED = "the server's engine failed for good and takes no requests (the server's log says why)"


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


class _StepFailed(Exception):
    """Every request of an engine step failed, and so did the probe (their error outputs,
    already observed by ``on_step``, are delivered by ``_recover`` once the failure is logged)."""

    def __init__(self, outputs: list[RequestOutput], batch: list[dict], probe_error: str):
        super().__init__(f"every request of the step failed ({outputs[0].error or 'no message'}), and so did "
                         f"a probe of the model ({probe_error})")
        self.outputs = outputs
        self.batch = batch


class _StepStalled(Exception):
    """The step returned after the watchdog had given it up (its requests were failed)."""


#: states in which ``/ready`` is 200, and those in which ``/health`` is 503 (see the module docstring)
READY_STATES = ("ready",)
WEDGED_STATES = ("stalled", "failed", "stopped")


class EngineLoop:
    """The thread that owns the engine; see the module docstring for the protocol.

    Args:
        make_engine: builds the engine, *in the loop thread* (loading weights and
            compiling kernels happen there, while ``/ready`` says 503); called again
            for a fresh engine after a failure.
        max_queue: the most requests waiting for the engine (submitted and not yet
            running) before :meth:`submit` raises :class:`QueueFullError`; ``None``: no limit.
        on_step: called in the loop thread after every iteration with the engine and
            that iteration's outputs — its aborts (finish reason ``"abort"``) first, then
            the step's — before finished requests are released: the metrics, logs and
            traces read the engine here.
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
        on_step: Callable[[Engine, list[RequestOutput]], None] | None = None,
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
        self._failures: deque[float] = deque()  # monotonic times of the recent failures
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        #: set once the engine is first built and warm: requests run from then on
        self.ready = threading.Event()
        #: ``loading``, ``ready``, ``restarting``, ``draining``, ``stalled``, ``failed`` or ``stopped``
        self.state = "loading"
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
            self._watchdog = threading.Thread(target=self._watch, name="llmrs-engine-watchdog", daemon=True)
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
            if self.state == "ready":
                self.state = "draining"
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
                self.state = "draining" if self._draining else "ready"
            self.ready.set()
            while True:
                with self._cond:
                    while not (self._stopping or self._cut_off or self._submissions or self._aborts
                               or engine.has_unfinished()):
                        self._cond.wait()
                    if self._stopping:
                        break
                    cut_off, self._cut_off = self._cut_off, None
                    submissions, self._submissions = list(self._submissions), deque()
                    aborts, self._aborts = self._aborts, set()
                    self._pending -= sum(len(s.requests) for s in submissions)
                if cut_off is not None:
                    self._fail_streams(engine, EngineDeadError(cut_off))
                try:
                    self._iterate(engine, submissions, aborts)
                except Exception as e:  # the engine failed: restart it, or give up
                    engine = self._recover(engine, e, submissions)
                    if engine is None:
                        return
                del submissions  # while the loop sleeps it holds no request's stream
            self._shut_down(engine, EngineDeadError("the server is shutting down"), "stopped")
        except BaseException as e:  # the loop is dead: say why in the log, and ENGINE_FAILED to everyone waiting
            self.error = f"the engine loop failed: {type(e).__name__}: {e}"
            self._report({"event": "engine_failure", "time": round(time.time(), 3), "error": self.error,
                          "where": "loop" if self.ready.is_set() else "start", "action": "unready",
                          "failed": sorted(self._streams)})
            self._shut_down(engine, EngineDeadError(ENGINE_FAILED), "failed")

    def _iterate(self, engine: Engine, submissions: list[_Submission], aborts: set[str]) -> None:
        """One iteration: admit, apply aborts, step, observe, deliver, release."""
        for s in submissions:
            self._admit(engine, s, aborts)
        finished = [rid for rid in aborts if rid in self._streams]
        aborted = [RequestOutput(rid, [], "", True, "abort") for rid in finished]
        for rid, out in zip(finished, aborted):
            engine.abort(rid)
            self._deliver(out)
        outputs: list[RequestOutput] = []
        if engine.has_unfinished():
            outputs = self._step(engine)
            self.steps = engine.steps
            engine.check_progress(outputs)
        failed = None
        if outputs and not engine.scheduler.running and all(o.finish_reason == "error" for o in outputs):
            # the batch failed, and each sequence again alone: the engine's fault only if a known-good
            # probe fails too (else the requests failed alone). Its error outputs then reach their
            # clients from _recover, after the failure is logged.
            probe_error = self._probe(engine)
            if probe_error is not None:
                failed = _StepFailed(outputs, self._batch(engine, [o.request_id for o in outputs]), probe_error)
        if self._on_step is not None:  # metrics and log lines first: a client holding its answer finds them
            self._on_step(engine, aborted + outputs)
        if failed is None:
            for out in outputs:
                self._deliver(out)
        for rid in finished + [o.request_id for o in outputs if o.finished]:
            engine.release(rid)
        self._engine_waiting = len(engine.scheduler.waiting)
        if failed is not None:
            raise failed

    def _step(self, engine: Engine) -> list[RequestOutput]:
        """``engine.step()``, timed for the watchdog; :class:`_StepStalled` if it gave the step up."""
        return self._timed(engine.step)

    def _probe(self, engine: Engine) -> str | None:
        """``engine.probe()``, timed for the watchdog: ``None`` if the model computes, else why not."""
        try:
            self._timed(engine.probe)
        except _StepStalled:
            raise
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return None

    def _timed(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` (a step or a probe) under the watchdog's eye; :class:`_StepStalled` if it
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
            raise _StepStalled(f"an engine step ran for more than {self.step_timeout:g} s (--step-timeout)")
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

    # -- failures -------------------------------------------------------------------------

    def _recover(self, engine: Engine, error: Exception, submissions: list[_Submission]) -> Engine | None:
        """After a failed (or stalled) step: fail its batch, retry the requests that had not started
        in a fresh engine — or, past the crash-loop guard, fail everything. Returns the fresh engine,
        or ``None`` when the loop gave up."""
        stalled = isinstance(error, _StepStalled)
        message = str(error) if isinstance(error, _StepFailed | _StepStalled) else f"{type(error).__name__}: {error}"
        self.last_failure = message
        now = time.monotonic()
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self.restart_window:
            self._failures.popleft()
        give_up = len(self._failures) > self.max_restarts
        if isinstance(error, _StepFailed):
            batch = error.batch
        else:
            batch = self._batch(engine, self._stall_ids if stalled else [r.request_id for r in engine.scheduler.running])
        unadmitted = [s for s in submissions if not s.handled]  # for the fresh engine
        in_batch = {b["request_id"] for b in batch}

        def untouched(rid: str) -> bool:  # nothing of it was computed, nothing reached its client
            r = engine.requests.get(rid)
            return r is not None and not r.output_ids and r.num_computed == 0

        retried = [] if give_up else [rid for rid in self._streams if rid not in in_batch and untouched(rid)]
        failed = [rid for rid in self._streams if rid not in retried]
        record = {"event": "engine_failure", "time": round(time.time(), 3), "error": message,
                  "where": "stall" if stalled else "step", "action": "unready" if give_up else "restart",
                  "restarts_in_window": len(self._failures) - 1, "batch": batch,
                  "failed": sorted(set(self._stall_ids) if stalled else in_batch | set(failed)), "retried": retried}
        text = f"the engine failed ({message}); the server restarted it" if not give_up else (
            f"the engine failed ({message}); the server gave up restarting it")
        for rid in failed:  # their blocks back to the old pool (kept for inspection when the loop gives up)
            try:
                engine.abort(rid)
            except Exception:
                pass
        own = {o.request_id: o for o in error.outputs} if isinstance(error, _StepFailed) else {}
        answers = [RequestOutput(rid, [], "", True, "error", error=f"request {rid!r} failed: {text}")
                   for rid in failed if rid not in own]  # for the log; clients get ENGINE_RESTARTED
        gone = [rid for rid in (self._stall_ids if stalled else ()) if rid in engine.requests]
        # metrics and the log line first: a client that has its error finds both already written
        self._observe_quietly(engine, answers + [RequestOutput(rid, [], "", True, "error", error=message)
                                                 for rid in gone])
        self._report(record)
        for out in answers + list(own.values()):  # the step's own errors were observed by on_step
            self._deliver(out, ENGINE_FAILED if give_up else ENGINE_RESTARTED)
        if give_up:
            self.error = (f"the engine failed {len(self._failures)} times within {self.restart_window:g} s, "
                          f"the last time: {message}; the server is unready for good")
            with self._cond:
                self._submissions.extendleft(reversed(unadmitted))
                self._pending += sum(len(s.requests) for s in unadmitted)
            self._shut_down(engine, EngineDeadError(ENGINE_FAILED), "failed")
            return None
        with self._cond:
            self.state = "restarting"
        keep = {rid: (self._streams[rid], self._requests[rid]) for rid in retried}
        self._streams, self._requests = {}, {}
        try:
            fresh = self.engine = self._make_engine()
            for rid, (stream, request) in keep.items():
                self._add(fresh, request)
                self._streams[rid], self._requests[rid] = stream, request
        except BaseException as e:
            self.error = f"the engine could not be rebuilt after a failure: {type(e).__name__}: {e}"
            self._report({"event": "engine_failure", "time": round(time.time(), 3), "error": self.error,
                          "where": "rebuild", "action": "unready", "failed": sorted(keep)})
            self._streams.update({rid: stream for rid, (stream, _) in keep.items()})
            self._shut_down(None, EngineDeadError(ENGINE_FAILED), "failed")
            return None
        self.restarts += 1
        with self._cond:
            self._submissions.extendleft(reversed(unadmitted))
            self._pending += sum(len(s.requests) for s in unadmitted)
            self._stalled = False
            self._stall_ids = []
            self._engine_waiting = len(fresh.scheduler.waiting)
            self.state = "draining" if self._draining else "ready"
            self._cond.notify_all()
        return fresh

    @staticmethod
    def _batch(engine: Engine, ids: list[str]) -> list[dict]:
        """A failed step's batch: its requests' ids and token counts."""
        out = []
        for rid in ids:
            r = engine.requests.get(rid)
            if r is not None:
                out.append({"request_id": rid, "prompt_tokens": len(r.prompt_ids),
                            "computed_tokens": r.num_computed, "completion_tokens": len(r.output_ids)})
        return out

    def _observe_quietly(self, engine: Engine | None, outputs: list[RequestOutput]) -> None:
        """``on_step`` for requests failed outside a normal step (the engine may be broken)."""
        if self._on_step is None or engine is None or not outputs:
            return
        try:
            self._on_step(engine, outputs)
        except Exception:
            pass

    def _report(self, record: dict) -> None:
        if self._on_failure is not None:
            try:
                self._on_failure(record)
            except Exception:
                pass

    def _watch(self) -> None:
        """The watchdog thread: declare the loop stalled when a step runs past ``step_timeout``."""
        interval = min(self.step_timeout / 4, 1.0)
        while True:
            with self._cond:
                if self._stopping or self.error is not None:
                    return
                self._cond.wait(interval)
                started = self._step_started
                if started is None or self._stalled or time.monotonic() - started <= self.step_timeout:
                    continue
                self._stalled = True
                self.state = "stalled"
                streams, self._streams = self._streams, {}
                self._stall_ids = list(streams)
                self._requests = {}
                submissions, self._submissions = list(self._submissions), deque()
                self._pending = 0
            message = (f"the engine step did not return within {self.step_timeout:g} s (--step-timeout): "
                       "the server is unready and failed every request in flight")
            self.last_failure = message
            error = EngineDeadError(message)
            self._report({"event": "engine_failure", "time": round(time.time(), 3), "error": message,
                          "where": "stall", "action": "unready", "failed": sorted(streams)})
            for s in submissions:
                _call_soon(s.stream.loop, _settle, s.accepted, error)
            for stream in {id(s): s for s in streams.values()}.values():
                _call_soon(stream.loop, stream.fail, error)

    def _fail_streams(self, engine: Engine, error: StreamError) -> None:
        """Abort every request in flight and end its stream with ``error`` (the drain timeout)."""
        streams, self._streams, self._requests = self._streams, {}, {}
        outputs = []
        for rid in streams:
            engine.abort(rid)
            outputs.append(RequestOutput(rid, [], "", True, "abort"))
        for stream in {id(s): s for s in streams.values()}.values():
            _call_soon(stream.loop, stream.put, error)
        self._observe_quietly(engine, outputs)
        for rid in streams:
            engine.release(rid)

    def _shut_down(self, engine: Engine | None, error: EngineDeadError, state: str) -> None:
        """End every stream and pending submission with ``error``; free what the engine holds."""
        with self._cond:
            self._stopping = True
            self.state = state
            submissions, self._submissions = list(self._submissions), deque()
            self._pending = 0
            self._cond.notify_all()
        for s in submissions:
            _call_soon(s.stream.loop, _settle, s.accepted, error)
        streams, self._streams, self._requests = self._streams, {}, {}
        for rid in streams:
            if engine is not None:
                try:
                    engine.abort(rid)
                except Exception:  # the engine may be what broke; the streams must still end
                    pass
        for stream in {id(s): s for s in streams.values()}.values():
            _call_soon(stream.loop, stream.put, error)


__all__ = ["ENGINE_FAILED", "ENGINE_RESTARTED", "REQUEST_FAILED", "EngineDeadError", "EngineLoop", "EngineRequest",
           "QueueFullError", "RequestTimeoutError", "ResponseStream", "SlowConsumerError", "StreamError"]
