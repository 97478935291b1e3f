"""``llmrs bench speed|throughput|serve|all|compare``: every benchmark's command (chapters 7, 8, 11, appendix A).

The measuring is in :mod:`llmrs_core.bench`; here are the options, their checks and the output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..backends import BACKENDS, DEFAULT_BACKEND
from ..fetch import default_model_path
from ..loader import load
from ..validation import check_int
from .console import warm_up, write_json
from .options import backend_of, parse_backends, parse_numbers


def _serve_loads(args: argparse.Namespace, bs) -> list:
    """``bench serve``'s options checked (the lengths' defaults filled in), and its loads: one
    per ``--max-concurrency`` or ``--request-rate`` value (``bs``: :mod:`llmrs_core.bench.serve`)."""
    args.input_len = 128 if args.input_len is None else args.input_len
    args.output_len = 64 if args.output_len is None else args.output_len
    for name, n in (("--num-prompts", args.num_prompts), ("--input-len", args.input_len),
                    ("--output-len", args.output_len)):
        check_int(name, n, minimum=1)
    if args.compare and args.base_url:
        raise ValueError("--compare starts its own servers on 127.0.0.1; leave out --base-url")
    if args.request_rate is not None and args.max_concurrency is not None:
        raise ValueError("give either --max-concurrency (closed loop) or --request-rate (open loop), not both")
    if args.burstiness is not None and args.request_rate is None:
        raise ValueError("--burstiness shapes the arrivals of --request-rate; give --request-rate too")
    if args.request_rate is not None:
        burstiness = 1.0 if args.burstiness is None else args.burstiness
        return [bs.Load(request_rate=r, burstiness=burstiness)
                for r in parse_numbers("--request-rate", args.request_rate, float)]
    return [bs.Load(max_concurrency=c) for c in parse_numbers("--max-concurrency", args.max_concurrency or "1,4,16", int)]


def _bench_serve(args: argparse.Namespace) -> int:
    try:
        import httpx  # noqa: F401  (the benchmark's HTTP client)
    except ImportError:
        raise ValueError("bench serve needs httpx: pip install httpx (the dev extra has it)") from None
    from ..bench import serve as bs
    from ..bench.serve_compare import compare, format_table, write_plot

    loads = _serve_loads(args, bs)
    slos = bs.parse_goodput(args.goodput)
    n, seed = args.num_prompts, args.seed
    if args.dataset == "random":
        tokenizer = load(args.model).tokenizer

        def workloads(level: int) -> bs.Workload:
            return bs.random_workload(tokenizer, n, args.input_len, args.output_len, seed=[seed, level + 1])
    else:
        def workloads(level: int) -> bs.Workload:
            return bs.prompt_set_workload(n, args.output_len, tag=f"{seed}.{level + 1}")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    workload = {"dataset": args.dataset, "num_prompts": n, "input_len": args.input_len if args.dataset == "random"
                else None, "output_len": args.output_len, "seed": seed, "goodput_slo_ms": {k: v * 1e3 for k, v in
                slos.items()}}
    if args.compare:
        backends = parse_backends(args.backend) if args.backend else (None,)
        if len(backends) != 1:
            raise ValueError("bench serve runs our server on one backend; give --backend one name")
        result = compare(args.model or default_model_path(), loads, workloads, threads=args.threads or 2, seed=seed,
                         slos=slos, backend=backends[0], n_ctx=max(2048, args.input_len + args.output_len + 64),
                         on_level=say)
        from ..bench.speed import machine

        result = {"workload": workload, "machine": machine(),
                  "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **result}
    else:
        url = args.base_url or "http://127.0.0.1:8000"
        measured = bs.benchmark(url, loads, workloads, length_field=args.length_field, seed=seed, slos=slos,
                                on_level=say)
        result = {"workload": workload, "servers": {measured["base_url"]: measured}, "notes": []}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result["servers"]))
        for note in result["notes"]:
            print(f"note: {note}")
    if args.output:
        write_json(result, args.output)
    if args.plot:
        write_plot(result["servers"], args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    if args.impl is not None:
        if args.backend:
            raise ValueError("give --impl or --backend, not both (--impl learner is --backend learner)")
        args.backend = backend_of(args)
    if args.what not in ("serve", "throughput") and (args.input_len is not None or args.output_len is not None):
        given = "--input-len" if args.input_len is not None else "--output-len"
        instead = " (prompt and generated tokens: --pp and --tg)" if args.what == "speed" else ""
        raise ValueError(f"{given} is for bench serve and bench throughput; bench {args.what} does not take it{instead}")
    if args.what == "serve":
        return _bench_serve(args)
    if args.what in ("all", "compare"):
        return _bench_all(args)
    if args.files:
        raise ValueError(f"bench {args.what} takes no file arguments (got {' '.join(args.files)})")
    if args.what == "speed":
        return _bench_speed(args)
    return _bench_throughput(args)


def _bench_speed(args: argparse.Namespace) -> int:
    from ..bench.speed import format_speed, speed

    for name, n in (("--pp", args.pp), ("--tg", args.tg), ("--repetitions", args.repetitions)):
        if n < 1:
            raise ValueError(f"{name} must be at least 1, got {n}")
    result = speed(args.model, backends=parse_backends(args.backend), pp=args.pp, tg=args.tg,
                   repetitions=args.repetitions, threads=args.threads or 2, compare=not args.no_compare,
                   exact=args.exact, contention=args.contention)
    print(json.dumps(result, indent=2) if args.json else format_speed(result))
    if args.output:
        write_json(result, args.output)
    return 0


def _bench_throughput(args: argparse.Namespace) -> int:
    from ..bench.throughput import format_throughput, throughput

    backends = parse_backends(args.backend)
    if len(backends) != 1:
        raise ValueError("bench throughput measures one backend; give --backend one name")
    check_int("--requests", args.requests, minimum=1)
    check_int("--max-num-seqs", args.max_num_seqs, minimum=1)
    lengths = {}  # the random workload's longest prompt and output (lengths are drawn from 16 up to them)
    for name, value, key in (("--input-len", args.input_len, "max_prompt"), ("--output-len", args.output_len,
                                                                          "max_output")):
        if value is not None:
            lengths[key] = check_int(name, value, minimum=1)
    model = load(args.model, backend=backends[0], threads=args.threads)
    if backends[0] == "learner" and not args.json:  # the YOURS table first: which of the learner's parts run
        print(model.backend_report(), flush=True)
    warm_up(model)

    def say(line: str) -> None:  # lines on stderr, flushed: they show through a pipe, and as they come
        print(line, file=sys.stderr, flush=True)

    result = throughput(model, n_requests=args.requests, seed=args.seed, max_num_seqs=args.max_num_seqs,
                        progress=say, **lengths)
    from ..bench.speed import machine

    result |= {"backend": model.backend_report().splitlines()[0], "threads": args.threads, "machine": machine(),
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps(result, indent=2) if args.json else format_throughput(result))
    return 0


def _bench_all(args: argparse.Namespace) -> int:
    from ..bench.report import compare_results, format_comparison, read_result, write_outputs

    if args.what == "compare":
        if len(args.files) != 2:
            raise ValueError(f"bench compare takes two results.json files, OLD and NEW (got {len(args.files)})")
        rows, only = compare_results(read_result(args.files[0]), read_result(args.files[1]))
        if not rows:
            why = f" ({only[0]}{', ...' if len(only) > 1 else ''})" if only else ""
            raise ValueError(f"{args.files[0]} and {args.files[1]} have no figure measured alike{why}")
        print(format_comparison(rows, only))
        return 0
    if args.files:
        raise ValueError(f"bench all takes no file arguments (got {' '.join(args.files)})")
    from ..bench.suite import Plan, run_all

    check_int("--repetitions", args.repetitions, minimum=5)  # a median and its interval need five
    threads = args.threads or 2
    plan = Plan.quick(threads, args.repetitions) if args.quick else Plan.full(threads, args.repetitions)
    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only else None
    result = run_all(args.model, plan, only=only)
    report = write_outputs(result, args.output_dir)
    print(report.read_text() if not args.json else json.dumps(result, indent=1))
    print(f"written: {report.parent}/results.json, {report}", file=sys.stderr)
    return 0


def add_bench(sub: argparse._SubParsersAction) -> None:
    """``llmrs bench``."""
    p = sub.add_parser(
        "bench", help="benchmarks: `speed` (pp/tg, llama-bench style), `throughput` (the engine, chapter 7), "
                      "`serve` (load on an HTTP server, chapter 11), `all` (every one, with statistics: "
                      "appendix A) or `compare` (two `all` results)"
    )
    p.add_argument("what", choices=("speed", "throughput", "serve", "all", "compare"),
                   help="what to measure; `all`: every headline benchmark with its statistics (appendix A); "
                        "`compare OLD.json NEW.json`: two `all` results, figure by figure")
    p.add_argument("files", nargs="*", metavar="FILE", help="compare: the old and the new results.json")
    p.add_argument("--quick", action="store_true", help="all: the small plan (about 5 minutes on 2 cores)")
    p.add_argument("--only", metavar="NAMES",
                   help="all: some benchmarks, comma-separated (tokenizer, speed, throughput, serve, quant, dist)")
    p.add_argument("--output-dir", metavar="DIR", default="build/bench",
                   help="all: where results.json, report.md and the plots go (default build/bench)")
    p.add_argument("--model", help="a GGUF file (default: SmolLM2)")
    p.add_argument("--backend", metavar="NAMES",
                   help=f"compute backend(s), comma-separated for speed (default {DEFAULT_BACKEND}; "
                        f"available: {', '.join(BACKENDS)})")
    p.add_argument("--impl", choices=("learner", "solutions"),
                   help="speed, throughput, serve: learner = --backend learner (your exercises, e.g. chapter 7's "
                        "scheduler in the batching engine); solutions = --backend numpy")
    _add_speed_options(p)
    p.add_argument("--requests", type=int, default=32, help="number of requests (default 32)")
    p.add_argument("--max-num-seqs", type=int, default=16, help="requests running at once (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random workload")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--output", metavar="FILE", help="speed, serve: also write the JSON result to FILE")
    _add_serve_options(p)
    p.set_defaults(func=cmd_bench)


def _add_speed_options(p: argparse.ArgumentParser) -> None:
    """``bench speed``'s options (``--threads`` all of them share)."""
    p.add_argument("--pp", type=int, default=512, help="speed: prompt tokens (default 512)")
    p.add_argument("--tg", type=int, default=128, help="speed: generated tokens (default 128)")
    p.add_argument("--repetitions", type=int, default=5, help="speed: runs after the warm-up (default 5)")
    p.add_argument("--threads", type=int,
                   help="threads for every engine: Numba, BLAS, llama.cpp (speed and serve --compare: default 2)")
    p.add_argument("--no-compare", action="store_true", help="speed: skip llama.cpp even if installed")
    p.add_argument("--exact", action="store_true",
                   help="speed: also measure the numba backend on its float kernels (numba-exact), next to its "
                        "default int8 decode path")
    p.add_argument("--contention", action="store_true",
                   help="speed: measure every engine quiet and with one core kept busy by a CPU-bound process "
                        "this benchmark starts, pinned to core 0, and stops")


