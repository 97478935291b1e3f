"""The GPU check (chapter 9): one run on a machine with an NVIDIA GPU, under 5 minutes on an H200.

    python scripts/gpu_check.py [--model PATH | --synthetic] [--output build/gpu_check.json] [--quick]
    make gpu-check

Steps, each bounded in time, each recorded even when another fails:

1. ``tests``: ``pytest tests/gpu`` on the GPU (no simulator): every kernel against its
   NumPy reference, the cuda backend end to end, and the sm_90 compile check; then the
   memory pool (9.4) installed in CuPy on two streams, and the fusion pass's kernels (9.6)
   against eager CuPy, their own checks;
2. ``smollm2``: SmolLM2 on ``cuda`` against the NumPy backend: logits on a few prompts
   (normalised error <= 1e-3) and 32 greedy tokens equal to the CPU's (on a synthetic model,
   whose logits are nearly flat, the tokens are reported, not required);
3. ``bench``: ``llmrs bench speed --backend cuda`` pp512 / tg128 (CUDA graphs: not built yet,
   reported as such), and batched greedy decode at 1, 16 and 64 sequences; ``matvec``: GPU time
   of the float and the int8 (llama.cpp-style) Q4_1 matvec kernels, with CUDA events; ``graphs``:
   a decode token's matvec launches eager against one captured CUDA graph replayed;
4. ``transformers``: the anchor, in the same run on the same GPU: Hugging Face transformers
   (torch) with the file's own weights, exported by the engine's ``formats.hf.export_hf``
   (dequantised, Q/K un-permuted to Hugging Face's RoPE layout), so no ``gguf`` package is
   needed. First float32: its logits against ours on cuda and on NumPy
   (a reference no one here wrote, on the same weights); then float16: pp512 and tg128, and
   our ratios to it.

``--synthetic`` writes a model of SmolLM2-135M's shapes with random Q4_1 weights (no
tokenizer: prompts are token ids) into ``build/``, for a GPU machine the 98 MB file cannot
reach: every speed figure depends on the shapes and types alone, and every check compares
two engines on the same weights.

It prints a short table last and writes everything to JSON. Without a GPU every GPU step
is skipped, saying so, and the table and JSON are still written: run it on the CPU first
so that the one GPU run is not spent on a typo. Works with whatever CuPy is installed
(``cupy-cuda12x`` or ``cupy-cuda13x``) and needs no network: the model file must be there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmrs_core.kernels.gpu import runtime  # noqa: E402  (after the path; imports no numba.cuda)

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]
LOGITS_BOUND = 1e-3  # float16 scales and another summation order through 30 layers stay well inside this
GREEDY_TOKENS = 32


def skipped(why: str) -> dict:
    return {"status": "skipped", "why": why}


def step(name: str, results: dict, fn, *args, save: Path | None = None) -> None:
    """Run one step; whatever it raises is recorded, and the next step runs. ``save``: write
    the results so far there after the step (a run cut off by its time limit keeps them)."""
    start = time.perf_counter()
    print(f"== {name} ...", flush=True)
    try:
        results[name] = fn(*args)
    except Exception as e:  # the run must go on: record, print, continue
        results[name] = {"status": "error", "error": f"{type(e).__name__}: {e}",
                         "traceback": traceback.format_exc(limit=6)}
        print(results[name]["traceback"], file=sys.stderr)
    results[name]["seconds"] = round(time.perf_counter() - start, 1)
    print(f"== {name}: {results[name]['status']} ({results[name]['seconds']} s)", flush=True)
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        save.write_text(json.dumps(results, indent=1, default=str) + "\n")


def environment() -> dict:
    info = {"status": "ok", "python": sys.version.split()[0], "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpus": runtime.driver_gpu_count()}
    for module in ("numba", "cupy", "torch", "transformers", "gguf", "pytest"):
        try:
            info[module] = __import__(module).__version__
        except Exception as e:  # missing, or broken without a driver
            info[module] = f"unavailable ({type(e).__name__})"
    if info["gpus"]:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        info["memory_gib"] = round(props["totalGlobalMem"] / 2**30, 1)
    return info


def gpu_tests(timeout: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != runtime.SIMULATOR_ENV}
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/gpu", "-q", "--no-header", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    tail = (run.stdout + run.stderr).strip().splitlines()[-15:]
    return {"status": "ok" if run.returncode == 0 else "failed", "returncode": run.returncode,
            "summary": tail[-1] if tail else "", "tail": tail}


def smollm2(model_path: str, prompts: list[str] = PROMPTS, n_greedy: int = GREEDY_TOKENS) -> dict:
    import llmrs_core as llmrs
    from llmrs_core.kernels.gpu.arrays import to_host
    from llmrs_core.testing import normalised_error

    cuda, reference = llmrs.load(model_path, backend="cuda"), llmrs.load(model_path, backend="numpy")
    errors, same, first_diff = [], [], []
    for text in prompts:
        ids = prompt_ids(cuda, text)
        errors.append(normalised_error(to_host(cuda.logits(ids)), reference.logits(ids)))
        ours = cuda.generate(ids, max_tokens=n_greedy).token_ids
        theirs = reference.generate(ids, max_tokens=n_greedy).token_ids
        same.append(ours == theirs)
        first_diff.append(next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None))
    synthetic = not has_tokenizer(cuda)  # random weights: near-ties make greedy tokens a report, not a check
    ok = max(errors) <= LOGITS_BOUND and (synthetic or all(same))
    return {"status": "ok" if ok else "failed", "max_logits_error": max(errors), "logits_errors": errors,
            "synthetic": synthetic,
            "bound": LOGITS_BOUND, "greedy_equal": same, "first_difference": first_diff,
            "describe": cuda.backend_report()}


def has_tokenizer(model) -> bool:
    try:
        model.tokenizer  # noqa: B018  (a model file without one raises ValueError)
    except ValueError:
        return False
    return True


def prompt_ids(model, text: str) -> list[int]:
    """The prompt's tokens, or (a synthetic model has no tokenizer) its bytes as token ids."""
    return model.tokenizer.encode(text) if has_tokenizer(model) else list(text.encode())


