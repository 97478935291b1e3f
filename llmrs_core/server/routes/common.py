"""What every route reads (chapter 11): the served model's settings on ``app.state``, the API
key check, the model-name check, and the errors in OpenAI's shape.

``create_app`` puts one :class:`ServingState` at ``app.state.serving`` beside the engine loop
(``app.state.engine_loop``), the metrics (``app.state.metrics``), the request observer
(``app.state.observer``) and, while the app runs, the encoding pool (``app.state.encoder``);
the routes read them from ``request.app.state``, as vLLM's ``api_router`` modules do.
"""

from __future__ import annotations

import secrets
import time
import traceback
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...config import ModelConfig
from ...tokenizer import Tokenizer
from ..protocol import APIError, GenerationRequest, error_body
from ..sse import EventStream

#: the message of a 500 for an unexpected error (the exception goes to the log, never to a client)
INTERNAL_ERROR = "internal server error (the server's log has the details)"


@dataclass(frozen=True)
class ServingState:
    """The served model and the routes' settings (``create_app``'s arguments)."""

    model_name: str
    tokenizer: Tokenizer
    config: ModelConfig
    #: ``None``: no key needed
    api_key: str | None
    max_body_bytes: int
    #: every request's deadline in seconds (``None``: none)
    request_timeout: float | None
    #: writes the SSE events of streamed answers (Exercise 11.6 plugs the learner's in)
    stream_events: EventStream
    #: when the app was made (``/v1/models``' ``created``)
    created: int


def serving(request: Request) -> ServingState:
    return request.app.state.serving


async def authorised(request: Request) -> None:
    """The routes' dependency: 401 without ``Authorization: Bearer KEY`` when the app has a key."""
    api_key = serving(request).api_key
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        raise APIError(401, "a valid API key is required: Authorization: Bearer KEY", code="invalid_api_key")


def check_model(state: ServingState, req: GenerationRequest | dict) -> None:
    """404 ``model_not_found`` if the request names another model than the one served."""
    asked = req.model if isinstance(req, GenerationRequest) else req.get("model")
    if asked is not None and asked != state.model_name:
        raise APIError(404, f"the model {asked!r} does not exist; this server serves {state.model_name!r}",
                       param="model", code="model_not_found")


async def api_error(request: Request, e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
    return JSONResponse(error_body(str(e.detail), "invalid_request_error", code=e.status_code),
                        status_code=e.status_code)


async def internal_error(request: Request, e: Exception) -> JSONResponse:
    """A bug: the client gets a stable message; the exception and its traceback go to the log."""
    request.app.state.observer.log_event({
        "event": "internal_error", "time": round(time.time(), 3), "method": request.method,
        "path": request.url.path, "error": f"{type(e).__name__}: {e}",
        "traceback": "".join(traceback.format_exception(e))})
    return JSONResponse(error_body(INTERNAL_ERROR, "server_error", code=500), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal and failure in OpenAI's error shape."""
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)


__all__ = ["INTERNAL_ERROR", "ServingState", "authorised", "check_model", "install_error_handlers", "serving"]
