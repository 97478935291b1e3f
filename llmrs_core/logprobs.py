"""Log-probabilities of generated tokens (chapter 11: the ``logprobs`` of OpenAI's API).

A generated token's log-probability is taken from the model's **raw** logits —
before penalties, temperature and the top-k/top-p filters — as vLLM does by
default (``logprobs_mode="raw_logprobs"``), so that it measures the model, not
the sampling settings: ``log_softmax(logits)[token]``, computed in float64
(``logits - max - log(sum(exp(logits - max)))``, which cannot overflow).
With ``top > 0`` the ``top`` most likely tokens come with it, most likely
first (ties by lower id), as OpenAI's ``top_logprobs`` list them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .validation import check_int

#: the most alternatives a request may ask for (OpenAI's limit for top_logprobs)
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its id, its log-probability, and the ``top`` most likely alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def check_top_logprobs(top: object, name: str = "top_logprobs") -> int:
    """``top`` as an int in ``[0, MAX_TOP_LOGPROBS]``, or a ``ValueError`` naming ``name``."""
    return check_int(name, top, 0, MAX_TOP_LOGPROBS)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """``[vocab]`` logits -> ``[vocab]`` float64 log-probabilities (stable for any finite logits)."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


def token_logprob(logits: np.ndarray, token_id: int, top: int = 0) -> TokenLogprob:
    """The log-probability of ``token_id`` under ``logits`` ``[vocab]``, with the ``top`` best alternatives."""
    lp = log_softmax(logits)
    alternatives: tuple[tuple[int, float], ...] = ()
    if top:
        best = np.argpartition(-lp, top - 1)[:top] if top < lp.size else np.arange(lp.size)
        best = best[np.lexsort((best, -lp[best]))]  # most likely first, ties by id
        alternatives = tuple((int(i), float(lp[i])) for i in best)
    return TokenLogprob(int(token_id), float(lp[token_id]), alternatives)


__all__ = ["MAX_TOP_LOGPROBS", "TokenLogprob", "check_top_logprobs", "log_softmax", "token_logprob"]
