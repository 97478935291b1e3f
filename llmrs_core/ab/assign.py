"""Weighted, sticky assignment of requests to variants (chapter 12, section 12.4).

A user must see the same variant on every request, or the experiment mixes
the two experiences and a user's complaints cannot be traced to one model.
So the variant is a function of the user's id alone: the id's SHA-256 (with a
per-experiment ``salt``, so that two experiments split the same users
independently) read as a number ``u`` uniform in [0, 1), and the variant
whose slice of [0, 1) holds ``u`` — slices as wide as the normalised weights,
in the order given. A weight of 0 gets an empty slice: never chosen.

SHA-256, not Python's ``hash()``: ``hash()`` of a string changes from one
process to the next (``PYTHONHASHSEED``), and the router may restart.

**Fallback.** A request without a ``user`` cannot be sticky: it gets a
weighted random draw of its own (``rng``), and the request log records its
user hash as ``null`` so the report can tell such requests apart.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping


def check_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """``{name: weight}`` checked: at least one variant, every weight finite and >= 0, their sum > 0."""
    if not weights:
        raise ValueError("an A/B test needs at least one variant; none was given")
    out = {}
    for name, w in weights.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a variant's name must be a non-empty string, got {name!r}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"variant {name!r}: the weight must be a finite number >= 0, got {w!r}")
        out[name] = float(w)
    if sum(out.values()) <= 0:
        raise ValueError(f"the weights must sum to more than 0 (every variant has weight 0): {out}")
    return out


def user_bucket(user: str, salt: str = "") -> float:
    """``user`` (with ``salt``) -> a number in [0, 1), the same in every process: the first
    8 bytes of SHA-256(salt NUL user) over 2**64."""
    digest = hashlib.sha256(f"{salt}\0{user}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def user_hash(user: str, salt: str = "") -> str:
    """A short, stable pseudonym of ``user`` for the request log (16 hex digits of its SHA-256)."""
    return hashlib.sha256(f"{salt}\0{user}".encode()).hexdigest()[:16]


def pick(u: float, weights: Mapping[str, float]) -> str:
    """The variant whose slice of [0, 1) holds ``u`` (slices as wide as the normalised weights, in order)."""
    total = sum(weights.values())
    edge = 0.0
    for name, w in weights.items():
        edge += w / total
        if w > 0 and u < edge:
            return name
    return [n for n, w in weights.items() if w > 0][-1]  # u just under 1 and rounding in the edges


def assign(user: str | None, weights: Mapping[str, float], salt: str = "",
           rng: random.Random | None = None) -> str:
    """The variant for ``user``: sticky (a function of ``user`` and ``salt`` only) and weighted.
    ``user=None`` (the fallback): a weighted draw from ``rng`` (default: the module's generator)."""
    weights = check_weights(weights)
    if user is None:
        return pick((rng or random).random(), weights)
    if not isinstance(user, str):
        raise ValueError(f"user must be a string, got {type(user).__name__}")
    return pick(user_bucket(user, salt), weights)


__all__ = ["assign", "check_weights", "pick", "user_bucket", "user_hash"]
