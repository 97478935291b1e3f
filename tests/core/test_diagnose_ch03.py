"""Chapter 3's tests name each known mistake: proven by planting it.

Each mistake is planted in a copy of the solution — the engine's own function,
recompiled from its source with one edit (:func:`llmrs_core.testing.plant`) — and the chapter 3 test that should
catch it is run on that copy: it must fail with the message that names the
mistake. The copies live in this process only; nothing under chapters/ or
llmrs_core/ changes. A mutation that no longer applies (the engine's code
changed) fails loudly, so the proof cannot go stale in silence.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from llmrs_core import attention, rope
from llmrs_core.testing import chapter_tests, plant
from llmrs_core.testing import solution_with as chapter_solution_with

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # overflow and NaN in planted mistakes


T36 = chapter_tests(3, "test_ex3_6_attention.py")
T37 = chapter_tests(3, "test_ex3_7_rope.py")


def solution_with(**planted) -> types.SimpleNamespace:
    """A copy of the chapter 3 solution module with some names replaced."""
    return chapter_solution_with(3, **planted)


def failure(test, ex, *args) -> str:
    with pytest.raises((AssertionError, pytest.fail.Exception)) as e:
        test(ex, *args)
    return str(e.value)


SDPA = attention.scaled_dot_product_attention
SCORES = "scores = qg @ k.transpose(1, 2, 0)[:, None] / np.sqrt(d).astype(q.dtype)"
MASK = "scores = np.where(causal_mask(tq, tk), scores, -np.inf)"
CHUNK = (3, 8, 6, 2)  # 3 queries over 8 keys, 6 query heads on 2 KV heads


def tril(k: str) -> str:
    return f"scores = np.where(np.tril(np.ones((tq, tk), dtype=bool){k}), scores, -np.inf)"


ATTENTION_MISTAKES = {
    "no 1/sqrt(D) scale": (
        [(SCORES, "scores = qg @ k.transpose(1, 2, 0)[:, None]")], (7, 7, 9, 3),
        "your attention (causal=True) equals the reference computed without the 1/sqrt(D) scale",
    ),
    "no causal mask": (
        [("    if causal:\n        " + MASK, "    if False:\n        " + MASK)], (7, 7, 9, 3),
        "equals the reference computed without the causal mask",
    ),
    "mask shifted: sees the next key": (
        [(MASK, tril(", k=tk - tq + 1"))], CHUNK, "shifted by one (each query also sees the key after it)",
    ),
    "mask shifted: misses its own key": (
        [(MASK, tril(", k=tk - tq - 1"))], CHUNK, "shifted by one (each query misses its own key)",
    ),
    "mask without the cache offset": (
        [(MASK, tril(""))], CHUNK, "with a mask that forgets the cached keys",
    ),
    "np.tile instead of np.repeat": (
        [("qg = q.reshape(tq, hkv, group, d).transpose(1, 2, 0, 3)", "qg = q.reshape(tq, group, hkv, d).transpose(2, 1, 0, 3)"),
         ("return out.transpose(2, 0, 1, 3)", "return out.transpose(2, 1, 0, 3)")], (7, 7, 9, 3),
        "with np.tile instead of np.repeat for the KV heads",
    ),
    "softmax over the queries": (
        [("out = softmax(scores) @", "out = softmax(scores, axis=-2) @")], (7, 7, 9, 3),
        "with the softmax over the queries instead of the keys",
    ),
}


@pytest.mark.parametrize("mistake", ATTENTION_MISTAKES)
def test_each_attention_mistake_gets_its_own_message(mistake):
    edits, shape, message = ATTENTION_MISTAKES[mistake]
    ex = solution_with(scaled_dot_product_attention=plant(SDPA, *edits))
    assert message in failure(T36.test_ex3_6_matches_the_naive_loop, ex, *shape)


def test_the_solution_passes_the_diagnosing_tests():
    ex = solution_with()
    for shape in [(5, 5, 1, 1), (7, 7, 9, 3), (1, 9, 9, 3), CHUNK]:
        T36.test_ex3_6_matches_the_naive_loop(ex, *shape)
    T37.test_ex3_7_interleaved_matches_pairwise_rotation(ex, 1e5)
    T37.test_ex3_7_permutation_makes_the_two_forms_agree(ex)


def test_softmax_over_the_keys_is_the_reference():
    """The one variant built here rather than from the engine's attention: right settings, right answer."""
    for causal in (True, False):
        q, k, v = T36.qkv(3, 8, 6, 2, 16)
        got = T36.softmax_over(q, k, v, causal, axis=-1)
        np.testing.assert_allclose(got, SDPA(q, k, v, causal), rtol=1e-5, atol=1e-6)


