"""``bench all``'s serve benchmark on a tiny model: our server, started on 127.0.0.1 on a free port
and stopped by the benchmark, under 1 and 2 clients, five repetitions of each level interleaved.
(llama-cpp-python's server is left out: the figures' bookkeeping is what is checked.)"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from llmrs_core.bench.suite import Plan, ServeBench, run_all  # noqa: E402
from llmrs_core.testing import write_tiny_llama  # noqa: E402


def test_serve_figures_per_level_from_interleaved_repetitions(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    plan = Plan("test", 5, 1, serve_levels=(1, 2), serve_prompts=2, serve_input_len=8, serve_output_len=4)
    ticks = []
    bench = ServeBench(compare=False)
    result = run_all(path, plan, benchmarks={"serve": bench}, progress=False, measure_machine=False,
                     say=ticks.append)
    figures = {f["key"]: f for f in result["figures"]}
    assert set(figures) == {f"serve.{c}.llmrs.{m}" for c in (1, 2) for m in ("output_tok_s", "ttft_p50")}
    for f in figures.values():
        assert len(f["samples"]) == 5 and all(x > 0 for x in f["samples"]), f
    notes = result["benchmarks"]["serve"]["notes"]
    assert not any("failed or were truncated" in n for n in notes), notes
    assert bench.steps(plan) == 10
