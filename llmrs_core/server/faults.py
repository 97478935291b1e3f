"""What can go wrong in the engine loop, and what clients are told (chapter 12.3).

* :class:`LoopState`: the engine loop's states, which ``/ready`` and ``/health`` report
  (the table is in :mod:`.loop`'s docstring); :data:`READY_STATES` take traffic, and in
  :data:`WEDGED_STATES` the process cannot serve again without outside help;
* the errors a :class:`~.loop.ResponseStream` or ``EngineLoop.submit`` raises, each with
  the HTTP status it becomes (:class:`StreamError` and its subclasses, :class:`QueueFullError`);
* the stable texts a client of a failed request gets (:data:`REQUEST_FAILED`,
  :data:`ENGINE_RESTARTED`, :data:`ENGINE_FAILED`): they name only the client's own request,
  never an exception or another request (the details go to the log);
* :class:`StepFailed` and :class:`StepStalled`, which the loop raises to its supervisor
  (:mod:`.supervisor`) and which never reach a client.
"""

from __future__ import annotations

import enum

from ..engine import RequestOutput


class LoopState(str, enum.Enum):
    """The engine loop's state; a ``str``, so ``loop.state == "ready"`` and JSON bodies read as text."""

    LOADING = "loading"
    READY = "ready"
    RESTARTING = "restarting"
    DRAINING = "draining"
    STALLED = "stalled"
    FAILED = "failed"
    STOPPED = "stopped"

    def __str__(self) -> str:  # the text, also in f-strings (Python 3.12 formats mixed-in enums by name)
        return self.value


#: states in which ``/ready`` is 200, and those in which ``/health`` is 503
READY_STATES = frozenset({LoopState.READY})
WEDGED_STATES = frozenset({LoopState.STALLED, LoopState.FAILED, LoopState.STOPPED})


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


class StepFailed(Exception):
    """Every request of an engine step failed, and so did the probe (their error outputs,
    already observed by ``on_step``, are delivered by the supervisor once the failure is logged)."""

    def __init__(self, outputs: list[RequestOutput], batch: list[dict], probe_error: str):
        super().__init__(f"every request of the step failed ({outputs[0].error or 'no message'}), and so did "
                         f"a probe of the model ({probe_error})")
        self.outputs = outputs
        self.batch = batch


class StepStalled(Exception):
    """The step returned after the watchdog had given it up (its requests were failed)."""


__all__ = ["ENGINE_FAILED", "ENGINE_RESTARTED", "READY_STATES", "REQUEST_FAILED", "WEDGED_STATES",
           "EngineDeadError", "LoopState", "QueueFullError", "RequestTimeoutError", "SlowConsumerError",
           "StepFailed", "StepStalled", "StreamError"]
