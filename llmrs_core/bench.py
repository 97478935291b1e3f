"""``llmrs bench speed``: prompt processing and generation speed, llama-bench style (appendix A).

Two measurements, as llama.cpp's ``llama-bench`` makes them:

* **pp N** — prompt processing: one forward pass over N random tokens from an
  empty cache, tokens per second;
* **tg N** — text generation: N single-token decode steps after a short
  prompt, tokens per second.

Each runs once to warm up (compilation, page faults, caches) and then
``repetitions`` times; we report the median and the spread (min-max). When
``llama-cpp-python`` is importable, llama.cpp runs the same measurements on
the same GGUF file, with the same thread count, in the same process, and
the ratio is reported: a ratio measured in one run is comparable across
machines, absolute numbers are not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np


def timings(fn: Callable[[], None], repetitions: int, warm_up: bool = True) -> list[float]:
    """Seconds taken by each of ``repetitions`` calls of ``fn`` (after one untimed call)."""
    if warm_up:
        fn()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _summary(n_tokens: int, times: list[float]) -> dict:
    rates = [n_tokens / t for t in times]
    return {"tokens_per_s": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": len(rates)}


def blas_threads(threads: int | None):
    """A context limiting BLAS threads (threadpoolctl), or nothing when not asked or not installed."""
    if threads is None:
        return nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return nullcontext()
    return threadpool_limits(limits=threads)


def random_ids(rng: np.random.Generator, vocab_size: int, n: int) -> list[int]:
    """``n`` random token ids, away from the special tokens at the start of most vocabularies."""
    margin = min(100, vocab_size // 4)
    return rng.integers(margin, vocab_size - margin, n).tolist()


def ours(model, pp: int, tg: int, repetitions: int, seed: int = 0) -> dict:
    net = model.network
    prompt = random_ids(np.random.default_rng(seed), net.config.vocab_size, pp)

    def run_pp() -> None:
        net.forward(prompt, net.new_cache(pp), last_only=True)

    def run_tg() -> None:
        cache = net.new_cache(tg + 9)
        logits = net.forward(prompt[:8], cache, last_only=True)[0]
        for _ in range(tg):
            logits = net.forward([int(np.argmax(logits))], cache, last_only=True)[0]

    return {"pp": _summary(pp, timings(run_pp, repetitions)), "tg": _summary(tg, timings(run_tg, repetitions))}


def llama_cpp(path: str, pp: int, tg: int, repetitions: int, threads: int, seed: int = 0) -> dict | None:
    """The same measurements through llama-cpp-python, or None when it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(path), n_ctx=max(pp, tg + 16) + 8, n_batch=max(pp, 32), n_threads=threads,
                verbose=False)
    prompt = random_ids(np.random.default_rng(seed), llm.n_vocab(), pp)

    def run_pp() -> None:
        llm.reset()
        llm.eval(prompt)

    def run_tg() -> None:
        llm.reset()
        llm.eval(prompt[:8])
        for _ in range(tg):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])

    return {"pp": _summary(pp, timings(run_pp, repetitions)), "tg": _summary(tg, timings(run_tg, repetitions))}


def speed(model, pp: int = 512, tg: int = 128, repetitions: int = 5, threads: int = 2,
          compare: bool = True) -> dict:
    """pp/tg of our backend and, if available, of llama.cpp, with the ratios."""
    with blas_threads(threads):
        result = {
            "model": model.name, "backend": model.backend, "threads": threads,
            "pp_tokens": pp, "tg_tokens": tg, "repetitions": repetitions,
            "llmrs": ours(model, pp, tg, repetitions),
        }
    reference = llama_cpp(model.path, pp, tg, repetitions, threads) if compare else None
    result["llama_cpp"] = reference
    if reference:
        result["ratio"] = {
            k: result["llmrs"][k]["tokens_per_s"] / reference[k]["tokens_per_s"] for k in ("pp", "tg")
        }
    return result


def format_speed(r: dict) -> str:
    lines = [f"{r['model']}: backend {r['backend']}, {r['threads']} threads, "
             f"median of {r['repetitions']} runs after a warm-up (min-max)"]
    rows = [("llmrs", r["llmrs"]), ("llama.cpp", r["llama_cpp"])]
    for name, m in rows:
        if m is None:
            lines.append(f"  {name:<10} not installed (pip install llama-cpp-python to compare)")
            continue
        for k, n in (("pp", r["pp_tokens"]), ("tg", r["tg_tokens"])):
            s = m[k]
            lines.append(f"  {name:<10} {k}{n:<5} {s['tokens_per_s']:9.1f} tokens/s  ({s['min']:.1f}-{s['max']:.1f})")
    if "ratio" in r:
        lines.append(f"  ratio llmrs / llama.cpp: pp {r['ratio']['pp']:.2f}x, tg {r['ratio']['tg']:.2f}x")
    return "\n".join(lines)
