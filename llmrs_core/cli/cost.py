"""``llmrs cost``: dollars per million tokens from benchmark JSON and an instance price (chapter 12)."""

from __future__ import annotations

import argparse
import json


def cmd_cost(args: argparse.Namespace) -> int:
    from ..cost import cost_json, cost_rows, find_price, format_cost, load_prices, read_throughputs

    price = find_price(load_prices(args.prices) if args.prices else load_prices(), args.instance)
    throughputs = [t for path in args.results for t in read_throughputs(path)]
    rows = cost_rows(throughputs, price, args.utilisation)
    print(json.dumps(cost_json(rows, price), indent=2) if args.json else format_cost(rows, price))
    return 0


def add_cost(sub: argparse._SubParsersAction) -> None:
    """``llmrs cost`` (chapter 12)."""
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


__all__ = ["add_cost", "cmd_cost"]
