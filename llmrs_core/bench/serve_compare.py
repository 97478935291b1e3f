"""``llmrs bench serve --compare``: our server and llama-cpp-python's, the same load on each (chapter 11).

Each server is started by the benchmark as a process of its own, one after the
other (never both at once: they would share the cores), on the same GGUF file
with the same threads, listening on 127.0.0.1 on a free port. Each has
``start_timeout`` seconds to get ready and is always stopped — SIGTERM, then a
kill — when its runs end, fail, or Ctrl-C interrupts them.

llama-cpp-python's server runs twice: as it ships, with ``interrupt_requests``
on, so that a request arriving while another streams cuts that stream short
(``[DONE]`` with no ``finish_reason``: the benchmark reports those answers as
truncated); and with ``--interrupt_requests False``, which answers everyone in
turn, one request at a time (its server holds one lock for every route).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..files import atomic_write
from .serve import Load, Workload, benchmark

OURS = "llmrs"
LLAMA_CPP = "llama-cpp-python"
LLAMA_CPP_IN_TURN = "llama-cpp-python (no interrupt)"
LLAMA_CPP_INSTALL = ("llama-cpp-python's server is not installed: pip install 'llama-cpp-python[server]' "
                     "(it compiles llama.cpp, about 5 minutes)")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_cpp_server_missing() -> str | None:
    """Why llama-cpp-python's server cannot run here, or ``None`` when it can."""
    for module in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings"):
        if importlib.util.find_spec(module) is None:
            return LLAMA_CPP_INSTALL
    return None


def our_command(model: str, port: int, threads: int | None, max_num_seqs: int,
                backend: str | None = None) -> list[str]:
    """``llmrs serve`` on ``model``, 127.0.0.1:``port``."""
    cmd = [sys.executable, "-m", "llmrs_core", "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
           "--max-num-seqs", str(max_num_seqs), "--drain-timeout", "5"]
    if backend is not None:
        cmd += ["--backend", backend]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    return cmd


def llama_cpp_command(model: str, port: int, threads: int, n_ctx: int, interrupt: bool = True) -> list[str]:
    """llama-cpp-python's server on ``model``, 127.0.0.1:``port``, ``threads`` for prompts and decoding;
    ``interrupt=False``: a new request waits instead of cutting the one streaming."""
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--n_ctx", str(n_ctx), "--interrupt_requests", str(interrupt)]


