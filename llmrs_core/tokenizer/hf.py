"""Hugging Face ``tokenizer.json`` / ``tokenizer_config.json``: reading and writing (chapters 2 and 10).

``from_hf_dir(directory) -> Tokenizer`` and ``save_hf(tokenizer, directory)``.
Layouts (what :func:`save_hf` writes and :func:`from_hf_dir` reads back):

* SmolLM2 (``smollm``): pre-tokeniser ``Sequence[Digits(individual_digits), ByteLevel(use_regex)]``,
  as SmolLM2's own file has it;
* every other BPE pre-tokeniser of :mod:`.pretokenizers`: ``Sequence[Split(pattern,
  "Isolated") for each pattern, ByteLevel(use_regex=False)]``, and ``ignore_merges``
  in the model (Llama 3). Hugging Face's own files write Llama 3's and Qwen2's
  contraction group as ``(?i:'s|'t|...)``; that form is read as the same pre-tokeniser;
* SentencePiece, as Hugging Face converts it (``LlamaConverter``, legacy): a BPE model
  with ``byte_fallback`` over the ``▁`` pieces, merges ordered by the joined piece's
  score, highest first; normaliser ``Prepend("▁")`` (when ``add_space_prefix``) and
  ``Replace(" ", "▁")``; no pre-tokeniser. Read back, a piece's score is minus the
  rank of the first merge that makes it, which orders merges as the scores did.

``tokenizer_config.json`` also records the pre-tokeniser's llama.cpp name (``llama_cpp_pre``).
Added tokens carry each special token's ``lstrip``/``rstrip`` (Phi-3's rstrip) and
whether it is special (control) or not (user-defined: matched even in plain text).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .pretokenizers import PRE_TOKENIZERS, PreTokenizer
from .sentencepiece import SPACE
from .special import TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_UNUSED, TOKEN_USER_DEFINED
from .tokenizer import Tokenizer

SMOLLM2_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
# Hugging Face's spelling of a case-insensitive contraction group, which llama.cpp writes out
HF_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
LLAMA_CPP_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# patterns we write in an equivalent linear-time form (see pretokenizers._TRAILING_SPACE)
LINEAR_FORMS = {r"\s+$": r"(?<!\s)\s+$"}


def read_json_object(path: Path) -> dict[str, Any]:
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


_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})")


def literal(pattern: str) -> str:
    """``pattern`` with its ``\\uXXXX``/``\\UXXXXXXXX`` escapes written as the characters: Hugging
    Face's regex engine (Oniguruma) has no ``\\U`` escape, and would read DeepSeek's letter ranges wrong."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), pattern)


def hf_pre_tokenizer(pre: PreTokenizer) -> dict[str, Any]:
    """The ``pre_tokenizer`` entry for a BPE pre-tokeniser."""
    if pre.name == "smollm":
        return SMOLLM2_PRE_TOKENIZER
    splits = [{"type": "Split", "pattern": {"Regex": literal(p)}, "behavior": "Isolated", "invert": False}
              for p in pre.patterns]
    return {"type": "Sequence", "pretokenizers": [*splits, BYTE_LEVEL]}


def _pre_from_hf(entry: Any, named: str | None = None) -> str | None:
    """The name of the pre-tokeniser a ``pre_tokenizer`` entry describes, or None; ``named``
    (``tokenizer_config.json``'s ``llama_cpp_pre``) chooses among names with the same patterns."""
    if entry == SMOLLM2_PRE_TOKENIZER:
        return "smollm"
    if isinstance(entry, dict) and entry.get("type") == "ByteLevel" and entry.get("use_regex", True):
        return "gpt-2"  # GPT-2's own file: ByteLevel's built-in regex is GPT-2's
    if not isinstance(entry, dict) or entry.get("type") != "Sequence":
        return None
    steps = entry.get("pretokenizers")
    if not isinstance(steps, list) or not steps or not isinstance(steps[-1], dict):
        return None
    if steps[-1].get("type") != "ByteLevel" or steps[-1].get("use_regex", True):
        return None
    patterns = []
    for step in steps[:-1]:
        if not (isinstance(step, dict) and step.get("type") == "Split" and step.get("behavior") == "Isolated"
                and not step.get("invert") and isinstance(step.get("pattern"), dict)
                and isinstance(step["pattern"].get("Regex"), str)):
            return None
        pattern = literal(step["pattern"]["Regex"].replace(HF_CONTRACTIONS, LLAMA_CPP_CONTRACTIONS))
        patterns.append(LINEAR_FORMS.get(pattern, pattern))
    # the name save_hf wrote, if its patterns are these; else the first name with these patterns
    names = [n for n in (named, *PRE_TOKENIZERS) if n in PRE_TOKENIZERS]
    return next((n for n in names if tuple(map(literal, PRE_TOKENIZERS[n].patterns)) == tuple(patterns)), None)


