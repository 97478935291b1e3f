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
    steps = {"tests", "memory_pool", "fusion", "smollm2", "bench", "matvec", "graphs", "transformers"}
    assert steps <= set(results)
    assert all(results[s]["status"] == "skipped" and "no NVIDIA GPU" in results[s]["why"] for s in steps)
    lines = run.stdout.strip().splitlines()
    assert lines[-1].startswith("(all figures:") and any(line.startswith("tg") for line in lines[-6:]), run.stdout
