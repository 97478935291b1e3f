"""``llmrs bench all``: the workbook's headline benchmarks in one run, with honest statistics (appendix A).

Each benchmark is the one its chapter defines, run :attr:`Plan.repetitions` times after a warm-up, and
every figure is a :class:`~.stats.Figure`: the median of the repetitions, a bootstrap 95% interval, and
a "noisy" mark when they vary by more than :data:`~.stats.NOISY_CV`. Two engines compared are
**interleaved** (A B A B …) and their ratio is taken per round (why: appendix A.3).

=================  ===========================================================  =======
benchmark          what                                                          chapter
=================  ===========================================================  =======
``tokenizer``      encode tokens/s, ours against Hugging Face ``tokenizers``     2
``speed``          pp/tg (llama-bench style) per backend, llama.cpp when         8
                   installed (``llama-cpp-python``)
``throughput``     the batching engine: a random workload's output tokens/s,     7
                   decode of many sequences against one, the prefix cache
``serve``          our HTTP server at 1/4/16 clients, llama-cpp-python's server   11
                   when installed (``llama-cpp-python[server]``)
``quant``          size, perplexity and KL divergence per quantisation scheme    6
                   (:mod:`llmrs_core.quant.evaluate`): deterministic, so a
                   table (``raw["table"]``), no repeated figures
``dist``           decode tokens/s and the share of decode time communicating:   11
                   one process, tensor and pipeline parallel under ``mpiexec``
                   (:mod:`.dist`; skipped without mpi4py/mpiexec, the dist extra)
=================  ===========================================================  =======

A benchmark whose optional reference is missing runs without it and says so in ``notes``; one that cannot
run at all (the serve or dist extra missing) is skipped with a sentence. A benchmark may give a table
besides its figures, ``raw["table"] = {"columns": [...], "rows": [[...]]}`` of display strings, which the
report prints as it is. Before it starts, :func:`busy_check` looks for a busy machine.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .stats import MIN_REPETITIONS, Figure


@dataclass(frozen=True)
class Plan:
    """The sizes of one ``bench all`` run: :meth:`quick` (about 5 minutes on 2 cores) or
    :meth:`full` (under 30)."""

    name: str
    repetitions: int
    threads: int = 2
    tokenizer_copies: int = 50
    pp: int = 512
    tg: int = 128
    throughput_requests: int = 32
    throughput_max_prompt: int = 128
    throughput_max_output: int = 64
    max_num_seqs: int = 16
    serve_levels: tuple[int, ...] = (1, 4, 16)
    serve_prompts: int = 16
    serve_input_len: int = 128
    serve_output_len: int = 64
    #: the quant table's schemes (:data:`llmrs_core.quant.evaluate.SCHEMES`) and text length in tokens
    quant_schemes: tuple[str, ...] = ("f32", "f16", "q8_0", "int8 per channel", "q6_k", "q4_k", "q4_1", "q4_0",
                                      "int4 group 32", "q4_1, embedding too")
    quant_tokens: int = 257
    #: decode steps in each of dist's repetitions (one launch per layout runs repetitions + 1 groups)
    dist_tokens: int = 32

    def __post_init__(self) -> None:
        if self.repetitions < MIN_REPETITIONS:
            raise ValueError(f"a figure needs at least {MIN_REPETITIONS} repetitions, got {self.repetitions}")
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if self.quant_tokens < 2:
            raise ValueError(f"quant_tokens must be at least 2 (one prediction), got {self.quant_tokens}")
        if self.dist_tokens < 1:
            raise ValueError(f"dist_tokens must be at least 1, got {self.dist_tokens}")

    @classmethod
    def quick(cls, threads: int = 2, repetitions: int = 5) -> Plan:
        return cls("quick", repetitions, threads, tokenizer_copies=10, pp=128, tg=32, throughput_requests=8,
                   throughput_max_prompt=64, throughput_max_output=16, max_num_seqs=8, serve_levels=(1, 4),
                   serve_prompts=8, serve_input_len=64, serve_output_len=24,
                   quant_schemes=("f32", "f16", "q8_0", "q4_0", "q4_1"), quant_tokens=65, dist_tokens=8)

    @classmethod
    def full(cls, threads: int = 2, repetitions: int = 5) -> Plan:
        return cls("full", repetitions, threads)


@dataclass
class Outcome:
    """What one benchmark gives: its figures, sentences about what it skipped or assumed, and
    the raw results of its chapter's command (for the report's tables)."""

    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict = field(default_factory=dict)


def ratio_samples(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per-round ratios of two interleaved series (round i of one over round i of the other)."""
    if len(numerator) != len(denominator):
        raise ValueError(f"interleaved series differ in length: {len(numerator)} and {len(denominator)}")
    return [a / b for a, b in zip(numerator, denominator)]


