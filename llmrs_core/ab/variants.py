"""The variants of an A/B test as an operator names them on the command line (chapter 12, section 12.4).

``--variant NAME=MODEL[:backend][@weight]``  a model file that ``llmrs ab serve`` serves itself
``--upstream NAME=URL[@weight]``             a server already running (any OpenAI-compatible one)

The weight defaults to 1. Names are unique, made of letters, digits, ``_``,
``-`` and ``.`` (they become a Prometheus label value and a response header).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..backends import BACKENDS
from .assign import check_weights

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class VariantSpec:
    """A model to serve: ``name``, its GGUF file, the backend (``None``: the default), its weight."""

    name: str
    model: str
    backend: str | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class Upstream:
    """A running server for one variant: ``name``, its base URL (no ``/v1``), its weight."""

    name: str
    url: str
    weight: float = 1.0


def _split(text: str, option: str, example: str) -> tuple[str, str, float]:
    name, sep, rest = text.partition("=")
    if not sep or not rest:
        raise ValueError(f"{option} takes {example}, got {text!r}")
    if not _NAME.match(name):
        raise ValueError(f"{option} {text!r}: the name {name!r} must be 1-64 letters, digits, '_', '-' or '.'")
    weight = 1.0
    head, at, tail = rest.rpartition("@")
    if at:
        try:
            weight = float(tail)
        except ValueError:
            raise ValueError(f"{option} {text!r}: the weight after '@' must be a number, got {tail!r}") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{option} {text!r}: the weight must be a finite number >= 0, got {tail!r}")
        rest = head
    return name, rest, weight


def parse_variant(text: str) -> VariantSpec:
    """``NAME=MODEL[:backend][@weight]`` -> a :class:`VariantSpec` (the model file must exist)."""
    name, rest, weight = _split(text, "--variant", "NAME=MODEL[:backend][@weight], e.g. q8=models/q8.gguf:numba@1")
    model, colon, backend = rest.rpartition(":")
    if not colon or backend not in BACKENDS:  # no backend given (a ':' may belong to the path)
        model, backend = rest, None
    if not Path(model).is_file():
        raise ValueError(f"--variant {name}: the model file {model!r} does not exist")
    return VariantSpec(name, model, backend, weight)


def parse_upstream(text: str) -> Upstream:
    """``NAME=URL[@weight]`` -> an :class:`Upstream` (``http://`` or ``https://``, no trailing ``/v1``)."""
    name, url, weight = _split(text, "--upstream", "NAME=URL[@weight], e.g. a=http://127.0.0.1:8001@1")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--upstream {name}: the URL must start with http:// or https://, got {url!r}")
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return Upstream(name, url, weight)


def check_variants(items: Sequence[VariantSpec | Upstream]) -> None:
    """At least one variant, no name twice, weights summing to more than 0."""
    seen: set[str] = set()
    for v in items:
        if v.name in seen:
            raise ValueError(f"the variant name {v.name!r} is given twice; each variant needs its own name")
        seen.add(v.name)
    check_weights({v.name: v.weight for v in items})


__all__ = ["Upstream", "VariantSpec", "check_variants", "parse_upstream", "parse_variant"]
