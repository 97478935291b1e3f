"""``llmrs serve``: the OpenAI-compatible server, its limits and faults checked first (chapters 11, 12).

The server's modules are imported only when the command runs: without the ``serve`` extra every
other command still works, and this one says what to install.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..backends import BACKENDS, DEFAULT_BACKEND
from ..fetch import default_model_path
from ..loader import load
from ..validation import check_int
from .console import one_line


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from ..server import create_app, serve
    except ImportError as e:
        raise ValueError(f"the server needs the serve extra ({e.name} is missing): "
                         "pip install 'llmrs-core[serve]'") from None
    for name, value, minimum in (("--port", args.port, 0), ("--max-num-seqs", args.max_num_seqs, 1),
                                 ("--num-blocks", args.num_blocks, 1), ("--threads", args.threads, 1),
                                 ("--max-queue", args.max_queue, 0)):
        if value is not None:
            check_int(name, value, minimum=minimum)
    if args.drain_timeout < 0:
        raise ValueError(f"--drain-timeout must be >= 0, got {args.drain_timeout}")
    for name, value in (("--request-timeout", args.request_timeout), ("--step-timeout", args.step_timeout)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {value}")
    for name, value, minimum in (("--stream-buffer", args.stream_buffer, 1),
                                 ("--max-engine-restarts", args.max_engine_restarts, 0),
                                 ("--limit-concurrency", args.limit_concurrency, 1)):
        check_int(name, value, minimum=minimum)
    for name, value in (("--header-timeout", args.header_timeout), ("--body-timeout", args.body_timeout)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {value}")
    from ..server.limits import ConnectionLimits
    from ..server.serve import EngineStartError

    limits = ConnectionLimits(header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                              limit_concurrency=args.limit_concurrency)
    from ..server.tracing import otlp_provider_from_env

    tracer_provider = otlp_provider_from_env()  # ValueError naming the package when the exporter is missing
    model = load(args.model, backend=args.backend, threads=args.threads, exact=args.exact)
    if args.backend == "learner":  # which parts of the engine behind this server are the learner's
        print(model.backend_report(), file=sys.stderr)
    api_key = args.api_key if args.api_key is not None else os.environ.get("LLMRS_API_KEY")
    app = create_app(model, served_model_name=args.served_model_name, max_num_seqs=args.max_num_seqs,
                     num_blocks=args.num_blocks, max_queue=args.max_queue, api_key=api_key or None,
                     request_log=None if args.no_request_log else sys.stdout, log_prompts=args.log_prompts,
                     tracer_provider=tracer_provider, request_timeout=args.request_timeout,
                     step_timeout=args.step_timeout, stream_buffer=args.stream_buffer,
                     max_restarts=args.max_engine_restarts)
    name = app.state.served_model_name
    print(f"serving {name!r} on http://{args.host}:{args.port}/v1 (loading; /ready is 200 when it takes requests)",
          file=sys.stderr)
    if tracer_provider is not None:
        print(f"tracing: OTLP export to {os.environ.get('OTEL_EXPORTER_OTLP_TRACES_ENDPOINT') or os.environ['OTEL_EXPORTER_OTLP_ENDPOINT']}",
              file=sys.stderr)
    try:
        serve(app, host=args.host, port=args.port, drain_timeout=args.drain_timeout,
              access_log=args.no_request_log, drain=app.state.engine_loop, startup=app.state.engine_loop,
              limits=limits)
    except EngineStartError as e:  # the KV pool, the warm-up...: say why and exit, never serve "failed"
        print(f"llmrs serve: error: {one_line(e)}", file=sys.stderr)
        return 1
    finally:
        if tracer_provider is not None:
            tracer_provider.shutdown()  # flush the spans still batched
    return 0


def add_serve(sub: argparse._SubParsersAction) -> None:
    """``llmrs serve`` (chapter 11; its limits chapter 12)."""
    p = sub.add_parser("serve", help="an OpenAI-compatible streaming server (chapter 11; the serve extra)")
    p.add_argument("model", nargs="?", help=f"a GGUF file (default: {default_model_path()})")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--backend", choices=BACKENDS, help=f"compute backend (default {DEFAULT_BACKEND})")
    p.add_argument("--threads", type=int, help="numba backend: threads (default: all cores)")
    p.add_argument("--exact", action="store_true", help="numba backend: keep every product on the float kernels (within float32 rounding of numpy) instead of the int8 decode path (llama.cpp's arithmetic)")
    p.add_argument("--max-num-seqs", type=int, default=16, help="requests running at once (default 16)")
    p.add_argument("--num-blocks", type=int, default=512, help="KV-cache blocks of 16 tokens (default 512)")
    p.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="answer 429 (with Retry-After) when more than N sequences wait for the engine (default 256)")
    p.add_argument("--api-key", metavar="KEY",
                   help="require Authorization: Bearer KEY on /v1/* (default: $LLMRS_API_KEY, else none)")
    p.add_argument("--served-model-name", metavar="NAME", help="the model's name in the API (default: the file's stem)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds the requests in flight get to finish (default 30); /ready is 503 at once")
    p.add_argument("--request-timeout", type=float, metavar="SECONDS",
                   help="abort a request that has not finished this long after it arrived: 504 (default: no limit)")
    p.add_argument("--step-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="an engine step running longer makes the server unready and fails the requests in "
                        "flight (default 60)")
    p.add_argument("--stream-buffer", type=int, default=256, metavar="N",
                   help="abort a stream whose client leaves more than N outputs a request unread (default 256)")
    p.add_argument("--max-engine-restarts", type=int, default=3, metavar="K",
                   help="fresh engines after failures within 60 s before the server stays unready (default 3)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="a client must send its request line and headers within this: else 408 and the "
                        "connection is closed (default 10)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a client must send its whole body within this after the headers: else 408 and closed "
                        "(default 30)")
    p.add_argument("--limit-concurrency", type=int, default=512, metavar="N",
                   help="connections or requests in progress at once; past it a new request gets 503 (default 512)")
    p.add_argument("--log-prompts", action="store_true",
                   help="add each request's prompt and output to its JSON log line (default: not logged)")
    p.add_argument("--no-request-log", action="store_true",
                   help="write no JSON line per finished request on stdout (default: one per request)")
    p.set_defaults(func=cmd_serve)


__all__ = ["add_serve", "cmd_serve"]
