"""Capture golden reference outputs from software no one here wrote.

The test suite compares llmrs_core with these files, so it never needs the
references installed. Run this script in a throwaway environment that has
them, never in the project's own (they are large and not dependencies)::

    python -m venv /tmp/ref-venv
    /tmp/ref-venv/bin/pip install torch==2.13.0 transformers gguf accelerate numpy
    /tmp/ref-venv/bin/python scripts/capture_golden.py config

Steps (each writes into tests/golden/):

    config     Hugging Face transformers' LlamaConfig for SmolLM2, as transformers
               itself builds it from the GGUF file -> smollm2_hf_config.json
    hf         transformers running SmolLM2 in float32 (it dequantises the GGUF):
               token ids, last-position log-probabilities, per-position argmax,
               and greedy continuations -> smollm2_hf_golden.npz
    torchbin   a small state dict saved by torch.save (float32, float16, bfloat16,
               int64, a transposed view, two tensors sharing one storage, an
               nn.Parameter) -> torch_checkpoint.bin, and its values as
               torch_checkpoint.npz, for the restricted .bin loader
    llamacpp   llama.cpp through llama-cpp-python (pip install llama-cpp-python):
               greedy continuations with top-5 log-probabilities at each step
               -> smollm2_llamacpp_golden.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path() -> Path:
    sys.path.insert(0, str(REPO))
    from llmrs_core.fetch import model_dir

    path = model_dir() / MODEL_FILE
    if not path.exists():
        sys.exit(f"{path} is missing: run `make fetch` (or `llmrs fetch`) first")
    return path


def capture_config() -> None:
    import transformers
    from transformers import AutoConfig

    path = model_path()
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    data = config.to_dict()
    keep = {
        k: data[k]
        for k in (
            "model_type", "vocab_size", "hidden_size", "intermediate_size",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "max_position_embeddings", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
            "head_dim", "bos_token_id", "eos_token_id", "rope_parameters",
        )
        if k in data
    }
    keep["_captured_with"] = f"transformers {transformers.__version__} AutoConfig from {MODEL_FILE}"
    out = GOLDEN / "smollm2_hf_config.json"
    out.write_text(json.dumps(keep, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")


# The prompts every golden file covers; tests/core/test_model_golden.py uses the same list.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat are the three primary colors?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea, there lived",
]
N_GREEDY = 32


def capture_hf() -> None:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    out: dict[str, np.ndarray] = {}
    for i, prompt in enumerate(PROMPTS):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            greedy = model.generate(
                torch.tensor([ids]), max_new_tokens=N_GREEDY, do_sample=False, pad_token_id=tok.eos_token_id
            )[0, len(ids) :]
        out[f"ids_{i}"] = np.array(ids, dtype=np.int32)
        # the 1,024 most likely next tokens and 1,024 others from the tail, to keep the file small
        last = logprobs[-1].numpy().astype(np.float32)
        top = np.argsort(-last)[:1024]
        rest = np.setdiff1d(np.arange(last.size), top)
        tail = np.random.default_rng(i).choice(rest, 1024, replace=False)
        sample = np.concatenate([top, np.sort(tail)]).astype(np.int32)
        out[f"last_ids_{i}"] = sample
        out[f"last_logprobs_{i}"] = last[sample]
        out[f"argmax_{i}"] = logprobs.argmax(-1).numpy().astype(np.int32)
        out[f"max_logprob_{i}"] = logprobs.max(-1).values.numpy().astype(np.float32)
        out[f"greedy_{i}"] = greedy.numpy().astype(np.int32)
        print(f"prompt {i}: {len(ids)} tokens -> {tok.decode(greedy)!r}")
    out["prompts"] = np.array(PROMPTS)
    out["captured_with"] = np.array(
        f"transformers {transformers.__version__}, torch {torch.__version__}, float32, {MODEL_FILE}"
    )
    dest = GOLDEN / "smollm2_hf_golden.npz"
    np.savez_compressed(dest, **out)
    print(f"wrote {dest} ({dest.stat().st_size:,} bytes)")


def capture_llamacpp() -> None:
    import math

    import llama_cpp
    from llama_cpp import Llama

    path = model_path()
    llm = Llama(model_path=str(path), n_ctx=512, n_threads=2, logits_all=True, verbose=False, seed=0)
    runs = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        steps = []
        for _ in range(N_GREEDY):
            logits = llm.scores[llm.n_tokens - 1]
            m = max(logits)
            lse = m + math.log(sum(math.exp(x - m) for x in logits))
            top = sorted(range(len(logits)), key=lambda j: -logits[j])[:5]
            steps.append({"top5": top, "top5_logprobs": [float(logits[j] - lse) for j in top]})
            llm.eval([top[0]])
        runs.append({"prompt": prompt, "ids": ids, "greedy": [s["top5"][0] for s in steps], "steps": steps})
        print(f"{len(ids)} tokens -> {llm.detokenize([s['top5'][0] for s in steps]).decode(errors='replace')!r}")
    data = {
        "captured_with": f"llama-cpp-python {llama_cpp.__version__}, n_threads=2, {MODEL_FILE}",
        "runs": runs,
    }
    dest = GOLDEN / "smollm2_llamacpp_golden.json"
    dest.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {dest} ({dest.stat().st_size:,} bytes)")


def capture_torchbin() -> None:
    import collections

    import numpy as np
    import torch

    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 4, generator=g)
    state = collections.OrderedDict(
        [
            ("model.embed.weight", torch.randn(5, 3, generator=g)),
            ("model.half", torch.randn(7, generator=g).half()),
            ("model.bf16", torch.randn(2, 3, generator=g).bfloat16()),
            ("model.ids", torch.arange(4, dtype=torch.int64)),
            ("model.transposed", base.t()),  # a non-contiguous view
            ("model.rows", base[2:4]),  # shares base's storage, with an offset
            ("model.param", torch.nn.Parameter(torch.ones(2, 2))),
            ("model.scalar", torch.tensor(3.5)),
        ]
    )
    dest = GOLDEN / "torch_checkpoint.bin"
    torch.save(state, dest)
    values = {k.replace(".", "__"): v.detach().float().numpy() if v.dtype == torch.bfloat16 else v.detach().numpy()
              for k, v in state.items()}
    np.savez_compressed(GOLDEN / "torch_checkpoint.npz", **values)
    print(f"wrote {dest} ({dest.stat().st_size:,} bytes) with torch {torch.__version__}")


STEPS = {"config": capture_config, "hf": capture_hf, "llamacpp": capture_llamacpp, "torchbin": capture_torchbin}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="+", choices=sorted(STEPS))
    args = parser.parse_args()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for step in args.steps:
        STEPS[step]()


if __name__ == "__main__":
    main()