class Benchmark(ABC):
    """One of ``bench all``'s benchmarks."""

    #: the name ``--only`` selects it by, and its figures' key prefix
    name: str
    #: one line for the progress bar and the report
    title: str

    def missing(self) -> str | None:
        """Why this benchmark cannot run here (a sentence), or None."""
        return None

    @abstractmethod
    def run(self, model_path: Path, plan: Plan, tick: Callable[[str], None]) -> Outcome:
        """Measure; ``tick(what)`` after each repetition, for the progress bar."""

    def steps(self, plan: Plan) -> int:
        """How many times :meth:`run` calls ``tick`` (the progress bar's length)."""
        return plan.repetitions


class TokenizerBench(Benchmark):
    name, title = "tokenizer", "tokenizer: encode speed against Hugging Face tokenizers (chapter 2)"

    def run(self, model_path: Path, plan: Plan, tick: Callable[[str], None]) -> Outcome:
        import llmrs_core as llmrs
        from llmrs_core.tokenizer.reference import reference_tokenizer

        from .tokenizer import SAMPLE

        ours = llmrs.load(model_path, backend="numpy").tokenizer
        ref = reference_tokenizer(ours)
        text = SAMPLE * plan.tokenizer_copies
        n = len(ours.encode(text))
        if ours.encode(text) != ref.encode(text).ids:
            raise ValueError("our tokenizer's ids differ from Hugging Face's on the sample: fix that first")
        times: dict[str, list[float]] = {"ours": [], "hf": []}
        for _ in range(plan.repetitions):
            for name, encode in (("ours", ours.encode), ("hf", ref.encode)):
                start = time.perf_counter()
                encode(text)
                times[name].append(time.perf_counter() - start)
            tick("tokenizer")
        rates = {k: [n / t for t in v] for k, v in times.items()}
        return Outcome([
            Figure.of("tokenizer.ours", "our tokenizer", "tokens/s", rates["ours"]),
            Figure.of("tokenizer.hf", "Hugging Face tokenizers (Rust)", "tokens/s", rates["hf"]),
            Figure.of("tokenizer.ours/hf", "ours / Hugging Face", "ratio", ratio_samples(rates["ours"], rates["hf"])),
        ], raw={"text_tokens": n})


class SpeedBench(Benchmark):
    name, title = "speed", "speed: prompt processing and generation, llama-bench style (chapter 8)"

    def __init__(self, backends: Sequence[str] = ("numba", "numpy"), compare: bool = True):
        self.backends = tuple(backends)
        self.compare = compare

    def run(self, model_path: Path, plan: Plan, tick: Callable[[str], None]) -> Outcome:
        return speed_outcome(model_path, plan, tick, self.backends, self.compare, "speed", memory=True)


