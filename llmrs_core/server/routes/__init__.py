"""The server's routes by concern (chapter 11), each module a ``router`` that reads
``request.app.state`` (:mod:`.common`); ``create_app`` includes :data:`ROUTERS`.

    generation   POST /v1/completions, POST /v1/chat/completions
    tokens       GET /v1/models, POST /tokenize, POST /detokenize
    probes       GET /health, GET /ready, GET /metrics (open without the API key)
    common       the served model's state, the API key, the model check, errors in OpenAI's shape
"""

from . import generation, probes, tokens

#: every route of the app, in the order they are matched
ROUTERS = (generation.router, tokens.router, probes.router)

__all__ = ["ROUTERS"]
