"""Chapter 11 solutions: the engine's distributed layer and server (llmrs_core.distributed, llmrs_core.server)."""

from __future__ import annotations

# each exercise's region adds its names
__all__: list[str] = []

# -- Exercise 11.5 ----------------------------------------------------------------------

# -- Exercise 11.6 ----------------------------------------------------------------------

from llmrs_core.server.sse import sse_event, sse_events  # noqa: E402

__all__ += ["sse_event", "sse_events"]
