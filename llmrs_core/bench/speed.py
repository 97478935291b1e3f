"""``llmrs bench speed``: prompt processing and generation speed, llama-bench style (chapter 8, appendix A).

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
machines, absolute numbers are not. The engines take turns, one repetition
each (pp, then tg) per round, so that a load that comes and goes on a shared
machine falls on all of them alike, with a pause of :data:`SETTLE_S` before each
engine's turn: measured on 2 cores (Qwen2.5-0.5B pp512, 2 threads, three pairs), our pass
right after llama.cpp's ran 4-5% slower than after a 3-second pause, while llama.cpp's
right after ours did not. ``exact=True`` adds the numba backend's
float kernels (``numba-exact``) as an engine of its own, next to its default
(the int8 decode path, where the CPU has AVX2).
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext

import numpy as np

from .common import random_ids, timings

#: seconds between one engine's turn and the next's (the module docstring says why)
SETTLE_S = 2.0


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


def _our_runs(model, pp: int, tg: int, seed: int = 0):
    """``(run_pp, run_tg)`` for one of our models."""
    net = model.network
    prompt = random_ids(np.random.default_rng(seed), net.config.vocab_size, pp)

    def run_pp() -> None:
        net.forward(prompt, net.new_cache(pp), last_only=True)

    def run_tg() -> None:
        cache = net.new_cache(tg + 9)
        logits = net.forward(prompt[:8], cache, last_only=True)[0]
        for _ in range(tg):
            logits = net.forward([int(np.argmax(logits))], cache, last_only=True)[0]

    return run_pp, run_tg


def ours(model, pp: int, tg: int, repetitions: int, seed: int = 0) -> dict:
    run_pp, run_tg = _our_runs(model, pp, tg, seed)
    return {"pp": _summary(pp, timings(run_pp, repetitions)), "tg": _summary(tg, timings(run_tg, repetitions))}


def _llama_cpp_runs(path: str, pp: int, tg: int, threads: int, seed: int = 0):
    """``(run_pp, run_tg)`` through llama-cpp-python, or None when it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    # n_threads_batch too: llama-cpp-python defaults it to every core, whatever n_threads says. Without
    # logits_all its `scores` has n_batch rows, indexed by position: tg's last is 8 + tg - 1.
    llm = Llama(model_path=str(path), n_ctx=max(pp, tg + 16) + 8, n_batch=max(pp, tg + 8, 32), n_threads=threads,
                n_threads_batch=threads, verbose=False)
    prompt = random_ids(np.random.default_rng(seed), llm.n_vocab(), pp)

    def run_pp() -> None:
        llm.reset()
        llm.eval(prompt)

    def run_tg() -> None:
        llm.reset()
        llm.eval(prompt[:8])
        for _ in range(tg):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])

    return run_pp, run_tg


def llama_cpp(path: str, pp: int, tg: int, repetitions: int, threads: int, seed: int = 0) -> dict | None:
    """The same measurements through llama-cpp-python, or None when it is not installed."""
    runs = _llama_cpp_runs(path, pp, tg, threads, seed)
    if runs is None:
        return None
    run_pp, run_tg = runs
    return {"pp": _summary(pp, timings(run_pp, repetitions)), "tg": _summary(tg, timings(run_tg, repetitions))}


def _interleaved(engines: dict, repetitions: int) -> dict[str, dict[str, list[float]]]:
    """Seconds of each run: every engine warms up, then each round runs every engine's pp and tg once."""
    times = {name: {"pp": [], "tg": []} for name in engines}
    for run_pp, run_tg, blas in engines.values():
        with blas_threads(blas):
            timings(run_pp, 0)
            timings(run_tg, 0)
    for _ in range(repetitions):
        for name, (run_pp, run_tg, blas) in engines.items():
            if len(engines) > 1:
                time.sleep(SETTLE_S)
            with blas_threads(blas):
                times[name]["pp"] += timings(run_pp, 1, warm_up=False)
                times[name]["tg"] += timings(run_tg, 1, warm_up=False)
    return times


def machine() -> dict:
    """What the numbers were measured on: CPU model and flags, cores, caches, memory, NumPy's version
    (:func:`.environment.machine`)."""
    from .environment import machine as this_machine

    return {**this_machine(), "numpy": np.__version__}