def _is_sentencepiece(data: dict[str, Any]) -> bool:
    model = data.get("model")
    return isinstance(model, dict) and bool(model.get("byte_fallback")) and data.get("pre_tokenizer") is None


def from_hf_dir(directory: str | os.PathLike[str]) -> Tokenizer:
    """Build the tokenizer from a Hugging Face ``tokenizer.json`` (+ ``tokenizer_config.json``).

    Byte-level BPE with any pre-tokeniser of :mod:`.pretokenizers` in the
    layout :func:`save_hf` writes (``Split`` by each pattern, then
    ``ByteLevel``; SmolLM2's ``Digits`` + ``ByteLevel``), and SentencePiece
    as Hugging Face converts it (BPE with ``▁`` and byte fallback). Anything
    else raises ``ValueError`` rather than encode wrongly.
    """
    return Tokenizer(**read_hf_dir(Path(directory)))


def read_hf_dir(directory: Path) -> dict[str, Any]:
    """The :class:`~.tokenizer.Tokenizer` arguments a Hugging Face directory describes."""
    path = directory / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"{directory} has no tokenizer.json")
    data = read_json_object(path)
    model = data.get("model") or {}
    if not isinstance(model, dict) or model.get("type") != "BPE":
        raise ValueError(f"{path}: only BPE models (byte-level, or SentencePiece converted to BPE) are supported")
    cfg_path = directory / "tokenizer_config.json"
    cfg = read_json_object(cfg_path) if cfg_path.exists() else {}
    spm = _is_sentencepiece(data)
    named = cfg.get("llama_cpp_pre")
    pre = None if spm else _pre_from_hf(data.get("pre_tokenizer"), named if isinstance(named, str) else None)
    if not spm and pre is None:
        raise ValueError(f"{path}: the pre_tokenizer is none of the supported byte-level BPE layouts "
                         "(SmolLM2's Digits + ByteLevel, GPT-2's ByteLevel, or Split by one of the "
                         f"pre-tokenisers {', '.join(sorted(PRE_TOKENIZERS))} + ByteLevel)")
    vocab = model.get("vocab")
    entries = data.get("added_tokens", [])
    if (not isinstance(vocab, dict) or not isinstance(entries, list)
            or not all(isinstance(t, dict) and isinstance(t.get("content"), str) for t in entries)):
        raise ValueError(f"{path}: model.vocab must map token text to ids, and added_tokens be a list of "
                         "{content, id} objects")
    added = {t["content"]: t for t in entries}
    ids = [*vocab.values(), *(t.get("id") for t in entries)]
    if not ids or not all(type(i) is int and i >= 0 for i in ids):
        raise ValueError(f"{path}: token ids must be non-negative integers")
    size = max(ids) + 1
    if size > path.stat().st_size:  # a vocabulary of that size cannot be written in this file
        raise ValueError(f"{path}: token id {size - 1:,} is larger than the file ({path.stat().st_size:,} "
                         f"bytes) can describe a vocabulary for; the ids are damaged")
    tokens = [""] * size
    types = [TOKEN_UNUSED] * size
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = TOKEN_BYTE if spm and len(text) == 6 and text.startswith("<0x") and text.endswith(">") \
            else TOKEN_NORMAL
    unk = model.get("unk_token")
    rstrip, lstrip = set(), set()
    for text, t in added.items():
        i = t["id"]
        tokens[i] = text
        types[i] = (TOKEN_UNKNOWN if text == unk else TOKEN_CONTROL) if t.get("special", False) else TOKEN_USER_DEFINED
        if t.get("rstrip"):
            rstrip.add(i)
        if t.get("lstrip"):
            lstrip.add(i)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    def special_id(key: str) -> int | None:
        value = cfg.get(key)
        content = value.get("content") if isinstance(value, dict) else value
        if not content:
            return None
        return added[content]["id"] if content in added else vocab.get(content)

    args: dict[str, Any] = dict(
        tokens=tokens, token_types=types, rstrip=rstrip, lstrip=lstrip,
        bos_token_id=special_id("bos_token"), eos_token_id=special_id("eos_token"),
        chat_template=cfg.get("chat_template"),
        add_bos=bool(cfg["add_bos_token"]) if "add_bos_token" in cfg else None,
    )
    if spm:
        args.update(kind="llama", scores=_scores_from_merges(tokens, vocab, merges), pre=None,
                    unk_token_id=vocab.get(unk) if isinstance(unk, str) else None,
                    add_space_prefix=_prepends_space(data.get("normalizer")))
    else:
        args.update(merges=merges, pre=pre)
    return args


