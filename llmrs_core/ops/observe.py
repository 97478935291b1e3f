"""``make observe``: a real Prometheus scrapes ``llmrs serve``, and agrees with the responses (chapter 12).

``python -m llmrs_core.ops.observe [--model GGUF] [--requests 8]`` starts
``llmrs serve`` on 127.0.0.1 and a free port, and the ``prometheus`` binary
(Debian's package; ``apt-get install prometheus``) with a generated scrape
config — one job, the server's ``/metrics`` every second — on its own free
port of 127.0.0.1 and a temporary storage directory. It sends a known load of
chat completions through the ``openai`` client — every third with ``n=2``
choices, whose ``usage.prompt_tokens`` counts the prompt once — waits for a
scrape taken after the server had observed every request, then asks
Prometheus's HTTP API (``/api/v1/query``) and checks that

* ``llmrs:generation_tokens_total`` equals the sum of the responses' ``completion_tokens``,
* ``llmrs:prompt_tokens_total`` equals the sum of their ``prompt_tokens`` (with ``n`` > 1 too),
* the TTFT and e2e histograms count one observation per choice (each is one engine request),
* ``llmrs:request_success_total`` counts every choice.

It prints a table and exits 1 if any check fails. Both processes are always
stopped (SIGTERM, then a kill). :func:`scrape_check` is the same check against
a server already running (the test runs it on a tiny model in-process).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..bench.serve_compare import ManagedServer, our_command

PROMETHEUS_MISSING = ("the prometheus binary is not on PATH: apt-get install prometheus "
                      "(Debian/Ubuntu; `make observe` does this when run as root), or get it from prometheus.io")
SCRAPE_INTERVAL_S = 1


def prometheus_missing() -> str | None:
    """Why a real Prometheus cannot run here, or ``None``."""
    return None if shutil.which("prometheus") else PROMETHEUS_MISSING


def scrape_config(target: str, interval_s: int = SCRAPE_INTERVAL_S) -> str:
    """A Prometheus config scraping ``target`` (``host:port``) at ``/metrics`` every ``interval_s``."""
    return (f"global:\n  scrape_interval: {interval_s}s\n  evaluation_interval: {interval_s}s\n"
            f"scrape_configs:\n  - job_name: llmrs\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: ['{target}']\n")


class Prometheus(ManagedServer):
    """``prometheus`` scraping ``target`` on 127.0.0.1 and a free port, its storage in a temporary
    directory (removed on exit); ``with Prometheus("127.0.0.1:8000") as url: ...``."""

    def __init__(self, target: str, start_timeout: float = 60.0):
        self.dir = tempfile.TemporaryDirectory(prefix="llmrs-prometheus-")
        config = Path(self.dir.name) / "prometheus.yml"
        config.write_text(scrape_config(target))
        storage = Path(self.dir.name) / "data"

        def command(port: int) -> list[str]:
            return [shutil.which("prometheus") or "prometheus", f"--config.file={config}",
                    f"--storage.tsdb.path={storage}", f"--web.listen-address=127.0.0.1:{port}"]

        super().__init__("prometheus", command, "/-/ready", start_timeout=start_timeout)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.dir.cleanup()


def query(prometheus_url: str, expr: str) -> tuple[float, float] | None:
    """``(value, sample timestamp)`` of an instant query that gives one number (``sum(...)``, say),
    or ``None`` when it gives no series (the metric was not scraped yet)."""
    r = httpx.get(prometheus_url + "/api/v1/query", params={"query": expr}, timeout=10.0, trust_env=False)
    r.raise_for_status()
    body = r.json()
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body}")
    result = body["data"]["result"]
    if not result:
        return None
    if len(result) != 1:
        raise ValueError(f"{expr!r} gave {len(result)} series; aggregate it to one")
    stamp, value = result[0]["value"]
    return float(value), float(stamp)


@dataclass(frozen=True)
class Usage:
    """One response's ``usage`` and its number of choices (engine requests)."""

    prompt_tokens: int
    completion_tokens: int
    choices: int = 1


#: every this many requests of :func:`send_load`, one asks for ``n=2`` choices
MULTI_CHOICE_EVERY = 3


def send_load(base_url: str, model: str, n: int, max_tokens: int = 32) -> list[Usage]:
    """``n`` chat completions (greedy, one after the other) through the ``openai`` client; their usage.
    Every :data:`MULTI_CHOICE_EVERY`-th asks for two choices (``n=2``)."""
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=300.0)
    out = []
    for i in range(n):
        choices = 2 if i % MULTI_CHOICE_EVERY == MULTI_CHOICE_EVERY - 1 else 1
        r = client.chat.completions.create(model=model, max_tokens=max_tokens, temperature=0, n=choices, messages=[
            {"role": "user", "content": f"Give me fact number {i + 1} about the ocean, in one sentence."}])
        out.append(Usage(r.usage.prompt_tokens, r.usage.completion_tokens, len(r.choices)))
    return out


