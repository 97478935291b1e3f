"""``llmrs cost``: dollars per million tokens from measured throughput and an instance price (chapter 12).

An instance billed ``usd_per_hour`` that serves ``r`` tokens/s during a fraction
``u`` of the hours it is paid for (its *utilisation*) costs

    $ per million tokens = usd_per_hour / (r * 3600 * u) * 1e6

so 1,000 tokens/s on a $3.60/h machine kept fully busy is $1.00 per million.

The throughput comes from the project's own benchmark JSON, recognised by its shape:

* ``llmrs bench speed --json`` (``backends``: ``pp`` and ``tg`` per backend, plus
  ``llama_cpp``): prompt processing and token generation are measured apart, so
  each gives its own price, input tokens from ``pp`` and output tokens from ``tg``
  (each as if the machine did only that);
* ``llmrs bench throughput --json`` (``batched``, ``single_decode_tokens_per_s``,
  ``batched_decode_tokens_per_s``): the batched run's output tokens/s (prefills
  included, so the whole run's cost is charged to its output tokens), and the
  steady decode of one sequence and of a full batch;
* ``llmrs bench serve --output FILE`` (``servers`` -> ``runs``): per server and
  load, the run's output tokens over its duration (again the whole run's cost
  on its output tokens), and input plus output together over the same time.

A run that did prefill and decode together cannot price input and output apart
without a model of how its time divides; those rows say so (``None``) rather than
guess. Instance prices are a small editable TOML table shipped with the engine
(:data:`DEFAULT_PRICES`), each price with its source and the date it was read.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: the table shipped with the engine (``llmrs cost --prices FILE`` uses another)
DEFAULT_PRICES = Path(__file__).with_name("data") / "prices.toml"
#: the instance ``llmrs cost`` prices unless told otherwise
DEFAULT_INSTANCE = "aws-c7a.large"
SECONDS_PER_HOUR = 3600.0


class CostError(ValueError):
    """A benchmark file, price table or option ``llmrs cost`` cannot use; the message says why."""


@dataclass(frozen=True)
class Price:
    """One instance's on-demand price and where it came from."""

    name: str
    usd_per_hour: float
    hardware: str
    source: str
    as_of: str
    note: str = ""
    region: str = ""


@dataclass(frozen=True)
class Throughput:
    """One measured throughput, tokens per second of wall time.

    ``input_tokens_per_s`` / ``output_tokens_per_s``: prompt tokens and generated
    tokens per second, ``None`` where the benchmark did not measure it. With
    ``combined`` (a run doing both at once) both rates share the same seconds:
    the output price then carries the whole run's cost, and ``input_tokens_per_s``
    only counts towards the price of all tokens together.
    """

    source: str  # "bench speed", "bench throughput", "bench serve"
    label: str
    input_tokens_per_s: float | None
    output_tokens_per_s: float | None
    combined: bool = False


@dataclass(frozen=True)
class CostRow:
    """Dollars per million tokens for one throughput on one instance (``None``: not measured)."""

    throughput: Throughput
    instance: str
    utilisation: float
    usd_per_m_input: float | None
    usd_per_m_output: float | None
    usd_per_m_all: float | None  # input and output together, for runs that did both at once


def usd_per_million(tokens_per_s: float, usd_per_hour: float, utilisation: float) -> float:
    """Dollars per million tokens at ``tokens_per_s`` on an instance at ``usd_per_hour``, busy ``utilisation``."""
    if not tokens_per_s > 0:
        raise CostError(f"a throughput of {tokens_per_s} tokens/s cannot be priced: it must be > 0 "
                        "(did the benchmark run finish?)")
    if not usd_per_hour >= 0:
        raise CostError(f"usd_per_hour must be >= 0, got {usd_per_hour}")
    check_utilisation(utilisation)
    return usd_per_hour / (tokens_per_s * SECONDS_PER_HOUR * utilisation) * 1e6


def check_utilisation(utilisation: float) -> float:
    """``utilisation`` if it is in (0, 1]: the fraction of paid hours spent serving at the measured rate."""
    if isinstance(utilisation, bool) or not (isinstance(utilisation, (int, float)) and 0 < utilisation <= 1):
        raise CostError(f"utilisation must be in (0, 1] (a fraction of the paid hours, 0.6 = 60 %), "
                        f"got {utilisation!r}")
    return float(utilisation)


# -- prices -------------------------------------------------------------------------------------