SMOLLM2_SHAPE = dict(hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9, n_kv_heads=3,
                     vocab_size=49152, context_length=2048, rope_theta=100000.0, rms_norm_eps=1e-5)


def synthetic_model(path: Path) -> str:
    """SmolLM2-135M's shapes (its config.json) and its file's types (Q4_1 matrices, a Q8_0 token
    embedding, tied), with seeded random weights."""
    from llmrs_core.testing import write_tiny_llama

    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_tiny_llama(path, weight_type="q4_1", embedding_type="q8_0", **SMOLLM2_SHAPE)
    return str(path)


def bench(model_path: str, pp: int, tg: int, repetitions: int, batches: tuple[int, ...]) -> dict:
    import llmrs_core as llmrs
    from llmrs_core.bench.speed import ours

    model = llmrs.load(model_path, backend="cuda")
    model.warm_up()
    measured = ours(model, pp, tg, repetitions)
    out = {"status": "ok", "pp": measured["pp"], "tg": measured["tg"], "pp_tokens": pp, "tg_tokens": tg,
           "graphs": skipped("CUDA graphs for decode are not built yet (issue 13)")}
    rng = np.random.default_rng(0)
    batched = {}
    for n in batches:
        prompts = [[int(i) for i in rng.integers(0, model.config.vocab_size, 16)] for _ in range(n)]
        model.generate(prompts[:1], max_tokens=2)  # warm
        start = time.perf_counter()
        done = model.generate(prompts, max_tokens=16)
        seconds = time.perf_counter() - start
        batched[str(n)] = {"tokens_per_s": sum(len(c.token_ids) for c in done) / seconds, "seconds": seconds}
    out["batched_decode"] = batched
    return out


