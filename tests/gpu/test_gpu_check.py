"""scripts/gpu_check.py on a machine without a GPU: every GPU step skipped with its reason,
the table printed last, the JSON written (so that the one GPU run is not spent on a typo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrs_core.kernels.gpu import runtime

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(runtime.driver_gpu_count() > 0, reason="a GPU is here: the check would really run")
def test_without_a_gpu_the_check_skips_and_still_reports(tmp_path):
    out = tmp_path / "check.json"
    env = {k: v for k, v in os.environ.items() if k != runtime.SIMULATOR_ENV}
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--output", str(out)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    results = json.loads(out.read_text())
    steps = {"tests", "launch", "memory_pool", "fusion", "smollm2", "bench", "matvec", "graphs", "transformers"}
    assert steps <= set(results)
    assert all(results[s]["status"] == "skipped" and "no NVIDIA GPU" in results[s]["why"] for s in steps)
    lines = run.stdout.strip().splitlines()
    assert lines[-1].startswith("(all figures:") and any(line.startswith("tg") for line in lines[-6:]), run.stdout


def test_the_synthetic_model_has_smollm2s_shapes_and_types():
    """--synthetic stands in for SmolLM2 on a GPU machine the file cannot reach: its speed figures
    mean something only if its shapes and stored types are SmolLM2's (the fetched file's)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from llmrs_core.formats.gguf import read_gguf

    real = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not real.is_file():
        pytest.skip("SmolLM2 is not fetched (make fetch)")
    c = read_gguf(real).config
    shape = gpu_check.SMOLLM2_SHAPE
    assert (c.hidden_size, c.intermediate_size, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size) == (
        shape["hidden_size"], shape["intermediate_size"], shape["n_layers"], shape["n_heads"], shape["n_kv_heads"],
        shape["vocab_size"])
    assert (c.rope_theta, c.tie_embeddings) == (shape["rope_theta"], True)
    types = {n: t.ggml_type.name for n, t in read_gguf(real).tensors.items()}
    assert types["token_embd.weight"] == "Q8_0" and {types[n] for n in types if n.startswith("blk.") and
                                                      not n.endswith("norm.weight")} == {"Q4_1"}
