"""``llmrs bench throughput``: offline serving throughput, nano-vllm style (chapter 7).

N requests with random prompt and output lengths (fixed seed), all queued
at once; the engine runs them to the end. Reported: requests/s, output
tokens/s, time to first token (TTFT) and inter-token latency (ITL), mean,
median and p99. The same workload through one request at a time gives the
single-sequence decode speed, for the batching speed-up. A prefix-heavy
workload (a shared system prompt plus a short question) shows what the
prefix cache saves, with it on and off.

The run takes seconds on the Numba backend and minutes on the NumPy-based ones (the
learner's, ``--impl learner``): ``progress`` receives a line as each of its five parts
starts and ends, and one every few seconds while the engine runs a workload, so the CLI
can show it on stderr (lines, not a redrawn one: they read the same through a pipe).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..engine import Engine
from ..engine.parts import EngineParts
from ..kv_cache.paged import blocks_for
from ..validation import check_int
from .common import percentiles, random_ids

#: receives one line of progress (the CLI prints it on stderr)
Progress = Callable[[str], None]
#: seconds between two progress lines while a workload runs
PROGRESS_EVERY = 5.0


def run_workload(
    net, tokenizer, prompts: list[list[int]], output_lens: list[int], *, max_num_seqs: int = 16,
    prefix_caching: bool = True, block_size: int = 16, progress: Progress | None = None,
    parts: EngineParts | None = None,
) -> dict:
    """Run the requests together; throughput and latency figures as a dict. ``progress`` gets a
    line every :data:`PROGRESS_EVERY` seconds: requests finished and tokens generated so far.
    ``parts``: the engine's classes (the model's ``parts``: the learner's, ``--impl learner``)."""
    needed = sum(blocks_for(len(p) + n, block_size) for p, n in zip(prompts, output_lens))
    engine = Engine(net, tokenizer, num_blocks=needed + 8, block_size=block_size, max_num_seqs=max_num_seqs,
                    prefix_caching=prefix_caching, parts=parts)
    start = time.perf_counter()
    rids = [engine.add_request(p, n, ignore_eos=True) for p, n in zip(prompts, output_lens)]
    finished = tokens = 0
    said = start
    for output in engine.run():
        finished += output.finished
        tokens += len(output.new_token_ids)
        if progress is not None and time.perf_counter() - said >= PROGRESS_EVERY:
            said = time.perf_counter()
            progress(f"    {finished} of {len(rids)} requests finished, {tokens} of {sum(output_lens)} tokens "
                     f"generated, {said - start:.0f} s")
    elapsed = time.perf_counter() - start
    ttft, itl, out_tokens = [], [], 0
    for rid in rids:
        metrics = engine.request_metrics(rid)
        ttft.append(metrics.ttft)
        itl += metrics.itl
        out_tokens += len(engine.requests[rid].output_ids)
    stats = engine.stats()
    return {
        "requests": len(rids),
        "seconds": elapsed,
        "requests_per_s": len(rids) / elapsed,
        "output_tokens_per_s": out_tokens / elapsed,
        "ttft_s": percentiles(ttft),
        "itl_s": percentiles(itl),
        "steps": stats["steps"],
        "preemptions": stats["preemptions"],
        "prefix_hit_rate": stats["prefix_hit_rate"],
    }


def single_decode_tokens_per_s(net, n_prompt: int = 64, n_out: int = 64, seed: int = 0) -> float:
    """Decode speed of one sequence alone (contiguous cache), tokens/s after the first."""
    rng = np.random.default_rng(seed)
    ids = random_ids(rng, net.config.vocab_size, n_prompt)
    cache = net.new_cache(n_prompt + n_out + 1)
    logits = net.forward(ids, cache, last_only=True)[0]
    start = time.perf_counter()
    for _ in range(n_out):
        logits = net.forward([int(np.argmax(logits))], cache, last_only=True)[0]
    return n_out / (time.perf_counter() - start)


def batched_decode_tokens_per_s(net, batch: int = 16, n_prompt: int = 64, n_steps: int = 32, seed: int = 0,
                                parts: EngineParts | None = None) -> float:
    """Steady-state decode with ``batch`` sequences in every step (one token each), tokens/s, in the
    block pool of ``parts`` (default: the engine's own)."""
    rng = np.random.default_rng(seed)
    per_seq = blocks_for(n_prompt + n_steps + 1, 16)
    pool_class = (parts or EngineParts.engines_own()).paged_kv_cache  # the engine's, or the learner's (5.7)
    cache = pool_class(net.config, num_blocks=batch * per_seq, block_size=16, xp=net.backend.xp)
    seqs = [cache.sequence(i) for i in range(batch)]
    last = []
    for seq in seqs:
        ids = random_ids(rng, net.config.vocab_size, n_prompt)
        last.append(int(np.argmax(net.forward(ids, seq, last_only=True)[0])))
    start = time.perf_counter()
    for _ in range(n_steps):
        logits = net.forward_batch([([t], s) for t, s in zip(last, seqs)], last_only=True)
        last = [int(np.argmax(lg[0])) for lg in logits]
    return batch * n_steps / (time.perf_counter() - start)


