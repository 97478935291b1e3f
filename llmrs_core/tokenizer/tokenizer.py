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
import math
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import regex

from .bpe import encode_ordinary, merge_ranks
from .bytes_map import bytes_to_unicode, decode_chars
from .chat import check_messages, render_chat_template
from .streaming import StreamDecoder
from .word_cache import WordCache

if TYPE_CHECKING:
    from ..formats.gguf import GGUFFile

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_TYPES = (TOKEN_CONTROL, TOKEN_USER_DEFINED)
# special tokens that end a turn, besides eos, in the vocabularies we meet (ChatML, GPT-2, Llama 3)
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")
# encode_rendered_chat's placeholders: a private-use character, 12 random digits, "#", an index, another
PLACEHOLDER = regex.compile("\ue000([0-9]{12})#([0-9]+)\ue001")


def _read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ``ValueError`` naming the file otherwise (not JSON, not an
    object, or nested deeper than the parser's stack)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


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
        word_cache_size: how many words' ids to remember (least recently used
            go first; see :class:`~.word_cache.WordCache`).
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
        word_cache_size: int = 2**16,
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
        self._cache = WordCache(word_cache_size)
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
        if not path.exists():
            raise FileNotFoundError(f"{directory} has no tokenizer.json")
        data = _read_json_object(path)
        model = data.get("model") or {}
        if (not isinstance(model, dict) or model.get("type") != "BPE"
                or data.get("pre_tokenizer") != cls.PRE_TOKENIZER):
            raise ValueError(
                f"{path}: only byte-level BPE with SmolLM2's pre-tokeniser (Digits + ByteLevel) is supported"
            )
        vocab: dict[str, int] = model.get("vocab")
        entries = data.get("added_tokens", [])
        if (not isinstance(vocab, dict) or not isinstance(entries, list)
                or not all(isinstance(t, dict) and isinstance(t.get("content"), str) for t in entries)):
            raise ValueError(f"{path}: model.vocab must map token text to ids, and added_tokens be a list of "
                             "{content, id} objects")
        added = {t["content"]: (t.get("id"), t.get("special", False)) for t in entries}
        ids = [*vocab.values(), *(i for i, _ in added.values())]
        if not ids or not all(type(i) is int and i >= 0 for i in ids):
            raise ValueError(f"{path}: token ids must be non-negative integers")
        size = max(ids) + 1
        if size > path.stat().st_size:  # a vocabulary of that size cannot be written in this file
            raise ValueError(f"{path}: token id {size - 1:,} is larger than the file ({path.stat().st_size:,} "
                             f"bytes) can describe a vocabulary for; the ids are damaged")
        tokens = [""] * size
        types = [TOKEN_UNUSED] * size
        for text, i in vocab.items():
            tokens[i], types[i] = text, TOKEN_NORMAL
        for text, (i, special) in added.items():
            tokens[i], types[i] = text, TOKEN_CONTROL if special else TOKEN_USER_DEFINED
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        cfg_path = directory / "tokenizer_config.json"
        cfg = _read_json_object(cfg_path) if cfg_path.exists() else {}

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
        ids = self._bos()
        if allow_special and self._special_split is not None:
            for i, piece in enumerate(self._special_split.split(text)):
                if i % 2:  # the split's captured separators: the special tokens
                    ids.append(self.special_tokens[piece])
                elif piece:
                    ids.extend(self._encode_plain(piece))
        else:
            ids.extend(self._encode_plain(text))
        return ids

    def _bos(self) -> list[int]:
        return [self.bos_token_id] if self.add_bos and self.bos_token_id is not None else []

    def _encode_plain(self, text: str) -> list[int]:
        try:
            return encode_ordinary(text, self.vocab, self.ranks, self._cache)
        except UnicodeEncodeError as e:
            bad = e.object[e.start]
            raise ValueError(
                f"text contains a lone surrogate {bad!r} (U+{ord(bad):04X}), which is not valid "
                "Unicode text and cannot be encoded as UTF-8"
            ) from None

    # -- lengths and stops, for the front door -------------------------------

    @cached_property
    def max_token_bytes(self) -> int:
        """The most text bytes one token can stand for (SmolLM2: 81, a run of spaces after a newline).

        A normal token covers one input byte per stand-in character; a special
        token, its text in UTF-8.
        """
        return max(
            (len(t.encode("utf-8")) if ty in SPECIAL_TYPES else len(t) for t, ty in zip(self.tokens, self.token_types)),
            default=0,
        )

    @cached_property
    def _dropped_bytes(self) -> bytes | None:
        """The byte values encoding drops (no stand-in in the vocabulary), or ``None``
        if encoding can drop more than those (a merge makes a piece the vocabulary lacks)."""
        if any(a + b not in self.vocab for a, b in self.ranks):
            return None
        table = bytes_to_unicode()
        return bytes(b for b in range(256) if table[b] not in self.vocab)

    def min_token_count(self, text: str) -> int:
        """A lower bound on ``len(self.encode(text))``, in O(len(text)) without encoding.

        Every token stands for at most :attr:`max_token_bytes` bytes of the
        text, and the tokens' bytes add up to the text's (less any byte the
        vocabulary has no token for, which encoding drops), so at least
        ``ceil(bytes / max_token_bytes)`` tokens are needed — plus the BOS token
        where one is added. The same bound holds with ``allow_special=False``.
        A front door can refuse text whose bound already exceeds the context
        before spending time on encoding it. For English prose the bound is
        about a sixteenth of the real count; it is a guard, not an estimate.
        A lone surrogate (which ``encode`` refuses) counts as its 3 bytes.
        """
        if not isinstance(text, str):
            raise TypeError(f"min_token_count() takes a str, got {type(text).__name__}")
        n_bos = len(self._bos())
        dropped = self._dropped_bytes
        if dropped is None or not self.max_token_bytes:
            return n_bos
        data = text.encode("utf-8", errors="surrogatepass")
        if dropped:
            data = data.translate(None, dropped)
        return n_bos + math.ceil(len(data) / self.max_token_bytes)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The ids that end a turn in this vocabulary: ``eos_token_id`` (if set), then
        whichever of ``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>`` are special
        tokens here; in that order, without repeats. SmolLM2: ``(2, 0)``."""
        ids = [self.eos_token_id] if self.eos_token_id is not None else []
        ids += [self.special_tokens[t] for t in END_OF_TURN_TOKENS if t in self.special_tokens]
        return tuple(dict.fromkeys(ids))

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

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Messages -> token ids of the model's chat prompt, with no turn injection possible.

        The chat template (:meth:`apply_chat_template`) lays out the prompt;
        its own markers (``<|im_start|>``, ``<|im_end|>``) become control
        tokens, while the messages' text is encoded as ordinary text:
        ``<|im_end|>`` typed in a message is the 6 tokens of ``<``, ``|``,
        ``im``, ... and cannot end the turn or forge a system message. For
        messages without special-token text the ids are exactly those of
        ``encode(apply_chat_template(messages))``. See :meth:`encode_rendered_chat`.

        The references differ on purpose here: Hugging Face
        ``apply_chat_template(tokenize=True)`` and llama.cpp's server both
        render the template and encode the whole string with special tokens
        parsed, so special text inside a message *does* become control
        tokens (llama.cpp has an open request to escape it); a Hugging Face
        tokenizer with ``split_special_tokens=True`` goes the other way and
        does not parse the template's own markers either. We treat the
        template's text as trusted and the messages' as not: where the two
        references agree (no special text in messages) our ids are theirs; a
        message's special text is encoded as ``split_special_tokens`` would.
        """
        return self.encode_rendered_chat(messages, lambda m: self.apply_chat_template(m, add_generation_prompt))

    def encode_rendered_chat(
        self, messages: Sequence[Mapping[str, Any]], render: Callable[[list[dict[str, Any]]], str]
    ) -> list[int]:
        """Encode ``render(messages)``: the layout's special tokens as control tokens,
        the messages' text as ordinary text.

        ``render`` lays out a prompt from messages (the chat template, or
        :func:`.chat.render_chatml`). It is called twice: once on the real
        messages, and once on copies whose every non-empty string (except the
        role) is replaced by a placeholder unique to this call. The placeholders show
        where message text lands in the rendering; the text around them is the
        layout. Special tokens are looked for only in the layout, then each
        run of ordinary text — layout and message text together, just as
        ``encode`` would see it, so the BPE pieces at the seams are the same —
        is encoded without special tokens.

        If the rendering does not hold each message string verbatim (a
        template that trims, escapes or splits it), the placeholders cannot be
        trusted; then the real rendering is encoded normally if that finds
        exactly the special tokens the placeholder rendering has, and
        otherwise ``ValueError`` is raised rather than risk message text
        becoming control tokens.
        """
        check_messages(messages)
        digits = f"{secrets.randbelow(10**12):012d}"
        strings: list[str] = []

        def mask(value: Any) -> Any:
            if isinstance(value, str) and value:  # "" stays "", so `{% if message.content %}` still works
                strings.append(value)
                return f"\ue000{digits}#{len(strings) - 1}\ue001"
            if isinstance(value, Mapping):
                return {k: mask(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [mask(v) for v in value]
            return value

        # every string a message carries (content, a name, tool calls...) except its role, one of four words
        masked = [{k: v if k == "role" else mask(v) for k, v in m.items()} for m in messages]
        real = render([dict(m) for m in messages])
        layout = render(masked)
        parts = PLACEHOLDER.split(layout)  # layout text, digits, string index, layout text, ...
        layout_texts, found_digits, indices = parts[::3], parts[1::3], parts[2::3]
        if any(d != digits for d in found_digits):  # the template itself holds something like a placeholder
            return self._encode_rendering_checked(real, layout)
        texts = [layout_texts[0]]  # layout text, message string, layout text, ..., layout text
        for index, text in zip(indices, layout_texts[1:]):
            texts += [strings[int(index)], text]
        if "".join(texts) != real:  # message text was not inserted verbatim (or a placeholder was cut)
            return self._encode_rendering_checked(real, layout)
        ids = self._bos()
        run: list[str] = []  # ordinary text waiting to be encoded in one piece
        for k, text in enumerate(texts):
            if k % 2 or self._special_split is None:
                run.append(text)
                continue
            for i, piece in enumerate(self._special_split.split(text)):
                if i % 2:
                    if run:
                        ids.extend(self._encode_plain("".join(run)))
                        run.clear()
                    ids.append(self.special_tokens[piece])
                else:
                    run.append(piece)
        if run:
            ids.extend(self._encode_plain("".join(run)))
        return ids

    def _encode_rendering_checked(self, real: str, layout: str) -> list[int]:
        """``encode(real)``, if it finds the same special tokens as the layout alone; else ``ValueError``."""
        found = self._special_split.findall(real) if self._special_split is not None else []
        expected = self._special_split.findall(layout) if self._special_split is not None else []
        if found != expected:
            raise ValueError(
                "the chat template does not insert message text verbatim, and with these messages the "
                "prompt holds other special tokens than the template's own, so message text could become "
                "control tokens; remove special-token text (e.g. '<|im_end|>') from the messages"
            )
        return self.encode(real, allow_special=True)

    def count_chat_tokens(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> int:
        """How many tokens the chat prompt takes: ``len(encode_chat(messages))``."""
        return len(self.encode_chat(messages, add_generation_prompt))

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.ranks)}, special={len(self.special_tokens)})"
