"""Special tokens: finding them in text, and which of them end generation (chapter 2).

Before a tokenizer model sees any text, the special tokens written in it are
split out (llama.cpp's ``tokenizer_st_partition``): longest text first, each
one's every occurrence in the pieces not yet split. Control and unknown
tokens (``<|im_start|>``, ``<s>``, ``<unk>``) are split out only when special
text is allowed; *user-defined* tokens (Qwen2's ``<think>``, Hugging Face's
non-special added tokens) always, as both llama.cpp and Hugging Face do.

A special token may swallow the whitespace beside it: ``rstrip`` drops the
whitespace after it, ``lstrip`` before it (C's ``isspace``: space, tab, newline,
vertical tab, form feed, carriage return). GGUF files do not store this;
llama.cpp sets it by model name (Phi-3's tokens rstrip, so ``<|user|>\\nHi``
encodes as ``<|user|>`` ``▁Hi``), and Hugging Face's ``tokenizer.json`` holds
it per added token.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_TYPES = (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN)
"""Token types matched whole in text (llama.cpp's special-token cache)."""
ALWAYS_SPLIT = (TOKEN_USER_DEFINED,)
"""... of which these are matched even when special text is not allowed."""

C_WHITESPACE = " \t\n\v\f\r"

END_OF_GENERATION = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
)
"""Token texts that end generation wherever they are in a vocabulary: llama.cpp's list
(``llama_vocab::impl::load``, "maintain a list of tokens that cause end-of-generation"), in its order."""


def end_of_generation_ids(vocab: dict[str, int], first: Sequence[int | None] = ()) -> tuple[int, ...]:
    """The ids that end generation: ``first`` (the file's eos, eot, eom ids, those that are set),
    then every :data:`END_OF_GENERATION` text the vocabulary has, without repeats.

    As llama.cpp does: ``<|end|>`` is not one where ``<|return|>`` and ``<|call|>`` (gpt-oss's
    harmony format) or ``<|calls|>`` and ``<|flush|>`` (solar-open) are, since there it ends a
    message, not the turn; ``</s>`` is not one where ``<|tool_response>`` (Gemma 4) is.
    """
    ids = [i for i in first if i is not None]
    ids += [vocab[t] for t in END_OF_GENERATION if t in vocab]
    has = {t for t in END_OF_GENERATION if t in vocab}
    if "<|end|>" in has and ({"<|return|>", "<|call|>"} <= has or {"<|calls|>", "<|flush|>"} <= has):
        ids = [i for i in ids if i != vocab["<|end|>"]]
    if "</s>" in has and "<|tool_response>" in has:
        ids = [i for i in ids if i != vocab["</s>"]]
    return tuple(dict.fromkeys(ids))


class SpecialTokens:
    """The special tokens of a vocabulary, and the splitter that finds them in text.

    ``tokens``/``token_types`` by id; ``rstrip``/``lstrip``: ids of tokens that swallow
    the whitespace after/before them.
    """

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int],
                 rstrip: Collection[int] = (), lstrip: Collection[int] = ()):
        self.ids: dict[str, int] = {}
        for i, (t, ty) in enumerate(zip(tokens, token_types, strict=True)):
            if ty in SPECIAL_TYPES and t:
                self.ids.setdefault(t, i)
        self.types = {t: token_types[i] for t, i in self.ids.items()}
        # longest first, as llama.cpp sorts its cache (a stable sort keeps id order among equals)
        self.order = sorted(self.ids, key=len, reverse=True)
        self.rstrip = frozenset(rstrip)
        self.lstrip = frozenset(lstrip)

    def split(self, text: str, allow_special: bool) -> list[str | int]:
        """``text`` -> its pieces: ordinary text (``str``, never empty) and special token ids (``int``).

        Cost: one substring search per special token over the text (all in C).
        """
        pieces: list[str | int] = [text] if text else []
        for token in self.order:
            if not allow_special and self.types[token] not in ALWAYS_SPLIT:
                continue
            token_id = self.ids[token]
            if not any(isinstance(p, str) and token in p for p in pieces):
                continue
            strip_left, strip_right = token_id in self.lstrip, token_id in self.rstrip
            out: list[str | int] = []
            for piece in pieces:
                if isinstance(piece, int) or token not in piece:
                    out.append(piece)
                    continue
                parts = piece.split(token)
                for k, part in enumerate(parts):
                    if k > 0 and strip_right:
                        part = part.lstrip(C_WHITESPACE)
                    if k < len(parts) - 1 and strip_left:
                        part = part.rstrip(C_WHITESPACE)
                    if part:
                        out.append(part)
                    if k < len(parts) - 1:
                        out.append(token_id)
            pieces = out
        return pieces