class ManagedServer:
    """A server process started by the benchmark; ``with ManagedServer(...) as base_url: ...``.

    ``command(port)`` gives its command line; it is ready when ``GET ready_path`` answers 200,
    which must happen within ``start_timeout`` seconds. It is stopped on leaving the block,
    however the block ends: SIGTERM, ``stop_timeout`` seconds, then a kill. Its output goes
    to a temporary log, whose end is quoted if it does not start.
    """

    def __init__(self, name: str, command: Callable[[int], list[str]], ready_path: str,
                 threads: int | None = None, start_timeout: float = 300.0, stop_timeout: float = 15.0):
        self.name, self.command, self.ready_path = name, command, ready_path
        self.threads, self.start_timeout, self.stop_timeout = threads, start_timeout, stop_timeout
        self.process: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()
        self.argv: list[str] = []

    def __enter__(self) -> str:
        import httpx

        port = free_port()
        self.argv = self.command(port)
        env = dict(os.environ)
        if self.threads is not None:  # BLAS and OpenMP pools too: the threads given, no more
            env |= {k: str(self.threads) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        self.process = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.start_timeout
        try:
            while True:
                if self.process.poll() is not None:
                    raise OSError(f"{self.name}'s server exited with status {self.process.returncode} before it "
                                  f"was ready: {self.log_tail()}")
                try:
                    if httpx.get(url + self.ready_path, timeout=2.0, trust_env=False).status_code == 200:
                        return url
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise OSError(f"{self.name}'s server was not ready within {self.start_timeout:g} s: "
                                  f"{self.log_tail()}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def log_tail(self, lines: int = 3) -> str:
        self.log.seek(0)
        tail = self.log.read().decode("utf-8", errors="replace").strip().splitlines()[-lines:]
        return " | ".join(tail) or "(no output)"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(self.stop_timeout)
        self.log.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def compare(model: str | Path, loads: Sequence[Load], workloads: Callable[[int], Workload], *, threads: int = 2,
            seed: int = 0, slos: dict[str, float] | None = None, with_llama_cpp: bool = True,
            backend: str | None = None, n_ctx: int = 2048, start_timeout: float = 300.0, timeout: float = 300.0,
            on_level: Callable[[str], None] | None = None) -> dict:
    """The same load against our server and, if installed, llama-cpp-python's, on one GGUF file.

    ``threads`` go to both (``None`` only with a ``backend`` that has no threads, for tests);
    ``n_ctx``: llama-cpp-python's context in tokens (prompt + output must fit); ``start_timeout``:
    seconds each server has to get ready; ``timeout``: seconds a request may wait for its next byte.
    Returns ``{"model_path", "threads", "servers": {name: benchmark result + "command"}, "notes"}``.
    """
    model = str(model)
    concurrency = max((load.max_concurrency or 16 for load in loads), default=16)
    servers: dict[str, dict] = {}
    notes: list[str] = []

    server = ManagedServer(OURS, lambda port: our_command(model, port, threads, max(16, concurrency), backend),
                           "/ready", threads, start_timeout)
    _run_with(server, servers, loads, workloads, seed, slos, timeout, "ignore_eos", on_level)
    missing = llama_cpp_server_missing() if with_llama_cpp else "llama-cpp-python: not asked for"
    if missing is None:
        for name, interrupt in ((LLAMA_CPP, True), (LLAMA_CPP_IN_TURN, False)):
            server = ManagedServer(
                name, lambda port, interrupt=interrupt: llama_cpp_command(model, port, threads or 2, n_ctx, interrupt),
                "/v1/models", threads, start_timeout)
            _run_with(server, servers, loads, workloads, seed, slos, timeout, "min_tokens", on_level)
        notes.append(f"{LLAMA_CPP} runs as shipped (interrupt_requests on): a request arriving while another "
                     f"streams cuts that stream; such answers count as truncated. {LLAMA_CPP_IN_TURN}: "
                     "--interrupt_requests False, one request at a time")
    else:
        notes.append(missing)
    return {"model_path": model, "threads": threads, "servers": servers, "notes": notes}


def _run_with(server: ManagedServer, servers: dict[str, dict], loads: Sequence[Load],
             workloads: Callable[[int], Workload], seed: int, slos: dict[str, float] | None, timeout: float,
             length_field: str, on_level: Callable[[str], None] | None) -> None:
    """Start ``server``, run every load on it, stop it; its result goes to ``servers[server.name]``."""
    with server as url:
        say = None if on_level is None else (lambda line: on_level(f"{server.name}: {line}"))
        result = benchmark(url, loads, workloads, length_field=length_field, seed=seed, slos=slos,
                           timeout=timeout, on_level=say)
    servers[server.name] = {**result, "command": server.argv}


# -- the table and the plot ----------------------------------------------------------------


def format_table(servers: dict[str, dict]) -> str:
    """Side by side, per load level: output tokens/s, TTFT and ITL p50/p99 (ms), failed, truncated."""
    w = max([17, *(len(name) for name in servers)])
    header = (f"{'load':<16} {'server':<{w}} {'tok/s':>7} {'req/s':>6} {'TTFT p50':>9} {'p99':>7} "
              f"{'ITL p50':>8} {'p99':>6} {'failed':>6} {'trunc.':>6}")
    lines = [header, "-" * len(header)]
    labels = list(dict.fromkeys(run["label"] for r in servers.values() for run in r["runs"]))
    for label in labels:
        for name, r in servers.items():
            for run in r["runs"]:
                if run["label"] != label:
                    continue
                ms = {k: {q: 1e3 * v for q, v in run[k].items()} for k in ("ttft_s", "itl_s")}
                lines.append(f"{label:<16} {name:<{w}} {run['output_tokens_per_s']:7.1f} {run['requests_per_s']:6.2f} "
                             f"{ms['ttft_s']['p50']:9.0f} {ms['ttft_s']['p99']:7.0f} {ms['itl_s']['p50']:8.1f} "
                             f"{ms['itl_s']['p99']:6.1f} {run['failed']:6d} {run['truncated']:6d}")
    for reference in (LLAMA_CPP, LLAMA_CPP_IN_TURN):
        if OURS not in servers or reference not in servers:
            continue
        ratios = []
        for ours, theirs in zip(servers[OURS]["runs"], servers[reference]["runs"]):
            rate = theirs["output_tokens_per_s"]
            ratios.append(f"{ours['label']} {ours['output_tokens_per_s'] / rate:.2f}x" if rate > 0
                          else f"{ours['label']} (theirs 0)")
        lines.append(f"output tokens/s, {OURS} / {reference}: " + ", ".join(ratios))
    lines.append("ms; latencies of the requests that succeeded; tok/s and req/s count only those")
    return "\n".join(lines)


def write_plot(servers: dict[str, dict], path: str | Path) -> None:
    """A PNG: median TTFT (ms) and output tokens/s against the load level, one line per server."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib") from None
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ttft_ax, tput_ax = fig.subplots(1, 2)
    closed = True
    for name, r in servers.items():
        xs = [run["load"]["max_concurrency"] or run["load"]["request_rate"] for run in r["runs"]]
        closed = all(run["load"]["max_concurrency"] is not None for run in r["runs"])
        ttft_ax.plot(xs, [1e3 * run["ttft_s"]["p50"] for run in r["runs"]], marker="o", label=name)
        tput_ax.plot(xs, [run["output_tokens_per_s"] for run in r["runs"]], marker="o", label=name)
    levels = sorted({run["load"]["max_concurrency"] or run["load"]["request_rate"]
                     for r in servers.values() for run in r["runs"]})
    for ax, title in ((ttft_ax, "median TTFT (ms)"), (tput_ax, "output tokens/s")):
        ax.set_xlabel("concurrent clients" if closed else "request rate (req/s)")
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, labels=[f"{x:g}" for x in levels])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)


__all__ = ["LLAMA_CPP", "LLAMA_CPP_IN_TURN", "OURS", "ManagedServer", "compare", "format_table", "free_port",
           "llama_cpp_command", "llama_cpp_server_missing", "our_command", "write_plot"]
