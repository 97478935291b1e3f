"""Chapter 8's tests name each known mistake: proven by planting it.

As for chapter 3 (test_diagnose_ch03.py): each mistake is planted in a copy of
the solution — the engine's Q4 kernel (``kernels.cpu.matmul.q4_matvec``), the
8.6 wrapper or the profiler (``profiling.profile_forward``) recompiled from its source
with one edit (:func:`llmrs_core.testing.plant`) — and the chapter 8 test named after
the mistake must fail with its own message. Kernels with a wrong product run as plain
Python (the ``@njit`` line is edited away: ``prange`` is then ``range``), on small
shapes; the mistakes only Numba shows (a type it cannot compile, float64 in the
assembly, no fastmath, a strided or float64 ``x``) are compiled, a few seconds each.
"""

from __future__ import annotations

import pytest
from numba import njit

import llmrs_core as llmrs
from llmrs_core import profiling
from llmrs_core.formats.gguf_writer import TensorToWrite, write_gguf
from llmrs_core.kernels.cpu import matmul
from llmrs_core.kernels.cpu.inspect import packed_fma_unavailable
from llmrs_core.quant.ggml_blocks import quantize
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import chapter_tests, plant, solution_with, tiny_llama_metadata, tiny_llama_tensors
from llmrs_core.testing import failure_message as failure

T86 = chapter_tests(8, "test_ex8_6_simd_matvec.py")
T87 = chapter_tests(8, "test_ex8_7_parallel_matvec.py")
T88 = chapter_tests(8, "test_ex8_8_profiling.py")
# the chapter's ``compiled`` fixture as the learner's run has it: Numba's TypingError told in the exercise's terms
learner_compiled = chapter_tests(8, "conftest.py").call_compiled
SOLUTION = solution_with(8)


def compiled(name, fn, *args):
    """The chapter's ``compiled`` fixture, for kernels that need no compiling."""
    return fn(*args)


DECORATOR = ("@njit(parallel=True, fastmath=True, cache=True)\n", "")
LOW = "xl0, xl1, xl2, xl3 = x[32 * b + j], x[32 * b + j + 1], x[32 * b + j + 2], x[32 * b + j + 3]"
HIGH = ("xh0, xh1 = x[32 * b + 16 + j], x[32 * b + 17 + j]", "xh2, xh3 = x[32 * b + 18 + j], x[32 * b + 19 + j]")
KERNEL_MISTAKES = {
    "nibbles swapped": (
        [(LOW, "xl0, xl1, xl2, xl3 = x[32 * b + 16 + j], x[32 * b + 17 + j], x[32 * b + 18 + j], x[32 * b + 19 + j]"),
         (HIGH[0], "xh0, xh1 = x[32 * b + j], x[32 * b + j + 1]"), (HIGH[1], "xh2, xh3 = x[32 * b + j + 2], x[32 * b + j + 3]")],
        "with the nibbles swapped",
    ),
    "no m * sum(x)": ([(" + m[g, b, lane] * xs", "")], "without the offsets: d * sum(q x) but no m * sum(x)"),
    "rows in the wrong order": ([("out[g * lanes + lane] = acc[lane]", "out[lane * groups + g] = acc[lane]")],
                                "with the rows in the wrong order"),
    "x's blocks 16 apart": ([(LOW, LOW.replace("32 * b", "16 * b")), (HIGH[0], HIGH[0].replace("32 * b", "16 * b")),
                             (HIGH[1], HIGH[1].replace("32 * b", "16 * b"))], "with the blocks of x 16 apart"),
}


def planted_kernel(mistake: str):
    edits, _ = KERNEL_MISTAKES[mistake]
    return plant(matmul.q4_matvec.py_func, DECORATOR, *edits)


@pytest.mark.parametrize("mistake", KERNEL_MISTAKES)
def test_each_simd_kernel_mistake_gets_its_own_message(mistake):
    ex = solution_with(8, q4_matvec_simd=plant(SOLUTION.q4_matvec_simd, q4_matvec_kernel=planted_kernel(mistake)))
    text = failure(T86.test_ex8_6_matches_the_dequantised_product, ex, 64, 96, compiled)
    assert KERNEL_MISTAKES[mistake][1] in text, text


