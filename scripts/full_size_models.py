"""Full-size shapes (issue 28): the engine against llama.cpp on models of the sizes people run.

The tiny fixtures (scripts/make_family_models.py) check every family's arithmetic; this
script checks that nothing breaks at the real widths: rows that do not divide by 256
(Qwen2.5-0.5B's 896, Gemma-3-1B's 1152) and the fallback types llama.cpp's Q4_K_M gives
them, vocabularies of 128k-262k, head_dim 256, 32 heads of 96. For each shape it builds a
model with the public config's values and random weights in transformers, converts it with
llama.cpp's own converter, quantises it to Q4_K_M with llama.cpp's quantiser, and runs 16
greedy tokens from the same prompt ids in llama.cpp and in the engine. Not part of
`make test` (minutes and gigabytes); `make full-size-check` runs it. Issue 30 (performance
at scale) reuses the Q4_K_M files.

Run it with the reference environment's Python (torch, transformers, gguf, sentencepiece,
protobuf, which transformers 5 needs to read a SentencePiece model, and llama-cpp-python); the
engine's steps run in the project's own venv (--engine-python)::

    /opt/ref-venv/bin/python scripts/full_size_models.py all [--shape NAME ...]

Steps, per shape, each in its own process so that one model is in memory at a time:

    hf        transformers model from the config below, random weights (seeded), the final
              norm scaled so the logits have standard deviation LOGIT_STD; saved as an HF dir
              with make_family_models.py's 320-piece SentencePiece tokenizer (the converter
              pads the vocabulary to the config's vocab_size with [PADn] tokens)
    gguf      convert_hf_to_gguf.py --outtype f32 (the sdist's gguf-py first on PYTHONPATH)
    quantize  llama_cpp.llama_model_quantize -> <shape>.Q4_K_M.gguf; the f32 GGUF and the
              HF dir are deleted unless --keep (they are 2-5 GB each)
    q8_0      for the shapes in Q8_0_SHAPES (Llama-3.2-1B): <shape>.Q8_0.gguf for issue 30's
              benchmark, by llama.cpp's quantiser from the f32 GGUF, or from the Q4_K_M file
              (requantised: the weights are random, the file's types and sizes are what count)
    llamacpp  llama.cpp: n_ctx 512, F32 KV cache (type_k = type_v = 0), flash_attn off,
              2 threads; 16 greedy tokens, each step's top 5, the first step's logits
    engine    llmrs_core.load(path) (--backend numba, the default int8 path, or numpy):
              the same 16 greedy tokens, compared with llama.cpp's
    report    build/full_size.json and a table

Files go under $LLMRS_FULL_SIZE_DIR (default ~/.cache/llmrs-full-size/): <shape>/ holds the
Q4_K_M file, llamacpp.json, llamacpp_logits0.npy and engine_<backend>.json.

The comparison: tokens equal (n/16, position by position), the first divergence and whether
it passes the top-5 rule of tests/core/test_model_golden.py (vLLM's: where the greedy tokens
first differ, each side's token is in the other's top 5); the rule at every step along
llama.cpp's tokens (the engine fed llama.cpp's continuation); and at the first step
max|ours - llama.cpp| / max|llama.cpp| over the whole vocabulary, and the rms error against
what llama.cpp's 8-bit activations explain (_activation_rounding_error). With the f32 GGUF
still there (before it is deleted), llama.cpp's and the numpy backend's first-step logits on
it, within make_family_models.py's bound. A row passes on the top-5 rule at every step, the
rounding bound and the f32 bound; equal tokens are not required (random logits' gaps are
smaller than the two engines' activation roundings move them: README, "How the tests work").
The exit status is 1 when a row fails. The engine steps run again on every `all`; the
reference steps only where their output is missing (--force rebuilds everything).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "build" / "full_size.json"
CACHE = Path(os.environ.get("LLMRS_FULL_SIZE_DIR", Path.home() / ".cache" / "llmrs-full-size"))
DEFAULT_SDIST = Path(os.environ.get("LLMRS_LLAMA_CPP_SDIST", "/opt/ref/src/llama_cpp_python-0.3.36"))
DEFAULT_ENGINE_PY = REPO / ".venv" / "bin" / "python"

N_PROMPT = 16  # BOS + 15 ids drawn once (below)
N_GREEDY = 16
N_CTX = 512
THREADS = 2
QUANT = "Q4_K_M"
#: the shapes whose Q8_0 file issue 30's benchmark (`llmrs bench all --only scale`) also reads
Q8_0_SHAPES = ("llama-3.2-1b",)
# The logits' standard deviation over the vocabulary, set through the final norm's scale.
# transformers' init (std 0.02) gives near-uniform logits, where greedy picks among near-ties
# and any rounding flips it; make_family_models.py's scale gives sqrt(hidden) (45 at 2048),
# where nothing can flip. A trained model's logits spread by a few units: at 3 the top-1/top-2
# gap among 128k-262k candidates averages about 3 / sqrt(2 ln V) = 0.6, which the
# engines' difference (int8 activations rounded alike, other sum orders) should not cross.
LOGIT_STD = 3.0

# Each shape: the public config.json's values (hidden size, layers, heads, KV heads, head_dim,
# intermediate, vocab, RoPE, tie, window), with transformers' class. bos/eos are the
# SentencePiece model's (1, 2), not the real tokenizers'; nothing here reads text.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {
        "model_class": "LlamaForCausalLM", "config_class": "LlamaConfig", "arch": "llama", "seed": 32,
        "config": {
            "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
        },
        "source": "meta-llama/Llama-3.2-1B config.json",
    },
    "qwen2.5-0.5b": {
        "model_class": "Qwen2ForCausalLM", "config_class": "Qwen2Config", "arch": "qwen2", "seed": 25,
        "config": {
            "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": True,
            "use_sliding_window": False, "sliding_window": None,
        },
        "source": "Qwen/Qwen2.5-0.5B config.json (head_dim 64 = 896 / 14)",
    },
    "qwen3-0.6b": {
        "model_class": "Qwen3ForCausalLM", "config_class": "Qwen3Config", "arch": "qwen3", "seed": 36,
        "config": {
            "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 40960, "rope_theta": 1000000.0, "tie_word_embeddings": True,
            "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
        },
        "source": "Qwen/Qwen3-0.6B config.json",
    },
    "gemma-3-1b": {
        "model_class": "Gemma3ForCausalLM", "config_class": "Gemma3TextConfig", "arch": "gemma3", "seed": 31,
        # Gemma multiplies its embedding by sqrt(1152) = 34: an embedding std of 2 / 34 puts std 2 in
        # the residual stream, as make_family_models.py's gemma3 (0.25 x 8)
        "embed_std": 2.0 / 1152**0.5,
        "config": {
            "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "rms_norm_eps": 1e-6,
            "query_pre_attn_scalar": 256, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "rope_scaling": None, "sliding_window": 512,
            "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh",
            "final_logit_softcapping": None, "attn_logit_softcapping": None, "tie_word_embeddings": True,
        },
        "source": "google/gemma-3-1b-it config.json (text model)",
    },
    "phi-3.5-mini-4l": {
        "model_class": "Phi3ForCausalLM", "config_class": "Phi3Config", "arch": "phi3", "seed": 35,
        "config": {
            "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 4,  # of the real 32: 3.8B parameters would not fit this check's budget
            "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0,
            # longrope, 48 factors each (head_dim 96 / 2). SYNTHETIC values of the real lists' range
            # (short ~1..3, long ~1..60), not Microsoft's: at n_ctx 512 < 4096 both engines use
            # the short ones; attn_factor sqrt(1 + ln 32 / ln 4096) follows from the two lengths
            "rope_scaling": {
                "rope_type": "longrope",
                "short_factor": [round(1.0 + 1.9 * (i / 47) ** 3, 4) for i in range(48)],
                "long_factor": [round(1.0 + 60.0 * (i / 47) ** 3, 4) for i in range(48)],
            },
            # the real config has sliding_window 262144 (never reached); None as in the tiny phi3
            "sliding_window": None, "tie_word_embeddings": False,
        },
        "source": "microsoft/Phi-3.5-mini-instruct config.json, 4 of its 32 layers",
    },
}


def _prompt(vocab: int) -> list[int]:
    """BOS then N_PROMPT - 1 ids drawn once over the whole vocabulary (the same seed for every shape)."""
    rng = np.random.default_rng(28)
    return [1] + rng.integers(3, vocab, N_PROMPT - 1).tolist()


def shape_dir(name: str) -> Path:
    return CACHE / name


def q_path(name: str) -> Path:
    return shape_dir(name) / f"{name}.{QUANT}.gguf"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


# ---------------------------------------------------------------- reference side (ref venv)


def _family(name: str):
    """make_family_models.Family for a shape: its _build and _randomise make the weights."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_family_models as mfm

    s = SHAPES[name]
    return mfm, mfm.Family(name, s["model_class"], s["config_class"], dict(s["config"]), s["source"],
                           s["arch"], embed_std=s.get("embed_std", 1.0), seed=s["seed"])


