"""The engine loop's supervisor (chapter 12.3): a failed or stalled step, and the crash-loop guard.

The contract (the narrative is :mod:`.loop`'s docstring, "Fault tolerance"):

* :meth:`Supervisor.recover` runs in the loop thread after a step failed (an exception escaped
  the iteration, or :class:`~.faults.StepFailed`) or returned after a stall
  (:class:`~.faults.StepStalled`). The step's batch, and every request that computed something,
  gets an error (:data:`~.faults.ENGINE_RESTARTED`); the requests that computed nothing are
  retried in a fresh engine; one ``engine_failure`` record goes to ``on_failure`` before any
  client sees its error. It returns the fresh engine, or ``None`` when the loop gave up.
* :class:`CrashLoopGuard`: at most ``max_restarts`` fresh engines within ``restart_window``
  seconds; the next failure is final (the loop goes ``failed``, :data:`~.faults.ENGINE_FAILED`).
* :meth:`Supervisor.watch` is the watchdog thread: a step past ``step_timeout`` makes the loop
  ``stalled`` and fails every request in flight and every pending submission at once (503).

The supervisor is the loop's other half: it works on the loop's tables (streams, admitted
requests, pending submissions) under the loop's lock, through the loop's fan-out helpers.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from ..engine import Engine, RequestOutput, StepStats
from .faults import (
    ENGINE_FAILED,
    ENGINE_RESTARTED,
    EngineDeadError,
    LoopState,
    StepFailed,
    StepStalled,
)

if TYPE_CHECKING:  # the loop builds its supervisor
    from .loop import EngineLoop, _Submission


class CrashLoopGuard:
    """Counts engine failures in a sliding window of ``window`` seconds."""

    def __init__(self, max_restarts: int, window: float):
        self.max_restarts = max_restarts
        self.window = window
        self._failures: deque[float] = deque()  # monotonic times of the recent failures

    def record(self, now: float) -> bool:
        """Count a failure at ``now``; ``True`` if it is one too many (give up, do not restart)."""
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self.window:
            self._failures.popleft()
        return len(self._failures) > self.max_restarts

    @property
    def failures(self) -> int:
        """Failures within the window, the last one included."""
        return len(self._failures)


def batch_of(stats: StepStats, request_ids: list[str]) -> list[dict]:
    """A failed step's batch, for the log: its requests' ids and token counts."""
    out = []
    for rid in request_ids:
        r = stats.requests.get(rid)
        if r is not None:
            out.append({"request_id": rid, "prompt_tokens": r.prompt_tokens, "computed_tokens": r.computed_tokens,
                        "completion_tokens": len(r.output_token_ids)})
    return out


class Supervisor:
    """Recovers ``loop`` from failed and stalled steps; see the module docstring."""

    def __init__(self, loop: EngineLoop, max_restarts: int, restart_window: float):
        self.loop = loop
        self.guard = CrashLoopGuard(max_restarts, restart_window)

    def recover(self, engine: Engine, error: Exception, submissions: list[_Submission]) -> Engine | None:
        """After a failed (or stalled) step: fail its batch, retry the requests that had not started
        in a fresh engine — or, past the crash-loop guard, fail everything. Returns the fresh engine,
        or ``None`` when the loop gave up."""
        loop = self.loop
        stalled = isinstance(error, StepStalled)
        message = str(error) if isinstance(error, StepFailed | StepStalled) else f"{type(error).__name__}: {error}"
        loop.last_failure = message
        give_up = self.guard.record(time.monotonic())
        unadmitted = [s for s in submissions if not s.handled]  # for the fresh engine
        batch, retried, failed, gone = self._triage(engine, error, give_up)
        in_batch = {b["request_id"] for b in batch}
        record = {"event": "engine_failure", "time": round(time.time(), 3), "error": message,
                  "where": "stall" if stalled else "step", "action": "unready" if give_up else "restart",
                  "restarts_in_window": self.guard.failures - 1, "batch": batch,
                  "failed": sorted(set(loop._stall_ids) if stalled else in_batch | set(failed)), "retried": retried}
        self._answer(engine, error, message, failed, gone, record, give_up)
        if give_up:
            loop.error = (f"the engine failed {self.guard.failures} times within {self.guard.window:g} s, "
                          f"the last time: {message}; the server is unready for good")
            with loop._cond:
                loop._requeue(unadmitted)
            loop._shut_down(engine, EngineDeadError(ENGINE_FAILED), LoopState.FAILED)
            return None
        return self._restart(retried, unadmitted)

    def _triage(self, engine: Engine, error: Exception, give_up: bool) -> tuple[list, list, list, list]:
        """The failed step's batch (for the log); the requests to retry (nothing of them computed,
        nothing reached their client) and those to fail; and the stalled requests still in the engine."""
        loop = self.loop
        stalled = isinstance(error, StepStalled)
        if isinstance(error, StepFailed):
            batch = error.batch
        else:
            ids = list(loop._stall_ids) if stalled else list(engine.step_stats().running)
            batch = batch_of(engine.step_stats(ids), ids)
        in_batch = {b["request_id"] for b in batch}
        known = engine.step_stats([*loop._streams, *loop._stall_ids]).requests

        def untouched(rid: str) -> bool:
            r = known.get(rid)
            return r is not None and not r.output_token_ids and r.computed_tokens == 0

        retried = [] if give_up else [rid for rid in loop._streams if rid not in in_batch and untouched(rid)]
        failed = [rid for rid in loop._streams if rid not in retried]
        gone = [rid for rid in (loop._stall_ids if stalled else ()) if rid in known]
        return batch, retried, failed, gone

    def _answer(self, engine: Engine, error: Exception, message: str, failed: list[str], gone: list[str],
                record: dict, give_up: bool) -> None:
        """Abort the failed requests, observe them, log the failure, then tell their clients."""
        loop = self.loop
        text = f"the engine failed ({message}); the server restarted it" if not give_up else (
            f"the engine failed ({message}); the server gave up restarting it")
        loop._abort_quietly(engine, failed)  # their blocks back to the old pool (kept for inspection on give-up)
        own = {o.request_id: o for o in error.outputs} if isinstance(error, StepFailed) else {}
        answers = [RequestOutput(rid, [], "", True, "error", error=f"request {rid!r} failed: {text}")
                   for rid in failed if rid not in own]  # for the log; clients get ENGINE_RESTARTED
        # metrics and the log line first: a client that has its error finds both already written
        loop._observe_quietly(engine, answers + [RequestOutput(rid, [], "", True, "error", error=message)
                                                 for rid in gone])
        loop._report(record)
        for out in answers + list(own.values()):  # the step's own errors were observed by on_step
            loop._deliver(out, ENGINE_FAILED if give_up else ENGINE_RESTARTED)

    def _restart(self, retried: list[str], unadmitted: list[_Submission]) -> Engine | None:
        """A fresh engine with the retried requests in it; ``None`` if it cannot be built."""
        loop = self.loop
        with loop._cond:
            loop.state = LoopState.RESTARTING
        keep = {rid: (loop._streams[rid], loop._requests[rid]) for rid in retried}
        loop._take_streams()
        try:
            fresh = loop.engine = loop._make_engine()
            for rid, (stream, request) in keep.items():
                loop._add(fresh, request)
                loop._streams[rid], loop._requests[rid] = stream, request
        except BaseException as e:
            loop.error = f"the engine could not be rebuilt after a failure: {type(e).__name__}: {e}"
            loop._report({"event": "engine_failure", "time": round(time.time(), 3), "error": loop.error,
                          "where": "rebuild", "action": "unready", "failed": sorted(keep)})
            loop._streams.update({rid: stream for rid, (stream, _) in keep.items()})
            loop._shut_down(None, EngineDeadError(ENGINE_FAILED), LoopState.FAILED)
            return None
        loop.restarts += 1
        with loop._cond:
            loop._requeue(unadmitted)
            loop._stalled = False
            loop._stall_ids = []
            loop._engine_waiting = fresh.step_stats().num_waiting
            loop.state = LoopState.DRAINING if loop._draining else LoopState.READY
            loop._cond.notify_all()
        return fresh

    def watch(self) -> None:
        """The watchdog thread: declare the loop stalled when a step runs past ``step_timeout``."""
        loop = self.loop
        interval = min(loop.step_timeout / 4, 1.0)
        while True:
            with loop._cond:
                if loop._stopping or loop.error is not None:
                    return
                loop._cond.wait(interval)
                started = loop._step_started
                if started is None or loop._stalled or time.monotonic() - started <= loop.step_timeout:
                    continue
                loop._stalled = True
                loop.state = LoopState.STALLED
                streams = loop._take_streams()
                loop._stall_ids = list(streams)
                submissions = loop._take_submissions()
            message = (f"the engine step did not return within {loop.step_timeout:g} s (--step-timeout): "
                       "the server is unready and failed every request in flight")
            loop.last_failure = message
            error = EngineDeadError(message)
            loop._report({"event": "engine_failure", "time": round(time.time(), 3), "error": message,
                          "where": "stall", "action": "unready", "failed": sorted(streams)})
            loop._refuse(submissions, error)
            loop._end_streams(streams.values(), error, fail=True)


__all__ = ["CrashLoopGuard", "Supervisor", "batch_of"]