def matvec_kernels(model_path: str) -> dict:
    """GPU time of the float and the int8 (Q8_1 activations) Q4_1 matvec on SmolLM2's ffn_gate, CUDA events."""
    import cupy
    from cupyx.profiler import benchmark

    from llmrs_core.formats.gguf import read_gguf
    from llmrs_core.kernels.gpu import matvec, matvec_int8

    gguf = read_gguf(model_path)
    name = "blk.0.ffn_gate.weight"
    raw, ggml_type = gguf.blocks(name)
    w = matvec.pack(raw, ggml_type, gguf.tensors[name].shape)
    out = {"status": "ok", "matrix": f"{name} {w.rows}x{w.cols} {ggml_type.name}"}
    for tokens in (1, 8):
        x = cupy.random.standard_normal((tokens, w.cols), dtype=cupy.float32)
        for label, fn in (("float", matvec.matvec), ("int8", matvec_int8.matvec_int8)):
            gpu_s = float(np.median(benchmark(fn, (x, w), n_repeat=200, n_warmup=10).gpu_times))
            out[f"{label}_T{tokens}_us"] = gpu_s * 1e6
            out[f"{label}_T{tokens}_GBps"] = w.nbytes / gpu_s / 1e9
    return out


def graph_replay(model_path: str, steps: int = 50) -> dict:
    """What CUDA graphs would save: one layer's decode matvecs (stacked Q/K/V, O, gate/up, down)
    times 30, launched eagerly, then captured once on a CuPy stream and replayed. An experiment,
    not the backend (whose decode step still has host work between kernels)."""
    import cupy

    from llmrs_core.formats.gguf import read_gguf
    from llmrs_core.kernels.gpu import matvec

    gguf = read_gguf(model_path)

    def packed(name):
        raw, t = gguf.blocks(name)
        return matvec.pack(raw, t, gguf.tensors[name].shape)

    qkv = matvec.stack([packed(f"blk.0.attn_{n}.weight") for n in "qkv"])[0].fused
    gate_up = matvec.stack([packed("blk.0.ffn_gate.weight"), packed("blk.0.ffn_up.weight")])[0].fused
    layer = [qkv, packed("blk.0.attn_output.weight"), gate_up, packed("blk.0.ffn_down.weight")]
    ins = [cupy.random.standard_normal((1, w.cols), dtype=cupy.float32) for w in layer]
    outs = [cupy.empty((1, w.rows), cupy.float32) for w in layer]

    def one_token():
        for _ in range(30):
            for w, x, o in zip(layer, ins, outs):
                matvec.matvec(x, w, o)

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        one_token()  # compiled and loaded before capture
        stream.synchronize()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(steps):
            one_token()
        stop.record(stream)
        stop.synchronize()
        eager_s = cupy.cuda.get_elapsed_time(start, stop) / 1e3 / steps
        stream.begin_capture()
        one_token()
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        start.record(stream)
        for _ in range(steps):
            graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        graph_s = cupy.cuda.get_elapsed_time(start, stop) / 1e3 / steps
    return {"status": "ok", "launches_per_token": 30 * len(layer), "eager_ms_per_token": eager_s * 1e3,
            "graph_ms_per_token": graph_s * 1e3, "speedup": eager_s / graph_s}


