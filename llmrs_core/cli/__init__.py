"""The ``llmrs`` command line (console script; ``python -m llmrs_core``). Each subcommand arrives with its chapter.

    llmrs fetch [--force] [--wheel PATH] [--verify]   chapter 1
    llmrs info [MODEL] [--json] [--context N]         chapter 1
    llmrs tokenize TEXT [--json] [--no-special]       chapter 2
    llmrs generate PROMPT [--chat] [sampling options]  chapter 4
    mpiexec -n 3 llmrs generate PROMPT --tp 3         chapter 11 (also --pp 2 under mpiexec -n 2)
    llmrs launch -n 3 -- generate PROMPT --tp 3       chapter 11: the same, mpiexec started for you
    llmrs chat                                        chapter 4
    llmrs quantize IN OUT --type q8_0|q4_0|q4_1|q4_k|q6_k  chapter 6
    llmrs bench speed|throughput|serve|all|compare    chapters 7, 8, 11, appendix A
    llmrs cost BENCH.json... [--instance NAME]        chapter 12: $ per million tokens
    llmrs serve [MODEL] [--host 127.0.0.1] [--port 8000]   chapter 11 (the `serve` extra)
    llmrs ab serve|load|report                        chapter 12: an A/B router over variants, decided

:data:`COMMANDS` is the dispatch table: each command's parser builder, which sets the function
that runs it (one module per group: :mod:`.model`, :mod:`.generate`, :mod:`.bench`, :mod:`.cost`,
:mod:`.serve`, :mod:`llmrs_core.ab.cli`; shared options in :mod:`.options`). The package's other
entry points are modules run with ``python -m`` (each one's ``--help`` says more):

    llmrs_core.ops.entrypoint          the container's entrypoint: check the environment, then serve (12)
    llmrs_core.ops.observe             make observe: a real Prometheus scrapes llmrs serve (12)
    llmrs_core.ops.profile             a split model's per-rank timeline, under mpiexec (11)
    llmrs_core.labs.ring               the ring all-reduce against MPI's, under mpiexec (11)
    llmrs_core.kernels.gpu.compile_check   the CUDA kernels compiled to PTX, no GPU needed (9)
    llmrs_core.bench.tokenizer         make bench-tokenizer: our BPE against tokenizers (2)
    llmrs_core.bench.footprint         one engine's RSS and load time in a fresh process (bench all, 8)
    llmrs_core.vocab_fetch             make fetch-vocab: the third-party vocabularies, sha256-checked
    llmrs_core.workbook.check_env      make check-env (run as a file: python llmrs_core/workbook/check_env.py)
    llmrs_core.workbook.progress       make progress: the learner's exercises, chapter by chapter
    llmrs_core.workbook.reset          make reset: an exercise back to its stub
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable

from .. import __version__
from ..ab.cli import add_ab_parser
from ..config import ConfigError
from ..fetch import FetchError
from ..formats.gguf import GGUFError
from . import bench, cost, generate, model, serve
from .console import one_line

#: the dispatch table, in ``--help`` order: command -> what adds its parser (and sets ``func``, which runs it)
COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "fetch": model.add_fetch,
    "info": model.add_info,
    "tokenize": model.add_tokenize,
    "generate": generate.add_generate,
    "launch": generate.add_launch,
    "chat": generate.add_chat,
    "quantize": model.add_quantize,
    "bench": bench.add_bench,
    "cost": cost.add_cost,
    "serve": serve.add_serve,
    "ab": add_ab_parser,  # llmrs ab serve|load|report (chapter 12)
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmrs", description="llm-rs in Python: a from-scratch LLM inference engine."
    )
    parser.add_argument("--version", action="version", version=f"llmrs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS.values():
        add(sub)
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
        print(f"llmrs {args.command}: error: {one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug of ours: still one line, and how to see the rest
        print(f"llmrs {args.command}: internal error: {type(e).__name__}: {one_line(e)} "
              "(set LLMRS_DEBUG=1 for the traceback)", file=sys.stderr)
        if os.environ.get("LLMRS_DEBUG"):
            raise
        return 70


__all__ = ["COMMANDS", "build_parser", "main"]
