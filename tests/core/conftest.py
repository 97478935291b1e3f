"""Fixtures of the engine tests: short names for the SmolLM2 tokenizer and its reference."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tok(smollm2_tokenizer):
    """SmolLM2's tokenizer (ours)."""
    return smollm2_tokenizer


@pytest.fixture(scope="session")
def ref(smollm2_reference):
    """Hugging Face ``tokenizers`` configured as SmolLM2's."""
    return smollm2_reference