def speed(path=None, backends: tuple[str, ...] = ("numba",), pp: int = 512, tg: int = 128,
          repetitions: int = 5, threads: int = 2, compare: bool = True, exact: bool = False,
          contention: bool = False) -> dict:
    """pp/tg of each of our ``backends`` and, if available, of llama.cpp, on one model, in one run.

    Every engine uses ``threads`` threads: Numba's pool for the numba backend,
    BLAS's for the rest, llama.cpp's own. The engines take turns (see the module's
    note); ``exact`` adds ``"numba-exact"``, the numba backend with ``exact=True`` (its
    float kernels; ``"numba"`` is its default, the int8 decode path where the CPU has
    AVX2), when ``"numba"`` is among ``backends``. Returns ``{"model", "threads",
    "pp_tokens", "tg_tokens", "repetitions", "machine", "backends": {name:
    {"pp": {...}, "tg": {...}, "describe": str (the backend's report)}}, "llama_cpp": {...} or None,
    "ratio": {name: {"pp", "tg"}}}`` where each measurement is
    ``{"tokens_per_s" (median), "min", "max", "runs"}`` and ``ratio`` is ours
    over llama.cpp's (present when llama.cpp ran).

    ``contention``: then every engine is measured again with one core kept busy
    (:func:`.contention.busy_core`), into ``"contended": {"core", "backends",
    "llama_cpp", "loss": {name: {"pp", "tg"}}}``, ``loss`` the quiet figure over the
    contended one (llama.cpp's under ``"llama.cpp"``).
    """
    from ..loader import load

    result: dict = {"model": None, "threads": threads, "pp_tokens": pp, "tg_tokens": tg,
                    "repetitions": repetitions, "machine": machine(), "backends": {}}
    variants = [(name, False) for name in backends]
    if exact and "numba" in backends:
        variants.insert(backends.index("numba") + 1, ("numba", True))
    engines, described, model_path = {}, {}, None
    for name, with_exact in variants:
        model = load(path, backend=name, threads=threads if name == "numba" else None, exact=with_exact)
        result["model"], model_path = model.name, model.path
        label = name + ("-exact" if with_exact else "")
        engines[label] = (*_our_runs(model, pp, tg), threads)
        described[label] = model.backend_report()  # whole: the learner's is a list of who computes what
    if compare and model_path:
        runs = _llama_cpp_runs(model_path, pp, tg, threads)
        if runs is not None:
            engines["llama.cpp"] = (*runs, None)
    ours_quiet, reference = _measured(engines, repetitions, pp, tg)
    result["backends"] = {name: {**m, "describe": described[name]} for name, m in ours_quiet.items()}
    result["llama_cpp"] = reference
    result["llama_cpp_note"] = ("measured" if reference else "skipped (--no-compare)" if not compare
                                else "not installed (pip install llama-cpp-python to compare)")
    if reference:
        result["ratio"] = {
            name: {k: m[k]["tokens_per_s"] / reference[k]["tokens_per_s"] for k in ("pp", "tg")}
            for name, m in result["backends"].items()
        }
    if contention:
        from .contention import busy_core, losses

        with busy_core() as core:
            ours_busy, reference_busy = _measured(engines, repetitions, pp, tg)
        quiet = {**ours_quiet, **({"llama.cpp": reference} if reference else {})}
        busy = {**ours_busy, **({"llama.cpp": reference_busy} if reference_busy else {})}
        result["contended"] = {"core": core, "backends": ours_busy, "llama_cpp": reference_busy,
                               "loss": losses(quiet, busy)}
    return result


def _measured(engines: dict, repetitions: int, pp: int, tg: int) -> tuple[dict, dict | None]:
    """``(ours, llama.cpp's or None)``: each engine's pp/tg summary from one interleaved run."""
    ours, reference = {}, None
    for name, t in _interleaved(engines, repetitions).items():
        measured = {"pp": _summary(pp, t["pp"]), "tg": _summary(tg, t["tg"])}
        if name == "llama.cpp":
            reference = measured
        else:
            ours[name] = measured
    return ours, reference


def format_speed(r: dict) -> str:
    lines = [f"{r['model']}: {r['threads']} threads, median of {r['repetitions']} runs after a warm-up (min-max)",
             f"  machine: {r['machine']['cpu']}, {r['machine']['cores']} cores"]
    rows = [*r["backends"].items(), ("llama.cpp", r["llama_cpp"])]
    for name, m in rows:
        if m is None:
            lines.append(f"  {name:<10} {r.get('llama_cpp_note', 'not measured')}")
            continue
        for k, n in (("pp", r["pp_tokens"]), ("tg", r["tg_tokens"])):
            s = m[k]
            lines.append(f"  {name:<10} {k}{n:<5} {s['tokens_per_s']:9.1f} tokens/s  ({s['min']:.1f}-{s['max']:.1f})")
    for name, ratio in r.get("ratio", {}).items():
        lines.append(f"  ratio {name} / llama.cpp: pp {ratio['pp']:.2f}x, tg {ratio['tg']:.2f}x")
    contended = r.get("contended")
    if contended:
        lines.append(f"  with core {contended['core']} kept busy by another process:")
        busy = [*contended["backends"].items(), ("llama.cpp", contended["llama_cpp"])]
        for name, m in busy:
            if m is None:
                continue
            loss = contended["loss"].get(name, {})
            lines.append(f"  {name:<11} pp {m['pp']['tokens_per_s']:7.1f}  tg {m['tg']['tokens_per_s']:6.1f} tokens/s"
                         f"   loss against quiet: pp {loss.get('pp', float('nan')):.2f}x, "
                         f"tg {loss.get('tg', float('nan')):.2f}x")
    for name, m in r["backends"].items():
        first, *rest = m["describe"].splitlines() or [""]
        lines.append(f"  {name}: {first}")
        lines += [f"  {line}" for line in rest]
    flags = r["machine"].get("flags") or {}
    lines.append(f"  CPU flags: {' '.join(f for f, present in flags.items() if present) or 'not known'}")
    return "\n".join(lines)
