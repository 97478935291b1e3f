"""One core kept busy on purpose: the ``--contention`` half of ``llmrs bench speed`` (issue 18).

A learner's laptop is rarely idle: a browser tab, an IDE's indexer or a build
takes a core while the engine runs. :func:`busy_core` starts one CPU-bound
process (a pure-Python loop, no I/O), pinned to one core, for the length of
a ``with`` block, and stops it however the block ends; the benchmark measures
every engine inside it and reports each figure's loss against the quiet run
(quiet / contended: 1.0 is no loss, 2.5 the issue's limit).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

#: what the busy process runs: compute forever, until it is terminated
_SPIN = "while True:\n    pass\n"


def can_pin() -> str | None:
    """Why a process cannot be pinned to a core here (a sentence), or None if it can."""
    if not hasattr(os, "sched_setaffinity"):
        return f"this platform ({sys.platform}) has no sched_setaffinity"
    if len(os.sched_getaffinity(0)) < 2:
        return "this process may use only one core: a busy one would leave the engine nothing"
    return None


@contextmanager
def busy_core(core: int | None = None):
    """Run a CPU-bound process pinned to ``core`` (default: the lowest this process may use) while
    the block runs; yields the core. ``ValueError`` (what the command line reports as one line) if
    it cannot be pinned here (:func:`can_pin`)."""
    reason = can_pin()
    if reason:
        raise ValueError(f"--contention needs a core to keep busy: {reason}")
    core = min(os.sched_getaffinity(0)) if core is None else core
    proc = subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    try:
        time.sleep(0.2)  # let it start computing before anything is timed
        if proc.poll() is not None:
            raise RuntimeError(f"the busy process exited at once (status {proc.returncode})")
        yield core
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def losses(quiet: dict, contended: dict) -> dict:
    """``{engine: {"pp", "tg"}}``: quiet tokens/s over contended tokens/s, for engines measured both ways."""
    return {name: {k: quiet[name][k]["tokens_per_s"] / contended[name][k]["tokens_per_s"] for k in ("pp", "tg")}
            for name in quiet if name in contended}


__all__ = ["busy_core", "can_pin", "losses"]
