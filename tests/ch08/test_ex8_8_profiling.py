"""Exercise 8.8 — CPU Profiling: the hotspots of one forward pass, from cProfile, on a tiny
random Llama stored in Q4_1 (like SmolLM2) and run by the numba backend."""

from __future__ import annotations

import sys

import pytest

import llmrs_core as llmrs
from llmrs_core.formats.gguf_writer import TensorToWrite, write_gguf
from llmrs_core.quant.ggml_blocks import quantize
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import TINY_LLAMA, tiny_llama_metadata, tiny_llama_tensors

PARAMS = {**TINY_LLAMA, "hidden_size": 64, "intermediate_size": 128}
IDS = [3, 14, 15, 9, 26]


@pytest.fixture(scope="module")
def tiny_numba(tmp_path_factory):
    """A tiny Llama, its matrices in Q4_1 and its embedding in Q8_0, on the numba backend."""
    tensors = {}
    for name, array in tiny_llama_tensors(**PARAMS, seed=12).items():
        if array.ndim == 2:
            kind = GGMLType.Q8_0 if name == "token_embd.weight" else GGMLType.Q4_1
            array = TensorToWrite(array.shape, kind, quantize(array, kind).tobytes())
        tensors[name] = array
    path = tmp_path_factory.mktemp("ch08") / "tiny-q4_1.gguf"
    write_gguf(path, tiny_llama_metadata(**PARAMS), tensors)
    return llmrs.load(path, backend="numba")


def test_ex8_8_hotspots_sorted_by_own_time_with_shares(ex, tiny_numba):
    hotspots = ex.profile_forward(tiny_numba, IDS, top=10)
    assert isinstance(hotspots, list) and hotspots, "profile_forward should return a non-empty list of Hotspot"
    assert all(isinstance(h, ex.Hotspot) for h in hotspots), "return Hotspot objects (from llmrs_core.profiling)"
    assert len(hotspots) <= 10, f"top=10 asks for at most 10 hotspots, got {len(hotspots)}"
    seconds = [h.seconds for h in hotspots]
    assert seconds == sorted(seconds, reverse=True), "sort by own time (seconds), largest first"
    for h in hotspots:
        assert h.seconds > 0, f"{h.name}: own time should be > 0 (leave out functions with none)"
        assert 0 < h.share <= 1, f"{h.name}: share {h.share} should be in (0, 1]"
        assert isinstance(h.calls, int) and h.calls >= 1, f"{h.name}: calls should be a count >= 1, got {h.calls!r}"
    assert sum(h.share for h in hotspots) <= 1 + 1e-9, "the shares of the top functions add up to at most 1"
    totals = [h.seconds / h.share for h in hotspots]
    assert max(totals) - min(totals) <= 1e-9 + 1e-6 * max(totals), (
        "share should be seconds / (the total own time of the whole profile) — the same total for every row"
    )


def test_ex8_8_names_say_where_each_function_lives(ex, tiny_numba):
    hotspots = ex.profile_forward(tiny_numba, IDS, top=30)
    for h in hotspots:
        where, sep, function = h.name.partition(":")
        assert sep and where and function, f"{h.name!r}: name it 'file:function' (function_name does it)"
    assert not any("_lsprof" in h.name for h in hotspots), "leave out the profiler's own `disable` call"


def test_ex8_8_the_matmul_kernel_is_among_the_hotspots(ex, tiny_numba):
    hotspots = ex.profile_forward(tiny_numba, IDS, top=30, repeat=3)
    names = [h.name for h in hotspots]
    kernels = ("kernels/cpu/matmul.py:", "kernels/cpu/int8.py:")  # the float kernels, the int8 decode path
    assert any(k in n for n in names for k in kernels), (
        "a forward pass on the numba backend runs the matrix kernels of kernels/cpu/matmul.py (or of "
        f"kernels/cpu/int8.py, its int8 decode path); none is among the hotspots found: {names}"
    )


def test_ex8_8_counts_the_profiled_passes_only(ex, tiny_numba):
    n_norms = 2 * PARAMS["n_layers"] + 1  # two per layer, one before the output
    for repeat in (1, 3):
        hotspots = ex.profile_forward(tiny_numba, IDS, top=200, repeat=repeat)
        norms = [h for h in hotspots if h.name.endswith("numba_backend.py:rms_norm")]
        assert norms, f"the backend's rms_norm is missing from the hotspots: {[h.name for h in hotspots]}"
        assert norms[0].calls == n_norms * repeat, (
            f"repeat={repeat}: rms_norm was called {norms[0].calls} times in the profile, a pass calls it "
            f"{n_norms} times — profile exactly `repeat` passes, and the warm-up pass outside the profiler"
        )


def test_ex8_8_top_and_repeat_are_checked_and_the_profiler_stops(ex, tiny_numba):
    three = ex.profile_forward(tiny_numba, IDS, top=3)
    assert len(three) == 3, f"top=3 asks for 3 hotspots, got {len(three)}"
    assert sum(h.share for h in three) < 1 - 1e-6, (
        "the top 3 functions add up to 100%: share should be relative to the whole profile "
        "(Stats.total_tt), not to the rows returned"
    )
    assert sys.getprofile() is None, "the profiler is still running: call profiler.disable() (in a finally)"
    for bad in ({"top": 0}, {"repeat": 0}):
        with pytest.raises(ValueError):
            ex.profile_forward(tiny_numba, IDS, **bad)


def test_ex8_8_accepts_the_network_itself(ex, tiny_numba):
    hotspots = ex.profile_forward(tiny_numba.network, IDS, top=5)
    assert len(hotspots) == 5, "model may also be the network (model.network): use getattr(model, 'network', model)"
