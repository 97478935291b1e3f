"""GPU kernel and cuda-backend tests (chapter 9): on an NVIDIA GPU when the driver has one,
else in numba-cuda's CUDA simulator.

The simulator must be chosen before anything imports ``numba.cuda``; pytest imports this
file before the test modules of this folder, and nothing earlier in a run imports
``numba.cuda`` (``make test-gpu`` runs this folder in a process of its own). These tests
are engine tests: marked ``core``, so the stub check (``-m "not core"``) leaves them out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmrs_core.kernels.gpu import runtime

SIMULATOR = runtime.use_simulator_unless_gpu()
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.core)


def pytest_report_header(config: pytest.Config) -> str:
    return f"GPU kernels: {'CUDA simulator (no GPU found)' if SIMULATOR else 'NVIDIA GPU'}"