def _logit_std(model, ids: list[int]) -> float:
    """Mean over positions of the logits' standard deviation over the vocabulary."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids]), use_cache=False).logits[0].float()
    return float(logits.std(dim=-1).mean())


def make_hf(name: str) -> None:
    """The HF directory: transformers' model with make_family_models.py's weights, then the final
    norm scaled so the logits' std is LOGIT_STD (logits are linear in that norm's scale: no
    soft-cap in these configs; Gemma stores w and applies 1 + w)."""
    import torch

    mfm, fam = _family(name)
    t0 = time.perf_counter()
    model = mfm._build(fam)
    ids = _prompt(fam.config["vocab_size"])
    before = _logit_std(model, ids)
    norm = model.model.norm.weight
    with torch.no_grad():
        k = LOGIT_STD / before
        if fam.arch.startswith("gemma"):
            norm.copy_((1.0 + norm) * k - 1.0)
        else:
            norm.mul_(k)
    after = _logit_std(model, ids)
    hf_dir = shape_dir(name) / "hf"
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    model.save_pretrained(str(hf_dir))
    mfm._save_tokenizer(hf_dir)
    n = sum(p.numel() for p in model.parameters())
    _write_json(shape_dir(name) / "hf.json", {
        "parameters": n, "logit_std_before_scaling": before, "logit_std": after,
        "final_norm_scale": k, "seconds": time.perf_counter() - t0,
    })
    print(f"{name}: {n:,} parameters; logits' std {before:.3g} -> {after:.3g} (final norm x {k:.3g}); "
          f"{time.perf_counter() - t0:.0f} s")


def _llama_cpp_dir(sdist: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_family_models as mfm

    return mfm._llama_cpp_dir(sdist)


def make_gguf(name: str, sdist: Path) -> None:
    llama_cpp = _llama_cpp_dir(sdist)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(llama_cpp / "gguf-py"), str(llama_cpp)]))
    out = shape_dir(name) / "f32.gguf"
    t0 = time.perf_counter()
    cmd = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(shape_dir(name) / "hf"),
           "--outfile", str(out), "--outtype", "f32"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{name}: convert_hf_to_gguf.py failed:\n{res.stderr[-3000:]}")
    print(f"{name}: {out.name} {out.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.0f} s")


def _llama_quantize(name: str, src: Path, dst: Path, quant: str) -> float:
    """llama.cpp's quantiser, ``src`` -> ``dst`` in ``quant`` (a ``LLAMA_FTYPE_MOSTLY_`` name); seconds."""
    import llama_cpp

    t0 = time.perf_counter()
    qp = llama_cpp.llama_model_quantize_default_params()
    qp.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant}")
    qp.nthread = THREADS
    qp.allow_requantize = True  # a Q4_K_M source (q8_0 without the f32 file)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(qp))
    if rc != 0:
        raise SystemExit(f"{name}: llama_model_quantize returned {rc}")
    return time.perf_counter() - t0


