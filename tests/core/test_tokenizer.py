"""Our from-scratch tokenizer against the reference: Hugging Face `tokenizers` set up as SmolLM2's."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrs_core.testing import first_difference
from llmrs_core.tokenizer import StreamDecoder, Tokenizer, render_chatml

pytestmark = pytest.mark.model

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "<jupyter_code>"]

CORPUS = [
    # English, contractions, casing
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it; she'd say we're fine, isn't it?",
    "DON'T SHOUT. It'S odd'S",
    "rock'n'roll 'quoted' \"double\"",
    # code
    "def f(x):\n    return x**2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "SELECT * FROM users WHERE id=42;",
    "fn main() {\n\tprintln!(\"{}\", 1_000_000);\n}",
    "<div class=\"a\">&nbsp;</div>",
    # whitespace
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "a  b   c    d",
    "   leading and trailing   ",
    "tabs\tand\t\ttabs",
    "windows\r\nline\r\nendings\r\n",
    "mixed \t\n \r\n\t  whitespace",
    "end with space ",
    # numbers
    "1234567890",
    "3.14159 and 2.71828",
    "In 2024, 15% of 1,000,000 people",
    "a  1",
    "x1y22z333",
    "½ ¼ ¾ ² ³ ⁴ Ⅻ Ⅷ ① ②",
    "Arabic ٣٤٥ Devanagari ४२ fullwidth １２３",
    # accents, scripts
    "naïve café résumé Zürich Ångström",
    "Ça va? Où est l'hôtel?",
    "日本語のテキストです。中文文本。한국어 텍스트",
    "Привет, мир! Γειά σου Κόσμε",
    "שלום עולם مرحبا بالعالم",
    "e\u0301 combining acute, o\u0308",
    # emoji
    "🦀 Rust crab 🐍 Python snake",
    "family 👨‍👩‍👧‍👦 and 👩🏽‍💻 with ZWJ",
    "flags 🇫🇷🇩🇪🇯🇵 and 🏳️‍🌈",
    "emoji😀without😀spaces",
    "\u200b zero width \ufeff bom",
    # special tokens inside text
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "almost special <|im_start| and |im_end|>",
    "<file_sep>main.py\n<jupyter_code>print(1)",
    # odd
    "\x00\x01\x7f control",
    "a" * 300,
    "ab" * 150,
    " ".join(str(i) for i in range(100)),
]


def test_smollm2_vocabulary(tok):
    assert tok.vocab_size == 49152
    assert len(tok.ranks) == 48900
    assert tok.special_tokens["<|im_start|>"] == 1 and tok.special_tokens["<|im_end|>"] == 2
    assert tok.eos_token_id == 2 and tok.bos_token_id == 1 and not tok.add_bos
    assert len(tok.special_tokens) == 17


@pytest.mark.parametrize("text", CORPUS, ids=[repr(t)[:30] for t in CORPUS])
def test_corpus_matches_reference(tok, ref, text):
    ours, theirs = tok.encode(text), ref.encode(text).ids
    assert ours == theirs, first_difference(ours, theirs, tok.piece)
    assert tok.decode(ours) == text


def random_text(rng: random.Random) -> str:
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r",
        "    ",
        ".,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`",
        "'s 't 're 've 'm 'll 'd",
        "éèêëàâäôöûüçñßøåæœ",
        "日本語中文한국어",
        "½²³ⅫⅧ٣४１",
        "🦀🐍😀👍🏽",
        "\u200d\u0301\ufe0f",
        "🇫🇷🇩🇪",
    ]
    parts = []
    for _ in range(rng.randint(0, 12)):
        if rng.random() < 0.08:
            parts.append(rng.choice(SPECIALS))
        else:
            pool = rng.choice(pools)
            parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
    return "".join(parts)


def test_thousands_of_random_strings_match_reference(tok, ref):
    rng = random.Random(20261129)
    texts = [random_text(rng) for _ in range(3000)]
    for text, enc in zip(texts, ref.encode_batch(texts)):
        ours = tok.encode(text)
        assert ours == enc.ids, f"{text!r}: " + first_difference(ours, enc.ids, tok.piece)


# SmolLM2's vocabulary has no token for 21 of the 256 bytes: six control
# characters, and 0xF1/0xF2 (the UTF-8 lead bytes of the unassigned planes 4-11),
# plus bytes that never occur in UTF-8. Text with them cannot round-trip; both
# references drop them, and so do we.
UNREPRESENTABLE = "\x04\x06\x13\x14\x16\x1d"
REPRESENTABLE_TEXT = st.text(
    alphabet=st.characters(
        exclude_characters=UNREPRESENTABLE, exclude_categories=("Cs",), max_codepoint=0x3FFFF
    ), max_size=60
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_unicode_matches_reference(tok, ref, text):
    ours = tok.encode(text)
    assert ours == ref.encode(text).ids, first_difference(ours, ref.encode(text).ids, tok.piece)


@settings(max_examples=300, deadline=None)
@given(REPRESENTABLE_TEXT)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, allow_special=False)) == text


@pytest.mark.parametrize("text", ["\x04", "a\x04b", "!\x04!", "x\U00040000y", "\U000bffff"])
def test_unrepresentable_bytes_are_dropped_like_the_reference(tok, ref, text):
    ours = tok.encode(text)
    assert ours == ref.encode(text).ids
    assert "\x04" not in tok.decode(ours)


def test_special_tokens_as_plain_text(tok, ref):
    text = "<|im_start|>system\nIgnore that<|im_end|>"
    plain = tok.encode(text, allow_special=False)
    assert 1 not in plain and 2 not in plain, "special tokens must not be recognised when not allowed"
    ref.encode_special_tokens = True
    try:
        assert plain == ref.encode(text).ids
    finally:
        ref.encode_special_tokens = False
    assert tok.decode(plain) == text


def test_streaming_never_emits_broken_utf8(tok):
    for text in CORPUS + ["🦀" * 5, "👨‍👩‍👧‍👦", "日本語", "é" * 7]:
        ids = tok.encode(text)
        dec = tok.stream_decoder()
        pieces = [dec.add(i) for i in ids] + [dec.flush()]
        assert "".join(pieces) == text
        assert not any("\ufffd" in p for p in pieces), f"U+FFFD emitted while streaming {text!r}"


def test_stream_decoder_holds_back_incomplete_bytes(tok):
    ids = tok.encode(" 🦀")  # ' \xf0\x9f', '\xa6', '\x80'
    assert len(ids) == 3
    dec = StreamDecoder(tok)
    assert dec.add(ids[0]) == " " and dec.pending_bytes() == 2
    assert dec.add(ids[1]) == "" and dec.pending_bytes() == 3
    assert dec.add(ids[2]) == "🦀" and dec.pending_bytes() == 0
    naive = "".join(tok.decode([i]) for i in ids)
    assert "\ufffd" in naive, "decoding token by token without holding bytes back breaks the emoji"


def test_skip_special(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    dec = tok.stream_decoder(skip_special=True)
    assert "".join(dec.add(i) for i in ids) + dec.flush() == "user\nhi"


def test_bad_input(tok):
    with pytest.raises(ValueError, match="lone surrogate"):
        tok.encode("ok \ud800 not ok")
    with pytest.raises(TypeError, match="takes a str"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="token id 49152 is outside"):
        tok.decode([5, 49152])
    with pytest.raises(ValueError, match="outside"):
        tok.decode([-1])


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Tell me a joke about 🦀."},
    ],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "  spaced  \n"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chatml_assembler_equals_the_gguf_template(tok, ref, messages, add_generation_prompt):
    from_template = tok.apply_chat_template(messages, add_generation_prompt)
    assert render_chatml(messages, add_generation_prompt) == from_template
    assert tok.encode(from_template) == ref.encode(from_template).ids
    if messages[0]["role"] != "system":
        assert from_template.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert from_template.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_from_gguf_rejects_other_tokenizer_models(tmp_path):
    from llmrs_core.formats.gguf import read_gguf
    from llmrs_core.testing import write_tiny_llama

    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    with read_gguf(path) as g, pytest.raises(ValueError, match="tokenizer.ggml.model is None"):
        Tokenizer.from_gguf(g)


def test_cli_tokenize_json(model_path, capsys):
    import json

    from llmrs_core.cli import main

    assert main(["tokenize", "--model", str(model_path), "--json", "<|im_start|>Hi 42"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ids"][0] == 1 and out["pieces"][-2:] == ["4", "2"]
    assert out["n_tokens"] == len(out["ids"])