def speed_outcome(model_path: Path, plan: Plan, tick: Callable[[str], None], backends: Sequence[str],
                  compare: bool, key: str, memory: bool = False) -> Outcome:
    """pp/tg of ``backends`` and llama.cpp's (when ``compare`` and installed) on one file, interleaved,
    as figures ``{key}.pp{N}.{engine}`` and ``{key}.pp{N}.{engine}/llama.cpp``; with ``memory``, also
    each engine's RSS and load time (:func:`memory_figures`) and the numba backend's roofline."""
    from ..loader import load
    from .speed import _interleaved, _llama_cpp_runs, _our_runs

    engines, notes, networks = {}, [], {}
    for name in backends:
        model = load(model_path, backend=name, threads=plan.threads if name == "numba" else None)
        networks[name] = model.network
        engines[name] = (*_our_runs(model, plan.pp, plan.tg), plan.threads)
    try:
        runs = _llama_cpp_runs(model_path, plan.pp, plan.tg, plan.threads) if compare else None
    except (ValueError, RuntimeError, OSError) as e:  # llama-cpp-python's "Failed to load model from file"
        runs = None
        notes.append(f"llama.cpp could not load {model_path.name} ({e}), so the speed figures have no reference")
    else:
        if runs is None and compare:
            notes.append("llama.cpp: not installed (`.venv/bin/pip install llama-cpp-python`, a 5-minute build), "
                         "so the speed figures have no reference")
    if runs is not None:
        engines["llama.cpp"] = (*runs, None)

    last = list(engines)[-1]  # a round ends with the last engine's tg: one tick a round
    run_pp, run_tg, blas = engines[last]
    calls = []

    def run_tg_and_tick() -> None:
        run_tg()
        calls.append(1)
        if len(calls) > 1:  # the first call is the warm-up
            tick(key)
    engines[last] = (run_pp, run_tg_and_tick, blas)
    times = _interleaved(engines, plan.repetitions)
    figures = []
    for kind, n in (("pp", plan.pp), ("tg", plan.tg)):
        for name, t in times.items():
            figures.append(Figure.of(f"{key}.{kind}{n}.{name}", f"{name} {kind}{n}", "tokens/s",
                                     [n / s for s in t[kind]]))
        if "llama.cpp" in times:
            for name in backends:  # tokens/s ratio = llama.cpp's seconds over ours, round by round
                figures.append(Figure.of(f"{key}.{kind}{n}.{name}/llama.cpp", f"{name} / llama.cpp {kind}{n}",
                                         "ratio", ratio_samples(times["llama.cpp"][kind], times[name][kind])))
    raw = {"pp": plan.pp, "tg": plan.tg, "engines": list(times)}
    if memory and "numba" in networks:
        more, raw["memory"] = memory_figures(model_path, plan, key, networks["numba"],
                                             plan.tg / statistics.median(times["numba"]["tg"]), "llama.cpp" in times)
        figures += more
    return Outcome(figures, notes, raw)


def memory_figures(model_path: Path, plan: Plan, key: str, network, tg_rate: float,
                   compare: bool) -> tuple[list[Figure], dict]:
    """RSS after the first token and load time of the numba backend and llama.cpp, each in a fresh
    process (:func:`.footprint.footprint`), and the numba backend's decode rate against the roof of
    the machine's STREAM bandwidth: figures ``{key}.rss.*``, ``{key}.load_s.*``, ``{key}.roofline``."""
    from .environment import stream_triad_gb_s
    from .footprint import footprint, roofline

    roof = roofline(network, tg_rate, stream_triad_gb_s(1 << (24 if plan.name == "full" else 22)))
    prints = {"numba": footprint(model_path, "numba", plan.threads)}
    if compare:
        prints["llama.cpp"] = footprint(model_path, "llama.cpp", plan.threads)
    figures = [Figure.of(f"{key}.roofline.numba", f"numba tg{plan.tg} / STREAM roof "
                         f"({roof['bytes_per_token'] / 2**20:.0f} MiB a token at {roof['stream_gb_s']:.1f} GB/s)",
                         "ratio", [roof["fraction"]])]
    for name, p in prints.items():
        if "error" not in p:
            figures += [Figure.of(f"{key}.rss.{name}", f"{name} RSS after the first token", "MiB", [p["rss_mib"]], False),
                        Figure.of(f"{key}.load_s.{name}", f"{name} load to first token", "s", [p["load_s"]], False)]
    if all("error" not in p for p in prints.values()) and "llama.cpp" in prints:
        figures.append(Figure.of(f"{key}.rss.numba/llama.cpp", "numba / llama.cpp RSS", "ratio",
                                 [prints["numba"]["rss_mib"] / prints["llama.cpp"]["rss_mib"]], False))
    return figures, {"roofline": roof, "footprint": prints}


