"""Choosing the next token from the logits (introduced in chapter 4).

The chain, in this order (as in vLLM and Hugging Face transformers):

1. **penalties** on tokens already generated: repetition (divide positive
   logits by ``r``, multiply negative ones), presence (subtract once) and
   frequency (subtract per occurrence);
2. **greedy** when ``temperature == 0``: the argmax, nothing else applies;
3. **temperature**: ``logits / T``;
4. **top-k**: keep the ``k`` largest (``0`` = off);
5. **top-p** (nucleus): keep the smallest set of most likely tokens whose
   probability reaches ``p`` — including the token that crosses it;
6. **min-p**: drop tokens less likely than ``min_p`` times the most likely;
7. **sample** from the renormalised distribution with a seeded generator.

Filters set removed logits to ``-inf``; shapes are ``[vocab]`` throughout.

**Finite by construction.** The chain computes in float64 (a float32 logit
divided by a small penalty or temperature can overflow float32 to ``inf``,
and ``inf - inf`` is NaN in the softmax), clamps what overflows even float64
to ``±``:data:`LOGIT_LIMIT`, and checks the distribution it draws from:
finite logits always give a finite distribution, and anything else (NaN
logits from a caller) is a ``ValueError`` — in the engine, the error of that
one request, never a NaN passed to the generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .attention import softmax
from .validation import check_float, check_int

#: temperatures below this are greedy (vLLM's rule): dividing by them overflows float32
MIN_TEMPERATURE = 1e-5
#: the range of ``repetition_penalty``: dividing or multiplying a logit by at most 100 keeps any
#: model's logits finite in float32 too (vLLM takes any value > 0: 1e-38 overflowed to ``inf``)
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0
#: logits are clamped to ``[-LOGIT_LIMIT, LOGIT_LIMIT]`` (float32's largest finite value) before the softmax
LOGIT_LIMIT = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. The defaults are greedy decoding.

    Every field is checked on construction, with a ``ValueError`` naming it:
    finite numbers of the right type; ``temperature >= 0`` (a temperature below
    :data:`MIN_TEMPERATURE` is taken as 0, greedy, as vLLM does); ``top_k >= 0``
    (0: off); ``top_p`` in (0, 1]; ``min_p`` in [0, 1]; presence and frequency
    penalties in [-2, 2] (the OpenAI API's range); ``repetition_penalty`` in
    [:data:`MIN_REPETITION_PENALTY`, :data:`MAX_REPETITION_PENALTY`] = [0.01, 100]
    (1: off); ``seed`` in [0, 2**63). Within these ranges every finite logit vector
    gives a finite distribution.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        # Types first, each naming the parameter: a NaN penalty or a float top_k would
        # otherwise reach NumPy and fail (or sample garbage) far from its cause.
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"):
            object.__setattr__(self, name, check_float(name, getattr(self, name)))
        object.__setattr__(self, "top_k", check_int("top_k", self.top_k, minimum=0))
        if self.seed is not None:
            object.__setattr__(self, "seed", check_int("seed", self.seed, minimum=0, maximum=2**63 - 1))
        if 0 < self.temperature < MIN_TEMPERATURE:  # 1/T would overflow float32: greedy, as in vLLM
            object.__setattr__(self, "temperature", 0.0)
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2 <= self.frequency_penalty <= 2,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY,
             f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}] "
             f"(1 is no penalty), got {self.repetition_penalty}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_penalties(
    logits: np.ndarray,
    history: Sequence[int],
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
) -> np.ndarray:
    """Penalise tokens in ``history`` (a new float64 array; ``logits`` is not changed)."""
    out = np.array(logits, dtype=np.float64, copy=True)
    if len(history) == 0:
        return out
    ids, counts = np.unique(np.asarray(history, dtype=np.int64), return_counts=True)
    if repetition_penalty != 1.0:
        picked = out[ids]
        out[ids] = np.where(picked > 0, picked / repetition_penalty, picked * repetition_penalty)
    out[ids] -= presence_penalty + frequency_penalty * counts
    return out


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """``logits / temperature`` (``temperature > 0``)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 here (0 means greedy), got {temperature}")
    return np.asarray(logits, dtype=np.float64) / float(temperature)


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the ``k`` largest logits (ties at the boundary are all kept); ``k <= 0`` keeps all."""
    logits = np.asarray(logits, dtype=np.float64)
    if k <= 0 or k >= logits.size:
        return logits.copy()
    threshold = np.partition(logits, -k)[-k]
    return np.where(logits >= threshold, logits, -np.inf)


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the most likely tokens until their probability reaches ``p``, the crossing one included."""
    logits = np.asarray(logits, dtype=np.float64)
    if p >= 1.0:
        return logits.copy()
    order = np.argsort(-logits, kind="stable")
    probs = softmax(logits[order])
    before = np.cumsum(probs) - probs  # mass of the tokens ranked above each one
    keep_sorted = before < p  # the first token always stays
    out = np.full_like(logits, -np.inf)
    kept = order[keep_sorted]
    out[kept] = logits[kept]
    return out


def min_p_filter(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Drop tokens whose probability is below ``min_p`` times the most likely token's."""
    logits = np.asarray(logits, dtype=np.float64)
    if min_p <= 0:
        return logits.copy()
    # p_i / p_max = exp(l_i - l_max): no normalisation needed
    keep = logits >= logits.max() + np.log(min_p)
    return np.where(keep, logits, -np.inf)


def sample_token(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    history: Sequence[int] = (),
) -> int:
    """Run the whole chain (see the module docstring) and return one token id.

    In float64, clamped to ``±LOGIT_LIMIT``; ``ValueError`` if ``logits`` hold NaN or the
    distribution is not finite (never a NaN handed to the generator)."""
    x = apply_penalties(
        logits, history, params.repetition_penalty, params.presence_penalty, params.frequency_penalty
    )
    if np.isnan(x).any():
        raise ValueError(f"the logits hold NaN at {int(np.isnan(x).sum())} of {x.size} positions: nothing to "
                         "sample from")
    x = np.clip(x, -LOGIT_LIMIT, LOGIT_LIMIT)  # -inf (a masked token) stays -inf
    if params.greedy:
        return int(np.argmax(x))
    x = np.clip(apply_temperature(x, params.temperature), -LOGIT_LIMIT, LOGIT_LIMIT)
    x = top_k_filter(x, params.top_k)
    x = top_p_filter(x, params.top_p)
    x = min_p_filter(x, params.min_p)
    probs = softmax(x)
    total = probs.sum()
    if not (np.isfinite(probs).all() and total > 0):
        raise ValueError(f"the sampling distribution is not finite (sum {total}) for {params}")
    return int(rng.choice(probs.size, p=probs))


class Sampler:
    """Sampling parameters plus their random generator: the same seed gives the same tokens."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        return sample_token(logits, self.params, self.rng, history)
