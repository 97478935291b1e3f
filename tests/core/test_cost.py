"""``llmrs cost`` (chapter 12): dollars per million tokens from benchmark JSON and an instance price.

The arithmetic against cases worked by hand; the parsers on the benchmark files stored in the repository
(written by ``llmrs bench speed`` and ``llmrs bench serve``) and on a ``bench throughput`` result produced
here by the engine's own function on a tiny model; bad input gets an error naming the problem.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrs_core.cli import main
from llmrs_core.cost import (
    DEFAULT_INSTANCE,
    CostError,
    Price,
    Throughput,
    cost_rows,
    find_price,
    load_prices,
    parse_throughputs,
    read_throughputs,
    usd_per_million,
)

ROOT = Path(__file__).resolve().parents[2]
SPEED = ROOT / "chapters/ch08_cpu_optimization/bench_results.json"
SERVE = ROOT / "chapters/ch11_distributed_serving/results/bench_serve.json"
PRICE = Price("test-box", 3.6, "a box", "by hand", "2026")


# -- the arithmetic, by hand ---------------------------------------------------------------------


def test_one_thousand_tokens_per_second_at_3_60_an_hour_is_one_dollar_per_million():
    # 1e6 tokens take 1000 s = 1/3.6 h, and 3.6 $/h * 1/3.6 h = $1
    assert usd_per_million(1000, 3.6, 1.0) == pytest.approx(1.0, rel=1e-15)


def test_utilisation_divides_the_price():
    # busy half the paid hours: each token carries twice the cost
    assert usd_per_million(1000, 3.6, 0.5) == pytest.approx(2.0, rel=1e-15)
    # 100 tok/s at $0.36/h, 60 %: 0.36 / (100 * 3600 * 0.6) * 1e6 = 1/0.6
    assert usd_per_million(100, 0.36, 0.6) == pytest.approx(1 / 0.6, rel=1e-15)


def test_a_phase_row_prices_input_and_output_apart_and_a_run_charges_output():
    phase = Throughput("bench speed", "pp/tg", 2000.0, 500.0)
    run = Throughput("bench serve", "run", 3000.0, 1000.0, combined=True)
    a, b = cost_rows([phase, run], PRICE, 1.0)
    assert (a.usd_per_m_input, a.usd_per_m_output, a.usd_per_m_all) == pytest.approx((0.5, 2.0, None))
    # the run: all of its cost on 1000 output tok/s, or spread over 4000 tok/s of both
    assert a.usd_per_m_all is None and b.usd_per_m_input is None
    assert (b.usd_per_m_output, b.usd_per_m_all) == pytest.approx((1.0, 0.25))


# -- the parsers, on the stored results ----------------------------------------------------------


def test_bench_speed_json_gives_pp_as_input_and_tg_as_output():
    stored = json.loads(SPEED.read_text())
    rows = read_throughputs(SPEED)
    by_label = {t.label.split(",")[0]: t for t in rows}
    for backend, r in stored["backends"].items():
        t = by_label[backend]
        assert (t.input_tokens_per_s, t.output_tokens_per_s) == (r["pp"]["tokens_per_s"], r["tg"]["tokens_per_s"])
        assert not t.combined
    if "llama_cpp" in stored:
        assert by_label["llama.cpp"].output_tokens_per_s == stored["llama_cpp"]["tg"]["tokens_per_s"]


def test_bench_serve_json_gives_each_run_its_tokens_over_its_duration():
    stored = json.loads(SERVE.read_text())
    rows = read_throughputs(SERVE)
    runs = [(name, run) for name, s in stored["servers"].items() for run in s["runs"]]
    assert len(rows) == len(runs)
    for t, (name, run) in zip(rows, runs):
        assert t.label.startswith(f"{name}, {run['label']}") and t.combined
        assert t.output_tokens_per_s == run["output_tokens"] / run["duration_s"]
        assert t.input_tokens_per_s == run["completed"] * stored["workload"]["input_len"] / run["duration_s"]
        assert ("truncated" in t.label) == bool(run["truncated"])


def test_bench_throughput_result_of_the_engine_is_recognised(tmp_path):
    import llmrs_core as llmrs
    from llmrs_core.bench.throughput import throughput
    from llmrs_core.testing import write_tiny_llama

    write_tiny_llama(tmp_path / "tiny.gguf", byte_tokenizer=True, context_length=2048)  # the prefix workload: ~600
    result = throughput(llmrs.load(tmp_path / "tiny.gguf", backend="numpy"), n_requests=2, max_prompt=20,
                        max_output=17, max_num_seqs=2)
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps(result))  # what `llmrs bench throughput --json` prints
    run, single, batched = read_throughputs(path)
    assert run.combined and run.output_tokens_per_s == result["batched"]["output_tokens_per_s"]
    assert single.output_tokens_per_s == result["single_decode_tokens_per_s"]
    assert batched.output_tokens_per_s == result["batched_decode_tokens_per_s"] and "batch of 2" in batched.label


def test_the_shipped_price_table_says_where_each_price_came_from():
    prices = load_prices()
    assert DEFAULT_INSTANCE in prices
    for p in prices.values():
        assert p.usd_per_hour > 0 and p.source.startswith("https://") and p.as_of and p.hardware


def test_cli_prints_the_table_and_json(capsys):
    assert main(["cost", str(SPEED), "--utilisation", "1"]) == 0
    out = capsys.readouterr().out
    assert DEFAULT_INSTANCE in out and "check before use" in out
    assert main(["cost", str(SPEED), str(SERVE), "--json", "--utilisation", "0.5"]) == 0
    data = json.loads(capsys.readouterr().out)
    price = load_prices()[DEFAULT_INSTANCE].usd_per_hour
    first = data["rows"][0]
    assert data["utilisation"] == 0.5
    assert first["usd_per_m_output"] == pytest.approx(price / (first["output_tokens_per_s"] * 3600 * 0.5) * 1e6)


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("u", [0, -0.1, 1.01, float("nan"), True])
def test_utilisation_outside_zero_one_is_refused(u):
    with pytest.raises(CostError, match=r"utilisation must be in \(0, 1\]"):
        usd_per_million(1000, 3.6, u)


def test_zero_throughput_is_refused():
    with pytest.raises(CostError, match="0 tokens/s cannot be priced"):
        usd_per_million(0, 3.6, 0.6)
    stored = json.loads(SERVE.read_text())
    stored["servers"]["llmrs"]["runs"][0]["output_tokens"] = 0
    with pytest.raises(CostError, match="cannot be priced"):
        cost_rows(parse_throughputs(stored), PRICE, 0.6)


def test_unknown_json_and_not_json_are_named(tmp_path):
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(CostError, match="not a benchmark result llmrs cost knows.*hello"):
        read_throughputs(tmp_path / "other.json")
    (tmp_path / "text.json").write_text("pp 512")
    with pytest.raises(CostError, match="is not JSON"):
        read_throughputs(tmp_path / "text.json")
    broken = json.loads(SPEED.read_text())
    del broken["backends"]["numba"]["tg"]
    with pytest.raises(CostError, match="looks like bench speed output but lacks 'tg'"):
        parse_throughputs(broken)


def test_missing_instance_and_bad_tables(tmp_path, capsys):
    with pytest.raises(CostError, match="no instance 'h100-box' in the price table; it has: .*aws-c7a.large"):
        find_price(load_prices(), "h100-box")
    assert main(["cost", str(SPEED), "--instance", "h100-box"]) == 1
    assert "no instance 'h100-box'" in capsys.readouterr().err
    table = tmp_path / "prices.toml"
    table.write_text('[instances."box"]\nusd_per_hour = 1.0\nhardware = "x"\n')
    with pytest.raises(CostError, match="'box' lacks source, as_of"):
        load_prices(table)
    table.write_text('[instances."box"]\nusd_per_hour = -1\nhardware = "x"\nsource = "s"\nas_of = "2026"\n')
    with pytest.raises(CostError, match="usd_per_hour -1"):
        load_prices(table)
    table.write_text("instances = [")
    with pytest.raises(CostError, match="not valid TOML"):
        load_prices(table)
