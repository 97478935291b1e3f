"""OpenAI's request and response shapes (chapter 11): parsing bodies, building answers.

Requests are JSON objects checked field by field, each mistake an
:class:`APIError` (HTTP 400) that names the field — the value checks are the
engine's own (:mod:`llmrs_core.validation`, :class:`~llmrs_core.sampling.SamplingParams`),
so the server accepts exactly what ``model.generate`` accepts. A field this
server does not implement is refused by name, never silently ignored; ``null``
means "not given", as in OpenAI's API.

The bounds follow OpenAI's API and vLLM: each value outside them is a 400 naming its
field, and within them every finite logit vector gives a finite distribution.
``temperature`` [0, 2]; ``top_p`` (0, 1]; ``top_k`` integer >= 0 (0 is off); ``min_p`` [0, 1];
``presence_penalty``, ``frequency_penalty`` [-2, 2]; ``repetition_penalty`` [0.01, 100];
``seed`` [0, 2**63); ``n`` [1, :data:`MAX_N`]; prompts × ``n`` <= :data:`MAX_SEQUENCES`
(each an engine request); ``stop`` <= 16 strings of <= 256 characters; ``logprobs`` 0 to 20;
``logit_bias`` refused; ``tools`` <= 128, passed to the chat template (the reply is not parsed
into tool calls); ``tool_choice`` ``auto`` or ``none``; ``chat_template_kwargs`` an object of
<= 64 JSON values, reserved names refused. The reason for each bound: chapter 11.4 ("The
request fields' bounds").

Responses are plain dicts in OpenAI's shape: ``id``, ``object``, ``created``,
``model``, ``choices`` (``index``, ``text`` or ``message``/``delta``,
``logprobs``, ``finish_reason``) and ``usage``.
"""

from __future__ import annotations

import codecs
import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..logprobs import TokenLogprob, check_top_logprobs
from ..sampling import SamplingParams
from ..tokenizer.messages import check_template_kwargs, check_tools
from ..validation import check_int, check_max_tokens, normalise_stop

#: OpenAI's range for temperature (the engine itself takes any value >= 0)
MAX_TEMPERATURE = 2.0
#: the most choices one request may ask for
MAX_N = 16
#: the most sequences (prompts × ``n``) one request may ask for: each is one engine request, and a
#: small body must not become thousands of them
MAX_SEQUENCES = 64

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "seed")
COMMON_FIELDS = (*SAMPLING_FIELDS, "model", "max_tokens", "stop", "n", "stream", "stream_options", "user",
                 "ignore_eos", "logprobs")
COMPLETION_FIELDS = (*COMMON_FIELDS, "prompt", "echo")
CHAT_FIELDS = (*COMMON_FIELDS, "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
               "chat_template_kwargs")


class APIError(Exception):
    """An error answer in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
             413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error",
             408: "timeout_error", 504: "timeout_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.TYPES.get(self.status, "invalid_request_error"), self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error shape. Its text is made encodable: a lone surrogate (``"\\ud800"``, which JSON
    can carry but UTF-8 cannot) from the client's body, say as the name of an unknown field, is
    written as its escape, so that the error itself never fails to be sent."""
    return {"error": {"message": _encodable(message), "type": type, "param": _encodable(param),
                      "code": _encodable(code)}}


def _encodable(value: Any) -> Any:
    """``value`` with every character UTF-8 cannot encode (lone surrogates) as a ``\\uXXXX`` escape."""
    if not isinstance(value, str):
        return value
    return value.encode("utf-8", errors="backslashreplace").decode("utf-8")


@dataclass
class GenerationRequest:
    """A checked completions or chat request.

    ``prompts`` are what to encode: for completions each is text or token ids; for
    chat there is one, the ``messages`` list. ``max_tokens`` is ``None`` when not given
    (the handler picks the default once it knows the prompt's length).
    """

    model: str | None
    prompts: list[Any]
    max_tokens: int | None
    sampling: SamplingParams
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    user: str | None = None
    #: ``None``: no log-probabilities; ``k``: each token's, with its ``k`` best alternatives
    logprobs: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    #: chat: the tools (JSON schemas) and template variables the chat template is given (checked)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def template_data(self) -> dict[str, Any]:
        """What the chat template sees besides the messages (for the length precheck)."""
        return {"tools": self.tools, **self.chat_template_kwargs}

    def sampling_for(self, choice: int) -> SamplingParams:
        """Choice ``choice``'s sampling: with a seed, choice j uses ``seed + j`` (the n choices
        differ, and the whole set is reproducible)."""
        if self.sampling.seed is None or choice == 0:
            return self.sampling
        return dataclasses.replace(self.sampling, seed=(self.sampling.seed + choice) % 2**63)