def test_a_wrong_softmax_of_their_own_is_pointed_out():
    """Attention built on the learner's own broken softmax says so, beside its own diagnosis."""
    unnormalised = plant(attention.softmax, ("return e / np.where(s == 0, 1.0, s)", "return e"))
    ex = solution_with(softmax=unnormalised,
                       scaled_dot_product_attention=plant(SDPA, softmax=unnormalised))
    message = failure(T36.test_ex3_6_matches_the_naive_loop, ex, *CHUNK)
    assert "(your softmax fails too: see its own test)" in message, message


def test_float64_attention_fails():
    ex = solution_with(scaled_dot_product_attention=plant(
        SDPA, (".reshape(tq, hq, d).astype(q.dtype, copy=False)", ".reshape(tq, hq, d).astype(np.float64)")))
    assert "float32 q, k, v must give float32 attention, got float64" in failure(T36.test_ex3_6_returns_float32, ex)


def test_no_error_for_more_queries_than_keys_fails():
    ex = solution_with(scaled_dot_product_attention=plant(
        SDPA, ("group = _check_shapes(q, k, v)", "group = q.shape[1] // k.shape[1]")))
    message = failure(T36.test_ex3_6_rejects_more_queries_than_keys, ex)
    assert "5 queries over 3 keys must raise ValueError" in message


MASK_RULE = "return np.arange(tk)[None, :] <= (tk - tq) + np.arange(tq)[:, None]"
CAUSAL_MASK_MISTAKES = {
    "misses its own key": ("return np.arange(tk)[None, :] < (tk - tq) + np.arange(tq)[:, None]", (3, 3),
                           "shifted by one (query i misses its own key)"),
    "sees the next key": ("return np.arange(tk)[None, :] <= (tk - tq) + 1 + np.arange(tq)[:, None]", (3, 3),
                          "shifted by one (query i also sees the key after its own)"),
    "no offset": ("return np.arange(tk)[None, :] <= np.arange(tq)[:, None]", (2, 4), "np.tril: query i sees keys 0..i"),
    "transposed": ("return np.arange(tk)[None, :] >= np.arange(tq)[:, None]", (3, 3),
                   "transposed (query i sees keys i and after)"),
}


@pytest.mark.parametrize("mistake", CAUSAL_MASK_MISTAKES)
def test_each_causal_mask_mistake_gets_its_own_message(mistake):
    new, shape, message = CAUSAL_MASK_MISTAKES[mistake]
    ex = solution_with(causal_mask=plant(attention.causal_mask, (MASK_RULE, new)))
    assert message in failure(T36.test_ex3_6_causal_mask, ex, *shape)


SOFTMAX_MISTAKES = {
    "no max subtracted": (("e = np.exp(x - m)", "e = np.exp(x)"), "overflowed: subtract the max before exp"),
    "axis ignored": (("    m = np.max(x, axis=axis", "    axis = -1\n    m = np.max(x, axis=axis"),
                     "your softmax(x, axis=0) equals the reference computed over the last axis instead of `axis`"),
    "NaN for a masked row": (("    m = np.where(np.isfinite(m), m, 0.0)\n", ""), "an all-masked row must give zeros"),
}


@pytest.mark.parametrize("mistake", SOFTMAX_MISTAKES)
def test_each_softmax_mistake_gets_its_own_message(mistake):
    edit, message = SOFTMAX_MISTAKES[mistake]
    ex = solution_with(softmax=plant(attention.softmax, edit))
    assert message in failure(T36.test_ex3_6_softmax, ex)


# -- Exercise 3.7 ---------------------------------------------------------------------------

ANGLES = "cos, sin = rope_angles(positions, x.shape[-1], theta)"
FREQUENCIES = "theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)"


