"""The Tokenizer: byte-level BPE or SentencePiece, built from a GGUF file or (:mod:`.hf`) a Hugging Face directory (ch. 2).

Everything it needs is in the GGUF metadata: ``tokenizer.ggml.model``
(``"gpt2"``: byte-level BPE; ``"llama"``: SentencePiece), ``tokenizer.ggml.pre``
(which pre-tokeniser a BPE vocabulary was trained with), ``tokenizer.ggml.tokens``
(id -> token text), ``tokenizer.ggml.token_type`` (1 normal, 2 unknown, 3 control,
4 user-defined, 6 byte), ``tokenizer.ggml.merges`` (BPE, ``"left right"`` in rank
order) or ``tokenizer.ggml.scores`` (SentencePiece), the special ids and the chat
template. No external tokenizer library runs in this path; Hugging Face
``tokenizers`` and llama.cpp's own test vectors are the references in the tests.

What is common to both kinds lives here (special tokens, BOS, decoding,
streaming, the length bound, chat); what differs is a :class:`~.model.TextModel`.

**BOS.** :meth:`Tokenizer.encode` adds the BOS token only when asked
(``add_bos=True``), so ``encode(text, allow_special=False)`` is exactly
llama.cpp's ``tokenize(text, add_special=False, parse_special=False)``.
:meth:`Tokenizer.encode_prompt` applies the model's rule (``add_bos``: the
file's ``tokenizer.ggml.add_bos_token``, else llama.cpp's default for the
kind) to a raw text prompt; that is what ``generate`` uses. A rendered chat
template writes its own ``{{ bos_token }}``, so no BOS is added to it
(Hugging Face's ``add_special_tokens=False``).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import regex

from .chat import check_messages, render_chat_template
from .messages import LAYOUT_WORDS, template_data
from .model import MODEL_KINDS, BPEModel, TextModel
from .pretokenizers import PreTokenizer, pre_tokenizer
from .sentencepiece import SentencePieceModel
from .special import (
    C_WHITESPACE,
    END_OF_GENERATION,
    SPECIAL_TYPES,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_UNUSED,
    TOKEN_USER_DEFINED,
    SpecialTokens,
    end_of_generation_ids,
)
from .streaming import StreamDecoder

if TYPE_CHECKING:
    from ..formats.gguf import GGUFFile

__all__ = [
    "TOKEN_BYTE", "TOKEN_CONTROL", "TOKEN_NORMAL", "TOKEN_UNKNOWN", "TOKEN_UNUSED", "TOKEN_USER_DEFINED",
    "Tokenizer",
]
# encode_rendered_chat's placeholders: a private-use character, 12 random digits, "#", an index, another
PLACEHOLDER = regex.compile("\ue000([0-9]{12})#([0-9]+)\ue001")


def _phi3_rstrip(tokens: Sequence[str], types: Sequence[int]) -> set[int]:
    """The tokens llama.cpp makes swallow the whitespace after them in a model named Phi-3:
    every special token and ``</s>``, but not ``<unk>``, ``<s>``, ``<|endoftext|>``."""
    ids = {i for i, ty in enumerate(types) if ty in SPECIAL_TYPES}
    ids |= {i for i, t in enumerate(tokens) if t == "</s>"}
    return {i for i in ids if tokens[i] not in ("<unk>", "<s>", "<|endoftext|>")}


class Tokenizer:
    """A tokenizer: byte-level BPE (``kind="gpt2"``) or SentencePiece (``kind="llama"``).

    Args:
        tokens: token text by id (BPE: in byte stand-in characters, ``"Ġthe"``;
            SentencePiece: pieces with ``▁`` for a space, ``<0x0A>`` byte tokens).
        merges: BPE merges in rank order, as ``"left right"`` strings or pairs (SentencePiece: none).
        token_types: llama.cpp token types by id; control, user-defined and unknown
            tokens are *special* (see :mod:`.special`).
        bos_token_id, eos_token_id, eot_token_id, eom_token_id, unk_token_id: the special ids.
        chat_template: a Jinja2 chat template (the GGUF's ``tokenizer.chat_template``).
        add_bos: the model's rule: does a raw text prompt start with BOS (:meth:`encode_prompt`)?
            ``None``: the pre-tokeniser's default (BPE) or yes (SentencePiece), as llama.cpp.
        word_cache_size: how many words' ids BPE remembers (see :class:`~.word_cache.WordCache`).
        pre: the BPE pre-tokeniser's name (``tokenizer.ggml.pre``; :mod:`.pretokenizers`);
            ``"smollm"`` by default, chapter 2's tokenizer.
        kind: ``"gpt2"`` or ``"llama"`` (GGUF's ``tokenizer.ggml.model``).
        scores: SentencePiece piece scores by id.
        add_space_prefix: SentencePiece writes a space before each run of text (default yes).
        rstrip, lstrip: ids of special tokens that swallow the whitespace after / before them.
    """

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str | tuple[str, str]] = (),
        token_types: Sequence[int] | None = None,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        eot_token_id: int | None = None,
        eom_token_id: int | None = None,
        unk_token_id: int | None = None,
        chat_template: str | None = None,
        add_bos: bool | None = None,
        word_cache_size: int = 2**16,
        pre: str | None = "smollm",
        kind: str = "gpt2",
        scores: Sequence[float] | None = None,
        add_space_prefix: bool = True,
        rstrip: Collection[int] = (),
        lstrip: Collection[int] = (),
    ):
        from .bpe import merge_ranks

        if kind not in MODEL_KINDS:
            raise ValueError(f"unknown tokenizer model {kind!r} (tokenizer.ggml.model); supported: "
                             + ", ".join(f"{k!r}" for k in MODEL_KINDS))
        self.tokens = list(tokens)
        types = list(token_types) if token_types is not None else [TOKEN_NORMAL] * len(self.tokens)
        if len(types) != len(self.tokens):
            raise ValueError(f"{len(types)} token types for {len(self.tokens)} tokens")
        for name, tid in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id),
                          ("eot_token_id", eot_token_id), ("eom_token_id", eom_token_id),
                          ("unk_token_id", unk_token_id)):
            if tid is not None and not 0 <= tid < len(self.tokens):
                raise ValueError(f"{name} {tid} is outside the vocabulary of {len(self.tokens)}")
        self.kind = kind
        self.vocab: dict[str, int] = {}
        if kind == "gpt2":
            for i, t in enumerate(self.tokens):
                self.vocab.setdefault(t, i)  # Hugging Face's BPE: a repeated text keeps its first id
        else:
            self.vocab = {t: i for i, t in enumerate(self.tokens)}  # llama.cpp's token_to_id: the last
        # end-of-generation texts are control tokens whatever the file says (llama.cpp overrides them too)
        for t in END_OF_GENERATION:
            if t in self.vocab and types[self.vocab[t]] != TOKEN_CONTROL:
                types[self.vocab[t]] = TOKEN_CONTROL
        self.token_types = types
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.eot_token_id, self.eom_token_id, self.unk_token_id = eot_token_id, eom_token_id, unk_token_id
        self.chat_template = chat_template
        self.specials = SpecialTokens(self.tokens, types, rstrip, lstrip)
        self.special_tokens: dict[str, int] = self.specials.ids
        self.pre: PreTokenizer | None = None
        self.model: TextModel
        if kind == "gpt2":
            self.pre = pre_tokenizer(pre)
            self.ranks = merge_ranks(merges)
            self.model = BPEModel(self.tokens, self.vocab, self.ranks, self.pre, word_cache_size)
            self._cache = self.model.cache
            self.add_bos = self.pre.add_bos if add_bos is None else bool(add_bos)
            self.clean_spaces = self.pre.clean_spaces
        else:
            if merges:
                raise ValueError("a SentencePiece tokenizer has scores, not merges")
            self.ranks = {}
            self.model = SentencePieceModel(self.tokens, list(scores) if scores is not None else [0.0] * len(self.tokens),
                                            types, self.vocab, add_space_prefix=add_space_prefix,
                                            unk_token_id=unk_token_id)
            self.add_bos = True if add_bos is None else bool(add_bos)
            self.clean_spaces = False
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Tokenizer:
        """Build the tokenizer from a GGUF file's ``tokenizer.*`` metadata (``model`` ``"gpt2"`` or ``"llama"``).

        An unknown ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre`` is refused
        with a ``ValueError`` naming it and the supported values (llama.cpp throws
        too); a BPE vocabulary that names no pre-tokeniser gets llama.cpp's
        ``default`` one, as llama.cpp does.
        """
        md = gguf.metadata
        kind = md.get("tokenizer.ggml.model")
        if kind not in MODEL_KINDS:
            raise ValueError(f"{gguf.path}: tokenizer.ggml.model is {kind!r}; supported: "
                             + ", ".join(f"{k!r} ({d})" for k, d in zip(MODEL_KINDS, ("byte-level BPE", "SentencePiece"))))
        needed = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges") if kind == "gpt2" else (
            "tokenizer.ggml.tokens", "tokenizer.ggml.scores")
        for key in needed:
            if key not in md:
                raise ValueError(f"{gguf.path}: GGUF metadata lacks {key!r}")
        tokens = md["tokenizer.ggml.tokens"]
        types = md.get("tokenizer.ggml.token_type")
        if types is None:
            types = [TOKEN_NORMAL] * len(tokens)
        name = str(md.get("general.name", "")).lower()
        rstrip = _phi3_rstrip(tokens, types) if "phi-3" in name or "phi3" in name else ()
        add_bos = md.get("tokenizer.ggml.add_bos_token")
        special = {}
        for key in ("bos", "eos", "eot", "eom", "unk"):
            special[f"{key}_token_id"] = md.get(f"tokenizer.ggml.{'unknown' if key == 'unk' else key}_token_id")
        if kind == "llama":  # llama.cpp's defaults for SentencePiece
            special = {"bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0} | {
                k: v for k, v in special.items() if v is not None}
        pre = md.get("tokenizer.ggml.pre")
        try:
            return cls(
                tokens, md.get("tokenizer.ggml.merges", []) if kind == "gpt2" else (), types,
                chat_template=md.get("tokenizer.chat_template"),
                add_bos=None if add_bos is None else bool(add_bos),
                pre=pre, kind=kind, scores=md.get("tokenizer.ggml.scores"),
                add_space_prefix=bool(md.get("tokenizer.ggml.add_space_prefix", True)),
                rstrip=rstrip, **special,
            )
        except ValueError as e:
            raise ValueError(f"{gguf.path}: {e}") from None

    # -- encoding ------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, allow_special: bool = True, *, add_bos: bool = False) -> list[int]:
        """Text -> token ids; BOS first only with ``add_bos=True`` (see :meth:`encode_prompt`).

        With ``allow_special`` (the default, right for chat prompts) special
        tokens written in the text, like ``<|im_start|>``, become their ids;
        without it they are encoded as plain text — use that for untrusted
        user input, so nobody can inject a turn boundary. (User-defined tokens,
        which control nothing, are matched either way, as in llama.cpp and
        Hugging Face.) ``encode(text, allow_special=False)`` equals llama.cpp's
        ``tokenize(text, add_special=False, parse_special=False)``.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        ids = self.bos_ids(add_bos)
        for piece in self.split_special(text, allow_special):
            if isinstance(piece, int):
                ids.append(piece)
            else:
                ids.extend(self._encode_plain(piece))
        return ids

    def encode_prompt(self, text: str, allow_special: bool = False) -> list[int]:
        """A raw text prompt -> ids, by the model's BOS rule: BOS first if :attr:`add_bos`
        (Llama 2/3, Phi-3: yes; SmolLM2, Qwen2: no). What ``generate`` does with text."""
        return self.encode(text, allow_special, add_bos=self.add_bos)

    def bos_ids(self, add_bos: bool) -> list[int]:
        """``[bos_token_id]`` if ``add_bos`` and the vocabulary has one, else ``[]``."""
        return [self.bos_token_id] if add_bos and self.bos_token_id is not None else []

    def _bos(self) -> list[int]:
        """The model's BOS rule for a raw prompt (``bos_ids(self.add_bos)``)."""
        return self.bos_ids(self.add_bos)

    def split_special(self, text: str, allow_special: bool = True) -> list[str | int]:
        """``text`` -> ordinary text runs (``str``) and special token ids (``int``), as
        :meth:`encode` sees it (see :mod:`.special`)."""
        return self.specials.split(text, allow_special)

    def _encode_plain(self, text: str) -> list[int]:
        """One run of ordinary text (at the start or after a special token) -> ids."""
        try:
            return self.model.encode(text)
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

        A normal token covers the bytes it decodes to (BPE: one per stand-in
        character; SentencePiece: ``▁`` is one space); a special token, its text in UTF-8.
        """
        return max(
            (len(t.encode("utf-8")) if ty in SPECIAL_TYPES else self.model.text_bytes(i)
             for i, (t, ty) in enumerate(zip(self.tokens, self.token_types))),
            default=0,
        )

    @cached_property
    def _dropped_bytes(self) -> bytes | None:
        """The byte values encoding may drop (they cost no token), or ``None`` if encoding can
        drop more than those. Whitespace beside a special token that strips it costs nothing too."""
        dropped = self.model.dropped_bytes()
        if dropped is not None and (self.specials.rstrip or self.specials.lstrip):
            dropped = bytes(sorted(set(dropped) | set(C_WHITESPACE.encode())))
        return dropped

    def min_token_count(self, text: str) -> int:
        """A lower bound on ``len(self.encode_prompt(text))``, in O(len(text)) without encoding.

        Every token stands for at most :attr:`max_token_bytes` bytes of the
        text, and the tokens' bytes add up to at least the text's (less any byte
        the vocabulary has no token for, which encoding drops, and whitespace a
        stripping special token swallows), so at least ``ceil(bytes /
        max_token_bytes)`` tokens are needed — plus the BOS token where the
        model adds one. The same bound holds with ``allow_special=False``.
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
        """The ids that end generation: ``eos_token_id``, ``eot_token_id``, ``eom_token_id`` (those
        set), then every text of llama.cpp's end-of-generation list (``<|eot_id|>``, ``<|im_end|>``,
        ``<|end|>``, ``<end_of_turn>``, ``<|endoftext|>``, ``</s>``, ``<|eom_id|>``,
        ``<|end_of_text|>``, ``<eos>``, ...; :data:`.special.END_OF_GENERATION`) this vocabulary
        has; in that order, without repeats. SmolLM2: ``(2, 0)``."""
        return end_of_generation_ids(self.vocab, (self.eos_token_id, self.eot_token_id, self.eom_token_id))

    # -- decoding ------------------------------------------------------------

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self.tokens):
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{len(self.tokens) - 1})")

    def is_special(self, token_id: int) -> bool:
        self._check_id(token_id)
        return self.token_types[token_id] in SPECIAL_TYPES

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its text in UTF-8; SentencePiece's
        ``▁`` is a space, ``<0xXX>`` one byte)."""
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        self._check_id(token_id)
        if self.token_types[token_id] in SPECIAL_TYPES:
            data = self.tokens[token_id].encode("utf-8")
        else:
            data = self.model.piece_bytes(token_id)
        self._bytes_cache[token_id] = data
        return data

    def decode_bytes(self, ids: Sequence[int], skip_special: bool = False) -> bytes:
        """The tokens' bytes, joined; the space SentencePiece writes before a text is taken
        off again at the start (llama.cpp's ``detokenize`` does the same)."""
        data = b"".join(
            self.token_bytes(int(i)) for i in ids if not (skip_special and self.is_special(int(i)))
        )
        if self.model.leading_space and data.startswith(b" "):
            data = data[1:]
        return data

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Token ids -> text. Bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def piece(self, token_id: int) -> str:
        """A token as it is stored in the vocabulary (``"Ġthe"``, ``"▁the"``), for display."""
        self._check_id(token_id)
        return self.tokens[token_id]

    def stream_decoder(self, skip_special: bool = False, *, at_start: bool = False) -> StreamDecoder:
        """A :class:`StreamDecoder` for printing tokens as they are generated.

        ``at_start``: the tokens begin a text (as :meth:`decode` assumes), so the
        space SentencePiece writes before a text is dropped; generated tokens
        continue a prompt, where that space is real (the default).
        """
        return StreamDecoder(self, skip_special=skip_special,
                             drop_leading_space=at_start and self.model.leading_space)

    # -- chat ----------------------------------------------------------------

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, *,
        tools: Sequence[Mapping[str, Any]] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}]``) with the model's chat template.

        ``tools`` (JSON schemas of functions) and ``chat_template_kwargs`` (template
        variables such as ``enable_thinking`` or ``date_string``, vLLM's name) are
        checked (:func:`.messages.check_tools`, :func:`.messages.check_template_kwargs`)
        and passed to the template beside ``bos_token`` and ``eos_token``; the
        equivalent of ``transformers``' ``apply_chat_template(messages, tools=tools,
        add_generation_prompt=..., tokenize=False, **chat_template_kwargs)``.
        """
        return self._render_chat(messages, add_generation_prompt, template_data(tools, chat_template_kwargs))

    def _render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                     data: Mapping[str, Any]) -> str:
        """The template rendered with the caller's (checked) ``data`` and this vocabulary's special tokens."""
        if not self.chat_template:
            raise ValueError("this model has no chat template (tokenizer.chat_template)")
        special = {
            "bos_token": self.tokens[self.bos_token_id] if self.bos_token_id is not None else "",
            "eos_token": self.tokens[self.eos_token_id] if self.eos_token_id is not None else "",
        }
        return render_chat_template(self.chat_template, messages, add_generation_prompt, **special, **data)

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, *,
        tools: Sequence[Mapping[str, Any]] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Messages -> token ids of the model's chat prompt, with no turn injection possible.

        The chat template (:meth:`apply_chat_template`, with the same ``tools`` and
        ``chat_template_kwargs``) lays out the prompt; its own markers
        (``<|im_start|>``, ``<|im_end|>``) become control tokens, while the
        messages' text (and the tools' and variables') is encoded as ordinary
        text: ``<|im_end|>`` typed in a message is the 6 tokens of ``<``, ``|``,
        ``im``, ... and cannot end the turn or forge a system message. For
        messages without special-token text the ids are exactly those of
        ``encode(apply_chat_template(messages))``. See :meth:`encode_rendered_chat`.

        No BOS is added: the template writes ``{{ bos_token }}`` where the model
        wants one (transformers encodes a rendered chat with
        ``add_special_tokens=False``; adding one too gave Llama 3 and Phi-3 two).

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
        data = template_data(tools, chat_template_kwargs)
        return self.encode_rendered_chat(
            messages, lambda m, d: self._render_chat(m, add_generation_prompt, d), data)

    def encode_rendered_chat(
        self, messages: Sequence[Mapping[str, Any]], render: Callable[[list[dict[str, Any]], dict[str, Any]], str],
        data: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Encode ``render(messages, data)``: the layout's special tokens as control tokens,
        the messages' (and ``data``'s) text as ordinary text; no BOS is added.

        ``render`` lays out a prompt from messages and the caller's template data
        (tools, template variables: untrusted like the messages), e.g. the chat
        template or :func:`.chat.render_chatml`. It is called twice: once on the
        real messages and data, and once on copies whose every non-empty string is
        replaced by a placeholder unique to this call — except a message's role
        and a ``type`` that is one of a few fixed words (``text``, ``function``,
        JSON-schema types), which templates compare and which hold no special
        token. The placeholders show where user text lands in the rendering; the
        text around them is the layout. Special tokens are looked for only in the
        layout (a user string may hold a user-defined token, as plain encoding
        finds them, but never one the layout writes: command-r's turn markers are
        user-defined), then each run of ordinary text — layout and user text together,
        just as ``encode`` would see it, so the pieces at the seams are the same —
        is encoded without special tokens.

        If the rendering does not hold each string verbatim (a template that
        trims, escapes or splits it, or compares it), the placeholders cannot be
        trusted; then the real rendering is encoded normally if that finds
        exactly the special tokens the placeholder rendering has, and otherwise
        ``ValueError`` is raised rather than risk user text becoming control tokens.
        """
        check_messages(messages)
        data = dict(data or {})
        digits = f"{secrets.randbelow(10**12):012d}"
        strings: list[str] = []

        def mask(value: Any, key: str | None = None) -> Any:
            if isinstance(value, str) and value:  # "" stays "", so `{% if message.content %}` still works
                if key in ("role", "type") and value in LAYOUT_WORDS \
                        and not any(isinstance(p, int) for p in self.split_special(value)):
                    return value  # a word templates compare (`item.type == 'text'`), not free text
                strings.append(value)
                return f"\ue000{digits}#{len(strings) - 1}\ue001"
            if isinstance(value, Mapping):
                return {k: mask(v, k) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [mask(v) for v in value]
            return value

        real = render([dict(m) for m in messages], data)
        layout = render(mask(list(messages)), mask(data))
        parts = PLACEHOLDER.split(layout)  # layout text, digits, string index, layout text, ...
        layout_texts, found_digits, indices = parts[::3], parts[1::3], parts[2::3]
        if any(d != digits for d in found_digits):  # the template itself holds something like a placeholder
            return self._encode_rendering_checked(real, layout)
        texts = [layout_texts[0]]  # layout text, user string, layout text, ..., layout text
        for index, text in zip(indices, layout_texts[1:]):
            texts += [strings[int(index)], text]
        if "".join(texts) != real:  # user text was not inserted verbatim (or a placeholder was cut)
            return self._encode_rendering_checked(real, layout)
        ids: list[int] = []
        run: list[str] = []  # ordinary text waiting to be encoded in one piece
        strip_next = False  # the last token swallows the whitespace after it (Phi-3's rstrip), across seams too

        def add_text(piece: str) -> None:
            nonlocal strip_next
            if strip_next:
                piece = piece.lstrip(C_WHITESPACE)
                if not piece:
                    return
                strip_next = False
            run.append(piece)

        def add_token(token_id: int) -> None:
            nonlocal strip_next
            text = "".join(run)
            if token_id in self.specials.lstrip:
                text = text.rstrip(C_WHITESPACE)
            if text:
                ids.extend(self._encode_plain(text))
            run.clear()
            ids.append(token_id)
            strip_next = token_id in self.specials.rstrip

        # the tokens the layout itself writes: a user string holding one is all ordinary text, even where
        # the token is user-defined (command-r's <|START_OF_TURN_TOKEN|>, which plain encoding matches)
        layout_tokens = {p for t in layout_texts for p in self.split_special(t) if isinstance(p, int)}
        for k, text in enumerate(texts):
            # user strings (odd k) are text: only user-defined tokens the layout does not use are matched
            pieces = self.split_special(text, allow_special=not k % 2)
            if k % 2 and any(isinstance(p, int) and p in layout_tokens for p in pieces):
                add_text(text)
                continue
            for piece in pieces:
                if isinstance(piece, int):
                    add_token(piece)
                else:
                    add_text(piece)
        if run:
            ids.extend(self._encode_plain("".join(run)))
        return ids

    def _encode_rendering_checked(self, real: str, layout: str) -> list[int]:
        """``encode(real)``, if it finds the same special tokens as the layout alone; else ``ValueError``."""
        found = [p for p in self.split_special(real) if isinstance(p, int)]
        expected = [p for p in self.split_special(layout) if isinstance(p, int)]
        if found != expected:
            raise ValueError(
                "the chat template does not insert message text verbatim, and with these messages the "
                "prompt holds other special tokens than the template's own, so message text could become "
                "control tokens; remove special-token text (e.g. '<|im_end|>') from the messages"
            )
        return self.encode(real, allow_special=True)

    def count_chat_tokens(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, *,
        tools: Sequence[Mapping[str, Any]] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> int:
        """How many tokens the chat prompt takes: ``len(encode_chat(messages, ...))``."""
        return len(self.encode_chat(messages, add_generation_prompt, tools=tools,
                                    chat_template_kwargs=chat_template_kwargs))

    def __repr__(self) -> str:
        pre = f", pre={self.pre.name!r}" if self.pre is not None else ""
        return (f"Tokenizer(kind={self.kind!r}{pre}, vocab_size={self.vocab_size}, merges={len(self.ranks)}, "
                f"special={len(self.special_tokens)})")