def _given(body: Mapping[str, Any], name: str) -> bool:
    return body.get(name) is not None


def _check_fields(body: Mapping[str, Any], allowed: Sequence[str]) -> None:
    for name in body:
        if name not in allowed:
            raise APIError(400, f"{name!r} is not supported by this server (supported: {', '.join(sorted(allowed))})",
                           param=name)


def _bool(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be true or false, got {type(value).__name__} {value!r}", param=name)
    return value


def _int(body: Mapping[str, Any], name: str, minimum: int | None = None, maximum: int | None = None) -> int | None:
    if not _given(body, name):
        return None
    try:
        return check_int(name, body[name], minimum, maximum)
    except ValueError as e:
        raise APIError(400, str(e), param=name) from None


def _sampling(body: Mapping[str, Any]) -> SamplingParams:
    """SamplingParams from the body, each field checked alone so that the error names it."""
    given = {name: body[name] for name in SAMPLING_FIELDS if _given(body, name)}
    for name, value in given.items():
        try:
            SamplingParams(**{name: value})
        except ValueError as e:
            raise APIError(400, str(e), param=name) from None
    temperature = given.get("temperature", 1.0)  # OpenAI's default: sampling, not greedy
    if temperature > MAX_TEMPERATURE:
        raise APIError(400, f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {temperature}", param="temperature")
    return SamplingParams(**{**given, "temperature": temperature})


def _completion_logprobs(body: Mapping[str, Any]) -> int | None:
    """Completions: ``logprobs`` is the number of alternatives (0 to 20) or null."""
    if body.get("echo") not in (None, False):
        raise APIError(400, "echo is not supported by this server", param="echo")
    if not _given(body, "logprobs"):
        return None
    try:
        return check_top_logprobs(body["logprobs"], "logprobs")
    except ValueError as e:
        raise APIError(400, str(e), param="logprobs") from None


def _chat_logprobs(body: Mapping[str, Any]) -> int | None:
    """Chat: ``logprobs`` (true/false) turns them on; ``top_logprobs`` (0 to 20) needs it."""
    wanted = _bool(body, "logprobs")
    if not _given(body, "top_logprobs"):
        return 0 if wanted else None
    if not wanted:
        raise APIError(400, "top_logprobs needs logprobs to be true", param="top_logprobs")
    try:
        return check_top_logprobs(body["top_logprobs"])
    except ValueError as e:
        raise APIError(400, str(e), param="top_logprobs") from None


def _common(body: Mapping[str, Any], prompts: list[Any], max_tokens: int | None,
            logprobs: int | None) -> GenerationRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(400, f"model must be a string, got {type(model).__name__}", param="model")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise APIError(400, f"user must be a string, got {type(user).__name__}", param="user")
    try:
        stop = normalise_stop(body.get("stop"))
    except ValueError as e:
        raise APIError(400, str(e), param="stop") from None
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")
        if not isinstance(options, Mapping):
            raise APIError(400, "stream_options must be an object", param="stream_options")
        for key in options:
            if key != "include_usage":
                raise APIError(400, f"stream_options.{key} is not supported by this server",
                               param=f"stream_options.{key}")
        include_usage = _bool(options, "include_usage")
    n = _int(body, "n", 1, MAX_N) or 1
    if len(prompts) * n > MAX_SEQUENCES:
        raise APIError(400, f"this request asks for {len(prompts)} prompts x n={n} = {len(prompts) * n} sequences; "
                            f"the limit is {MAX_SEQUENCES} a request (send the rest in other requests)",
                       param="n" if n > 1 else "prompt")
    return GenerationRequest(
        model=model, prompts=prompts, max_tokens=max_tokens, sampling=_sampling(body), stop=stop, n=n,
        stream=stream, include_usage=include_usage, ignore_eos=_bool(body, "ignore_eos"), user=user,
        logprobs=logprobs,
    )


def _max_tokens(body: Mapping[str, Any], name: str) -> int | None:
    if not _given(body, name):
        return None
    try:
        return check_max_tokens(body[name])
    except ValueError as e:
        raise APIError(400, str(e).replace("max_tokens", name), param=name) from None


def parse_completion_request(body: Any) -> GenerationRequest:
    """``POST /v1/completions``: ``prompt`` is text, token ids, or a list of either."""
    body = _object(body)
    _check_fields(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if prompt is None:
        raise APIError(400, "prompt is required: text, a list of token ids, or a list of texts", param="prompt")
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and len(prompt) > MAX_SEQUENCES and isinstance(prompt[0], (str, list)):
        raise APIError(400, f"prompt is a list of {len(prompt):,} prompts; the limit is {MAX_SEQUENCES} a request "
                            "(prompts x n)", param="prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        prompts = list(prompt)  # a batch: texts or token-id lists
    elif isinstance(prompt, list):
        prompts = [prompt]  # token ids (checked when encoded)
    else:
        raise APIError(400, f"prompt must be text or a list of token ids, got {type(prompt).__name__}",
                       param="prompt")
    if not prompts or prompts == [[]]:
        raise APIError(400, "prompt is empty", param="prompt")
    return _common(body, prompts, _max_tokens(body, "max_tokens"), _completion_logprobs(body))


def parse_chat_request(body: Any) -> GenerationRequest:
    """``POST /v1/chat/completions``: ``messages`` go through the chat template, with ``tools``
    and ``chat_template_kwargs`` (checked here: a 400 naming the field)."""
    body = _object(body)
    _check_fields(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    max_tokens = _max_tokens(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _max_tokens(body, "max_tokens")
    tool_choice = body.get("tool_choice")
    if tool_choice not in (None, "auto", "none"):
        raise APIError(400, f"tool_choice {tool_choice!r} is not supported by this server (supported: 'auto', "
                            "'none'; it does not force tool calls)", param="tool_choice")
    try:
        tools = check_tools(body.get("tools"))
    except ValueError as e:
        raise APIError(400, str(e), param="tools") from None
    try:
        kwargs = check_template_kwargs(body.get("chat_template_kwargs"))
    except ValueError as e:
        raise APIError(400, str(e), param="chat_template_kwargs") from None
    req = _common(body, [messages], max_tokens, _chat_logprobs(body))
    req.tools = None if tool_choice == "none" else tools
    req.chat_template_kwargs = kwargs
    return req


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


# -- responses -----------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_choice(index: int, text: str, finish_reason: str | None,
                      logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_choice(index: int, text: str, finish_reason: str | None,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish_reason}


def chat_delta(index: int, delta: dict[str, str], finish_reason: str | None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


TokenBytes = Callable[[int], bytes]


def token_text(data: bytes) -> str:
    """A token's text for logprobs. A byte-level token that is not whole UTF-8 characters (part of
    an emoji, say) is written ``bytes:\\xe2\\x80`` as OpenAI's API writes it: replacing the bytes with
    U+FFFD would make different tokens look alike. Chat's ``bytes`` field has the exact bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def chat_logprobs(entries: Sequence[TokenLogprob], token_bytes: TokenBytes) -> dict[str, Any]:
    """Chat's ``logprobs``: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal"}``."""
    def one(token_id: int, logprob: float) -> dict[str, Any]:
        data = token_bytes(token_id)
        return {"token": token_text(data), "logprob": logprob, "bytes": list(data)}

    content = [{**one(e.token_id, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


class TextOffsets:
    """Completions' ``text_offset``: the characters of generated text before each token.

    Fed the tokens' bytes in order; a character split across tokens counts once it is whole.
    """

    def __init__(self) -> None:
        self.chars = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def next(self, data: bytes) -> int:
        """The offset of the token whose bytes are ``data``; then count them."""
        offset = self.chars
        self.chars += len(self._decoder.decode(data))
        return offset


def completion_logprobs(entries: Sequence[TokenLogprob], token_bytes: TokenBytes,
                        offsets: TextOffsets) -> dict[str, Any]:
    """Completions' ``logprobs``: parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs``
    (one ``{token: logprob}`` per token) and ``text_offset`` (from ``offsets``, which carries on
    across the chunks of a stream)."""
    data = [token_bytes(e.token_id) for e in entries]
    return {"tokens": [token_text(d) for d in data], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_text(token_bytes(i)): lp for i, lp in e.top} for e in entries],
            "text_offset": [offsets.next(d) for d in data]}


def response(kind: str, rid: str, created: int, model: str, choices: list[dict],
             usage: dict[str, int] | None = None) -> dict[str, Any]:
    """A whole answer or one stream chunk. ``kind``: ``"text_completion"``,
    ``"chat.completion"`` or ``"chat.completion.chunk"``; ``usage`` is left out when ``None``."""
    out: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


__all__ = [
    "MAX_N",
    "MAX_SEQUENCES",
    "APIError",
    "GenerationRequest",
    "TextOffsets",
    "chat_choice",
    "chat_delta",
    "chat_logprobs",
    "completion_choice",
    "completion_logprobs",
    "error_body",
    "new_id",
    "parse_chat_request",
    "parse_completion_request",
    "response",
    "token_text",
    "usage",
]