def launch_costs(n: int = 2000) -> dict:
    """Host time of one kernel launch, which bounds decode at batch 1 (hundreds of launches a
    token): a 1-thread kernel with 5 array arguments, launched n times, each way the engine could
    launch it. Microseconds per launch, the device synchronised once at the end."""
    import cupy

    from llmrs_core.kernels.gpu import runtime
    from llmrs_core.kernels.gpu.arrays import launch

    cuda = runtime.cuda()

    @cuda.jit
    def touch(a, b, c, d, e):
        if cuda.grid(1) == 0:
            e[0] = a[0] + b[0] + c[0] + d[0]

    arrays = [cupy.ones(1024, cupy.float32) for _ in range(5)]
    stream = cuda.external_stream(cupy.cuda.get_current_stream().ptr)
    wrapped = [cuda.as_cuda_array(a) for a in arrays]
    configured = touch[1, 32, stream]
    add = cupy.ElementwiseKernel("float32 a, float32 b", "float32 c", "c = a + b", "llmrs_add")
    ways = {
        "engine_launch": lambda: launch(touch, 1, 32, *arrays),
        "stream_reused": lambda: touch[1, 32, stream](*arrays),
        "configured_cupy_arrays": lambda: configured(*arrays),
        "configured_numba_arrays": lambda: configured(*wrapped),
        "cupy_elementwise": lambda: add(arrays[0], arrays[1], arrays[2]),
    }
    out = {"status": "ok", "launches": n}
    for name, fn in ways.items():
        fn()
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        cupy.cuda.Device().synchronize()
        out[f"{name}_us"] = (time.perf_counter() - start) / n * 1e6
    return out


def memory_pool() -> dict:
    """The caching allocator of 9.4 installed in CuPy, on two streams, values checked (memory_pool_cupy)."""
    from llmrs_core.labs.memory_pool_cupy import check_on_gpu

    return {"status": "ok", "stats": check_on_gpu()}


def fusion_kernels() -> dict:
    """9.6's generated kernels against eager CuPy at SmolLM2's sizes: errors and device times (fusion_check)."""
    from llmrs_core.labs.fusion_check import check_on_gpu

    rows = check_on_gpu()
    return {"status": "ok" if all(r["ok"] for r in rows) else "failed", "rows": rows}


def hf_llama(model_path: str):
    """A transformers ``LlamaForCausalLM`` (float32, CPU) holding the GGUF's own weights, through the
    engine's own exporter (``formats.hf.export_hf``: dequantised, W_q/W_k un-permuted to Hugging
    Face's RoPE layout, ``config.json`` from the file's metadata). Plain Llama models only."""
    import tempfile

    from transformers import LlamaForCausalLM

    from llmrs_core.formats.gguf import read_gguf
    from llmrs_core.formats.hf import export_hf

    c = read_gguf(model_path).config
    if c.architecture != "llama" or c.rope_scale != 1.0 or c.rotary_dim or c.qkv_bias:
        raise ValueError(f"the anchor builds plain Llama models only (SmolLM2's kind), not {c.architecture!r} "
                         f"with RoPE scale {c.rope_scale}, rotary_dim {c.rotary_dim}, qkv_bias {c.qkv_bias}")
    with tempfile.TemporaryDirectory() as tmp:
        model = LlamaForCausalLM.from_pretrained(export_hf(model_path, tmp), dtype="float32")
    return model.eval()


def transformers_anchor(model_path: str, pp: int, tg: int, repetitions: int, device: str = "cuda") -> dict:
    import torch

    import llmrs_core as llmrs
    from llmrs_core.kernels.gpu.arrays import to_host
    from llmrs_core.testing import normalised_error

    model = hf_llama(model_path).to(device)
    ours = {"numpy": llmrs.load(model_path, backend="numpy")}
    if device == "cuda":
        ours["cuda"] = llmrs.load(model_path, backend="cuda")
    ids = prompt_ids(ours["numpy"], PROMPTS[0])
    with torch.inference_mode():
        theirs = model(torch.tensor([ids], device=device)).logits[0].float().cpu().numpy()  # [T, vocab]
    errors = {f"{name}_vs_transformers_fp32": normalised_error(to_host(m.logits(ids)), theirs) for name, m in ours.items()}
    del ours
    model = model.half()
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, pp), device=device, generator=torch.Generator(device).manual_seed(0))

    def timed(fn) -> list[float]:
        fn()
        times = []
        for _ in range(repetitions):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return times

    with torch.inference_mode():
        pp_times = timed(lambda: model(prompt))
        short = prompt[:, :8]
        tg_times = timed(lambda: model.generate(short, max_new_tokens=tg, min_new_tokens=tg, do_sample=False))
    rate = lambda n, ts: {"tokens_per_s": statistics.median(n / t for t in ts), "runs": len(ts)}  # noqa: E731
    ok = max(errors.values()) <= LOGITS_BOUND
    return {"status": "ok" if ok else "failed", "logits_errors": errors, "bound": LOGITS_BOUND,
            "pp": rate(pp, pp_times), "tg": rate(tg, tg_times), "dtype": "float16", "torch": torch.__version__}


