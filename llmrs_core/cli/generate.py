"""``llmrs generate``, ``chat`` (chapter 4) and ``launch`` (chapter 11: ``generate --tp/--pp`` on MPI ranks)."""

from __future__ import annotations

import argparse
import json
import sys

from ..loader import load
from ..validation import check_max_tokens
from .console import print_stats, warm_up, write
from .options import add_sampling_options, backend_of, sampling_kwargs


def cmd_generate(args: argparse.Namespace) -> int:
    check_max_tokens(args.max_tokens)  # before loading anything
    args.backend = backend_of(args)
    if args.tp != 1 or args.pp != 1:  # one rank of an mpiexec launch (chapter 11)
        from .ranks import run_on_ranks

        return run_on_ranks(args, generate_with)
    return generate_with(args, load(args.model, backend=args.backend, threads=args.threads, exact=args.exact))


def generate_with(args: argparse.Namespace, model) -> int:
    if args.backend == "learner":
        print(model.backend_report(), file=sys.stderr)
    warm_up(model)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    on_text = None if args.json else write
    if args.chat:  # the message's text stays text: only the template makes control tokens
        completion = model.chat([{"role": "user", "content": prompt}], on_text=on_text, **sampling_kwargs(args))
    else:
        completion = model.generate(prompt, on_text=on_text, **sampling_kwargs(args))
    if args.json:
        print(json.dumps({
            "text": completion.text, "token_ids": completion.token_ids,
            "finish_reason": completion.finish_reason, "prompt_tokens": completion.prompt_tokens,
            "prefill_tokens_per_second": completion.prefill_tokens_per_second,
            "decode_tokens_per_second": completion.decode_tokens_per_second,
        }, ensure_ascii=False))
    else:
        print()
        print_stats(completion)
    return 0


def add_generate(sub: argparse._SubParsersAction) -> None:
    """``llmrs generate`` (chapter 4; ``--tp``/``--pp`` chapter 11)."""
    p = sub.add_parser("generate", help="continue a prompt, streaming the text")
    p.add_argument("prompt", help="the prompt ('-' reads standard input)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--json", action="store_true", help="print the completion as JSON instead of streaming")
    add_sampling_options(p, max_tokens=128)
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks, under mpiexec -n TP (chapter 11; the dist extra)")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline-parallel stages, under mpiexec -n PP (chapter 11; the dist extra)")
    p.set_defaults(func=cmd_generate)


def cmd_launch(args: argparse.Namespace) -> int:
    """``llmrs launch -n 3 -- generate PROMPT --tp 3``: the same command under ``mpiexec -n 3``."""
    import subprocess

    from ..distributed.mpi import launch_command

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if not rest:
        raise ValueError("launch needs a command to run, e.g. llmrs launch -n 3 -- generate PROMPT --tp 3")
    command, env = launch_command(args.n, rest)
    return subprocess.call(command, env=env)


def add_launch(sub: argparse._SubParsersAction) -> None:
    """``llmrs launch`` (chapter 11)."""
    p = sub.add_parser("launch", help="run an llmrs command on N MPI ranks (mpiexec for you; chapter 11, dist extra)")
    p.add_argument("-n", type=int, required=True, help="how many ranks (processes)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the command, e.g. -- generate PROMPT --tp 3")
    p.set_defaults(func=cmd_launch)


def cmd_chat(args: argparse.Namespace) -> int:
    check_max_tokens(args.max_tokens)
    args.backend = backend_of(args)
    model = load(args.model, backend=args.backend, threads=args.threads, exact=args.exact)
    if args.backend == "learner":
        print(model.backend_report(), file=sys.stderr)
    warm_up(model)
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
            completion = model.chat(messages, on_text=write, **sampling_kwargs(args))
        except ValueError as e:  # too long for the context, say: the conversation so far is kept
            messages.pop()
            print(f"that message was not sent: {e}. The conversation so far is kept; "
                  "try a shorter message (or fewer --max-tokens).", file=sys.stderr)
            continue
        print()
        if args.stats:
            print_stats(completion)
        messages.append({"role": "assistant", "content": completion.text})


def add_chat(sub: argparse._SubParsersAction) -> None:
    """``llmrs chat`` (chapter 4)."""
    p = sub.add_parser("chat", help="an interactive chat using the model's chat template")
    p.add_argument("--system", help="a system prompt (default: the template's own)")
    p.add_argument("--stats", action="store_true", help="print tokens/s after each reply")
    add_sampling_options(p, max_tokens=256)
    p.set_defaults(func=cmd_chat)


__all__ = ["add_chat", "add_generate", "add_launch", "cmd_chat", "cmd_generate", "cmd_launch", "generate_with"]
