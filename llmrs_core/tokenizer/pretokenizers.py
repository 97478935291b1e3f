"""The pre-tokeniser zoo: how each byte-level BPE vocabulary cuts text into words (chapter 2, beyond the book).

A GGUF file names its pre-tokeniser in ``tokenizer.ggml.pre``; the regular
expressions and per-type defaults here are ported from llama.cpp's
``src/llama-vocab.cpp`` (``llm_tokenizer_bpe`` and ``llama_vocab::impl::load``,
llama-cpp-python 0.3.36's vendored copy). A pre-tokeniser is a list of
patterns applied one after the other, as llama.cpp's ``unicode_regex_split``
does: each piece so far is cut into the pattern's matches *and* the text
between them (Hugging Face's ``Split(behavior="Isolated")``), so nothing is
ever dropped. Merges never cross a word boundary.

The differences that matter most:

* digits: Llama 3 (``\\p{N}{1,3}``) groups them in threes, Qwen2 and
  SmolLM2 (``\\p{N}``) take one at a time, GPT-2 keeps a whole run;
* ``[^\\r\\n\\p{L}\\p{N}]?\\p{L}+`` (Llama 3, Qwen2) lets any one symbol, not
  only a space, lead a word;
* ``ignore_merges`` (Llama 3): a word that is itself in the vocabulary is one
  token, even when the merges would not build it.

llama.cpp writes ``(?i:'s|...)`` out as ``'[sS]|...`` for its own regex
engine; the two mean the same for these contractions, and we keep its form.
Types that need llama.cpp's hand-written splitters (``kimi-k2``, ``afmoe``), whose pattern
is quadratic in a run of digits (``superbpe``'s look-ahead ``(?=(\\d{3})+(?!\\d))``),
or encode raw UTF-8 instead of bytes (``gemma4``, ``sarvam-moe``,
``whitespace``), or change more than the split (``chatglm-bpe``, ``glm4``: no BOS;
``jina-v1-en``, ``roberta-bpe``: a SEP token) are not here, and are refused by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import regex

from .pretokenize import pretokenize as smollm_pretokenize

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
# written with \u escapes so that no invisible character (U+3000, U+D7FF) can be lost in an edit
_DEEPSEEK_LETTERS = (
    r"A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    r"\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    r"\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    r"\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b"
    r"\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    r"\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    r"\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4"
    r"\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    r"\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    r"\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_DEEPSEEK_PUNCT = r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_KANA_HAN = r"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
# llama.cpp's r"\s+$", which tries every position of a whitespace run and scans to its end: quadratic
# (20,000 spaces before a digit took 15 s). Its leftmost match always starts where the run starts, so
# only trying there gives the same matches in linear time.
_TRAILING_SPACE = r"(?<!\s)\s+$"
_PORO = r" ?[^(\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_DEEPSEEK3_MAIN = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                   r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    """One of llama.cpp's BPE pre-tokeniser types and its defaults.

    ``patterns`` apply in order (see the module docstring); ``ignore_merges``:
    a word found whole in the vocabulary is one token; ``add_bos``: the
    default for prepending BOS (a file's ``tokenizer.ggml.add_bos_token``
    overrides it); ``clean_spaces``: llama.cpp's ``clean_up_tokenization_spaces``
    default (recorded, not applied by :meth:`Tokenizer.decode`, which stays exact).
    """

    name: str
    patterns: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False
    clean_spaces: bool = True

    @cached_property
    def _compiled(self) -> tuple[regex.Pattern, ...]:
        return tuple(regex.compile(p) for p in self.patterns)

    @cached_property
    def split(self) -> Callable[[str], list[str]]:
        """``text -> words`` (they concatenate back to the text). SmolLM2's own, faster
        function (:func:`.pretokenize.pretokenize`) serves ``smollm``: the same split."""
        if self.name == "smollm":
            return smollm_pretokenize
        compiled = self._compiled
        if len(compiled) == 1 and self.patterns[0].endswith(r"|\s+"):  # matches everywhere: no gaps
            return compiled[0].findall
        return lambda text: split_isolated(text, compiled)


def split_isolated(text: str, patterns: tuple[regex.Pattern, ...]) -> list[str]:
    """Cut ``text`` by each pattern in turn, keeping matches and the gaps between them
    (llama.cpp's ``unicode_regex_split``); an empty match cuts the text where it is."""
    pieces = [text] if text else []
    for pattern in patterns:
        out: list[str] = []
        for piece in pieces:
            pos = 0
            for m in pattern.finditer(piece):
                start, end = m.span()
                if start > pos:
                    out.append(piece[pos:start])
                if end > start:  # an empty match only cuts the text before it off
                    out.append(piece[start:end])
                pos = end
            if pos < len(piece):
                out.append(piece[pos:])
        pieces = out
    return pieces


def _types() -> dict[str, PreTokenizer]:
    P = PreTokenizer
    starcoder = (r"\p{N}", GPT2)
    no_clean = {"clean_spaces": False}
    table: dict[str, PreTokenizer] = {}

    def add(names: str, patterns: tuple[str, ...] | str, **kw) -> None:
        pats = (patterns,) if isinstance(patterns, str) else patterns
        for name in names.split():
            table[name] = P(name, pats, **kw)

    add("default", (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
    add("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", LLAMA3,
        ignore_merges=True, add_bos=True)
    add("minicpm5", (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+"), ignore_merges=True)
    add("deepseek-llm", ("[\r\n]", r"\s?[" + _DEEPSEEK_LETTERS + "]+", _DEEPSEEK_PUNCT, _TRAILING_SPACE,
                         _CJK, r"\p{N}+"), **no_clean)
    add("deepseek-coder", ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"), **no_clean)
    add("deepseek-v3 hunyuan-dense joyai-llm hy_v4", (r"\p{N}{1,3}", _KANA_HAN, _DEEPSEEK3_MAIN), **no_clean)
    add("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"))
    add("mpt olmo jais trillion gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum "
        "modern-bert exaone4", GPT2)
    add("trillion granite-docling", GPT2, **no_clean)
    add("jais-2", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
        r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
    add("starcoder refact codeshell exaone minerva-7b mellum2", starcoder)
    add("command-r smollm", starcoder, **no_clean)
    add("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", QWEN2, **no_clean)
    add("stablelm2 megrez", QWEN2)
    add("qwen35", QWEN35, **no_clean)
    add("dbrx smaug-bpe", LLAMA3)
    add("poro-chat", _PORO, **no_clean)
    add("bloom gpt3-finnish", _PORO)
    add("viking", (_PORO, r"\p{N}"), **no_clean)
    add("tekken", r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?"
        r"((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ignore_merges=True, add_bos=True, **no_clean)
    add("chameleon", ("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", r"\p{N}",
                      r"[\p{P}!-/:-@\[-`{-~]", GPT2), add_bos=True, **no_clean)
    add("gpt-4o llama4 kanana2 talkie minimax-m2", _GPT4O, **no_clean)
    add("bailingmoe bailingmoe2 llada-moe", r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+", **no_clean)
    add("seed-coder", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+", **no_clean)
    add("grok-2", QWEN2, **no_clean)
    add("ufakzeka", r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", **no_clean)
    add("laguna", (r"[^\n]+|[\n]+", QWEN2), **no_clean)
    return table


PRE_TOKENIZERS: dict[str, PreTokenizer] = _types()
"""Every supported ``tokenizer.ggml.pre`` value (llama.cpp's names and aliases) -> its pre-tokeniser."""

MISSING_PRE = "default"
"""What llama.cpp uses when a ``gpt2`` vocabulary names no pre-tokeniser (with a warning that
generation quality will suffer): its ``default`` type."""


def pre_tokenizer(name: str | None, where: str = "tokenizer") -> PreTokenizer:
    """The pre-tokeniser called ``name`` (``None``: llama.cpp's default); ``ValueError``
    naming it and listing the supported ones otherwise."""
    if name is None:
        name = MISSING_PRE
    try:
        return PRE_TOKENIZERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"{where}: unknown pre-tokenizer type {name!r} (tokenizer.ggml.pre); supported: "
                         + ", ".join(sorted(PRE_TOKENIZERS))) from None