#: the full-size random-weight files `make full-size-check` leaves (scripts/full_size_models.py), in
#: ``$LLMRS_FULL_SIZE_DIR`` or ``~/.cache/llmrs-full-size/<shape>/<shape>.Q4_K_M.gguf``
SCALE_SHAPES = ("qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b")
#: the shapes whose Q8_0 file (``<shape>.Q8_0.gguf``, the script's ``q8_0`` step) is measured too, as ``<shape>-q8_0``
SCALE_Q8_0 = ("llama-3.2-1b",)


def full_size_files() -> dict[str, Path]:
    """The :data:`SCALE_SHAPES` files present here, by shape (``<shape>-q8_0`` for a Q8_0 file)."""
    root = Path(os.environ.get("LLMRS_FULL_SIZE_DIR", Path.home() / ".cache" / "llmrs-full-size"))
    files = {shape: root / shape / f"{shape}.Q4_K_M.gguf" for shape in SCALE_SHAPES}
    files.update({f"{shape}-q8_0": root / shape / f"{shape}.Q8_0.gguf" for shape in SCALE_Q8_0})
    return {shape: path for shape, path in files.items() if path.is_file()}


class ScaleBench(Benchmark):
    """Speed at the sizes people run (issue 30): ``speed`` on each full-size Q4_K_M file (and Llama-1B's
    Q8_0), the numba backend against llama.cpp, figures ``scale.<shape>.pp<N>.<engine>``."""

    name, title = "scale", "scale: pp/tg at 0.5B-1B parameters, Q4_K_M (and Q8_0), against llama.cpp (chapter 8)"

    def missing(self) -> str | None:
        if full_size_files():
            return None
        return ("no full-size files: `make full-size-check` makes them (random weights at the shapes of "
                f"{', '.join(SCALE_SHAPES)}; it needs a reference environment, see the README)")

    def steps(self, plan: Plan) -> int:
        return plan.repetitions * len(full_size_files())

    def run(self, model_path: Path, plan: Plan, tick: Callable[[str], None]) -> Outcome:
        figures, notes, raw = [], [], {}
        for shape, path in full_size_files().items():
            outcome = speed_outcome(path, plan, tick, ("numba",), True, f"scale.{shape}", memory=True)
            figures += outcome.figures
            notes += [f"{shape}: {note}" for note in outcome.notes]
            raw[shape] = {**outcome.raw, "file": str(path), "bytes": path.stat().st_size}
        return Outcome(figures, notes, raw)


class ThroughputBench(Benchmark):
    name, title = "throughput", "throughput: the batching engine and the prefix cache (chapter 7)"

    def __init__(self, backend: str = "numba"):
        self.backend = backend

    def run(self, model_path: Path, plan: Plan, tick: Callable[[str], None]) -> Outcome:
        from ..loader import load
        from .throughput import throughput

        model = load(model_path, backend=self.backend, threads=plan.threads if self.backend == "numba" else None)
        kwargs = dict(n_requests=plan.throughput_requests, max_prompt=plan.throughput_max_prompt,
                      max_output=plan.throughput_max_output, max_num_seqs=plan.max_num_seqs)
        throughput(model, **{**kwargs, "n_requests": 2})  # warm-up: compile every kernel shape once
        runs = []
        for _ in range(plan.repetitions):
            runs.append(throughput(model, **kwargs))
            tick("throughput")
        b = plan.max_num_seqs

        def series(fn) -> list[float]:
            return [fn(r) for r in runs]
        figures = [
            Figure.of("throughput.batched.output_tok_s", f"{plan.throughput_requests} random requests, {b} at once",
                      "tokens/s", series(lambda r: r["batched"]["output_tokens_per_s"])),
            Figure.of("throughput.decode.1", "decode, one sequence", "tokens/s",
                      series(lambda r: r["single_decode_tokens_per_s"])),
            Figure.of(f"throughput.decode.{b}", f"decode, {b} sequences a step", "tokens/s",
                      series(lambda r: r["batched_decode_tokens_per_s"])),
            Figure.of(f"throughput.decode.{b}/1", f"decode speed-up, {b} sequences against one", "ratio",
                      series(lambda r: r["decode_speedup"])),
            Figure.of("throughput.prefix.on/off", "prefix cache on / off, requests/s", "ratio",
                      series(lambda r: r["prefix_speedup"])),
            Figure.of("throughput.batched.ttft_p50", "time to first token, median", "s",
                      series(lambda r: r["batched"]["ttft_s"]["p50"]), higher_is_better=False),
        ]
        return Outcome(figures, [], {"backend": self.backend, "workload": runs[-1]["workload"]})