def table(results: dict) -> str:
    def fig(section: str, key: str) -> str:
        r = results.get(section, {})
        return f"{r[key]['tokens_per_s']:.1f}" if r.get("status") == "ok" and key in r else "-"

    env = results.get("environment", {})
    lines = [f"GPU check, {env.get('date', '?')}: {env.get('gpu', 'no GPU')}",
             f"{'step':<14}{'status':<10}detail"]
    for name, r in results.items():
        if name == "environment":
            continue
        detail = r.get("why") or r.get("error") or r.get("summary") or ""
        if name == "matvec" and r.get("status") == "ok":
            detail = (f"T=1 float {r['float_T1_us']:.1f} us ({r['float_T1_GBps']:.0f} GB/s), "
                      f"int8 {r['int8_T1_us']:.1f} us; T=8 float {r['float_T8_us']:.1f}, int8 {r['int8_T8_us']:.1f} us")
        if name == "fusion" and r.get("status") in ("ok", "failed"):
            detail = "; ".join(f"{x['block']} T={x['T']}: eager {x['eager_us']:.0f} us, numba {x['numba_kernel_us']:.0f} us"
                               for x in r["rows"])
        if name == "launch" and r.get("status") == "ok":
            detail = ", ".join(f"{k.removesuffix('_us')} {v:.0f}" for k, v in r.items() if k.endswith("_us")) + " us"
        if name == "memory_pool" and r.get("status") == "ok":
            detail = ", ".join(f"{k} {v}" for k, v in list(r["stats"].items())[:4])
        if name == "graphs" and r.get("status") == "ok":
            detail = (f"{r['launches_per_token']} matvec launches/token: eager {r['eager_ms_per_token']:.2f} ms, "
                      f"graph replay {r['graph_ms_per_token']:.2f} ms ({r['speedup']:.1f}x)")
        if name == "transformers" and r.get("status") in ("ok", "failed"):
            detail = ", ".join(f"{k.split('_')[0]} {v:.1e}" for k, v in r["logits_errors"].items()) + " vs fp32"
        if name == "smollm2" and r.get("status") in ("ok", "failed"):
            detail = f"max logits error {r['max_logits_error']:.1e} (<= {r['bound']:g}), greedy equal {r['greedy_equal']}"
        lines.append(f"{name:<14}{r.get('status', '?'):<10}{detail[:90]}")
    lines.append(f"{'':<14}{'ours':>10}{'transformers':>14}{'ratio':>8}")
    for key in ("pp", "tg"):
        a, b = fig("bench", key), fig("transformers", key)
        ratio = f"{float(a) / float(b):.2f}" if "-" not in (a, b) else "-"
        tokens = results.get("bench", {}).get(f"{key}_tokens", "")
        lines.append(f"{key + str(tokens):<14}{a:>10}{b:>14}{ratio:>8}")
    for n, r in results.get("bench", {}).get("batched_decode", {}).items():
        lines.append(f"{'batch ' + n:<14}{r['tokens_per_s']:>10.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The chapter 9 GPU check (see the module docstring).")
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--output", default=str(ROOT / "build" / "gpu_check.json"))
    parser.add_argument("--synthetic", action="store_true",
                        help="SmolLM2's shapes with random Q4_1 weights, written to build/ (for a GPU machine "
                             "the real file cannot reach)")
    parser.add_argument("--quick", action="store_true", help="pp64/tg16, one repetition, batches 1 and 4")
    parser.add_argument("--test-timeout", type=int, default=240, help="seconds for pytest tests/gpu")
    parser.add_argument("--rehearse", action="store_true",
                        help="no GPU: run the SmolLM2 and bench steps' code on a tiny random model in the CUDA "
                             "simulator (a minute), so that the GPU run is not spent on a typo")
    args = parser.parse_args(argv)
    pp, tg, reps, batches = (64, 16, 1, (1, 4)) if args.quick else (512, 128, 3, (1, 16, 64))
    if args.rehearse:
        return rehearse(args.output)

    results: dict = {}
    step("environment", results, environment)
    gpu = results["environment"].get("gpus", 0) > 0 and not runtime.simulator_enabled()
    if args.synthetic:
        args.model = synthetic_model(ROOT / "build" / "smollm2-shape-random.Q4_1.gguf")
        results["environment"]["model"] = "synthetic: SmolLM2-135M's shapes, random Q4_1 weights"
    have_model = Path(args.model).is_file()
    no_gpu = "no NVIDIA GPU here"
    no_model = f"no model file at {args.model} (there is no network: bring it, or give --model)"
    out = Path(args.output)
    if gpu:
        step("tests", results, gpu_tests, args.test_timeout, save=out)
        step("launch", results, launch_costs, save=out)
        step("memory_pool", results, memory_pool, save=out)
        step("fusion", results, fusion_kernels, save=out)
    else:
        results["tests"] = skipped(no_gpu + ": make test-gpu runs them in the simulator")
        results["launch"] = results["memory_pool"] = results["fusion"] = skipped(no_gpu)
    for name, fn, fn_args in (("smollm2", smollm2, (args.model,)),
                              ("bench", bench, (args.model, pp, tg, reps, batches)),
                              ("matvec", matvec_kernels, (args.model,)),
                              ("graphs", graph_replay, (args.model,)),
                              ("transformers", transformers_anchor, (args.model, pp, tg, reps))):
        if not gpu or not have_model:
            results[name] = skipped(no_gpu + " (the simulator is far too slow for SmolLM2)" if not gpu else no_model)
        else:
            step(name, results, fn, *fn_args, save=out)

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print()
    print(table(results))
    print(f"(all figures: {out})")
    failed = [n for n, r in results.items() if r.get("status") in ("failed", "error")]
    return 1 if failed else 0


def rehearse(output: str) -> int:
    """The GPU steps' own code, on a tiny model in the simulator: every figure is meaningless."""
    import tempfile

    from llmrs_core.testing import write_tiny_llama

    runtime.enable_simulator()
    results: dict = {}
    step("environment", results, environment)
    results["tests"] = skipped("rehearsal: make test-gpu runs them in the simulator")
    results["launch"] = results["memory_pool"] = results["fusion"] = skipped("rehearsal: they need a GPU")
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "tiny.gguf")
        write_tiny_llama(path, weight_type="q4_1", byte_tokenizer=True, hidden_size=32, intermediate_size=64,
                         n_layers=1, n_heads=2, n_kv_heads=1)
        step("smollm2", results, smollm2, path, ["Hi"], 2)
        step("bench", results, bench, path, 4, 2, 1, (1, 2))
    results["matvec"] = skipped("rehearsal: CUDA events need a GPU")
    results["graphs"] = skipped("rehearsal: CUDA graphs need a GPU")
    results["transformers"] = skipped("rehearsal: torch and a GPU are needed")
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print()
    print(table(results))
    print(f"(rehearsal on a tiny random model in the CUDA simulator: no figure here means anything; {out})")
    return 1 if any(r.get("status") in ("failed", "error") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