def _server_total(base_url: str, name: str) -> float:
    """The sum of a metric's series on the server's own ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base_url + "/metrics", timeout=10.0, trust_env=False).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def scrape_check(base_url: str, prometheus_url: str, usage: list[Usage], timeout: float = 60.0) -> list[dict]:
    """Compare what Prometheus scraped from ``base_url`` with the responses' ``usage``; one row per check.

    Waits (at most ``timeout`` s) until the server has observed every request's finish, then for a
    Prometheus sample of the server taken after that moment, so the query sees the whole load.
    """
    n = sum(u.choices for u in usage)  # engine requests: one per choice
    _wait(lambda: _server_total(base_url, "llmrs:request_success_total") >= n, timeout,
          "the server to observe every request")
    settled = time.time()

    def scraped_after() -> bool:
        got = query(prometheus_url, "max(timestamp(llmrs:generation_tokens_total))")
        return got is not None and got[0] > settled

    _wait(scraped_after, timeout, "a Prometheus scrape after the load")
    checks = [
        ("generation tokens", "sum(llmrs:generation_tokens_total)", "sum of completion_tokens",
         sum(u.completion_tokens for u in usage)),
        ("prompt tokens", "sum(llmrs:prompt_tokens_total)", "sum of prompt_tokens", sum(u.prompt_tokens for u in usage)),
        ("TTFT observations", "sum(llmrs:time_to_first_token_seconds_count)", "choices", n),
        ("e2e observations", "sum(llmrs:e2e_request_latency_seconds_count)", "choices", n),
        ("finished requests", "sum(llmrs:request_success_total)", "choices", n),
    ]
    rows = []
    for what, expr, reference, want in checks:
        got = query(prometheus_url, expr)
        value = None if got is None else got[0]
        rows.append({"check": what, "promql": expr, "prometheus": value, "reference": reference, "want": want,
                     "ok": value == want})
    ttft = query(prometheus_url, "sum(llmrs:time_to_first_token_seconds_sum) / "
                                 "sum(llmrs:time_to_first_token_seconds_count)")
    rows.append({"check": "mean TTFT (s)", "promql": "ttft_sum / ttft_count", "prometheus": ttft and ttft[0],
                 "reference": "(shown, not checked)", "want": None, "ok": True})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'check':<20} {'Prometheus':>12} {'responses':>10}  {'':4} reference", "-" * 72]
    for r in rows:
        got = "-" if r["prometheus"] is None else f"{r['prometheus']:.4g}"
        want = "" if r["want"] is None else str(r["want"])
        mark = "" if r["want"] is None else ("ok" if r["ok"] else "FAIL")
        lines.append(f"{r['check']:<20} {got:>12} {want:>10}  {mark:4} {r['reference']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from ..fetch import default_model_path

    p = argparse.ArgumentParser(prog="python -m llmrs_core.ops.observe", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(default_model_path()), help="a GGUF file (default: SmolLM2)")
    p.add_argument("--requests", type=int, default=8, help="chat completions to send (default 8)")
    p.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each (default 32)")
    p.add_argument("--backend", help="the server's backend (default: llmrs serve's)")
    args = p.parse_args(argv)
    missing = prometheus_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    if not Path(args.model).is_file():
        print(f"no model at {args.model}: run `make fetch` (or give --model)", file=sys.stderr)
        return 2
    if args.requests < 1:
        print(f"--requests must be >= 1, got {args.requests}", file=sys.stderr)
        return 2
    started = time.monotonic()
    server = ManagedServer("llmrs", lambda port: our_command(args.model, port, None, 16, args.backend), "/ready")
    with server as base_url:
        print(f"llmrs serve: {base_url} ({time.monotonic() - started:.1f} s to ready)")
        with Prometheus(base_url.removeprefix("http://")) as prometheus_url:
            print(f"prometheus:  {prometheus_url} (scraping every {SCRAPE_INTERVAL_S} s)")
            name = httpx.get(base_url + "/v1/models", timeout=10.0, trust_env=False).json()["data"][0]["id"]
            usage = send_load(base_url, name, args.requests, args.max_tokens)
            print(f"sent {len(usage)} chat completions to {name!r} ({sum(u.choices for u in usage)} choices)")
            rows = scrape_check(base_url, prometheus_url, usage)
    print(format_rows(rows))
    ok = all(r["ok"] for r in rows)
    print(f"{'Prometheus agrees with the responses' if ok else 'MISMATCH'} ({time.monotonic() - started:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