class ServeBench(Benchmark):
    name, title = "serve", "serve: our HTTP server under 1/4/16 clients, against llama-cpp-python's (chapter 11)"

    def __init__(self, compare: bool = True):
        self.compare = compare

    def missing(self) -> str | None:
        try:
            import fastapi  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as e:
            return f"the serve benchmark needs the serve extra ({e.name} is missing): pip install 'llmrs-core[serve]'"
        return None

    def steps(self, plan: Plan) -> int:
        from .serve_compare import llama_cpp_server_missing

        servers = 1 + (2 if self.compare and llama_cpp_server_missing() is None else 0)
        return servers * plan.repetitions * len(plan.serve_levels)

    def run(self, model_path: Path, plan: Plan, tick: Callable[[str], None]) -> Outcome:
        from .serve import Load, random_workload
        from .serve_compare import compare

        loads = [Load(max_concurrency=c) for _ in range(plan.repetitions) for c in plan.serve_levels]
        tokenizer = _tokenizer(model_path)

        def workloads(i: int):
            return random_workload(tokenizer, 1 if i < 0 else plan.serve_prompts, plan.serve_input_len,
                                   plan.serve_output_len, seed=1000 + i)  # fresh prompts every run: no prefix hits
        result = compare(model_path, loads, workloads, threads=plan.threads, with_llama_cpp=self.compare,
                         n_ctx=max(2048, plan.serve_input_len + plan.serve_output_len + 64),
                         on_level=lambda line: tick("serve"))
        figures = []
        for server, r in result["servers"].items():
            for c in plan.serve_levels:
                runs = [x for x in r["runs"] if x["load"]["max_concurrency"] == c]
                key = f"serve.{c}.{_slug(server)}"
                clients = f"{c} client{'s' if c > 1 else ''}"
                figures.append(Figure.of(f"{key}.output_tok_s", f"{server}, {clients}: output tokens/s", "tokens/s",
                                         [x["output_tokens_per_s"] for x in runs]))
                figures.append(Figure.of(f"{key}.ttft_p50", f"{server}, {clients}: TTFT median", "s",
                                         [x["ttft_s"]["p50"] for x in runs], higher_is_better=False))
                failed = sum(x["failed"] + x["truncated"] for x in runs)
                if failed:
                    result["notes"].append(f"{server} at {clients}: {failed} requests failed or were truncated")
        notes = list(result["notes"]) + ["servers run one after the other (each needs the cores): their ratio is "
                                         "less robust to drift than the interleaved speed figures"]
        return Outcome(figures, notes, {"servers": {k: v["command"] for k, v in result["servers"].items()}})