def q8_0(name: str) -> None:
    """``<shape>.Q8_0.gguf`` from the f32 GGUF if it is there, else from the Q4_K_M file."""
    f32 = shape_dir(name) / "f32.gguf"
    src = f32 if f32.exists() else q_path(name)
    if not src.exists():
        raise SystemExit(f"{name}: neither {f32} nor {q_path(name)}: run the hf, gguf and quantize steps first")
    dst = shape_dir(name) / f"{name}.Q8_0.gguf"
    seconds = _llama_quantize(name, src, dst, "Q8_0")
    print(f"{name}: {dst.name} from {src.name}, {dst.stat().st_size / 2**20:.0f} MiB in {seconds:.0f} s")


def quantize(name: str) -> None:
    from gguf import GGUFReader

    src, dst = shape_dir(name) / "f32.gguf", q_path(name)
    seconds = _llama_quantize(name, src, dst, QUANT)
    reader = GGUFReader(dst)
    types: dict[str, int] = {}
    per_tensor = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        per_tensor[t.name] = t.tensor_type.name
    _write_json(shape_dir(name) / "quantize.json", {
        "file": str(dst), "bytes": dst.stat().st_size, "types": types, "tensors": per_tensor,
        "f32_gguf_bytes": src.stat().st_size, "seconds": seconds,
    })
    print(f"{name}: {dst.name} {dst.stat().st_size / 2**20:.0f} MiB in {seconds:.0f} s; types {types}")


