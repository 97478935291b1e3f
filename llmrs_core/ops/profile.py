"""``python -m llmrs_core.ops.profile``: a split model's per-rank timeline (chapter 11).

Run under ``mpiexec`` (``mpiexec -n 3 python -m llmrs_core.ops.profile --tp 3 --out t.json``),
or without ``--tp``/``--pp`` for the one-process baseline. Every rank loads its shard, warms
up, runs the prompt and ``--tokens`` greedy decode steps (argmax) with a
:class:`~.timeline.TimedCommunicator`, and rank 0 writes one JSON file: each rank's step
times and communication events (seconds from a common barrier) and their summaries
(:func:`~.timeline.summarise`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np


def run(args: argparse.Namespace) -> dict | None:
    import llmrs_core as llmrs

    from ..distributed.communicator import LocalCommunicator
    from ..distributed.launch import connect
    from .timeline import TimedCommunicator, summarise

    split = args.tp * args.pp > 1
    comm = TimedCommunicator(connect(args.tp, args.pp) if split else LocalCommunicator.group(1)[0])
    model = llmrs.load(args.model, backend=args.backend, threads=args.threads, tp=args.tp, pp=args.pp,
                       comm=comm if split else None, vocab_parallel=not args.whole_vocab)
    net = model.network
    net.warm_up()
    ids = model.tokenizer.encode(args.prompt)
    cache = net.new_cache(len(ids) + args.tokens)
    comm.barrier()
    zero = time.perf_counter()
    comm.events.clear()
    steps, tokens = [], []
    for i in range(args.tokens + 1):
        step_ids = ids if i == 0 else tokens[-1:]
        start = time.perf_counter()
        logits = net.forward(step_ids, cache, last_only=True)
        steps.append((start, time.perf_counter()))
        tokens.append(int(np.argmax(logits[0])))
    rank = {
        "rank": comm.rank,
        "steps": [(s - zero, e - zero) for s, e in steps],
        "events": [(ev.op, ev.start - zero, ev.end - zero, ev.nbytes) for ev in comm.events],
        "prefill": summarise(comm.events, steps[:1]),
        "decode": summarise(comm.events, steps[1:]),
        "shard": net.config.n_layers,
    }
    everyone = comm.gather_objects(rank)
    if comm.rank != 0:
        return None
    return {"tp": args.tp, "pp": args.pp, "vocab_parallel": not args.whole_vocab, "prompt_tokens": len(ids), "decode_tokens": args.tokens,
            "token_ids": tokens, "text": model.tokenizer.decode(tokens),
            "config": dataclasses.asdict(model.config), "ranks": everyone}


PROMPTS = ["The capital of France is", "Once upon a time", "The three primary colours are",
           "Water boils at", "The largest planet is", "A haiku about autumn:"]


def run_micro(args: argparse.Namespace) -> dict | None:
    """``--micro-batches G``: G prompts interleaved through the pipeline's stages
    (:func:`~llmrs_core.distributed.pipeline.pipelined_greedy`); with ``--pp 1`` the same schedule in one process."""
    import llmrs_core as llmrs

    from ..backends import get_backend
    from ..distributed.communicator import LocalCommunicator
    from ..distributed.launch import connect, shard
    from ..distributed.pipeline import pipelined_greedy
    from ..model import LlamaModel
    from .timeline import TimedCommunicator

    comm = TimedCommunicator(connect(1, args.pp) if args.pp > 1 else LocalCommunicator.group(1)[0])
    source = llmrs.read_gguf(args.model or llmrs.fetch_model(quiet=True))
    part, plan = shard(source, comm, 1, args.pp, micro_batched=True)
    net = LlamaModel(part, part.config, get_backend(args.backend, args.threads), plan=plan)
    net.warm_up()
    tok = source.tokenizer()
    prompts = [tok.encode(PROMPTS[g % len(PROMPTS)]) for g in range(args.micro_batches)]
    comm.barrier()
    comm.events.clear()
    start = time.perf_counter()
    tokens = pipelined_greedy(net, plan, prompts, args.tokens)
    end = time.perf_counter()
    waits = sum(ev.end - ev.start for ev in comm.events if ev.op in ("recv", "send"))
    rank = {"rank": comm.rank, "span": (0.0, end - start),
            "events": [(ev.op, ev.start - start, ev.end - start, ev.nbytes) for ev in comm.events],
            "busy_share": 1 - waits / (end - start),
            "tokens_per_s": args.micro_batches * args.tokens / (end - start)}
    everyone = comm.gather_objects(rank)
    if comm.rank != 0:
        return None
    return {"pp": args.pp, "micro_batches": args.micro_batches, "decode_tokens": args.tokens,
            "token_ids": tokens, "ranks": everyone}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmrs_core.ops.profile", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a GGUF file (default: SmolLM2)")
    p.add_argument("--backend", default="numba")
    p.add_argument("--threads", type=int, default=1, help="Numba threads per rank (default 1)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--tokens", type=int, default=16, help="decode steps after the prompt (default 16)")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--whole-vocab", action="store_true",
                   help="TP: keep the embedding and output head whole on every rank (default: vocab-parallel)")
    p.add_argument("--micro-batches", type=int, default=0,
                   help="pipeline: this many prompts in flight through the stages (with --pp, or --pp 1)")
    p.add_argument("--out", help="write the JSON here (default: standard output)")
    args = p.parse_args(argv)
    result = run_micro(args) if args.micro_batches else run(args)
    if result is not None:
        text = json.dumps(result)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        else:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