class QuantBench(Benchmark):
    """Chapter 6's table (:func:`llmrs_core.quant.evaluate.table`) on the first
    :attr:`Plan.quant_tokens` tokens of :data:`QUANT_TEXT`. Size, perplexity and KL are
    deterministic: one evaluation per scheme, recorded in ``raw`` (no repeated figures;
    re-quantising every matrix and a forward pass take seconds each, too much to repeat
    five times for a timing nobody reads)."""

    name, title = "quant", "quant: size, perplexity and KL divergence per quantisation scheme (chapter 6)"

    def steps(self, plan: Plan) -> int:
        return len(plan.quant_schemes) + 1  # the reference, then each scheme

    def run(self, model_path: Path, plan: Plan, tick: Callable[[str], None]) -> Outcome:
        from ..loader import load
        from ..quant.evaluate import evaluate, reference, scheme_named
        from ..workbook import find_root

        schemes = {name: scheme_named(name) for name in plan.quant_schemes}  # a bad name before loading
        model = load(model_path, backend="numpy")
        ids = model.tokenizer.encode((find_root() / QUANT_TEXT).read_text())[:plan.quant_tokens]
        if len(ids) < plan.quant_tokens:
            raise ValueError(f"{QUANT_TEXT} has {len(ids)} tokens, fewer than the plan's {plan.quant_tokens}")
        ref = reference(model, ids)
        tick("quant")
        rows = {}
        for name, scheme in schemes.items():
            start = time.perf_counter()
            rows[name] = {**evaluate(model, ids, scheme, ref), "seconds": time.perf_counter() - start}
            tick("quant")
        n_weights = sum(info.n_elements for name, info in model.source.tensors.items()
                        if name != "output.weight" or not model.config.tie_embeddings)
        mixed = [name for name, r in rows.items() if len(r["stored_as"]) > 1]
        table = {"columns": ["scheme", "size MB", "bits/weight", "perplexity", "KL (nats)", "top-1 same",
                             "matrices stored as"],
                 "rows": [[name + ("*" if name in mixed else ""), f"{r['bytes'] / 1e6:.1f}",
                           f"{8 * r['bytes'] / n_weights:.2f}", f"{r['ppl']:.3f}", f"{r['kl']:.1e}",
                           f"{100 * r['top1']:.1f}%", ", ".join(f"{n} {k}" for k, n in r["stored_as"].items())]
                          for name, r in rows.items()]}
        embedding = model.source.tensors["token_embd.weight"].type_name
        notes = [f"{len(ids) - 1} next-token predictions on the first {len(ids)} tokens of {QUANT_TEXT}; the "
                 f"reference is the model as loaded (perplexity {ref.ppl:.3f}), so every figure is damage added to "
                 f"the file's own quantisation",
                 f"the embedding (the output head) keeps the file's {embedding} except where the scheme's name "
                 "says otherwise; norms stay F32",
                 "deterministic figures: one evaluation each, in the table (no repetitions, nothing for "
                 "`bench compare`)"]
        if mixed:
            notes.append("*: rows that do not split into the type's blocks fall back to Q8_0 (llmrs quantize's rule)")
        return Outcome([], notes, {"tokens": len(ids), "text": str(QUANT_TEXT), "reference_ppl": ref.ppl,
                                   "weights": n_weights, "schemes": rows, "table": table})


