"""The CPU backend's heap settings (kernels/cpu/heap.py): glibc keeps a prompt's large freed
temporaries for the next product instead of unmapping them (each would be faulted in again)."""

from __future__ import annotations

import ctypes
import platform

import pytest

from llmrs_core.kernels.cpu import heap

pytestmark = pytest.mark.core


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_glibc_takes_both_thresholds(monkeypatch):
    for name in heap.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert heap._set_thresholds(), "glibc refused a threshold: the mmap one must be at most 32 MiB on 64-bit"


def test_a_users_own_malloc_settings_are_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert heap._set_thresholds() is False


def test_no_mallopt_is_no_error(monkeypatch):
    """Another C library (musl, macOS's) has no mallopt, or none to load: the backend runs without."""
    for name in heap.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)

    def missing(*args, **kwargs):
        raise OSError("no C library")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert heap._set_thresholds() is False


def test_the_numba_backend_sets_them_once(monkeypatch):
    from llmrs_core.backends.numba_backend import NumbaBackend

    calls = []
    monkeypatch.setattr(heap, "_applied", None)
    monkeypatch.setattr(heap, "_set_thresholds", lambda: calls.append(1) or True)
    NumbaBackend(threads=1)
    NumbaBackend(threads=1)
    assert calls == [1]