def _top5(logits: np.ndarray) -> list[int]:
    """The 5 largest, best first (ties by lower id, as a stable argsort)."""
    return np.argsort(-logits, kind="stable")[:5].tolist()


def run_llamacpp(name: str) -> None:
    import llama_cpp
    from llama_cpp import Llama

    path = q_path(name)
    t0 = time.perf_counter()
    llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=THREADS,
                n_threads_batch=THREADS, logits_all=False, type_k=0, type_v=0, flash_attn=False,
                seed=0, verbose=False)
    load_s = time.perf_counter() - t0
    n_vocab = llm.n_vocab()

    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).copy()

    ids = _prompt(n_vocab)
    t0 = time.perf_counter()
    llm.eval(ids)
    prompt_s = time.perf_counter() - t0
    logits = last_logits()
    np.save(shape_dir(name) / "llamacpp_logits0.npy", logits)
    tokens, steps = [], []
    t0 = time.perf_counter()
    for i in range(N_GREEDY):
        top = _top5(logits)
        tokens.append(top[0])
        steps.append({"top5": top, "top5_logits": logits[top].tolist()})
        if i < N_GREEDY - 1:  # the last token needs no forward pass
            llm.eval([top[0]])
            logits = last_logits()
    decode_s = time.perf_counter() - t0
    _write_json(shape_dir(name) / "llamacpp.json", {
        "prompt": ids, "greedy": tokens, "steps": steps, "n_vocab": n_vocab, "load_s": load_s,
        "prompt_s": prompt_s, "decode_tokens_per_s": (N_GREEDY - 1) / decode_s,
        "settings": f"llama-cpp-python {llama_cpp.__version__}, n_ctx {N_CTX}, F32 KV (type_k = type_v = 0), "
                    f"flash_attn off, n_threads {THREADS}, greedy (argmax of the logits)",
    })
    print(f"{name}: llama.cpp greedy {tokens} ({(N_GREEDY - 1) / decode_s:.1f} tok/s)")


