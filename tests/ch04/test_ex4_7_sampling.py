"""Exercise 4.7 — Sampling Strategies, on hand-built distributions.

Where a filter or the chain goes wrong in a known way, the message names the
mistake: the kept sets it is compared with come from the engine's samplers
(llmrs_core.sampling) run with that mistake.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmrs_core import sampling as reference

PROBS = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS = np.log(PROBS).astype(np.float32)


def kept(filtered) -> list[int]:
    return np.flatnonzero(np.isfinite(filtered)).tolist()


def test_ex4_7_penalties(ex):
    logits = np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32)
    original = logits.copy()
    out = ex.apply_penalties(logits, [0, 1, 1], repetition_penalty=2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, 0.5], err_msg="divide positive logits, multiply negative ones")
    assert np.array_equal(logits, original), "apply_penalties must not change its input"
    out = ex.apply_penalties(logits, [0, 1, 1], presence_penalty=0.5, frequency_penalty=0.1)
    np.testing.assert_allclose(out, [2.0 - 0.6, -2.0 - 0.7, 1.0, 0.5], rtol=1e-6)
    np.testing.assert_allclose(ex.apply_penalties(logits, []), logits)


def test_ex4_7_temperature(ex):
    np.testing.assert_allclose(ex.apply_temperature(LOGITS, 0.5), LOGITS * 2, rtol=1e-6)
    with pytest.raises(ValueError):
        ex.apply_temperature(LOGITS, 0.0)


def test_ex4_7_top_k(ex):
    assert kept(ex.top_k_filter(LOGITS, 2)) == [0, 1]
    assert kept(ex.top_k_filter(LOGITS, 0)) == [0, 1, 2, 3], "k = 0 turns top-k off"
    assert kept(ex.top_k_filter(np.array([1.0, 3.0, 3.0, 2.0]), 1)) == [1, 2], "ties with the k-th stay"
    np.testing.assert_allclose(ex.top_k_filter(LOGITS, 3)[:3], LOGITS[:3], err_msg="kept logits are unchanged")


@pytest.mark.parametrize(
    "p, want",
    [(0.3, [0]), (0.5, [0]), (0.6, [0, 1]), (0.8, [0, 1]), (0.81, [0, 1, 2]), (0.99, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])],
)
def test_ex4_7_top_p_keeps_the_token_that_crosses(ex, p, want):
    shuffled = np.array([2, 0, 3, 1])  # order must come from the probabilities, not positions
    got = sorted(shuffled[kept(ex.top_p_filter(LOGITS[shuffled], p))].tolist())
    assert sorted(shuffled[kept(reference.top_p_filter(LOGITS[shuffled], p))].tolist()) == want  # the engine agrees
    # tokens 0, 1, 2, 3 are in order of probability: one too few is the crossing token dropped
    mistakes = {tuple(want[:-1]): "drops the token that crosses p: keep a token while the total *before* it is "
                                  "below p (cumsum - prob < p), not the total including it"}
    assert got == want, (
        f"top_p={p} on probabilities {PROBS.tolist()}: yours keeps tokens {got}, expected {want}"
        + (f" — it {mistakes[tuple(got)]}" if tuple(got) in mistakes else
           " (keep the most likely tokens until their total reaches p, the one that crosses it included)")
    )


def test_ex4_7_min_p(ex):
    assert kept(ex.min_p_filter(LOGITS, 0.2)) == [0, 1, 2], "0.05 < 0.2 x 0.5 is dropped; 0.15 stays"
    assert kept(ex.min_p_filter(LOGITS, 0.0)) == [0, 1, 2, 3]
    assert kept(ex.min_p_filter(LOGITS, 1.0)) == [0]


def test_ex4_7_greedy_and_penalised_greedy(ex):
    rng = np.random.default_rng(0)
    assert ex.sample_token(LOGITS, ex.SamplingParams(), rng) == 0
    params = ex.SamplingParams(repetition_penalty=10.0)
    assert ex.sample_token(LOGITS, params, rng, history=[0]) == 1, "penalties apply before the argmax"


def test_ex4_7_sampling_follows_the_distribution(ex):
    rng = np.random.default_rng(1234)
    params = ex.SamplingParams(temperature=1.0)
    draws = np.array([ex.sample_token(LOGITS, params, rng) for _ in range(20000)])
    freq = np.bincount(draws, minlength=4) / draws.size
    np.testing.assert_allclose(freq, PROBS, atol=0.015, err_msg="sampled frequencies should match softmax(logits)")
    cold = np.array([ex.sample_token(LOGITS, ex.SamplingParams(temperature=0.25), rng) for _ in range(2000)])
    sharpened = PROBS**4 / (PROBS**4).sum()  # temperature 0.25: p ** (1 / 0.25), renormalised
    assert abs((cold == 0).mean() - sharpened[0]) < 0.03, (
        f"at temperature 0.25 token 0 should come up {sharpened[0]:.0%} of the time, got {(cold == 0).mean():.0%}"
    )


def test_ex4_7_filters_are_applied_before_drawing(ex):
    rng = np.random.default_rng(5)
    for params, allowed in [
        (ex.SamplingParams(temperature=1.0, top_k=2), {0, 1}),
        (ex.SamplingParams(temperature=1.0, top_p=0.6), {0, 1}),
        (ex.SamplingParams(temperature=1.0, min_p=0.5), {0, 1}),
        (ex.SamplingParams(temperature=5.0, top_k=1), {0}),
    ]:
        draws = {ex.sample_token(LOGITS, params, rng) for _ in range(300)}
        assert draws <= allowed, f"{params}: drew {sorted(draws)}, only {sorted(allowed)} allowed"


def drawn(sample, params, n=600, seed=7) -> set[int]:
    rng = np.random.default_rng(seed)
    return {int(sample(LOGITS, params, rng)) for _ in range(n)}


def test_ex4_7_temperature_comes_before_top_p(ex):
    """At temperature 2 the distribution flattens to [0.38, 0.29, 0.21, 0.12]: top-p 0.7 then keeps three
    tokens; on the untempered probabilities [0.5, 0.3, 0.15, 0.05] it would keep two."""
    params = ex.SamplingParams(temperature=2.0, top_p=0.7)
    allowed = kept(reference.top_p_filter(reference.apply_temperature(LOGITS, 2.0), 0.7))
    untempered = kept(reference.top_p_filter(LOGITS, 0.7))
    assert allowed != untempered  # the engine's samplers tell the two orders apart here
    got = drawn(ex.sample_token, params)
    assert got == set(allowed), (
        f"{params}: yours drew tokens {sorted(got)}, expected {allowed}"
        + (" — your sample_token applies top-p before the temperature: the filters must see the tempered "
           "probabilities (penalties, temperature, top-k, top-p, min-p, then draw)" if got == set(untempered) else "")
    )


def test_ex4_7_a_seed_reproduces_a_sample(ex):
    params = ex.SamplingParams(temperature=1.0, top_p=0.9)
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    a = [ex.sample_token(logits, params, np.random.default_rng(42)) for _ in range(5)]
    b = [ex.sample_token(logits, params, np.random.default_rng(42)) for _ in range(5)]
    assert a == b