def load_prices(path: str | Path = DEFAULT_PRICES) -> dict[str, Price]:
    """The instance table of a prices TOML file (``[instances."NAME"]`` with ``usd_per_hour``,
    ``hardware``, ``source``, ``as_of``; optional ``note``, ``region``)."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise CostError(f"{path} is not valid TOML: {e}") from None
    instances = table.get("instances")
    if not isinstance(instances, dict) or not instances:
        raise CostError(f"{path} has no [instances.\"NAME\"] tables")
    prices = {}
    for name, entry in instances.items():
        missing = [k for k in ("usd_per_hour", "hardware", "source", "as_of") if k not in entry]
        if missing:
            raise CostError(f"{path}: instance {name!r} lacks {', '.join(missing)} (every price says its "
                            "source and the date it was read)")
        usd = entry["usd_per_hour"]
        if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not usd >= 0:
            raise CostError(f"{path}: instance {name!r} has usd_per_hour {usd!r}; it must be a number >= 0")
        prices[name] = Price(name, float(usd), str(entry["hardware"]), str(entry["source"]), str(entry["as_of"]),
                             str(entry.get("note", "")), str(entry.get("region", "")))
    return prices


def find_price(prices: dict[str, Price], name: str) -> Price:
    try:
        return prices[name]
    except KeyError:
        raise CostError(f"no instance {name!r} in the price table; it has: {', '.join(sorted(prices))} "
                        "(add one to the table, or give --prices FILE)") from None


# -- benchmark files ----------------------------------------------------------------------------


def _rate(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CostError(f"{where} is {value!r}, not a number of tokens/s")
    return float(value)


def throughputs_from_speed(result: dict) -> list[Throughput]:
    """``llmrs bench speed`` JSON: one row per backend (and llama.cpp when it ran): input at pp, output at tg."""
    rows = []
    engines = [(name, r) for name, r in result["backends"].items()]
    if isinstance(result.get("llama_cpp"), dict):
        engines.append(("llama.cpp", result["llama_cpp"]))
    for name, r in engines:
        pp = _rate(r["pp"]["tokens_per_s"], f"{name}'s pp tokens_per_s")
        tg = _rate(r["tg"]["tokens_per_s"], f"{name}'s tg tokens_per_s")
        label = f"{name}, pp{result.get('pp_tokens', '')} / tg{result.get('tg_tokens', '')}"
        rows.append(Throughput("bench speed", label, pp, tg))
    return rows


def throughputs_from_throughput(result: dict) -> list[Throughput]:
    """``llmrs bench throughput`` JSON: the batched run, and steady decode alone and batched."""
    n = result["workload"]["max_num_seqs"]
    batched = result["batched"]
    return [
        Throughput("bench throughput", f"engine run, up to {n} at once (prefills included)", None,
                   _rate(batched["output_tokens_per_s"], "batched output_tokens_per_s"), combined=True),
        Throughput("bench throughput", "decode, 1 sequence", None,
                   _rate(result["single_decode_tokens_per_s"], "single_decode_tokens_per_s")),
        Throughput("bench throughput", f"decode, batch of {n}", None,
                   _rate(result["batched_decode_tokens_per_s"], "batched_decode_tokens_per_s")),
    ]


def throughputs_from_serve(result: dict) -> list[Throughput]:
    """``llmrs bench serve`` JSON: per server and load, output (and input + output) tokens over the run.

    Input tokens are the workload's ``input_len`` per completed request (the random prompts are cut
    to that many tokens of the model's tokenizer). A run with failed or truncated requests says so
    in its label: its tokens/s are not what a working server would give.
    """
    input_len = result["workload"]["input_len"]
    rows = []
    for server, s in result["servers"].items():
        for run in s["runs"]:
            seconds = _rate(run["duration_s"], f"{server} {run.get('label')} duration_s")
            if not seconds > 0:
                raise CostError(f"{server} {run.get('label')}: duration_s is {seconds}; it must be > 0")
            out = run["output_tokens"] / seconds
            inp = run["completed"] * input_len / seconds
            label = f"{server}, {run['label']}"
            bad = {k: run.get(k, 0) for k in ("failed", "truncated") if run.get(k, 0)}
            if bad:  # their tokens still count, but the run is not a fair price: say so
                label += " (" + ", ".join(f"{v} {k}" for k, v in bad.items()) + ")"
            rows.append(Throughput("bench serve", label, inp, out, combined=True))
    return rows


#: top-level keys that identify each benchmark's JSON
_SHAPES = (
    (("backends", "pp_tokens", "tg_tokens"), "bench speed", throughputs_from_speed),
    (("batched", "single_decode_tokens_per_s", "batched_decode_tokens_per_s"), "bench throughput",
     throughputs_from_throughput),
    (("servers", "workload"), "bench serve", throughputs_from_serve),
)


def read_throughputs(path: str | Path) -> list[Throughput]:
    """The throughputs in a benchmark JSON file written by ``llmrs bench speed|throughput|serve``."""
    path = Path(path)
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CostError(f"{path} is not JSON ({e}); give the output of llmrs bench speed --json, "
                        "bench throughput --json or bench serve --output FILE") from None
    return parse_throughputs(result, str(path))


def parse_throughputs(result: object, name: str = "the JSON") -> list[Throughput]:
    """:func:`read_throughputs` of an already-parsed benchmark result."""
    if isinstance(result, dict):
        for keys, what, parse in _SHAPES:
            if all(k in result for k in keys):
                try:
                    return parse(result)
                except (KeyError, TypeError) as e:
                    raise CostError(f"{name} looks like {what} output but lacks {e}: was it written by another "
                                    "version of llmrs?") from None
    found = ", ".join(map(str, list(result)[:8])) if isinstance(result, dict) else type(result).__name__
    raise CostError(f"{name} is not a benchmark result llmrs cost knows (bench speed --json, bench throughput "
                    f"--json, bench serve --output): its top level has {found}")


# -- the table ----------------------------------------------------------------------------------


def cost_rows(throughputs: list[Throughput], price: Price, utilisation: float) -> list[CostRow]:
    """Each throughput priced on ``price`` at ``utilisation``."""
    check_utilisation(utilisation)
    rows = []
    for t in throughputs:
        def per_m(rate: float | None) -> float | None:
            return None if rate is None else usd_per_million(rate, price.usd_per_hour, utilisation)

        if t.combined:
            both = None if t.input_tokens_per_s is None else per_m(t.input_tokens_per_s + t.output_tokens_per_s)
            rows.append(CostRow(t, price.name, utilisation, None, per_m(t.output_tokens_per_s), both))
        else:
            rows.append(CostRow(t, price.name, utilisation, per_m(t.input_tokens_per_s),
                                per_m(t.output_tokens_per_s), None))
    return rows


def _money(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.2f}" if x >= 1 else f"{x:.3f}"


def _rate_text(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def format_cost(rows: list[CostRow], price: Price) -> str:
    """The table ``llmrs cost`` prints."""
    u = rows[0].utilisation if rows else 0
    head = (f"{price.name}: ${price.usd_per_hour:g}/h on demand ({price.hardware}; {price.source}, as of "
            f"{price.as_of}: check before use), {u:.0%} utilisation")
    lines = [head, "",
             f"{'source':<17} {'measurement':<50} {'in tok/s':>9} {'out tok/s':>9} {'$/M in':>8} {'$/M out':>8} "
             f"{'$/M all':>8}", "-" * 115]
    for r in rows:
        t = r.throughput
        lines.append(f"{t.source:<17} {t.label[:50]:<50} {_rate_text(t.input_tokens_per_s):>9} "
                     f"{_rate_text(t.output_tokens_per_s):>9} {_money(r.usd_per_m_input):>8} "
                     f"{_money(r.usd_per_m_output):>8} {_money(r.usd_per_m_all):>8}")
    lines += ["", "$/M in, $/M out: dollars per million prompt / generated tokens. Where one run did both",
              "(bench throughput's run, bench serve), $/M out charges the whole run to its output tokens and",
              "$/M all spreads it over input and output together; input alone is not priced there (-)."]
    return "\n".join(lines)


def cost_json(rows: list[CostRow], price: Price) -> dict:
    """The table as JSON (``llmrs cost --json``)."""
    return {
        "instance": {"name": price.name, "usd_per_hour": price.usd_per_hour, "hardware": price.hardware,
                     "source": price.source, "as_of": price.as_of, "note": price.note, "region": price.region},
        "utilisation": rows[0].utilisation if rows else None,
        "rows": [{"source": r.throughput.source, "label": r.throughput.label,
                  "input_tokens_per_s": r.throughput.input_tokens_per_s,
                  "output_tokens_per_s": r.throughput.output_tokens_per_s, "combined": r.throughput.combined,
                  "usd_per_m_input": r.usd_per_m_input, "usd_per_m_output": r.usd_per_m_output,
                  "usd_per_m_all": r.usd_per_m_all} for r in rows],
    }


__all__ = ["DEFAULT_INSTANCE", "DEFAULT_PRICES", "CostError", "CostRow", "Price", "Throughput", "check_utilisation",
           "cost_json", "cost_rows", "find_price", "format_cost", "load_prices", "parse_throughputs",
           "read_throughputs", "usd_per_million"]