def _prepends_space(normalizer: Any) -> bool:
    steps = normalizer.get("normalizers", []) if isinstance(normalizer, dict) else []
    return any(isinstance(s, dict) and s.get("type") == "Prepend" and s.get("prepend") == SPACE for s in steps)


def _scores_from_merges(tokens: list[str], vocab: dict[str, int], merges: list[str]) -> list[float]:
    """SentencePiece scores that order the pieces as the merges do: minus the rank of the
    first merge that makes a piece; pieces no merge makes (single characters, bytes) score
    below all of them (they are never looked up as a joined pair)."""
    scores = [float(-len(merges) - 1)] * len(tokens)
    seen = set()
    for rank, merge in enumerate(merges):
        left, _, right = merge.partition(" ")
        piece = left + right
        if piece in vocab and piece not in seen:
            seen.add(piece)
            scores[vocab[piece]] = float(-rank)
    return scores


def _sentencepiece_merges(tok: Tokenizer) -> list[list[str]]:
    """Hugging Face's ``SentencePieceExtractor``: every split of every piece into two pieces,
    ordered by the piece's score, highest first (ties: the piece's id, then the halves' ids)."""
    vocab = tok.vocab
    merges = []
    for piece, i in vocab.items():
        if tok.token_types[i] != TOKEN_NORMAL:
            continue
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        merges.extend((tok.model.scores[i], i, lr) for lr in local)
    merges.sort(key=lambda m: (-m[0], m[1]))
    return [list(lr) for _, _, lr in merges]


def save_hf(tok: Tokenizer, directory: str | os.PathLike[str]) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for ``tok`` (the layouts above), which
    Hugging Face ``tokenizers`` (and :func:`from_hf_dir`) read as this tokenizer."""
    directory = Path(directory)
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": i in tok.specials.lstrip,
         "rstrip": i in tok.specials.rstrip, "normalized": False,
         "special": tok.token_types[i] != TOKEN_USER_DEFINED}
        for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
    ]
    vocab = {t: i for t, i in tok.vocab.items()} if tok.kind == "gpt2" else {
        t: i for i, t in enumerate(tok.tokens) if tok.vocab.get(t) == i}
    if tok.kind == "gpt2":
        assert tok.pre is not None  # a BPE tokenizer always has one
        merges = [[a, b] for (a, b), _ in sorted(tok.ranks.items(), key=lambda kv: kv[1])]
        data = {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": hf_pre_tokenizer(tok.pre), "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": tok.pre.ignore_merges, "vocab": vocab, "merges": merges},
        }
    else:
        unk = tok.tokens[tok.unk_token_id] if tok.unk_token_id is not None else None
        normalizers = [{"type": "Prepend", "prepend": SPACE}] if tok.model.leading_space else []
        normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": SPACE})
        decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                    {"type": "ByteFallback"}, {"type": "Fuse"}]
        if tok.model.leading_space:
            decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
        data = {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": normalizers}, "pre_tokenizer": None,
            "post_processor": None, "decoder": {"type": "Sequence", "decoders": decoders},
            "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                      "ignore_merges": False, "vocab": vocab, "merges": _sentencepiece_merges(tok)},
        }
    (directory / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    def text(tid: int | None) -> str | None:
        return tok.tokens[tid] if tid is not None else None

    config = {
        "tokenizer_class": "GPT2Tokenizer" if tok.kind == "gpt2" else "LlamaTokenizerFast",
        "bos_token": text(tok.bos_token_id),
        "eos_token": text(tok.eos_token_id),
        "add_bos_token": tok.add_bos,
        "chat_template": tok.chat_template,
    }
    if tok.kind == "llama":
        config["unk_token"] = text(tok.unk_token_id)
    else:  # which of the names with these patterns (their defaults differ); Hugging Face ignores it
        config["llama_cpp_pre"] = tok.pre.name
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                                    encoding="utf-8")