def run_llamacpp_f32(name: str) -> None:
    """llama.cpp's logits at the prompt's last position on the f32 GGUF: with float weights it
    rounds no activation, so the engine's float path must meet it to float32 rounding."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(shape_dir(name) / "f32.gguf"), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX,
                n_threads=THREADS, n_threads_batch=THREADS, logits_all=False, type_k=0, type_v=0,
                flash_attn=False, seed=0, verbose=False)
    n_vocab = llm.n_vocab()
    llm.eval(_prompt(n_vocab))
    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).copy()
    np.save(shape_dir(name) / "llamacpp_f32_logits0.npy", logits)
    print(f"{name}: llama.cpp on f32.gguf, argmax {int(logits.argmax())}")


# ---------------------------------------------------------------- engine side (project venv)


def run_engine_f32(name: str) -> None:
    """The numpy backend on the f32 GGUF against llama.cpp's logits on it, within
    make_family_models.py's bound for the family (float32 sum orders; Gemma's fp16 GELU table)."""
    import llmrs_core as llmrs
    from llmrs_core.testing import normalised_error

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_family_models as mfm

    result: dict[str, Any] = {}
    try:
        want = np.load(shape_dir(name) / "llamacpp_f32_logits0.npy")
        model = llmrs.load(shape_dir(name) / "f32.gguf", backend="numpy")
        got = model.network.forward(_prompt(len(want)), last_only=True)[0]
        bound, why = mfm._llamacpp_bound({**mfm.COMMON, **SHAPES[name]["config"]})
        err = normalised_error(got, want)
        result = {"max_norm_error": err, "bound": bound, "bound_why": why, "within": err <= bound,
                  "argmax_equal": int(got.argmax()) == int(want.argmax())}
        print(f"{name} [numpy, f32.gguf]: max norm error {err:.2e} (bound {bound:.2e})")
    except Exception as e:  # recorded for the report
        result = {"error": f"{type(e).__name__}: {e}"}
        print(f"{name} [numpy, f32.gguf]: {result['error']}")
    _write_json(shape_dir(name) / "f32check.json", result)




def run_engine(name: str, backend: str) -> None:
    """The engine's 16 greedy tokens on the same file and prompt, compared with llama.cpp's.
    Any error (a refused type, a failed load) is recorded, not raised: the report names it."""
    out = shape_dir(name) / f"engine_{backend}.json"
    ref = json.loads((shape_dir(name) / "llamacpp.json").read_text())
    result: dict[str, Any] = {"backend": backend}
    try:
        result.update(_engine_compare(name, backend, ref))
    except Exception as e:  # recorded for the report: the exact error is the finding
        import traceback

        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()[-3000:]
        print(f"{name} [{backend}]: {result['error']}")
    _write_json(out, result)


def _activation_rounding_error(quantized: dict[str, Any]) -> float:
    """The logits' relative rms change that llama.cpp's 8-bit activations explain (the arithmetic of
    tests/core/test_quant_mixes.py): before every quantised product it rounds the input to a step
    of max|x_block| / 127, an rms error of about 3 / (127 sqrt(12)) of rms(x) for Gaussian
    activations in blocks of 256; a product with random W passes it on unchanged, and the P
    products a logit depends on add theirs like a random walk: sqrt(P) * 3 / (127 sqrt(12)).
    P: the file's quantised matrices; token_embd is a look-up unless it is also the output head.
    The engine's int8 path rounds too, in blocks of 32 (not Q8_K's 256): two independent
    roundings, sqrt(2) times this apart."""
    tensors = quantized["tensors"]
    products = sum(t not in ("F32", "F16", "BF16") for t in tensors.values())
    if "output.weight" in tensors and tensors["token_embd.weight"] not in ("F32", "F16", "BF16"):
        products -= 1
    return products**0.5 * 3 / (127 * 12**0.5)


def _nudged_first_step(net: Any, prompt: list[int]) -> np.ndarray:
    """The engine's first-step logits with every embedding value moved by 1e-6 of itself, up or down at
    random: how far differences of float32's size carry through the int8 path's roundings at this
    size (a measurement hook: the backend's ``embed`` is wrapped for one forward pass)."""
    backend, rng = net.backend, np.random.default_rng(0)
    embed = backend.embed

    def nudged(table: Any, ids: np.ndarray) -> np.ndarray:
        e = embed(table, ids)
        return e * (np.float32(1) + np.float32(1e-6) * rng.choice(np.array([-1, 1], np.float32), e.shape))

    backend.embed = nudged
    try:
        return net.forward(prompt, net.new_cache(len(prompt)), last_only=True)[0]
    finally:
        del backend.embed


def _engine_compare(name: str, backend: str, ref: dict[str, Any]) -> dict[str, Any]:
    import llmrs_core as llmrs

    t0 = time.perf_counter()
    # numpy multiplies with BLAS, whose threads come from OPENBLAS_NUM_THREADS (set by _run_step)
    model = llmrs.load(q_path(name), backend=backend, threads=THREADS if backend == "numba" else None)
    net = model.network  # reads the weights
    load_s = time.perf_counter() - t0
    warm_s = net.warm_up()
    prompt = ref["prompt"]

    def greedy(forced: list[int] | None) -> tuple[list[int], list[np.ndarray], float, float]:
        """N_GREEDY tokens: our argmax each step, or (forced) llama.cpp's tokens fed back."""
        cache = net.new_cache(len(prompt) + N_GREEDY)
        t0 = time.perf_counter()
        logits = net.forward(prompt, cache, last_only=True)[0]
        prompt_s = time.perf_counter() - t0
        tokens, steps = [], []
        t0 = time.perf_counter()
        for i in range(N_GREEDY):
            steps.append(np.asarray(logits, dtype=np.float32))
            tokens.append(int(np.argmax(logits)))
            if i < N_GREEDY - 1:
                nxt = forced[i] if forced is not None else tokens[-1]
                logits = net.forward([nxt], cache, last_only=True)[0]
        return tokens, steps, prompt_s, time.perf_counter() - t0

    tokens, steps, prompt_s, decode_s = greedy(None)
    theirs = ref["greedy"]
    first = next((i for i, (a, b) in enumerate(zip(tokens, theirs)) if a != b), None)
    rule = None
    if first is not None:
        rule = theirs[first] in _top5(steps[first]) and tokens[first] in ref["steps"][first]["top5"]
    # the rule at every step on the same contexts: our engine fed llama.cpp's tokens
    forced_tokens, forced_steps = (tokens, steps) if first is None else greedy(theirs)[:2]
    per_step = [theirs[i] in _top5(forced_steps[i]) and forced_tokens[i] in ref["steps"][i]["top5"]
                for i in range(N_GREEDY)]
    l0 = np.load(shape_dir(name) / "llamacpp_logits0.npy")
    d0 = steps[0] - l0
    rms = float(np.sqrt(np.mean(l0.astype(np.float64) ** 2)))
    nudge = steps[0] - _nudged_first_step(net, prompt)
    explained = _activation_rounding_error(json.loads((shape_dir(name) / "quantize.json").read_text()))
    gaps = [s["top5_logits"][0] - s["top5_logits"][1] for s in ref["steps"]]
    result = {
        "greedy": tokens, "tokens_equal": sum(a == b for a, b in zip(tokens, theirs)),
        "first_divergence": first, "top5_rule_at_first_divergence": rule,
        "forced_top1_equal": sum(a == b for a, b in zip(forced_tokens, theirs)),
        "top5_rule_every_step": all(per_step), "top5_rule_per_step": per_step,
        "step1_max_norm_error": float(np.abs(d0).max() / np.abs(l0).max()),
        "step1_rms_norm_error": float(np.sqrt(np.mean(d0.astype(np.float64) ** 2)) / np.abs(l0).max()),
        "step1_logit_std": float(l0.std()),
        # rms(ours - llama.cpp) / rms(llama.cpp) against what llama.cpp's activation rounding explains
        "step1_rms_error_over_rms": float(np.sqrt(np.mean(d0.astype(np.float64) ** 2)) / rms),
        "activation_rounding_rms": explained,
        # rms(ours - ours with the embeddings nudged by 1e-6) / rms(llama.cpp): the floor no two
        # float32 engines can go below once one 8-bit code rounds otherwise
        "step1_self_nudge_rms_over_rms": float(np.sqrt(np.mean(nudge.astype(np.float64) ** 2)) / rms),
        "step1_within_3_sigma": bool(np.sqrt(np.mean(d0.astype(np.float64) ** 2)) / rms
                                     <= 3 * explained * (2**0.5 if "decode: int8" in model.backend_report() else 1.0)),
        "llamacpp_min_top1_top2_gap": float(min(gaps)),
        "load_s": load_s, "warm_up_s": warm_s, "prompt_s": prompt_s,
        "decode_tokens_per_s": (N_GREEDY - 1) / decode_s,
        "backend_report": model.backend_report(),
    }
    print(f"{name} [{backend}]: tokens equal {result['tokens_equal']}/{N_GREEDY}, first divergence {first}, "
          f"step-1 error {result['step1_max_norm_error']:.2e} (rms {result['step1_rms_error_over_rms']:.3f}; "
          f"ours nudged by 1e-6: {result['step1_self_nudge_rms_over_rms']:.3f}), load {load_s:.1f} s, "
          f"{result['decode_tokens_per_s']:.1f} tok/s")
    return result


# ---------------------------------------------------------------- orchestration and report


def _run_step(args: list[str], python: str, log: dict[str, Any], label: str) -> bool:
    """One step in its own process (one model in memory at a time); its failure is recorded."""
    t0 = time.perf_counter()
    # OMP_WAIT_POLICY: llama.cpp's OpenMP threads spin between ops; on a machine whose cores are
    # shared with other work that made it 6x slower here (1.4 against 9.1 tokens/s, Qwen2.5-0.5B)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS),
               OMP_WAIT_POLICY="PASSIVE")
    res = subprocess.run([python, str(Path(__file__).resolve()), *args], text=True, env=env,
                         stdout=sys.stdout, stderr=subprocess.PIPE)
    if res.stderr:
        sys.stderr.write(res.stderr[-4000:])
    if res.returncode != 0:
        log[label] = f"exit {res.returncode} after {time.perf_counter() - t0:.0f} s: {res.stderr[-2000:]}"
        print(f"  {label} failed (exit {res.returncode})")
        return False
    return True


