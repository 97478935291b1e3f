"""Chapter 6's tests name each known mistake: proven by planting it.

As for chapter 3 (test_diagnose_ch03.py): each mistake is planted in a copy of
the solution — the engine's quantiser, packer or dequantiser recompiled from its
source with one edit (:func:`llmrs_core.testing.plant`), or for GGUF parsing a
few lines written the wrong way here — and the chapter 6 test named after the
mistake must fail with its own message.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from llmrs_core.quant import dequant, ggml_blocks, integer
from llmrs_core.testing import chapter_tests, plant, solution_with
from llmrs_core.testing import failure_message as failure

pytest.importorskip("gguf")


T66 = chapter_tests(6, "test_ex6_6_int4.py")
T67 = chapter_tests(6, "test_ex6_7_gguf_parsing.py")
SOLUTION = solution_with(6)


SCALE = "exact = np.maximum(-lo, hi) / scheme.qmax if symmetric"
PACK = "return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)"
MISTAKES = {
    "scale from max instead of absmax": (
        {"quantize_int": plant(integer.quantize, (SCALE, "exact = hi / scheme.qmax if symmetric"))},
        T66.test_ex6_6_symmetric_scale_is_absmax_over_qmax, (), "= max(x) / 127: the symmetric scale comes from the largest *magnitude*",
    ),
    "scale over 128": (
        {"quantize_int": plant(integer.quantize, (SCALE, "exact = np.maximum(-lo, hi) / (scheme.qmax + 1) if symmetric"))},
        T66.test_ex6_6_symmetric_scale_is_absmax_over_qmax, (), "= max|x| / 128",
    ),
    "asymmetric range without 0": (
        {"quantize_int": plant(integer.quantize, ("lo = np.minimum(blocks.min(axis=1), 0.0)", "lo = blocks.min(axis=1)"))},
        T66.test_ex6_6_asymmetric_range_includes_zero, (), "widen [min, max] to include 0 first",
    ),
    "nibbles swapped": (
        {"pack_int4": plant(integer.pack_int4, (PACK, "return nibbles[..., 1::2] | (nibbles[..., 0::2] << 4)"))},
        T66.test_ex6_6_nibble_packing, (), "the nibbles are swapped",
    ),
    "no sign extension": (
        {"unpack_int4": plant(integer.unpack_int4, ("    if signed:\n        # sign-extend", "    if False:\n        # sign-extend"))},
        T66.test_ex6_6_unpack_sign_extends, (), "gave the raw nibbles [8, 7, 15, 0]: sign-extend them",
    ),
    "Q4_0 nibbles in pack_int4's order": (
        {"quantize_q4_0": plant(ggml_blocks.quantize_q4_0, _pack_nibbles=T66.interleaved_nibbles)},
        T66.test_ex6_6_ggml_blocks_match_llamacpp, ("q4_0", "normal"), "equal llama.cpp's computed " + T66.INTERLEAVED,
    ),
    "Q4_1 nibbles swapped": (
        {"quantize_q4_1": plant(ggml_blocks.quantize_q4_1, _pack_nibbles=T66.swapped_nibbles)},
        T66.test_ex6_6_ggml_blocks_match_llamacpp, ("q4_1", "cubed"), "equal llama.cpp's computed " + T66.SWAPPED,
    ),
    "Q4_0 scale from max": (
        {"quantize_q4_0": plant(ggml_blocks.quantize_q4_0, ("np.abs(blocks).argmax(axis=1)", "blocks.argmax(axis=1)"))},
        T66.test_ex6_6_ggml_blocks_match_llamacpp, ("q4_0", "normal"), "with m the largest value (max) instead of",
    ),
    "Q4_1 over 16 steps": (
        {"quantize_q4_1": plant(ggml_blocks.quantize_q4_1, ("d = (hi - lo) / np.float32(15)", "d = (hi - lo) / np.float32(16)"))},
        T66.test_ex6_6_ggml_blocks_match_llamacpp, ("q4_1", "normal"), "with d = (max - min) / 16 instead of / 15",
    ),
    "Q4_0 block of zeros as code 0": (
        {"quantize_q4_0": plant(ggml_blocks.quantize_q4_0, ("q = np.minimum(codes, 15)",
                                                            "q = np.where(d == 0, 0, np.minimum(codes, 15))"))},
        T66.test_ex6_6_ggml_blocks_match_llamacpp, ("q4_0", "zeros"), "equal llama.cpp's computed " + T66.ZERO_BLOCK,
    ),
    # forgetting the + 8 leaves codes -8..8; each way of storing them must be named
    "Q4_0 quantised without the offset, codes masked to four bits": (
        {"quantize_q4_0": plant(ggml_blocks.quantize_q4_0, ("np.float32(8.5)", "np.float32(0.5)"),
                                ("q = np.minimum(codes, 15).astype(np.uint8)",
                                 "q = (np.minimum(codes, 15).astype(np.int8) & 0x0F).astype(np.uint8)"))},
        T66.test_ex6_6_ggml_blocks_match_llamacpp, ("q4_0", "normal"), "are llama.cpp's " + T66.NO_OFFSET,
    ),
    "Q4_0 quantised without the offset, signed codes or-ed into bytes": (
        {"quantize_q4_0": plant(ggml_blocks.quantize_q4_0, ("np.float32(8.5)", "np.float32(0.5)"),
                                ("q = np.minimum(codes, 15).astype(np.uint8)", "q = np.minimum(codes, 15).astype(np.int64)"))},
        T66.test_ex6_6_ggml_blocks_match_llamacpp, ("q4_0", "cubed"), "are llama.cpp's " + T66.NO_OFFSET,
    ),
    "Q4_0 without the offset": (
        {"dequantize_q4_0": plant(dequant.dequantize_q4_0, (" - np.int8(8)", ""))},
        T66.test_ex6_6_dequantize_matches_llamacpp, ("q4_0", "normal"), "without the offset: d * q instead of d * (q - 8)",
    ),
    "Q4_1 without m": (
        {"dequantize_q4_1": plant(dequant.dequantize_q4_1, (" + fp16_field(b, 2)", ""))},
        T66.test_ex6_6_dequantize_matches_llamacpp, ("q4_1", "one-sided"), "without m: d * q instead of d * q + m",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_quantisation_mistake_gets_its_own_message(mistake):
    planted, test, args, message = MISTAKES[mistake]
    text = failure(test, solution_with(6, **planted), *args)
    assert message in text, text


def test_a_scale_rounded_to_nearest_is_not_blamed():
    """.astype(np.float32) of the exact scale, where the engine takes the float32 above: the 6.6 tests pass, and
    they are not vacuous here (scales one ulp apart and codes at a tie rounded the other way, on the grid data)."""
    nearest = plant(integer.quantize, ("scales = _round_up_to_float32(exact)", "scales = exact.astype(np.float32)"))
    learner = solution_with(6, quantize_int=nearest)
    T66.test_ex6_6_agrees_with_the_engine_up_to_rounding(learner)
    T66.test_ex6_6_symmetric_scale_is_absmax_over_qmax(learner)
    T66.test_ex6_6_symmetric_int8_by_hand(learner)
    x, kw = T66.on_a_grid(), dict(bits=8, granularity="group", group_size=64)
    ours, ref = nearest(x, **kw), integer.quantize(x, **kw)
    assert np.any(ours.scales != ref.scales) and np.any(ours.codes != ref.codes)


def test_codes_beyond_a_tie_are_blamed():
    """Rounding down (floor) is not a tie's choice: the agreement test names the first code that moved."""
    floor = plant(integer.quantize, ("codes = np.rint(blocks / divisor)\n", "codes = np.floor(blocks / divisor)\n"))
    text = failure(T66.test_ex6_6_agrees_with_the_engine_up_to_rounding, solution_with(6, quantize_int=floor))
    assert "differs from the engine's beyond rounding" in text and "codes differ by more than a tie allows" in text, text


