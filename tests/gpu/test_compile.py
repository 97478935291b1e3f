"""Every GPU kernel compiles for a real GPU (sm_90, the H100/H200), checked without one (chapter 9).

The simulator runs kernels as Python and never types them: a kernel can pass every
simulator test and still fail to compile (a float64 where float32 was meant, an
unsupported call). ``compile_ptx`` needs the real CUDA target, which this process may
not have (the simulator is on), so the check runs in a process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys


def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run(
        [sys.executable, "-m", "llmrs_core.kernels.gpu.compile_check", "--cc", "9.0"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, f"kernels that do not compile for sm_90:\n{run.stdout}{run.stderr}"
    assert run.stdout.count("ok ") >= 15, run.stdout
