"""Chapter 9's kernels run on an NVIDIA GPU when the driver has one, else in numba-cuda's CUDA
simulator. The choice must come before anything imports ``numba.cuda``: pytest imports this
file while collecting tests/ch09, before any test runs (and the exercise modules import
``numba.cuda`` only when a test asks for them). Nothing collected earlier imports it.
"""

from __future__ import annotations

from llmrs_core.kernels.gpu import runtime

SIMULATOR = runtime.use_simulator_unless_gpu()
