"""Chapter 9 solutions: the engine's GPU kernels and memory pool (llmrs_core.kernels.gpu)."""

from __future__ import annotations

# -- Exercise 9.7 ---------------------------------------------------------------------

# -- Exercise 9.8 ---------------------------------------------------------------------

# -- Exercise 9.9 ---------------------------------------------------------------------
