"""``GET /v1/models``, ``POST /tokenize`` and ``POST /detokenize`` (chapter 11).

``/tokenize`` takes ``{"prompt"}`` (text, encoded as ordinary text) or ``{"messages"}`` (through
the chat template, with ``tools`` and ``chat_template_kwargs``) and returns ``{"tokens",
"count", "max_model_len"}``; text too long for the context is refused before it is encoded.
``/detokenize`` takes ``{"tokens"}`` and returns ``{"prompt"}``.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ...tokenizer.messages import check_template_kwargs, check_tools
from ...validation import check_token_ids, precheck_chat, precheck_text
from ..body import read_json_object
from ..encode_pool import text_size
from ..protocol import APIError
from .common import authorised, check_model, serving

TOKENIZE_FIELDS = ("model", "prompt", "messages", "tools", "chat_template_kwargs")
DETOKENIZE_FIELDS = ("model", "tokens")

router = APIRouter(dependencies=[Depends(authorised)])


@router.get("/v1/models")
async def models(request: Request) -> dict:
    state = serving(request)
    card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "llmrs",
            "max_model_len": state.config.context_length}
    return {"object": "list", "data": [card]}


@router.post("/tokenize")
async def tokenize(request: Request) -> dict:
    state = serving(request)
    body = await read_json_object(request, TOKENIZE_FIELDS, state.max_body_bytes)
    check_model(state, body)
    if ("prompt" in body) == ("messages" in body):
        raise APIError(400, "give either prompt (text) or messages", param="prompt")
    data = _template_data(body)
    param = "messages" if "messages" in body else "prompt"
    context_length = state.config.context_length

    def run() -> list[int]:
        try:
            if "messages" in body:
                return state.tokenizer.encode_chat(body["messages"], **data)
            if not isinstance(body["prompt"], str):
                raise ValueError(f"prompt must be text, got {type(body['prompt']).__name__}")
            return state.tokenizer.encode(body["prompt"], allow_special=False)
        except ValueError as e:
            raise APIError(400, str(e), param=param) from None

    try:  # text too long for the context is refused before it is encoded, here on the event loop
        if "messages" in body:
            precheck_chat(body["messages"], state.tokenizer, context_length, 0, data)
        elif isinstance(body["prompt"], str):
            precheck_text([body["prompt"]], state.tokenizer, context_length, 0)
    except ValueError as e:
        raise APIError(400, str(e), param=param) from None
    ids = await request.app.state.encoder.run(text_size([body.get("messages") or body["prompt"], data]), run)
    return {"tokens": ids, "count": len(ids), "max_model_len": context_length}


def _template_data(body: dict) -> dict:
    """``tools`` and ``chat_template_kwargs``, checked: with ``messages`` only."""
    data: dict = {}
    if "messages" in body:
        for field_name, check in (("tools", check_tools), ("chat_template_kwargs", check_template_kwargs)):
            try:
                data[field_name] = check(body.get(field_name))
            except ValueError as e:
                raise APIError(400, str(e), param=field_name) from None
    elif "tools" in body or "chat_template_kwargs" in body:
        raise APIError(400, "tools and chat_template_kwargs go with messages, not prompt", param="prompt")
    return data


@router.post("/detokenize")
async def detokenize(request: Request) -> dict:
    state = serving(request)
    body = await read_json_object(request, DETOKENIZE_FIELDS, state.max_body_bytes)
    check_model(state, body)
    tokens = body.get("tokens")
    if tokens == []:
        return {"prompt": ""}
    try:
        ids = check_token_ids(tokens, state.config.vocab_size, what="tokens")
    except ValueError as e:
        raise APIError(400, str(e), param="tokens") from None
    return {"prompt": state.tokenizer.decode(ids)}


__all__ = ["DETOKENIZE_FIELDS", "TOKENIZE_FIELDS", "router"]