class DistBench(Benchmark):
    """Chapter 11's split model under real ranks (:mod:`.dist`): one launch per layout, each
    giving :attr:`Plan.repetitions` groups of :attr:`Plan.dist_tokens` decode steps after a
    warm-up group."""

    name, title = "dist", "dist: tensor- and pipeline-parallel decode and its communication (chapter 11)"

    def __init__(self, backend: str = "numba", timeout: float | None = None):
        from .dist import LAUNCH_TIMEOUT

        self.backend = backend
        self.timeout = LAUNCH_TIMEOUT if timeout is None else timeout

    def missing(self) -> str | None:
        from ..distributed.mpi import INSTALL_HINT, find_mpiexec

        try:
            import mpi4py  # noqa: F401
        except ImportError:
            return f"the dist benchmark needs mpi4py, which is not installed: {INSTALL_HINT}"
        try:
            find_mpiexec()
        except FileNotFoundError as e:
            return f"the dist benchmark needs mpiexec: {e}"
        return None

    def steps(self, plan: Plan) -> int:
        return 3  # one launch per layout

    def run(self, model_path: Path, plan: Plan, tick: Callable[[str], None]) -> Outcome:
        from ..distributed.shard import weight_block_size
        from ..formats.gguf import read_gguf
        from .dist import LaunchFailed, decode_repetitions, launch, layouts

        source = read_gguf(model_path)
        chosen, notes = layouts(source.config, weight_block_size(source))
        n_tokens = (plan.repetitions + 1) * plan.dist_tokens
        if n_tokens >= source.config.context_length:
            raise ValueError(f"dist: {n_tokens} decode steps do not fit the model's context "
                             f"({source.config.context_length}): lower dist_tokens")
        for _ in range(self.steps(plan) - len(chosen)):
            tick("dist")  # the layouts this model cannot run
        runs = {}
        for layout in chosen:
            try:
                profile = launch(model_path, layout, n_tokens, self.backend, self.timeout)
                runs[layout] = (profile, decode_repetitions(profile, plan.dist_tokens))
            except LaunchFailed as e:
                notes.append(f"{layout.name}: not measured: {e}")
            tick("dist")
        figures, table, raw = [], [], {}
        single = next((r for layout, (_, r) in runs.items() if layout.ranks == 1), None)
        base_tokens = next((p["token_ids"] for layout, (p, _) in runs.items() if layout.ranks == 1), None)
        for layout, (profile, r) in runs.items():
            k, name = layout.key, layout.name
            figures.append(Figure.of(f"dist.{k}.decode_tok_s", f"{name}: decode", "tokens/s", r["tokens_per_s"]))
            if layout.ranks > 1:
                figures.append(Figure.of(f"dist.{k}.comm_share", f"{name}: share of decode time communicating", "%",
                                         [100 * x for x in r["comm_share"]], higher_is_better=False))
                if single is not None:
                    figures.append(Figure.of(f"dist.{k}/single", f"{name} / one process, decode tokens/s", "ratio",
                                             ratio_samples(r["tokens_per_s"], single["tokens_per_s"])))
                if base_tokens is not None and profile["token_ids"] != base_tokens:
                    same = next(i for i, (a, b) in enumerate(zip(profile["token_ids"], base_tokens)) if a != b)
                    notes.append(f"{name}: the greedy tokens differ from one process's from token {same} on "
                                 "(a near tie decided by another order of the sums)")
            for i, s in enumerate(r["ranks"]):
                table.append([name, str(i), f"{1e3 * s['step_s']:.1f}", f"{1e3 * s['comm_s']:.1f}",
                              f"{100 * s['comm_share']:.0f}%", f"{s['all_reduces']:g}", f"{s['sent_bytes']:,.0f}"])
            raw[name] = {"command": profile["command"], "ranks": layout.ranks, "decode_per_rank": r["ranks"],
                         "prefill_per_rank": [x["prefill"] for x in profile["ranks"]]}
        cores = os.cpu_count() or 1
        notes += [f"every process runs one thread (the split layouts' ranks share this machine's {cores} cores); "
                  "time in communication includes waiting for the slowest rank; with one sequence a pipeline "
                  "stage waits in recv while the other computes (the bubble), so PP's share is mostly that",
                  "the layouts run one after another, one launch each: their ratio pairs repetitions by index, "
                  "less robust to drift than the interleaved speed figures"]
        return Outcome(figures, notes, {
            "backend": self.backend, "tokens_per_repetition": plan.dist_tokens, "layouts": raw,
            "table": {"columns": ["layout", "rank", "step ms", "in communication ms", "share", "all-reduces/step",
                                  "bytes sent/step"], "rows": table}})


#: the text the quant table is measured on (the chapter's), relative to the checkout
QUANT_TEXT = Path("tests/data/long_text.txt")


def _tokenizer(model_path: Path):
    from ..loader import load

    return load(model_path, backend="numpy").tokenizer


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")


#: every benchmark, in the order they run
BENCHMARKS: dict[str, Callable[[], Benchmark]] = {
    "tokenizer": TokenizerBench, "speed": SpeedBench, "throughput": ThroughputBench, "serve": ServeBench,
    "quant": QuantBench, "dist": DistBench, "scale": ScaleBench,
}


def cpu_busy_share(seconds: float = 1.0) -> float | None:
    """The share of all cores busy during the next ``seconds`` (``/proc/stat``), while this process
    sleeps: what *others* use right now. None where the system has no /proc/stat."""

    def sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    first = sample()
    time.sleep(seconds)
    second = sample()
    if first is None or second is None or second[0] == first[0]:
        return None
    return 1 - (second[1] - first[1]) / (second[0] - first[0])