@pytest.mark.parametrize("mistake", KERNEL_MISTAKES)
def test_a_kernel_mistake_is_not_blamed_on_the_conversion(mistake):
    """The float64/strided test compares with the learner's own kernel on float32 first: a wrong
    kernel is sent to the product's test, and the correct wrapper is not blamed."""
    ex = solution_with(8, q4_matvec_simd=plant(SOLUTION.q4_matvec_simd, q4_matvec_kernel=planted_kernel(mistake)))
    text = failure(T86.test_ex8_6_accepts_float64_and_strided_input, ex, compiled)
    assert "not the conversion" in text and "ascontiguousarray" not in text, text


def test_the_unplanted_kernel_passes_as_python():
    """The planted copies differ from the engine's kernel by their one edit only."""
    kernel = plant(matmul.q4_matvec.py_func, DECORATOR)
    T86.test_ex8_6_matches_the_dequantised_product(
        solution_with(8, q4_matvec_simd=plant(SOLUTION.q4_matvec_simd, q4_matvec_kernel=kernel)), 64, 96, compiled)


# -- Exercise 8.6: the wrapper, and the mistakes only Numba shows ---------------------------


def fresh_kernel(*edits: tuple[str, str], fastmath: bool = True):
    """The engine's kernel, with ``edits``, compiled by a dispatcher of its own (whose types start empty)."""
    return njit(fastmath=fastmath)(plant(matmul.q4_matvec.py_func, DECORATOR, *edits))


CONVERT = "    x = np.ascontiguousarray(x, dtype=np.float32)\n"
WRAPPER_MISTAKES = {
    # (edit of the solutions' _check, what the float64/strided test must say)
    "x passed as it came": ((CONVERT, ""), ["could not compile q4_matvec_kernel", "np.ascontiguousarray(x, dtype=np.float32)"]),
    "x made contiguous but left float64": ((CONVERT, "    x = np.ascontiguousarray(x)\n"),
                                           ["compiled a second version", "np.ascontiguousarray(x, dtype=np.float32)"]),
}


@pytest.mark.parametrize("mistake", WRAPPER_MISTAKES)
def test_each_conversion_mistake_gets_its_own_message(mistake):
    edit, messages = WRAPPER_MISTAKES[mistake]
    check = plant(SOLUTION.q4_matvec_simd.__globals__["_check"], edit)
    ex = solution_with(8, q4_matvec_kernel=(kernel := fresh_kernel()))
    ex.q4_matvec_simd = plant(SOLUTION.q4_matvec_simd, q4_matvec_kernel=kernel, _check=check)
    text = failure(T86.test_ex8_6_accepts_float64_and_strided_input, ex, learner_compiled)
    assert text.startswith("q4_matvec_simd passed x to the kernel") and all(m in text for m in messages), text


def test_padding_rows_kept_gets_its_message():
    ex = solution_with(8, q4_matvec_simd=plant(SOLUTION.q4_matvec_simd, ("[: w.rows]", "")))
    text = failure(T86.test_ex8_6_matches_the_dequantised_product, ex, 100, 64, compiled)
    assert "slice away the padding rows" in text, text


def test_a_kernel_numba_cannot_compile_is_told_in_the_exercise_terms():
    """A shift after the conversion (a float shifted): Numba's TypingError, told as the exercise's."""
    kernel = fresh_kernel(("h0 = np.float32(qs[g, b, j, lane] >> 4)", "h0 = np.float32(qs[g, b, j, lane]) >> 4"))
    ex = solution_with(8, q4_matvec_simd=plant(SOLUTION.q4_matvec_simd, q4_matvec_kernel=kernel))
    text = failure(T86.test_ex8_6_matches_the_dequantised_product, ex, 64, 96, learner_compiled)
    assert "Numba could not compile q4_matvec_kernel" in text and "NUMBA_DISABLE_JIT=1" in text, text


