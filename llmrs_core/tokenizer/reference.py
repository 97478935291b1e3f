"""The reference tokenizer: Hugging Face ``tokenizers`` set up as SmolLM2's own (chapter 2).

Used by the tests, the notebook and the benchmark to check our from-scratch
tokenizer, never by the engine. It is built from the same GGUF vocabulary
and merges with SmolLM2's ``tokenizer.json`` settings: a BPE model,
pre-tokeniser ``Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)]``, a ByteLevel decoder,
and the control tokens as special added tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tokenizers

    from .tokenizer import Tokenizer


def reference_tokenizer(ours: Tokenizer) -> tokenizers.Tokenizer:
    """A ``tokenizers.Tokenizer`` with the same vocabulary, merges and special tokens as ``ours``."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    merges = sorted(ours.ranks, key=ours.ranks.__getitem__)
    hf = HFTokenizer(models.BPE(vocab=dict(ours.vocab), merges=merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in sorted(ours.special_tokens, key=ours.special_tokens.get)]
    )
    return hf