def busy_check(threshold: float = 0.2) -> dict:
    """Is someone else using the cores? Two signs: the share of the cores busy during one second
    while this process sleeps (above ``threshold``: busy), and a calibration loop (a fixed NumPy
    computation) timed twice, which on a quiet machine takes the same time (more than 20% apart:
    busy). The 1-minute load average is recorded too, but only as information: it still counts
    what ran a minute ago."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    share = cpu_busy_share()
    x = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)

    def calibrate() -> float:
        start = time.perf_counter()
        for _ in range(200):
            x @ x
        return time.perf_counter() - start
    calibrate()
    first, second = calibrate(), calibrate()
    spread = abs(first - second) / min(first, second)
    reasons = []
    if share is not None and share > threshold:
        reasons.append(f"{100 * share:.0f}% of the {cores} cores were busy with other work")
    if spread > 0.2:
        reasons.append(f"a calibration loop took {first * 1e3:.0f} ms then {second * 1e3:.0f} ms")
    return {"load_average_1m": load, "others_cpu_share": share, "cores": cores, "calibration_s": [first, second],
            "busy": bool(reasons), "why": "; ".join(reasons)}


def run_all(model_path: str | Path | None = None, plan: Plan | None = None, only: Sequence[str] | None = None,
            benchmarks: dict[str, Benchmark] | None = None, progress: bool = True, measure_machine: bool = True,
            say: Callable[[str], None] | None = None) -> dict:
    """Run the benchmarks (``only`` some, by name) and return the result document: ``{"plan",
    "environment", "busy", "benchmarks": {name: {"title", "figures", "notes", "raw", "seconds"} or
    {"skipped": why}}, "figures": [every figure]}``."""
    from tqdm import tqdm

    from ..fetch import default_model_path
    from .environment import environment

    plan = plan or Plan.full()
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    chosen = benchmarks or {name: make() for name, make in BENCHMARKS.items()}
    unknown = sorted(set(only or ()) - set(chosen))
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}: choose from {', '.join(chosen)}")
    model_path = Path(model_path) if model_path else default_model_path()
    if not model_path.is_file():
        raise ValueError(f"no model at {model_path}: run `make fetch` (or give --model)")
    if only:
        chosen = {k: v for k, v in chosen.items() if k in only}
    busy = busy_check()
    if busy["busy"]:
        say(f"warning: this machine looks busy ({busy['why']}): figures will be slower and noisier than "
            "on a quiet one, and the report marks them")
    result = {"plan": asdict(plan), "model": str(model_path), "busy": busy,
              "environment": environment(plan.threads, measure=measure_machine, quick=plan.name == "quick"),
              "benchmarks": {}, "figures": []}
    runnable = {k: b for k, b in chosen.items() if b.missing() is None}
    bar = tqdm(total=sum(b.steps(plan) for b in runnable.values()), disable=not progress, unit="run",
               file=sys.stderr, dynamic_ncols=True)
    try:
        for name, bench in chosen.items():
            why = bench.missing()
            if why is not None:
                say(f"{name}: skipped: {why}")
                result["benchmarks"][name] = {"title": bench.title, "skipped": why}
                continue
            bar.set_description(name)
            start = time.perf_counter()
            outcome = bench.run(model_path, plan, lambda what: bar.update(1))
            result["benchmarks"][name] = {"title": bench.title, "figures": [f.key for f in outcome.figures],
                                          "notes": outcome.notes, "raw": outcome.raw,
                                          "seconds": time.perf_counter() - start}
            result["figures"] += [f.to_json() for f in outcome.figures]
    finally:
        bar.close()
    return result


def figures_of(result: dict) -> dict[str, Figure]:
    """The figures of a result document, by key."""
    return {d["key"]: Figure.from_json(d) for d in result["figures"]}


__all__ = ["BENCHMARKS", "Benchmark", "DistBench", "Outcome", "Plan", "QuantBench", "ScaleBench", "ServeBench",
           "SpeedBench", "full_size_files", "speed_outcome",
           "ThroughputBench", "TokenizerBench", "busy_check", "figures_of", "ratio_samples", "run_all"]