FLOAT64 = "computes in float64"
COMPILE_MISTAKES = {
    # (edits of the engine's kernel, fastmath, the 8.6 test, what it must say, what it must not)
    "a bare 16 (int64) times a float32": (
        [("sixteen = np.float32(16)", "sixteen = 16")], True, "test_ex8_6_kernel_vectorises",
        [FLOAT64, "sixteen = np.float32(16)"], "one float at a time"),
    "float64 accumulators (arrays without a dtype)": (
        [("acc = np.zeros(lanes, np.float32)", "acc = np.zeros(lanes)"),
         ("lo = np.empty(lanes, np.float32)", "lo = np.empty(lanes)"), ("hi = np.empty(lanes, np.float32)", "hi = np.empty(lanes)")],
        True, "test_ex8_6_kernel_vectorises", [FLOAT64, "np.zeros(LANES) is float64"], "one float at a time"),
    "no fastmath": ([], False, "test_ex8_6_kernel_is_compiled_with_fastmath", ["compiled without fastmath"], None),
}


@pytest.mark.parametrize("mistake", COMPILE_MISTAKES)
def test_each_compiled_kernel_mistake_gets_its_own_message(mistake):
    edits, fastmath, test, messages, wrong = COMPILE_MISTAKES[mistake]
    if test == "test_ex8_6_kernel_vectorises" and (reason := packed_fma_unavailable()):
        pytest.skip(reason)
    ex = solution_with(8, q4_matvec_kernel=fresh_kernel(*edits, fastmath=fastmath))
    text = failure(getattr(T86, test), ex, learner_compiled)
    assert all(m in text for m in messages) and (wrong is None or wrong not in text), text


def test_a_kernel_without_njit_gets_its_message():
    ex = solution_with(8, q4_matvec_kernel=plant(matmul.q4_matvec.py_func, DECORATOR))
    text = failure(T86.test_ex8_6_kernel_is_compiled_with_fastmath, ex, compiled)
    assert "not compiled by Numba: decorate it with @njit(fastmath=True)" in text, text


# -- Exercise 8.7: the same kernel mistakes, through the parallel wrapper ---------------------


@pytest.mark.parametrize("mistake", KERNEL_MISTAKES)
def test_each_parallel_kernel_mistake_gets_its_own_message(mistake):
    ex = solution_with(8, parallel_matvec=plant(SOLUTION.parallel_matvec, q4_matvec_parallel=planted_kernel(mistake)))
    text = failure(T87.test_ex8_7_matches_the_dequantised_product, ex, 100, 64, compiled)
    assert KERNEL_MISTAKES[mistake][1] in text, text


# -- Exercise 8.8 ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_numba(tmp_path_factory):
    """Exercise 8.8's test model: a tiny Llama in Q4_1 (embedding Q8_0) on the numba backend."""
    tensors = {}
    for name, array in tiny_llama_tensors(**T88.PARAMS, seed=12).items():
        if array.ndim == 2:
            kind = GGMLType.Q8_0 if name == "token_embd.weight" else GGMLType.Q4_1
            array = TensorToWrite(array.shape, kind, quantize(array, kind).tobytes())
        tensors[name] = array
    path = tmp_path_factory.mktemp("ch08") / "tiny-q4_1.gguf"
    write_gguf(path, tiny_llama_metadata(**T88.PARAMS), tensors)
    return llmrs.load(path, backend="numba")


WARM_UP = "    if warm_up:\n        network.forward(ids)\n"
START = "    profiler = cProfile.Profile()\n    profiler.enable()\n"
PROFILER_MISTAKES = {
    "sorted smallest first": ([("return rows[:top]", "return rows[:top][::-1]")],
                        T88.test_ex8_8_hotspots_sorted_by_own_time_with_shares, "sort by own time"),
    "shares of the rows returned": (
        [("return rows[:top]", "rows = rows[:top]\n    t = sum(h.seconds for h in rows)\n"
          "    return [Hotspot(h.name, h.calls, h.seconds, h.seconds / t) for h in rows]")],
        T88.test_ex8_8_top_and_repeat_are_checked_and_the_profiler_stops, "the top 3 functions add up to 100%"),
    "warm-up profiled": ([(WARM_UP + START, START + WARM_UP)], T88.test_ex8_8_counts_the_profiled_passes_only,
                         "and the warm-up pass outside the profiler"),
}


@pytest.mark.parametrize("mistake", PROFILER_MISTAKES)
def test_each_profiler_mistake_gets_its_own_message(mistake, tiny_numba):
    edits, test, message = PROFILER_MISTAKES[mistake]
    text = failure(test, solution_with(8, profile_forward=plant(profiling.profile_forward, *edits)), tiny_numba)
    assert message in text, text
