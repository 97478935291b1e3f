"""Chapter 11 solutions: the engine's distributed layer and server (llmrs_core.distributed, llmrs_core.server)."""

from __future__ import annotations

# -- Exercise 11.5 ----------------------------------------------------------------------

# -- Exercise 11.6 ----------------------------------------------------------------------
