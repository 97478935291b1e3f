"""The ``llmrs ab`` commands (chapter 12, section 12.4)::

    llmrs ab serve --variant q4_1=models/a.gguf@1 --variant q8_0=models/b.gguf:numba@1 [--log FILE]
    llmrs ab serve --upstream a=http://127.0.0.1:8001@1 --upstream b=http://127.0.0.1:8002@1
    llmrs ab load [--base-url URL] [--requests N] [--users U] [--concurrency C]
    llmrs ab report --variant q4_1=models/a.gguf --variant q8_0=models/b.gguf --log FILE [--output JSON]
"""

from __future__ import annotations

import argparse
import json
import sys

from .variants import parse_upstream, parse_variant


def cmd_ab(args: argparse.Namespace) -> int:
    if args.ab_command == "serve":
        return _serve(args)
    if args.ab_command == "load":
        from .load import send_load

        counts = send_load(args.base_url, requests=args.requests, users=args.users, concurrency=args.concurrency,
                           max_tokens=args.max_tokens)
        print(json.dumps({"answers_per_variant": counts}))
        return 0
    if args.ab_command == "report":
        return _report(args)
    raise ValueError("llmrs ab needs a command: serve, load or report (see llmrs ab --help)")


def _serve(args: argparse.Namespace) -> int:
    try:
        from .launch import run_ab
    except ImportError as e:
        raise ValueError(f"the router needs the serve extra ({e.name} is missing): pip install 'llmrs-core[serve]'") from None
    variants = [parse_variant(v) for v in args.variant or ()]
    upstreams = [parse_upstream(u) for u in args.upstream or ()]
    if not variants and not upstreams:
        raise ValueError("give the variants: --variant NAME=MODEL[:backend][@weight] or --upstream NAME=URL[@weight]")
    log = open(args.log, "a", encoding="utf-8") if args.log else sys.stdout  # noqa: SIM115 (open for the run)
    try:
        run_ab(variants, upstreams, host=args.host, port=args.port, salt=args.salt,
               served_model_name=args.served_model_name, request_log=log, threads=args.threads,
               timeout=args.upstream_timeout)
    finally:
        if log is not sys.stdout:
            log.close()
    return 0


def _report(args: argparse.Namespace) -> int:
    from ..files import atomic_write
    from .record import read_records
    from .report import build_report, format_report

    variants = [parse_variant(v) for v in args.variant or ()]
    records = read_records(args.log) if args.log else None
    text = open(args.text, encoding="utf-8").read() if args.text else None
    report = build_report(variants, records, text=text, alpha=args.alpha, power=args.power, seed=args.seed)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    if args.output:
        with atomic_write(args.output, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def add_ab_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ab", help="A/B testing of model variants: serve (router), load, report (chapter 12)")
    ab = p.add_subparsers(dest="ab_command", metavar="COMMAND")
    s = ab.add_parser("serve", help="one llmrs serve per --variant, and a router in front (the serve extra)")
    s.add_argument("--variant", action="append", metavar="NAME=MODEL[:backend][@weight]",
                   help="a GGUF file to serve as a variant (repeatable; weight default 1)")
    s.add_argument("--upstream", action="append", metavar="NAME=URL[@weight]",
                   help="a server already running, as a variant (repeatable)")
    s.add_argument("--host", default="127.0.0.1", help="the router's address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="the router's port (default 8000)")
    s.add_argument("--salt", default="", help="the experiment's salt: another salt splits the users anew")
    s.add_argument("--served-model-name", default="ab", help="the model name clients use (default ab)")
    s.add_argument("--threads", type=int, help="threads of each variant's server (default: the cores shared out)")
    s.add_argument("--upstream-timeout", type=float, default=300.0,
                   help="seconds an upstream may take for its next byte before a 504 (default 300)")
    s.add_argument("--log", metavar="FILE", help="append the request log (JSON lines) to FILE (default stdout)")
    lo = ab.add_parser("load", help="streamed chats from several users through the router (for the report)")
    lo.add_argument("--base-url", default="http://127.0.0.1:8000", help="the router (default http://127.0.0.1:8000)")
    lo.add_argument("--requests", type=int, default=40, help="requests in all (default 40)")
    lo.add_argument("--users", type=int, default=20, help="distinct users (default 20)")
    lo.add_argument("--concurrency", type=int, default=1, help="requests in flight (default 1)")
    lo.add_argument("--max-tokens", type=int, default=32, help="tokens per answer (default 32)")
    r = ab.add_parser("report", help="quality, latency and cost of the variants, with CIs and a verdict")
    r.add_argument("--variant", action="append", metavar="NAME=MODEL[:backend]",
                   help="a variant to evaluate; the first is the baseline A (repeatable)")
    r.add_argument("--log", metavar="FILE", help="the router's request log (latency and cost)")
    r.add_argument("--text", metavar="FILE", help="the held-out text (default tests/data/ab_heldout.txt)")
    r.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    r.add_argument("--power", type=float, default=0.8, help="power for the sample sizes (default 0.8)")
    r.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    r.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    r.add_argument("--output", metavar="FILE", help="also write the JSON to FILE")
    p.set_defaults(func=cmd_ab)


__all__ = ["add_ab_parser", "cmd_ab"]
