"""The offline quality of a variant (chapter 12, section 12.4): two measurements on fixed inputs.

* **Log-likelihood of a held-out text.** ``tests/data/ab_heldout.txt`` is five short
  paragraphs of plain English written for this project (so no model was trained on
  them). :func:`text_logprobs` gives the log-probability the model assigns to each
  token given the ones before it ``[T - 1]``; their mean is the per-token
  log-likelihood, and ``exp(-mean)`` the perplexity. Two variants score the same
  tokens, so their differences are paired.
* **Agreement with a reference.** ``tests/golden/smollm2_hf_golden.npz`` holds Hugging
  Face ``transformers``' greedy continuations of four prompts (``scripts/capture_golden.py
  hf``, float32 on the dequantised Q4_1 file). :func:`greedy_agreement` feeds each
  prompt and the reference's continuation to the variant (teacher forcing) and asks,
  at every position, whether the variant's most likely token is the reference's:
  one boolean per reference token. Free-running greedy text is compared too (exact
  match, and the common prefix), four prompts, too few for a test on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..logprobs import log_softmax
from ..validation import stop_token_set
from ..workbook import find_root

HELDOUT = Path("tests/data/ab_heldout.txt")
GOLDEN = Path("tests/golden/smollm2_hf_golden.npz")


def default_path(relative: Path) -> Path:
    """A data file of the checkout (the report runs from it: the goldens live in tests/)."""
    return find_root() / relative


def text_logprobs(model, text: str) -> np.ndarray:
    """``[T - 1]`` float64: log p(token t | tokens < t) for t = 1..T-1 of ``text``'s T tokens."""
    ids = model.tokenizer.encode(text, allow_special=False)
    if len(ids) < 2:
        raise ValueError(f"the held-out text has {len(ids)} token(s); it needs at least 2")
    if len(ids) > model.config.context_length:
        raise ValueError(f"the held-out text has {len(ids)} tokens, more than the context ({model.config.context_length})")
    logits = model.logits(ids)
    return np.array([log_softmax(logits[t])[ids[t + 1]] for t in range(len(ids) - 1)])


@dataclass(frozen=True)
class Agreement:
    """``top1`` [N]: per reference token, does the variant's argmax equal it (teacher forcing);
    ``exact`` [P]: per prompt, is the free-running greedy continuation the reference's;
    ``prefix`` [P]: its common prefix with the reference, in tokens; ``lengths`` [P]."""

    top1: np.ndarray
    exact: np.ndarray
    prefix: np.ndarray
    lengths: np.ndarray


def load_golden(path: str | Path | None = None) -> list[tuple[list[int], list[int]]]:
    """The reference's (prompt ids, greedy continuation ids) pairs."""
    data = np.load(path or default_path(GOLDEN))
    n = sum(1 for k in data.files if k.startswith("greedy_"))
    return [(data[f"ids_{i}"].tolist(), data[f"greedy_{i}"].tolist()) for i in range(n)]


def greedy_agreement(model, golden: list[tuple[list[int], list[int]]]) -> Agreement:
    """The variant's greedy choices against the reference's, on each (prompt, continuation)."""
    top1, exact, prefix, lengths = [], [], [], []
    stops = stop_token_set(model.tokenizer, None)
    for prompt, reference in golden:
        if not prompt or not reference:
            raise ValueError("every reference needs a prompt and a continuation of at least one token")
        logits = model.logits(prompt + reference[:-1])
        predicted = logits[len(prompt) - 1:].argmax(axis=-1)
        top1.extend((predicted == np.array(reference)).tolist())
        ours = list(model.generate(prompt, max_tokens=len(reference), temperature=0.0).token_ids)
        if len(ours) < len(reference) and reference[len(ours)] in stops:  # ours ended there (without the token)
            ours.append(reference[len(ours)])
        common = next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), min(len(ours), len(reference)))
        exact.append(ours == list(reference))
        prefix.append(common)
        lengths.append(len(reference))
    return Agreement(np.array(top1, dtype=bool), np.array(exact, dtype=bool), np.array(prefix), np.array(lengths))


__all__ = ["GOLDEN", "HELDOUT", "Agreement", "default_path", "greedy_agreement", "load_golden", "text_logprobs"]
