"""How much memory there is, so that an impossible allocation is refused with the numbers.

A KV pool of ``10**9`` blocks is a typo, not a plan: asking NumPy for it
gets the process killed by the kernel's OOM killer (no message at all) or a
bare ``MemoryError``. :func:`check_host_allocation` compares the bytes with
what the machine has available first and says both.
"""

from __future__ import annotations

import os


def available_host_bytes() -> int | None:
    """Memory available to a new allocation (Linux ``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_host_allocation(nbytes: int, what: str) -> None:
    """``ValueError`` naming ``what``, its size and the memory available, if it cannot fit."""
    available = available_host_bytes()
    if available is not None and nbytes > available:
        raise ValueError(f"{what} needs {_gib(nbytes)}, but this machine has {_gib(available)} of memory available")


__all__ = ["available_host_bytes", "check_host_allocation"]