def run_all(names: list[str], backends: list[str], sdist: Path, engine_py: str, keep: bool,
            force: bool) -> int:
    for name in names:
        failures: dict[str, Any] = {}
        shape_dir(name).mkdir(parents=True, exist_ok=True)
        ok = True
        # resumable: a step runs when its output is missing (or with --force)
        f32, hf = shape_dir(name) / "f32.gguf", shape_dir(name) / "hf" / "config.json"
        if force or not q_path(name).exists():
            if force or not (f32.exists() or hf.exists()):
                ok = _run_step(["hf", "--shape", name], sys.executable, failures, "hf")
            if ok and (force or not f32.exists()):
                ok = _run_step(["gguf", "--shape", name, "--sdist", str(sdist)], sys.executable, failures, "gguf")
            if ok:
                ok = _run_step(["quantize", "--shape", name], sys.executable, failures, "quantize")
        if ok and name in Q8_0_SHAPES and (force or not (shape_dir(name) / f"{name}.Q8_0.gguf").exists()):
            _run_step(["q8_0", "--shape", name], sys.executable, failures, "q8_0")
        if ok and (force or not (shape_dir(name) / "llamacpp.json").exists()):
            ok = _run_step(["llamacpp", "--shape", name], sys.executable, failures, "llamacpp")
        if ok:
            for backend in backends:
                _run_step(["engine", "--shape", name, "--backend", backend], engine_py, failures,
                          f"engine_{backend}")
        if f32.exists() and (force or not (shape_dir(name) / "f32check.json").exists()):
            if _run_step(["llamacpp-f32", "--shape", name], sys.executable, failures, "llamacpp-f32"):
                _run_step(["engine-f32", "--shape", name], engine_py, failures, "engine-f32")
        if not keep:  # 2-5 GB each; the Q4_K_M file stays for issue 30
            f32.unlink(missing_ok=True)
            shutil.rmtree(shape_dir(name) / "hf", ignore_errors=True)
        _write_json(shape_dir(name) / "failures.json", failures)
        gc.collect()
    return report(list(SHAPES))


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def report(names: list[str]) -> int:
    """Writes REPORT, prints the table; returns how many rows failed. A row passes when the top-5
    rule holds at every step along llama.cpp's tokens, the first step's error is within 3 sigma
    of what llama.cpp's activation rounding explains, and the f32 check (where run) is within
    its bound. Equal greedy tokens are reported, not required: see the README."""
    rows, data, failed = [], {}, 0
    for name in names:
        d = shape_dir(name)
        entry = {"config": SHAPES[name]["config"], "source": SHAPES[name]["source"],
                 "hf": _load(d / "hf.json"), "quantize": _load(d / "quantize.json"),
                 "llamacpp": _load(d / "llamacpp.json"), "failures": _load(d / "failures.json"),
                 "f32_check": _load(d / "f32check.json"),
                 "engine": {}}
        if entry["quantize"]:
            entry["quantize"].pop("tensors", None)
        for path in sorted(d.glob("engine_*.json")):
            entry["engine"][path.stem.removeprefix("engine_")] = _load(path)
        data[name] = entry
        q, lc, f32 = entry["quantize"], entry["llamacpp"], entry["f32_check"]
        f32_cell = "-" if not f32 else f32.get("error", "")[:40] or f"{f32['max_norm_error']:.1e} / {f32['bound']:.0e}"
        base = [name, f"{q['bytes'] / 2**20:.0f} MiB" if q else "-",
                ",".join(f"{k}:{v}" for k, v in sorted(q["types"].items())) if q else "-", f32_cell]
        if not entry["engine"]:
            failed += 1
            rows.append(base + ["-"] * 8 + [json.dumps(entry["failures"])[:80] if entry["failures"] else "not run"])
        for backend, e in entry["engine"].items():
            lc_tps = f"{lc['decode_tokens_per_s']:.1f}" if lc else "-"
            if "error" in e:
                failed += 1
                rows.append(base + [backend] + ["-"] * 6 + [lc_tps, "FAIL: " + e["error"][:100]])
                continue
            first = "-" if e["first_divergence"] is None else (
                f"{e['first_divergence']} ({'top-5 ok' if e['top5_rule_at_first_divergence'] else 'top-5 FAIL'})")
            why = [w for w, bad in (("top-5 rule fails at a step", not e["top5_rule_every_step"]),
                                    ("step-1 error beyond 3 sigma", not e["step1_within_3_sigma"]),
                                    ("f32 beyond bound", bool(f32) and not f32.get("within", False)))
                   if bad]
            failed += bool(why)
            rows.append(base + [backend, f"{e['tokens_equal']}/{N_GREEDY}", first,
                                f"{e['step1_max_norm_error']:.1e}",
                                f"{e['step1_rms_error_over_rms']:.3f} / {e['activation_rounding_rms']:.3f}"
                                + (f" (nudge {e['step1_self_nudge_rms_over_rms']:.3f})"
                                   if "step1_self_nudge_rms_over_rms" in e else ""),
                                f"{e['load_s']:.1f}",
                                f"{e['decode_tokens_per_s']:.1f}", lc_tps,
                                "PASS" if not why else "FAIL: " + "; ".join(why)])
    meta = {"n_prompt": N_PROMPT, "n_greedy": N_GREEDY, "n_ctx": N_CTX, "threads": THREADS, "quant": QUANT,
            "logit_std": LOGIT_STD, "cache": str(CACHE), "machine": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    _write_json(REPORT, {"meta": meta, "shapes": data})
    head = ["shape", "file", "tensor types", "f32 err / bound", "backend", "tokens equal", "first divergence",
            "step-1 max err", "step-1 rms err / explained", "load s", "ours tok/s", "llama.cpp tok/s", "verdict"]
    table = [head] + rows
    widths = [max(len(str(r[i])) for r in table) for i in range(len(head))]
    for r in table:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print(f"wrote {REPORT}; {failed} row(s) failed" if failed else f"wrote {REPORT}; every row passed")
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["all", "hf", "gguf", "quantize", "q8_0", "llamacpp", "engine", "llamacpp-f32",
                                         "engine-f32", "report"])
    parser.add_argument("--shape", action="append", choices=list(SHAPES), help="repeatable; default: all")
    parser.add_argument("--backend", action="append", choices=["numba", "numpy"],
                        help="engine backends (repeatable; default: numba and numpy)")
    parser.add_argument("--sdist", type=Path, default=DEFAULT_SDIST,
                        help="llama-cpp-python 0.3.36 sdist (.tar.gz or unpacked), for its converter")
    parser.add_argument("--engine-python", default=str(DEFAULT_ENGINE_PY),
                        help="the project venv's python, which runs the engine steps")
    parser.add_argument("--keep", action="store_true", help="keep the HF dir and the f32 GGUF")
    parser.add_argument("--force", action="store_true", help="rebuild files that exist")
    args = parser.parse_args()
    names = args.shape or list(SHAPES)
    backends = args.backend or ["numba", "numpy"]
    if args.step == "all":
        if not args.sdist.exists():
            parser.error(f"{args.sdist}: no llama-cpp-python sdist (pip download --no-deps --no-binary :all: "
                         "llama-cpp-python==0.3.36, then --sdist PATH or LLMRS_LLAMA_CPP_SDIST)")
        sys.exit(1 if run_all(names, backends, args.sdist, args.engine_python, args.keep, args.force) else 0)
    elif args.step == "report":
        sys.exit(1 if report(names) else 0)
    else:
        for name in names:
            if args.step == "hf":
                make_hf(name)
            elif args.step == "gguf":
                make_gguf(name, args.sdist)
            elif args.step == "quantize":
                quantize(name)
            elif args.step == "q8_0":
                q8_0(name)
            elif args.step == "llamacpp":
                run_llamacpp(name)
            elif args.step == "llamacpp-f32":
                run_llamacpp_f32(name)
            elif args.step == "engine-f32":
                run_engine_f32(name)
            else:
                for backend in backends:
                    run_engine(name, backend)


if __name__ == "__main__":
    main()