def test_other_wrong_bytes_are_located():
    """Bytes that match no known mistake: the first differing block and field, in the block's terms."""
    offset_by_one = plant(ggml_blocks.quantize_q4_0, ("np.float32(8.5)", "np.float32(7.5)"))
    text = failure(T66.test_ex6_6_ggml_blocks_match_llamacpp, solution_with(6, quantize_q4_0=offset_by_one),
                   "q4_0", "normal")
    assert "differ from llama.cpp's; first at block 0: nibble byte" in text, text


# -- Exercise 6.7: a few lines written the wrong way ------------------------------------------


def string_with_u32_length(data, offset):
    (n,) = struct.unpack_from("<I", data, offset)
    return bytes(data[offset + 4 : offset + 4 + n]).decode("utf-8"), offset + 4 + n


def string_end_in_characters(data, offset):
    s, _ = SOLUTION.read_string(data, offset)
    return s, offset + 8 + len(s)


def array_count_first(data, offset, value_type):
    if value_type != 9:
        return SOLUTION.read_value(data, offset, value_type)
    count, etype = struct.unpack_from("<QI", data, offset)
    pos, out = offset + 12, []
    for _ in range(count):
        value, pos = SOLUTION.read_value(data, pos, etype)
        out.append(value)
    return out, pos