class _Parts:
    """Says each part of the run as it starts and ends: ``[2/5] ... done in 3.1 s``."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.number = progress, total, 0

    def __call__(self, what: str, run: Callable[[], object]) -> object:
        self.number += 1
        say = self.progress or (lambda line: None)
        say(f"bench throughput [{self.number}/{self.total}] {what} ...")
        start = time.perf_counter()
        result = run()
        say(f"bench throughput [{self.number}/{self.total}] done in {time.perf_counter() - start:.1f} s")
        return result


def throughput(model, n_requests: int = 32, seed: int = 0, max_prompt: int = 128, max_output: int = 64,
               max_num_seqs: int = 16, progress: Progress | None = None) -> dict:
    """The random workload and the prefix-heavy one, with their comparisons.

    Prompt and output lengths of the random workload are drawn from ``min(16, max_prompt)``
    to ``max_prompt`` tokens and ``min(16, max_output)`` to ``max_output`` (the CLI's
    ``--input-len`` and ``--output-len``). ``progress`` receives a line per part and while
    the engine runs (see the module's note).
    """
    check_int("n_requests", n_requests, minimum=1)
    check_int("max_prompt", max_prompt, minimum=1)
    check_int("max_output", max_output, minimum=1)
    net, tok = model.network, model.tokenizer
    rng = np.random.default_rng(seed)
    vocab = net.config.vocab_size
    prompt_range, output_range = [min(16, max_prompt), max_prompt], [min(16, max_output), max_output]
    prompts = [random_ids(rng, vocab, int(rng.integers(prompt_range[0], max_prompt + 1))) for _ in range(n_requests)]
    outs = [int(rng.integers(output_range[0], max_output + 1)) for _ in range(n_requests)]
    result = {"workload": {"n_requests": n_requests, "seed": seed, "prompt_tokens": prompt_range,
                           "output_tokens": output_range, "max_num_seqs": max_num_seqs}}
    part = _Parts(progress, 5)
    result["batched"] = part(
        f"{n_requests} random requests, up to {max_num_seqs} at once",
        lambda: run_workload(net, tok, prompts, outs, max_num_seqs=max_num_seqs, prefix_caching=False,
                             progress=progress, parts=model.parts))
    result["single_decode_tokens_per_s"] = part("one sequence alone: 64 decode steps",
                                                lambda: single_decode_tokens_per_s(net))
    result["batching_speedup"] = result["batched"]["output_tokens_per_s"] / result["single_decode_tokens_per_s"]
    result["batched_decode_tokens_per_s"] = part(
        f"{max_num_seqs} sequences per step: 32 decode steps",
        lambda: batched_decode_tokens_per_s(net, batch=max_num_seqs, parts=model.parts))
    result["decode_speedup"] = result["batched_decode_tokens_per_s"] / result["single_decode_tokens_per_s"]
    system = tok.encode(
        "<|im_start|>system\nYou are a careful assistant. Answer in one short sentence, cite no sources, "
        "and never repeat the question. If the question is unclear, say so and stop. Be kind and precise; "
        "prefer simple words; give numbers with their units.<|im_end|>\n"
    )
    few_shot = system * 2
    questions = [tok.encode(f"<|im_start|>user\nQuestion number {i}?<|im_end|>\n<|im_start|>assistant\n")
                 for i in range(n_requests)]
    shared = [few_shot + q for q in questions]
    short = [16] * n_requests
    result["prefix_workload"] = {"shared_prefix_tokens": len(few_shot)}
    result["prefix_off"] = part(
        f"{n_requests} requests sharing a {len(few_shot)}-token prefix, prefix cache off",
        lambda: run_workload(net, tok, shared, short, max_num_seqs=max_num_seqs, prefix_caching=False,
                             progress=progress, parts=model.parts))
    result["prefix_on"] = part(
        "the same with the prefix cache on",
        lambda: run_workload(net, tok, shared, short, max_num_seqs=max_num_seqs, prefix_caching=True,
                             progress=progress, parts=model.parts))
    result["prefix_speedup"] = result["prefix_on"]["requests_per_s"] / result["prefix_off"]["requests_per_s"]
    return result


def format_throughput(r: dict) -> str:
    b = r["batched"]
    w = r["workload"]
    lines = [
        f"workload: {w['n_requests']} requests, prompts {w['prompt_tokens'][0]}-{w['prompt_tokens'][1]} tokens, "
        f"outputs {w['output_tokens'][0]}-{w['output_tokens'][1]}, up to {w['max_num_seqs']} at once, seed {w['seed']}",
        f"  {b['requests_per_s']:.2f} requests/s, {b['output_tokens_per_s']:.1f} output tokens/s "
        f"({b['steps']} steps, {b['preemptions']} preemptions, {b['seconds']:.1f} s)",
        f"  TTFT mean {1e3 * b['ttft_s']['mean']:.0f} ms, p50 {1e3 * b['ttft_s']['p50']:.0f}, "
        f"p99 {1e3 * b['ttft_s']['p99']:.0f}; ITL mean {1e3 * b['itl_s']['mean']:.0f} ms, "
        f"p50 {1e3 * b['itl_s']['p50']:.0f}, p99 {1e3 * b['itl_s']['p99']:.0f}",
        f"  one sequence alone decodes {r['single_decode_tokens_per_s']:.1f} tokens/s: the whole run "
        f"(prefills included) gives {r['batching_speedup']:.1f}x the output tokens/s",
        f"  steady-state decode of {w['max_num_seqs']} sequences per step: "
        f"{r['batched_decode_tokens_per_s']:.1f} tokens/s, {r['decode_speedup']:.1f}x one sequence alone",
        f"prefix-heavy: a {r['prefix_workload']['shared_prefix_tokens']}-token shared prefix",
        f"  cache off {r['prefix_off']['requests_per_s']:.2f} requests/s; on {r['prefix_on']['requests_per_s']:.2f} "
        f"requests/s (hit rate {r['prefix_on']['prefix_hit_rate']:.0%}): {r['prefix_speedup']:.1f}x",
    ]
    return "\n".join(lines)
