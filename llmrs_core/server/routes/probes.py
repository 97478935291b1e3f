"""``GET /health``, ``GET /ready`` and ``GET /metrics`` (chapters 11, 12): open without the API key.

``/health`` is liveness: 200 while the process can serve (loading included), 503 when the
engine loop is wedged (stalled, failed, stopped). ``/ready`` is readiness: 200 only while
requests are taken. Their body is ``{"status"}`` (the loop's state), with ``restarts`` after
a restart and, for a failed loop, the stable ``ENGINE_FAILED`` text: probes are public, so the
reason itself is in the log only. ``/metrics`` is the Prometheus text (:mod:`..metrics`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..faults import ENGINE_FAILED, LoopState
from ..loop import EngineLoop
from ..metrics import ServerMetrics

router = APIRouter()


def status_body(engine_loop: EngineLoop, state: str) -> dict:
    """The probes' body: the state, restarts, and for a failed loop the stable ENGINE_FAILED."""
    body: dict = {"status": state}
    if engine_loop.restarts:
        body["restarts"] = engine_loop.restarts
    if engine_loop.error is not None:
        body["error"] = ENGINE_FAILED
    return body


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """Liveness: 503 only when the process cannot serve again without a restart."""
    engine_loop = request.app.state.engine_loop
    state = engine_loop.state
    if engine_loop.wedged:
        return JSONResponse(status_body(engine_loop, state), status_code=503)
    return JSONResponse({"status": "ok"} if state == LoopState.READY else status_body(engine_loop, state))


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """Readiness: 200 only while requests are taken."""
    engine_loop = request.app.state.engine_loop
    if engine_loop.accepting:
        return JSONResponse(status_body(engine_loop, LoopState.READY))
    return JSONResponse(status_body(engine_loop, engine_loop.state), status_code=503)


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=ServerMetrics.CONTENT_TYPE)


__all__ = ["router", "status_body"]
