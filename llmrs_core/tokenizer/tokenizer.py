"""The Tokenizer: SmolLM2's byte-level BPE built from a GGUF file (chapter 2).

Everything it needs is in the GGUF metadata: ``tokenizer.ggml.tokens`` (id ->
token text in byte stand-in characters), ``tokenizer.ggml.token_type``
(1 normal, 3 control, 4 user-defined, ...), ``tokenizer.ggml.merges``
(``"left right"`` strings in rank order), the special ids and the chat
template. No external tokenizer library runs in this path; Hugging Face
``tokenizers`` is only the reference in the tests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import regex

from .bpe import encode_ordinary, merge_ranks
from .bytes_map import decode_chars
from .chat import render_chat_template
from .streaming import StreamDecoder

if TYPE_CHECKING:
    from ..formats.gguf import GGUFFile

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_TYPES = (TOKEN_CONTROL, TOKEN_USER_DEFINED)


class Tokenizer:
    """Byte-level BPE tokenizer (GPT-2 family, SmolLM2's pre-tokenisation).

    Args:
        tokens: token text by id, in byte stand-in characters (``"Ġthe"``).
        merges: merges in rank order, as ``"left right"`` strings or pairs.
        token_types: llama.cpp token types by id; control and user-defined
            tokens are *special*: matched whole in text when ``allow_special``.
        bos_token_id, eos_token_id: ids of the begin/end-of-sequence tokens.
        chat_template: a Jinja2 chat template (the GGUF's ``tokenizer.chat_template``).
        add_bos: prepend ``bos_token_id`` when encoding (SmolLM2: no).
    """

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str | tuple[str, str]],
        token_types: Sequence[int] | None = None,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        chat_template: str | None = None,
        add_bos: bool = False,
    ):
        self.tokens = list(tokens)
        self.vocab: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            self.vocab.setdefault(t, i)
        self.ranks = merge_ranks(merges)
        types = list(token_types) if token_types is not None else [TOKEN_NORMAL] * len(self.tokens)
        if len(types) != len(self.tokens):
            raise ValueError(f"{len(types)} token types for {len(self.tokens)} tokens")
        self.token_types = types
        self.special_tokens: dict[str, int] = {
            t: i for i, (t, ty) in enumerate(zip(self.tokens, types, strict=True)) if ty in SPECIAL_TYPES
        }
        for name, tid in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
            if tid is not None and not 0 <= tid < len(self.tokens):
                raise ValueError(f"{name} {tid} is outside the vocabulary of {len(self.tokens)}")
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template
        self.add_bos = add_bos
        # longest first, so "<|im_start|>" wins over any special that is its prefix
        alternatives = sorted(self.special_tokens, key=len, reverse=True)
        self._special_split = (
            regex.compile("(" + "|".join(regex.escape(s) for s in alternatives) + ")") if alternatives else None
        )
        self._cache: dict[str, list[int]] = {}
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Tokenizer:
        """Build the tokenizer from a GGUF file's ``tokenizer.*`` metadata (``model == "gpt2"``)."""
        md = gguf.metadata
        kind = md.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"{gguf.path}: tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') is supported"
            )
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in md:
                raise ValueError(f"{gguf.path}: GGUF metadata lacks {key!r}")
        return cls(
            md["tokenizer.ggml.tokens"],
            md["tokenizer.ggml.merges"],
            md.get("tokenizer.ggml.token_type"),
            bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=md.get("tokenizer.ggml.eos_token_id"),
            chat_template=md.get("tokenizer.chat_template"),
            add_bos=bool(md.get("tokenizer.ggml.add_bos_token", False)),
        )

    # -- Hugging Face tokenizer files (chapter 10) ---------------------------

    PRE_TOKENIZER = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    }

    @classmethod
    def from_hf_dir(cls, directory: str | os.PathLike[str]) -> Tokenizer:
        """Build the tokenizer from a Hugging Face ``tokenizer.json`` (+ ``tokenizer_config.json``).

        Only SmolLM2's kind is supported: byte-level BPE with digits split
        individually; anything else raises ``ValueError`` rather than encode wrongly.
        """
        directory = Path(directory)
        path = directory / "tokenizer.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{directory} has no tokenizer.json") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        model = data.get("model") or {}
        if model.get("type") != "BPE" or data.get("pre_tokenizer") != cls.PRE_TOKENIZER:
            raise ValueError(
                f"{path}: only byte-level BPE with SmolLM2's pre-tokeniser (Digits + ByteLevel) is supported"
            )
        vocab: dict[str, int] = model["vocab"]
        added = {t["content"]: (t["id"], t.get("special", False)) for t in data.get("added_tokens", [])}
        size = max([*vocab.values(), *(i for i, _ in added.values())]) + 1
        tokens = [""] * size
        types = [TOKEN_UNUSED] * size
        for text, i in vocab.items():
            tokens[i], types[i] = text, TOKEN_NORMAL
        for text, (i, special) in added.items():
            tokens[i], types[i] = text, TOKEN_CONTROL if special else TOKEN_USER_DEFINED
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        cfg_path = directory / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}

        def special_id(key: str) -> int | None:
            value = cfg.get(key)
            content = value.get("content") if isinstance(value, dict) else value
            return added.get(content, (vocab.get(content), False))[0] if content else None

        return cls(
            tokens, merges, types,
            bos_token_id=special_id("bos_token"), eos_token_id=special_id("eos_token"),
            chat_template=cfg.get("chat_template"), add_bos=bool(cfg.get("add_bos_token", False)),
        )

    def save_hf(self, directory: str | os.PathLike[str]) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` that Hugging Face ``tokenizers``
        (and :meth:`from_hf_dir`) read as this tokenizer."""
        directory = Path(directory)
        special = {t: i for t, i in self.special_tokens.items()}
        added = [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": self.token_types[i] == TOKEN_CONTROL}
            for t, i in sorted(special.items(), key=lambda kv: kv[1])
        ]
        merges = [[a, b] for (a, b), _ in sorted(self.ranks.items(), key=lambda kv: kv[1])]
        data = {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": self.PRE_TOKENIZER, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": dict(self.vocab),
                      "merges": merges},
        }
        (directory / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        config = {
            "tokenizer_class": "GPT2Tokenizer",
            "bos_token": self.tokens[self.bos_token_id] if self.bos_token_id is not None else None,
            "eos_token": self.tokens[self.eos_token_id] if self.eos_token_id is not None else None,
            "add_bos_token": self.add_bos,
            "chat_template": self.chat_template,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")

    # -- encoding ------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        """Text -> token ids.

        With ``allow_special`` (the default, right for chat prompts) special
        tokens written in the text, like ``<|im_start|>``, become their ids;
        without it they are encoded as plain text — use that for untrusted
        user input, so nobody can inject a turn boundary.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        ids = [self.bos_token_id] if self.add_bos and self.bos_token_id is not None else []
        try:
            if allow_special and self._special_split is not None:
                for i, piece in enumerate(self._special_split.split(text)):
                    if i % 2:  # the split's captured separators: the special tokens
                        ids.append(self.special_tokens[piece])
                    elif piece:
                        ids.extend(encode_ordinary(piece, self.vocab, self.ranks, self._cache))
            else:
                ids.extend(encode_ordinary(text, self.vocab, self.ranks, self._cache))
        except UnicodeEncodeError as e:
            bad = e.object[e.start]
            raise ValueError(
                f"text contains a lone surrogate {bad!r} (U+{ord(bad):04X}), which is not valid "
                "Unicode text and cannot be encoded as UTF-8"
            ) from None
        return ids

    # -- decoding ------------------------------------------------------------

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self.tokens):
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{len(self.tokens) - 1})")

    def is_special(self, token_id: int) -> bool:
        self._check_id(token_id)
        return self.token_types[token_id] in SPECIAL_TYPES

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its text in UTF-8)."""
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        self._check_id(token_id)
        text = self.tokens[token_id]
        if self.token_types[token_id] in SPECIAL_TYPES:
            data = text.encode("utf-8")
        else:
            data = decode_chars(text)
        self._bytes_cache[token_id] = data
        return data

    def decode_bytes(self, ids: Sequence[int], skip_special: bool = False) -> bytes:
        return b"".join(
            self.token_bytes(int(i)) for i in ids if not (skip_special and self.is_special(int(i)))
        )

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Token ids -> text. Bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def piece(self, token_id: int) -> str:
        """A token as it is stored in the vocabulary (``"Ġthe"``), for display."""
        self._check_id(token_id)
        return self.tokens[token_id]

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        """A :class:`StreamDecoder` for printing tokens as they are generated."""
        return StreamDecoder(self, skip_special=skip_special)

    # -- chat ----------------------------------------------------------------

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}]``) with the model's chat template."""
        if not self.chat_template:
            raise ValueError("this model has no chat template (tokenizer.chat_template)")
        special = {
            "bos_token": self.tokens[self.bos_token_id] if self.bos_token_id is not None else "",
            "eos_token": self.tokens[self.eos_token_id] if self.eos_token_id is not None else "",
        }
        return render_chat_template(self.chat_template, messages, add_generation_prompt, **special)

    def count_chat_tokens(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> int:
        """How many tokens the rendered chat prompt takes."""
        return len(self.encode(self.apply_chat_template(messages, add_generation_prompt)))

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.ranks)}, special={len(self.special_tokens)})"
