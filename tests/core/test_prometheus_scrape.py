"""A real Prometheus (the `prometheus` binary) scrapes `llmrs serve` and agrees with the responses' usage
(chapter 12, `make observe`'s check on a tiny model). Skipped when the binary is not installed. The server
(in a thread) and Prometheus (a process) listen on 127.0.0.1 and free ports and are always stopped; every
wait is bounded.
"""

from __future__ import annotations

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

import llmrs_core as llmrs  # noqa: E402
from llmrs_core.ops.observe import Prometheus, prometheus_missing, scrape_check, scrape_config, send_load  # noqa: E402
from llmrs_core.server import BackgroundServer, create_app  # noqa: E402
from llmrs_core.testing import write_tiny_llama  # noqa: E402

MISSING = prometheus_missing()


def test_scrape_config_names_the_target_and_interval():
    config = scrape_config("127.0.0.1:1234", 1)
    assert "scrape_interval: 1s" in config and "targets: ['127.0.0.1:1234']" in config


@pytest.mark.skipif(MISSING is not None, reason=f"no real Prometheus here: {MISSING}")
def test_prometheus_sees_the_tokens_the_responses_reported(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=3)
    model = llmrs.load(path, backend="numpy")
    app = create_app(model, served_model_name="tiny", warm_up=False)
    with BackgroundServer(app) as url, Prometheus(url.removeprefix("http://"), start_timeout=60.0) as prom:
        usage = send_load(url, "tiny", 8, max_tokens=12)
        rows = scrape_check(url, prom, usage, timeout=60.0)
    failed = [r for r in rows if not r["ok"]]
    assert not failed, f"Prometheus disagrees with the responses: {failed}"
    assert next(r for r in rows if r["check"] == "generation tokens")["prometheus"] == sum(
        u.completion_tokens for u in usage)
