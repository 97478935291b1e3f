"""Capture golden reference outputs from software no one here wrote.

The test suite compares llmrs_core with these files, so it never needs the
references installed. Run this script in a throwaway environment that has
them, never in the project's own (they are large and not dependencies)::

    python -m venv /tmp/ref-venv
    /tmp/ref-venv/bin/pip install torch==2.13.0 transformers gguf accelerate numpy
    /tmp/ref-venv/bin/python scripts/capture_golden.py config

Steps (each writes into tests/golden/):

    config   Hugging Face transformers' LlamaConfig for SmolLM2, as transformers
             itself builds it from the GGUF file -> smollm2_hf_config.json

Later chapters add steps here (logits, greedy continuations, llama.cpp).
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


STEPS = {"config": capture_config}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="+", choices=sorted(STEPS))
    args = parser.parse_args()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for step in args.steps:
        STEPS[step]()


if __name__ == "__main__":
    main()