def bool_as_int(data, offset, value_type):
    value, end = SOLUTION.read_value(data, offset, value_type)
    return (int(value) if value_type == 7 else value), end


GGUF_MISTAKES = {
    "no version check": ({"read_header": plant(SOLUTION.read_header, ("if version not in (2, 3):", "if False:"))},
                         T67.test_ex6_7_header, (), "read_header must raise ValueError for version 1"),
    "no length check": ({"read_header": plant(SOLUTION.read_header, ("if len(data) < 24:", "if False:"))},
                        T67.test_ex6_7_header, (), "raised struct.error"),
    "string length as uint32": ({"read_string": string_with_u32_length}, T67.test_ex6_7_strings, (),
                                "a GGUF string is a uint64 length"),
    "string end in characters": ({"read_string": string_end_in_characters}, T67.test_ex6_7_strings, (),
                                 "counting characters: 'héllo' is 5 characters but 6 UTF-8 bytes"),
    "array count before type": ({"read_value": array_count_first}, T67.test_ex6_7_values,
                                T67.VALUES[9],
                                "an array is a uint32 element type, a uint64 count, then the elements"),
    "bool as an int": ({"read_value": bool_as_int}, T67.test_ex6_7_values, T67.VALUES[5],
                       "type 7 is a bool"),
}


@pytest.mark.parametrize("mistake", GGUF_MISTAKES)
def test_each_gguf_parsing_mistake_gets_its_own_message(mistake):
    planted, test, args, message = GGUF_MISTAKES[mistake]
    text = failure(test, solution_with(6, **planted), *args)
    assert message in text, text


def test_the_solution_passes_the_diagnosing_tests():
    for name in ("test_ex6_6_symmetric_scale_is_absmax_over_qmax", "test_ex6_6_asymmetric_range_includes_zero",
                 "test_ex6_6_nibble_packing", "test_ex6_6_agrees_with_the_engine_up_to_rounding",
                 "test_ex6_6_unpack_sign_extends", "test_ex6_7_header", "test_ex6_7_strings"):
        getattr(T66 if "6_6" in name else T67, name)(SOLUTION)
    for kind in ("q4_0", "q4_1"):
        for data in T66.DATA:
            T66.test_ex6_6_ggml_blocks_match_llamacpp(SOLUTION, kind, data)
            T66.test_ex6_6_dequantize_matches_llamacpp(SOLUTION, kind, data)


# -- integer.disagreement: what the notebook's comparison and the agreement test allow ------------


def test_disagreement_allows_rounding_and_names_the_rest():
    x = np.array([[127.0, 0.5, -3.0, 2.0]], np.float32)  # scale 1 exactly: 0.5 is a tie between codes 0 and 1
    ref = integer.quantize(x, bits=8)
    assert ref.codes.tolist() == [[127, 0, -3, 2]] and float(ref.scales) == 1.0
    assert integer.disagreement(x, ref, ref) is None

    def ours(codes, scale=1.0):
        return integer.QuantizedTensor(np.array(codes, np.int8), np.asarray(scale, np.float32), None, ref.scheme)

    assert integer.disagreement(x, ours([[127, 1, -3, 2]]), ref) is None  # the other side of the tie
    one_ulp = np.nextafter(np.float32(1.0), np.float32(0.0))
    assert integer.disagreement(x, ours([[127, 0, -3, 2]], one_ulp), ref) is None
    two_ulps = np.nextafter(one_ulp, np.float32(0.0))
    assert "2 float32 steps apart" in integer.disagreement(x, ours([[127, 0, -3, 2]], two_ulps), ref)
    assert "1 codes differ by more than a tie allows; the first, at (0, 2), is -4" in integer.disagreement(
        x, ours([[127, 0, -4, 2]]), ref)
    assert "scheme" in integer.disagreement(x, integer.quantize(x, bits=4), ref)
    wide = integer.QuantizedTensor(ref.codes.astype(np.int16), ref.scales, None, ref.scheme)
    assert "dtype int16" in integer.disagreement(x, wide, ref)
    asym = integer.quantize(x, bits=8, symmetric=False)
    shifted = integer.QuantizedTensor(asym.codes, asym.scales, asym.zero_points + 1, asym.scheme)
    assert "the zero point of block 0" in integer.disagreement(x, shifted, asym)