def minus_i_over_d():
    """theta ** (-i/D) for i = 0 .. D/2 - 1, planted in the frequencies and seen through the angles."""
    freqs = plant(rope.rope_frequencies, (FREQUENCIES, "theta ** (-np.arange(head_dim // 2, dtype=np.float64) / head_dim)"))
    return freqs, plant(rope.rope_angles, rope_frequencies=freqs)


def rope_mistakes(layout: str) -> dict:
    right = rope.apply_rope_interleaved if layout == "interleaved" else rope.apply_rope_half
    other = rope.apply_rope_half if layout == "interleaved" else rope.apply_rope_interleaved
    name = right.__name__
    sign = (
        [("out[..., 0::2] = even * cos - odd * sin", "out[..., 0::2] = even * cos + odd * sin"),
         ("out[..., 1::2] = even * sin + odd * cos", "out[..., 1::2] = -even * sin + odd * cos")]
        if layout == "interleaved" else
        [("[first * cos - second * sin, first * sin + second * cos]", "[first * cos + second * sin, -first * sin + second * cos]")]
    )
    return {
        "the other pairing": (plant(other, (f"def {other.__name__}(", f"def {name}("), name=name), "with the other pairing"),
        "theta**(-i/D)": (plant(right, rope_angles=minus_i_over_d()[1]), "with frequencies theta**(-i/D)"),
        "positions from 1": (plant(right, (ANGLES, ANGLES.replace("(positions", "(np.asarray(positions) + 1"))),
                             "with positions starting at 1 instead of 0"),
        "rotating the wrong way": (plant(right, *sign), "rotating the wrong way"),
    }


@pytest.mark.parametrize("mistake", ["the other pairing", "theta**(-i/D)", "positions from 1", "rotating the wrong way"])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_each_rope_mistake_gets_its_own_message(layout, mistake):
    planted, message = rope_mistakes(layout)[mistake]
    if layout == "interleaved":
        text = failure(T37.test_ex3_7_interleaved_matches_pairwise_rotation, solution_with(apply_rope_interleaved=planted), 1e4)
    else:
        text = failure(T37.test_ex3_7_half_matches_pairwise_rotation, solution_with(apply_rope_half=planted))
    assert message in text, text


@pytest.mark.parametrize(
    "edit, message",
    [((FREQUENCIES, "theta ** (-np.arange(head_dim // 2, dtype=np.float64) / head_dim)"), "as theta**(-i/D)"),
     ((FREQUENCIES, FREQUENCIES.replace("(-np.arange", "(np.arange")), "the exponent's sign is lost")],
    ids=["theta**(-i/D)", "positive exponent"],
)
def test_each_frequency_mistake_gets_its_own_message(edit, message):
    ex = solution_with(rope_frequencies=plant(rope.rope_frequencies, edit))
    assert message in failure(T37.test_ex3_7_rope_frequencies, ex)


PERMUTATION_MISTAKES = {
    "the inverse": (plant(rope.unpermute_from_interleaved, ("def unpermute_from_interleaved(", "def permute_for_interleaved("),
                           name="permute_for_interleaved"), "backwards (GGUF's row order back to HF's"),
    "the whole matrix as one head": (
        plant(rope.permute_for_interleaved, ("w.reshape(n_heads, 2, d // 2, cols)", "w.reshape(1, 2, rows // 2, cols)")),
        "over the whole matrix as one head, not head by head",
    ),
}


@pytest.mark.parametrize("mistake", PERMUTATION_MISTAKES)
def test_each_permutation_mistake_gets_its_own_message(mistake):
    planted, message = PERMUTATION_MISTAKES[mistake]
    assert message in failure(T37.test_ex3_7_permutation_makes_the_two_forms_agree,
                              solution_with(permute_for_interleaved=planted))


@pytest.mark.parametrize("mistake", ["the other pairing", "positions from 1", "rotating the wrong way"])
def test_a_wrong_rope_does_not_fail_the_permutation_test(mistake):
    """The permutation test judges permute_for_interleaved alone, whatever the learner's RoPE does."""
    wrong = solution_with(apply_rope_interleaved=rope_mistakes("interleaved")[mistake][0],
                          apply_rope_half=rope_mistakes("half")[mistake][0])
    T37.test_ex3_7_permutation_makes_the_two_forms_agree(wrong)