def _add_serve_options(p: argparse.ArgumentParser) -> None:
    """``bench serve``'s options (``--input-len``/``--output-len`` throughput's too)."""
    p.add_argument("--base-url", metavar="URL",
                   help="serve: the OpenAI-compatible server to load (default http://127.0.0.1:8000)")
    p.add_argument("--compare", action="store_true",
                   help="serve: start our server and llama-cpp-python's (if installed) on --model, same threads")
    p.add_argument("--max-concurrency", metavar="LIST",
                   help="serve: closed loop, at most N requests in flight, one run per N (default 1,4,16)")
    p.add_argument("--request-rate", metavar="LIST",
                   help="serve: open loop, requests/s (gamma arrivals), one run per rate")
    p.add_argument("--burstiness", type=float, help="serve: gamma shape of the arrivals (1 = Poisson, default)")
    p.add_argument("--num-prompts", type=int, default=32, help="serve: requests per run (default 32)")
    p.add_argument("--input-len", type=int,
                   help="serve: prompt tokens, random dataset (default 128); throughput: the longest prompt of "
                        "the random workload, whose lengths are drawn from 16 up to it (default 128)")
    p.add_argument("--output-len", type=int,
                   help="serve: tokens generated per request (default 64); throughput: the longest output of "
                        "the random workload, drawn from 16 up to it (default 64)")
    p.add_argument("--dataset", choices=("random", "prompts"), default="random",
                   help="serve: random token prompts, or the shipped prompt set (default random)")
    p.add_argument("--length-field", choices=("ignore_eos", "min_tokens", "none"), default="ignore_eos",
                   help="serve, with --base-url: how a request asks for all --output-len tokens: ignore_eos "
                        "(ours, vLLM; default), min_tokens (llama-cpp-python) or none")
    p.add_argument("--goodput", metavar="SLOS", help="serve: SLOs in ms for goodput, e.g. ttft:500,tpot:50")
    p.add_argument("--plot", metavar="FILE", help="serve: a PNG of TTFT and throughput against the load")


__all__ = ["add_bench", "cmd_bench"]
